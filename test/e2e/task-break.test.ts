// Breaking the task close (issue 19, docs/guide/tasks.md "Tasks: complete(task)") on a real supervisor:
// a checkpoint removed by sbx gc while a crashed close attempt waited to be resumed (the
// resumed attempt must not sign a receipt naming it); a first close naming a workspace no
// checkpoint can be taken of (refused before anything is recorded, so the task can still be
// closed with the right one); a close without --workspace after the watched workspaces
// changed (the task's own set: its final receipt is returned unchanged); an entry in tasks/
// that is not a task dir (a file, a symlink) at start: the supervisor starts, the task it
// would be stays sealed, nothing outside the state dir is touched; sbx verify of an honest
// receipt whose close could not read supervisor.json (a fact only the receipt can tell now);
// a key retired whole by retention asked for in another task (KEY_CONFLICT, as a live one);
// a torn close.json or receipt.json (refused naming the file, nothing replaced); an earlier
// attempt's checkpoint of another supervisor instance (supervisor.json was torn: a new
// instance) is not reused, so closing again converges.
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import type { TaskReceipt } from '../../ipc/protocol.js';
import { until } from '../helpers/daemon.js';
import { closeWithIdentityTorn, taskDir, verifyTask, withWorkspace } from '../helpers/tasks.js';
import { json, WorkspaceRig } from '../helpers/workspace.js';
import { storedManifest } from '../helpers/manifest.js';

const rig = new WorkspaceRig();
afterEach(() => rig.cleanup());

