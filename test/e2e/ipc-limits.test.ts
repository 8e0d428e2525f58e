// The socket as the supervisor's only door: bounds (connections, in-flight requests,
// sessions, the hello deadline, partial frames in time and in bytes, bodies that are not
// maps), backpressure towards a stalled reader, and the peer allow-list checked with
// SO_PEERCRED against a client really running as nobody.
import { execFileSync } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { SupervisorClient, readOutput } from '../../ipc/client.js';
import { encodeFrame, FrameDecoder } from '../../ipc/framing.js';
import { isSupervisorError } from '../../ipc/errors.js';
import { sha256, TestDaemon, until } from '../helpers/daemon.js';

const daemons: TestDaemon[] = [];
const sockets: Socket[] = [];
afterEach(async () => {
  for (const s of sockets.splice(0)) s.destroy();
  for (const d of daemons.splice(0)) await d.stop();
});
async function daemon(config: Record<string, unknown> = {}, socketPath?: string): Promise<TestDaemon> {
  const d = new TestDaemon({ config, socketPath });
  daemons.push(d);
  return d.start();
}

/** A raw connection collecting decoded frames; closed tells whether the server closed it. */
function raw(socketPath: string) {
  const socket = connect(socketPath);
  sockets.push(socket);
  const frames: any[] = [];
  const decoder = new FrameDecoder();
  const state = { closed: false, ended: false, closedAt: 0 };
  socket.on('data', (d) => decoder.push(d, (f) => frames.push(f)));
  socket.on('error', () => {});
  socket.on('end', () => (state.ended = true)); // the server's FIN: EOF on the socket
  socket.on('close', () => {
    state.closed = true;
    state.closedAt = performance.now();
  });
  return { socket, frames, state };
}
const MiB = 1024 * 1024;
/** Paces a sender (the stimulus itself), never a wait for a result. */
const pace = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** A frame with this body, prefix and all (for bodies encodeFrame would not produce). */
const rawFrame = (body: number[] | Buffer) => {
  const b = Buffer.from(body);
  const prefix = Buffer.alloc(4);
  prefix.writeUInt32BE(b.length);
  return Buffer.concat([prefix, b]);
};
const hello = (id = 1) => encodeFrame({ id, method: 'hello', params: { versions: [1] } });
const rssKb = (pid: number) => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1]);

describe('a burst of requests in one read', () => {
  it('200 launches written at once on one connection: their answers start while the rest are still being admitted, and another connection is served between them', async () => {
    const d = await daemon({ ipc: { maxInFlight: 4096 }, session: { maxSessions: 4096 } });
    const other = await d.client();
    const r = raw(d.socketPath);
    r.socket.write(hello());
    await until(() => r.frames.length === 1 || null, 'the hello answered');
    const n = 200;
    r.socket.write(Buffer.concat(Array.from({ length: n }, (_, i) => encodeFrame({ id: 10 + i, method: 'launch', params: { argv: ['true'], cwd: '/' } }))));
    // When the first answer arrives, the supervisor has not admitted every launch yet: the
    // frames of one read are dispatched in slices, the answers so far sent between them (all
    // 200 were admitted before the first answer went out, when they were dispatched at once).
    await until(() => r.frames.length > 1 || null, 'the first launch answered');
    const status = await other.status();
    const admitted = Object.values(status.sessions).reduce((a, b) => a + b, 0);
    expect(admitted).toBeLessThan(n);
    await until(() => r.frames.length === 1 + n || null, 'every launch answered', 60_000);
    expect(r.frames.slice(1).map((f) => f.id)).toEqual(Array.from({ length: n }, (_, i) => 10 + i));
    expect(r.frames.slice(1).every((f) => typeof f.result?.session_id === 'string')).toBe(true);
  });
});

