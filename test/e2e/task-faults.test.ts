// The task close under fault injection at every boundary (docs/guide/tasks.md "Tasks: complete(task)"):
// for each crash point, a real supervisor is SIGKILLed exactly there (SBX_FAULT_POINT,
// core/fault.ts), started again, and asked to close the task again. Every run must end
// as an uninterrupted close does: complete, with every condition; each command ran once; one
// published manifest for the task (no second one claiming another boundary), none left
// unpublished; the task receipt verifies end to end (sbx verify), and a receipt written
// before the crash is returned unchanged.
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import type { Receipt, TaskReceipt } from '../../ipc/protocol.js';
import type { TestDaemon } from '../helpers/daemon.js';
import { cancelledOnStderr, taskDir, twoSessionTask, verifyTask, withWorkspace } from '../helpers/tasks.js';
import { json, WorkspaceRig } from '../helpers/workspace.js';
import { storedManifest } from '../helpers/manifest.js';

const rig = new WorkspaceRig();
afterEach(() => rig.cleanup());

const TASK = 'task-under-faults';

/** Published checkpoint records of the task in the local store, and every manifest there. */
function storeOf(d: TestDaemon) {
  const store = join(d.stateDir, 'checkpoints');
  const list = (sub: string) => (existsSync(join(store, sub)) ? readdirSync(join(store, sub)).filter((n) => /^[0-9a-f]{64}\.json$/.test(n)) : []);
  const published = list('published').map(
    (n) => JSON.parse(readFileSync(join(store, 'published', n), 'utf8')) as { checkpoint_id: string; task: string | null; close_attempt?: number },
  );
  return {
    published: published.filter((p) => p.task === TASK),
    manifests: list('manifests').map((n) => n.slice(0, 64)),
    tmp: existsSync(join(store, 'tmp')) ? readdirSync(join(store, 'tmp')) : [],
  };
}

/** A daemon watching ws (with env), and the two-session task of the crash tests in it (helpers/tasks.ts). */
async function scenario(env: NodeJS.ProcessEnv | undefined) {
  const { d, ws } = await withWorkspace(rig, { env });
  const { runs, ids } = await twoSessionTask(d, ws, TASK);
  return { d, ws, runs, ids };
}

const close = (d: TestDaemon, ws: string) => d.sbx(['close', '--task', TASK, '--workspace', ws, '--timeout', '300ms']);

/** What every close of the scenario must end with, crash or not. */
async function expectComplete(d: TestDaemon, ws: string, runs: string, ids: string[], r: Awaited<ReturnType<typeof close>>): Promise<TaskReceipt> {
  expect(r.status).toBe(0);
  const receipt = json<TaskReceipt>(r);
  // stderr names the sessions the close ended (the one still running), and nothing else.
  expect(cancelledOnStderr(r.stderr)).toEqual(receipt.settle.terminated_ids);
  expect(receipt.settle.terminated_ids?.every((id) => ids.includes(id))).toBe(true);
  expect(receipt).toMatchObject({ kind: 'task', task: TASK, complete: true, obligations: [], workspaces: [ws] });
  expect(receipt.conditions).toEqual({
    sealed: true,
    sessions_settled: true,
    terminal_mutations_known: true,
    checkpoint_covers: true,
    read_back_exact: true,
    fenced: true,
  });
  expect(receipt.sessions.map((s) => s.session_id)).toEqual(ids);
  for (const s of receipt.sessions) expect(s.death?.evidence).toBe('cgroup_empty');
  // Each command ran once, however many times close ran.
  expect(readFileSync(runs, 'utf8')).toBe('s1\ns2\n');
  // One published manifest for the task, the receipt's; nothing unpublished, no temp file.
  const store = storeOf(d);
  expect(store.published.map((p) => p.checkpoint_id)).toEqual([receipt.checkpoints[0].checkpoint_id]);
  expect(store.manifests).toEqual([receipt.checkpoints[0].checkpoint_id]);
  expect(store.tmp).toEqual([]);
  expect(readdirSync(taskDir(d, TASK)).filter((n) => n.endsWith('.tmp'))).toEqual([]);
  // The checkpoint holds what the sessions wrote.
  const manifest = storedManifest(join(d.stateDir, 'checkpoints'), receipt.checkpoints[0].checkpoint_id!);
  const sha = (s: string) => createHash('sha256').update(s).digest('hex');
  expect(manifest.entries.map((e) => [e.path, e.sha256])).toEqual([
    ['f1', sha('one\n')],
    ['f2', sha('two\n')],
  ]);
  // End to end: signature, session receipts, manifest, objects, the verdict from the facts.
  const v = await verifyTask(d, r.stdout);
  expect(v.out).toContain('OK: task receipt');
  expect(v.status).toBe(0);
  return receipt;
}

describe('task close: SIGKILL at every boundary, then close again', () => {
  it('uninterrupted: the verdict every crash must end with', async () => {
    const { d, ws, runs, ids } = await scenario(undefined);
    const receipt = await expectComplete(d, ws, runs, ids, await close(d, ws));
    expect(receipt.attempt).toBe(1);
    expect(receipt.settle).toEqual({ timeout_ms: 300, terminated: 1, terminated_ids: [ids[1]] });
    const outcomes = receipt.sessions.map((s) => s.outcome).sort();
    expect(outcomes).toEqual(['cancelled', 'exited']);
    // Unchanged on every later call.
    const again = await close(d, ws);
    expect(again.stdout.equals((await close(d, ws)).stdout)).toBe(true);
    expect(json<TaskReceipt>(again)).toEqual(receipt);
  });

  const points = [
    'task-close:after-attempt',
    'task-close:after-seal',
    'task-close:settling',
    'task-close:after-last-death',
    'checkpoint:after-boundary',
    'checkpoint:object@1',
    'checkpoint:object@2',
    'checkpoint:before-manifest',
    'checkpoint:after-manifest',
    'checkpoint:after-read-back',
    'task-close:after-checkpoint',
    'task-close:after-receipt-temp',
    'task-close:after-receipt-rename',
  ];
  for (const point of points) {
    it(`killed at ${point}`, async () => {
      const { d, ws, runs, ids } = await scenario({ SBX_FAULT_POINT: point });
      const crashed = await close(d, ws);
      expect(crashed.status).toBe(125); // the connection died with the supervisor
      expect(await d.exitedNow()).toEqual({ code: null, signal: 'SIGKILL' });
      const before = existsSync(join(taskDir(d, TASK), 'receipt.json')) ? readFileSync(join(taskDir(d, TASK), 'receipt.json'), 'utf8') : null;
      // Only the last point has a receipt on disk; a receipt there is never complete with a missing fact.
      expect(before !== null).toBe(point === 'task-close:after-receipt-rename');
      await d.withEnv(undefined).start();
      const r = await close(d, ws);
      const receipt = await expectComplete(d, ws, runs, ids, r);
      if (before !== null) expect(receipt).toEqual(JSON.parse(before)); // returned unchanged
      // A crash before the settle ended s2 leaves it to reconciliation (owner_lost); after, it was ended by close.
      const s2 = receipt.sessions.find((s) => s.invocation_key === 'k2')!;
      expect(s2.outcome).toBe(['task-close:after-attempt', 'task-close:after-seal', 'task-close:settling'].includes(point) ? 'owner_lost' : 'cancelled');
      const receipts = await Promise.all(ids.map(async (id) => json<Receipt>(await d.sbx(['receipt', id, '--json']))));
      expect(receipts.map((x) => x.task)).toEqual([TASK, TASK]);
    });
  }
});
