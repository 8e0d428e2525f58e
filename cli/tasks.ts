// sbx verify of a task receipt (works with the supervisor stopped), loaded by sbx.ts only for one: its
// signature, the session receipts and checkpoints it lists, and the verdict evaluated again from those facts
// (core/task/join.ts) and compared (verifyTaskReceipt). Owns that output and exit status (0 it all holds, 1 a
// mismatch, 125 could not check).
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import type { Receipt, TaskReceipt } from '../ipc/protocol.js';
import { readRecord } from '../core/state/records.js';
import { ESCAPE_ATTESTED_FILE, RECEIPT_FILE, STATE } from '../core/state/names.js';
import { jcs, verifyCloseSessions, verifySignature } from '../core/receipts/verify.js';
import { verifyCheckpoint } from '../core/checkpoint/verify.js';
import { evaluateTask, type JoinSession } from '../core/task/join.js';
import { openStore } from './checkpoints.js';
import { fail } from './fail.js';

/** Whether an escaped session's entry rests on an operator's word the state dir still holds, for that receipt (a mismatch is a problem). */
function escapeAttested(s: TaskReceipt['sessions'][number], stateDir: string, problems: string[]): boolean {
  const said = s.death?.escape_attested;
  if (s.death?.evidence !== 'cgroup_escaped') return false;
  let record: { receipt_sha256: string; uid: number; reason: string; attested_at: string } | null = null;
  try {
    record = readRecord('escapeAttested', join(stateDir, STATE.sessionsDir, s.session_id, ESCAPE_ATTESTED_FILE));
  } catch {
    // None (or unreadable): the word is not there.
  }
  const holds = record !== null && record.receipt_sha256 === s.receipt_sha256;
  if (said && (!holds || record!.reason !== said.reason || record!.attested_at !== said.attested_at))
    problems.push(`${s.session_id}: the task receipt shows an operator's word on its escape that the state dir does not hold`);
  return holds && said !== undefined;
}

/**
 * Problems with a task receipt, checked end to end against the state dir and its stores ([]: it all holds): its
 * signature; every session receipt it lists (digest, signature, stored output, its task); every checkpoint (the
 * manifest by id from its store, its signature and form, publication, every object re-hashed; and that it says
 * what the task receipt says of it: task, close attempt, boundary, started_at, scan digest, fence); and the
 * verdict itself, evaluated again from those facts (core/task/join.ts) and compared.
 */