describe('task close: breaking it', () => {
  it('a crashed attempt whose checkpoint sbx gc removed before the resume: incomplete, naming it (never a receipt naming a checkpoint that is gone); close again: a new one, complete', async () => {
    const { d, ws } = await withWorkspace(rig, { env: { SBX_FAULT_POINT: 'task-close:after-receipt-temp' } });
    expect((await d.sbx(['run', '--task', 'T', '--key', 'k', '--', 'sh', '-c', `echo t > ${ws}/t`])).status).toBe(0);
    const crashed = await d.sbx(['close', '--task', 'T', '--workspace', ws]);
    expect(crashed.status).toBe(125);
    expect(await d.exitedNow()).toEqual({ code: null, signal: 'SIGKILL' });
    const recorded = (JSON.parse(readFileSync(join(taskDir(d, 'T'), 'attempt.json'), 'utf8')) as { checkpoints: Record<string, { checkpoint_id: string }> })
      .checkpoints[ws].checkpoint_id;
    // Restarted with a retention that expires every checkpoint; gc removes the attempt's.
    await d
      .withEnv(undefined)
      .withConfig({ checkpoint: { maxAgeMs: 1 } })
      .start();
    const gc = await d.sbx(['gc', '--json']);
    expect(gc.status).toBe(0);
    expect(json<{ checkpoints: { removed_manifests: string[] } }>(gc).checkpoints.removed_manifests).toEqual([recorded]);
    expect(existsSync(join(d.stateDir, 'checkpoints', 'manifests', `${recorded}.json`))).toBe(false);

    const resumed = await d.sbx(['close', '--task', 'T', '--workspace', ws]);
    expect(resumed.status).toBe(1);
    const first = json<TaskReceipt>(resumed);
    expect(first).toMatchObject({ attempt: 1, complete: false });
    expect(first.conditions).toMatchObject({
      sessions_settled: true,
      terminal_mutations_known: true,
      checkpoint_covers: false,
      read_back_exact: false,
      fenced: false,
    });
    expect(first.checkpoints).toEqual([
      expect.objectContaining({
        workspace: ws,
        checkpoint_id: null,
        error: {
          code: 'CHECKPOINT_FAILED',
          stage: 'store',
          message: expect.stringContaining(`checkpoint ${recorded} is no longer published in ${join(d.stateDir, 'checkpoints')} (removed by sbx gc?)`),
        },
      }),
    ]);
    expect(first.obligations).toEqual([
      { authority: 'workspace', condition: 'checkpoint_covers', workspace: ws, what: expect.stringContaining(`checkpoint ${recorded} is no longer published`) },
    ]);
    expect(resumed.stderr.toString()).toContain('incomplete: workspace must settle checkpoint_covers');
    expect((await verifyTask(d, resumed.stdout)).out).toContain('OK: task receipt of "T" (complete: false)');

    const again = await d.sbx(['close', '--task', 'T', '--workspace', ws]);
    expect(again.stderr.toString()).toBe('');
    expect(again.status).toBe(0);
    const second = json<TaskReceipt>(again);
    expect(second).toMatchObject({ attempt: 2, complete: true, obligations: [] });
    expect(second.checkpoints[0].checkpoint_id).not.toBe(recorded);
    expect(second.checkpoints[0].close_attempt).toBe(2);
    expect((await verifyTask(d, again.stdout)).status).toBe(0);
    expect(json<{ outcome: string }[]>(await d.sbx(['ps', '--all', '--json'])).length).toBe(1); // the command ran once
  });

  it('a first close naming a workspace no checkpoint can be taken of is refused with INVALID_ARGUMENT and records nothing; the task then closes with the right one', async () => {
    const { d, ws } = await withWorkspace(rig);
    writeFileSync(join(d.dir, 'a-file'), 'x');
    expect((await d.sbx(['run', '--task', 'T', '--', 'sh', '-c', `echo t > ${ws}/t`])).status).toBe(0);
    const bad: [string, string][] = [
      [join(d.dir, 'typo'), 'does not exist'],
      [join(d.dir, 'a-file'), 'is not a directory'],
      [d.stateDir, `the directory ${d.stateDir} holds the state dir ${d.stateDir}`],
      [d.dir, `the directory ${d.dir} holds the state dir ${d.stateDir}`],
    ];
    for (const [path, why] of bad) {
      const r = await d.sbx(['close', '--task', 'T', '--workspace', path]);
      expect(r.stdout.toString()).toBe('');
      expect(r.stderr.toString()).toContain(`INVALID_ARGUMENT: close: no checkpoint can be taken of ${path}: `);
      expect(r.stderr.toString()).toContain(why);
      expect(r.stderr.toString()).toContain('. Nothing was recorded or sealed\n');
      expect(r.status).toBe(125);
    }
    // Nothing was recorded: no close, no seal; the task still admits.
    expect(existsSync(taskDir(d, 'T'))).toBe(false);
    expect((await d.sbx(['run', '--task', 'T', '--', 'echo', 'still open'])).stdout.toString()).toBe('still open\n');
    const closed = await d.sbx(['close', '--task', 'T', '--workspace', ws]);
    expect(closed.stderr.toString()).toBe('');
    expect(closed.status).toBe(0);
    expect(json<TaskReceipt>(closed)).toMatchObject({ complete: true, workspaces: [ws] });

    // A workspace removed after the first close named it stays the task's: a later close is not refused (its receipt, final, is answered).
    const gone = join(ws, 'gone');
    mkdirSync(gone);
    expect((await d.sbx(['run', '--task', 'U', '--', 'true'])).status).toBe(0);
    const first = await d.sbx(['close', '--task', 'U', '--workspace', gone]);
    expect(first.status).toBe(0);
    rmSync(gone, { recursive: true });
    const later = await d.sbx(['close', '--task', 'U', '--workspace', gone]);
    expect(later.status).toBe(0);
    expect(later.stdout.equals(first.stdout)).toBe(true);
  });

  it("without --workspace, a later close names the task's first set, also after the watched workspaces changed: its final receipt is returned unchanged", async () => {
    const { d, ws } = await withWorkspace(rig);
    expect((await d.sbx(['run', '--task', 'T', '--', 'sh', '-c', `echo t > ${ws}/t`])).status).toBe(0);
    const first = await d.sbx(['close', '--task', 'T']);
    expect(first.status).toBe(0);
    expect(json<TaskReceipt>(first).workspaces).toEqual([ws]);
    // Restarted watching one more workspace.
    await d.terminate();
    const ws2 = join(d.dir, 'ws2');
    mkdirSync(ws2);
    await d.withConfig({ workspace: { paths: [ws, ws2] } }).start();
    const again = await d.sbx(['close', '--task', 'T']);
    expect(again.stderr.toString()).toBe('');
    expect(again.status).toBe(0);
    expect(again.stdout.equals(first.stdout)).toBe(true);
    // Another set named outright is still refused; a new task without --workspace gets every watched one.
    const other = await d.sbx(['close', '--task', 'T', '--workspace', ws2]);
    expect(other.status).toBe(125);
    expect(other.stderr.toString()).toContain(`TASK_CONFLICT: task "T" is closed (or closing) with workspaces ["${ws}"]`);
    const fresh = await d.sbx(['close', '--task', 'V']);
    expect(fresh.status).toBe(0);
    expect(json<TaskReceipt>(fresh).workspaces).toEqual([ws, ws2]);
  });

  it('an entry in tasks/ that is not a task dir (a file, a symlink to a dir elsewhere): the supervisor starts, that task stays sealed, the link is not followed, other tasks are unaffected', async () => {
    const { d, ws } = await withWorkspace(rig);
    expect((await d.sbx(['run', '--task', 'T', '--', 'sh', '-c', `echo t > ${ws}/t`])).status).toBe(0);
    const closed = await d.sbx(['close', '--task', 'T']);
    expect(closed.status).toBe(0);
    await d.terminate();
    writeFileSync(taskDir(d, 'X'), 'not a task dir');
    const elsewhere = join(d.dir, 'elsewhere');
    mkdirSync(elsewhere);
    writeFileSync(join(elsewhere, '.keep.json.0123456789ab.tmp'), "not the supervisor's");
    symlinkSync(elsewhere, taskDir(d, 'Y'));
    await d.start();
    for (const t of ['X', 'Y']) {
      const r = await d.sbx(['run', '--task', t, '--', 'true']);
      expect(r.stderr.toString()).toContain(`ADMISSION_SEALED: task "${t}" was sealed`);
      expect(r.status).toBe(125);
    }
    expect(readdirSync(elsewhere)).toEqual(['.keep.json.0123456789ab.tmp']);
    expect(d.log()).toContain('a task seal is unreadable; that task stays sealed');
    expect((await d.sbx(['close', '--task', 'T'])).stdout.equals(closed.stdout)).toBe(true);
    expect((await d.sbx(['run', '--task', 'U', '--', 'echo', 'open'])).stdout.toString()).toBe('open\n');
  });

  it('sbx verify of an honest receipt whose close could not read supervisor.json (fenced false, an operator obligation): OK, complete false', async () => {
    const { d, ws } = await withWorkspace(rig);
    expect((await d.sbx(['run', '--task', 'T', '--', 'sh', '-c', `echo t > ${ws}/t`])).status).toBe(0);
    const closed = await closeWithIdentityTorn(d, ['T']);
    expect(closed.status).toBe(1);
    const receipt = json<TaskReceipt>(closed);
    expect(receipt.conditions).toMatchObject({ sessions_settled: true, checkpoint_covers: true, read_back_exact: true, fenced: false });
    expect(receipt.obligations).toEqual([
      { authority: 'operator', condition: 'fenced', what: 'supervisor.json cannot be read: this run cannot show it still owns the state dir' },
    ]);
    const v = await verifyTask(d, closed.stdout);
    expect(v.out).toContain('OK: task receipt of "T" (complete: false)');
    expect(v.status).toBe(0);
    // Edited to claim the fence held, it does not verify (the signature).
    const edited = { ...receipt, obligations: [], conditions: { ...receipt.conditions, fenced: true }, complete: true };
    expect((await verifyTask(d, Buffer.from(JSON.stringify(edited)))).status).toBe(1);
  });

  it('a key retired whole by retention is still in its task: the same key in another task is KEY_CONFLICT naming it; in its own task it answers retired', async () => {
    const { d } = await withWorkspace(rig);
    const ran = await d.sbx(['run', '--task', 'A', '--key', 'rk', '--', 'true']);
    expect(ran.status).toBe(0);
    await d.terminate();
    await d.withConfig({ retention: { receiptMaxAgeMs: 1 } }).start();
    const gc = await d.sbx(['gc', '--json']);
    expect(json<{ retired: string[] }>(gc).retired).toHaveLength(1);
    const tombstone = JSON.parse(readFileSync(join(d.stateDir, 'retired', `${json<{ retired: string[] }>(gc).retired[0]}.json`), 'utf8')) as { task?: string };
    expect(tombstone.task).toBe('A');
    const other = await d.sbx(['run', '--task', 'B', '--key', 'rk', '--detach', '--json', '--', 'true']);
    expect(other.stderr.toString()).toContain('KEY_CONFLICT: invocation key "rk" was used in task "A", not "B"');
    expect(other.status).toBe(125);
    const same = await d.sbx(['run', '--task', 'A', '--key', 'rk', '--detach', '--json', '--', 'true']);
    expect(same.status).toBe(0);
    expect(json<{ existing: boolean; state: string }>(same)).toMatchObject({ existing: true, state: 'retired' });
  });

  it('a torn task record (close.json, receipt.json): the close is refused naming the file, nothing is replaced, the supervisor and other tasks go on', async () => {
    const { d, ws } = await withWorkspace(rig);
    for (const t of ['T1', 'T2']) {
      expect((await d.sbx(['run', '--task', t, '--', 'sh', '-c', `echo ${t} > ${ws}/${t}`])).status).toBe(0);
      expect((await d.sbx(['close', '--task', t])).status).toBe(0);
    }
    await d.kill9();
    writeFileSync(join(taskDir(d, 'T1'), 'close.json'), '{ torn');
    writeFileSync(join(taskDir(d, 'T2'), 'receipt.json'), '{ torn');
    await d.start();
    for (const [t, file] of [
      ['T1', 'close.json'],
      ['T2', 'receipt.json'],
    ]) {
      const r = await d.sbx(['close', '--task', t]);
      expect(r.stderr.toString()).toContain(`sbx: INTERNAL: ${join(taskDir(d, t), file)} cannot be read: not JSON`);
      expect(r.status).toBe(125);
      expect(readFileSync(join(taskDir(d, t), file), 'utf8')).toBe('{ torn');
    }
    expect((await d.sbx(['run', '--task', 'T1', '--', 'true'])).status).toBe(125); // still sealed
    expect((await d.sbx(['close', '--task', 'T3'])).status).toBe(0);
  });

  it("an earlier attempt's checkpoint from another supervisor instance (supervisor.json torn: a new one) is not reused: the next close takes a new one and is complete", async () => {
    const { d, ws } = await withWorkspace(rig);
    expect((await d.sbx(['run', '--task', 'T', '--', 'sh', '-c', `echo t > ${ws}/t`])).status).toBe(0);
    const identity = join(d.stateDir, 'supervisor.json');
    writeFileSync(identity, '{ torn');
    const first = await d.sbx(['close', '--task', 'T']);
    expect(first.status).toBe(1); // this run cannot show it owns the state dir
    const old = json<TaskReceipt>(first);
    await d.kill9();
    await d.start(); // supervisor.json unreadable: kept aside, a new instance
    const again = await d.sbx(['close', '--task', 'T']);
    const second = json<TaskReceipt>(again);
    expect(second.supervisor.instance).not.toBe(old.supervisor.instance);
    expect(second.obligations).toEqual([]);
    expect(again.status).toBe(0);
    expect(second).toMatchObject({ attempt: 2, complete: true });
    expect(second.checkpoints[0].checkpoint_id).not.toBe(old.checkpoints[0].checkpoint_id);
    expect(second.checkpoints[0].fence!.instance).toBe(second.supervisor.instance);
    expect((await verifyTask(d, again.stdout)).status).toBe(0);
  });
});