describe('bounds', () => {
  it('300 connections at once, half silent: status and sessions keep being served', async () => {
    const d = await daemon();
    const c = await d.client();
    const { session_id } = await c.launch({ argv: ['sh', '-c', 'for i in $(seq 1 200); do echo "n $i"; done; sleep 0.5'], cwd: '/' });
    const conns = Array.from({ length: 300 }, () => raw(d.socketPath));
    conns.forEach((r, i) => {
      if (i % 2) r.socket.write(Buffer.concat([hello(), encodeFrame({ id: 2, method: 'status', params: {} })]));
    });
    await until(() => conns.every((r, i) => i % 2 === 0 || r.frames.length === 2), 'the talking half to be answered');
    expect(conns.filter((r, i) => i % 2 && r.frames[1].result?.mode === 'cgroup')).toHaveLength(150);
    const status = await d.sbx(['status', '--json']);
    expect(status.status).toBe(0);
    const receipt = await c.wait({ session_id });
    const expected = Array.from({ length: 200 }, (_, i) => `n ${i + 1}\n`).join('');
    expect(receipt.output.stdout).toMatchObject({ final_cursor: expected.length, sha256: sha256(expected), complete: true });
  });

  it('refuses connections past maxConnections with LIMIT_EXCEEDED, and closes silent ones after the hello deadline', async () => {
    const d = await daemon({ ipc: { maxConnections: 5, handshakeTimeoutMs: 1500 } });
    const held = Array.from({ length: 5 }, () => raw(d.socketPath));
    await until(() => held.every((r) => r.socket.readyState === 'open'), 'five connections');
    const sixth = raw(d.socketPath);
    await until(() => sixth.state.closed, 'the sixth to be closed');
    expect(sixth.frames[0].error).toMatchObject({ code: 'LIMIT_EXCEEDED', retryable: true, details: { limit: 'connections', max: 5 } });
    // The client library hands that refusal on (not a bare ECONNRESET): sbx says why.
    const refused = await d.sbx(['status']);
    expect(refused.status).toBe(125);
    expect(refused.stderr.toString()).toBe('sbx: LIMIT_EXCEEDED: 5 connections are open\n');
    await until(() => held.every((r) => r.state.closed), 'the silent ones to be closed after 1500 ms');
    expect(held[0].frames[0].error.message).toContain('no hello within 1500 ms');
    const ok = await d.sbx(['status']);
    expect(ok.status).toBe(0);
  });

  it('bounds live sessions and in-flight requests per connection', async () => {
    const d = await daemon({ ipc: { maxInFlight: 2 }, session: { maxSessions: 2 } });
    const r = raw(d.socketPath);
    r.socket.write(hello());
    const answer = async (frame: { id: number; method: string; params: object }) => {
      r.socket.write(encodeFrame(frame));
      return until(() => r.frames.find((f) => f.id === frame.id), `the answer to ${frame.id}`);
    };
    const launch = (id: number) => ({ id, method: 'launch', params: { argv: ['sleep', '30'], cwd: '/', timeout_ms: 20_000 } });
    const first = (await answer(launch(2))).result.session_id;
    const second = (await answer(launch(3))).result.session_id;
    expect((await answer(launch(4))).error).toMatchObject({ code: 'LIMIT_EXCEEDED', retryable: true, details: { limit: 'sessions', max: 2 } });
    r.socket.write(encodeFrame({ id: 12, method: 'wait', params: { session_id: first } }));
    r.socket.write(encodeFrame({ id: 13, method: 'wait', params: { session_id: second } }));
    expect((await answer({ id: 14, method: 'status', params: {} })).error).toMatchObject({ code: 'LIMIT_EXCEEDED', details: { limit: 'in_flight', max: 2 } });
    for (const id of [first, second]) await d.sbx(['cancel', id, '--grace', '0']);
    await until(() => r.frames.some((f) => f.id === 12) && r.frames.some((f) => f.id === 13), 'both waits to be answered');
    expect(r.frames.filter((f) => f.id === 12 || f.id === 13).map((f) => f.result.outcome)).toEqual(['cancelled', 'cancelled']);
    expect((await answer({ id: 15, method: 'status', params: {} })).result.mode).toBe('cgroup');
  });
});

