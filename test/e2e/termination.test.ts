// Deadlines, cancellation and termination owned by the supervisor: independent of output,
// readers and clients; TERM to every process of the cgroup, KILL after the grace, 124 for
// the deadline, first cause wins, and an orderly shutdown that leaves receipts.
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Receipt } from '../../ipc/protocol.js';
import { pidsWithMarker, PROGRAMS, SBX, sha256, TestDaemon, until } from '../helpers/daemon.js';

let daemon: TestDaemon;
beforeAll(async () => {
  daemon = await new TestDaemon().start();
});
afterAll(async () => {
  expect(await daemon.stop()).toEqual({ code: 0, signal: null });
});

const marker = () => `5${randomBytes(2).readUInt16BE(0) % 100}.${randomBytes(3).readUIntBE(0, 3)}`;
const ms = (iso: string | null) => Date.parse(iso!);

/** sbx run attached to a daemon's socket; resolves once `ready` is on its stdout. */
async function attachedRun(socketPath: string, args: string[], ready: string) {
  const child = spawn(process.execPath, [SBX, 'run', ...args], { env: { ...process.env, SBX_SOCKET: socketPath }, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (err += d));
  const exited = new Promise<number | null>((r) => child.on('close', (code) => r(code)));
  await until(() => out.includes(ready), 'the session to start');
  return { child, exited, stderr: () => err };
}

async function run(args: string[], argv: string[]) {
  const receiptPath = join(daemon.dir, `r-${randomBytes(4).toString('hex')}.json`);
  const r = await daemon.sbx(['run', '--receipt', receiptPath, ...args, '--', ...argv]);
  return { ...r, receipt: JSON.parse(readFileSync(receiptPath, 'utf8')) as Receipt };
}

describe('deadline', () => {
  it('ends a silent command at the deadline: 124, timed_out, TERM then death', async () => {
    const m = marker();
    const { status, receipt } = await run(['--timeout', '1s'], ['sleep', m]);
    expect(status).toBe(124);
    expect(receipt.outcome).toBe('timed_out');
    expect(receipt.termination.cause).toBe('deadline');
    expect(receipt.termination.steps.map((s) => s.signal)).toEqual(['SIGTERM']);
    expect(receipt.termination.steps[0].pids).toBe(1);
    expect(receipt.exit).toEqual({ code: null, signal: 'SIGTERM' });
    const termAt = ms(receipt.termination.steps[0].at) - ms(receipt.started_at);
    expect(termAt).toBeGreaterThanOrEqual(990);
    expect(termAt).toBeLessThan(2000);
    expect(ms(receipt.death.observed_at)).toBeGreaterThanOrEqual(ms(receipt.termination.steps[0].at));
    expect(receipt.death.evidence).toBe('cgroup_empty');
    expect(pidsWithMarker(m)).toEqual([]);
  });

  it("a stopped command acts on the deadline's TERM: SIGCONT follows it, as systemd does", async () => {
    // Before, a command stopped (kill -STOP $$, a ^Z) kept its TERM pending until the KILL at the grace's end.
    const m = marker();
    const { status, stdout, receipt } = await run(
      ['--timeout', '300ms', '--grace', '20s'],
      ['sh', '-c', `trap 'echo got-term; exit 7' TERM; kill -STOP $$; sleep ${m}; exit 0`],
    );
    expect(status).toBe(124);
    expect(stdout.toString()).toBe('got-term\n');
    expect(receipt.termination.steps.map((s) => [s.signal, s.pids])).toEqual([['SIGTERM', 1]]);
    expect(receipt.exit).toEqual({ code: 7, signal: null });
    expect(pidsWithMarker(m)).toEqual([]);
  });

  it('a SIGTERM to sbx run reaches a command that stopped itself: sent on with a SIGCONT after it, as bash kills a stopped job', async () => {
    // Before, the TERM stayed pending on the stopped command and sbx run waited for good (timeout 60 sbx run -- ...).
    const m = marker();
    const run = await attachedRun(daemon.socketPath, ['--', 'sh', '-c', `trap 'echo got-term; exit 7' TERM; echo ready; kill -STOP $$; sleep ${m}`], 'ready');
    // The TERM goes out once sh has stopped itself (state T), not while it may still be on its way to.
    await until(() => pidsWithMarker(m).some((pid) => readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.startsWith('T')), 'sh to stop itself');
    run.child.kill('SIGTERM');
    expect(await run.exited).toBe(7);
    expect(run.stderr()).toBe('');
  });

  it('enforces a deadline shorter than the spawn itself (1 ms): TERM reaches the command', async () => {
    const m = marker();
    const { status, receipt } = await run(['--timeout', '1ms', '--grace', '1s'], ['sleep', m]);
    expect(status).toBe(124);
    expect(receipt.termination.steps[0]).toMatchObject({ signal: 'SIGTERM', pids: 1 });
    expect(receipt.descendants_terminated).toBe(0);
    expect(ms(receipt.ended_at) - ms(receipt.started_at)).toBeLessThan(1000);
    expect(pidsWithMarker(m)).toEqual([]);
  });

  it('KILLs a leader and a setsid descendant that both ignore SIGTERM, after the grace', async () => {
    const a = marker();
    const b = marker();
    const { status, receipt } = await run(['--timeout', '1s', '--grace', '1s'], ['sh', '-c', `trap "" TERM; setsid sleep ${a} & sleep ${b}; echo unreachable`]);
    expect(status).toBe(124);
    expect(receipt.outcome).toBe('timed_out');
    expect(receipt.termination.steps.map((s) => s.signal)).toEqual(['SIGTERM', 'SIGKILL']);
    expect(receipt.termination.steps[0].pids).toBe(3);
    expect(receipt.descendants_terminated).toBe(2);
    const killAfterTerm = ms(receipt.termination.steps[1].at) - ms(receipt.termination.steps[0].at);
    expect(killAfterTerm).toBeGreaterThanOrEqual(990);
    expect(killAfterTerm).toBeLessThan(2000);
    expect(receipt.exit.signal).toBe('SIGKILL');
    expect(receipt.death.evidence).toBe('cgroup_empty');
    expect(pidsWithMarker(a)).toEqual([]);
    expect(pidsWithMarker(b)).toEqual([]);
  });

  it('fires on time under an output flood, and the supervisor keeps answering', async () => {
    const client = await daemon.client();
    const launched = await client.launch({ argv: ['sh', '-c', 'while :; do echo flood; done'], cwd: '/', timeout_ms: 1000, grace_ms: 1000 });
    const t0 = Date.now();
    const status = await client.status();
    expect(Date.now() - t0).toBeLessThan(1000);
    expect(status.sessions.running).toBeGreaterThanOrEqual(1);
    const rssBefore = Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${daemon.pid}/status`, 'utf8'))![1]);
    const receipt = await client.wait({ session_id: launched.session_id });
    const rssAfter = Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${daemon.pid}/status`, 'utf8'))![1]);
    expect(receipt.outcome).toBe('timed_out');
    expect(ms(receipt.termination.steps[0].at) - ms(receipt.started_at)).toBeLessThan(2000);
    expect(ms(receipt.ended_at) - ms(receipt.started_at)).toBeLessThan(3500);
    expect(receipt.output.stdout!.final_cursor).toBeGreaterThan(0);
    expect(receipt.output.stdout!.final_cursor % 6).toBe(0); // whole "flood\n" lines: nothing torn or lost
    expect(rssAfter - rssBefore).toBeLessThan(64 * 1024); // kB: the flood is not buffered in memory
  });

  it('outlives a SIGKILLed sbx and still ends at its deadline with a receipt', async () => {
    const key = `orphaned-client-${randomBytes(4).toString('hex')}`;
    const { child } = await attachedRun(daemon.socketPath, ['--key', key, '--timeout', '2s', '--', 'sh', '-c', 'echo started; sleep 60'], 'started');
    child.kill('SIGKILL');
    const waited = await daemon.sbx(['wait', '--key', key]);
    expect(waited.status).toBe(124);
    const receipt = JSON.parse(waited.stdout.toString()) as Receipt;
    expect(receipt.outcome).toBe('timed_out');
    expect(ms(receipt.termination.steps[0].at) - ms(receipt.started_at)).toBeGreaterThanOrEqual(1990);
    expect(receipt.output.stdout).toMatchObject({ final_cursor: 8, sha256: sha256('started\n') });
  });

  it('refuses bad durations with INVALID_ARGUMENT and 125', async () => {
    for (const bad of ['-1s', 'soon', '31d']) {
      const r = await daemon.sbx(['run', '--timeout', bad, '--', 'true']);
      expect(r.status).toBe(125);
      expect(r.stderr.toString()).toContain('INVALID_ARGUMENT');
    }
    const grace = await daemon.sbx(['run', '--grace', '1e3', '--', 'true']);
    expect(grace.status).toBe(125);
  });
});