describe('task close: after the breaker', () => {
  it('a session retired whole by retention before its task closed: listed from its tombstone, an operator obligation (never complete without its facts)', async () => {
    const { d, ws } = await withWorkspace(rig);
    expect((await d.sbx(['run', '--task', 'T', '--key', 'old', '--', 'sh', '-c', `echo old > ${ws}/old`])).status).toBe(0);
    await d.terminate();
    await d.withConfig({ retention: { receiptMaxAgeMs: 1 } }).start();
    const [sid] = json<{ retired: string[] }>(await d.sbx(['gc', '--json'])).retired;
    const closed = await d.sbx(['close', '--task', 'T', '--workspace', ws]);
    expect(closed.status).toBe(1);
    const r = json<TaskReceipt>(closed);
    expect(r.sessions).toEqual([
      expect.objectContaining({
        session_id: sid,
        invocation_key: 'old',
        task: 'T',
        state: 'retired',
        outcome: 'exited',
        receipt_sha256: expect.stringMatching(/^sha256:/),
        death: null,
      }),
    ]);
    expect(r.conditions).toMatchObject({ sessions_settled: false, terminal_mutations_known: false });
    expect(r.obligations).toEqual([
      {
        authority: 'operator',
        condition: 'sessions_settled',
        session_id: sid,
        what: expect.stringContaining('was removed whole by the retention policy before the task closed'),
      },
    ]);
    expect((await verifyTask(d, closed.stdout)).out).toContain('OK: task receipt of "T" (complete: false)');
  });

  it('sbx gc keeps the checkpoints a complete task receipt names (past checkpoint.maxAgeMs too); the receipt still verifies', async () => {
    const { d, ws } = await withWorkspace(rig);
    expect((await d.sbx(['run', '--task', 'T', '--', 'sh', '-c', `echo kept > ${ws}/kept`])).status).toBe(0);
    const closed = await d.sbx(['close', '--task', 'T', '--workspace', ws]);
    expect(closed.status).toBe(0);
    const id = json<TaskReceipt>(closed).checkpoints[0].checkpoint_id!;
    const loose = json<{ checkpoint_id: string }>(await d.sbx(['checkpoint', '--workspace', ws, '--json']));
    await d.terminate();
    await d.withConfig({ checkpoint: { maxAgeMs: 1 } }).start();
    const gc = json<{ checkpoints: { removed_manifests: string[]; kept_manifests: number } }>(await d.sbx(['gc', '--json']));
    expect(gc.checkpoints.removed_manifests).toEqual(loose.checkpoint_id === id ? [] : [loose.checkpoint_id]);
    expect(existsSync(join(d.stateDir, 'checkpoints', 'manifests', `${id}.json`))).toBe(true);
    expect((await verifyTask(d, closed.stdout)).status).toBe(0);
  });

  it('a task receipt that cannot be read: sbx gc removes no checkpoint by age (it cannot tell which are evidence)', async () => {
    const { d, ws } = await withWorkspace(rig);
    expect((await d.sbx(['run', '--task', 'T', '--', 'sh', '-c', `echo t > ${ws}/t`])).status).toBe(0);
    expect((await d.sbx(['close', '--task', 'T', '--workspace', ws])).status).toBe(0);
    writeFileSync(join(ws, 'u'), 'u\n');
    expect((await d.sbx(['checkpoint', '--workspace', ws])).status).toBe(0);
    await d.terminate();
    writeFileSync(join(taskDir(d, 'T'), 'receipt.json'), '{ torn');
    await d.withConfig({ checkpoint: { maxAgeMs: 1 } }).start();
    const gc = json<{ checkpoints: { removed_manifests: string[]; kept_manifests: number } }>(await d.sbx(['gc', '--json']));
    expect(gc.checkpoints).toMatchObject({ removed_manifests: [], kept_manifests: 2 });
    await until(() => d.log().includes('a task receipt cannot be read; gc removes no checkpoint by age until it can'), 'the log line');
  });

  it('SIGTERM while a close settles: SHUTTING_DOWN, no receipt claimed; after the restart the resumed attempt is complete', async () => {
    const { d, ws } = await withWorkspace(rig);
    const c = await d.client();
    // Ignores TERM: the close waits out its timeout, and the shutdown finds it settling.
    await c.launch({ argv: ['sh', '-c', `trap '' TERM; echo x > ${ws}/x; while :; do sleep 0.05; done`], cwd: '/', task: 'T', grace_ms: 500 });
    const closing = d.sbx(['close', '--task', 'T', '--workspace', ws, '--timeout', '30s']);
    await new Promise<void>((resolve, reject) => {
      const t0 = Date.now();
      const tick = () =>
        existsSync(join(taskDir(d, 'T'), 'attempt.json'))
          ? resolve()
          : Date.now() - t0 > 10_000
            ? reject(new Error('no attempt record'))
            : setTimeout(tick, 20);
      tick();
    });
    expect((await d.terminate())?.code).toBe(0);
    const r = await closing;
    expect(r.status).toBe(125);
    expect(existsSync(join(taskDir(d, 'T'), 'receipt.json'))).toBe(false);
    await d.start();
    const again = await d.sbx(['close', '--task', 'T', '--workspace', ws]);
    expect(again.stderr.toString()).toBe('');
    expect(again.status).toBe(0);
    expect(json<TaskReceipt>(again)).toMatchObject({ attempt: 1, complete: true });
  });

  it("a symlinked workspace retargeted between attempts: the earlier attempt's checkpoint (of the old target) is not reused", async () => {
    const { d, ws } = await withWorkspace(rig);
    mkdirSync(join(ws, 'one'));
    mkdirSync(join(ws, 'two'));
    writeFileSync(join(ws, 'two', 'f'), 'two\n');
    const link = join(d.dir, 'current');
    symlinkSync(join(ws, 'one'), link);
    expect((await d.sbx(['run', '--task', 'T', '--', 'true'])).status).toBe(0);
    // supervisor.json unreadable during the first close: fenced false, the checkpoint itself fine (reusable).
    const first = await closeWithIdentityTorn(d, ['T', '--workspace', link]);
    expect(first.status).toBe(1);
    const firstCp = json<TaskReceipt>(first).checkpoints[0];
    expect(firstCp.consistent).toBe(true);
    rmSync(link);
    symlinkSync(join(ws, 'two'), link);
    const second = await d.sbx(['close', '--task', 'T', '--workspace', link]);
    expect(second.status).toBe(0);
    const id = json<TaskReceipt>(second).checkpoints[0].checkpoint_id!;
    expect(id).not.toBe(firstCp.checkpoint_id);
    const manifest = storedManifest(join(d.stateDir, 'checkpoints'), id);
    expect(manifest.workspace).toBe(join(ws, 'two'));
    expect(manifest.entries.map((e) => e.path)).toEqual(['f']);
  });
});
