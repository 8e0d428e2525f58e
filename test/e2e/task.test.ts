// Tasks and complete(task) on a real supervisor (docs/guide/tasks.md "Tasks: complete(task)"): two tasks
// in one supervisor closed one at a time; the task receipt of a normal run complete; and
// complete: false with the right obligation for each missing fact: a session stuck unknown
// (then resolved by an operator: complete, evidence operator_attested), a workspace whose
// watcher had a gap and whose scan failed, an object flipped between its write and its
// read-back, a checkpoint older than a session's terminal_mutation, a workspace not watched.
// sbx verify checks a task receipt end to end and names what was tampered with.
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import type { CloseReceipt, Receipt, SessionSummary, TaskReceipt } from '../../ipc/protocol.js';
import { pidsWithMarker, type TestDaemon, until } from '../helpers/daemon.js';
import { taskDir, tearSession, verifyTask, withWorkspace } from '../helpers/tasks.js';
import { json, WorkspaceRig } from '../helpers/workspace.js';
import { storedManifest } from '../helpers/manifest.js';

const rig = new WorkspaceRig();
afterEach(() => rig.cleanup());

const ALL_TRUE = { sealed: true, sessions_settled: true, terminal_mutations_known: true, checkpoint_covers: true, read_back_exact: true, fenced: true };
const marker = () => `task-test-${process.pid}-${Math.random().toString(36).slice(2)}`;

async function closeTask(d: TestDaemon, task: string, args: string[] = []) {
  const r = await d.sbx(['close', '--task', task, ...args]);
  return { status: r.status, stderr: r.stderr.toString(), stdout: r.stdout, receipt: r.status === 0 || r.status === 1 ? json<TaskReceipt>(r) : null };
}