export async function verifyTaskReceipt(
  receipt: TaskReceipt,
  keyPem: string,
  o: { stateDir: string; store?: string },
): Promise<{ problems: string[]; objects: number; bytes: number }> {
  const problems = verifySignature(receipt as unknown as Receipt, keyPem).map((p) => `task receipt: ${p}`);
  let objects = 0;
  let bytes = 0;
  if (problems.length) return { problems, objects, bytes };
  // A retired session's receipt is gone (its tombstone named it): nothing to re-read.
  for (const p of verifyCloseSessions({ sessions: receipt.sessions.filter((s) => s.state !== 'retired') }, o.stateDir, keyPem)) problems.push(p);
  const sessions: JoinSession[] = receipt.sessions.map((s) => {
    let r: Receipt | null = null;
    if (s.receipt_sha256 !== null && s.state !== 'retired') {
      try {
        r = readRecord('receipt', join(o.stateDir, STATE.sessionsDir, s.session_id, RECEIPT_FILE));
      } catch {
        // named by verifyCloseSessions
      }
      // A session of another task is not this task's fact (one of no known task names none).
      if (r && typeof r.task === 'string' && r.task !== receipt.task)
        problems.push(`${s.session_id}: its receipt is of task ${JSON.stringify(r.task)}, not ${JSON.stringify(receipt.task)}`);
    }
    return { sessionId: s.session_id, state: s.state, receipt: r, unknownReason: null, escapeAttested: escapeAttested(s, o.stateDir, problems) };
  });
  for (const cp of receipt.checkpoints) {
    if (cp.checkpoint_id === null) continue;
    const store = await openStore({ stateDir: o.stateDir, store: o.store ?? (cp.store && cp.store.startsWith('s3://') ? cp.store : undefined) });
    let manifestBytes: Buffer;
    try {
      manifestBytes = await store.readManifest(cp.checkpoint_id);
    } catch (err) {
      problems.push(`checkpoint ${cp.checkpoint_id} (${cp.workspace}): ${(err as Error).message}`);
      continue;
    }
    const v = await verifyCheckpoint(manifestBytes, keyPem, store, cp.checkpoint_id);
    objects += v.objects;
    bytes += v.bytes;
    for (const p of v.problems) problems.push(`checkpoint ${cp.checkpoint_id} (${cp.workspace}): ${p}`);
    const m = v.manifest;
    if (!m) continue;
    const said = (what: string, manifest: unknown, task: unknown) => {
      if (jcs(manifest ?? null) !== jcs(task ?? null))
        problems.push(`checkpoint ${cp.checkpoint_id}: the manifest's ${what} is ${JSON.stringify(manifest)}, the task receipt says ${JSON.stringify(task)}`);
    };
    said('task', m.task, receipt.task);
    said('boundary', m.boundary, cp.boundary);
    said('started_at', m.started_at, cp.started_at); // the join orders by it across epochs and gaps
    said('scan digest', m.scan.digest, cp.scan_digest);
    said('consistent', m.consistent, cp.consistent);
    said('fence', { instance: m.supervisor.instance, generation: m.supervisor.generation, boot_id: m.supervisor.boot_id }, cp.fence);
    said('close attempt', m.close_attempt ?? null, cp.close_attempt);
    if (cp.mounts_skipped !== undefined) said('mount points skipped', v.mountsSkipped, cp.mounts_skipped); // (absent in receipts written before it was said)
  }
  // The verdict again, from the facts just checked. Whether supervisor.json still named the
  // run when it signed is a fact of that moment only the (signed) receipt tells: its fenced
  // obligation without a workspace.
  const diskFenceFailed = receipt.obligations.some((ob) => ob.condition === 'fenced' && ob.workspace === undefined);
  const again = evaluateTask({
    sealed: receipt.sealed !== null,
    sessions,
    // Each session entry names the watched root of each workspace (the same for all; without sessions it does not matter).
    workspaces: receipt.workspaces.map((path) => ({ path, root: receipt.sessions[0]?.workspace.find((w) => w.path === path)?.root ?? null })),
    checkpoints: receipt.workspaces.map((path) => receipt.checkpoints.find((c) => c.workspace === path)!),
    sealGeneration: receipt.sealed?.generation ?? null,
    fence: receipt.fence,
    fenceOnDisk: diskFenceFailed ? null : { instance: receipt.fence.instance, generation: receipt.fence.generation },
  });
  if (again.complete !== receipt.complete) problems.push(`the task receipt says complete: ${receipt.complete}; its facts say ${again.complete}`);
  for (const [k, v] of Object.entries(again.conditions)) {
    const said = (receipt.conditions as unknown as Record<string, boolean>)[k];
    if (said !== v) problems.push(`condition ${k}: the task receipt says ${said}, its facts say ${v}`);
  }
  return { problems, objects, bytes };
}

/** `sbx verify TASK.json`: prints OK or each mismatch; exit 0, 1, or 125 when it cannot check. */
export async function verifyTaskCommand(receipt: TaskReceipt, keyPem: string, o: { stateDir: string; store?: string; json?: boolean }): Promise<void> {
  if (!existsSync(join(o.stateDir, STATE.sessionsDir)))
    fail(`verify: a task receipt is checked against its state dir: ${o.stateDir} has no sessions/ (give --state-dir DIR)`);
  const { problems, objects, bytes } = await verifyTaskReceipt(receipt, keyPem, o);
  if (o.json)
    process.stdout.write(
      JSON.stringify(
        { ok: problems.length === 0, key_id: receipt.signature?.key_id ?? null, task: receipt.task, complete: receipt.complete, objects, bytes, problems },
        null,
        2,
      ) + '\n',
    );
  else if (problems.length === 0) {
    const ck = receipt.checkpoints.filter((c) => c.checkpoint_id !== null).length;
    process.stdout.write(
      `OK: task receipt of ${JSON.stringify(receipt.task)} (complete: ${receipt.complete}) signed by ${receipt.signature!.key_id}; ${receipt.sessions.length} session receipt(s) match, ${ck} checkpoint(s) verify (${objects} objects, ${bytes} bytes re-hashed), the verdict follows from them\n`,
    );
  } else for (const p of problems) process.stdout.write(`MISMATCH: ${p}\n`);
  process.exitCode = problems.length === 0 ? 0 : 1;
}
