// Services (docs/guide/services.md): leftovers of a command handed off at its leader's exit
// (linger handoff, the default) into a session of their own, frozen while they move; services
// started directly (sbx run --service); their output, cancel, task close, the sandbox-wide
// close and a supervisor crash. Every test ends what it started and checks nothing is left.
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createConnection } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Receipt, SessionSummary, TaskReceipt } from '../../ipc/protocol.js';
import { pidsWithMarker, TestDaemon, until } from '../helpers/daemon.js';

let daemon: TestDaemon;
beforeAll(async () => {
  daemon = await new TestDaemon({ config: { session: { defaultGraceMs: 1000 } } }).start();
});
afterAll(async () => {
  expect(await daemon.stop()).toEqual({ code: 0, signal: null });
});

/** A number no other process's command line has: the leftovers carry it (sleep MARKER). */
const marker = () => `7${randomBytes(2).readUInt16BE(0) % 100}.${randomBytes(3).readUIntBE(0, 3)}`;
const task = () => `svc-${randomBytes(4).toString('hex')}`;

async function run(args: string[], argv: string[]) {
  const receiptPath = join(daemon.dir, `r-${randomBytes(4).toString('hex')}.json`);
  const r = await daemon.sbx(['run', '--receipt', receiptPath, ...args, '--', ...argv]);
  return { ...r, receipt: JSON.parse(readFileSync(receiptPath, 'utf8')) as Receipt };
}

async function summary(id: string): Promise<SessionSummary> {
  const r = await daemon.sbx(['ps', '--all', '--json']);
  const all = JSON.parse(r.stdout.toString()) as SessionSummary[];
  return all.find((s) => s.session_id === id)!;
}

/** The cgroup (v2 path) of a pid now, from /proc/PID/cgroup's 0:: line. */
function cgroupOf(pid: number): string | null {
  try {
    return /^0::(.*)$/m.exec(readFileSync(`/proc/${pid}/cgroup`, 'utf8'))?.[1] ?? null;
  } catch {
    return null;
  }
}

