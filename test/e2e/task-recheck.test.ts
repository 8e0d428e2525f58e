// A re-check of the task close (issue 19, docs/guide/tasks.md "Tasks: complete(task)") after its first
// round of fixes, on a real supervisor: a --timeout past 24.8 days is given (not an overflowed
// timer's 1 ms); a close of one task never waits for another task's session a restart left to
// reconciliation; a session retention retires while the close takes its checkpoint is not
// claimed; a task whose seal cannot be read, or was written at a generation above this run's
// (supervisor.json lost), converges, and gc keeps its complete receipt's checkpoints; sbx verify
// compares started_at and each listed session's task, and names a receipt re-signed with
// another key; a task dir that is a symlink is never followed; a watched workspace configured
// through a symlink; a session of no known task an operator resolved stays ended across a
// restart and is never retired whole (it is every task's); two crashes in a row at different
// points of one close attempt (the second in the resumed attempt) end as an uninterrupted
// close does.
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import type { SessionSummary, TaskReceipt } from '../../ipc/protocol.js';
import { ReceiptSigner } from '../../supervisor/signing.js';
import { pidsWithMarker, type SbxResult, until } from '../helpers/daemon.js';
import { cancelledOnStderr, closeWithIdentityTorn, taskDir, tearSession, twoSessionTask, verifyTask, withWorkspace } from '../helpers/tasks.js';
import { json, WorkspaceRig } from '../helpers/workspace.js';
import { storedManifest } from '../helpers/manifest.js';

const rig = new WorkspaceRig();
afterEach(() => rig.cleanup());

const marker = () => `task-recheck-${process.pid}-${Math.random().toString(36).slice(2)}`;

/** The result of a pending sbx call once it answers (until() polls it). */
function settleLater(p: Promise<SbxResult>): () => SbxResult | null {
  let done: SbxResult | null = null;
  void p.then((r) => (done = r));
  return () => done;
}

