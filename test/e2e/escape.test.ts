// Root sessions and the trust model: a root process that moves a process out of its leaf
// (cgroup.procs of another cgroup) is seen by the escape watch, and its receipt's death is
// qualified (cgroup_escaped, where to), so complete(task) does not count it; a write to its own
// leaf is no escape; a non-root session cannot escape; receipts carry the uid; a signal the
// supervisor did not send is marked so (exit.signal_source).
import { randomBytes } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { Receipt, SessionSummary, TaskReceipt } from '../../ipc/protocol.js';
import { cgroupMount, removeCgroupTree, TEST_CGROUP_PREFIX } from '../helpers/cgroup-cleanup.js';
import { TestDaemon, until } from '../helpers/daemon.js';
import { verifyTask } from '../helpers/tasks.js';

let daemon: TestDaemon;
beforeAll(async () => {
  daemon = new TestDaemon();
  await daemon.start();
});
afterAll(async () => {
  expect(await daemon.stop()).toEqual({ code: 0, signal: null });
});

/** A cgroup outside the daemon's subtree, made by the test; whatever went there is killed by pid, then it goes. */
let foreign: string | null = null;
function makeForeignCgroup(): string {
  const mount = cgroupMount();
  if (!mount) throw new Error('no cgroup2 mount');
  foreign = join(mount, `${TEST_CGROUP_PREFIX}escape-${randomBytes(4).toString('hex')}`);
  mkdirSync(foreign);
  return foreign;
}
const procsOf = (dir: string) => readFileSync(join(dir, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean).map(Number);
afterEach(async () => {
  if (!foreign || !existsSync(foreign)) return;
  for (const pid of procsOf(foreign)) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // Gone already.
    }
  }
  await removeCgroupTree(foreign);
  foreign = null;
});

let lastStderr = '';
async function run(task: string, argv: string[], extra: string[] = []): Promise<Receipt> {
  const path = join(daemon.dir, `r-${randomBytes(4).toString('hex')}.json`);
  lastStderr = (await daemon.sbx(['run', '--task', task, '--receipt', path, '--cwd', '/', ...extra, '--', ...argv])).stderr.toString();
  return JSON.parse(readFileSync(path, 'utf8')) as Receipt;
}

async function closeTask(task: string): Promise<{ status: number | null; receipt: TaskReceipt; verified: { status: number | null; out: string } }> {
  const r = await daemon.sbx(['close', '--task', task, '--json']);
  return { status: r.status, receipt: JSON.parse(r.stdout.toString()) as TaskReceipt, verified: await verifyTask(daemon, r.stdout) };
}

const task = () => `esc-${randomBytes(4).toString('hex')}`;

