// The TypeScript client (ipc/client.ts over ipc/transport.ts) against a real supervisor over
// every transport: the Unix socket, `sbx bridge` as a spawned command (the exec channel), and
// the WebSocket listener on loopback; transport faults by pid (SIGKILL the bridge, SIGSTOP a
// link so pings go unanswered): calls fail or reconnect within the silence deadline, output
// resumes with no gap or duplicate (digest = the receipt's), a keyed launch resent after a
// drop is the same session, run once. And `sbx --url ... run -- echo hi` end to end.
import { appendFileSync, readFileSync, writeFileSync } from 'node:fs';
import { connect as netConnect, createServer, type Socket } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { readOutput, ReconnectingClient, SupervisorClient, type ConnectOptions } from '../../ipc/client.js';
import type { Receipt, StatusResult } from '../../ipc/protocol.js';
import { runSbx, SBX_BIN, sha256, TestDaemon, until, within } from '../helpers/daemon.js';

const SEED = Number(process.env.SBX_TEST_SEED ?? Date.now() % 1_000_000);
console.log(`client-transports seed ${SEED}`);
/** Deterministic bytes from the seed (an xorshift stream), so a run can be repeated. */
function seededBytes(n: number, seed: number): Buffer {
  const b = Buffer.allocUnsafe(n);
  let x = seed | 1;
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    b[i] = x & 0xff;
  }
  return b;
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};
const kill = (pid: number, signal: NodeJS.Signals) => {
  try {
    process.kill(pid, signal);
  } catch {
    // gone
  }
};