describe('task close: re-check', () => {
  it("a close of one task does not wait for another task's session that reconciliation is ending (its grace running)", { timeout: 120_000 }, async () => {
    const { d, ws } = await withWorkspace(rig);
    const m = marker();
    const c = await d.client();
    // B's command ignores TERM and has a grace of 10 minutes.
    const b = await c.launch({
      argv: ['sh', '-c', `trap '' TERM; while :; do sleep 0.05; done; : ${m}`],
      cwd: '/',
      task: 'B',
      invocation_key: 'b',
      grace_ms: 600_000,
    });
    expect((await d.sbx(['run', '--task', 'A', '--key', 'a', '--', 'sh', '-c', `echo a > ${ws}/a`])).status).toBe(0);
    await until(() => pidsWithMarker(m).length === 1, "B's command to run");
    await d.kill9();
    await d.start();
    // Reconciliation TERMs B's leaf, then waits its grace.
    await until(
      async () =>
        json<SessionSummary[]>(await d.sbx(['ps', '--json']))
          .find((s) => s.session_id === b.session_id)
          ?.reason?.includes('being ended'),
      'reconciliation to be ending B',
    );
    const answered = settleLater(d.sbx(['close', '--task', 'A', '--workspace', ws, '--timeout', '300ms']));
    // A has nothing left to wait for: it answers while B's grace runs (10 minutes).
    const r = await until(answered, "A's close to answer while B is still being ended", 60_000);
    expect(r.stderr.toString()).toBe('');
    expect(r.status).toBe(0);
    const receipt = json<TaskReceipt>(r);
    expect(receipt).toMatchObject({ task: 'A', complete: true, obligations: [] });
    expect(receipt.sessions.map((s) => s.invocation_key)).toEqual(['a']);
    // B still in its grace: its shell runs (with, now and then, a child forked to exec sleep,
    // which carries the same command line until its exec: seen twice under load).
    expect(pidsWithMarker(m).length).toBeGreaterThanOrEqual(1);
    // B's close waits for B's reconciliation: cut short here (sbx cancel), it is complete.
    const closingB = settleLater(d.sbx(['close', '--task', 'B', '--workspace', ws]));
    expect((await d.sbx(['cancel', b.session_id])).status).toBe(0);
    const rb = await until(closingB, "B's close", 60_000);
    expect(rb.status).toBe(0);
    expect(json<TaskReceipt>(rb).sessions).toEqual([
      expect.objectContaining({ session_id: b.session_id, outcome: 'owner_lost', death: expect.objectContaining({ evidence: 'cgroup_empty' }) }),
    ]);
    expect(pidsWithMarker(m)).toEqual([]);
  });

  it(
    "a task close ends its own session reconciliation is ending at the close's --timeout (KILL; its TERM went out when reconciliation began), not after the session's 10-minute grace",
    { timeout: 120_000 },
    async () => {
      const { d, ws } = await withWorkspace(rig);
      const m = marker();
      const c = await d.client();
      const b = await c.launch({
        argv: ['sh', '-c', `trap '' TERM; while :; do sleep 0.05; done; : ${m}`],
        cwd: '/',
        task: 'B',
        invocation_key: 'b',
        grace_ms: 600_000,
      });
      await until(() => pidsWithMarker(m).length === 1, "B's command to run");
      await d.kill9();
      await d.start();
      await until(
        async () =>
          json<SessionSummary[]>(await d.sbx(['ps', '--json']))
            .find((s) => s.session_id === b.session_id)
            ?.reason?.includes('being ended'),
        'reconciliation to be ending B',
      );
      const started = Date.now();
      const r = await d.sbx(['close', '--task', 'B', '--workspace', ws, '--timeout', '2s']);
      expect(Date.now() - started).toBeGreaterThanOrEqual(2000);
      expect(r.status).toBe(0);
      const receipt = json<TaskReceipt>(r);
      expect(receipt).toMatchObject({ complete: true, settle: { timeout_ms: 2000, terminated: 1, terminated_ids: [b.session_id] } });
      expect(cancelledOnStderr(r.stderr)).toEqual([b.session_id]);
      expect(receipt.sessions).toEqual([
        expect.objectContaining({ session_id: b.session_id, outcome: 'owner_lost', death: expect.objectContaining({ evidence: 'cgroup_empty' }) }),
      ]);
      expect(pidsWithMarker(m)).toEqual([]);
    },
  );

  it('--timeout past 24.8 days (2^31-1 ms; 30 days are allowed): the sessions are given it, not ended at once', async () => {
    const { d, ws } = await withWorkspace(rig);
    const go = join(d.dir, 'go');
    const c = await d.client();
    const s = await c.launch({ argv: ['sh', '-c', `echo x > ${ws}/x; while [ ! -e ${go} ]; do sleep 0.05; done`], cwd: '/', task: 'T' });
    await until(() => existsSync(join(ws, 'x')), 'the write');
    const closing = settleLater(d.sbx(['close', '--task', 'T', '--workspace', ws, '--timeout', '25d']));
    await until(() => existsSync(join(taskDir(d, 'T'), 'seal.json')), 'the close to be settling');
    // It ends by itself once told to (an overflowing timer would have ended it at once).
    writeFileSync(go, '');
    const r = await until(closing, 'the close', 60_000);
    expect(r.status).toBe(0);
    const receipt = json<TaskReceipt>(r);
    expect(receipt.settle).toEqual({ timeout_ms: 25 * 86_400_000, terminated: 0, terminated_ids: [] });
    expect(receipt.sessions).toEqual([expect.objectContaining({ session_id: s.session_id, outcome: 'exited', exit: { code: 0, signal: null } })]);
  });

  it('a session retired by retention while the close takes its checkpoint is not claimed: complete false, listed retired, never a receipt naming a session receipt that is gone', async () => {
    const pause = rig.removeLater(join('/tmp', `sbx-test-task-recheck-pause-${process.pid}-${Date.now()}`));
    const { d, ws } = await withWorkspace(rig, { env: { SBX_TEST_WATCH_PAUSE_FILE: pause }, config: { barrierTimeoutMs: 120_000 } });
    expect((await d.sbx(['run', '--task', 'T', '--key', 'old', '--', 'sh', '-c', `echo old > ${ws}/old`])).status).toBe(0);
    const [old] = json<SessionSummary[]>(await d.sbx(['ps', '--all', '--json']));
    await d.terminate();
    await d.withConfig({ retention: { receiptMaxAgeMs: 1, intervalMs: 0 } }).start();
    // The reader held: the close's checkpoint waits at its boundary (the barrier round).
    writeFileSync(pause, '');
    const closing = settleLater(d.sbx(['close', '--task', 'T', '--workspace', ws]));
    await until(
      () =>
        existsSync(join(taskDir(d, 'T'), 'attempt.json')) &&
        (JSON.parse(readFileSync(join(taskDir(d, 'T'), 'attempt.json'), 'utf8')) as { settle: unknown }).settle !== null,
      'the settle to be recorded',
    );
    // Meanwhile sbx gc retires the session whole (its checkpoint part waits behind the close's checkpoint).
    const gc = settleLater(d.sbx(['gc', '--json']));
    // Retired whole: its tombstone written, then its dir removed (retention.ts, in that order: poll for both).
    await until(
      () => existsSync(join(d.stateDir, 'retired', `${old.session_id}.json`)) && !existsSync(join(d.stateDir, 'sessions', old.session_id)),
      'the session to be retired',
    );
    rmSync(pause);
    const r = await until(closing, 'the close', 60_000);
    expect((await until(gc, 'gc', 60_000)).status).toBe(0);
    expect(r.status).toBe(1);
    const receipt = json<TaskReceipt>(r);
    expect(receipt.complete).toBe(false);
    expect(receipt.sessions).toEqual([expect.objectContaining({ session_id: old.session_id, state: 'retired', death: null })]);
    expect(receipt.obligations).toEqual([
      {
        authority: 'operator',
        condition: 'sessions_settled',
        session_id: old.session_id,
        what: expect.stringContaining('was removed whole by the retention policy before the task closed'),
      },
    ]);
    expect((await verifyTask(d, r.stdout)).out).toContain('OK: task receipt of "T" (complete: false)');
  });

  it("a task whose seal cannot be read (sealed at this run's generation): an earlier attempt's checkpoint from before it is not reused, so closing again converges", async () => {
    const { d, ws } = await withWorkspace(rig);
    expect((await d.sbx(['run', '--task', 'T', '--', 'sh', '-c', `echo t > ${ws}/t`])).status).toBe(0);
    // Attempt 1: its checkpoint is fine (consistent, covering, this instance's); supervisor.json could not be read.
    const first = await closeWithIdentityTorn(d, ['T', '--workspace', ws]);
    expect(first.status).toBe(1);
    const p1 = json<TaskReceipt>(first).checkpoints[0];
    expect(p1).toMatchObject({ consistent: true, close_attempt: 1 });
    await d.terminate();
    writeFileSync(join(taskDir(d, 'T'), 'seal.json'), '{ torn');
    await d.start();
    const again = await d.sbx(['close', '--task', 'T', '--workspace', ws]);
    const second = json<TaskReceipt>(again);
    expect(second.obligations).toEqual([]);
    expect(again.status).toBe(0);
    expect(second).toMatchObject({ attempt: 2, complete: true, sealed: { generation: null, sealed_at: null } });
    expect(second.checkpoints[0].checkpoint_id).not.toBe(p1.checkpoint_id);
    expect(second.checkpoints[0].fence!.generation).toBe(second.supervisor.generation);
    expect((await verifyTask(d, again.stdout)).status).toBe(0);
  });

  it("a task sealed at a generation above this run's (supervisor.json torn: a new instance, its generation recovered from admission records only): closing again is complete", async () => {
    const { d, ws } = await withWorkspace(rig);
    expect((await d.sbx(['run', '--task', 'T', '--', 'sh', '-c', `echo t > ${ws}/t`])).status).toBe(0); // admitted at generation 1
    for (let i = 0; i < 2; i++) {
      await d.terminate();
      await d.start(); // generations 2, 3
    }
    const identity = join(d.stateDir, 'supervisor.json');
    writeFileSync(identity, '{ torn');
    const first = await d.sbx(['close', '--task', 'T', '--workspace', ws]);
    expect(first.status).toBe(1); // supervisor.json cannot be read
    expect(json<TaskReceipt>(first).sealed!.generation).toBe(3);
    await d.kill9();
    await d.start(); // a new instance at generation 2 (the highest admission record's, plus one)
    const again = await d.sbx(['close', '--task', 'T', '--workspace', ws]);
    const second = json<TaskReceipt>(again);
    expect(second.supervisor.generation).toBe(2);
    expect(second.obligations).toEqual([]);
    expect(again.status).toBe(0);
    expect(second).toMatchObject({ attempt: 2, complete: true, sealed: { generation: 3 } });
    expect((await verifyTask(d, again.stdout)).status).toBe(0);
  });

  it('sbx gc keeps the checkpoints of a complete task receipt whose seal cannot be read', async () => {
    const { d, ws } = await withWorkspace(rig);
    expect((await d.sbx(['run', '--task', 'T', '--', 'sh', '-c', `echo kept > ${ws}/kept`])).status).toBe(0);
    const closed = await d.sbx(['close', '--task', 'T', '--workspace', ws]);
    expect(closed.status).toBe(0);
    const id = json<TaskReceipt>(closed).checkpoints[0].checkpoint_id!;
    await d.terminate();
    writeFileSync(join(taskDir(d, 'T'), 'seal.json'), '{ torn');
    await d.withConfig({ checkpoint: { maxAgeMs: 1 } }).start();
    const gc = json<{ checkpoints: { removed_manifests: string[] } }>(await d.sbx(['gc', '--json']));
    expect(gc.checkpoints.removed_manifests).toEqual([]);
    expect(existsSync(join(d.stateDir, 'checkpoints', 'manifests', `${id}.json`))).toBe(true);
    expect((await verifyTask(d, closed.stdout)).status).toBe(0);
    expect((await d.sbx(['close', '--task', 'T', '--workspace', ws])).stdout.equals(closed.stdout)).toBe(true);
  });

  it("sbx verify names a session of another task listed in a task receipt (signed with the state dir's own key)", async () => {
    const { d, ws } = await withWorkspace(rig);
    expect((await d.sbx(['run', '--task', 'A', '--', 'sh', '-c', `echo a > ${ws}/a`])).status).toBe(0);
    expect((await d.sbx(['run', '--task', 'B', '--', 'sh', '-c', `echo b > ${ws}/b`])).status).toBe(0);
    const b = json<TaskReceipt>(await d.sbx(['close', '--task', 'B', '--workspace', ws]));
    const closed = await d.sbx(['close', '--task', 'A', '--workspace', ws]);
    expect(closed.status).toBe(0);
    const a = json<TaskReceipt>(closed);
    // B's session moved into A's receipt: every other fact of it holds (its receipt, A's checkpoint after it).
    const moved = {
      ...b.sessions[0],
      task: 'A',
      workspace: a.sessions[0].workspace.map((w, i) => ({ ...w, ...b.sessions[0].workspace[i], path: w.path, root: w.root })),
    };
    const edited = ReceiptSigner.loadOrCreate(d.stateDir).sign({
      ...a,
      sessions: [...a.sessions, moved].sort((x, y) => (x.session_id < y.session_id ? -1 : 1)),
    });
    const v = await verifyTask(d, JSON.stringify(edited));
    expect(v.out).toContain(`MISMATCH: ${b.sessions[0].session_id}: its receipt is of task "B", not "A"`);
    expect(v.status).toBe(1);
  });

  it("sbx verify compares a checkpoint's started_at (the join orders by it across gaps) with its manifest's", async () => {
    const { d, ws } = await withWorkspace(rig);
    expect((await d.sbx(['run', '--task', 'T', '--', 'sh', '-c', `echo t > ${ws}/t`])).status).toBe(0);
    const closed = await d.sbx(['close', '--task', 'T', '--workspace', ws]);
    expect(closed.status).toBe(0);
    const receipt = json<TaskReceipt>(closed);
    const later = new Date(Date.parse(receipt.checkpoints[0].started_at!) + 3_600_000).toISOString();
    // Signed with the state dir's own key: only what it says differs from the manifest.
    const signer = ReceiptSigner.loadOrCreate(d.stateDir);
    const edited = signer.sign({ ...receipt, checkpoints: [{ ...receipt.checkpoints[0], started_at: later }] });
    const v = await verifyTask(d, JSON.stringify(edited));
    expect(v.out).toContain(
      `MISMATCH: checkpoint ${receipt.checkpoints[0].checkpoint_id}: the manifest's started_at is "${receipt.checkpoints[0].started_at}", the task receipt says "${later}"`,
    );
    expect(v.status).toBe(1);
  });
});

