// The socket under wrong input: the hello comes first and is versioned, oversized frames are
// refused by their prefix, malformed frames and unknown methods get stable codes, and the
// supervisor keeps serving afterwards.
import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeFrame, FrameDecoder } from '../../ipc/framing.js';
import { TestDaemon } from '../helpers/daemon.js';

let daemon: TestDaemon;
beforeAll(async () => {
  daemon = await new TestDaemon({ config: { ipc: { maxFrameBytes: 65536 } } }).start();
});
afterAll(async () => {
  expect(await daemon.stop()).toEqual({ code: 0, signal: null });
});

/**
 * Sends raw bytes on a fresh connection; resolves with the frames received once `frames` of
 * them have arrived (then it closes its end), or when the server closes first. Fails after a
 * deadline rather than waiting a fixed time.
 */
function exchange(chunks: Buffer[], expectFrames = Infinity, deadlineMs = 10_000): Promise<{ frames: any[]; closedByServer: boolean }> {
  return new Promise((resolve, reject) => {
    const socket = connect(daemon.socketPath);
    const decoder = new FrameDecoder();
    const frames: any[] = [];
    let closedByServer = true;
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`${frames.length} of ${expectFrames} frames within ${deadlineMs} ms`));
    }, deadlineMs);
    socket.on('connect', () => chunks.forEach((c) => socket.write(c)));
    socket.on('data', (d) =>
      decoder.push(d, (f) => {
        frames.push(f);
        if (frames.length >= expectFrames) {
          closedByServer = false;
          socket.destroy();
        }
      }),
    );
    socket.on('error', reject);
    socket.on('close', () => {
      clearTimeout(timer);
      resolve({ frames, closedByServer });
    });
  });
}

const hello = (versions = [1]) => encodeFrame({ id: 1, method: 'hello', params: { versions } });

describe('protocol', () => {
  it('answers hello with the version, then requests', async () => {
    const { frames } = await exchange([hello(), encodeFrame({ id: 2, method: 'status', params: {} })], 2);
    expect(frames[0]).toMatchObject({ id: 1, result: { version: 1, generation: 1 } });
    expect(frames[1]).toMatchObject({ id: 2, result: { mode: 'cgroup', protocol: 1 } });
  });

  it('runs nothing without an integer id, and refuses a second hello', async () => {
    const { frames } = await exchange(
      [
        hello(),
        encodeFrame({ id: 'x', method: 'launch', params: { argv: ['true'], cwd: '/' } }),
        encodeFrame({ id: 1.5, method: 'status' }),
        encodeFrame({ method: 'status' }),
        encodeFrame({ id: 9, method: 'hello', params: { versions: [1] } }),
      ],
      5,
    );
    expect(frames.slice(1).map((f) => [f.id, f.error?.code])).toEqual([
      [0, 'INVALID_ARGUMENT'],
      [0, 'INVALID_ARGUMENT'],
      [0, 'INVALID_ARGUMENT'],
      [9, 'INVALID_ARGUMENT'],
    ]);
    const ps = await daemon.sbx(['ps', '--all', '--json']);
    expect(JSON.parse(ps.stdout.toString())).toEqual([]);
  });

  it('accepts integers a peer encodes as 64-bit (msgpack uint64)', async () => {
    // { id: 1, method: "hello", params: { versions: [1] } } with every integer as 0xcf uint64
    const u64 = (n: number) => Buffer.from([0xcf, 0, 0, 0, 0, 0, 0, 0, n]);
    const str = (t: string) => Buffer.concat([Buffer.from([0xa0 | t.length]), Buffer.from(t)]);
    const body = Buffer.concat([
      Buffer.from([0x83]),
      str('id'),
      u64(1),
      str('method'),
      str('hello'),
      str('params'),
      Buffer.from([0x81]),
      str('versions'),
      Buffer.from([0x91]),
      u64(1),
    ]);
    const prefix = Buffer.alloc(4);
    prefix.writeUInt32BE(body.length);
    const { frames } = await exchange([prefix, body], 1);
    expect(frames[0]).toMatchObject({ id: 1, result: { version: 1 } });
  });

  it('refuses an unsupported version with the supported range and closes', async () => {
    const { frames, closedByServer } = await exchange([hello([99])]);
    expect(frames[0].error).toMatchObject({ code: 'UNSUPPORTED_VERSION', retryable: false, details: { supported: [1] } });
    expect(closedByServer).toBe(true);
  });

  it('requires hello first', async () => {
    const { frames } = await exchange([encodeFrame({ id: 7, method: 'status' })], 1);
    expect(frames[0]).toMatchObject({ id: 7, error: { code: 'INVALID_ARGUMENT' } });
  });

  it('refuses an oversized frame by its length prefix, before the body arrives', async () => {
    const prefix = Buffer.alloc(4);
    prefix.writeUInt32BE(10 * 1024 * 1024);
    const { frames, closedByServer } = await exchange([hello(), prefix]);
    expect(frames[1].error).toMatchObject({ code: 'FRAME_TOO_LARGE', details: { max_frame_bytes: 65536 } });
    expect(closedByServer).toBe(true);
  });

  it('answers malformed msgpack, unknown methods and bad params with stable codes', async () => {
    const garbage = Buffer.from([0, 0, 0, 1, 0xc1]); // 0xc1 is never valid msgpack
    const bad = await exchange([hello(), garbage]);
    expect(bad.frames[1].error.code).toBe('INVALID_ARGUMENT');
    expect(bad.closedByServer).toBe(true);
    const { frames } = await exchange(
      [
        hello(),
        encodeFrame({ id: 2, method: 'rm -rf' }),
        encodeFrame({ id: 3, method: 'launch', params: { argv: ['a\0b'], cwd: '/' } }),
        encodeFrame({ id: 4, method: 'launch', params: { argv: [], cwd: '/' } }),
        encodeFrame({ id: 5, method: 'subscribe', params: { session_id: 'x', stream: 'stdout', from: -1 } }),
        encodeFrame({ id: 6, method: 'launch', params: { argv: ['true'], cwd: '/', timeout_ms: 31 * 24 * 3600 * 1000 } }),
      ],
      6,
    );
    const byId = new Map(frames.map((f) => [f.id, f]));
    expect(byId.get(2).error.code).toBe('INVALID_ARGUMENT');
    expect(byId.get(3).error).toMatchObject({ code: 'INVALID_ARGUMENT' });
    expect(byId.get(3).error.message).toContain('NUL');
    expect(byId.get(4).error.code).toBe('INVALID_ARGUMENT');
    expect(byId.get(5).error.code).toBe('INVALID_ARGUMENT');
    expect(byId.get(6).error.code).toBe('INVALID_ARGUMENT');
    // Still serving.
    const r = await daemon.sbx(['run', '--', 'echo', 'still here']);
    expect(r.stdout.toString()).toBe('still here\n');
  });
});

describe('ReconnectingClient', () => {
  it('gives callers that ask at once, before it is connected, one connection (a second was left open, keeping sbx from exiting)', async () => {
    const { ReconnectingClient } = await import('../../ipc/client.js');
    const conn = new ReconnectingClient({ socketPath: daemon.socketPath, clientName: 'test' });
    const clients = await Promise.all([conn.get(), conn.get(), conn.get()]);
    expect(new Set(clients).size).toBe(1);
    expect(conn.current).toBe(clients[0]);
    expect((await clients[0].status()).version).toBeDefined();
    conn.drop();
    expect(conn.current).toBe(null);
  });
});