describe('partial frames and bodies', () => {
  it('holds at most ipc.maxPendingFrameBytes of incomplete frames across all connections: past it LIMIT_EXCEEDED and closed, the rest served, RSS bounded', async () => {
    const boundBytes = 64 * MiB;
    const d = await daemon({ ipc: { maxPendingFrameBytes: boundBytes, frameTimeoutMs: 300_000 } });
    // A status request padded to a 16 MiB body (= ipc.maxFrameBytes, so the prefix is accepted).
    const overhead = encodeFrame({ id: 2, method: 'status', params: {}, pad: Buffer.alloc(MiB) }).length - 4 - MiB;
    const big = encodeFrame({ id: 2, method: 'status', params: {}, pad: Buffer.alloc(16 * MiB - overhead, 0x5a) });
    expect(big.length).toBe(4 + 16 * MiB);
    const conns = Array.from({ length: 20 }, () => raw(d.socketPath));
    for (const r of conns) r.socket.write(hello());
    await until(() => conns.every((r) => r.frames.length === 1), 'every hello to be answered');
    const rssBefore = rssKb(d.pid);
    const allButLast = big.subarray(0, big.length - 1);
    const written = conns.map((r) => new Promise<void>((resolve) => r.socket.write(allButLast, () => resolve())));
    // 16 MiB + 3 bytes held per connection: 3 fit under 64 MiB, a 4th would not.
    await until(() => conns.filter((r) => r.state.closed).length === 17, '17 connections to be refused and closed', 60_000);
    const refused = conns.filter((r) => r.state.closed);
    for (const r of refused) {
      expect(r.frames).toHaveLength(2);
      expect(r.frames[1]).toEqual({
        id: 0,
        error: {
          code: 'LIMIT_EXCEEDED',
          retryable: true,
          message: expect.stringContaining('incomplete frames'),
          details: { limit: 'pending_frame_bytes', max: boundBytes, retry_after_ms: 500 },
        },
      });
      expect(r.state.ended).toBe(true);
    }
    const held = conns.filter((r) => !r.state.closed);
    await Promise.all(conns.map((r, i) => (r.state.closed ? undefined : written[i])));
    const grownKb = rssKb(d.pid) - rssBefore;
    // 20 x 16 MiB = 320 MiB held without the bound; the slack is for the refused connections'
    // bytes, read and dropped (so they see the error and EOF rather than a reset) and not yet collected.
    expect(grownKb).toBeLessThan((boundBytes + 128 * MiB) / 1024);
    // A new connection is served meanwhile, exactly.
    const echo = await d.sbx(['run', '--', 'echo', 'ok']);
    expect([echo.status, echo.stdout.toString()]).toEqual([0, 'ok\n']);
    // The held ones were untouched: their last byte completes the request, which is answered.
    for (const r of held) r.socket.write(big.subarray(big.length - 1));
    await until(() => held.every((r) => r.frames.length === 2), 'the held frames to be answered');
    expect(held.map((r) => [r.frames[1].id, r.frames[1].result?.mode, r.state.closed])).toEqual(Array(3).fill([2, 'cgroup', false]));
  }, 120_000);

  it('closes a connection whose frame stalls mid-body after ipc.frameTimeoutMs; whole frames sent slowly, idle between them, are served', async () => {
    const d = await daemon({ ipc: { frameTimeoutMs: 500 } });
    const stalled = raw(d.socketPath);
    const slow = raw(d.socketPath);
    stalled.socket.write(hello());
    slow.socket.write(hello());
    await until(() => stalled.frames.length === 1 && slow.frames.length === 1, 'both hellos to be answered');
    const sentAt = performance.now();
    stalled.socket.write(encodeFrame({ id: 2, method: 'status', params: {} }).subarray(0, 10));
    for (let i = 0; i < 4; i++) {
      // Each request takes 200 ms to arrive (under the bound); the connection idles 700 ms between them (over it).
      const frame = encodeFrame({ id: 10 + i, method: 'status', params: {} });
      slow.socket.write(frame.subarray(0, 6));
      await pace(200);
      slow.socket.write(frame.subarray(6));
      await until(() => slow.frames.some((f) => f.id === 10 + i), `request ${10 + i} to be answered`);
      await pace(700);
    }
    await until(() => stalled.state.closed, 'the stalled connection to be closed');
    expect(stalled.frames[1]).toEqual({
      id: 0,
      error: { code: 'LIMIT_EXCEEDED', retryable: true, message: expect.stringContaining('500 ms'), details: { limit: 'frame_time', max: 500 } },
    });
    expect(stalled.state.ended).toBe(true);
    expect(stalled.state.closedAt - sentAt).toBeGreaterThanOrEqual(500);
    expect(slow.state.closed).toBe(false);
    expect(slow.frames.slice(1).map((f) => [f.id, f.result?.mode])).toEqual([10, 11, 12, 13].map((id) => [id, 'cgroup']));
    expect((await d.sbx(['status'])).status).toBe(0);
  });

  it('does not count against the frame time the time the supervisor stops reading a client that does not read its answers', async () => {
    const d = await daemon({ ipc: { frameTimeoutMs: 1000 } });
    const c = await d.client();
    const { session_id } = await c.launch({ argv: ['head', '-c', String(16 * MiB), '/dev/zero'], cwd: '/' });
    await c.wait({ session_id });
    const r = raw(d.socketPath);
    r.socket.write(hello());
    await until(() => r.frames.length === 1, 'the hello answer');
    r.socket.pause(); // read nothing: the supervisor's queue passes 4 MiB and it stops reading this connection
    const status = encodeFrame({ id: 3, method: 'status', params: {} });
    r.socket.write(Buffer.concat([encodeFrame({ id: 2, method: 'subscribe', params: { session_id, stream: 'stdout' } }), status.subarray(0, 5)]));
    await pace(2500); // 2.5 s not read, over the 1 s bound
    r.socket.resume();
    r.socket.write(status.subarray(5));
    await until(() => r.frames.some((f) => f.id === 3) || r.state.closed, 'the status answer');
    expect(r.frames.find((f) => f.id === 3)?.result?.mode).toBe('cgroup');
    await until(() => r.frames.some((f) => f.event === 'end'), 'the end of the subscription');
    expect(r.frames.filter((f) => f.event === 'output').reduce((n, f) => n + f.data.length, 0)).toBe(16 * MiB);
    expect(r.state.closed).toBe(false);
  });

  it('answers a body that is not a msgpack map (0xc1, an integer, an array, a string) with INVALID_ARGUMENT and closes the connection', async () => {
    const d = await daemon();
    for (const body of [[0xc1], [0x2a], [0x92, 0x01, 0x02], [0xa1, 0x78]]) {
      const r = raw(d.socketPath);
      // A status request follows in the same write: it must not run after the bad frame.
      r.socket.write(Buffer.concat([hello(), rawFrame(body), encodeFrame({ id: 3, method: 'status', params: {} })]));
      await until(() => r.state.closed, `the connection to be closed after ${Buffer.from(body).toString('hex')}`);
      expect(r.state.ended).toBe(true);
      expect(r.frames).toHaveLength(2);
      expect(r.frames[1]).toMatchObject({ id: 0, error: { code: 'INVALID_ARGUMENT', retryable: false } });
      expect(r.frames[1].error.message).toContain('map');
    }
    const echo = await d.sbx(['run', '--', 'echo', 'ok']);
    expect([echo.status, echo.stdout.toString()]).toEqual([0, 'ok\n']);
  });
});