describe('sbx verify of a task receipt re-signed with another key', () => {
  it("its fence and boundary edited and the receipt signed again with a key of its own: MISMATCH with the state dir's key, and with that key given (--key) every session receipt and manifest says so", async () => {
    const { d, ws } = await withWorkspace(rig);
    expect((await d.sbx(['run', '--task', 'T', '--', 'sh', '-c', `echo t > ${ws}/t`])).status).toBe(0);
    const closed = await d.sbx(['close', '--task', 'T', '--workspace', ws]);
    expect(closed.status).toBe(0);
    const receipt = json<TaskReceipt>(closed);
    const cp = receipt.checkpoints[0];
    const other = join(d.dir, 'other-key');
    mkdirSync(other);
    const signer = ReceiptSigner.loadOrCreate(other);
    const edited = signer.sign({
      ...receipt,
      checkpoints: [{ ...cp, fence: { ...cp.fence!, generation: cp.fence!.generation + 1 }, boundary: { ...cp.boundary!, seq: cp.boundary!.seq! + 100 } }],
    });
    const own = await verifyTask(d, JSON.stringify(edited));
    expect(own.status).toBe(1);
    expect(own.out).toContain('MISMATCH: task receipt: signed by key');
    const file = join(d.dir, 'edited.json');
    writeFileSync(file, JSON.stringify(edited));
    const theirs = await d.sbx(['verify', file, '--state-dir', d.stateDir, '--public-key', join(other, 'receipt-key.pub')]);
    expect(theirs.status).toBe(1);
    const out = theirs.stdout.toString();
    expect(out).toContain(`MISMATCH: ${receipt.sessions[0].session_id}: signed by key`);
    expect(out).toContain(`MISMATCH: checkpoint ${cp.checkpoint_id} (${ws}): `);
    expect(out).toContain(`MISMATCH: checkpoint ${cp.checkpoint_id}: the manifest's boundary is`);
    expect(out).toContain(`MISMATCH: checkpoint ${cp.checkpoint_id}: the manifest's fence is`);
  });
});

