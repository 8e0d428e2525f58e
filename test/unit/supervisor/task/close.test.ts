// The task close apart from the socket (supervisor/task/close.ts, through the registry compose.ts
// builds): a real supervisor in this process, subreaper mode, in a temp state dir. A task's seal
// stops its keys only; its close settles its sessions only (terminating one past the timeout,
// cause close) and writes a signed, final receipt; pinnedCheckpoints (task/records.ts) reads them.
import { closeSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pino from 'pino';
import { afterEach, beforeEach, expect, it } from 'vitest';
import type { LaunchParams, Receipt } from '../../../../ipc/protocol.js';
import { STATE } from '../../../../core/state/names.js';
import { verifySignature } from '../../../../core/receipts/signature.js';
import { compose } from '../../../../supervisor/compose.js';
import { parseConfig } from '../../../../supervisor/config.js';
import { ownChildren } from '../../../../supervisor/reaper.js';
import type { Supervisor } from '../../../../supervisor/supervisor.js';
import { pinnedCheckpoints } from '../../../../supervisor/task/records.js';

const log = pino({ level: 'silent' });
let dir: string;
let s: Supervisor;

const launchOf = (argv: string[], key: string, task: string): LaunchParams => ({ argv, cwd: '/', invocation_key: key, task });

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'task-close-'));
  s = compose(parseConfig({ stateDir: join(dir, 'state'), socketPath: join(dir, 'sock'), cgroup: { mode: 'subreaper' } }, 'test', {}), log);
});

afterEach(async () => {
  await s.shutdown();
  await s.ctx.hashPool.close();
  closeSync(s.lock.fd);
  expect(ownChildren().filter((pid) => pid !== process.pid)).toEqual([]);
  rmSync(dir, { recursive: true, force: true });
});

it("a task's seal stops new keys in that task only; a retried key of it is still answered", async () => {
  const a = s.launch(launchOf(['/bin/true'], 'a1', 'a'));
  expect(s.sealTask('a')).toMatchObject({ task: 'a', already_sealed: false });
  expect(s.sealTask('a')).toMatchObject({ task: 'a', already_sealed: true });
  expect(() => s.launch(launchOf(['/bin/true'], 'a2', 'a'))).toThrow(expect.objectContaining({ code: 'ADMISSION_SEALED' }));
  expect(s.launch(launchOf(['/bin/true'], 'a1', 'a')).result).toMatchObject({ session_id: a.result.session_id, existing: true });
  const b = s.launch(launchOf(['/bin/true'], 'b1', 'b'));
  expect(b.result.existing).toBe(false);
  await Promise.all([a.session!.ended, b.session!.ended]);
  expect(s.admissionState()).toBe('open'); // the sandbox is not sealed
});

it("closes one task: its sessions settled (one terminated past the timeout, cause close), another task's left running; the receipt signed, complete, final", async () => {
  const done = s.launch(launchOf(['/bin/sh', '-c', 'printf done'], 'a-done', 'a'));
  await done.session!.ended;
  const stuck = s.launch(launchOf(['/bin/sleep', '30'], 'a-stuck', 'a'));
  const other = s.launch(launchOf(['/bin/sleep', '30'], 'b-other', 'b'));

  const receipt = await s.closeTask('a', 200, undefined);
  expect({ task: receipt.task, complete: receipt.complete, obligations: receipt.obligations, workspaces: receipt.workspaces }).toEqual({
    task: 'a',
    complete: true,
    obligations: [],
    workspaces: [],
  });
  expect(receipt.settle).toEqual({ timeout_ms: 200, terminated: 1, terminated_ids: [stuck.result.session_id] });
  expect(receipt.sessions.map((e) => [e.session_id, e.state, e.outcome]).sort()).toEqual(
    [
      [done.result.session_id, 'ended', 'exited'],
      [stuck.result.session_id, 'ended', 'cancelled'],
    ].sort(),
  );
  expect(((await stuck.session!.ended) as Receipt).termination.cause).toBe('close');
  expect(verifySignature(receipt as unknown as Receipt, s.ctx.signer.publicKeyPem)).toEqual([]);
  expect(receipt.fence).toEqual({ instance: s.ctx.identity.instance, generation: s.ctx.identity.generation, boot_id: s.ctx.identity.bootId });
  expect(other.session!.state).toBe('running');

  // Final: a second close answers with the same receipt, and launches in the task are refused.
  expect(await s.closeTask('a', 200, undefined)).toEqual(receipt);
  expect(() => s.launch(launchOf(['/bin/true'], 'a-late', 'a'))).toThrow(expect.objectContaining({ code: 'ADMISSION_SEALED' }));
  // No checkpoint is named (no workspace), so none is pinned; an unreadable task receipt pins every one (null).
  expect(pinnedCheckpoints(s.config.stateDir, log)).toEqual(new Set());
  const [taskDir] = readdirSync(join(s.config.stateDir, STATE.tasksDir));
  const receiptFile = readdirSync(join(s.config.stateDir, STATE.tasksDir, taskDir!)).find((f) => f.includes('receipt'))!;
  writeFileSync(join(s.config.stateDir, STATE.tasksDir, taskDir!, receiptFile), '{not json');
  expect(pinnedCheckpoints(s.config.stateDir, log)).toBeNull();
});