describe('backpressure', () => {
  it('a reader stalled for 5 s while 200 MiB are written: bounded RSS, the producer never blocks, every byte arrives', async () => {
    const d = await daemon();
    const c = await d.client();
    const copy = join(d.dir, 'copy.bin');
    const { session_id } = await c.launch({ argv: ['sh', '-c', `head -c 209715200 /dev/urandom | tee ${copy}`], cwd: '/' });
    const rssBefore = rssKb(d.pid);
    const reader = readOutput({ socketPath: d.socketPath, selector: { session_id }, stream: 'stdout', follow: true });
    const first = await reader.next();
    expect(first.done).toBe(false);
    const stalledAt = Date.now();
    // The reader takes nothing more now. The producer must still finish, with a receipt.
    const watcher = await d.client();
    const receipt = await watcher.wait({ session_id });
    const rssPeak = rssKb(d.pid);
    await until(() => Date.now() - stalledAt >= 5000, 'the 5 s stall to be over', 10_000);
    expect(Date.parse(receipt.ended_at)).toBeLessThan(stalledAt + 5000);
    expect(rssPeak - rssBefore).toBeLessThan(96 * 1024); // kB; 200 MiB went to disk, not memory
    const hash = (await import('node:crypto')).createHash('sha256');
    let bytes = first.value!.data.length;
    hash.update(first.value!.data);
    for await (const chunk of reader) {
      hash.update(chunk.data);
      bytes += chunk.data.length;
    }
    expect(bytes).toBe(209715200);
    expect(hash.digest('hex')).toBe(receipt.output.stdout!.sha256);
    expect(receipt.output.stdout!.sha256).toBe(sha256(readFileSync(copy)));
  });

  it('logs --from past the end: CURSOR_OUT_OF_RANGE at once; with --follow it waits for those bytes, unless the stream is final', async () => {
    const d = await daemon();
    // "second" comes only once the test says so: no race against a sleep.
    const go = join(d.dir, 'go');
    const detached = await d.sbx(['run', '--detach', '--', 'sh', '-c', `echo first; while [ ! -e ${go} ]; do sleep 0.02; done; echo second`]);
    const id = detached.stdout.toString().trim();
    await until(async () => JSON.parse((await d.sbx(['ps', '--json'])).stdout.toString())[0]?.cursors.stdout === 6, '"first" to be stored');
    const now = await d.sbx(['logs', id, '--from', '10']);
    expect(now.status).toBe(125);
    expect(now.stderr.toString()).toContain('CURSOR_OUT_OF_RANGE');
    const following = d.sbx(['logs', id, '--from', '10', '--follow']);
    writeFileSync(go, '');
    const followed = await following;
    expect(followed.status).toBe(0);
    expect(followed.stdout.toString()).toBe('second\n'.slice(4)); // bytes 10.. of "first\nsecond\n"
    // Once the stream is final, a follow from past its end has nothing to wait for.
    await d.sbx(['wait', id]);
    const pastFinal = await d.sbx(['logs', id, '--from', '14', '--follow']);
    expect(pastFinal.status).toBe(125);
    expect(pastFinal.stderr.toString()).toContain('CURSOR_OUT_OF_RANGE: cursor 14 is past the end of stdout (13, its final length)');
    const client = await d.client();
    await expect(client.readIndex({ session_id: id, stream: 'stdout', from: 14, follow: true })).rejects.toMatchObject({
      code: 'CURSOR_OUT_OF_RANGE',
      details: { cursor: 13 },
    });
    // At the end exactly, the follow ends at once.
    const atEnd = await d.sbx(['logs', id, '--from', '13', '--follow']);
    expect([atEnd.status, atEnd.stdout.toString()]).toEqual([0, '']);
    // A follow from past the end of a stream that then ends shorter: its end event says where the stream ended.
    const go2 = join(d.dir, 'go2');
    const short = (await client.launch({ argv: ['sh', '-c', `echo first; while [ ! -e ${go2} ]; do sleep 0.02; done`], cwd: '/' })).session_id;
    const ended = new Promise<unknown>((resolve, reject) => {
      client
        .subscribe({ session_id: short, stream: 'stdout', from: 10, follow: true }, { onOutput: () => reject(new Error('no output past 10')), onEnd: resolve })
        .catch(reject);
    });
    writeFileSync(go2, '');
    expect(await ended).toMatchObject({ event: 'end', stream: 'stdout', cursor: 6, final: true });
    const missing = await d.sbx(['logs', 's-0-nope']);
    expect(missing.status).toBe(125);
    expect(missing.stderr.toString()).toContain('SESSION_NOT_FOUND');
  });
});