describe('cgroup escapes', () => {
  it('a root session that moves a background sleep into another cgroup: death cgroup_escaped naming it, the task incomplete', async () => {
    const dest = makeForeignCgroup();
    const t = task();
    const receipt = await run(t, ['sh', '-c', `sleep 300 & echo $! > ${dest}/cgroup.procs; exit 0`]);
    // The sleep runs on in the foreign cgroup.
    const moved = procsOf(dest);
    expect(moved).toHaveLength(1);
    expect(readFileSync(`/proc/${moved[0]}/comm`, 'utf8')).toBe('sleep\n');
    expect(receipt).toMatchObject({ outcome: 'exited', exit: { code: 0, signal: null }, termination: { cause: null, steps: [] }, uid: 0, gid: 0 });
    // The sleep holds the session's pipes: the drain is cut after the post-death bound, and says so.
    expect(receipt.output.stdout).toMatchObject({ complete: false, drain_end: 'timeout' });
    expect(receipt.termination.signal_source).toBeUndefined(); // no signal
    expect(receipt.death).toEqual({
      evidence: 'cgroup_escaped',
      observed_at: expect.any(String),
      cgroup: expect.stringMatching(/\/sessions\/s-/),
      escape_watch: 'fanotify',
      escapes: [{ kind: 'escape', to: dest, at: expect.any(String), writer_pid: expect.any(Number) }],
    });
    // sbx ps says so beside the exit status.
    const psRow = async () =>
      (JSON.parse((await daemon.sbx(['ps', '--all', '--json'])).stdout.toString()) as SessionSummary[]).find((s) => s.session_id === receipt.session_id)!;
    expect((await psRow()).escaped).toBe('unproven');
    expect((await daemon.sbx(['ps', '--all'])).stdout.toString()).toMatch(/exited 0, [^\n]*ago, processes left its cgroup \(end unproven\)/);
    // sbx run says so: the exit status cannot.
    expect(lastStderr).toContain(
      `sbx: session ${receipt.session_id}: processes were moved out of its cgroup (to ${dest}): their end is not proven (death evidence cgroup_escaped; sbx receipt ${receipt.session_id})\n`,
    );
    const closed = await closeTask(t);
    expect(closed.status).toBe(1);
    expect(closed.receipt.complete).toBe(false);
    expect(closed.receipt.conditions.sessions_settled).toBe(false);
    expect(closed.receipt.obligations).toEqual([
      {
        authority: 'operator',
        condition: 'sessions_settled',
        session_id: receipt.session_id,
        what: expect.stringContaining(`moved out of its cgroup before it emptied (to ${dest} by pid `),
      },
    ]);
    expect(closed.receipt.sessions).toEqual([
      expect.objectContaining({ session_id: receipt.session_id, uid: 0, death: expect.objectContaining({ evidence: 'cgroup_escaped' }) }),
    ]);
    expect(closed.receipt.trust).toEqual({ root_sessions: [receipt.session_id], reason: expect.stringContaining('a root process can leave its cgroup') });
    // The operator ends what escaped, says so; the next close counts it, showing the word.
    // Not while the destination still holds it.
    const early = await daemon.sbx(['resolve', receipt.session_id, '--as-operator', '--reason', 'too early']);
    expect(early.status).toBe(125);
    expect(early.stderr.toString()).toContain(`what left its cgroup still runs (${dest} holds pid ${moved[0]}): end it first, or attest anyway with --force`);
    expect(existsSync(join(daemon.stateDir, 'sessions', receipt.session_id, 'escape-attested.json'))).toBe(false);
    process.kill(moved[0], 'SIGKILL');
    await until(() => procsOf(dest).length === 0 || null, 'the foreign cgroup empty');
    const resolved = await daemon.sbx(['resolve', receipt.session_id, '--as-operator', '--reason', 'killed the escaped sleep']);
    expect(resolved.status).toBe(0);
    expect(JSON.parse(resolved.stdout.toString())).toEqual(receipt); // the receipt stays as it was
    expect(resolved.stderr.toString()).toBe(
      `sbx: session ${receipt.session_id}: your word that what left its cgroup is ended is recorded (escape-attested.json in its directory of the state dir, sessions/${receipt.session_id}/); the receipt stays as it was, and the next close counts the session\n`,
    );
    expect((await psRow()).escaped).toBe('attested');
    // sbx wait says it was attested, no longer that the end is not proven.
    const waited = (await daemon.sbx(['wait', receipt.session_id])).stderr.toString();
    expect(waited).toContain(
      `sbx: session ${receipt.session_id}: processes were moved out of its cgroup (to ${dest}): an operator attested their end (uid 0 at `,
    );
    expect(waited).not.toContain('not proven');
    expect((await daemon.sbx(['resolve', receipt.session_id, '--as-operator', '--reason', 'again'])).stderr.toString()).toContain('attested already');
    const again = await closeTask(t);
    expect(again.status).toBe(0);
    expect(again.receipt.complete).toBe(true);
    expect(again.receipt.sessions[0].death).toMatchObject({
      evidence: 'cgroup_escaped',
      escape_attested: { uid: 0, reason: 'killed the escaped sleep', attested_at: expect.any(String) },
    });
    // Both task receipts verify end to end: the verdict follows from the receipts and the word in the state dir.
    for (const c of [closed, again]) expect(c.verified).toEqual({ status: 0, out: expect.stringContaining('OK: task receipt') });
  });

  it('a root session whose leader moves itself out: attributed by the shim pid; the supervisor waits for its own child, killed from outside', async () => {
    const dest = makeForeignCgroup();
    const id = (await daemon.sbx(['run', '--detach', '--task', task(), '--', 'sh', '-c', `echo $$ > ${dest}/cgroup.procs; exec sleep 300`])).stdout
      .toString()
      .trim();
    const [pid] = await until(() => (procsOf(dest).length === 1 ? procsOf(dest) : null), 'the leader in the foreign cgroup');
    // Its leaf is empty, but the leader is the supervisor's child and not reaped: no receipt yet.
    expect(JSON.parse((await daemon.sbx(['ps', '--json'])).stdout.toString()).find((s: SessionSummary) => s.session_id === id)).toMatchObject({
      state: 'running',
      pid,
    });
    process.kill(pid, 'SIGKILL');
    const receipt = JSON.parse((await daemon.sbx(['wait', id])).stdout.toString()) as Receipt;
    expect(receipt).toMatchObject({ exit: { signal: 'SIGKILL' } });
    expect(receipt.termination).toEqual({ cause: null, steps: [], signal_source: 'not_supervisor' });
    expect(receipt.death).toMatchObject({ evidence: 'cgroup_escaped', escapes: [{ kind: 'escape', to: dest, writer_pid: pid }] });
  });

  it('an orphan of the session (reparented to the supervisor) that moves itself out: unattributable, charged as escape_possible', async () => {
    const dest = makeForeignCgroup();
    // The subshell exits at once: its child is an orphan, whose parent is now the supervisor (the subreaper), not the shim.
    // `>>`, not `>`: O_TRUNC is a write of its own (FAN_MODIFY at the open), seen while the
    // orphan is still in the leaf and then rightly charged to the session; one write only here.
    const inner = `sleep 0.3; echo \\$\\$ >> ${dest}/cgroup.procs; exec sleep 300`;
    const receipt = await run(task(), ['sh', '-c', `(sh -c "${inner}" &) ; exit 0`], ['--linger', 'wait']);
    const [orphan] = procsOf(dest);
    expect(readFileSync(`/proc/${orphan}/comm`, 'utf8')).toBe('sleep\n');
    expect(receipt.death).toMatchObject({ evidence: 'cgroup_escaped', escapes: [{ kind: 'escape_possible', to: dest, writer_pid: orphan }] });
  });

  it('an orphan that moves another process out, from inside the leaf: attributed to the session by its cgroup', async () => {
    const dest = makeForeignCgroup();
    // The writer stays a moment after its write, so the watch's read (every 50 ms) finds it alive.
    const inner = `sleep 300 & sleep 0.3; echo \\$! > ${dest}/cgroup.procs; sleep 0.5`;
    const receipt = await run(task(), ['sh', '-c', `(sh -c "${inner}" &) ; exit 0`], ['--linger', 'wait']);
    const [moved] = procsOf(dest);
    expect(receipt.death).toMatchObject({ evidence: 'cgroup_escaped', escapes: [{ kind: 'escape', to: dest, writer_pid: expect.any(Number) }] });
    expect(receipt.death.escapes![0].writer_pid).not.toBe(moved);
  });

  it('a root session that writes only its own leaf: no escape, cgroup_empty watched', async () => {
    expect(JSON.parse((await daemon.sbx(['status', '--json'])).stdout.toString()).escape_watch).toEqual({ on: true, reason: null });
    const t = task();
    const leafProcs = `"${cgroupMount()}$(sed -n 's/^0:://p' /proc/self/cgroup)/cgroup.procs"`;
    const receipt = await run(t, ['sh', '-c', `echo $$ > ${leafProcs} && echo joined`]);
    expect(receipt).toMatchObject({ outcome: 'exited', exit: { code: 0 }, uid: 0 });
    expect(receipt.output.stdout!.final_cursor).toBe(7);
    expect(receipt.death).toEqual({ evidence: 'cgroup_empty', observed_at: expect.any(String), cgroup: expect.any(String), escape_watch: 'fanotify' });
    const closed = await closeTask(t);
    expect(closed.status).toBe(0);
    expect(closed.receipt.complete).toBe(true);
    // Complete, with the note that its proof rests on root not interfering.
    expect(closed.receipt.trust?.root_sessions).toEqual([receipt.session_id]);
  });

  it('a non-root session cannot escape (EACCES): its receipt is unqualified, the task has no trust note', async () => {
    const dest = makeForeignCgroup();
    const t = task();
    const receipt = await run(t, ['sh', '-c', `echo $$ > ${dest}/cgroup.procs; echo rc=$?`], ['--user', 'nobody']);
    expect(procsOf(dest)).toEqual([]);
    expect(receipt).toMatchObject({ outcome: 'exited', user: 'nobody', uid: 65534 });
    expect(receipt.death).toEqual({ evidence: 'cgroup_empty', observed_at: expect.any(String), cgroup: expect.any(String), escape_watch: 'fanotify' });
    const out = readFileSync(join(daemon.stateDir, 'sessions', receipt.session_id, 'stdout', '0000000000000000.chunk'), 'utf8');
    expect(out).toBe('rc=2\n'); // sh: Permission denied
    const closed = await closeTask(t);
    expect(closed.status).toBe(0);
    expect(closed.receipt.sessions).toEqual([expect.objectContaining({ session_id: receipt.session_id, uid: 65534 })]);
    expect(closed.receipt.trust).toBeUndefined();
  });
});

