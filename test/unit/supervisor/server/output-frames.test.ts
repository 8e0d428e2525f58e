// Output frames are encoded into per-connection slabs (connection.ts frameBuffer/sendEncoded): over a
// stand-in socket that completes writes only when told, every frame's bytes stay as encoded until the
// socket has written it, whatever is encoded after it; a slab is reused only once all its frames are
// written; thousands of short events use a handful of slabs, not a buffer each.
import { EventEmitter } from 'node:events';
import { describe, expect, it } from 'vitest';
import { encodeOutputFrame, FrameDecoder } from '../../../../ipc/framing.js';
import { Connection, type ConnectionSocket, type FrameLimits } from '../../../../supervisor/server/connection.js';

/** A socket whose writes stay queued (their buffers referenced) until complete() is called; `written` keeps each write's bytes as they were when it completed. */
class HeldSocket extends EventEmitter {
  readonly queued: { data: Buffer; copy: Buffer; cb?: (err?: Error | null) => void }[] = [];
  readonly written: Buffer[] = [];
  writableLength = 0;
  write(data: Buffer, cb?: (err?: Error | null) => void): boolean {
    this.queued.push({ data, copy: Buffer.from(data), cb });
    return true;
  }
  /** Completes the oldest n writes, checking each buffer still holds the bytes it was given. */
  complete(n: number): void {
    for (const w of this.queued.splice(0, n)) {
      expect(w.data.equals(w.copy)).toBe(true);
      this.written.push(Buffer.from(w.data));
      w.cb?.();
    }
  }
  end(): this {
    return this;
  }
  destroy(): this {
    return this;
  }
  pause(): this {
    return this;
  }
  resume(): this {
    return this;
  }
}

/** The events of every frame written, in order. */
function decoded(socket: HeldSocket): { cursor: number; data: Buffer }[] {
  const out: { cursor: number; data: Buffer }[] = [];
  const decoder = new FrameDecoder(2 << 20);
  for (const w of socket.written) decoder.push(w, (v) => out.push(v as { cursor: number; data: Buffer }));
  return out;
}

function connection(socket: HeldSocket): Connection {
  return new Connection(
    socket as unknown as ConnectionSocket,
    { maxFrameBytes: 1 << 20, frameTimeoutMs: 0, pending: { heldBytes: 0, maxBytes: 1 << 30 }, onFrameTimeout: () => {} } satisfies FrameLimits,
    { pid: 1, uid: 0, gid: 0 },
  );
}

/** Encodes one output event of `bytes` bytes of `fillByte` at cursor into conn's frame buffer and sends it. */
async function sendOutput(conn: Connection, cursor: number, bytes: number, fillByte: number): Promise<Buffer> {
  const into = conn.frameBuffer(bytes + 128);
  const frame = encodeOutputFrame(7, 'stdout', cursor, bytes, (buf, offset, max) => buf.fill(fillByte, offset, offset + max) && max, into)!;
  await conn.sendEncoded(frame);
  return frame;
}

describe('output frames in slabs', () => {
  it('keeps every frame as encoded until it is written, and reuses a slab only once all its frames are', async () => {
    const seed = Date.now() % 100_000;
    console.log(`seed ${seed}`);
    let x = seed;
    const rand = (n: number) => ((x = (x * 48271) % 2147483647), x % n);
    const socket = new HeldSocket();
    const conn = connection(socket);
    const buffers = new Set<ArrayBufferLike>();
    const sent: { cursor: number; bytes: number; fill: number }[] = [];
    let cursor = 0;
    for (let i = 0; i < 3000; i++) {
      // Short events mostly, a full 1 MiB one now and then; the socket completes writes late and in bursts.
      const bytes = rand(40) === 0 ? 1 << 20 : 1 + rand(9000);
      const frame = await sendOutput(conn, cursor, bytes, i % 251);
      buffers.add(frame.buffer);
      sent.push({ cursor, bytes, fill: i % 251 });
      cursor += bytes;
      if (rand(4) === 0) socket.complete(rand(socket.queued.length + 1));
    }
    socket.complete(socket.queued.length);
    const got = decoded(socket);
    expect(got.length).toBe(sent.length);
    got.forEach((e, i) => {
      expect(e.cursor).toBe(sent[i]!.cursor);
      expect(e.data.equals(Buffer.alloc(sent[i]!.bytes, sent[i]!.fill))).toBe(true);
    });
    // ~75 full events each need a slab of their own; the ~2,900 short ones share.
    expect(buffers.size).toBeLessThan(200);
  });

  it('thousands of short events written as they go use one slab', async () => {
    const socket = new HeldSocket();
    const conn = connection(socket);
    const buffers = new Set<ArrayBufferLike>();
    for (let i = 0; i < 5000; i++) {
      buffers.add((await sendOutput(conn, i * 4096, 4096, i % 256)).buffer);
      socket.complete(1);
    }
    // 4 KiB events fill a 1 MiB slab about 250 times over: two slabs at most take turns.
    expect(buffers.size).toBeLessThanOrEqual(2);
  });

  it('a frame encoded elsewhere (not in the slab) is sent as it is', async () => {
    const socket = new HeldSocket();
    const conn = connection(socket);
    const own = encodeOutputFrame(1, 'stderr', 0, 3, (buf, offset) => buf.write('abc', offset))!;
    await conn.sendEncoded(own);
    expect(socket.queued[0]!.data).toBe(own);
    socket.complete(1);
    expect(decoded(socket)).toEqual([{ id: 1, event: 'output', stream: 'stderr', cursor: 0, data: Buffer.from('abc') }]);
  });
});