describe('peer credentials', () => {
  // Made in beforeAll (not at collection: a run that filters these tests out never removes it).
  let shared = '';
  let script = '';
  beforeAll(() => {
    shared = mkdtempSync(join(tmpdir(), 'sbx-peer-'));
    chmodSync(shared, 0o711);
    // A client with no dependencies, so it runs as nobody wherever the checkout lives.
    script = join(shared, 'hello-as-peer.mjs');
    writeFileSync(
      script,
      `import { connect } from 'node:net';
const s = connect(process.argv[2]);
const body = Buffer.from('83a26964 01a66d6574686f64 a568656c6c6f a6706172616d73 81a876657273696f6e73 9101'.replace(/ /g, ''), 'hex');
const head = Buffer.alloc(4); head.writeUInt32BE(body.length);
let got = Buffer.alloc(0);
s.on('connect', () => s.write(Buffer.concat([head, body])));
s.on('data', (d) => { got = Buffer.concat([got, d]); if (got.includes('version') || got.includes('UNAUTHORIZED')) s.end(); });
s.on('close', () => console.log(got.toString('latin1').replace(/[^ -~]/g, '.')));
s.on('error', (e) => console.log('error ' + e.code));
`,
    );
    chmodSync(script, 0o644);
  });
  afterAll(() => rmSync(shared, { recursive: true, force: true }));
  const asNobody = (socketPath: string) =>
    execFileSync('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', process.execPath, script, socketPath], { env: {} }).toString();

  it('refuses a peer outside the allow-list (a client running as nobody) with UNAUTHORIZED, and logs it', async () => {
    const d = await daemon({ ipc: { socketGroup: 'nogroup' } }, join(shared, 'refuse.sock'));
    const out = asNobody(d.socketPath);
    expect(out).toContain('UNAUTHORIZED');
    expect(out).toContain('uid 65534');
    await until(() => /refused a peer outside the allow-list/.test(d.log()) && /"uid":65534/.test(d.log()), 'the log line');
    const st = statSync(d.socketPath);
    expect(st.mode & 0o777).toBe(0o660);
    expect(st.gid).toBe(65534);
  });

  it('admits that peer once its gid is allowed', async () => {
    const d = await daemon({ ipc: { socketGroup: 65534, allowGids: [65534] } }, join(shared, 'admit.sock'));
    const out = asNobody(d.socketPath);
    expect(out).toContain('version');
    expect(out).not.toContain('UNAUTHORIZED');
  });
});

describe('client library', () => {
  it('typed errors carry code and retryability', async () => {
    const d = await daemon();
    const c = await SupervisorClient.connect({ socketPath: d.socketPath });
    try {
      await c.wait({ session_id: 's-0-missing' });
      expect.unreachable();
    } catch (err) {
      expect(isSupervisorError(err, 'SESSION_NOT_FOUND')).toBe(true);
      expect((err as { retryable: boolean }).retryable).toBe(false);
    } finally {
      c.close();
    }
  });
});
