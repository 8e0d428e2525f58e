// A tiny client of the WebSocket listener for tests, on `ws` directly (not ipc/client.ts):
// one binary message = one frame body (ipc/framing.ts, its 4-byte prefix dropped), hello,
// requests matched by id and subscription events (frame-peer.ts), and the HTTP answer of a refused upgrade
// (status, headers, JSON body, how long it took).
import { WebSocket, type ClientOptions } from 'ws';
import type { WireError } from '../../ipc/errors.js';
import { encodeFrame, FrameDecoder } from '../../ipc/framing.js';
import { FramePeer, type Answer } from './frame-peer.js';

/** Encodes one frame body (the msgpack map alone). */
export function frameBody(value: unknown): Buffer {
  return encodeFrame(value).subarray(4);
}

export class WsPeer extends FramePeer {
  /** Every decoded message, in order (for tests that look at what came unasked, e.g. id 0). */
  readonly received: Answer[] = [];
  /** The close code and reason once closed. */
  readonly closed: Promise<{ code: number; reason: string }>;

  private constructor(readonly ws: WebSocket) {
    super();
    const decoder = new FrameDecoder(256 * 1024 * 1024);
    ws.on('message', (data: Buffer) => {
      const prefix = Buffer.allocUnsafe(4);
      prefix.writeUInt32BE(data.length, 0);
      decoder.push(Buffer.concat([prefix, data]), (v) => this.onAnswer(v as Answer));
    });
    this.closed = new Promise((resolve) =>
      ws.on('close', (code, reason) => {
        this.failPending(new Error(`closed ${code} before the answer`));
        resolve({ code, reason: reason.toString() });
      }),
    );
    ws.on('error', () => {});
  }

  /** Opens url with `Authorization: Bearer token` (when given); rejects with the HTTP answer of a refused upgrade. */
  static open(url: string, token?: string, opts: ClientOptions = {}): Promise<WsPeer> {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(url, { ...opts, headers: { ...(token !== undefined ? { Authorization: `Bearer ${token}` } : {}), ...opts.headers } });
      ws.once('open', () => resolve(new WsPeer(ws)));
      ws.once('unexpected-response', (_req, res) => {
        const parts: Buffer[] = [];
        res.on('data', (d: Buffer) => parts.push(d));
        res.on('end', () =>
          reject(
            Object.assign(new Error(`upgrade refused: ${res.statusCode}`), {
              status: res.statusCode,
              headers: res.headers,
              body: Buffer.concat(parts).toString(),
            }),
          ),
        );
      });
      ws.once('error', reject);
    });
  }

  /** open() and hello. */
  static async connect(url: string, token?: string, opts: ClientOptions = {}): Promise<WsPeer> {
    const peer = await WsPeer.open(url, token, opts);
    await peer.request('hello', { versions: [1], client: 'ws-peer' });
    return peer;
  }

  protected override onAnswer(a: Answer): void {
    this.received.push(a);
    super.onAnswer(a);
  }

  /** One binary message: the frame body, without its length prefix. */
  protected sendFrame(frame: Buffer): void {
    this.ws.send(frame.subarray(4), { binary: true });
  }

  /** Every byte of a stream from 0 to its end (subscribe, follow), concatenated. */
  async readAll(sessionId: string, stream = 'stdout'): Promise<Buffer> {
    const parts: Buffer[] = [];
    let done!: () => void;
    const ended = new Promise<void>((r) => (done = r));
    await this.request('subscribe', { session_id: sessionId, stream, from: 0, follow: true }, (e) => {
      if (e.event === 'output') parts.push(Buffer.from(e.data as Uint8Array));
      if (e.event === 'end') done();
    });
    await ended;
    return Buffer.concat(parts);
  }

  close(): void {
    this.ws.close();
  }
}

/** The refusal of an upgrade to url with these headers: status, headers, parsed JSON body, and ms from connect to answer. */
export async function refusedUpgrade(
  url: string,
  headers: Record<string, string>,
  opts: ClientOptions = {},
): Promise<{ status: number; headers: Record<string, unknown>; body: { error: WireError }; ms: number }> {
  const t0 = performance.now();
  try {
    const peer = await WsPeer.open(url, undefined, { ...opts, headers });
    peer.close();
  } catch (err) {
    const e = err as { status?: number; headers?: Record<string, unknown>; body?: string };
    if (e.status === undefined) throw err;
    return { status: e.status, headers: e.headers ?? {}, body: JSON.parse(e.body ?? '{}'), ms: performance.now() - t0 };
  }
  throw new Error(`the upgrade to ${url} was accepted`);
}
