// The client transports (ipc/transport.ts) and the client's keepalive (ipc/client.ts) against
// fake supervisors on real sockets: a Unix socket, a WebSocket server on loopback, and a
// spawned command (test/fixtures/stdio-bridge.mjs): framing split at every byte, one message
// per frame body, HTTP refusals, the silence and connect deadlines, a keyless launch never resent.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer as createHttpServer, type Server as HttpServer } from 'node:http';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { WebSocketServer, type WebSocket } from 'ws';
import { LaunchUnconfirmedError, ReconnectingClient, SupervisorClient } from '../../../ipc/client.js';
import { isSupervisorError } from '../../../ipc/errors.js';
import { decodeBody, encodeFrame, FrameDecoder } from '../../../ipc/framing.js';
import { resolveEndpoint } from '../../../ipc/transport.js';
import { pidsInGroup, pidsWithMarker, ROOT, runSbx, SBX_BIN, until } from '../../helpers/daemon.js';

const dir = mkdtempSync(join(tmpdir(), 'sbx-transport-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const BRIDGE = join(ROOT, 'test/fixtures/stdio-bridge.mjs');

type Frame = { id: number; method: string; params: Record<string, unknown> };
type Reply = (value: unknown) => void;
/** What a fake supervisor does with each request; returns nothing to leave it unanswered. */
type Handler = (frame: Frame, reply: Reply, socket: Socket | WebSocket) => void;

const HELLO = { version: 1, server: 'fake', instance: 'i', generation: 1 };
/** Answers hello and ping; everything else is left to `rest`. */
const standard =
  (rest: Handler = () => {}): Handler =>
  (f, reply, s) => {
    if (f.method === 'hello') reply({ id: f.id, result: HELLO });
    else if (f.method === 'ping') reply({ id: f.id, result: { now_ms: Date.now() } });
    else rest(f, reply, s);
  };

const cleanups: (() => void | Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

let n = 0;
/** A fake supervisor on a Unix socket; `log` has every request it received. */
async function unixServer(handler: Handler, write: (s: Socket, frame: Buffer) => void = (s, b) => s.write(b)) {
  const path = join(dir, `s${n++}.sock`);
  const log: Frame[] = [];
  const sockets = new Set<Socket>();
  const server: Server = createServer((s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
    s.on('error', () => {});
    const decoder = new FrameDecoder();
    s.on('data', (d: Buffer) =>
      decoder.push(d, (v) => {
        log.push(v as Frame);
        handler(v as Frame, (r) => write(s, encodeFrame(r)), s);
      }),
    );
  });
  await new Promise<void>((r) => server.listen(path, r));
  cleanups.push(() => {
    for (const s of sockets) s.destroy();
    return new Promise<void>((r) => server.close(() => r()));
  });
  return { path, log, sockets };
}

/** A fake supervisor's WebSocket listener on loopback: one binary message = one frame body. */
async function wsServer(handler: Handler, opts: { token?: string } = {}) {
  const log: { frame: Frame; firstByte: number; auth: string | undefined }[] = [];
  const http: HttpServer = createHttpServer((_req, res) => {
    res.writeHead(426, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ error: { code: 'INVALID_ARGUMENT', message: 'this is a WebSocket endpoint: upgrade required' } }));
  });
  const wss = new WebSocketServer({ noServer: true });
  http.on('upgrade', (req, socket, head) => {
    if (opts.token !== undefined && req.headers.authorization !== `Bearer ${opts.token}`) {
      const body = JSON.stringify({ error: { code: 'UNAUTHORIZED', message: 'no valid bearer token' } });
      socket.end(
        `HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`,
      );
      return;
    }
    wss.handleUpgrade(req, socket, head, (ws) => {
      ws.on('message', (data: Buffer, isBinary: boolean) => {
        expect(isBinary).toBe(true);
        const frame = decodeBody(data) as Frame;
        log.push({ frame, firstByte: data[0]!, auth: req.headers.authorization });
        handler(frame, (r) => ws.send(encodeFrame(r).subarray(4)), ws);
      });
    });
  });
  await new Promise<void>((r) => http.listen(0, '127.0.0.1', r));
  const port = (http.address() as { port: number }).port;
  cleanups.push(() => {
    for (const c of wss.clients) c.terminate();
    http.closeAllConnections();
    return new Promise<void>((r) => http.close(() => r()));
  });
  return { url: `ws://127.0.0.1:${port}`, log, wss };
}

/** Records a client for closing after the test. */
function track(c: SupervisorClient): SupervisorClient {
  cleanups.push(() => c.close());
  return c;
}

describe('resolveEndpoint', () => {
  it('takes the options, else SBX_URL with SBX_TOKEN / SBX_TOKEN_FILE, else the socket', () => {
    const env = { SBX_URL: 'ws://h:1', SBX_TOKEN: 't-env', SBX_TOKEN_FILE: '/f-env', SBX_SOCKET: '/s-env' };
    expect(resolveEndpoint({ socketPath: '/s' }, env)).toEqual({ kind: 'socket', socketPath: '/s' });
    expect(resolveEndpoint({}, env)).toEqual({ kind: 'url', url: 'ws://h:1', token: 't-env', tokenFile: null, caFile: null });
    expect(resolveEndpoint({}, { SBX_URL: 'wss://h:1', SBX_TOKEN_FILE: '/f-env' })).toEqual({
      kind: 'url',
      url: 'wss://h:1',
      token: null,
      tokenFile: '/f-env',
      caFile: null,
    });
    expect(resolveEndpoint({ url: 'ws://x:2', tokenFile: '/f' }, env)).toEqual({ kind: 'url', url: 'ws://x:2', token: null, tokenFile: '/f', caFile: null });
    expect(resolveEndpoint({ url: 'ws://x:2', token: 'tok', tokenFile: '/f' }, env)).toMatchObject({ token: 'tok', tokenFile: null });
    expect(resolveEndpoint({}, { SBX_SOCKET: '/s-env' })).toEqual({ kind: 'socket', socketPath: '/s-env' });
    expect(resolveEndpoint({ command: ['ssh', 'h', 'sbx', 'bridge'] }, env)).toEqual({
      kind: 'command',
      command: ['ssh', 'h', 'sbx', 'bridge'],
      stderr: 'inherit',
    });
  });

  it('refuses two endpoints, a URL that is not ws(s)://, and an empty command', () => {
    expect(() => resolveEndpoint({ socketPath: '/s', url: 'ws://h:1' })).toThrow(/socketPath and url both name a supervisor/);
    expect(() => resolveEndpoint({ url: 'http://h:1' })).toThrow(/ws:\/\/HOST:PORT or wss:\/\/HOST:PORT/);
    expect(() => resolveEndpoint({ command: [] })).toThrow(/non-empty array/);
  });
});

describe('Unix socket transport', () => {
  it('reassembles frames split at every byte, and several frames in one write', async () => {
    // One byte per write, each in its own turn of the loop, frames one after another.
    let queue = Promise.resolve();
    const byteByByte = (sock: Socket, frame: Buffer) => {
      queue = queue.then(async () => {
        for (let i = 0; i < frame.length && !sock.destroyed; i++) await new Promise<void>((r) => sock.write(frame.subarray(i, i + 1), () => setImmediate(r)));
      });
    };
    const s = await unixServer(
      standard((f, reply) => reply({ id: f.id, result: { n: f.id } })),
      byteByByte,
    );
    const c = track(await SupervisorClient.connect({ socketPath: s.path }));
    expect(c.hello).toEqual(HELLO);
    const answers = await Promise.all([c.request('status', {}), c.request('status', {}), c.request('status', {})]);
    expect(answers.map((a) => (a as unknown as { n: number }).n)).toEqual([2, 3, 4]);
  });

  it('keeps the ENOTSOCK message for a path that is not a socket', async () => {
    const file = join(dir, 'not-a-socket');
    writeFileSync(file, '');
    await expect(SupervisorClient.connect({ socketPath: file })).rejects.toMatchObject({
      code: 'ENOTSOCK',
      message: `connect ENOTSOCK ${file}: a regular file, not a socket`,
    });
  });
});

describe('keepalive', () => {
  it('pings while a call is pending and keeps a connection that answers them', async () => {
    const s = await unixServer(standard()); // never answers `wait`
    const c = track(await SupervisorClient.connect({ socketPath: s.path, keepaliveMs: 40, silenceMs: 200 }));
    let failed: Error | null = null;
    c.wait({ session_id: 'x' }).catch((e: Error) => (failed = e));
    await until(() => s.log.filter((f) => f.method === 'ping').length >= 8, 'eight pings');
    expect(failed).toBeNull();
    expect(s.log.find((f) => f.method === 'ping')!.params).toEqual({});
  });

  it('sends nothing and keeps the connection while no call is pending', async () => {
    const s = await unixServer(standard());
    const c = track(await SupervisorClient.connect({ socketPath: s.path, keepaliveMs: 20, silenceMs: 60 }));
    let closed: Error | null = null;
    c.onClose((e) => (closed = e));
    const t = performance.now();
    await until(() => performance.now() - t > 400, 'time passing');
    expect(closed).toBeNull();
    expect(s.log.map((f) => f.method)).toEqual(['hello']);
  });

  it('declares a silent transport dead after silenceMs: the pending call fails ETIMEDOUT, not a SupervisorError', async () => {
    const s = await unixServer((f, reply) => f.method === 'hello' && reply({ id: f.id, result: HELLO })); // pings go unanswered
    const c = track(await SupervisorClient.connect({ socketPath: s.path, keepaliveMs: 50, silenceMs: 300 }));
    const t = performance.now();
    const err = (await c.wait({ session_id: 'x' }).catch((e: Error) => e)) as NodeJS.ErrnoException;
    const tookMs = performance.now() - t;
    expect(isSupervisorError(err)).toBe(false);
    expect(err.code).toBe('ETIMEDOUT');
    expect(err.message).toMatch(/no byte from the supervisor at .* while calls were pending/);
    expect(tookMs).toBeGreaterThanOrEqual(300);
    expect(tookMs).toBeLessThan(300 + 1000);
    expect(s.log.filter((f) => f.method === 'ping').length).toBeGreaterThanOrEqual(1);
    await until(() => s.sockets.size === 0, 'the dead connection closed');
  });

  it('does not count silence while the client holds reading (paused), and does again once resumed', async () => {
    const s = await unixServer((f, reply) => f.method === 'hello' && reply({ id: f.id, result: HELLO }));
    const c = track(await SupervisorClient.connect({ socketPath: s.path, keepaliveMs: 30, silenceMs: 150 }));
    let failed: NodeJS.ErrnoException | null = null;
    c.pause();
    c.wait({ session_id: 'x' }).catch((e: NodeJS.ErrnoException) => (failed = e));
    const t = performance.now();
    await until(() => performance.now() - t > 600, 'four silence deadlines passing');
    expect(failed).toBeNull();
    c.resume();
    await until(() => failed, 'the deadline once resumed', 2000);
    expect(failed!.code).toBe('ETIMEDOUT');
  });

  it('bounds connect + hello by connectTimeoutMs', async () => {
    const s = await unixServer(() => {}); // accepts, never answers the hello
    const t = performance.now();
    const err = (await SupervisorClient.connect({ socketPath: s.path, connectTimeoutMs: 250 }).catch((e: Error) => e)) as NodeJS.ErrnoException;
    expect(err.code).toBe('ETIMEDOUT');
    expect(err.message).toBe(`no answer from the supervisor at ${s.path} within 250 ms (connect and hello)`);
    expect(performance.now() - t).toBeLessThan(2000);
    await until(() => s.sockets.size === 0, 'the connection closed');
  });
});

describe('launch resend', () => {
  it('a keyless launch that lost its connection is not resent (LaunchUnconfirmedError); a keyed one is', async () => {
    const s = await unixServer(
      standard((f, _reply, sock) => {
        // The first launch of each key is taken, and the connection dies before its answer.
        if (f.method === 'launch' && s.log.filter((x) => x.method === 'launch' && x.params.invocation_key === f.params.invocation_key).length === 1)
          (sock as Socket).destroy();
        else if (f.method === 'launch')
          (sock as Socket).write(
            encodeFrame({
              id: f.id,
              result: { session_id: 's1', invocation_key: f.params.invocation_key, existing: true, state: 'running', command_digest: 'd' },
            }),
          );
      }),
    );
    const conn = new ReconnectingClient({ socketPath: s.path, reconnectMs: 2000 });
    cleanups.push(() => conn.drop());
    const keyless = await conn.run((c) => c.launch({ argv: ['true'], cwd: '/' })).catch((e: Error) => e);
    expect(keyless).toBeInstanceOf(LaunchUnconfirmedError);
    expect((keyless as LaunchUnconfirmedError).code).toBe('LAUNCH_UNCONFIRMED');
    expect(s.log.filter((f) => f.method === 'launch')).toHaveLength(1);
    const keyed = await conn.run((c) => c.launch({ argv: ['true'], cwd: '/', invocation_key: 'k1' }));
    expect(keyed).toMatchObject({ session_id: 's1', existing: true });
    expect(s.log.filter((f) => f.method === 'launch' && f.params.invocation_key === 'k1')).toHaveLength(2);
  });
});

describe('WebSocket transport', () => {
  it('sends one binary message per frame body (no length prefix) with the bearer token', async () => {
    const s = await wsServer(
      standard((f, reply) => reply({ id: f.id, result: { got: [f.params.session_id, ...(f.params.data as Uint8Array)] } })),
      { token: 'sekret' },
    );
    const c = track(await SupervisorClient.connect({ url: s.url, token: 'sekret' }));
    expect(c.hello).toEqual(HELLO);
    const data = Buffer.from([0, 1, 2, 255]);
    expect(await c.request('write', { session_id: 'x', data })).toEqual({ got: ['x', 0, 1, 2, 255] });
    // The message starts with the map itself (fixmap or map16), not a length prefix.
    expect(s.log.map((l) => [l.frame.method, (l.firstByte >= 0x80 && l.firstByte <= 0x8f) || l.firstByte === 0xde, l.auth])).toEqual([
      ['hello', true, 'Bearer sekret'],
      ['write', true, 'Bearer sekret'],
    ]);
  });

  it('reads the token file at each connect (a rotated file is used), and SBX_TOKEN_FILE', async () => {
    const s = await wsServer(standard(), { token: 'second' });
    const file = join(dir, 'token');
    writeFileSync(file, 'first\n');
    const err = await SupervisorClient.connect({ url: s.url, tokenFile: file }).catch((e: Error) => e);
    expect(isSupervisorError(err, 'UNAUTHORIZED')).toBe(true);
    expect((err as Error).message).toBe(
      `the supervisor at ${s.url} answered HTTP 401 Unauthorized: no valid bearer token (check the token: --token-file, SBX_TOKEN or SBX_TOKEN_FILE)`,
    );
    writeFileSync(file, 'second\n');
    track(await SupervisorClient.connect({ url: s.url, tokenFile: file }));
    const saved = process.env.SBX_TOKEN_FILE;
    process.env.SBX_TOKEN_FILE = file;
    try {
      track(await SupervisorClient.connect({ url: s.url }));
    } finally {
      if (saved === undefined) delete process.env.SBX_TOKEN_FILE;
      else process.env.SBX_TOKEN_FILE = saved;
    }
    await expect(SupervisorClient.connect({ url: s.url, tokenFile: join(dir, 'absent') })).rejects.toThrow(
      `cannot read the token file ${join(dir, 'absent')}: ENOENT`,
    );
  });

  it('a plain HTTP answer (426) is a clear INVALID_ARGUMENT; nothing listening is ECONNREFUSED', async () => {
    // What a listener answers a request that is no WebSocket upgrade (or a proxy that dropped it).
    const http = createHttpServer();
    const body = JSON.stringify({ error: { code: 'INVALID_ARGUMENT', message: 'upgrade required, really!' } });
    http.on('upgrade', (_req, socket) =>
      socket.end(`HTTP/1.1 426 Upgrade Required\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`),
    );
    await new Promise<void>((r) => http.listen(0, '127.0.0.1', r));
    cleanups.push(() => new Promise<void>((r) => http.close(() => r())));
    const url = `ws://127.0.0.1:${(http.address() as { port: number }).port}`;
    const err = await SupervisorClient.connect({ url }).catch((e: Error) => e);
    expect(isSupervisorError(err, 'INVALID_ARGUMENT')).toBe(true);
    expect((err as Error).message).toMatch(/answered HTTP 426 Upgrade Required: upgrade required, really! \(the WebSocket upgrade did not reach it/);
    http.close();
    await new Promise((r) => setTimeout(r, 0));
    await expect(SupervisorClient.connect({ url })).rejects.toMatchObject({ code: 'ECONNREFUSED' });
  });

  it('a text message from the peer closes the connection with INVALID_ARGUMENT', async () => {
    const s = await wsServer(standard((f, _reply, ws) => (ws as WebSocket).send('not a frame')));
    const c = track(await SupervisorClient.connect({ url: s.url }));
    const err = await c.status().catch((e: Error) => e);
    expect(isSupervisorError(err, 'INVALID_ARGUMENT')).toBe(true);
    expect((err as Error).message).toMatch(/text message/);
  });

  it('a silent WebSocket peer is declared dead after silenceMs', async () => {
    const s = await wsServer((f, reply) => f.method === 'hello' && reply({ id: f.id, result: HELLO }));
    const c = track(await SupervisorClient.connect({ url: s.url, keepaliveMs: 50, silenceMs: 250 }));
    await expect(c.wait({ session_id: 'x' })).rejects.toMatchObject({ code: 'ETIMEDOUT' });
    await until(() => s.wss.clients.size === 0, 'the server seeing it close');
  });
});

describe('command transport', () => {
  it('carries the length-prefixed stream on stdin/stdout; close kills it by pid and reaps it', async () => {
    const s = await unixServer(standard((f, reply) => reply({ id: f.id, result: { sessions: [] } })));
    const c = track(await SupervisorClient.connect({ command: [process.execPath, BRIDGE, s.path] }));
    expect(c.hello).toEqual(HELLO);
    expect(await c.ps()).toEqual({ sessions: [] });
    const pid = c.transportPid!;
    expect(pid).toBeGreaterThan(0);
    c.close();
    await until(() => !alive(pid), 'the command gone (exited and reaped)');
  });

  it('runs the command in its own process group and on close signals the group: nothing it started is left', async () => {
    const s = await unixServer(standard((f, reply) => reply({ id: f.id, result: { sessions: [] } })));
    const marker = `sbx-transport-group-${process.pid}-${n++}`;
    // A grandchild that ignores nothing and outlives the bridge unless its group is signalled.
    const script = `${JSON.stringify(process.execPath)} -e 'setTimeout(() => {}, 30000)' ${marker} & ${JSON.stringify(process.execPath)} ${JSON.stringify(BRIDGE)} ${JSON.stringify(s.path)}; wait`;
    const c = track(await SupervisorClient.connect({ command: ['sh', '-c', script] }));
    expect(await c.ps()).toEqual({ sessions: [] });
    const pid = c.transportPid!;
    const [grandchild] = await until(() => (pidsWithMarker(marker).length ? pidsWithMarker(marker) : null), 'the grandchild started');
    const stat = readFileSync(`/proc/${grandchild}/stat`, 'utf8');
    expect(Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[2])).toBe(pid); // its group is the command's
    expect(pidsInGroup(pid).length).toBeGreaterThanOrEqual(3); // sh, the bridge, the grandchild
    c.close();
    await until(() => pidsInGroup(pid).length === 0 && pidsWithMarker(marker).length === 0, 'no process of the group left');
  });

  it('an ended command fails the calls naming it, with its captured stderr; one that cannot start fails ENOENT', async () => {
    const script = 'process.stdin.once("data", () => { process.stderr.write("remote: no such box\\n"); process.exit(3); })';
    const c = await SupervisorClient.connect({ command: [process.execPath, '-e', script], commandStderr: 'capture' }).catch((e: Error) => e);
    expect((c as NodeJS.ErrnoException).code).toBe('ECONNRESET');
    expect((c as Error).message).toMatch(/the transport command \(.* -e .*\) exited with status 3: remote: no such box$/);
    await expect(SupervisorClient.connect({ command: [join(dir, 'no-such-program')] })).rejects.toMatchObject({ code: 'ENOENT' });
  });

  it('a command that reads and writes nothing fails connect within connectTimeoutMs, and is killed', async () => {
    const marker = `sbx-transport-silent-${process.pid}-${n++}`;
    const t = performance.now();
    const err = await SupervisorClient.connect({ command: [process.execPath, '-e', 'setInterval(() => {}, 1000)', marker], connectTimeoutMs: 300 }).catch(
      (e: Error) => e,
    );
    expect((err as NodeJS.ErrnoException).code).toBe('ETIMEDOUT');
    expect(performance.now() - t).toBeLessThan(2000);
    await until(() => pidsWithMarker(marker).length === 0, 'the silent command gone');
  });
});

describe('sbx --url (the CLI over a WebSocket, from its bundle)', () => {
  it('talks to the URL with the token file', async () => {
    const s = await wsServer(
      standard((f, reply) => reply({ id: f.id, result: { sessions: [] } })),
      { token: 'tok-cli' },
    );
    const file = join(dir, 'cli-token');
    writeFileSync(file, 'tok-cli\n', { mode: 0o600 });
    // Run asynchronously: the fake listener is in this process.
    const r = await runSbx(join(dir, 'none.sock'), ['--url', s.url, '--token-file', file, 'ps', '--json']);
    expect(r.stderr.toString()).toBe('');
    expect(r.status).toBe(0);
    expect(JSON.parse(r.stdout.toString())).toEqual([]);
    expect(s.log.map((l) => [l.frame.method, l.auth])).toEqual([
      ['hello', 'Bearer tok-cli'],
      ['ps', 'Bearer tok-cli'],
    ]);
    const bad = await runSbx(join(dir, 'none.sock'), ['ps', '--url', s.url], { env: { SBX_TOKEN: 'wrong' } });
    expect(bad.status).toBe(125);
    expect(bad.stderr.toString()).toMatch(
      /^sbx: UNAUTHORIZED: the supervisor at ws:\/\/127\.0\.0\.1:\d+ answered HTTP 401 Unauthorized: no valid bearer token/,
    );
  });

  it('refuses --socket with --url, --token-file without a URL and a URL that is not ws(s):// (125, nothing sent); says what a URL with nobody listening answered', () => {
    const both = spawnSync(SBX_BIN, ['--socket', '/nowhere', '--url', 'ws://127.0.0.1:1', 'ps']);
    expect(both.status).toBe(125);
    expect(both.stderr.toString()).toBe('sbx: INVALID_ARGUMENT: --socket and --url both name a supervisor; give one of them\n');
    const env = { ...process.env };
    delete env.SBX_URL;
    const tokenOnly = spawnSync(SBX_BIN, ['ps', '--token-file', '/x'], { env });
    expect(tokenOnly.status).toBe(125);
    expect(tokenOnly.stderr.toString()).toBe('sbx: INVALID_ARGUMENT: --token-file is the token of a supervisor URL: give --url (or SBX_URL) too\n');
    const nobody = spawnSync(SBX_BIN, ['--url', 'ws://127.0.0.1:1', 'ps'], { env });
    expect(nobody.status).toBe(125);
    expect(nobody.stderr.toString()).toBe(
      'sbx: cannot reach the supervisor at ws://127.0.0.1:1 (connect ECONNREFUSED 127.0.0.1:1); is its listener on (serve --listen, remote.listen)? --url or SBX_URL name another\n',
    );
    const notWs = spawnSync(SBX_BIN, ['--url', 'http://127.0.0.1:1', 'ps'], { env });
    expect([notWs.status, notWs.stderr.toString()]).toEqual([
      125,
      'sbx: INVALID_ARGUMENT: a supervisor URL is ws://HOST:PORT or wss://HOST:PORT, got "http://127.0.0.1:1"\n',
    ]);
  });
});

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}