describe('hand-off of leftovers (the default)', () => {
  it('a backgrounded sleep goes on as a service: the command ends at once with its status, the service has its own id, leaf, ps row, logs and receipt', async () => {
    const m = marker();
    const t = task();
    // The leader exits once the subshell has forked its sleep (the pid file is written after the
    // fork), so both are left at its exit: without the wait a loaded machine ends it first.
    const pidFile = join(daemon.dir, `sleep-${m}.pid`);
    const r = await run(
      ['--task', t],
      ['sh', '-c', `echo before; (sleep ${m} & echo $! > ${pidFile}; wait; echo late) & until [ -s ${pidFile} ]; do :; done; echo started; exit 3`],
    );
    expect(r.status).toBe(3);
    expect(r.stdout.toString()).toBe('before\nstarted\n');
    expect(r.receipt.outcome).toBe('exited');
    expect(r.receipt.termination.cause).toBeNull();
    expect(r.receipt.death.evidence).toBe('cgroup_empty');
    expect(r.receipt.handed_off).toMatchObject({ pids: 2 });
    expect(r.receipt.output.stdout).toMatchObject({ final_cursor: 15, complete: true, drain_end: 'handoff' });
    const sid = r.receipt.handed_off!.service_id;
    expect(r.stderr.toString()).toBe(`sbx: 2 processes handed off to service ${sid} (sbx ps, sbx logs ${sid}; sbx close --task ${t} ends it)\n`);
    // Every leftover is in the service's leaf, none in the command's (gone) or anywhere else.
    // (the subshell's command line carries the marker too)
    const pids = pidsWithMarker(m);
    expect(pids.length).toBe(2);
    const svc = await summary(sid);
    expect(svc).toMatchObject({ state: 'running', task: t, service: { handed_off_from: r.receipt.session_id, keep_after_close: false }, pid: null });
    expect(svc.live_pids).toBe(2);
    for (const pid of pids) expect(cgroupOf(pid)).toMatch(new RegExp(`/sessions/${sid}$`));
    expect((await summary(r.receipt.session_id)).handed_off_to).toBe(sid);
    // The service's stdout is the same pipe, from the hand-off on: "late" lands there.
    expect((await daemon.sbx(['cancel', sid])).status).toBe(0);
    const w = await daemon.sbx(['wait', sid]);
    const sr = JSON.parse(w.stdout.toString()) as Receipt;
    expect(sr).toMatchObject({
      outcome: 'cancelled',
      termination: { cause: 'cancel' },
      service: { handed_off_from: r.receipt.session_id },
      death: { evidence: 'cgroup_empty' },
    });
    expect(pidsWithMarker(m)).toEqual([]);
  });

  it("a service keeps the original stdout: bytes written after the hand-off are the service's, before it the command's; it ends by itself (wait: 0)", async () => {
    const r = await run([], ['sh', '-c', 'echo mine; (sleep 0.3; echo theirs; echo err >&2) & exit 0']);
    expect(r.status).toBe(0);
    expect(r.stdout.toString()).toBe('mine\n');
    const sid = r.receipt.handed_off!.service_id;
    const w = await daemon.sbx(['wait', sid]);
    expect(w.status).toBe(0);
    const sr = JSON.parse(w.stdout.toString()) as Receipt;
    expect(sr).toMatchObject({ outcome: 'exited', exit: { code: null, signal: null }, termination: { cause: null }, death: { evidence: 'cgroup_empty' } });
    expect(sr.output.stdout).toMatchObject({ final_cursor: 7, complete: true, drain_end: 'eof' });
    const logs = await daemon.sbx(['logs', sid]);
    expect([logs.stdout.toString(), logs.stderr.toString()]).toEqual(['theirs\n', 'err\n']);
  });

  it('a double-forked, setsid daemon is handed off whole; one that ignores SIGTERM is KILLed after the grace by cancel', async () => {
    const m = marker();
    const r = await run([], ['sh', '-c', `(setsid sh -c 'trap "" TERM; exec sleep ${m}' &) ; echo ok`]);
    expect(r.status).toBe(0);
    expect(r.receipt.handed_off).toMatchObject({ pids: 1 });
    const sid = r.receipt.handed_off!.service_id;
    expect(pidsWithMarker(m).map(cgroupOf)).toEqual([expect.stringMatching(new RegExp(`/sessions/${sid}$`))]);
    expect((await daemon.sbx(['cancel', '--grace', '300ms', sid])).status).toBe(0);
    const sr = JSON.parse((await daemon.sbx(['wait', sid])).stdout.toString()) as Receipt;
    expect(sr.termination.steps.map((s) => s.signal)).toEqual(['SIGTERM', 'SIGKILL']);
    expect(pidsWithMarker(m)).toEqual([]);
  });

  it("a descendant that forks in a loop during the move: every process ends up in the service, none in the command's leaf or elsewhere", async () => {
    const m = marker();
    // The loop forks a short-lived child (and a subshell) without pause; the hand-off freezes it mid-loop.
    const r = await run([], ['sh', '-c', `(while :; do sleep 0 ${m}; done) & (while :; do (true ${m}) ; done) & exit 0`]);
    expect(r.status).toBe(0);
    expect(r.receipt.death.evidence).toBe('cgroup_empty');
    const sid = r.receipt.handed_off!.service_id;
    expect(r.receipt.handed_off!.pids).toBeGreaterThanOrEqual(2);
    // Polled: each process seen carrying the marker is in the service's leaf (a child forked
    // since is too: the kernel puts it in its parent's cgroup). The command's leaf is gone.
    for (let round = 0; round < 20; round++) {
      for (const pid of pidsWithMarker(m)) {
        const cg = cgroupOf(pid);
        if (cg !== null) expect(cg).toMatch(new RegExp(`/sessions/${sid}$`));
      }
    }
    expect((await summary(sid)).live_pids).toBeGreaterThanOrEqual(2);
    expect((await daemon.sbx(['cancel', '--grace', '200ms', sid])).status).toBe(0);
    expect((await daemon.sbx(['wait', sid])).status).toBe(0);
    await until(() => pidsWithMarker(m).length === 0, 'every forked process to be gone');
  });

  it("--linger kill ends them and says so once on stderr; -q keeps stderr the command's own", async () => {
    const m = marker();
    const r = await run(['--linger', 'kill'], ['sh', '-c', `sleep ${m} & sleep ${m} & echo x >&2`]);
    expect(r.status).toBe(0);
    expect(r.stderr.toString()).toBe('x\nsbx: 2 leftover processes were ended (linger kill)\n');
    expect(r.receipt).toMatchObject({ termination: { cause: 'linger' }, descendants_terminated: 2 });
    expect(r.receipt.handed_off).toBeUndefined();
    // One that ignores SIGTERM (started after the leader's own trap: SIG_IGN is inherited, and in
    // place before the leader exits) is killed once the grace runs out, and the line says so.
    const t = await run(['--linger', 'kill', '--grace', '300ms'], ['sh', '-c', `sleep ${m} & trap '' TERM; sleep ${m} & echo x >&2`]);
    expect(t.stderr.toString()).toBe(
      'x\nsbx: 2 leftover processes were ended (linger kill: SIGTERM, then SIGKILL to 1 process still running after the grace)\n',
    );
    expect(t.receipt.termination.steps.map((s) => [s.signal, s.pids])).toEqual([
      ['SIGTERM', 2],
      ['SIGKILL', 1],
    ]);
    // With no grace SIGKILL is the only step, and the line says no more.
    const g = await run(['--linger', 'kill', '--grace', '0'], ['sh', '-c', `sleep ${m} & echo x >&2`]);
    expect(g.stderr.toString()).toBe('x\nsbx: 1 leftover process was ended (linger kill: SIGKILL, no grace)\n');
    expect(g.receipt.termination.steps.map((s) => s.signal)).toEqual(['SIGKILL']);
    const q = await run(['--linger', 'kill', '-q'], ['sh', '-c', `sleep ${m} & echo x >&2`]);
    expect(q.stderr.toString()).toBe('x\n');
    expect(pidsWithMarker(m)).toEqual([]);
  });

  it('nothing is said or handed off when nothing is left; with a pty the default is kill, and handoff asked for is refused', async () => {
    const r = await run([], ['sh', '-c', 'echo done']);
    expect(r.stderr.toString()).toBe('');
    expect(r.receipt.handed_off).toBeUndefined();
    const m = marker();
    const p = await run(['--pty'], ['sh', '-c', `sleep ${m} & echo up`]);
    expect(p.receipt).toMatchObject({ termination: { cause: 'linger' }, descendants_terminated: 1 });
    const refused = await daemon.sbx(['run', '--pty', '--linger', 'handoff', '--', 'true']);
    expect(refused.status).toBe(125);
    expect(refused.stderr.toString()).toContain('linger handoff is not available for a pty session');
    expect(pidsWithMarker(m)).toEqual([]);
  });
});

