// Seal and close, the join that ends a sandbox's work (docs/guide/close-and-retention.md "Seal, close"): the durable seal
// (<state>/seal.json: new keys get ADMISSION_SEALED, a restart does not unseal), then close:
// the task close machinery (task/close.ts: one settle, then every task's close), the scans
// (workspace/: directory fds, in a worker), and the signed close receipt listing each task's
// verdict, written (<state>/close-receipt.json) once every task is complete; final then.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from 'pino';
import type { SealResult } from '../ipc/methods.js';
import { SupervisorError } from '../ipc/errors.js';
import type { CloseReceipt, CloseTaskEntry, WorkspaceScan } from '../ipc/protocol.js';
import { readRecord, type SealRecord } from '../core/state/records.js';
import { STATE } from '../core/state/names.js';
import { receiptDigest } from '../core/receipts/verify.js';
import type { SessionContext } from './session/context.js';
import type { Session } from './session/session.js';
import { createFileDurable, writeFileDurable } from '../core/fs/durable.js';
import type { Tasks } from './task/close.js';
import type { CloseDigest } from './workspace/digest.js';
import { scanInWorker } from './workspace/scan.js';
import type { FsIdentity } from '../core/fs/walk.js';

export type { CloseReceipt } from '../ipc/protocol.js';

/** Scans one directory tree off the event loop; never rejects: a failure is `error` + `digest: null`. */
export async function scanWorkspace(root: string, options: { deadlineMs?: number; expectFs?: FsIdentity } = {}): Promise<WorkspaceScan> {
  const reply = await scanInWorker<CloseDigest>(root, 'close', options);
  if (reply.ok) return { path: root, ...reply.result };
  return { path: root, files: 0, total_bytes: 0, newest_mtime: null, digest: null, error: reply.code, error_message: reply.message };
}

/** Scans the workspaces one after another (one walk, one worker at a time), in the order given; a watched one must still be its watched file system (expectFs). */
export async function scanWorkspaces(
  roots: string[],
  options: { deadlineMs?: number; expectFs?: (root: string) => FsIdentity | null } = {},
): Promise<WorkspaceScan[]> {
  const scans: WorkspaceScan[] = [];
  for (const root of roots) scans.push(await scanWorkspace(root, { deadlineMs: options.deadlineMs, expectFs: options.expectFs?.(root) ?? undefined }));
  return scans;
}

/** The seal and the close receipt of one state dir. */
export class Closing {
  /** Admission sealed, and since which generation (null: open). */
  seal: SealRecord | null;
  private closing: Promise<CloseReceipt> | null = null;

  constructor(
    private readonly ctx: SessionContext,
    private readonly log: Logger,
  ) {
    this.seal = this.readSeal();
  }

  private get sealPath(): string {
    return join(this.ctx.config.stateDir, STATE.seal);
  }

  private get receiptPath(): string {
    return join(this.ctx.config.stateDir, STATE.closeReceipt);
  }

  /** The close receipt is written: final, the state dir an archive. */
  get final(): boolean {
    return existsSync(this.receiptPath);
  }

  /** Closed, or closing now: the state dir is an archive. */
  get closed(): boolean {
    return this.closing !== null || existsSync(this.receiptPath);
  }

  /** The close receipt as written (checked with its schema, returned with its fields in their written order: the same bytes every time). */
  storedReceipt(): CloseReceipt {
    readRecord('closeReceipt', this.receiptPath);
    return JSON.parse(readFileSync(this.receiptPath, 'utf8')) as CloseReceipt;
  }

  private readSeal(): SealRecord | null {
    if (!existsSync(this.sealPath)) return null;
    try {
      return readRecord('seal', this.sealPath);
    } catch (err) {
      // Sealed is the safe reading of a torn seal: admission stays closed.
      this.log.error({ err }, 'seal.json is unreadable; admission stays sealed');
      return { generation: this.ctx.identity.generation, sealed_at: new Date(0).toISOString() };
    }
  }