/** A C fixture (built with gcc): clone3(CLONE_INTO_CGROUP) of a child born in argv[1] that sleeps; the parent prints its pid and exits. */
const CLONE3_C = `#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(int argc, char **argv) {
  int fd = open(argv[1], O_RDONLY | O_DIRECTORY);
  if (fd < 0) { perror("open"); return 2; }
  struct clone_args a; memset(&a, 0, sizeof a);
  a.flags = CLONE_INTO_CGROUP; a.exit_signal = SIGCHLD; a.cgroup = (uint64_t)fd;
  long pid = syscall(SYS_clone3, &a, sizeof a);
  if (pid < 0) { perror("clone3"); return 3; }
  if (pid == 0) { execlp("sleep", "sleep", "300", (char *)0); _exit(127); }
  printf("%ld\\n", pid);
  return 0;
}
`;

describe('the walk at a death (positive proof, no event needed)', () => {
  let bin = '';
  let scratch = '';
  beforeAll(() => {
    scratch = mkdtempSync(join(tmpdir(), 'sbx-clone3-'));
    writeFileSync(join(scratch, 'clone3.c'), CLONE3_C);
    bin = join(scratch, 'clone3-into');
    execFileSync('gcc', ['-O1', '-o', bin, join(scratch, 'clone3.c')]);
  });
  afterAll(() => rmSync(scratch, { recursive: true, force: true }));

  it('a child born in another cgroup (clone3 CLONE_INTO_CGROUP: no cgroup.procs write): a stray, the task incomplete', async () => {
    const dest = makeForeignCgroup();
    const t = task();
    const receipt = await run(t, ['sh', '-c', `${bin} ${dest} > /dev/null 2>&1`]);
    const [child] = procsOf(dest);
    expect(readFileSync(`/proc/${child}/comm`, 'utf8')).toBe('sleep\n');
    expect(receipt).toMatchObject({ outcome: 'exited', exit: { code: 0 } });
    expect(receipt.death).toMatchObject({ evidence: 'cgroup_escaped', escapes: [{ kind: 'stray', to: dest, at: expect.any(String), writer_pid: child }] });
    const closed = await closeTask(t);
    expect(closed.status).toBe(1);
    expect(closed.receipt.complete).toBe(false);
    // --force attests over a live destination (the operator's choice, recorded as such).
    const forced = await daemon.sbx(['resolve', receipt.session_id, '--as-operator', '--force', '--reason', 'it may run']);
    expect(forced.status).toBe(0);
    expect(forced.stderr.toString()).toContain('is recorded (escape-attested.json');
  });

  it("a process that moves itself out as the leaf's last one, 10 sessions at once: every death qualified", async () => {
    const dest = makeForeignCgroup();
    // At once, so the supervisor is busy when each write returns (its event queued after populated 0).
    const receipts = await Promise.all(
      Array.from({ length: 10 }, () =>
        run(task(), ['sh', '-c', `sh -c 'echo $$ > ${dest}/cgroup.procs; exec sleep 300' > /dev/null 2>&1 & exit 0`], ['--linger', 'wait']),
      ),
    );
    expect(procsOf(dest)).toHaveLength(10);
    for (const receipt of receipts) {
      expect(receipt.death.evidence).toBe('cgroup_escaped');
      expect(receipt.death.escapes!.some((e) => e.to === dest)).toBe(true);
    }
  });

  it('a writer 70 processes deep moves a sleep out: qualified (a cut PPid chain is never "not ours")', async () => {
    const dest = makeForeignCgroup();
    const script = join(daemon.dir, `deep-${randomBytes(4).toString('hex')}.sh`);
    writeFileSync(
      script,
      `if [ "$1" -gt 0 ]; then sh ${script} $(($1 - 1)); exit $?; fi\nsleep 300 > /dev/null 2>&1 &\necho $! > ${dest}/cgroup.procs\nsleep 0.3\n`,
    );
    const receipt = await run(task(), ['sh', script, '70']);
    expect(procsOf(dest)).toHaveLength(1);
    expect(receipt.death).toMatchObject({ evidence: 'cgroup_escaped', escapes: [expect.objectContaining({ to: dest })] });
  });

  it('a service of leftovers is not charged with a stray an earlier session left: it starts when its command did', async () => {
    const dest = makeForeignCgroup();
    const escaped = await run(task(), ['sh', '-c', `(sh -c 'echo $$ > ${dest}/cgroup.procs; exec sleep 300') & sleep 0.3; echo moved`], ['--linger', 'kill']);
    expect(escaped.death.evidence).toBe('cgroup_escaped');
    expect(procsOf(dest).length).toBe(1);
    const t = task();
    const command = await run(t, ['sh', '-c', 'sleep 300 & echo up']);
    const sid = command.handed_off!.service_id;
    const closed = await closeTask(t);
    expect(closed.receipt.sessions.find((s) => s.session_id === sid)!.death).toEqual({ evidence: 'cgroup_empty', observed_at: expect.any(String) });
    expect(closed.receipt.complete).toBe(true);
    expect(closed.verified.status).toBe(0);
  });

  it('a benign root session whose children all die, beside a live root session: unqualified, the other not charged', async () => {
    const other = (await daemon.sbx(['run', '--detach', '--', 'sh', '-c', 'sleep 300 & exec sleep 300'])).stdout.toString().trim();
    try {
      const t = task();
      const receipt = await run(t, ['sh', '-c', 'sleep 0.1 & (sleep 0.2 &) ; sh -c "sleep 0.1" & wait'], ['--linger', 'wait']);
      expect(receipt.death).toEqual({ evidence: 'cgroup_empty', observed_at: expect.any(String), cgroup: expect.any(String), escape_watch: 'fanotify' });
      expect((await closeTask(t)).receipt.complete).toBe(true);
    } finally {
      await daemon.sbx(['kill', other]);
      const r = JSON.parse((await daemon.sbx(['wait', other])).stdout.toString()) as Receipt;
      expect(r.death.evidence).toBe('cgroup_empty');
    }
  });
});