describe('tasks', () => {
  it('two tasks in one supervisor: closing A leaves B admitting and running; each task receipt lists only its sessions; a sealed task stays sealed across a restart', async () => {
    const { d, ws } = await withWorkspace(rig);
    const m = marker();
    const a1 = await d.sbx(['run', '--task', 'A', '--key', 'a1', '--', 'sh', '-c', `echo a1 > ${ws}/a1`]);
    expect(a1.status).toBe(0);
    const c = await d.client();
    await c.launch({ argv: ['sh', '-c', `echo b1 > ${ws}/b1; sleep 600; : ${m}`], cwd: '/', invocation_key: 'b1', task: 'B' });
    const dflt = await d.sbx(['run', '--key', 'd1', '--', 'true']); // no --task: the task "default"
    expect(dflt.status).toBe(0);
    await until(() => pidsWithMarker(m).length === 1, "B's command to run");

    const A = await closeTask(d, 'A', ['--workspace', ws]);
    expect(A.stderr).toBe('');
    expect(A.status).toBe(0);
    expect(A.receipt).toMatchObject({ kind: 'task', task: 'A', attempt: 1, complete: true, obligations: [], workspaces: [ws], settle: { terminated: 0 } });
    expect(A.receipt!.conditions).toEqual(ALL_TRUE);
    expect(A.receipt!.sessions.map((s) => [s.invocation_key, s.task, s.outcome])).toEqual([['a1', 'A', 'exited']]);
    const [cp] = A.receipt!.checkpoints;
    expect(cp).toMatchObject({ workspace: ws, consistent: true, close_attempt: 1, error: null, read_back: { exact: true } });
    // The checkpoint covers A's terminal_mutation in the same epoch.
    const tm = A.receipt!.sessions[0].workspace[0];
    expect(tm.root).toBe(ws);
    expect(cp.boundary!.epoch).toBe(tm.epoch);
    expect(cp.boundary!.seq).toBeGreaterThanOrEqual(tm.terminal_mutation!);

    // B goes on: its command still runs, and it admits new keys; A refuses new keys, answers retries.
    expect(pidsWithMarker(m)).toHaveLength(1);
    expect((await d.sbx(['run', '--task', 'B', '--', 'echo', 'b2'])).stdout.toString()).toBe('b2\n');
    const refused = await d.sbx(['run', '--task', 'A', '--', 'true']);
    expect(refused.status).toBe(125);
    expect(refused.stderr.toString()).toContain('ADMISSION_SEALED: task "A" was sealed at generation');
    const retry = await d.sbx(['run', '--task', 'A', '--key', 'a1', '--detach', '--json', '--', 'sh', '-c', `echo a1 > ${ws}/a1`]);
    expect(json<{ existing: boolean }>(retry).existing).toBe(true);
    const otherTask = await d.sbx(['run', '--task', 'B', '--key', 'a1', '--', 'sh', '-c', `echo a1 > ${ws}/a1`]);
    expect(otherTask.status).toBe(125);
    expect(otherTask.stderr.toString()).toContain('KEY_CONFLICT: invocation key "a1" was used in task "A", not "B"');

    // Unchanged on a later call; another set of workspaces is refused.
    const again = await d.sbx(['close', '--task', 'A', '--workspace', ws]);
    expect(again.stdout.equals(A.stdout)).toBe(true);
    const conflict = await d.sbx(['close', '--task', 'A', '--workspace', d.dir]);
    expect(conflict.status).toBe(125);
    expect(conflict.stderr.toString()).toContain(`TASK_CONFLICT: task "A" is closed (or closing) with workspaces ["${ws}"]`);
    expect(conflict.stdout.toString()).toBe(''); // without --json, nothing on stdout
    const conflictJson = await d.sbx(['close', '--task', 'A', '--json', '--workspace', d.dir]);
    expect(conflictJson.status).toBe(125);
    expect(JSON.parse(conflictJson.stdout.toString())).toMatchObject({
      error: { code: 'TASK_CONFLICT', retryable: false, details: { task: 'A', workspaces: [ws] } },
    });
    expect((await verifyTask(d, A.stdout)).out).toContain('OK: task receipt of "A" (complete: true)');

    // Across a restart: A stays sealed and its receipt unchanged; B's session, owner lost, is reconciled.
    await d.kill9();
    await d.start();
    expect((await d.sbx(['run', '--task', 'A', '--', 'true'])).stderr.toString()).toContain('ADMISSION_SEALED: task "A"');
    expect((await d.sbx(['close', '--task', 'A', '--workspace', ws])).stdout.equals(A.stdout)).toBe(true);
    const B = await closeTask(d, 'B', ['--workspace', ws, '--timeout', '200ms']);
    expect(B.status).toBe(0);
    expect(B.receipt!.complete).toBe(true);
    expect(B.receipt!.sessions.map((s) => [s.invocation_key, s.task]).sort()).toEqual(
      [
        ['b1', 'B'],
        [expect.stringMatching(/^auto-/), 'B'],
      ].sort(),
    );
    expect(B.receipt!.sessions.find((s) => s.invocation_key === 'b1')!.outcome).toBe('owner_lost');
    expect(pidsWithMarker(m)).toEqual([]);
    // The default task is untouched by both, and the status shows the ps row's task.
    const ps = json<SessionSummary[]>(await d.sbx(['ps', '--all', '--json']));
    expect(ps.find((s) => s.invocation_key === 'd1')!.task).toBe('default');
    expect((await d.sbx(['run', '--', 'echo', 'still open'])).stdout.toString()).toBe('still open\n');
    expect(json<Receipt>(await d.sbx(['receipt', '--key', 'b1'])).task).toBe('B');
  });

  it('the client library: launch in a task, sealTask, closeTask (default workspaces: every watched one)', async () => {
    const { d, ws } = await withWorkspace(rig);
    const c = await d.client();
    const s = await c.launch({ argv: ['sh', '-c', `printf x > ${ws}/x`], cwd: '/', task: 'lib' });
    await c.wait({ session_id: s.session_id });
    expect(await c.sealTask('lib')).toMatchObject({ task: 'lib', already_sealed: false });
    expect(await c.sealTask('lib')).toMatchObject({ task: 'lib', already_sealed: true });
    await expect(c.launch({ argv: ['true'], cwd: '/', task: 'lib' })).rejects.toMatchObject({ code: 'ADMISSION_SEALED', details: { task: 'lib' } });
    const receipt = await c.closeTask({ task: 'lib' });
    expect(receipt).toMatchObject({ complete: true, workspaces: [ws], obligations: [] });
    expect(receipt.sessions.map((x) => x.session_id)).toEqual([s.session_id]);
    await expect(c.closeTask({ task: 'lib', workspaces: ['/'] })).rejects.toMatchObject({ code: 'TASK_CONFLICT', details: { task: 'lib', workspaces: [ws] } });
  });

  it("a close of a directory in the workspace: its own .sandbox-supervisor/ is the user's content, in the manifest with its exact sha256 and restored", async () => {
    const { d, ws } = await withWorkspace(rig);
    const proj = join(ws, 'proj');
    const main = 'int main(void) { return 0; }\n';
    const artifact = Buffer.from([0x7f, 0x45, 0x4c, 0x46, 0x02, 0x01, 0x01, 0x00, 0xff, 0x00]);
    const script = `mkdir -p ${proj}/.sandbox-supervisor && printf '%s\\n' '${main.trimEnd()}' > ${proj}/main.c && printf '\\177ELF\\002\\001\\001\\000\\377\\000' > ${proj}/.sandbox-supervisor/artifact.o`;
    const made = await d.sbx(['run', '--task', 'T', '--', 'sh', '-c', script]);
    expect(made.status).toBe(0);
    expect(readFileSync(join(proj, 'main.c'), 'utf8')).toBe(main);
    expect(readFileSync(join(proj, '.sandbox-supervisor', 'artifact.o'))).toEqual(artifact);
    const closed = await closeTask(d, 'T', ['--workspace', proj]);
    expect(closed.stderr).toBe('');
    expect(closed.status).toBe(0);
    expect(closed.receipt).toMatchObject({ complete: true, workspaces: [proj] });
    const id = closed.receipt!.checkpoints[0].checkpoint_id!;
    const manifest = storedManifest(join(d.stateDir, 'checkpoints'), id);
    const digest = (b: Buffer | string) => createHash('sha256').update(b).digest('hex');
    expect(manifest.entries.map((e) => [e.path, e.type, e.sha256 ?? null])).toEqual([
      ['.sandbox-supervisor', 'dir', null],
      ['.sandbox-supervisor/artifact.o', 'file', digest(artifact)],
      ['main.c', 'file', digest(main)],
    ]);
    const target = join(d.dir, 'restored');
    const r = await d.sbx(['restore', id, target, '--state-dir', d.stateDir, '--json']);
    expect(r.stderr.toString()).toBe('');
    expect(json<{ identical: boolean; entries: number }>(r)).toMatchObject({ identical: true, entries: 3 });
    expect(readFileSync(join(target, 'main.c'), 'utf8')).toBe(main);
    expect(readFileSync(join(target, '.sandbox-supervisor', 'artifact.o'))).toEqual(artifact);
  });
});