describe('task close: a task dir that is a symlink', () => {
  it('a close of that task is refused naming it, and writes nothing where the link points; other tasks close', async () => {
    const { d, ws } = await withWorkspace(rig);
    await d.terminate();
    const elsewhere = join(d.dir, 'elsewhere');
    mkdirSync(elsewhere);
    mkdirSync(join(d.stateDir, 'tasks'), { recursive: true });
    symlinkSync(elsewhere, taskDir(d, 'Y'));
    await d.start();
    const r = await d.sbx(['close', '--task', 'Y', '--workspace', ws]);
    expect(r.stderr.toString()).toContain(`${taskDir(d, 'Y')} is not a directory`);
    expect(r.status).toBe(125);
    expect(readdirSync(elsewhere)).toEqual([]);
    expect((await d.sbx(['close', '--task', 'Z', '--workspace', ws])).status).toBe(0);
  });
});

describe('task close: workspaces named another way', () => {
  it('a watched workspace configured through a symlink, closed by the link with a trailing slash: the receipts name its real path, the join matches it, complete', async () => {
    const { d, paths } = await rig.daemon((dir) => {
      mkdirSync(join(dir, 'real-ws'));
      symlinkSync(join(dir, 'real-ws'), join(dir, 'ws-link'));
      return [join(dir, 'ws-link')];
    });
    const real = join(d.dir, 'real-ws');
    expect((await d.sbx(['run', '--task', 'T', '--', 'sh', '-c', `echo t > ${paths[0]}/t`])).status).toBe(0);
    const closed = await d.sbx(['close', '--task', 'T', '--workspace', `${paths[0]}/`]);
    expect(closed.stderr.toString()).toBe('');
    expect(closed.status).toBe(0);
    const r = json<TaskReceipt>(closed);
    expect(r.workspaces).toEqual([paths[0]]);
    expect(r.sessions[0].workspace).toEqual([expect.objectContaining({ path: paths[0], root: real, terminal_mutation: expect.any(Number) })]);
    expect((await d.sbx(['close', '--task', 'T', '--workspace', paths[0]])).stdout.equals(closed.stdout)).toBe(true);
  });
});