describe('a command faster than its tracking', () => {
  it("a write to another cgroup.procs before the supervisor tracks the session (a loaded machine): still the session's escape, named with its writer", async () => {
    // The event loop held 300 ms between the spawn and the tracking: the command has moved its
    // sleep out and exited by then. That write was once dropped as stale (only a stray left).
    const slow = new TestDaemon({ env: { SBX_TEST_SPAWN_TO_TRACK_MS: '300' } });
    await slow.start();
    try {
      const dest = makeForeignCgroup();
      const path = join(slow.dir, 'r.json');
      await slow.sbx(['run', '--receipt', path, '--', 'sh', '-c', `sleep 300 >/dev/null 2>&1 & echo $! > ${dest}/cgroup.procs; echo $$`]);
      const receipt = JSON.parse(readFileSync(path, 'utf8')) as Receipt;
      const [moved] = procsOf(dest);
      expect(readFileSync(`/proc/${moved}/comm`, 'utf8')).toBe('sleep\n');
      const leader = Number((await slow.sbx(['logs', receipt.session_id])).stdout.toString().trim());
      expect(receipt.death).toMatchObject({ evidence: 'cgroup_escaped', escapes: [{ kind: 'escape', to: dest, writer_pid: leader }] });
      expect(receipt.death.escapes).toHaveLength(1);
      process.kill(moved, 'SIGKILL');
      await until(() => procsOf(dest).length === 0 || null, 'the foreign cgroup empty');
      // The leader moves itself out: it is no stray (the supervisor's own child), so the dropped
      // write had left an unqualified cgroup_empty, a proof that was not one.
      const id = (await slow.sbx(['run', '--detach', '--', 'sh', '-c', `echo $$ > ${dest}/cgroup.procs; exec sleep 300`])).stdout.toString().trim();
      const [pid] = await until(() => (procsOf(dest).length === 1 ? procsOf(dest) : null), 'the leader in the foreign cgroup');
      process.kill(pid, 'SIGKILL');
      const second = JSON.parse((await slow.sbx(['wait', id])).stdout.toString()) as Receipt;
      expect(second.death).toMatchObject({ evidence: 'cgroup_escaped', escapes: [{ kind: 'escape', to: dest, writer_pid: pid }] });
    } finally {
      expect(await slow.stop()).toEqual({ code: 0, signal: null });
    }
  });
});

