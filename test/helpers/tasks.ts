// Task-close test helpers (test/e2e/task*.test.ts): a daemon watching one workspace, a task's
// state dir, sbx verify of a task receipt, a session's records torn (unknown, task unknown),
// and the two-session task the crash tests close (one ended, one still running).
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { type SbxResult, type TestDaemon, until } from './daemon.js';
import type { WorkspaceRig } from './workspace.js';

/** <state>/tasks/<sha256(task)>: where a task's records are. */
export const taskDir = (d: TestDaemon, task: string) => join(d.stateDir, 'tasks', createHash('sha256').update(task).digest('hex'));

/** A started daemon (tracked by rig) watching <its dir>/ws. */
export async function withWorkspace(rig: WorkspaceRig, options: { env?: NodeJS.ProcessEnv; wrap?: string[]; config?: Record<string, unknown> } = {}) {
  const { d, paths } = await rig.daemon((dir) => {
    mkdirSync(join(dir, 'ws'));
    return [join(dir, 'ws')];
  }, options);
  return { d, ws: paths[0] };
}

/** sbx verify of receipt bytes (written to a file in the daemon's dir) against its state dir: status, stdout + stderr. */
export async function verifyTask(d: TestDaemon, receipt: Buffer | string) {
  const file = join(d.dir, `verify-${Math.random().toString(36).slice(2)}.json`);
  writeFileSync(file, receipt);
  const r = await d.sbx(['verify', file, '--state-dir', d.stateDir]);
  return { status: r.status, out: r.stdout.toString() + r.stderr.toString() };
}

/** Tears a session's admission record and receipt (the daemon stopped): at the next start it is unknown, its task unknown. */
export function tearSession(d: TestDaemon, sessionId: string): void {
  const dir = join(d.stateDir, 'sessions', sessionId);
  writeFileSync(join(dir, 'admission.json'), '{"session_id": "s-');
  writeFileSync(join(dir, 'receipt.json'), '{ torn');
}

/**
 * In task: one session that ended (it wrote ws/f1) and one still running (it wrote ws/f2,
 * then sleeps). Each command appends its name to runs (outside the workspace), so a command
 * run twice would show. Resolves once both have written.
 */
export async function twoSessionTask(d: TestDaemon, ws: string, task: string) {
  const runs = join(d.dir, 'runs');
  const c = await d.client();
  const s1 = await c.launch({ argv: ['sh', '-c', `echo one > ${ws}/f1; echo s1 >> ${runs}`], cwd: '/', invocation_key: 'k1', task });
  await c.wait({ session_id: s1.session_id });
  const s2 = await c.launch({ argv: ['sh', '-c', `echo two > ${ws}/f2; echo s2 >> ${runs}; exec sleep 600`], cwd: '/', invocation_key: 'k2', task });
  await until(() => existsSync(runs) && readFileSync(runs, 'utf8') === 's1\ns2\n', 'both commands to have run');
  return { runs, ids: [s1.session_id, s2.session_id].sort() };
}

/** sbx close --task with args while supervisor.json is torn (the fence cannot be shown), then the file put back. */
export async function closeWithIdentityTorn(d: TestDaemon, args: string[]): Promise<SbxResult> {
  const identity = join(d.stateDir, 'supervisor.json');
  const saved = readFileSync(identity);
  writeFileSync(identity, '{ torn');
  try {
    return await d.sbx(['close', '--task', ...args]);
  } finally {
    writeFileSync(identity, saved);
  }
}

/**
 * The session ids `sbx close --task` names on stderr as cancelled (one line each, in the one form
 * cli/sbx.ts writes); throws on any other stderr line, so a test comparing the ids with the
 * receipt's settle.terminated_ids also proves stderr said nothing else.
 */
export function cancelledOnStderr(stderr: Buffer | string): string[] {
  const lines = stderr.toString().split('\n');
  if (lines.pop() !== '') throw new Error(`stderr does not end with a newline: ${JSON.stringify(stderr.toString())}`);
  return lines.map((line) => {
    const m = /^sbx: cancelled session (s-\S+) \(.+\): it was still running after the [0-9.]+ s timeout$/.exec(line);
    if (!m) throw new Error(`stderr line is not a cancelled session's: ${JSON.stringify(line)}`);
    return m[1]!;
  });
}