describe('services and tasks', () => {
  it('the dev-server pattern: a server started in the background serves the next session; sbx close --task ends it with a receipt and frees its port', async () => {
    const t = task();
    const dir = mkdtempSync(join(daemon.dir, 'www-'));
    writeFileSync(join(dir, 'hello.txt'), 'hello from the service\n');
    const start = await run(
      ['--task', t, '--cwd', dir],
      [
        'sh',
        '-c',
        // The port, once the server says it (polled, with a bound): http.server prints "Serving HTTP on ... port N".
        'python3 -u -m http.server 0 --bind 127.0.0.1 > srv.log 2>&1 & i=0; while [ $i -lt 400 ]; do p=$(sed -n "s/.* port \\([0-9]*\\) .*/\\1/p" srv.log); [ -n "$p" ] && break; sleep 0.025; i=$((i+1)); done; echo "$p"',
      ],
    );
    expect(start.status, start.stderr.toString()).toBe(0);
    const port = Number(start.stdout.toString().trim());
    expect(port).toBeGreaterThan(0);
    const sid = start.receipt.handed_off!.service_id;
    const fetched = await run(
      ['--task', t],
      ['python3', '-c', `import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:${port}/hello.txt').read().decode(), end='')`],
    );
    expect(fetched.stdout.toString()).toBe('hello from the service\n');
    const closed = await daemon.sbx(['close', '--task', t]);
    expect(closed.status, closed.stdout.toString() + closed.stderr.toString()).toBe(0);
    const receipt = JSON.parse(closed.stdout.toString()) as TaskReceipt;
    expect(receipt.settle.terminated_ids).toEqual([sid]);
    expect(closed.stderr.toString()).toContain(`sbx: ended service ${sid} (sh -c `);
    expect(receipt.sessions.find((s) => s.session_id === sid)).toMatchObject({
      state: 'ended',
      outcome: 'cancelled',
      service: { handed_off_from: start.receipt.session_id, keep_after_close: false },
      death: { evidence: 'cgroup_empty' },
    });
    expect(receipt.complete).toBe(true);
    // The port is free: nothing listens there any more.
    const refused = await new Promise<string>((resolve) => {
      const c = createConnection({ host: '127.0.0.1', port }, () => {
        c.destroy();
        resolve('connected');
      });
      c.on('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? 'error'));
    });
    expect(refused).toBe('ECONNREFUSED');
    rmSync(dir, { recursive: true, force: true });
  });

  it('sbx run --service starts one directly (its id, at once); close --task ends it; --keep-after-close outlives the task close', async () => {
    const t = task();
    const m = marker();
    const started = await daemon.sbx(['run', '--service', '--task', t, '--', 'sleep', m]);
    expect(started.status).toBe(0);
    const sid = started.stdout.toString().trim();
    const kept = (await daemon.sbx(['run', '--service', '--keep-after-close', '--task', t, '--', 'sleep', `${m}1`])).stdout.toString().trim();
    expect(await summary(sid)).toMatchObject({ state: 'running', service: { handed_off_from: null, keep_after_close: false } });
    const closed = JSON.parse((await daemon.sbx(['close', '--task', t])).stdout.toString()) as TaskReceipt;
    expect(closed.settle.terminated_ids).toEqual([sid]);
    expect(closed.sessions.map((s) => s.session_id)).not.toContain(kept);
    // With its obligations, so that a close not complete says why.
    expect({ complete: closed.complete, obligations: closed.obligations }).toEqual({ complete: true, obligations: [] });
    expect(await summary(kept)).toMatchObject({ state: 'running', service: { keep_after_close: true } });
    expect(pidsWithMarker(`${m}1`).length).toBe(1);
    expect((await daemon.sbx(['cancel', kept])).status).toBe(0);
    await daemon.sbx(['wait', kept]);
    expect(pidsWithMarker(m)).toEqual([]);
    // The services' keys are the supervisor's: no launch can take one first (and so keep a hand-off from happening).
    const taken = await daemon.sbx(['run', '--key', `service:${sid}`, '--', 'true']);
    expect(taken.status).toBe(125);
    expect(taken.stderr.toString()).toContain('invocation keys starting with "service:" are the supervisor\'s own');
    const refused = await daemon.sbx(['run', '--keep-after-close', '--', 'true']);
    expect(refused.status).toBe(125);
    expect(refused.stderr.toString()).toContain('--keep-after-close is for a service');
  });
});

describe('a supervisor crash while a service runs', () => {
  it('the service is recovered like any session: owner_lost, cgroup_empty, nothing left', async () => {
    const d = await new TestDaemon().start();
    try {
      const m = marker();
      const r = await d.sbx(['run', '--', 'sh', '-c', `sleep ${m} & echo up`]);
      expect(r.status).toBe(0);
      const sid = / service (s-[0-9a-z]+-[0-9a-f]+) /.exec(r.stderr.toString())![1];
      expect(pidsWithMarker(m).length).toBe(1);
      await d.kill9();
      await d.start();
      const w = await d.sbx(['wait', sid]);
      const sr = JSON.parse(w.stdout.toString()) as Receipt;
      expect(sr).toMatchObject({ outcome: 'owner_lost', death: { evidence: 'cgroup_empty' }, service: { handed_off_from: expect.stringMatching(/^s-/) } });
      expect(pidsWithMarker(m)).toEqual([]);
    } finally {
      expect(await d.stop()).toEqual({ code: 0, signal: null });
    }
  });
});