describe('complete: false names what is missing', () => {
  it('a session stuck unknown: an operator obligation, no checkpoint while it may write; after sbx resolve, close again: complete, evidence operator_attested', async () => {
    const { d, ws } = await withWorkspace(rig);
    const c = await d.client();
    const ok = await c.launch({ argv: ['sh', '-c', `echo ok > ${ws}/ok`], cwd: '/', task: 'T', invocation_key: 'fine' });
    await c.wait({ session_id: ok.session_id });
    const lost = await c.launch({ argv: ['sh', '-c', `echo lost > ${ws}/lost`], cwd: '/', task: 'T', invocation_key: 'torn' });
    await c.wait({ session_id: lost.session_id });
    await d.kill9();
    // Its records torn: no proof of its end, and its task unknown (it is listed in every task's join).
    tearSession(d, lost.session_id);
    await d.start();
    const first = await closeTask(d, 'T', ['--workspace', ws]);
    expect(first.status).toBe(1);
    expect(first.receipt).toMatchObject({ complete: false, attempt: 1 });
    expect(first.receipt!.conditions).toEqual({
      ...ALL_TRUE,
      sessions_settled: false,
      terminal_mutations_known: false,
      checkpoint_covers: false,
      read_back_exact: false,
      fenced: false,
    });
    expect(first.receipt!.obligations).toEqual([
      {
        authority: 'operator',
        condition: 'sessions_settled',
        session_id: lost.session_id,
        what: expect.stringContaining(`sbx resolve ${lost.session_id} --as-operator --reason TEXT`),
      },
    ]);
    expect(first.receipt!.sessions.find((s) => s.session_id === lost.session_id)).toMatchObject({ task: null, state: 'unknown', receipt_sha256: null });
    expect(first.receipt!.checkpoints).toEqual([expect.objectContaining({ workspace: ws, checkpoint_id: null, error: null })]);
    expect(first.stderr).toContain('incomplete: operator must settle sessions_settled');
    expect((await verifyTask(d, first.stdout)).out).toContain('OK: task receipt of "T" (complete: false)');

    const resolved = await d.sbx(['resolve', lost.session_id, '--as-operator', '--reason', 'checked: it exited']);
    expect(resolved.status).toBe(0);
    const second = await closeTask(d, 'T', ['--workspace', ws]);
    expect(second.stderr).toBe('');
    expect(second.status).toBe(0);
    expect(second.receipt).toMatchObject({ complete: true, attempt: 2, obligations: [] });
    expect(second.receipt!.sessions.find((s) => s.session_id === lost.session_id)).toMatchObject({
      death: { evidence: 'operator_attested' },
      outcome: 'owner_lost',
    });
    // Its end in the workspace is the scan at its resolution (a gap: another listener's events), which the checkpoint follows.
    expect(second.receipt!.sessions.find((s) => s.session_id === lost.session_id)!.workspace[0]).toMatchObject({
      gap: 'listener_restart',
      scan_digest: expect.stringMatching(/^sha256:/),
    });
    // Its receipt verifies, but its stored output cannot be re-read: its admission record (the chunk size) is torn. Said, not hidden.
    const v = await verifyTask(d, second.stdout);
    expect(v.status).toBe(1);
    expect(v.out.trim().split('\n')).toEqual([expect.stringMatching(new RegExp(`^MISMATCH: ${lost.session_id}: admission record unreadable: `))]);
  });

  it('a workspace whose watcher had a gap (no CAP_SYS_ADMIN: no fanotify) and whose scan failed (EACCES without CAP_DAC_OVERRIDE)', async () => {
    const caps = '-sys_admin,-dac_override,-dac_read_search';
    const { d, ws } = await withWorkspace(rig, { wrap: ['setpriv', `--inh-caps=${caps}`, `--bounding-set=${caps}`, '--'] });
    const r = await d.sbx(['run', '--task', 'T', '--', 'sh', '-c', `mkdir ${ws}/locked && echo secret > ${ws}/locked/f && chmod 000 ${ws}/locked`]);
    expect(r.status).toBe(0);
    const closed = await closeTask(d, 'T', ['--workspace', ws]);
    expect(closed.status).toBe(1);
    const { receipt } = closed;
    expect(receipt!.sessions[0].workspace[0]).toMatchObject({ gap: 'unsupported', terminal_mutation: null, scan_digest: null });
    expect(receipt!.conditions).toMatchObject({ sessions_settled: true, terminal_mutations_known: false, checkpoint_covers: false });
    expect(receipt!.obligations).toEqual([
      {
        authority: 'workspace',
        condition: 'terminal_mutations_known',
        session_id: receipt!.sessions[0].session_id,
        workspace: ws,
        what: `session ${receipt!.sessions[0].session_id}'s end in ${ws} is unknown: the watcher had a gap (unsupported) and the scan that stands in failed`,
      },
      {
        authority: 'workspace',
        condition: 'checkpoint_covers',
        workspace: ws,
        what: expect.stringMatching(/^the checkpoint of .* failed \(CHECKPOINT_FAILED, scan\): .*EACCES/),
      },
    ]);
    chmodSync(join(ws, 'locked'), 0o700); // so the rig can remove it
  });

  it('a workspace root a session mounted over (tmpfs on WS): the close does not capture the tmpfs as WS: CHECKPOINT_FAILED naming it, not complete; unmounted, close again: complete with what is on the watched file system', async () => {
    const { d, ws } = await withWorkspace(rig);
    let mounted = false;
    try {
      const r = await d.sbx([
        'run',
        '--task',
        'M1',
        '--',
        'sh',
        '-c',
        `echo real > ${ws}/real.txt && mount -t tmpfs sbx-test-over ${ws} && echo fake > ${ws}/fake.txt`,
      ]);
      mounted = readFileSync('/proc/self/mountinfo', 'utf8')
        .split('\n')
        .some((l) => l.split(' ')[4] === ws);
      expect(r.status, r.stderr.toString()).toBe(0);
      expect(mounted).toBe(true);
      const closed = await closeTask(d, 'M1', ['--workspace', ws]);
      expect(closed.status, closed.stderr).toBe(1);
      expect(closed.receipt).toMatchObject({ complete: false, conditions: { checkpoint_covers: false } });
      expect(closed.receipt!.checkpoints[0]).toMatchObject({ checkpoint_id: null });
      expect(closed.receipt!.obligations).toEqual([
        {
          authority: 'workspace',
          condition: 'checkpoint_covers',
          workspace: ws,
          what: expect.stringMatching(
            new RegExp(
              `^the checkpoint of .* failed \\(CHECKPOINT_FAILED, scan\\): .*fs_changed: the workspace ${ws} is now another file system: something is mounted over it`,
            ),
          ),
        },
      ]);
      // sbx checkpoint of it says the same, and publishes nothing.
      const ck = await d.sbx(['checkpoint', '--workspace', ws, '--json']);
      expect(ck.status).not.toBe(0);
      expect(ck.stderr.toString()).toContain(`fs_changed: the workspace ${ws} is now another file system: something is mounted over it`);
      expect(spawnSync('umount', [ws]).status).toBe(0);
      mounted = false;
      const again = await closeTask(d, 'M1', ['--workspace', ws]);
      expect(again.status, again.stderr).toBe(0);
      expect(again.receipt).toMatchObject({ complete: true, obligations: [] });
      const listing = await d.sbx(['restore', again.receipt!.checkpoints[0].checkpoint_id!, join(d.dir, 'back'), '--state-dir', d.stateDir]);
      expect(listing.status, listing.stderr.toString()).toBe(0);
      expect(readdirSync(join(d.dir, 'back')).filter((n) => !n.startsWith('.'))).toEqual(['real.txt']);
      expect(readFileSync(join(d.dir, 'back', 'real.txt'), 'utf8')).toBe('real\n');
    } finally {
      if (mounted) spawnSync('umount', [ws]);
    }
  });

  it('the same check by mount id and for a directory in a workspace: a bind mount of the same file system over WS (same st_dev), a tmpfs over WS/inner: CHECKPOINT_FAILED fs_changed; an unwatched directory is not checked', async () => {
    const { d, ws } = await withWorkspace(rig);
    mkdirSync(join(ws, 'sub'));
    writeFileSync(join(ws, 'sub', 'other'), 'other\n');
    mkdirSync(join(ws, 'inner'));
    rig.mount(['-t', 'tmpfs', 'sbx-test-inner'], join(ws, 'inner'));
    const inner = await d.sbx(['checkpoint', '--workspace', join(ws, 'inner')]);
    expect(inner.status).not.toBe(0);
    expect(inner.stderr.toString()).toContain(
      `CHECKPOINT_FAILED: checkpoint of ${ws}/inner failed (scan): fs_changed: ${ws}/inner (in workspace ${ws}) is now another file system: something is mounted over it`,
    );
    rig.mount(['--bind', join(ws, 'sub')], ws);
    const bound = await d.sbx(['checkpoint', '--workspace', ws]);
    expect(bound.status).not.toBe(0);
    expect(bound.stderr.toString()).toContain(`fs_changed: the workspace ${ws} is now another mount: something is mounted over it`);
    // A directory no workspace holds: not_watched, nothing to compare with.
    mkdirSync(join(d.dir, 'plain'));
    writeFileSync(join(d.dir, 'plain', 'f'), 'f');
    const plain = json<{ boundary: { gap: string }; consistent: boolean }>(await d.sbx(['checkpoint', '--workspace', join(d.dir, 'plain'), '--json']));
    expect(plain).toMatchObject({ boundary: { gap: 'not_watched' }, consistent: true });
  });

  it('an object flipped between its write and its read-back: read_back_exact false, the object set aside; close again: a new checkpoint, complete', async () => {
    const { d, ws } = await withWorkspace(rig, { env: { SBX_TEST_CHECKPOINT_FLIP: 'big' } });
    const r = await d.sbx(['run', '--task', 'T', '--', 'sh', '-c', `head -c 100000 /dev/zero | tr '\\0' 'z' > ${ws}/big; echo small > ${ws}/small`]);
    expect(r.status).toBe(0);
    const first = await closeTask(d, 'T', ['--workspace', ws]);
    expect(first.status).toBe(1);
    expect(first.receipt!.conditions).toEqual({ ...ALL_TRUE, checkpoint_covers: false, read_back_exact: false, fenced: false });
    const sha = createHash('sha256').update('z'.repeat(100000)).digest('hex');
    expect(first.receipt!.obligations).toEqual([
      { authority: 'workspace', condition: 'read_back_exact', workspace: ws, what: expect.stringContaining(`object ${sha}`) },
    ]);
    expect(first.receipt!.checkpoints[0]).toMatchObject({ checkpoint_id: null, error: { code: 'CHECKPOINT_FAILED', stage: 'read_back' } });
    expect(readdirSync(join(d.stateDir, 'checkpoints', 'quarantine')).some((n) => n.startsWith(sha))).toBe(true);
    // The hook flips once per run: the next attempt stores the object again and reads it back.
    const second = await closeTask(d, 'T', ['--workspace', ws]);
    expect(second.status).toBe(0);
    expect(second.receipt).toMatchObject({ complete: true, attempt: 2 });
    expect(readFileSync(join(d.stateDir, 'checkpoints', 'objects', sha.slice(0, 2), sha), 'utf8')).toBe('z'.repeat(100000));
    expect((await verifyTask(d, second.stdout)).status).toBe(0);
  });

  it("a checkpoint older than a session's terminal_mutation (test hook: taken before the settle): the obligation names both; close again: a new one after it", async () => {
    const { d, ws } = await withWorkspace(rig, { env: { SBX_TEST_TASK_EARLY_CHECKPOINT: '1' } });
    const c = await d.client();
    const go = join(d.dir, 'go');
    writeFileSync(go, '');
    // It writes after it is told to end: its last write is after any checkpoint taken before.
    const s = await c.launch({
      argv: ['sh', '-c', `trap 'echo late > ${ws}/late; exit 0' TERM; echo early > ${ws}/early; while :; do sleep 0.05; done`],
      cwd: '/',
      task: 'T',
    });
    await until(() => existsSync(join(ws, 'early')), 'the first write');
    const first = await closeTask(d, 'T', ['--workspace', ws, '--timeout', '100ms']);
    expect(first.status).toBe(1);
    const cp = first.receipt!.checkpoints[0];
    const e = first.receipt!.sessions[0].workspace[0];
    expect(e.epoch).toBe(cp.boundary!.epoch);
    expect(e.terminal_mutation!).toBeGreaterThan(cp.boundary!.seq!);
    expect(first.receipt!.conditions).toEqual({ ...ALL_TRUE, checkpoint_covers: false });
    expect(first.receipt!.obligations).toEqual([
      {
        authority: 'workspace',
        condition: 'checkpoint_covers',
        session_id: s.session_id,
        workspace: ws,
        what: `checkpoint ${cp.checkpoint_id} of ${ws} (boundary ${cp.boundary!.epoch} seq ${cp.boundary!.seq}) is older than session ${s.session_id}'s terminal_mutation (${e.epoch} seq ${e.terminal_mutation}); close again to take one after it`,
      },
    ]);
    expect((await verifyTask(d, first.stdout)).status).toBe(0); // an incomplete receipt verifies too: it says what it proves
    const second = await closeTask(d, 'T', ['--workspace', ws]);
    expect(second.status).toBe(0);
    expect(second.receipt!.checkpoints[0].boundary!.seq).toBeGreaterThanOrEqual(e.terminal_mutation!);
    const manifest = storedManifest(join(d.stateDir, 'checkpoints'), second.receipt!.checkpoints[0].checkpoint_id!);
    expect(manifest.entries.map((x) => x.path)).toEqual(['early', 'late']);
  });

  it('a first close naming a workspace not watched, missing, or a file: INVALID_ARGUMENT, nothing recorded or sealed; then a close without --workspace names the first set', async () => {
    const { d, ws } = await withWorkspace(rig);
    const other = join(d.dir, 'elsewhere');
    mkdirSync(other);
    writeFileSync(join(d.dir, 'a-file'), '');
    expect((await d.sbx(['run', '--task', 'T', '--', 'sh', '-c', `echo hi > ${ws}/f`])).status).toBe(0);
    for (const [path, says] of [
      [other, `close: ${other} is not in a watched workspace (${ws})`],
      [join(d.dir, 'missing'), `close: no checkpoint can be taken of ${join(d.dir, 'missing')}: does not exist. Nothing was recorded or sealed`],
      [
        join(d.dir, 'a-file'),
        `close: no checkpoint can be taken of ${join(d.dir, 'a-file')}: ${join(d.dir, 'a-file')} is not a directory. Nothing was recorded or sealed`,
      ],
      [
        '/tmp',
        `close: no checkpoint can be taken of /tmp: the directory /tmp holds the state dir ${d.stateDir}: a checkpoint would hold itself. Nothing was recorded or sealed`,
      ],
    ]) {
      const refused = await closeTask(d, 'T', ['--workspace', path]);
      expect(refused.status).toBe(125);
      expect(refused.stderr).toContain(`INVALID_ARGUMENT: ${says}`);
    }
    // --json: each refusal is {"error"} on stdout too, as is a close with neither --task nor --all.
    const asJson = await d.sbx(['close', '--json', '--task', 'T', '--workspace', '/tmp']);
    expect(JSON.parse(asJson.stdout.toString())).toMatchObject({ error: { code: 'INVALID_ARGUMENT', retryable: false } });
    for (const command of ['close', 'seal']) {
      const neither = await d.sbx([command, '--json']);
      expect(neither.status).toBe(125);
      expect(JSON.parse(neither.stdout.toString())).toEqual({
        error: {
          code: 'INVALID_ARGUMENT',
          message: `${command} needs --task T (that task only) or --all (every task, the whole sandbox, for good); nothing was sent`,
          retryable: false,
          details: { field: 'task' },
        },
      });
      expect(neither.stderr.toString()).toBe(
        `sbx: INVALID_ARGUMENT: ${command} needs --task T (that task only) or --all (every task, the whole sandbox, for good); nothing was sent\n`,
      );
    }
    expect(existsSync(join(d.stateDir, 'tasks'))).toBe(false);
    expect((await d.sbx(['run', '--task', 'T', '--', 'true'])).status).toBe(0); // not sealed
    // A directory in the watched workspace is fine; later closes without --workspace name it.
    mkdirSync(join(ws, 'sub'));
    const sub = await closeTask(d, 'T', ['--workspace', join(ws, 'sub')]);
    expect(sub.status).toBe(0);
    expect(sub.receipt!.sessions.map((s) => s.workspace[0].root)).toEqual([ws, ws]);
    expect(sub.receipt!.sessions.map((s) => s.exit)).toEqual([
      { code: 0, signal: null },
      { code: 0, signal: null },
    ]);
    expect((await d.sbx(['close', '--task', 'T'])).stdout.equals(sub.stdout)).toBe(true);
    const empty = await closeTask(d, 'nothing-ran-here', ['--workspace', ws]);
    expect(empty.status).toBe(0);
    expect(empty.receipt).toMatchObject({ complete: true, sessions: [] });
    expect(empty.stderr).toBe('sbx: note: task "nothing-ran-here" has no sessions (complete holds vacuously; is the task name right?)\n');
  });
});

