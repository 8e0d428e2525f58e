// Without a writable cgroup2 (not root, no delegation) the supervisor runs in subreaper
// mode: the exec shim stays as each session's own subreaper, and death evidence is
// "subreaper_reaped". Forced here with cgroup.mode = "subreaper".
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Receipt } from '../../ipc/protocol.js';
import { parentPid, pidsWithMarker, sha256, TestDaemon, until, zombieChildren } from '../helpers/daemon.js';

let daemon: TestDaemon;
beforeAll(async () => {
  daemon = await new TestDaemon({ config: { cgroup: { mode: 'subreaper' } } }).start();
});
afterAll(async () => {
  expect(await daemon.stop()).toEqual({ code: 0, signal: null });
});

/** sbx run [--pty] of sh -c script with a 300 ms deadline and a 20 s grace (a KILL step: the TERM missed a process); its status and receipt. */
async function deadlineRun(pty: string[], name: string, script: string): Promise<{ status: number | null; receipt: Receipt }> {
  const receiptPath = join(daemon.dir, `${name}.json`);
  const r = await daemon.sbx(['run', ...pty, '--timeout', '300ms', '--grace', '20s', '--receipt', receiptPath, '--', 'sh', '-c', script]);
  return { status: r.status, receipt: JSON.parse(readFileSync(receiptPath, 'utf8')) as Receipt };
}

const marker = () => `4${randomBytes(2).readUInt16BE(0) % 100}.${randomBytes(3).readUIntBE(0, 3)}`;

