// The WebSocket listener (docs/guide/remote.md) against a real supervisor on loopback, driven by
// `ws` directly (test/helpers/ws-peer.ts): a command launched, its output and receipt read
// over ws; then bad input (no token, a wrong one, one a byte off: 401, counted, each later
// failure from the address answered later; a slow handshake; an oversized and a text message;
// a plain HTTP GET; a flood past remote.maxConnections), after each of which a good client is
// still served; headers over 16 KiB (431); token rotation by rename, a rotated file that
// fails the start-up checks (refused, fail closed); an invalid SBX_REMOTE_TOKEN (exit 2); a silent peer dropped by keepalive; TLS (openssl).
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, renameSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { request } from 'node:http';
import { connect } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import type { Receipt, StatusResult } from '../../ipc/protocol.js';
import { DAEMON_ARGV, TestDaemon, until, within } from '../helpers/daemon.js';
import { refusedUpgrade, WsPeer } from '../helpers/ws-peer.js';

const sha = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');
const MAX_FRAME_BYTES = 64 * 1024;
const MAX_CONNECTIONS = 4;
const PING_INTERVAL_MS = 300;
const PING_TIMEOUT_MS = 300;
const UPGRADE_TIMEOUT_MS = 500;
const HELLO_TIMEOUT_MS = 3000;

/** GET path on host:port: status, headers, body. */
function httpGet(
  host: string,
  port: number,
  path: string,
  headers: Record<string, string> = {},
): Promise<{ status: number; headers: Record<string, unknown>; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host, port, path, headers, agent: false }, (res) => {
      const parts: Buffer[] = [];
      res.on('data', (d: Buffer) => parts.push(d));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(parts).toString() }));
    });
    req.on('error', reject);
    req.end();
  });
}

/** One sample of the daemon's /metrics (every series used here is pre-declared at 0). */
async function metric(metricsAddr: string, series: string): Promise<number> {
  const [host, port] = metricsAddr.split(':');
  const r = await httpGet(host, Number(port), '/metrics');
  for (const line of r.body.split('\n')) if (line.startsWith(`${series} `)) return Number(line.slice(series.length + 1));
  throw new Error(`no series ${series}`);
}

/** A launch over ws, its stdout read to the end and its receipt: the bytes, their digest against the receipt's. */
async function launchAndRead(url: string, token: string, argv: string[]): Promise<{ out: Buffer; receipt: Receipt }> {
  const peer = await WsPeer.connect(url, token);
  try {
    const launched = await peer.request<{ session_id: string }>('launch', { argv, cwd: '/' });
    const out = await peer.readAll(launched.session_id);
    const receipt = await peer.request<Receipt>('wait', { session_id: launched.session_id });
    return { out, receipt };
  } finally {
    peer.close();
  }
}

/** The status once the WebSocket listener is up (it starts just after the Unix socket answers). */
async function remoteUp(d: TestDaemon): Promise<StatusResult> {
  const client = await d.client();
  return until(async () => {
    const status = (await client.request('status', {})) as StatusResult;
    return status.remote ? status : null;
  }, 'the WebSocket listener');
}