describe('linger', () => {
  it('with --linger kill, kills a background child when the leader exits, promptly', async () => {
    const m = marker();
    const { status, stdout, receipt } = await run(['--linger', 'kill'], ['sh', '-c', `sleep ${m} & echo bg`]);
    expect(status).toBe(0);
    expect(stdout.toString()).toBe('bg\n');
    expect(receipt.descendants_terminated).toBe(1);
    expect(ms(receipt.ended_at) - ms(receipt.started_at)).toBeLessThan(1000);
    expect(pidsWithMarker(m)).toEqual([]);
  });

  it('with --linger wait, keeps the session open until the deadline, then 124', async () => {
    const m = marker();
    const client = await daemon.client();
    const launched = await client.launch({ argv: ['sh', '-c', `sleep ${m} & echo bg`], cwd: '/', linger: 'wait', timeout_ms: 2000 });
    await until(async () => (await client.ps()).sessions.find((s) => s.session_id === launched.session_id)?.state === 'leader_exited', 'leader_exited');
    const row = (await client.ps()).sessions.find((s) => s.session_id === launched.session_id)!;
    expect(row.live_pids).toBe(1);
    const receipt = await client.wait({ session_id: launched.session_id });
    expect(receipt.outcome).toBe('timed_out');
    expect(receipt.exit).toEqual({ code: 0, signal: null });
    expect(receipt.descendants_terminated).toBe(1);
    expect(ms(receipt.termination.steps[0].at) - ms(receipt.started_at)).toBeGreaterThanOrEqual(1990);
    expect(pidsWithMarker(m)).toEqual([]);
  });
});

