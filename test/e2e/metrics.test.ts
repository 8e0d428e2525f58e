// The Prometheus endpoint (docs/guide/running.md "Metrics"): scraped over real HTTP, on TCP and on a Unix
// socket, checked by promtool, and its counters moved by exactly what real sessions did
// (launches, receipts by outcome, bytes stored, a refusal, a checkpoint, workspace events,
// a restart's unknown session and reconciliation). Bad addresses and a port in use stop the
// start with exit 2 and a message, before anything is made.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { request } from 'node:http';
import { createServer, connect, type Server, type Socket } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Receipt, StatusResult } from '../../ipc/protocol.js';
import { encodeFrame, FrameDecoder } from '../../ipc/framing.js';
import { DAEMON_ARGV, TestDaemon, until } from '../helpers/daemon.js';
import { cgroupMount, TEST_CGROUP_PREFIX } from '../helpers/cgroup-cleanup.js';

const PROMTOOL = spawnSync('promtool', ['--version']).status === 0;
const PROMTOOL_MISSING = 'skipped: promtool is not installed (apt-get install prometheus)';

type Target = { host: string; port: number } | { socketPath: string };
interface HttpAnswer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

/** One HTTP request to the endpoint; rejects on a connection error. */
function http(target: Target, method = 'GET', path = '/metrics', body?: string): Promise<HttpAnswer> {
  return new Promise((resolve, reject) => {
    const req = request({ ...target, method, path, headers: body !== undefined ? { 'Content-Length': Buffer.byteLength(body) } : {}, agent: false }, (res) => {
      const parts: Buffer[] = [];
      res.on('data', (d: Buffer) => parts.push(d));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(parts).toString() }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

/** Every sample of a text exposition by its series as written (`name{a="b"}`), to its value. */
function samples(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const at = line.lastIndexOf(' ');
    out.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return out;
}

async function scrape(target: Target): Promise<Map<string, number>> {
  const r = await http(target);
  expect(r.status).toBe(200);
  return samples(r.body);
}

/** The value of a series; a series that is missing fails the test (every one here is pre-declared). */
function v(m: Map<string, number>, series: string): number {
  const value = m.get(series);
  if (value === undefined) throw new Error(`no series ${series} in the scrape`);
  return value;
}

/** promtool check metrics on a scrape: its exit status and what it said. */
function promtool(text: string): { status: number | null; output: string } {
  const r = spawnSync('promtool', ['check', 'metrics'], { input: text });
  return { status: r.status, output: r.stdout.toString() + r.stderr.toString() };
}

/** The address the daemon logged for its endpoint (the last start's). */
function loggedAddress(d: TestDaemon): string {
  const lines = d
    .log()
    .split('\n')
    .filter((l) => l.includes('"metrics listening"'));
  if (!lines.length) throw new Error(`the daemon logged no metrics address:\n${d.log()}`);
  return (JSON.parse(lines[lines.length - 1]) as { metrics: string }).metrics;
}

const P = 'sandbox_supervisor_';

describe('metrics over TCP', () => {
  const d = new TestDaemon({ cgroupPrefix: `${TEST_CGROUP_PREFIX}metrics-` });
  let target: { host: string; port: number };
  let ws: string;
  beforeAll(async () => {
    ws = join(d.dir, 'ws');
    mkdirSync(ws);
    d.withConfig({ metrics: { listen: '127.0.0.1:0' }, workspace: { paths: [ws] } });
    await d.start();
    const [host, port] = loggedAddress(d).split(':');
    target = { host, port: Number(port) };
    expect(host).toBe('127.0.0.1');
  });
  afterAll(() => d.stop());

  it('serves GET /metrics in the text format, promtool-clean, with the process metrics', async () => {
    const r = await http(target);
    expect(r.status).toBe(200);
    expect(r.headers['content-type']).toBe('text/plain; version=0.0.4; charset=utf-8');
    expect(r.headers['content-length']).toBe(String(Buffer.byteLength(r.body)));
    const m = samples(r.body);
    expect(v(m, `${P}info{version="0.1.0",mode="cgroup"}`)).toBe(1);
    expect(m.get('process_start_time_seconds')).toBeGreaterThan(0);
    expect(m.get('process_resident_memory_bytes')).toBeGreaterThan(0);
    expect(r.body).toContain('# TYPE sandbox_supervisor_launches_total counter');
    expect(r.body).toContain('# TYPE sandbox_supervisor_sessions gauge');
    expect(r.body).toContain('# TYPE sandbox_supervisor_exit_to_receipt_seconds histogram');
  });

  it('every documented label value of output_dropped_bytes_total is there from the start (quota, disk_full, io_error)', async () => {
    const m = await scrape(target);
    for (const stream of ['stdout', 'stderr', 'pty'])
      for (const reason of ['quota', 'disk_full', 'io_error'])
        expect(m.get(`${P}output_dropped_bytes_total{stream="${stream}",reason="${reason}"}`), `${stream} ${reason}`).toBe(0);
  });

  it('status gives the bound address (port 0 resolved), and sbx status shows it', async () => {
    const c = await d.client();
    const status = (await c.status()) as StatusResult;
    expect(status.metrics).toBe(`${target.host}:${target.port}`);
    expect(target.port).toBeGreaterThan(0);
    c.close();
    const r = await d.sbx(['status']);
    expect(r.status).toBe(0);
    expect(r.stdout.toString().split('\n')).toContain(`metrics    http://127.0.0.1:${target.port}/metrics`);
  });

  it.skipIf(!PROMTOOL)(PROMTOOL ? 'promtool check metrics accepts the scrape' : `promtool check metrics accepts the scrape (${PROMTOOL_MISSING})`, async () => {
    const r = await http(target);
    expect(promtool(r.body)).toEqual({ status: 0, output: '' });
  });

  it('HEAD answers the headers only; other paths 404, other methods 405, a body 413', async () => {
    const head = await http(target, 'HEAD');
    expect(head.status).toBe(200);
    expect(head.body).toBe('');
    expect(Number(head.headers['content-length'])).toBeGreaterThan(1000);
    expect((await http(target, 'GET', '/')).status).toBe(404);
    expect((await http(target, 'GET', '/metrics/x')).status).toBe(404);
    const post = await http(target, 'POST', '/metrics', 'a=b');
    expect(post.status).toBe(405);
    expect(post.headers.allow).toBe('GET, HEAD');
    expect((await http(target, 'DELETE')).status).toBe(405);
    const withBody = await http(target, 'GET', '/metrics', 'x'.repeat(100));
    expect(withBody.status).toBe(413);
    expect(withBody.headers.connection).toBe('close');
    expect((await http(target)).status).toBe(200); // and it goes on serving
  });

  it('launches and receipts by outcome, bytes stored and exit->receipt move by exactly what three sessions did', async () => {
    const before = await scrape(target);
    const c = await d.client();
    const launched = await Promise.all([
      c.launch({ argv: ['sh', '-c', 'printf abc; printf de >&2; exit 0'], cwd: '/' }),
      c.launch({ argv: ['sh', '-c', 'printf 12345; exit 3'], cwd: '/' }),
      c.launch({ argv: ['sh', '-c', 'printf 7; exec sleep 30'], cwd: '/', timeout_ms: 300, grace_ms: 1000 }),
    ]);
    const receipts: Receipt[] = await Promise.all(launched.map((l) => c.wait({ session_id: l.session_id })));
    expect(receipts.map((r) => [r.outcome, r.exit.code])).toEqual([
      ['exited', 0],
      ['exited', 3],
      ['timed_out', null],
    ]);
    const after = await scrape(target);
    const delta = (series: string) => v(after, `${P}${series}`) - v(before, `${P}${series}`);
    expect(delta('launches_total{outcome="started"}')).toBe(3);
    expect(delta('launches_total{outcome="refused"}')).toBe(0);
    expect(delta('receipts_total{outcome="exited"}')).toBe(2);
    expect(delta('receipts_total{outcome="timed_out"}')).toBe(1);
    for (const o of ['signaled', 'cancelled', 'spawn_failed', 'owner_lost']) expect(delta(`receipts_total{outcome="${o}"}`)).toBe(0);
    expect(delta('output_stored_bytes_total{stream="stdout"}')).toBe(9);
    expect(delta('output_stored_bytes_total{stream="stderr"}')).toBe(2);
    const stored = (s: 'stdout' | 'stderr') => receipts.reduce((n, r) => n + r.output[s]!.final_cursor, 0);
    expect([stored('stdout'), stored('stderr')]).toEqual([9, 2]);
    expect(delta('output_dropped_bytes_total{stream="stdout",reason="quota"}')).toBe(0);
    expect(delta('exit_to_receipt_seconds_count')).toBe(3);
    expect(delta('exit_to_receipt_seconds_bucket{le="+Inf"}')).toBe(3);
    expect(v(after, `${P}sessions{state="running"}`)).toBe(0);
    expect(v(after, `${P}sessions{state="ended"}`) - v(before, `${P}sessions{state="ended"}`)).toBe(3);
  });

  it('a refusal moves its code by 1; a retry of a key counts as existing', async () => {
    const c = await d.client();
    const key = `metrics-key-${process.pid}`;
    const first = await c.launch({ argv: ['true'], cwd: '/', invocation_key: key });
    await c.wait({ session_id: first.session_id });
    const before = await scrape(target);
    expect((await c.launch({ argv: ['true'], cwd: '/', invocation_key: key })).existing).toBe(true);
    await expect(c.launch({ argv: ['false'], cwd: '/', invocation_key: key })).rejects.toMatchObject({ code: 'KEY_CONFLICT' });
    await expect(c.launch({ argv: ['true'], cwd: join(d.dir, 'no-such-dir') })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    const after = await scrape(target);
    const delta = (series: string) => v(after, `${P}${series}`) - v(before, `${P}${series}`);
    expect(delta('admission_refusals_total{code="KEY_CONFLICT"}')).toBe(1);
    expect(delta('admission_refusals_total{code="INVALID_ARGUMENT"}')).toBe(1);
    expect(delta('admission_refusals_total{code="ADMISSION_SEALED"}')).toBe(0);
    expect(delta('launches_total{outcome="refused"}')).toBe(2);
    expect(delta('launches_total{outcome="existing"}')).toBe(1);
    expect(delta('launches_total{outcome="started"}')).toBe(0);
  });

  it("a live session's bytes count while it runs, and once only after its receipt", async () => {
    const before = await scrape(target);
    const c = await d.client();
    const { session_id } = await c.launch({ argv: ['sh', '-c', 'printf xyz; exec sleep 30'], cwd: '/', grace_ms: 1000 });
    const live = await until(async () => {
      const m = await scrape(target);
      return v(m, `${P}output_stored_bytes_total{stream="stdout"}`) - v(before, `${P}output_stored_bytes_total{stream="stdout"}`) === 3 ? m : null;
    }, "the live session's 3 bytes in the scrape");
    expect(v(live, `${P}sessions{state="running"}`)).toBe(1);
    await c.request('cancel', { session_id });
    expect((await c.wait({ session_id })).outcome).toBe('cancelled');
    const after = await scrape(target);
    expect(v(after, `${P}output_stored_bytes_total{stream="stdout"}`) - v(before, `${P}output_stored_bytes_total{stream="stdout"}`)).toBe(3);
    expect(v(after, `${P}receipts_total{outcome="cancelled"}`) - v(before, `${P}receipts_total{outcome="cancelled"}`)).toBe(1);
    expect(v(after, `${P}sessions{state="running"}`)).toBe(0);
  });

  it('workspace events match the watcher and the receipt; a checkpoint counts its duration and bytes', async () => {
    const before = await scrape(target);
    const c = await d.client();
    // The shell stays a moment after its writes: a writer already reaped has no pidfd, and its
    // events are unattributed (docs/design/facts.md 22); the counts below are exact either way.
    const { session_id } = await c.launch({ argv: ['sh', '-c', `printf hello > ${ws}/a; printf world! > ${ws}/b; sleep 0.2`], cwd: '/' });
    const receipt = await c.wait({ session_id });
    const attributed = receipt.workspace![0].attributed.events;
    expect(attributed).toBeGreaterThan(0);
    const status = (await c.status()) as StatusResult;
    const after = await scrape(target);
    const series = (attribution: string) => `${P}workspace_events_total{workspace="${ws}",attribution="${attribution}"}`;
    expect(v(after, series('attributed')) - v(before, series('attributed'))).toBe(attributed);
    expect(v(after, series('unattributed'))).toBe(status.workspaces[0].unattributed_events);
    expect(v(after, series('attributed')) + v(after, series('unattributed'))).toBe(status.workspaces[0].events);
    expect(v(after, `${P}workspace_gaps_total{workspace="${ws}",gap="overflow"}`)).toBe(0);

    const cp = await c.checkpoint({ workspace: ws });
    const done = await scrape(target);
    const cdelta = (s: string) => v(done, `${P}${s}`) - v(after, `${P}${s}`);
    expect(cdelta('checkpoint_duration_seconds_count{result="published"}')).toBe(1);
    expect(cdelta('checkpoint_duration_seconds_count{result="failed"}')).toBe(0);
    expect(cdelta('checkpoint_written_bytes_total')).toBe(cp.objects.bytes_written);
    expect(cdelta('checkpoint_scanned_bytes_total')).toBe(cp.scan.bytes);
    expect(cp.scan.bytes).toBe(11);
  });

  it('connections: the gauge is what is open, the counter what was accepted', async () => {
    const before = await scrape(target);
    const open = v(before, `${P}connections`);
    const c = await d.client();
    const m = await scrape(target);
    expect(v(m, `${P}connections`)).toBe(open + 1);
    expect(v(m, `${P}connections_total{outcome="accepted"}`) - v(before, `${P}connections_total{outcome="accepted"}`)).toBe(1);
    c.close();
    await until(async () => v(await scrape(target), `${P}connections`) === open, 'the closed connection gone from the gauge');
  });

  it('80 slow connections held open (slowloris, reopened as they close): a scrape still gets in, the oldest slow one is closed for it', async () => {
    const slow = new Set<Socket>();
    let closedSlow = 0;
    let holding = true;
    const open = () => {
      const s = connect(target.port, target.host, () => s.write('GET /metrics HTTP/1.1\r\nHost: x\r\n')); // headers never finished
      s.on('error', () => {});
      s.on('close', () => {
        slow.delete(s);
        closedSlow++;
        if (holding) setTimeout(open, 20); // the attacker takes the place again
      });
      slow.add(s);
    };
    try {
      for (let i = 0; i < 80; i++) open();
      await until(() => [...slow].filter((s) => s.readyState === 'open').length >= 64, 'the slow connections open');
      // Before the server closed slow connections for new ones, every scrape waited out the
      // header timeout of the slow ones (5 s), again and again.
      await until(
        () =>
          http(target).then(
            (r) => r.status === 200,
            () => false,
          ),
        'a scrape among 80 slow connections',
        4_500,
      );
      expect(closedSlow).toBeGreaterThan(0);
    } finally {
      holding = false;
      for (const s of slow) s.destroy();
    }
    await until(
      () =>
        http(target).then(
          (r) => r.status === 200,
          () => false,
        ),
      'a scrape once the slow connections are gone',
    );
  });
});

describe('metrics over a Unix socket, across a restart', () => {
  const d = new TestDaemon({ cgroupPrefix: `${TEST_CGROUP_PREFIX}metrics-` });
  let socketPath: string;
  let ws: string;
  beforeAll(async () => {
    socketPath = join(d.dir, 'metrics.sock');
    ws = join(d.dir, 'ws');
    mkdirSync(ws);
    d.withConfig({ metrics: { listen: socketPath }, workspace: { paths: [ws] } });
    await d.start();
  });
  afterAll(() => d.stop());

  it('serves the same text on the socket (0660), and removes the socket at stop', async () => {
    expect(loggedAddress(d)).toBe(socketPath);
    const c = await d.client();
    expect(((await c.status()) as StatusResult).metrics).toBe(socketPath);
    c.close();
    expect(statSync(socketPath).mode & 0o777).toBe(0o660);
    const r = await http({ socketPath });
    expect(r.status).toBe(200);
    expect(samples(r.body).get(`${P}sessions{state="ended"}`)).toBe(0);
    if (PROMTOOL) expect(promtool(r.body)).toEqual({ status: 0, output: '' });
  });

  it('a session found unknown after a crash: unknown +1, reconciled +1, an owner_lost receipt, a listener_restart gap', async () => {
    const c = await d.client();
    const { session_id } = await c.launch({ argv: ['sleep', '30'], cwd: '/', grace_ms: 1000 });
    await d.kill9();
    expect(existsSync(socketPath)).toBe(true); // a crash leaves the socket file
    await d.start(); // which the next start replaces (nobody answers on it)
    const c2 = await d.client();
    expect((await c2.wait({ session_id })).outcome).toBe('owner_lost');
    const m = await scrape({ socketPath });
    expect(v(m, `${P}sessions_unknown_total`)).toBe(1);
    expect(v(m, `${P}reconciliations_total{result="ended"}`)).toBe(1);
    expect(v(m, `${P}reconciliations_total{result="failed"}`)).toBe(0);
    expect(v(m, `${P}receipts_total{outcome="owner_lost"}`)).toBe(1);
    expect(v(m, `${P}workspace_gaps_total{workspace="${ws}",gap="listener_restart"}`)).toBe(1);
    // Not this process's output: a recovered session adds no stored bytes and no exit->receipt.
    expect(v(m, `${P}exit_to_receipt_seconds_count`)).toBe(0);
    expect(v(m, `${P}sessions{state="ended"}`)).toBe(1);
    await d.terminate();
    expect(existsSync(socketPath)).toBe(false);
  });
});

describe('metrics of refusals at the socket (ipc limits)', () => {
  const d = new TestDaemon({ cgroupPrefix: `${TEST_CGROUP_PREFIX}metrics-` });
  let target: { host: string; port: number };
  const sockets: Socket[] = [];
  beforeAll(async () => {
    d.withConfig({ metrics: { listen: '127.0.0.1:0' }, ipc: { maxInFlight: 3, maxConnections: 4 } });
    await d.start();
    const [host, port] = loggedAddress(d).split(':');
    target = { host, port: Number(port) };
  });
  afterAll(async () => {
    for (const s of sockets) s.destroy();
    await d.stop();
  });

  /** A raw connection to the supervisor socket and the frames it got. */
  function raw() {
    const socket = connect(d.socketPath);
    sockets.push(socket);
    const frames: { id: number; result?: { session_id: string }; error?: { code: string; details?: { limit?: string } } }[] = [];
    const decoder = new FrameDecoder();
    const state = { closed: false };
    socket.on('data', (b) => decoder.push(b, (f) => frames.push(f as (typeof frames)[number])));
    socket.on('error', () => {});
    socket.on('close', () => (state.closed = true));
    return { socket, frames, state };
  }

  it('N launches at once on one connection: every in_flight refusal counts as a refused launch, LIMIT_EXCEEDED and ipc in_flight', async () => {
    const before = await scrape(target);
    const n = 12;
    const c0 = await d.client();
    const held = await c0.launch({ argv: ['sleep', '30'], cwd: '/' });
    const r = raw();
    // Two waits on a running session hold two of the connection's 3 slots for the whole burst;
    // the launches share the third (the frames of one read are dispatched in slices, so a
    // launch answered between slices frees it): some run, the rest are refused in_flight.
    const frames = [encodeFrame({ id: 1, method: 'hello', params: { versions: [1] } })];
    for (const id of [50, 51]) frames.push(encodeFrame({ id, method: 'wait', params: { session_id: held.session_id } }));
    for (let i = 0; i < n; i++) frames.push(encodeFrame({ id: 100 + i, method: 'launch', params: { argv: ['sleep', '0.3'], cwd: '/' } }));
    r.socket.write(Buffer.concat(frames));
    await until(() => r.frames.filter((f) => f.id >= 100).length === n, `the ${n} launches answered`);
    await d.sbx(['cancel', held.session_id, '--grace', '0']);
    c0.close();
    const answers = r.frames.filter((f) => f.id >= 100);
    const refused = answers.filter((f) => f.error?.code === 'LIMIT_EXCEEDED' && f.error.details?.limit === 'in_flight').length;
    const started = answers.filter((f) => f.result?.session_id).length;
    expect(started + refused).toBe(n);
    expect(refused).toBeGreaterThan(0);
    const c = await d.client();
    for (const f of answers) if (f.result) await c.wait({ session_id: f.result.session_id });
    const after = await scrape(target);
    const delta = (series: string) => v(after, `${P}${series}`) - v(before, `${P}${series}`);
    expect(delta('launches_total{outcome="refused"}')).toBe(refused);
    expect(delta('launches_total{outcome="started"}')).toBe(started + 1); // and the held one
    expect(delta('admission_refusals_total{code="LIMIT_EXCEEDED"}')).toBe(refused);
    expect(delta('ipc_refusals_total{limit="in_flight"}')).toBe(refused);
    expect(delta('ipc_refusals_total{limit="connections"}')).toBe(0);
    c.close();
    r.socket.destroy();
  });

  it('a connection past ipc.maxConnections moves ipc_refusals_total{limit="connections"} by 1; every limit starts at 0', async () => {
    const before = await scrape(target);
    for (const limit of ['in_flight', 'connections', 'pending_frame_bytes', 'frame_time', 'frame_bytes'])
      expect(before.has(`${P}ipc_refusals_total{limit="${limit}"}`), limit).toBe(true);
    await until(async () => v(await scrape(target), `${P}connections`) === 0, 'no connection open');
    const held = [raw(), raw(), raw(), raw()];
    await until(async () => v(await scrape(target), `${P}connections`) === 4, 'four connections held');
    const fifth = raw();
    await until(() => fifth.state.closed, 'the fifth refused');
    expect(fifth.frames[0].error).toMatchObject({ code: 'LIMIT_EXCEEDED', details: { limit: 'connections' } });
    const after = await scrape(target);
    expect(v(after, `${P}ipc_refusals_total{limit="connections"}`) - v(before, `${P}ipc_refusals_total{limit="connections"}`)).toBe(1);
    expect(v(after, `${P}launches_total{outcome="refused"}`) - v(before, `${P}launches_total{outcome="refused"}`)).toBe(0);
    for (const h of held) h.socket.destroy();
  });
});

describe('metrics start-up errors (exit 2, a message, nothing made)', () => {
  const d = new TestDaemon({ cgroupPrefix: `${TEST_CGROUP_PREFIX}metrics-` });
  let busy: Server;
  afterAll(async () => {
    await new Promise((r) => busy?.close(r));
    await d.stop();
  });

  function serve(args: string[], config: Record<string, unknown> = {}) {
    const configPath = join(d.dir, 'config.json');
    writeFileSync(configPath, JSON.stringify({ cgroup: { parent: d.cgroupParent }, ...config }));
    return spawnSync(process.execPath, [...DAEMON_ARGV, 'serve', '--config', configPath, ...args], {
      env: { ...process.env, SBX_SOCKET: d.socketPath, SBX_STATE_DIR: d.stateDir },
      timeout: 20_000,
    });
  }
  const nothingMade = () => {
    expect(existsSync(d.stateDir)).toBe(false);
    expect(existsSync(d.socketPath)).toBe(false);
    const mount = cgroupMount();
    if (mount) expect(existsSync(join(mount, d.cgroupParent))).toBe(false);
  };

  it('a bad --metrics value, naming what to write', () => {
    for (const [value, says] of [
      [':9464', 'names no host; listening on every interface must be explicit'],
      ['9464', 'is not HOST:PORT or an absolute path'],
      ['127.0.0.1:70000', 'has a port outside 0-65535'],
      ['example.com:9464', 'has a host that is not an IP address (names are not resolved; localhost is 127.0.0.1)'],
      ['[127.0.0.1]:9464', 'has a bracketed host that is not an IPv6 address'],
      ['metrics.sock', 'is not HOST:PORT or an absolute path'],
    ]) {
      const r = serve(['--metrics', value]);
      expect(r.status, value).toBe(2);
      const stderr = r.stderr.toString();
      expect(stderr.startsWith(`sandbox-supervisor: --metrics ${JSON.stringify(value)} ${says}`), stderr).toBe(true);
      expect(stderr).toContain('(give HOST:PORT such as 127.0.0.1:9464');
      expect(stderr.split('\n')).toHaveLength(2); // one line, no stack
    }
    nothingMade();
  });

  it('a bad metrics.listen in the config, naming the key', () => {
    const r = serve([], { metrics: { listen: '0.0.0.0' } });
    expect(r.status).toBe(2);
    expect(r.stderr.toString()).toContain('"metrics.listen": "0.0.0.0" is not HOST:PORT');
    const unknown = serve([], { metrics: { port: 1 } });
    expect(unknown.status).toBe(2);
    expect(unknown.stderr.toString()).toContain('unknown key "metrics.port"');
    nothingMade();
  });

  it('a port in use, and a socket path taken by a file: a clear message, no stack', async () => {
    busy = createServer();
    await new Promise<void>((r) => busy.listen(0, '127.0.0.1', () => r()));
    const port = (busy.address() as { port: number }).port;
    const r = serve(['--metrics', `127.0.0.1:${port}`]);
    expect(r.status).toBe(2);
    expect(r.stderr.toString()).toBe(`sandbox-supervisor: --metrics 127.0.0.1:${port}: the address is in use (EADDRINUSE)\n`);
    const fromConfig = serve([], { metrics: { listen: `127.0.0.1:${port}` } });
    expect(fromConfig.status).toBe(2);
    expect(fromConfig.stderr.toString()).toBe(`sandbox-supervisor: metrics.listen 127.0.0.1:${port}: the address is in use (EADDRINUSE)\n`);
    const file = join(d.dir, 'not-a-socket');
    writeFileSync(file, 'x');
    const f = serve(['--metrics', file]);
    expect(f.status).toBe(2);
    expect(f.stderr.toString()).toBe(`sandbox-supervisor: --metrics ${file}: a file that is not a socket is at that path\n`);
    nothingMade();
  });

  it('a socket path longer than sun_path (107 bytes): refused up front, one line, nothing bound or left', () => {
    const long = join(d.dir, `${'m'.repeat(140 - d.dir.length)}.sock`);
    expect(Buffer.byteLength(long)).toBeGreaterThan(107);
    const before = readdirSync(d.dir).sort();
    for (const [args, config, says] of [
      [
        ['--metrics', long],
        {},
        `sandbox-supervisor: --metrics ${JSON.stringify(long)} is a Unix socket path of ${Buffer.byteLength(long)} bytes: at most 107 fit (sun_path, unix(7)); give a shorter path\n`,
      ],
      [[], { metrics: { listen: long } }, 'is a Unix socket path of'],
    ] as const) {
      const r = serve([...args], config);
      expect(r.status).toBe(2);
      const stderr = r.stderr.toString();
      expect(stderr.split('\n'), stderr).toHaveLength(2);
      if (says.endsWith('\n')) expect(stderr).toBe(says);
      else expect(stderr).toContain(says);
    }
    expect(
      readdirSync(d.dir)
        .filter((n) => n !== 'config.json')
        .sort(),
    ).toEqual(before.filter((n) => n !== 'config.json'));
    expect(existsSync(long.slice(0, 107))).toBe(false);
    nothingMade();
  });

  it('a socket path whose directory does not exist says so (not EACCES)', () => {
    const dir = join(d.dir, 'no-such-dir');
    const r = serve(['--metrics', join(dir, 'metrics.sock')]);
    expect(r.status).toBe(2);
    expect(r.stderr.toString()).toBe(`sandbox-supervisor: --metrics ${join(dir, 'metrics.sock')}: its directory ${dir} does not exist (create it first)\n`);
    nothingMade();
  });

  it("--metrics at the supervisor's own socket path: refused before anything is made", () => {
    for (const path of [d.socketPath, d.socketPath.replace(/\/([^/]+)$/, '/./$1')]) {
      const r = serve(['--metrics', path]);
      expect(r.status, path).toBe(2);
      expect(r.stderr.toString()).toBe(
        `sandbox-supervisor: --metrics ${path} is the supervisor's own socket (SBX_SOCKET or socketPath): give the metrics another path\n`,
      );
      nothingMade();
    }
  });
});