describe('the WebSocket listener', () => {
  const d = new TestDaemon({
    config: {
      ipc: { maxFrameBytes: MAX_FRAME_BYTES, handshakeTimeoutMs: HELLO_TIMEOUT_MS },
      metrics: { listen: '127.0.0.1:0' },
      remote: {
        listen: '127.0.0.1:0',
        maxConnections: MAX_CONNECTIONS,
        pingIntervalMs: PING_INTERVAL_MS,
        pingTimeoutMs: PING_TIMEOUT_MS,
        upgradeTimeoutMs: UPGRADE_TIMEOUT_MS,
      },
    },
  });
  let url = '';
  let host = '';
  let port = 0;
  let metricsAddr = '';
  let tokenFile = '';
  let token = '';

  beforeAll(async () => {
    await d.start();
    const status = await remoteUp(d);
    url = status.remote!;
    metricsAddr = status.metrics!;
    const m = /^ws:\/\/(127\.0\.0\.1):(\d+)\/$/.exec(url);
    expect(m, url).not.toBeNull();
    host = m![1];
    port = Number(m![2]);
    tokenFile = join(d.stateDir, 'remote-token');
    token = readFileSync(tokenFile, 'utf8').trim();
  });
  afterAll(async () => {
    await d.stop();
  });

  /** A good client is served: hello, ping, a launch read to its receipt. */
  async function stillServed(): Promise<void> {
    const marker = `served-${Math.random().toString(36).slice(2)}`;
    const { out, receipt } = await launchAndRead(url, token, ['printf', '%s', marker]);
    expect(out.toString()).toBe(marker);
    expect(receipt.exit).toEqual({ code: 0, signal: null });
  }

  it('makes the token file 0600 at first start, names it in the log (never the token) and serves status.remote', () => {
    expect(statSync(tokenFile).mode & 0o777).toBe(0o600);
    expect(token).toMatch(/^[A-Za-z0-9_-]{43}$/);
    const log = d.log();
    expect(log).toContain(`file ${tokenFile}`);
    expect(log).toContain('"WebSocket listener up"');
    expect(log).not.toContain(token);
  });

  it('launches a command and reads its output and receipt over ws, byte-exact', async () => {
    const peer = await WsPeer.connect(url, token);
    onTestFinished(() => peer.close());
    const pong = await peer.request<{ now_ms: number }>('ping');
    expect(Math.abs(pong.now_ms - Date.now())).toBeLessThan(5000);
    const launched = await peer.request<{ session_id: string }>('launch', {
      argv: ['sh', '-c', 'head -c 3000000 /dev/urandom | tee /dev/stderr | sha256sum >&2; printf done'],
      cwd: '/',
    });
    const out = await peer.readAll(launched.session_id);
    const receipt = await peer.request<Receipt>('wait', { session_id: launched.session_id });
    expect(out.toString()).toBe('done');
    expect(receipt.exit).toEqual({ code: 0, signal: null });
    expect(receipt.output.stdout!.sha256).toBe(sha(out));
    const err = await peer.readAll(launched.session_id, 'stderr');
    expect(err.length).toBe(3_000_000 + 68); // the digest, two spaces, '-', a newline
    expect(err.subarray(3_000_000, 3_000_064).toString()).toBe(sha(err.subarray(0, 3_000_000)));
    expect(receipt.output.stderr!.sha256).toBe(sha(err));
    peer.close();
    // The peer of a ws connection is named by its address in the log.
    expect(d.log()).toMatch(/"remote":"ws 127\.0\.0\.1:\d+"[^\n]*"WebSocket connection accepted"/);
  });

  it('refuses no token, a wrong one and one a byte off with 401, counted, each later failure answered later', async () => {
    await stillServed(); // a success resets this address's delay
    const noToken0 = await metric(metricsAddr, 'sandbox_supervisor_remote_handshake_failures_total{reason="no_token"}');
    const wrong0 = await metric(metricsAddr, 'sandbox_supervisor_remote_handshake_failures_total{reason="wrong_token"}');
    const offByOne = token.slice(0, -1) + (token.endsWith('A') ? 'B' : 'A');
    const answers = [];
    for (const headers of [
      {} as Record<string, string>,
      { Authorization: 'Bearer not-the-token' },
      { Authorization: `Bearer ${offByOne}` },
      { Authorization: `Basic ${token}` },
    ]) {
      answers.push(await refusedUpgrade(url, headers));
    }
    for (const a of answers) {
      expect(a.status).toBe(401);
      expect(a.headers['www-authenticate']).toBe('Bearer');
      expect(a.body.error.code).toBe('UNAUTHORIZED');
      expect(JSON.stringify(a)).not.toContain(token);
    }
    // 100, 200, 400, 800 ms: each at least its delay, and longer than the one before.
    const delays = [100, 200, 400, 800];
    answers.forEach((a, i) => expect(a.ms, `failure ${i + 1}`).toBeGreaterThanOrEqual(delays[i] - 5));
    for (let i = 1; i < answers.length; i++) expect(answers[i].ms).toBeGreaterThan(answers[i - 1].ms);
    expect(await metric(metricsAddr, 'sandbox_supervisor_remote_handshake_failures_total{reason="no_token"}')).toBe(noToken0 + 2);
    expect(await metric(metricsAddr, 'sandbox_supervisor_remote_handshake_failures_total{reason="wrong_token"}')).toBe(wrong0 + 2);
    expect(d.log()).not.toContain(offByOne);
    // A good client meanwhile is served at once (only failures wait), and that resets the delay.
    const t0 = performance.now();
    (await WsPeer.connect(url, token)).close();
    expect(performance.now() - t0).toBeLessThan(800);
    expect((await refusedUpgrade(url, {})).ms).toBeLessThan(800);
    await stillServed();
  });

  it('closes a TCP connection that sends no upgrade by remote.upgradeTimeoutMs', async () => {
    const before = await metric(metricsAddr, 'sandbox_supervisor_remote_handshake_failures_total{reason="upgrade_timeout"}');
    const t0 = performance.now();
    const closedAfterMs = await new Promise<number>((resolve, reject) => {
      const s = connect(port, host);
      s.on('error', reject);
      s.on('data', () => {});
      s.on('close', () => resolve(performance.now() - t0));
    });
    expect(closedAfterMs).toBeGreaterThanOrEqual(UPGRADE_TIMEOUT_MS - 20);
    expect(closedAfterMs).toBeLessThan(UPGRADE_TIMEOUT_MS + 2000);
    expect(await metric(metricsAddr, 'sandbox_supervisor_remote_handshake_failures_total{reason="upgrade_timeout"}')).toBe(before + 1);
    await stillServed();
  });

  it('closes idle TCP connections past remote.maxConnections oldest first: a client with the token still gets in', async () => {
    const idle = await Promise.all(
      Array.from(
        { length: 3 * MAX_CONNECTIONS },
        () =>
          new Promise<ReturnType<typeof connect>>((resolve, reject) => {
            const s = connect(port, host, () => resolve(s));
            s.on('error', reject);
          }),
      ),
    );
    const closed = idle.map((s) => new Promise<void>((r) => s.once('close', () => r())));
    onTestFinished(() => idle.forEach((s) => s.destroy()));
    // Served at once, before any idle one reaches its upgrade deadline.
    const t0 = performance.now();
    await stillServed();
    expect(performance.now() - t0).toBeLessThan(UPGRADE_TIMEOUT_MS * 4);
    await within(Promise.all(closed), 'every idle connection closed', 10_000);
  });

  it('refuses a WebSocket that sends no hello within ipc.handshakeTimeoutMs', async () => {
    const peer = await WsPeer.open(url, token);
    const t0 = performance.now();
    await peer.closed;
    expect(performance.now() - t0).toBeGreaterThanOrEqual(HELLO_TIMEOUT_MS - 100);
    expect(peer.received).toEqual([{ id: 0, error: { code: 'INVALID_ARGUMENT', message: `no hello within ${HELLO_TIMEOUT_MS} ms`, retryable: false } }]);
  });

  it('closes with 1009 on a message over ipc.maxFrameBytes (counted frame_bytes), and refuses a text message', async () => {
    const before = await metric(metricsAddr, 'sandbox_supervisor_ipc_refusals_total{limit="frame_bytes"}');
    const big = await WsPeer.connect(url, token);
    big.ws.send(Buffer.alloc(MAX_FRAME_BYTES + 1, 0x80), { binary: true });
    expect((await big.closed).code).toBe(1009);
    expect(await metric(metricsAddr, 'sandbox_supervisor_ipc_refusals_total{limit="frame_bytes"}')).toBe(before + 1);
    // A message of exactly the bound passes the WebSocket layer (then fails as not a map).
    const text = await WsPeer.connect(url, token);
    text.ws.send('{"id":1,"method":"ping"}');
    const closed = await text.closed;
    expect(closed.code).toBe(1003);
    expect(text.received.at(-1)).toMatchObject({ id: 0, error: { code: 'INVALID_ARGUMENT' } });
    expect(String(text.received.at(-1)!.error!.message)).toContain('text message');
    await stillServed();
  });

  it('answers a plain HTTP GET with 426 and a malformed upgrade with 400, JSON errors, counted', async () => {
    const before = await metric(metricsAddr, 'sandbox_supervisor_remote_handshake_failures_total{reason="not_websocket"}');
    const r = await httpGet(host, port, '/', { Authorization: `Bearer ${token}` });
    expect(r.status).toBe(426);
    expect(r.headers['content-type']).toBe('application/json');
    expect(r.headers.upgrade).toBe('websocket');
    const body = JSON.parse(r.body) as { error: { code: string; message: string } };
    expect(body.error.code).toBe('INVALID_ARGUMENT');
    expect(body.error.message).toContain('WebSocket');
    expect(await metric(metricsAddr, 'sandbox_supervisor_remote_handshake_failures_total{reason="not_websocket"}')).toBe(before + 1);
    // A malformed upgrade (with the token): 400, counted bad_upgrade.
    const bad0 = await metric(metricsAddr, 'sandbox_supervisor_remote_handshake_failures_total{reason="bad_upgrade"}');
    const answer = await new Promise<string>((resolve, reject) => {
      const sock = connect(port, host, () =>
        sock.write(
          `GET / HTTP/1.1\r\nHost: ${host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 99\r\nAuthorization: Bearer ${token}\r\n\r\n`,
        ),
      );
      let text = '';
      sock.on('data', (b: Buffer) => (text += b.toString()));
      sock.on('error', reject);
      sock.on('close', () => resolve(text));
    });
    expect(answer).toMatch(/^HTTP\/1\.1 400 Bad Request\r\n/);
    expect(JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)).error.code).toBe('INVALID_ARGUMENT');
    expect(await metric(metricsAddr, 'sandbox_supervisor_remote_handshake_failures_total{reason="bad_upgrade"}')).toBe(bad0 + 1);
    await stillServed();
  });

  it('refuses connections past remote.maxConnections with 503 LIMIT_EXCEEDED, apart from the Unix socket', async () => {
    await until(async () => (await metric(metricsAddr, 'sandbox_supervisor_remote_connections')) === 0, 'no WebSocket connection open');
    const held: WsPeer[] = [];
    onTestFinished(() => held.forEach((p) => p.close()));
    for (let i = 0; i < MAX_CONNECTIONS; i++) held.push(await WsPeer.connect(url, token));
    const refused = [];
    for (let i = 0; i < 3; i++) refused.push(await refusedUpgrade(url, { Authorization: `Bearer ${token}` }));
    for (const r of refused) {
      expect(r.status).toBe(503);
      expect(r.body.error).toMatchObject({ code: 'LIMIT_EXCEEDED', retryable: true, details: { limit: 'connections', max: MAX_CONNECTIONS } });
    }
    // The Unix socket is counted apart: still served.
    const status = (await (await d.client()).request('status', {})) as StatusResult;
    expect(status.remote).toBe(url);
    // The held ones are served all along.
    for (const p of held) expect((await p.request<{ now_ms: number }>('ping')).now_ms).toBeGreaterThan(0);
    for (const p of held) p.close();
    await Promise.all(held.map((p) => p.closed));
    await until(async () => (await metric(metricsAddr, 'sandbox_supervisor_remote_connections')) === 0, 'the held connections to be gone');
    await stillServed();
  });

  it('stops sending to a peer that does not read (backpressure), holding little, and drops it by keepalive; a new connection reads every byte', async () => {
    const TOTAL = 64 * 1024 * 1024;
    const client = await d.client();
    const launched = await client.launch({ argv: ['head', '-c', String(TOTAL), '/dev/zero'], cwd: '/' });
    const receipt = await client.wait({ session_id: launched.session_id });
    const rss = () => Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${d.pid}/status`, 'utf8'))![1]) * 1024;
    const peer = await WsPeer.connect(url, token);
    onTestFinished(() => peer.close());
    const before = rss();
    peer.ws.pause(); // reads nothing from here on, pongs included
    void peer.request('subscribe', { session_id: launched.session_id, stream: 'stdout', from: 0, follow: true }).catch(() => {});
    // It took only what fits in the socket buffers; pongs do not come, nothing drains: dropped
    // (seen from the supervisor: a paused client does not read the FIN either).
    const t0 = performance.now();
    const drops = () => d.log().split('did not answer a ping in time').length - 1;
    const dropsBefore = drops();
    await new Promise((r) => setTimeout(r, PING_INTERVAL_MS / 2));
    const grownBytes = rss() - before;
    await until(() => drops() > dropsBefore, 'the keepalive to drop the peer that does not read');
    const droppedAfterMs = performance.now() - t0;
    await until(async () => (await metric(metricsAddr, 'sandbox_supervisor_remote_connections')) === 0, 'the connection gone');
    console.log(
      `supervisor RSS growth with a ${TOTAL / 1024 / 1024} MiB subscription to a peer that does not read: ${(grownBytes / 1024 / 1024).toFixed(1)} MiB; dropped after ${Math.round(droppedAfterMs)} ms`,
    );
    expect(grownBytes).toBeLessThan(32 * 1024 * 1024);
    expect(droppedAfterMs).toBeLessThan(2 * (PING_INTERVAL_MS + PING_TIMEOUT_MS) + 1000);
    peer.ws.resume();
    expect((await within(peer.closed, 'the client to see the close')).code).toBe(1006); // terminated: no close frame
    const again = await WsPeer.connect(url, token);
    onTestFinished(() => again.close());
    const out = await within(again.readAll(launched.session_id), 'the whole stream over a new connection', 60_000);
    expect(out.length).toBe(TOTAL);
    expect(sha(out)).toBe(receipt.output.stdout!.sha256);
  }, 150_000); // 64 MiB stored, then read over WebSocket (within its own 60 s): a loaded machine took longer than the default 60 s for the whole

  it('takes a new token renamed over the token file without a restart: the old one refused', async () => {
    const old = token;
    const fresh = `rotated-${Math.random().toString(36).slice(2)}-0123456789`;
    const tmp = `${tokenFile}.new`;
    writeFileSync(tmp, `${fresh}\n`, { mode: 0o600 });
    renameSync(tmp, tokenFile);
    const r = await refusedUpgrade(url, { Authorization: `Bearer ${old}` });
    expect(r.status).toBe(401);
    token = fresh;
    await stillServed();
  });

  it('checks a rotated token file as at start: a 0644 file, a symlink, a 1-character token refuse every handshake (fail closed) until a good file is back', async () => {
    const series = 'sandbox_supervisor_remote_handshake_failures_total{reason="token_file_invalid"}';
    const before = await metric(metricsAddr, series);
    const tmp = `${tokenFile}.new`;
    const next = `next-${Math.random().toString(36).slice(2)}-0123456789`;
    const errors = () =>
      d
        .log()
        .split('\n')
        .filter((l) => /"level":50/.test(l) && l.includes('the remote token file fails its checks')).length;
    const errors0 = errors();
    const bad: [string, () => void][] = [
      ['readable by others (mode 644)', () => writeFileSync(tmp, `${next}\n`, { mode: 0o644 })],
      [
        'is a symbolic link',
        () => {
          writeFileSync(`${tokenFile}.target`, `${next}\n`, { mode: 0o600 });
          symlinkSync(`${tokenFile}.target`, tmp);
        },
      ],
      ['1 characters (at least 16)', () => writeFileSync(tmp, 'a\n', { mode: 0o600 })],
    ];
    let n = 0;
    for (const [why, make] of bad) {
      make();
      renameSync(tmp, tokenFile);
      for (const offered of [token, next]) {
        const r = await refusedUpgrade(url, { Authorization: `Bearer ${offered}` });
        expect(r.status).toBe(401);
        expect(r.body.error.code).toBe('UNAUTHORIZED');
        expect(r.body.error.message).toContain('token file fails its checks');
        n++;
      }
      const lines = d
        .log()
        .split('\n')
        .filter((l) => /"level":50/.test(l) && l.includes('the remote token file fails its checks'));
      expect(lines.at(-1)).toContain(why);
      expect(lines.at(-1)).not.toContain(next);
    }
    expect(errors() - errors0).toBe(n);
    expect(await metric(metricsAddr, series)).toBe(before + n);
    rmSync(`${tokenFile}.target`, { force: true });
    writeFileSync(tmp, `${next}\n`, { mode: 0o600 });
    renameSync(tmp, tokenFile);
    token = next;
    await stillServed();
  });

  it('answers request headers over 16 KiB with 431 and the JSON body, counted bad_upgrade', async () => {
    const bad0 = await metric(metricsAddr, 'sandbox_supervisor_remote_handshake_failures_total{reason="bad_upgrade"}');
    const answer = await new Promise<string>((resolve, reject) => {
      const sock = connect(port, host, () =>
        sock.write(
          `GET / HTTP/1.1\r\nHost: ${host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer ${token}\r\nX-Padding: ${'p'.repeat(17 * 1024)}\r\n\r\n`,
        ),
      );
      let text = '';
      sock.on('data', (b: Buffer) => (text += b.toString()));
      sock.on('error', reject);
      sock.on('close', () => resolve(text));
    });
    expect(answer).toMatch(/^HTTP\/1\.1 431 Request Header Fields Too Large\r\n/);
    const body = JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)) as { error: { code: string; details: unknown } };
    expect(body.error.code).toBe('INVALID_ARGUMENT');
    expect(body.error.details).toEqual({ limit: 'header_bytes', max: 16384 });
    expect(await metric(metricsAddr, 'sandbox_supervisor_remote_handshake_failures_total{reason="bad_upgrade"}')).toBe(bad0 + 1);
    await stillServed();
  });

  it('drops a peer that stops answering pings within pingIntervalMs + pingTimeoutMs', async () => {
    // A raw TCP socket that upgrades, then reads nothing and answers nothing.
    const t0 = performance.now();
    const closedAfterMs = await new Promise<number>((resolve, reject) => {
      const s = connect(port, host, () => {
        s.write(
          `GET / HTTP/1.1\r\nHost: ${host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer ${token}\r\n\r\n`,
        );
      });
      let head = '';
      s.on('data', (b: Buffer) => (head += b.toString('latin1')));
      s.on('error', reject);
      s.on('close', () => (head.startsWith('HTTP/1.1 101 ') ? resolve(performance.now() - t0) : reject(new Error(`not upgraded: ${head.slice(0, 200)}`))));
    });
    expect(closedAfterMs).toBeGreaterThanOrEqual(PING_INTERVAL_MS + PING_TIMEOUT_MS - 20);
    expect(closedAfterMs).toBeLessThan(2 * (PING_INTERVAL_MS + PING_TIMEOUT_MS) + 1000);
    expect(d.log()).toContain('did not answer a ping in time');
    // One that answers pings (the ws client does by itself) stays past several intervals.
    const alive = await WsPeer.connect(url, token);
    await new Promise((r) => setTimeout(r, 3 * (PING_INTERVAL_MS + PING_TIMEOUT_MS)));
    expect(alive.ws.readyState).toBe(alive.ws.OPEN);
    expect((await alive.request<{ now_ms: number }>('ping')).now_ms).toBeGreaterThan(0);
    alive.close();
    await stillServed();
  });
});

const OPENSSL = spawnSync('openssl', ['version']).status === 0;

describe('the WebSocket listener over TLS', () => {
  const d = new TestDaemon({ env: { SBX_REMOTE_TOKEN: 'tls-test-token-0123456789abcdef' } });
  let cert: Buffer;

  beforeAll(async () => {
    if (!OPENSSL) return;
    const key = join(d.dir, 'key.pem');
    const crt = join(d.dir, 'cert.pem');
    const r = spawnSync(
      'openssl',
      [
        'req',
        '-x509',
        '-newkey',
        'rsa:2048',
        '-nodes',
        '-keyout',
        key,
        '-out',
        crt,
        '-days',
        '1',
        '-subj',
        '/CN=localhost',
        '-addext',
        'subjectAltName=IP:127.0.0.1',
      ],
      { encoding: 'utf8' },
    );
    expect(r.status, r.stderr).toBe(0);
    cert = readFileSync(crt);
    d.withConfig({ remote: { listen: '127.0.0.1:0', tlsCertFile: crt, tlsKeyFile: key } });
    await d.start();
  });
  afterAll(async () => {
    await d.stop();
  });

  it.skipIf(!OPENSSL)(
    OPENSSL ? 'serves wss with a self-signed certificate; the token from SBX_REMOTE_TOKEN' : 'serves wss (skipped: openssl is not installed)',
    async () => {
      const status = await remoteUp(d);
      expect(status.remote).toMatch(/^wss:\/\/127\.0\.0\.1:\d+\/$/);
      const url = status.remote!;
      const peer = await WsPeer.connect(url, 'tls-test-token-0123456789abcdef', { ca: cert });
      const launched = await peer.request<{ session_id: string }>('launch', { argv: ['printf', 'over tls'], cwd: '/' });
      const out = await peer.readAll(launched.session_id);
      const receipt = await peer.request<Receipt>('wait', { session_id: launched.session_id });
      peer.close();
      expect(out.toString()).toBe('over tls');
      expect(receipt.exit).toEqual({ code: 0, signal: null });
      // Not a token file when the environment gives the token.
      expect(d.log()).toContain('"token":"SBX_REMOTE_TOKEN"');
      expect(d.log()).not.toContain('tls-test-token-0123456789abcdef');
      // Not trusted without the certificate; refused without the token.
      await expect(WsPeer.open(url, 'tls-test-token-0123456789abcdef')).rejects.toThrow(/self.signed|certificate/i);
      expect((await refusedUpgrade(url, { Authorization: 'Bearer nope' }, { ca: cert })).status).toBe(401);
    },
  );
});

describe('the WebSocket listener refuses to start', () => {
  it('insecure on a non-loopback --listen: exit 2 before anything is made (nothing is bound)', () => {
    const d = new TestDaemon();
    try {
      const config = join(d.dir, 'config.json');
      writeFileSync(config, JSON.stringify({ remote: { insecure: true } }));
      const r = spawnSync(process.execPath, [...DAEMON_ARGV, 'serve', '--config', config, '--listen', '0.0.0.0:0'], {
        env: { ...process.env, SBX_SOCKET: d.socketPath, SBX_STATE_DIR: d.stateDir },
        encoding: 'utf8',
        timeout: 30_000,
      });
      expect(r.status).toBe(2);
      expect(r.stderr).toContain('--listen remote.insecure (no token) is allowed only on a loopback address, not 0.0.0.0:0');
      expect(existsSync(d.stateDir)).toBe(false);
      const path = spawnSync(process.execPath, [...DAEMON_ARGV, 'serve', '--config', config, '--listen', '/tmp/x.sock'], {
        env: { ...process.env, SBX_SOCKET: d.socketPath, SBX_STATE_DIR: d.stateDir },
        encoding: 'utf8',
        timeout: 30_000,
      });
      expect(path.status).toBe(2);
      expect(path.stderr).toContain('is a path');
    } finally {
      rmSync(d.dir, { recursive: true, force: true });
    }
  });

  for (const [envToken, why] of [
    [' ', 'SBX_REMOTE_TOKEN holds white space'],
    ['a', 'SBX_REMOTE_TOKEN holds a token of 1 characters (at least 16)'],
  ]) {
    it(`with SBX_REMOTE_TOKEN=${JSON.stringify(envToken)}: exit 2 saying why; the Unix socket never listened`, async () => {
      const d = new TestDaemon({ env: { SBX_REMOTE_TOKEN: envToken } });
      try {
        d.withConfig({ remote: { listen: '127.0.0.1:0' } });
        await expect(d.start()).rejects.toThrow(/supervisor exited at start-up/);
        expect((await d.exitedNow()).code).toBe(2);
        expect(d.log()).toContain(`the WebSocket listener has no token, so it does not start: ${why}`);
        expect(existsSync(d.socketPath)).toBe(false);
      } finally {
        await d.stop();
      }
    });
  }

  it('without a token (an empty token file): exit 2 naming the file; the Unix socket never listened', async () => {
    const d = new TestDaemon();
    try {
      const empty = join(d.dir, 'empty-token');
      writeFileSync(empty, '', { mode: 0o600 });
      d.withConfig({ remote: { listen: '127.0.0.1:0', tokenFile: empty } });
      await expect(d.start()).rejects.toThrow(/supervisor exited at start-up/);
      expect((await d.exitedNow()).code).toBe(2);
      expect(d.log()).toContain(`the WebSocket listener has no token, so it does not start: the remote token file ${empty} holds no token`);
      expect(existsSync(d.socketPath)).toBe(false);
    } finally {
      await d.stop();
    }
  });
});