describe('task close: a session of no known task', () => {
  it("one an operator resolved stays ended across a restart (its signed receipt is read back), and retention does not retire it whole (it is every task's): later tasks can be complete", async () => {
    const { d, ws } = await withWorkspace(rig);
    const c = await d.client();
    const lost = await c.launch({ argv: ['sh', '-c', `echo lost > ${ws}/lost`], cwd: '/', task: 'T', invocation_key: 'torn' });
    await c.wait({ session_id: lost.session_id });
    await d.kill9();
    // Its records torn: its task is unknown (listed in every task's join) until an operator resolves it.
    tearSession(d, lost.session_id);
    await d.start();
    const resolved = await d.sbx(['resolve', lost.session_id, '--as-operator', '--json', '--reason', 'checked: it exited']);
    expect(resolved.status).toBe(0);
    await d.terminate();
    await d.withConfig({ retention: { receiptMaxAgeMs: 1, intervalMs: 0 } }).start();
    // The operator's word holds: ended, its receipt the one written then (not unknown again, to be resolved again).
    expect(json<SessionSummary[]>(await d.sbx(['ps', '--all', '--json'])).find((s) => s.session_id === lost.session_id)).toMatchObject({
      state: 'ended',
      task: null,
    });
    expect(readFileSync(join(d.stateDir, 'sessions', lost.session_id, 'receipt.json'), 'utf8')).toBe(`${JSON.stringify(json(resolved))}\n`);
    const gc = json<{ retired: string[] }>(await d.sbx(['gc', '--json']));
    expect(gc.retired).toEqual([]);
    expect(existsSync(join(d.stateDir, 'retired', `${lost.session_id}.json`))).toBe(false);
    // A task run afterwards: the resolved session is in its join with its receipt, and it can be complete.
    expect((await d.sbx(['run', '--task', 'U', '--', 'sh', '-c', `echo u > ${ws}/u`])).status).toBe(0);
    const closed = await d.sbx(['close', '--task', 'U', '--workspace', ws]);
    const receipt = json<TaskReceipt>(closed);
    expect(receipt.obligations).toEqual([]);
    expect(closed.status).toBe(0);
    expect(receipt.sessions.find((s) => s.session_id === lost.session_id)).toMatchObject({
      task: null,
      state: 'ended',
      death: { evidence: 'operator_attested' },
    });
  });
});