  /** Stops admission for good (durable; a restart does not unseal). Idempotent. */
  sealNow(): SealResult {
    if (this.seal) return { ...this.seal, already_sealed: true };
    const record = { generation: this.ctx.identity.generation, sealed_at: new Date().toISOString() };
    writeFileDurable(this.sealPath, JSON.stringify(record) + '\n');
    this.seal = record;
    this.log.info(record, 'admission sealed');
    return { ...record, already_sealed: false };
  }

  /**
   * The sandbox-wide close (sbx close --all): the seal of everything, then the task close
   * machinery (task/close.ts) for every task: one settle of every session (the same as a
   * task close's, recovered sessions included), each task's close (checkpoint, read-back,
   * fence, join), then the scans and the signed close receipt listing each task's verdict.
   * Complete when every task is and every session ended: the receipt is written
   * (close-receipt.json, once; every later call returns it, even after a restart). Otherwise
   * it is answered, not written: the next close runs again.
   */
  close(
    c: { sessions: () => Session[]; tasks: Tasks; taskNames: () => string[]; stopping: () => boolean; checkpointsSettled: () => Promise<void> },
    timeoutMs: number,
    workspaces: string[],
  ): Promise<CloseReceipt> {
    if (existsSync(this.receiptPath)) return Promise.resolve(this.storedReceipt());
    this.closing ??= (async () => {
      const sealed = this.sealNow();
      const { settle, terminated } = await c.tasks.settleSessions(() => c.sessions(), timeoutMs, { scope: 'all' });
      // Each task's close, one after another (their checkpoints may be of the same workspace).
      const tasks: CloseTaskEntry[] = [];
      for (const task of c.taskNames()) {
        if (c.stopping()) throw new SupervisorError('SHUTTING_DOWN', 'the supervisor is stopping; close again once it has started');
        const r = await c.tasks.close(task, timeoutMs, undefined, terminated);
        tasks.push({ task, attempt: r.attempt, complete: r.complete, receipt_sha256: receiptDigest(r), obligations: r.obligations });
      }
      const scans = await scanWorkspaces(workspaces, { expectFs: (root) => this.ctx.watcher.fsIdentity(root) });
      for (const s of scans) if (s.error) this.log.warn({ path: s.path, error: s.error, message: s.error_message }, 'workspace scan failed');
      if (c.stopping()) throw new SupervisorError('SHUTTING_DOWN', 'the supervisor is stopping; close again once it has started');
      const sessions = c.sessions().sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
      const complete = tasks.every((t) => t.complete) && sessions.every((s) => s.state === 'ended');
      const { instance, generation, bootId, mode } = this.ctx.identity;
      const receipt = this.ctx.signer.sign<CloseReceipt>({
        version: 1,
        kind: 'close',
        supervisor: { instance, generation, boot_id: bootId, mode },
        sealed: { generation: sealed.generation, sealed_at: sealed.sealed_at },
        closed_at: new Date().toISOString(),
        settle,
        sessions: sessions.map((s) => ({
          session_id: s.id,
          invocation_key: s.req.invocationKey,
          task: s.req.task,
          state: s.state,
          outcome: s.receipt?.outcome ?? null,
          receipt_sha256: s.receipt ? receiptDigest(s.receipt) : null,
        })),
        workspaces: scans,
        tasks,
        complete,
      });
      // Final only when complete: a session unknown, or a task incomplete, is retried by the next close.
      if (complete) {
        // The checkpoint thread's idle write of its stat cache made first: a closed state dir is an archive.
        await c.checkpointsSettled();
        createFileDurable(this.receiptPath, JSON.stringify(receipt, null, 2) + '\n');
      }
      this.log.info(
        { sessions: receipt.sessions.length, terminated: settle.terminated, tasks: tasks.length, complete },
        complete ? 'closed' : 'close incomplete: not final, close again',
      );
      return receipt;
    })();
    const done = this.closing;
    done.then(
      (r) => {
        if (!r.complete && this.closing === done) this.closing = null;
      },
      () => {
        if (this.closing === done) this.closing = null;
      },
    );
    return done;
  }
}