describe("a workspace the task's receipts name", () => {
  it('no longer watched (restarted without --workspace): the close is not complete, it names the workspace and the session; watched but not named: the close adds it, records it, and checkpoints it', async () => {
    const { d, ws } = await withWorkspace(rig);
    const r2 = await d.sbx(['run', '--task', 'R2', '--key', 'r2', '--', 'sh', '-c', `echo out2 > ${ws}/out2.txt`]);
    expect(r2.status).toBe(0);
    const id = json<SessionSummary[]>(await d.sbx(['ps', '--all', '--json'])).find((s) => s.invocation_key === 'r2')!.session_id;
    const own = json<Receipt>(await d.sbx(['receipt', id]));
    expect(own.workspace).toEqual([expect.objectContaining({ path: ws, terminal_mutation: expect.any(Number), gap: null })]);
    // The same supervisor, restarted watching nothing.
    await d.terminate();
    d.withConfig({ workspace: { paths: [] } });
    await d.start();
    const closed = await closeTask(d, 'R2');
    expect(closed.status).toBe(1);
    expect(closed.receipt).toMatchObject({ complete: false, workspaces: [], checkpoints: [] });
    expect(closed.receipt!.conditions).toEqual({ ...ALL_TRUE, checkpoint_covers: false });
    const what = `workspace ${ws} is named by session ${id}'s receipt (it may have written there) but is not a workspace of this close, nor watched by this supervisor: no checkpoint orders those writes (watch it again, workspace.paths or serve --workspace, and close again)`;
    expect(closed.receipt!.obligations).toEqual([{ authority: 'workspace', condition: 'checkpoint_covers', session_id: id, workspace: ws, what }]);
    expect(closed.stderr).toBe(`sbx: task "R2" incomplete: workspace must settle checkpoint_covers: ${what}\n`);
    // The session's entry shows the receipt's facts for the workspace its obligation names (root null: not watched now).
    const own2 = own.workspace![0];
    expect(closed.receipt!.sessions.map((s) => s.workspace)).toEqual([
      [{ path: ws, root: null, epoch: own2.epoch, terminal_mutation: own2.terminal_mutation, gap: null, scan_digest: null }],
    ]);
    // sbx verify derives the same verdict from the facts.
    expect(await verifyTask(d, closed.stdout)).toMatchObject({ status: 0 });

    // Watched again, and another workspace too; the close names only the other: it adds ws.
    const other = join(d.dir, 'other');
    mkdirSync(other);
    await d.terminate();
    d.withConfig({ workspace: { paths: [ws, other] } });
    await d.start();
    expect((await d.sbx(['run', '--task', 'R3', '--key', 'r3', '--', 'sh', '-c', `echo out3 > ${ws}/out3.txt`])).status).toBe(0);
    const added = await closeTask(d, 'R3', ['--workspace', other]);
    expect(added.stderr).toBe('');
    expect(added.status).toBe(0);
    expect(added.receipt).toMatchObject({ complete: true, workspaces: [other, ws], obligations: [] });
    expect(added.receipt!.checkpoints.map((c) => [c.workspace, c.checkpoint_id !== null])).toEqual([
      [other, true],
      [ws, true],
    ]);
    const record = JSON.parse(readFileSync(join(d.stateDir, 'tasks', createHash('sha256').update('R3').digest('hex'), 'close.json'), 'utf8'));
    expect(record).toMatchObject({ task: 'R3', workspaces: [other], added_workspaces: [ws] });
    // A later close naming the first set answers with the same receipt.
    expect((await d.sbx(['close', '--task', 'R3', '--workspace', other])).stdout.equals(added.stdout)).toBe(true);
    expect(await verifyTask(d, added.stdout)).toMatchObject({ status: 0 });
    // R2 closed again with ws watched: complete now, ws added to its set.
    const again = await closeTask(d, 'R2');
    expect(again.status).toBe(0);
    expect(again.receipt).toMatchObject({ complete: true, workspaces: [ws] });
  });
});