describe('cancel and kill', () => {
  it('sbx cancel: TERM, grace, KILL; outcome cancelled, exit 128+N', async () => {
    const detached = await daemon.sbx(['run', '--detach', '--', join(PROGRAMS, 'ignore-sigterm'), '60']);
    const id = detached.stdout.toString().trim();
    const r = await daemon.sbx(['cancel', id, '--grace', '500ms']);
    expect(r.status).toBe(0);
    const waited = await daemon.sbx(['wait', id]);
    const receipt = JSON.parse(waited.stdout.toString()) as Receipt;
    expect(receipt.outcome).toBe('cancelled');
    expect(receipt.termination.cause).toBe('cancel');
    expect(receipt.termination.steps.map((s) => s.signal)).toEqual(['SIGTERM', 'SIGKILL']);
    expect(receipt.exit).toEqual({ code: null, signal: 'SIGKILL' });
    expect(receipt.termination.signal_source).toBe('supervisor');
    expect(waited.status).toBe(137);
  });

  it('first cause wins: a cancel after the deadline fired stays timed_out', async () => {
    const client = await daemon.client();
    const launched = await client.launch({ argv: [join(PROGRAMS, 'ignore-sigterm'), '60'], cwd: '/', timeout_ms: 300, grace_ms: 1500 });
    await until(async () => (await client.ps()).sessions.find((s) => s.session_id === launched.session_id)?.state === 'terminating', 'terminating');
    await client.request('cancel', { session_id: launched.session_id });
    const receipt = await client.wait({ session_id: launched.session_id });
    expect(receipt.outcome).toBe('timed_out');
    expect(receipt.termination.cause).toBe('deadline');
  });

  it('sbx kill --signal sends that signal to every process of the session', async () => {
    // --linger wait: the descendants the signal also ends are waited for, never TERMed by a
    // linger rule, so the receipt has no cause at all.
    const detached = await daemon.sbx(['run', '--detach', '--linger', 'wait', '--', 'sh', '-c', 'setsid sleep 61 & sleep 62; wait']);
    const id = detached.stdout.toString().trim();
    await until(async () => (await daemon.sbx(['ps', '--json'])).stdout.toString().includes('"live_pids": 3'), 'three processes');
    const r = await daemon.sbx(['kill', id, '--signal', 'USR1', '--json']);
    expect(JSON.parse(r.stdout.toString())).toMatchObject({ session_id: id, signal: 'SIGUSR1', pids: 3 });
    const waited = await daemon.sbx(['wait', id]);
    expect(waited.status).toBe(128 + 10);
    const receipt = JSON.parse(waited.stdout.toString()) as Receipt;
    expect(receipt.outcome).toBe('signaled');
    expect(receipt.exit).toEqual({ code: null, signal: 'SIGUSR1' });
    // kill records no cause of its own; the signal was the supervisor's.
    expect(receipt.termination).toEqual({ cause: null, steps: [], signal_source: 'supervisor' });
    const bad = await daemon.sbx(['kill', id, '--signal', 'SIGNOPE']);
    expect(bad.status).toBe(125);
    expect(bad.stderr.toString()).toContain('INVALID_ARGUMENT');
  });

  it('a cancel that lands after the leader exited, before it is reaped: descendants_terminated counts every descendant', async () => {
    // The supervisor is stopped (SIGSTOP) while the leader exits, so the leader is a zombie
    // (gone from cgroup.procs, not yet reaped) when the cancel is read: the request is queued
    // before the SIGCHLD, which only arrives once the supervisor runs again.
    const client = await daemon.client();
    const stateOf = (pid: number) => {
      try {
        const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
        return stat.slice(stat.lastIndexOf(')') + 2)[0];
      } catch {
        return 'gone';
      }
    };
    for (const graceMs of [0, 5000]) {
      const m = marker();
      // The leader waits on a fifo (no polling children: live_pids stays exactly 3).
      const go = join(daemon.dir, `go-${m}`);
      expect(spawnSync('mkfifo', [go]).status).toBe(0);
      const { session_id } = await client.launch({ argv: ['sh', '-c', `sleep ${m} & sleep ${m} & read x < ${go}; exit 0`], cwd: '/' });
      const leaderPid = await until(async () => {
        const s = (await client.ps()).sessions.find((x) => x.session_id === session_id);
        return s?.live_pids === 3 ? s.pid : null;
      }, 'the leader and its two descendants');
      process.kill(daemon.pid, 'SIGSTOP');
      try {
        await until(() => stateOf(daemon.pid) === 'T', 'the supervisor to stop');
        writeFileSync(go, 'go\n');
        await until(() => stateOf(leaderPid) === 'Z', 'the leader to exit');
        const cancelled = client.request('cancel', { session_id, grace_ms: graceMs });
        await new Promise((r) => setImmediate(r)); // the frame is written to the socket
        process.kill(daemon.pid, 'SIGCONT');
        await cancelled;
      } finally {
        process.kill(daemon.pid, 'SIGCONT');
      }
      const receipt = await client.wait({ session_id });
      expect(receipt.termination).toMatchObject({ cause: 'cancel', steps: [{ signal: graceMs > 0 ? 'SIGTERM' : 'SIGKILL', pids: 2 }] });
      expect(receipt.descendants_terminated).toBe(2);
      expect(pidsWithMarker(m)).toEqual([]);
    }
  });

  it('forwards SIGINT from sbx run to the session: exit 130', async () => {
    const { child, exited } = await attachedRun(daemon.socketPath, ['--', 'sh', '-c', 'echo ready; sleep 60'], 'ready');
    child.kill('SIGINT');
    expect(await exited).toBe(130);
  });

  it('--on-disconnect cancel: a client that dies takes the session with it', async () => {
    const key = `cancel-on-disconnect-${randomBytes(4).toString('hex')}`;
    const { child } = await attachedRun(daemon.socketPath, ['--key', key, '--on-disconnect', 'cancel', '--', 'sh', '-c', 'echo ready; sleep 60'], 'ready');
    child.kill('SIGKILL');
    const waited = await daemon.sbx(['wait', '--key', key]);
    const receipt = JSON.parse(waited.stdout.toString()) as Receipt;
    expect(receipt.outcome).toBe('cancelled');
    expect(receipt.termination.cause).toBe('cancel');
    expect(waited.status).toBe(143);
  });
});