describe("a reaped shim's pid taken by another process", () => {
  it("a write by a process that got a reaped shim's pid (ns_last_pid) is its own session's escape, not the shim's session's", async () => {
    const dest = makeForeignCgroup();
    // Session a: its shim (the leader) exits and is reaped at once; a stays tracked while its
    // setsid'ed leftover runs (--linger wait), so its shim's pid is free for anyone.
    const a = (await daemon.sbx(['run', '--detach', '--linger', 'wait', '--', 'sh', '-c', 'setsid sleep 4 >/dev/null 2>&1 & exit 0'])).stdout.toString().trim();
    const shimPid = await until(async () => {
      const row = (JSON.parse((await daemon.sbx(['ps', '--json'])).stdout.toString()) as SessionSummary[]).find((s) => s.session_id === a);
      return row?.state === 'leader_exited' ? (row.pid ?? null) : null;
    }, "a's leader exited");
    // Session b forks until a child gets that pid (ns_last_pid, as a root process may); that child moves itself out.
    const grab = join(daemon.dir, 'grab.sh');
    writeFileSync(
      grab,
      [
        'T=$1; i=0',
        'while [ $i -lt 300 ]; do',
        '  echo $((T-1)) > /proc/sys/kernel/ns_last_pid',
        `  sh -c "if [ \\$\\$ -eq $T ]; then echo 0 > ${dest}/cgroup.procs; exec sleep 100; fi" >/dev/null 2>&1 &`,
        '  c=$!',
        '  if [ $c -eq $T ]; then sleep 0.3; echo got; exit 0; fi',
        '  wait $c; i=$((i+1))',
        'done',
        'exit 7',
      ].join('\n') + '\n',
    );
    const b = await run(task(), ['sh', grab, String(shimPid)]);
    expect(b.output.stdout).toMatchObject({ final_cursor: 4 }); // "got": the pid was taken
    expect(procsOf(dest)).toEqual([shimPid]);
    expect(b.death).toMatchObject({ evidence: 'cgroup_escaped', escapes: [{ kind: 'escape', to: dest, writer_pid: shimPid }] });
    const ra = JSON.parse((await daemon.sbx(['wait', a])).stdout.toString()) as Receipt;
    expect(ra.death).toEqual({ evidence: 'cgroup_empty', observed_at: expect.any(String), cgroup: expect.any(String), escape_watch: 'fanotify' });
  });
});