describe('sbx close --all is the join over every task', () => {
  it(
    'a task incomplete (its receipt names a workspace no longer watched): exit 1, no close receipt written, the sandbox stays sealed; watched again, the next close --all completes and is final',
    { timeout: 60_000 },
    async () => {
      const { d, ws } = await withWorkspace(rig);
      expect((await d.sbx(['run', '--task', 'R', '--key', 'r', '--', 'sh', '-c', `echo out > ${ws}/out.txt`])).status).toBe(0);
      expect((await d.sbx(['run', '--task', 'Q', '--key', 'q', '--', 'true'])).status).toBe(0);
      await d.terminate();
      d.withConfig({ workspace: { paths: [] } });
      await d.start();
      const first = await d.sbx(['close', '--all', '--timeout', '1s']);
      expect(first.status).toBe(1);
      const close = JSON.parse(first.stdout.toString()) as CloseReceipt;
      expect(close).toMatchObject({ kind: 'close', complete: false });
      expect(close.tasks!.map((t) => [t.task, t.attempt, t.complete])).toEqual([
        ['Q', 1, true],
        ['R', 1, false],
      ]);
      expect(first.stderr.toString()).toContain(`sbx: task "R" incomplete: workspace must settle checkpoint_covers: workspace ${ws} is named by session`);
      expect(first.stderr.toString()).toContain(
        'sbx: the close is incomplete: nothing was written, the sandbox stays sealed; close --all again once the obligations above are settled\n',
      );
      expect(existsSync(join(d.stateDir, 'close-receipt.json'))).toBe(false);
      expect((await d.sbx(['run', '--task', 'fresh', '--', 'true'])).status).toBe(125); // sealed for good
      await d.terminate();
      d.withConfig({ workspace: { paths: [ws] } });
      await d.start();
      const second = await d.sbx(['close', '--all', '--timeout', '1s']);
      expect(second.stderr.toString()).toBe('');
      expect(second.status).toBe(0);
      const done = JSON.parse(second.stdout.toString()) as CloseReceipt;
      // Q's complete task receipt is final (attempt 1 again); R's second attempt checkpointed ws.
      expect(done.tasks!.map((t) => [t.task, t.attempt, t.complete])).toEqual([
        ['Q', 1, true],
        ['R', 2, true],
      ]);
      expect(done.complete).toBe(true);
      expect(readFileSync(join(d.stateDir, 'close-receipt.json'), 'utf8')).toBe(second.stdout.toString());
      const rReceipt = json<TaskReceipt>(await d.sbx(['close', '--task', 'R']));
      expect(rReceipt).toMatchObject({
        complete: true,
        workspaces: [ws],
        checkpoints: [expect.objectContaining({ workspace: ws, checkpoint_id: expect.any(String) })],
      });
      // The same receipt every time: the stored bytes, exactly.
      const third = await d.sbx(['close', '--all', '--timeout', '1s']);
      expect(third.status).toBe(0);
      expect(third.stdout.equals(second.stdout)).toBe(true);
      // The closed state dir is an archive: a task close writes nothing in it.
      const files = (): string[] => (readdirSync(d.stateDir, { recursive: true }) as string[]).filter((f) => !f.endsWith('.log')).sort();
      const before = files();
      const r = await d.sbx(['close', '--task', 'R']);
      expect(r.status).toBe(0);
      expect(r.stdout.toString()).toBe(readFileSync(join(taskDir(d, 'R'), 'receipt.json'), 'utf8'));
      const fresh = await d.sbx(['close', '--task', 'newtask']);
      expect(fresh.status).toBe(125);
      expect(fresh.stderr.toString()).toBe(
        'sbx: ADMISSION_SEALED: the sandbox is closed (its close receipt is final) and task "newtask" has no final task receipt in it: it had no sessions (is the task name right?). Nothing was recorded or sealed\n',
      );
      expect(files()).toEqual(before);
    },
  );
});