describe('shutdown', () => {
  it('SIGTERM to the supervisor with 3 sessions running: 3 receipts, nothing left, exit 0', async () => {
    const own = await new TestDaemon().start();
    try {
      const marks = [marker(), marker(), marker()];
      const client = await own.client();
      const ids: string[] = [];
      ids.push((await client.launch({ argv: ['sleep', marks[0]], cwd: '/' })).session_id);
      ids.push((await client.launch({ argv: [join(PROGRAMS, 'ignore-sigterm'), marks[1]], cwd: '/', grace_ms: 500 })).session_id);
      ids.push((await client.launch({ argv: ['sh', '-c', `setsid sleep ${marks[2]} & wait`], cwd: '/' })).session_id);
      await until(() => marks.every((m) => pidsWithMarker(m).length >= 1), 'all three sessions to run');
      expect(await own.terminate()).toEqual({ code: 0, signal: null });
      for (const id of ids) {
        const receipt = JSON.parse(readFileSync(join(own.stateDir, 'sessions', id, 'receipt.json'), 'utf8')) as Receipt;
        expect(receipt.outcome).toBe('cancelled');
        expect(receipt.termination.cause).toBe('shutdown');
        expect(receipt.death.evidence).toBe('cgroup_empty');
      }
      for (const m of marks) expect(pidsWithMarker(m)).toEqual([]);
    } finally {
      await own.stop();
    }
  });

  it('settles a session that turns unknown during shutdown (its receipt cannot be written) and exits 0', async () => {
    const own = await new TestDaemon().start();
    try {
      const m = marker();
      const client = await own.client();
      const { session_id } = await client.launch({ argv: ['sleep', m], cwd: '/' });
      await until(() => pidsWithMarker(m).length === 1, 'the session to run');
      // Something already where its receipt goes: the write fails closed, the session is unknown.
      mkdirSync(join(own.stateDir, 'sessions', session_id, 'receipt.json'));
      expect(await own.terminate()).toEqual({ code: 0, signal: null }); // before: waited forever, SIGKILLed after 30 s
      expect(pidsWithMarker(m)).toEqual([]);
      expect(own.log()).toMatch(/"session_id":"[^"]+","reason":"the receipt could not be written: EEXIST/);
    } finally {
      await own.stop();
    }
  });

  it("an attached sbx run gets its session's end when the supervisor shuts down", async () => {
    const own = await new TestDaemon().start();
    try {
      const { exited, stderr } = await attachedRun(own.socketPath, ['--', 'sh', '-c', 'echo up; sleep 60'], 'up');
      const t0 = Date.now();
      expect(await own.terminate()).toEqual({ code: 0, signal: null });
      expect(await exited).toBe(143); // cancelled by shutdown: 128 + SIGTERM
      expect(stderr()).toMatch(/^sbx: session s-\S+ was ended because the supervisor is stopping \(cancelled, cause shutdown; sbx receipt s-\S+\)\n$/);
      expect(Date.now() - t0).toBeLessThan(10_000);
    } finally {
      await own.stop();
    }
  });
});