describe('without the escape watch', () => {
  it('receipts say escape detection was unavailable; the trust note of the task names the root sessions it concerns', async () => {
    const off = new TestDaemon({ env: { SBX_TEST_ESCAPE_WATCH_OFF: '1' } });
    await off.start();
    try {
      const path = join(off.dir, 'r.json');
      expect((await off.sbx(['run', '--task', 'off', '--receipt', path, '--', 'true'])).status).toBe(0);
      const receipt = JSON.parse(readFileSync(path, 'utf8')) as Receipt;
      expect(receipt.death).toEqual({ evidence: 'cgroup_empty', observed_at: expect.any(String), cgroup: expect.any(String), escape_watch: 'unavailable' });
      expect(JSON.parse((await off.sbx(['status', '--json'])).stdout.toString()).escape_watch).toEqual({
        on: false,
        reason: 'turned off (SBX_TEST_ESCAPE_WATCH_OFF)',
      });
      expect((await off.sbx(['status'])).stdout.toString()).toContain('\nescapes    not watched: turned off (SBX_TEST_ESCAPE_WATCH_OFF)\n');
      const closed = JSON.parse((await off.sbx(['close', '--task', 'off', '--json'])).stdout.toString()) as TaskReceipt;
      expect(closed.complete).toBe(true);
      expect(closed.trust).toEqual({
        root_sessions: [receipt.session_id],
        reason: expect.stringMatching(new RegExp(`; escape detection was unavailable for ${receipt.session_id}$`)),
      });
    } finally {
      expect(await off.stop()).toEqual({ code: 0, signal: null });
    }
  });
});

describe('signals from outside', () => {
  it('a leader killed by someone else (kill -9 from the test): cause null, termination.signal_source not_supervisor', async () => {
    const id = (await daemon.sbx(['run', '--detach', '--', 'sleep', '300'])).stdout.toString().trim();
    const pid = await until(async () => {
      const ps = JSON.parse((await daemon.sbx(['ps', '--json'])).stdout.toString()) as SessionSummary[];
      return ps.find((s) => s.session_id === id)?.pid;
    }, 'the leader pid');
    process.kill(pid, 'SIGKILL');
    const waited = await daemon.sbx(['wait', id]);
    const receipt = JSON.parse(waited.stdout.toString()) as Receipt;
    expect(receipt).toMatchObject({ outcome: 'signaled', exit: { code: null, signal: 'SIGKILL' } });
    expect(receipt.termination).toEqual({ cause: null, steps: [], signal_source: 'not_supervisor' });
    // A stored receipt's signature holds as read back through the state dir's schema (sbx verify --state-dir).
    const path = join(daemon.dir, `signaled-${id}.json`);
    (await import('node:fs')).writeFileSync(path, waited.stdout);
    expect((await daemon.sbx(['verify', path, '--state-dir', daemon.stateDir])).status).toBe(0);
  });
});