describe('task close: two crashes in a row, then close again', () => {
  const TASK = 'twice';
  // [the first crash, the second (in the resumed attempt)]
  const sequences: [string, string][] = [
    ['task-close:after-attempt', 'task-close:after-seal'], // the attempt recorded, not sealed yet; then sealed
    ['task-close:settling', 'checkpoint:after-read-back'], // sessions left running; the resumed attempt's checkpoint cut short
    ['checkpoint:after-manifest', 'task-close:after-checkpoint'], // a manifest never published; then one published, not recorded
    ['task-close:after-checkpoint', 'task-close:after-receipt-temp'], // published, not recorded; found, recorded, the receipt cut short
  ];
  for (const [first, second] of sequences) {
    it(`killed at ${first}, then at ${second}`, async () => {
      const { d, ws } = await withWorkspace(rig, { env: { SBX_FAULT_POINT: first } });
      const { runs, ids } = await twoSessionTask(d, ws, TASK);
      const close = () => d.sbx(['close', '--task', TASK, '--workspace', ws, '--timeout', '300ms']);
      for (const env of [{ SBX_FAULT_POINT: second }, undefined]) {
        expect((await close()).status).toBe(125);
        expect(await d.exitedNow()).toEqual({ code: null, signal: 'SIGKILL' });
        expect(existsSync(join(taskDir(d, TASK), 'receipt.json'))).toBe(false);
        await d.withEnv(env).start();
      }
      const r = await close();
      expect(r.status).toBe(0);
      const receipt = json<TaskReceipt>(r);
      expect(receipt).toMatchObject({ task: TASK, attempt: 1, complete: true, obligations: [] });
      expect(cancelledOnStderr(r.stderr)).toEqual(receipt.settle.terminated_ids);
      expect(receipt.sessions.map((s) => s.session_id)).toEqual(ids);
      expect(readFileSync(runs, 'utf8')).toBe('s1\ns2\n'); // each command ran once
      // One manifest in the store, published for this attempt: the receipt's.
      const store = join(d.stateDir, 'checkpoints');
      const names = (sub: string) =>
        readdirSync(join(store, sub))
          .filter((n) => /^[0-9a-f]{64}\.json$/.test(n))
          .map((n) => n.slice(0, 64));
      const id = receipt.checkpoints[0].checkpoint_id!;
      expect(names('manifests')).toEqual([id]);
      expect(names('published')).toEqual([id]);
      expect(receipt.checkpoints[0].close_attempt).toBe(1);
      const manifest = storedManifest(store, id);
      expect(manifest.entries.map((e) => e.path)).toEqual(['f1', 'f2']);
      expect((await verifyTask(d, r.stdout)).status).toBe(0);
      expect((await close()).stdout.equals(r.stdout)).toBe(true);
    });
  }
});
