// Property test of the socket: thousands of random and mutated frames (garbage, truncated,
// oversized length prefixes, wrong types, unknown methods, huge cursors, NUL in argv) at a
// running supervisor. It must never crash, must answer every well-formed request with a
// result or a known error code (and go on answering on that connection), must close a
// connection it cannot parse after saying why, and a session running meanwhile must finish
// byte-exact.
import fc from 'fast-check';
import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ERROR_CODES } from '../../ipc/errors.js';
import { encodeFrame, FrameDecoder } from '../../ipc/framing.js';
import { sha256, TestDaemon } from '../helpers/daemon.js';

const MAX_FRAME = 65536;
const SENTINEL = 424242;
let daemon: TestDaemon;
beforeAll(async () => {
  daemon = await new TestDaemon({ config: { ipc: { maxFrameBytes: MAX_FRAME }, logLevel: 'warn' } }).start();
});
afterAll(async () => {
  expect(await daemon.stop()).toEqual({ code: 0, signal: null });
});

const HELLO = encodeFrame({ id: 1, method: 'hello', params: { versions: [1] } });
const known = new Set(Object.keys(ERROR_CODES));
const METHODS = ['launch', 'subscribe', 'wait', 'receipt', 'ps', 'status', 'cancel', 'kill', 'resolve', 'hello'];

// Commands are limited to harmless ones: random strings are never run.
const argv0 = fc.constantFrom('true', 'echo', '/nonexistent/fuzz-command');
const weird = fc.oneof(fc.string(), fc.string({ unit: 'binary' }), fc.constantFrom('a\0b', '', '\u0000', '💥'));
const num = fc.oneof(fc.integer(), fc.double(), fc.constantFrom(-1, 2 ** 53, Number.MAX_SAFE_INTEGER + 2, 1e308, NaN));
const launchParams = fc.record(
  {
    argv: fc.oneof(
      fc.tuple(argv0, fc.array(weird, { maxLength: 3 })).map(([a, rest]) => [a, ...rest]),
      fc.anything(),
    ),
    cwd: fc.oneof(fc.constant('/'), weird),
    env: fc.oneof(fc.dictionary(weird, weird, { maxKeys: 3 }), fc.anything()),
    timeout_ms: fc.oneof(fc.constantFrom(0, 100), num),
    grace_ms: num,
    linger: fc.oneof(fc.constantFrom('kill', 'wait'), weird),
    invocation_key: fc.oneof(weird, fc.constant(undefined)),
    extra: fc.anything(),
  },
  { requiredKeys: [] },
);
const selectorParams = fc.record(
  {
    session_id: fc.oneof(weird, fc.constant('s-0-none')),
    invocation_key: weird,
    stream: fc.oneof(fc.constantFrom('stdout', 'stderr', 'pty', 'all'), weird),
    from: num,
    follow: fc.oneof(fc.boolean(), fc.anything()),
    signal: fc.oneof(fc.constantFrom('SIGUSR1', 'KILL', 'SIGNOPE'), num),
    reason: weird,
    as_operator: fc.anything(),
  },
  { requiredKeys: [] },
);
const request = fc.record({
  id: fc.oneof(fc.nat(100_000), fc.nat(100_000), num, weird, fc.constant(null)),
  method: fc.oneof(fc.constantFrom(...METHODS), weird),
  params: fc.oneof(launchParams, selectorParams, fc.anything()),
});

/** Sends bytes after the hello; collects frames until the sentinel is answered or the server closes. */
function exchange(payload: Buffer, endAfter: boolean): Promise<{ frames: any[]; closed: boolean; badFrame: Error | null }> {
  return new Promise((resolve) => {
    const socket = connect(daemon.socketPath);
    const decoder = new FrameDecoder(1 << 24);
    const frames: any[] = [];
    let badFrame: Error | null = null;
    let settled = false;
    const finish = (closed: boolean) => {
      if (settled) return;
      settled = true;
      socket.destroy();
      resolve({ frames, closed, badFrame });
    };
    socket.on('connect', () => {
      socket.write(Buffer.concat([HELLO, payload, endAfter ? Buffer.alloc(0) : encodeFrame({ id: SENTINEL, method: 'status', params: {} })]));
      if (endAfter) socket.end();
    });
    socket.on('data', (d) => {
      try {
        decoder.push(d, (f) => {
          frames.push(f);
          if ((f as { id?: number }).id === SENTINEL) finish(false);
        });
      } catch (err) {
        badFrame = err as Error;
      }
    });
    socket.on('error', () => {});
    socket.on('close', () => finish(true));
  });
}

function wellFormed(frame: any): boolean {
  if (typeof frame !== 'object' || frame === null || typeof frame.id !== 'number') return false;
  if ('event' in frame) return frame.event === 'output' || frame.event === 'end';
  if ('error' in frame) return known.has(frame.error.code) && typeof frame.error.message === 'string' && typeof frame.error.retryable === 'boolean';
  return 'result' in frame;
}

describe('fuzzing the socket', () => {
  it('survives thousands of random and mutated frames; a session running meanwhile ends byte-exact', async () => {
    const client = await daemon.client();
    const expected = Array.from({ length: 3000 }, (_, i) => `tick ${i}\n`).join('');
    const { session_id } = await client.launch({ argv: ['sh', '-c', 'i=0; while [ $i -lt 3000 ]; do echo "tick $i"; i=$((i+1)); done'], cwd: '/' });

    // Well-formed frames carrying random requests: each is answered, and the connection goes on.
    await fc.assert(
      fc.asyncProperty(request, async (req) => {
        const { frames, closed, badFrame } = await exchange(encodeFrame(req), false);
        expect(badFrame).toBeNull();
        expect(frames.every(wellFormed)).toBe(true);
        expect(closed).toBe(false); // the sentinel after it was answered
        expect(frames.find((f) => f.id === SENTINEL)?.result?.protocol).toBe(1);
      }),
      { numRuns: 1500 },
    );

    // Garbage, truncated frames and oversized prefixes: answered with a code, or closed.
    const garbage = fc.oneof(
      fc.uint8Array({ maxLength: 200 }).map((b) => Buffer.from(b)),
      request.map((r) => encodeFrame(r)).chain((f) => fc.nat(f.length - 1).map((cut) => f.subarray(0, cut))),
      fc.integer({ min: MAX_FRAME + 1, max: 2 ** 32 - 1 }).map((n) => {
        const b = Buffer.alloc(4);
        b.writeUInt32BE(n);
        return b;
      }),
      fc.uint8Array({ minLength: 1, maxLength: 100 }).map((b) => {
        const head = Buffer.alloc(4);
        head.writeUInt32BE(b.length);
        return Buffer.concat([head, Buffer.from(b)]);
      }),
    );
    await fc.assert(
      fc.asyncProperty(garbage, async (bytes) => {
        const { frames, closed, badFrame } = await exchange(bytes, true);
        expect(badFrame).toBeNull();
        expect(frames.every(wellFormed)).toBe(true);
        expect(closed).toBe(true);
      }),
      { numRuns: 700 },
    );

    process.kill(daemon.pid, 0); // still alive
    const receipt = await client.wait({ session_id });
    expect(receipt.output.stdout).toMatchObject({ final_cursor: expected.length, sha256: sha256(expected), complete: true });
    const status = await daemon.sbx(['status', '--json']);
    expect(status.status).toBe(0);
  });
});