describe('client transports against a real supervisor', () => {
  const d = new TestDaemon({ config: { remote: { listen: '127.0.0.1:0' } } });
  let url = '';
  let tokenFile = '';
  let pidFile = '';
  let n = 0;

  /** `sbx bridge` as the transport command, each spawn's pid appended to a file (exec keeps it). */
  function bridged(): { command: string[]; pids: () => number[] } {
    const file = join(d.dir, `bridge-pids-${n++}`);
    writeFileSync(file, '');
    return {
      command: ['sh', '-c', `echo $$ >> '${file}'; exec '${SBX_BIN}' bridge --socket '${d.socketPath}'`],
      pids: () => readFileSync(file, 'utf8').split('\n').filter(Boolean).map(Number),
    };
  }

  beforeAll(async () => {
    await d.start();
    const c = await d.client();
    const status = await until(async () => {
      const s = (await c.request('status', {})) as StatusResult & { remote?: string };
      return s.remote ? s : null;
    }, 'the WebSocket listener');
    url = status.remote!;
    tokenFile = join(d.stateDir, 'remote-token');
    pidFile = join(d.dir, 'stopped-pids');
    writeFileSync(pidFile, '');
  });
  afterAll(async () => {
    // Links a test stopped and left (by pid): continued and killed.
    for (const pid of readFileSync(pidFile, 'utf8').split('\n').filter(Boolean).map(Number)) {
      kill(pid, 'SIGKILL');
      kill(pid, 'SIGCONT');
    }
    await d.stop();
  });

  /** Launches argv (keyed), reads stdout over opts to its end, and waits for the receipt over opts. */
  async function runOver(opts: ConnectOptions, argv: string[]): Promise<{ out: Buffer; receipt: Receipt }> {
    const conn = new ReconnectingClient(opts);
    try {
      const launched = await conn.run((c) => c.launch({ argv, cwd: '/', invocation_key: `k-${SEED}-${n++}` }));
      const parts: Buffer[] = [];
      for await (const chunk of readOutput({ ...opts, selector: { session_id: launched.session_id }, stream: 'stdout', follow: true })) parts.push(chunk.data);
      return { out: Buffer.concat(parts), receipt: await conn.run((c) => c.wait({ session_id: launched.session_id })) };
    } finally {
      conn.drop();
    }
  }

  it('runs a session over each transport: the socket, sbx bridge as a command, the WebSocket with the token file', async () => {
    const bridge = bridged();
    for (const opts of [{ socketPath: d.socketPath }, { command: bridge.command }, { url, tokenFile }] as ConnectOptions[]) {
      const { out, receipt } = await runOver(opts, ['sh', '-c', 'printf "%s" "$0"; printf err >&2', `over-${Object.keys(opts)[0]}`]);
      expect(out.toString()).toBe(`over-${Object.keys(opts)[0]}`);
      expect(receipt.exit).toEqual({ code: 0, signal: null });
      expect(receipt.output.stdout!.sha256).toBe(sha256(out));
      // ping: the supervisor's clock, one round trip, on every transport.
      const c = await SupervisorClient.connect(opts);
      const before = Date.now();
      const { now_ms } = await c.ping();
      c.close();
      expect(Math.abs(now_ms - before)).toBeLessThan(60_000);
    }
    // Each connection of the command endpoint spawned its own bridge, all gone now.
    expect(bridge.pids().length).toBeGreaterThanOrEqual(2);
    await until(() => bridge.pids().every((p) => !alive(p)), 'every bridge gone');
  });

  it('a call on a stopped bridge fails ETIMEDOUT within the silence deadline; a ReconnectingClient reconnects and gets the receipt', async () => {
    const c = await d.client();
    const { session_id } = await c.launch({ argv: ['sleep', '5'], cwd: '/', invocation_key: `sleep-${SEED}` });
    const bridge = bridged();
    // The silence deadline leaves room for a loaded machine (two cores, CI's parallel files): a
    // live bridge descheduled past a shorter one was taken as dead and made a fourth bridge.
    const deadlines = { keepaliveMs: 100, silenceMs: 1200 };
    // One client: its bridge stopped (pings unanswered), the wait fails in time, not a hang.
    const one = await SupervisorClient.connect({ command: bridge.command, ...deadlines });
    const stopped = one.transportPid!;
    appendFileSync(pidFile, `${stopped}\n`);
    kill(stopped, 'SIGSTOP');
    const t = performance.now();
    const err = (await within(
      one.wait({ session_id }).catch((e: Error) => e),
      'the wait on a stopped bridge to fail',
      5000,
    )) as NodeJS.ErrnoException;
    expect(err.code).toBe('ETIMEDOUT');
    expect(performance.now() - t).toBeGreaterThanOrEqual(deadlines.silenceMs);
    expect(performance.now() - t).toBeLessThan(deadlines.silenceMs + 1500);
    // Killed by pid (SIGTERM with SIGCONT) and reaped.
    await until(() => !alive(stopped), 'the stopped bridge gone');
    // Reconnecting: the first bridge stopped mid-wait, a new one spawned, the wait asked again.
    const conn = new ReconnectingClient({ command: bridge.command, ...deadlines });
    onTestFinished(() => conn.drop());
    const first = await conn.get();
    appendFileSync(pidFile, `${first.transportPid}\n`);
    const waiting = conn.run((cl) => cl.wait({ session_id }));
    kill(first.transportPid!, 'SIGSTOP');
    const receipt = await within(waiting, 'the receipt after a reconnect', 10_000);
    expect(receipt.session_id).toBe(session_id);
    expect(receipt.exit).toEqual({ code: 0, signal: null });
    expect(bridge.pids().length).toBe(3);
  });

  it('a quiet session is not a silent transport: pings answered by the supervisor keep a follow alive past silenceMs, on one bridge', async () => {
    const bridge = bridged();
    // Quiet for 2.5x the silence deadline (a shorter deadline took a descheduled bridge as dead under CI's load).
    const opts = { command: bridge.command, keepaliveMs: 100, silenceMs: 1000 };
    const { out, receipt } = await runOver(opts, ['sh', '-c', 'sleep 2.5; printf late']);
    expect(out.toString()).toBe('late');
    expect(receipt.exit).toEqual({ code: 0, signal: null });
    // One bridge for the launch and wait, one for the follow: no reconnect.
    expect(bridge.pids().length).toBe(2);
  });

  it("a bridge killed mid-readOutput: the stream resumes from the next byte, no gap, no duplicate (digest = the receipt's)", async () => {
    const file = join(d.dir, `payload-${SEED}`);
    const payload = seededBytes(6 * 1024 * 1024, SEED);
    writeFileSync(file, payload);
    const c = await d.client();
    const { session_id } = await c.launch({ argv: ['cat', file], cwd: '/', invocation_key: `cat-${SEED}` });
    await c.wait({ session_id });
    const bridge = bridged();
    const hash = sha256;
    const parts: Buffer[] = [];
    let got = 0;
    let killedAt = -1;
    let next = 0;
    // Kill points from the seed: two drops at random places in the stream.
    const points = [1 + (SEED % 2_000_000), 3_000_000 + (SEED % 2_000_000)];
    for await (const chunk of readOutput({ command: bridge.command, selector: { session_id }, stream: 'stdout', from: 0 })) {
      expect(chunk.cursor).toBe(got);
      parts.push(chunk.data);
      got += chunk.data.length;
      if (next < points.length && got >= points[next]!) {
        const pids = bridge.pids();
        killedAt = got;
        kill(pids[pids.length - 1]!, 'SIGKILL');
        next++;
      }
    }
    const out = Buffer.concat(parts);
    expect(killedAt).toBeGreaterThan(0);
    expect(out.length).toBe(payload.length);
    const receipt = await c.wait({ session_id });
    expect(hash(out)).toBe(receipt.output.stdout!.sha256);
    expect(hash(out)).toBe(hash(payload));
    expect(bridge.pids().length).toBeGreaterThanOrEqual(2);
  });

  it('a keyed launch whose answer was lost (the link stopped) is resent and returns the same session, run once', async () => {
    const marker = join(d.dir, `ran-${SEED}`);
    const file = join(d.dir, `relay-pids-${n++}`);
    writeFileSync(file, '');
    // bridge | relay: the launch reaches the supervisor, the relay (stopped) holds its answer.
    const command = ['sh', '-c', `'${SBX_BIN}' bridge --socket '${d.socketPath}' | sh -c 'echo $$ >> "${file}"; exec cat'`];
    const relays = () => readFileSync(file, 'utf8').split('\n').filter(Boolean).map(Number);
    const conn = new ReconnectingClient({ command, keepaliveMs: 100, silenceMs: 600 });
    onTestFinished(() => conn.drop());
    await conn.get();
    const relay = await until(() => relays()[0], 'the relay pid');
    appendFileSync(pidFile, `${relay}\n`);
    kill(relay, 'SIGSTOP');
    const key = `once-${SEED}`;
    const params = { argv: ['sh', '-c', `echo ran >> '${marker}'`], cwd: '/', invocation_key: key };
    const launched = await within(
      conn.run((c) => c.launch(params)),
      'the launch after a reconnect',
      10_000,
    );
    // The first send was admitted (its answer lost): the resend found it.
    expect(launched.existing).toBe(true);
    const c = await d.client();
    const receipt = await c.wait({ session_id: launched.session_id });
    expect(receipt.exit).toEqual({ code: 0, signal: null });
    expect(readFileSync(marker, 'utf8')).toBe('ran\n');
    const again = await c.launch(params);
    expect(again).toMatchObject({ session_id: launched.session_id, existing: true });
    const sessions = (await c.ps(true)).sessions.filter((s) => s.invocation_key === key);
    expect(sessions.map((s) => s.session_id)).toEqual([launched.session_id]);
    kill(relay, 'SIGKILL');
    kill(relay, 'SIGCONT');
  });

  it('a launch without a key is never resent after a drop: it raises LAUNCH_UNCONFIRMED and runs at most once', async () => {
    const marker = join(d.dir, `keyless-${SEED}`);
    const file = join(d.dir, `relay-pids-${n++}`);
    writeFileSync(file, '');
    const command = ['sh', '-c', `'${SBX_BIN}' bridge --socket '${d.socketPath}' | sh -c 'echo $$ >> "${file}"; exec cat'`];
    const conn = new ReconnectingClient({ command, keepaliveMs: 100, silenceMs: 600 });
    onTestFinished(() => conn.drop());
    await conn.get();
    const relay = await until(() => readFileSync(file, 'utf8').split('\n').filter(Boolean).map(Number)[0], 'the relay pid');
    appendFileSync(pidFile, `${relay}\n`);
    kill(relay, 'SIGSTOP');
    const err = await within(
      conn.run((c) => c.launch({ argv: ['sh', '-c', `echo ran >> '${marker}'`], cwd: '/' })).catch((e: Error) => e),
      'the keyless launch to fail',
      10_000,
    );
    expect((err as NodeJS.ErrnoException).code).toBe('LAUNCH_UNCONFIRMED');
    await until(() => {
      try {
        return readFileSync(marker, 'utf8') === 'ran\n';
      } catch {
        return false;
      }
    }, 'the one run of the keyless launch');
    kill(relay, 'SIGKILL');
    kill(relay, 'SIGCONT');
  });

  it('over the WebSocket: a frozen TCP link (a proxy that stops forwarding) fails the wait and the follow within the silence deadline; both reconnect and finish, every byte once', async () => {
    const target = new URL(url);
    // A TCP proxy in this process: freeze() stops forwarding on the open connections (the
    // peers see silence, no FIN), cut() destroys them; new connections are forwarded.
    const open = new Set<{ c: Socket; u: Socket }>();
    let accepted = 0;
    const proxy = createServer((c) => {
      accepted++;
      const u = netConnect(Number(target.port), target.hostname);
      const pair = { c, u };
      open.add(pair);
      c.pipe(u);
      u.pipe(c);
      const drop = () => {
        open.delete(pair);
        c.destroy();
        u.destroy();
      };
      c.on('error', drop).on('close', drop);
      u.on('error', drop).on('close', drop);
    });
    await new Promise<void>((r) => proxy.listen(0, '127.0.0.1', r));
    onTestFinished(() => {
      for (const { c, u } of open) (c.destroy(), u.destroy());
      return new Promise<void>((r) => proxy.close(() => r()));
    });
    const freeze = () => {
      for (const p of open) {
        p.c.unpipe(p.u);
        p.u.unpipe(p.c);
        p.c.pause();
        p.u.pause();
        open.delete(p); // left frozen; destroyed at the end
        onTestFinished(() => void (p.c.destroy(), p.u.destroy()));
      }
    };
    const proxied = `ws://127.0.0.1:${(proxy.address() as { port: number }).port}`;
    const opts = { url: proxied, tokenFile, keepaliveMs: 100, silenceMs: 600 };
    const c = await d.client();
    const { session_id } = await c.launch({ argv: ['sh', '-c', 'sleep 1.5; printf "%s" "$0"', `ws-${SEED}`], cwd: '/', invocation_key: `ws-freeze-${SEED}` });
    const conn = new ReconnectingClient(opts);
    onTestFinished(() => conn.drop());
    await conn.get();
    const waiting = conn.run((cl) => cl.wait({ session_id }));
    const parts: Buffer[] = [];
    const reading = (async () => {
      for await (const chunk of readOutput({ ...opts, selector: { session_id }, stream: 'stdout', follow: true })) parts.push(chunk.data);
    })();
    await until(() => open.size >= 2, 'both connections through the proxy');
    const t = performance.now();
    freeze();
    // Both calls come back on new connections: the wait with the receipt, the follow with every byte once.
    const receipt = await within(waiting, 'the wait after a frozen link', 10_000);
    await within(reading, 'the follow after a frozen link', 10_000);
    expect(performance.now() - t).toBeLessThan(1500 + 600 + 2000);
    expect(accepted).toBeGreaterThanOrEqual(4); // two frozen, two new
    expect(Buffer.concat(parts).toString()).toBe(`ws-${SEED}`);
    expect(receipt.output.stdout!.sha256).toBe(sha256(Buffer.concat(parts)));
  });

  it('sbx --url ws://127.0.0.1:PORT --token-file F run -- echo hi, end to end', async () => {
    const r = await runSbx(join(d.dir, 'no-such.sock'), ['--url', url, '--token-file', tokenFile, 'run', '--', 'echo', 'hi']);
    expect(r.stderr.toString()).toBe('');
    expect(r.stdout.toString()).toBe('hi\n');
    expect(r.status).toBe(0);
    // The environment works as the options do, and a wrong token is a clear 125.
    const env = await runSbx(join(d.dir, 'no-such.sock'), ['run', '--', 'sh', '-c', 'exit 7'], { env: { SBX_URL: url, SBX_TOKEN_FILE: tokenFile } });
    expect(env.status).toBe(7);
    const bad = await runSbx(join(d.dir, 'no-such.sock'), ['--url', url, 'ps'], { env: { SBX_TOKEN: 'wrong-token' } });
    expect(bad.status).toBe(125);
    expect(bad.stderr.toString()).toMatch(/^sbx: UNAUTHORIZED: the supervisor at ws:\/\/127\.0\.0\.1:\d+\/ answered HTTP 401/);
    expect(bad.stderr.toString()).not.toContain('wrong-token');
  });

  it("sbx --url: the session runs in the supervisor's first workspace (none here: /), not in this shell's directory; --cwd is sent as given", async () => {
    const here = d.dir; // a directory of this machine: over a URL it means nothing to the supervisor
    const r = await runSbx(join(d.dir, 'no-such.sock'), ['--url', url, '--token-file', tokenFile, 'run', '--', 'pwd'], { cwd: here });
    expect({ status: r.status, stdout: r.stdout.toString(), stderr: r.stderr.toString() }).toEqual({ status: 0, stdout: '/\n', stderr: '' });
    const given = await runSbx(join(d.dir, 'no-such.sock'), ['--url', url, '--token-file', tokenFile, 'run', '--cwd', '/tmp', '--', 'pwd'], { cwd: here });
    expect({ status: given.status, stdout: given.stdout.toString() }).toEqual({ status: 0, stdout: '/tmp\n' });
    // Over the socket the shell's directory is still the default.
    const local = await runSbx(d.socketPath, ['run', '--', 'pwd'], { cwd: here });
    expect({ status: local.status, stdout: local.stdout.toString() }).toEqual({ status: 0, stdout: `${here}\n` });
  });
});