describe('a workspace added at a restart', () => {
  it(
    'a session that ended before it was watched (no receipt entry) is ordered by the checkpoint after its end: close --all completes; the task receipt says not_watched',
    { timeout: 60_000 },
    async () => {
      const { d, ws } = await withWorkspace(rig);
      expect((await d.sbx(['run', '--task', 't9', '--key', 't9', '--', 'sh', '-c', `echo nine > ${ws}/nine.txt`])).status).toBe(0);
      const id = json<SessionSummary[]>(await d.sbx(['ps', '--all', '--json'])).find((s) => s.invocation_key === 't9')!.session_id;
      const ws2 = join(d.dir, 'ws2');
      mkdirSync(ws2);
      await d.terminate();
      d.withConfig({ workspace: { paths: [ws, ws2] } });
      await d.start();
      const all = await d.sbx(['close', '--all', '--timeout', '1s']);
      expect(all.stderr.toString()).toBe('');
      expect(all.status).toBe(0);
      expect((JSON.parse(all.stdout.toString()) as CloseReceipt).tasks!.map((t) => [t.task, t.complete])).toEqual([['t9', true]]);
      const t9 = await closeTask(d, 't9');
      expect(t9.status).toBe(0);
      expect(t9.receipt).toMatchObject({ complete: true, workspaces: [ws, ws2], obligations: [] });
      expect(t9.receipt!.sessions.map((s) => [s.session_id, s.workspace.map((w) => [w.path, w.root, w.gap, w.terminal_mutation === null])])).toEqual([
        [
          id,
          [
            [ws, ws, null, false],
            [ws2, ws2, 'not_watched', true],
          ],
        ],
      ]);
      expect(await verifyTask(d, t9.stdout)).toMatchObject({ status: 0 });
      // The set close --all defaulted to is recorded as such.
      expect(JSON.parse(readFileSync(join(taskDir(d, 't9'), 'close.json'), 'utf8'))).toMatchObject({ workspaces: [ws, ws2], defaulted: true });
    },
  );

  it(
    'the set close --all defaulted to (every watched workspace) gives way to the first close that names workspaces while the task is incomplete; a named set stays',
    { timeout: 60_000 },
    async () => {
      const { d, ws } = await withWorkspace(rig);
      const c = await d.client();
      const ok = await c.launch({ argv: ['sh', '-c', `echo ok > ${ws}/ok`], cwd: '/', task: 'T', invocation_key: 'fine' });
      await c.wait({ session_id: ok.session_id });
      const lost = await c.launch({ argv: ['true'], cwd: '/', task: 'T', invocation_key: 'torn' });
      await c.wait({ session_id: lost.session_id });
      await d.kill9();
      tearSession(d, lost.session_id);
      const ws2 = join(d.dir, 'ws2');
      mkdirSync(ws2);
      d.withConfig({ workspace: { paths: [ws, ws2] } });
      await d.start();
      expect((await d.sbx(['close', '--all', '--timeout', '1s'])).status).toBe(1);
      const record = () => JSON.parse(readFileSync(join(taskDir(d, 'T'), 'close.json'), 'utf8'));
      expect(record()).toMatchObject({ workspaces: [ws, ws2], defaulted: true });
      const named = await closeTask(d, 'T', ['--workspace', ws]);
      expect(named.status).toBe(1);
      expect(named.receipt).toMatchObject({ complete: false, workspaces: [ws] });
      expect(record()).toMatchObject({ workspaces: [ws], defaulted: false });
      const conflict = await d.sbx(['close', '--task', 'T', '--workspace', ws2]);
      expect(conflict.status).toBe(125);
      expect(conflict.stderr.toString()).toContain(`TASK_CONFLICT: task "T" is closed (or closing) with workspaces ${JSON.stringify([ws])}`);
      expect((await d.sbx(['resolve', lost.session_id, '--as-operator', '--reason', 'checked'])).status).toBe(0);
      const done = await d.sbx(['close', '--all', '--timeout', '1s']);
      expect(done.stderr.toString()).toBe('');
      expect(done.status).toBe(0);
      // The resolved session's receipt has a gap in ws2 (its end was scanned there): the close adds ws2 to the named set.
      expect(json<TaskReceipt>(await d.sbx(['close', '--task', 'T']))).toMatchObject({ complete: true, workspaces: [ws, ws2] });
      expect(record()).toMatchObject({ workspaces: [ws], defaulted: false, added_workspaces: [ws2] });
    },
  );
});

