// A WebSocket seen as the socket a Connection (connection.ts) uses: one binary message in is one frame body
// (re-prefixed with its length for the frame decoder), each frame written is sent as one binary message (its
// 4-byte prefix dropped). A text message is not decoded: 'text' is emitted for the listener to refuse. Owns
// the translation; not auth, keepalive or bounds (remote.ts).
import { EventEmitter } from 'node:events';
import type { Duplex } from 'node:stream';
import type { WebSocket } from 'ws';
import type { ConnectionSocket } from './connection.js';

/** The close code `end` closes with: 1000 (normal) unless the listener set another (1003 for a text message). */
const NORMAL_CLOSURE = 1000;

export class WsSocket extends EventEmitter implements ConnectionSocket {
  /** The close code end() sends. */
  endCode = NORMAL_CLOSURE;
  private closedOnce = false;

  /** ws: the upgraded WebSocket; raw: its TCP (or TLS) socket, whose 'drain' we pass on. */
  constructor(
    readonly ws: WebSocket,
    private readonly raw: Duplex,
  ) {
    super();
    ws.on('message', (data: Buffer, isBinary: boolean) => {
      if (!isBinary) return void this.emit('text', data.length);
      const prefix = Buffer.allocUnsafe(4);
      prefix.writeUInt32BE(data.length, 0);
      this.emit('data', prefix);
      if (data.length > 0) this.emit('data', data);
    });
    ws.on('close', () => this.closed());
    ws.on('error', (err) => this.emit('error', err));
    raw.on('drain', () => this.emit('drain'));
    raw.on('close', () => this.closed());
  }

  private closed(): void {
    if (this.closedOnce) return;
    this.closedOnce = true;
    this.emit('close');
  }

  /** Sends each whole frame in data (u32 BE length + body) as one binary message; cb once the last is written. */
  write(data: Buffer, cb?: (err?: Error | null) => void): boolean {
    let at = 0;
    while (at + 4 <= data.length) {
      const bytes = data.readUInt32BE(at);
      const body = data.subarray(at + 4, at + 4 + bytes);
      at += 4 + bytes;
      const last = at + 4 > data.length;
      this.ws.send(body, { binary: true, fin: true }, last && cb ? (err) => cb(err ?? null) : undefined);
    }
    return this.writableLength === 0;
  }

  /** Sends the last frames, then closes the WebSocket (endCode). */
  end(data: Buffer): this {
    if (data.length > 0) this.write(data);
    this.ws.close(this.endCode);
    return this;
  }

  destroy(): this {
    this.ws.terminate();
    return this;
  }

  /** pause/resume stop and start reading. */
  pause(): this {
    this.ws.pause();
    return this;
  }

  resume(): this {
    this.ws.resume();
    return this;
  }

  /** The bytes not yet handed to the kernel (ws bufferedAmount); 'drain' is the TCP socket's. */
  get writableLength(): number {
    return this.ws.bufferedAmount;
  }
}