describe('subreaper mode', () => {
  it('says so in status and makes no cgroup', async () => {
    const status = JSON.parse((await daemon.sbx(['status', '--json'])).stdout.toString());
    expect(status.mode).toBe('subreaper');
    expect(status.cgroup).toBeNull();
    expect(existsSync(daemon.cgroupBase!)).toBe(false);
  });

  it('ends setsid and background descendants and proves it by reaping them all', async () => {
    const a = marker();
    const b = marker();
    const receiptPath = join(daemon.dir, 'r.json');
    const r = await daemon.sbx(['run', '--receipt', receiptPath, '--', 'sh', '-c', `(setsid sleep ${a} &); (sleep ${b} &); echo started`]);
    expect(r.status).toBe(0);
    expect(r.stdout.toString()).toBe('started\n');
    const receipt = JSON.parse(readFileSync(receiptPath, 'utf8')) as Receipt;
    expect(receipt.supervisor.mode).toBe('subreaper');
    expect(receipt.death.evidence).toBe('subreaper_reaped');
    expect(receipt.death.reaped).toBeGreaterThanOrEqual(2);
    expect(receipt.descendants_terminated).toBeGreaterThanOrEqual(2);
    expect(receipt.output.stdout).toMatchObject({ final_cursor: 8, sha256: sha256('started\n'), complete: true });
    expect(pidsWithMarker(a)).toEqual([]);
    expect(pidsWithMarker(b)).toEqual([]);
    expect(Date.parse(receipt.ended_at) - Date.parse(receipt.admitted_at)).toBeLessThan(1000);
  });

  it('keeps exit statuses: 3, 137, 127, and the leader exit clock', async () => {
    expect((await daemon.sbx(['run', '--', 'sh', '-c', 'exit 3'])).status).toBe(3);
    expect((await daemon.sbx(['run', '--', 'sh', '-c', 'kill -9 $$'])).status).toBe(137);
    const missing = await daemon.sbx(['run', '--', '/nonexistent/sbx-no-such-command']);
    expect(missing.status).toBe(127);
    const receiptPath = join(daemon.dir, 'clock.json');
    const r = await daemon.sbx(['run', '--linger', 'wait', '--receipt', receiptPath, '--', 'sh', '-c', '(sleep 1; echo late) & echo early']);
    expect(r.stdout.toString()).toBe('early\nlate\n');
    const receipt = JSON.parse(readFileSync(receiptPath, 'utf8')) as Receipt;
    expect(Date.parse(receipt.leader_exited_at!) - Date.parse(receipt.started_at!)).toBeLessThan(800);
    expect(Date.parse(receipt.ended_at) - Date.parse(receipt.leader_exited_at!)).toBeGreaterThanOrEqual(900);
  });

  it('escalates at the deadline through the shim: TERM, then KILL of TERM-ignoring descendants', async () => {
    const a = marker();
    const b = marker();
    const receiptPath = join(daemon.dir, 'deadline.json');
    const r = await daemon.sbx([
      'run',
      '--timeout',
      '1s',
      '--grace',
      '500ms',
      '--receipt',
      receiptPath,
      '--',
      'sh',
      '-c',
      `trap "" TERM; setsid sleep ${a} & sleep ${b}`,
    ]);
    expect(r.status).toBe(124);
    const receipt = JSON.parse(readFileSync(receiptPath, 'utf8')) as Receipt;
    expect(receipt.outcome).toBe('timed_out');
    expect(receipt.termination.steps.map((s) => s.signal)).toEqual(['SIGTERM', 'SIGKILL']);
    expect(receipt.termination.steps[0].pids).toBe(3);
    expect(receipt.descendants_terminated).toBe(2);
    expect(receipt.death.evidence).toBe('subreaper_reaped');
    expect(pidsWithMarker(a)).toEqual([]);
    expect(pidsWithMarker(b)).toEqual([]);
  });

  it("the deadline's TERM reaches every process, also the children of a shell it kills (reparented to the shim mid-walk): no KILL step", async () => {
    // The shim signalled a process before reading its children: sh died of the TERM, its two
    // sleeps went to the shim, out of the list read, and lived to the KILL after the grace
    // (9 of 16 runs before). 5 pipe and 5 pty runs.
    for (let i = 0; i < 5; i++) {
      for (const pty of [[], ['--pty']]) {
        const a = marker();
        const { status, receipt } = await deadlineRun(pty, `term-${i}${pty.length}`, `sleep ${a} & sleep ${a}`);
        expect(status).toBe(124);
        expect({ run: i, pty: pty.length > 0, steps: receipt.termination.steps.map((s) => [s.signal, s.pids]) }).toEqual({
          run: i,
          pty: pty.length > 0,
          steps: [['SIGTERM', 3]],
        });
        expect(receipt.descendants_terminated).toBe(2);
        expect(pidsWithMarker(a)).toEqual([]);
      }
    }
  });

  it('a shim the command stops (kill -STOP $PPID, or kill -STOP 0: its process group) is continued: the exit is reported, the deadline ends it', async () => {
    // Before, the stopped shim reported nothing and answered no signal: sbx run waited forever,
    // the deadline's TERM waited on the shim's answer, and so did the supervisor's shutdown.
    for (const pty of [[], ['--pty']]) {
      const receiptPath = join(daemon.dir, `stopped-${pty.length}.json`);
      const r = await daemon.sbx(['run', ...pty, '--receipt', receiptPath, '--', 'sh', '-c', 'kill -STOP $PPID; echo hi']);
      expect({ pty, status: r.status, stdout: r.stdout.toString() }).toEqual({ pty, status: 0, stdout: pty.length ? 'hi\r\n' : 'hi\n' });
      expect(JSON.parse(readFileSync(receiptPath, 'utf8')).death.evidence).toBe('subreaper_reaped');
      for (const target of ['$PPID', '0']) {
        const m = marker();
        const { status, receipt } = await deadlineRun(pty, `stopped-deadline-${pty.length}`, `kill -STOP ${target}; sleep ${m}; exit 0`);
        expect({ pty, target, status }).toEqual({ pty, target, status: 124 });
        // kill -STOP 0 stopped sh too, before its sleep: TERM (then CONT) reached sh alone.
        expect({ pty, target, steps: receipt.termination.steps.map((s) => [s.signal, s.pids]) }).toEqual({
          pty,
          target,
          steps: [['SIGTERM', target === '0' ? 1 : 2]],
        });
        expect(receipt.death.evidence).toBe('subreaper_reaped');
        expect(pidsWithMarker(m)).toEqual([]);
      }
    }
  });

  it('runs pty and stdin sessions too', async () => {
    const pty = await daemon.sbx(['run', '--pty', '--', 'sh', '-c', 'tty >/dev/null && head -c 300000 /dev/zero | base64 -w0; exit 3']);
    expect(pty.status).toBe(3);
    expect(pty.stdout.length).toBe(400000);
    const stdin = await daemon.sbx(['run', '--stdin', '--', 'wc', '-c'], { input: Buffer.alloc(100000, 1) });
    expect(stdin.stdout.toString().trim()).toBe('100000');
  });

  it('a shim killed before it reports leaves the session unknown (no proof of death), never failed', async () => {
    const m = marker();
    const client = await daemon.client();
    try {
      const { session_id } = await client.launch({ argv: ['sleep', m], cwd: '/' });
      const [leader] = await until(() => {
        const pids = pidsWithMarker(m);
        return pids.length === 1 ? pids : null;
      }, 'the command to run');
      const shim = parentPid(leader);
      expect(readFileSync(`/proc/${shim}/cmdline`, 'utf8')).toContain('exec-shim');
      process.kill(shim, 'SIGKILL');
      const row = await until(
        async () => (await client.ps(true)).sessions.find((s) => s.session_id === session_id && s.state === 'unknown'),
        'the session to be unknown',
      );
      expect(row.reason).toBe("the exec shim (the session's subreaper) died before reporting all descendants reaped");
      expect(row.outcome).toBeNull();
      expect((await client.receipt({ session_id })).receipt).toBeNull();
      // sbx wait does not wait for evidence that never comes: 125 with the reason.
      const waited = await daemon.sbx(['wait', session_id]);
      expect({ status: waited.status, stdout: waited.stdout.toString(), stderr: waited.stderr.toString() }).toEqual({
        status: 125,
        stdout: '',
        stderr: `sbx: session ${session_id} is unknown: the exec shim (the session's subreaper) died before reporting all descendants reaped; it is never run again (sbx ps, sbx resolve)\n`,
      });
      const cancelled = await daemon.sbx(['cancel', session_id]);
      expect(cancelled.status).toBe(125);
      expect(cancelled.stderr.toString()).toContain('(it has no cgroup: what it left is not reachable from here; sbx resolve records');
      const killed = await daemon.sbx(['kill', session_id]);
      expect([killed.status, killed.stderr.toString()]).toEqual([
        125,
        `sbx: INVALID_ARGUMENT: session ${session_id} is unknown and has no cgroup: what it left is not reachable from here: the exec shim (the session's subreaper) died before reporting all descendants reaped (sbx resolve records an operator's word)\n`,
      ]);
    } finally {
      // The command outlives its shim (reparented to the supervisor): ended here, by pid.
      for (const pid of pidsWithMarker(m)) process.kill(pid, 'SIGKILL');
      await until(() => pidsWithMarker(m).length === 0, 'the orphaned command to be gone');
      client.close();
    }
  });

  it('sbx run of a command that kills its shim: its output, then 125 with the reason (the session unknown), not a wait for good; with --pty too', async () => {
    const unknownLine =
      /^sbx: session s-\S+ is unknown: the exec shim \(the session's subreaper\) died before reporting all descendants reaped; it is never run again \(sbx ps, sbx resolve\)\n$/;
    const r = await daemon.sbx(['run', '--', 'sh', '-c', 'kill -9 $PPID; echo after']);
    expect(r.status).toBe(125);
    expect(r.stdout.toString()).toBe('after\n');
    expect(r.stderr.toString()).toMatch(unknownLine);
    // The pty's session leader gone, the tty is hung up: its stream ends (the supervisor lets its
    // slave go), and sbx run is not left following it for good.
    const pty = await daemon.sbx(['run', '--pty', '--', 'sh', '-c', 'kill -9 $PPID; sleep 1; echo x']);
    expect(pty.status).toBe(125);
    expect(pty.stderr.toString()).toMatch(unknownLine);
  });

  it('leaves no zombie under the supervisor', async () => {
    const r = await daemon.sbx(['run', '--', 'sh', '-c', 'i=0; while [ $i -lt 50 ]; do sh -c "sleep 0.01 &"; i=$((i+1)); done; echo ok']);
    expect(r.status).toBe(0);
    await until(() => zombieChildren(daemon.pid).length === 0, 'no zombie under the supervisor', 5000);
  });
});

describe('subreaper mode, a shim that stays stopped (SBX_TEST_SHIM_STAYS_STOPPED: never continued)', () => {
  // The command stops the shim (its parent) at once; when that comes before the shim wrote
  // "started" (1 in 11 runs of the shim alone here), the exec is never heard: the second case
  // makes that order certain (SBX_TEST_SHIM_START_UNHEARD) and the escalation goes on past the
  // shim's answer bound instead of waiting for the exec for good.
  it.each([
    ['by its command, before or after it said "started"', {}, []],
    ['before it said "started"', { SBX_TEST_SHIM_START_UNHEARD: '1' }, ['the exec shim did not report the exec in time: the escalation goes on without it']],
  ] as const)(
    'stopped %s: past the kill bound the supervisor kills its tree: the session is unknown, nothing is left, the supervisor stops cleanly',
    async (_when, env, logLines) => {
      // The shim's answer bound (5 s) and kill bound (10 s) cut to 1 s and 2 s: the same escalation, sooner.
      const stuck = await new TestDaemon({
        config: { cgroup: { mode: 'subreaper' } },
        env: { SBX_TEST_SHIM_STAYS_STOPPED: '1', SBX_TEST_SHIM_ANSWER_MS: '1000', SBX_TEST_SHIM_KILL_GIVE_UP_MS: '2000', ...env },
      }).start();
      const m = marker();
      const client = await stuck.client();
      try {
        const { session_id } = await client.launch({
          argv: ['sh', '-c', `sleep ${m} & kill -STOP $PPID; sleep ${m}`],
          cwd: '/',
          timeout_ms: 200,
          grace_ms: 100,
        });
        const row = await until(
          async () => (await client.ps(true)).sessions.find((s) => s.session_id === session_id && s.state === 'unknown'),
          'the session to be unknown after the kill bound (2 s here)',
          60_000,
        );
        expect(row.reason).toBe("the exec shim (the session's subreaper) died before reporting all descendants reaped");
        expect(row.outcome).toBeNull();
        await until(() => pidsWithMarker(m).length === 0, 'the sleeps to be gone');
        await until(() => zombieChildren(stuck.pid).length === 0, 'no zombie under the supervisor', 5000);
        const log = readFileSync(stuck.logPath, 'utf8');
        for (const line of [...logLines, 'the exec shim did not report all reaped within the kill bound: its tree killed from the supervisor'])
          expect(log).toContain(line);
      } finally {
        client.close();
        for (const pid of pidsWithMarker(m)) process.kill(pid, 'SIGKILL');
        expect(await stuck.stop()).toEqual({ code: 0, signal: null });
      }
    },
    90_000,
  );
});

describe('subreaper mode, the supervisor SIGKILLed under a running session', () => {
  it('the shim goes on as the subreaper: it reaps, leaves the command alone (its own SIGPIPE is not forwarded) and does not spin on its dead report pipe', async () => {
    const d = await new TestDaemon({ config: { cgroup: { mode: 'subreaper' } } }).start();
    const m = marker();
    let survivor = 0;
    let shim = 0;
    try {
      const c = await d.client();
      // The leader execs a 1 s sleep; its child sleeps on (the marker only in the child's command line).
      await c.launch({ argv: ['sh', '-c', 'sleep $M & exec sleep 1'], env: { M: m }, cwd: '/' });
      [survivor] = await until(() => {
        const p = pidsWithMarker(m);
        return p.length === 1 ? p : null;
      }, 'the background sleep');
      const leader = parentPid(survivor);
      shim = parentPid(leader);
      expect(readFileSync(`/proc/${shim}/cmdline`, 'utf8')).toContain('exec-shim');
      await d.kill9();
      // The leader's exit is reported to a pipe nobody reads (EPIPE, and SIGPIPE on the shim's signalfd).
      await until(() => !existsSync(`/proc/${leader}`) && parentPid(survivor) === shim, 'the leader to exit and be reaped by the shim');
      const ticks = () => {
        const stat = readFileSync(`/proc/${shim}/stat`, 'utf8');
        const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
        return Number(f[11]) + Number(f[12]); // utime + stime, clock ticks (proc(5))
      };
      const before = ticks();
      await new Promise((r) => setTimeout(r, 300)); // a window to measure the shim's CPU in, not a race to wait out
      expect(ticks() - before).toBeLessThan(5); // it spun at ~90% of a CPU (~27 ticks in 300 ms)
      expect(pidsWithMarker(m)).toEqual([survivor]); // alive, not a zombie: no SIGPIPE forwarded to it
      expect(zombieChildren(shim)).toEqual([]);
    } finally {
      if (survivor) process.kill(survivor, 'SIGKILL');
      // A shim that failed the test (spinning) is ended by its pid: its parent is gone.
      if (shim && existsSync(`/proc/${shim}`) && readFileSync(`/proc/${shim}/cmdline`, 'utf8').includes('exec-shim')) process.kill(shim, 'SIGKILL');
      await until(() => pidsWithMarker(m).length === 0, 'the background sleep to be gone');
      await d.start();
      await d.stop();
    }
  });
});