describe('sbx verify of a task receipt', () => {
  it('names an edited receipt, an edited session receipt, and a flipped object', async () => {
    const { d, ws } = await withWorkspace(rig);
    expect((await d.sbx(['run', '--task', 'T', '--key', 'v1', '--', 'sh', '-c', `echo content > ${ws}/f`])).status).toBe(0);
    const closed = await closeTask(d, 'T', ['--workspace', ws]);
    expect(closed.status).toBe(0);
    const edited = JSON.parse(closed.stdout.toString()) as TaskReceipt;
    edited.complete = false;
    const v1 = await verifyTask(d, JSON.stringify(edited));
    expect(v1.status).toBe(1);
    expect(v1.out).toContain('MISMATCH: task receipt: ');
    // A session receipt on disk changed after the task receipt listed it.
    const sid = closed.receipt!.sessions[0].session_id;
    const receiptPath = join(d.stateDir, 'sessions', sid, 'receipt.json');
    const original = readFileSync(receiptPath);
    writeFileSync(receiptPath, original.toString().replace('"exited"', '"signaled"'));
    const v2 = await verifyTask(d, closed.stdout);
    expect(v2.status).toBe(1);
    expect(v2.out).toContain(`MISMATCH: ${sid}: receipt digest`);
    writeFileSync(receiptPath, original);
    // An object of its checkpoint flipped in the store.
    const sha = createHash('sha256').update('content\n').digest('hex');
    const object = join(d.stateDir, 'checkpoints', 'objects', sha.slice(0, 2), sha);
    chmodSync(object, 0o600);
    writeFileSync(object, 'cONTENT\n');
    const v3 = await verifyTask(d, closed.stdout);
    expect(v3.status).toBe(1);
    expect(v3.out).toContain(`MISMATCH: checkpoint ${closed.receipt!.checkpoints[0].checkpoint_id}`);
    expect(v3.out).toContain(sha);
  });
});
