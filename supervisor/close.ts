// Seal and close, the join that ends a sandbox's work (README "Seal, close"): the durable seal
// (<state>/seal.json: new keys get ADMISSION_SEALED, a restart does not unseal), then close:
// settle every session (terminate what is left after the timeout, cause close), scan the
// workspaces (workspace/: directory fds, in a worker), and write the signed close receipt
// (<state>/close-receipt.json) once; every later call returns that same receipt.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from 'pino';
import type { SealResult } from '../ipc/methods.js';
import type { CloseReceipt, WorkspaceScan } from '../ipc/protocol.js';
import { readRecord, STATE, type SealRecord } from '../ipc/state-layout.js';
import { receiptDigest } from '../ipc/verify.js';
import type { SessionContext } from './session/context.js';
import { isLive, isSettled } from './session/lifecycle.js';
import type { Session } from './session/session.js';
import { createFileDurable, writeFileDurable } from './store/durable.js';
import type { CloseDigest } from './workspace/digest.js';
import { setDeadline } from './timers.js';
import { scanInWorker } from './workspace/scan.js';

export type { CloseReceipt } from '../ipc/protocol.js';

/** Scans one directory tree off the event loop; never rejects: a failure is `error` + `digest: null`. */
export async function scanWorkspace(root: string, options: { deadlineMs?: number } = {}): Promise<WorkspaceScan> {
  const reply = await scanInWorker<CloseDigest>(root, 'close', options);
  if (reply.ok) return { path: root, ...reply.result };
  return { path: root, files: 0, total_bytes: 0, newest_mtime: null, digest: null, error: reply.code, error_message: reply.message };
}

/** Scans the workspaces one after another (one walk, one worker at a time), in the order given. */
export async function scanWorkspaces(roots: string[], options: { deadlineMs?: number } = {}): Promise<WorkspaceScan[]> {
  const scans: WorkspaceScan[] = [];
  for (const root of roots) scans.push(await scanWorkspace(root, options));
  return scans;
}


/** The seal and the close receipt of one state dir. */
export class Closing {
  /** Admission sealed, and since which generation (null: open). */
  seal: SealRecord | null;
  private closing: Promise<CloseReceipt> | null = null;

  constructor(private readonly ctx: SessionContext, private readonly log: Logger) {
    this.seal = this.readSeal();
  }

  private get sealPath(): string {
    return join(this.ctx.config.stateDir, STATE.seal);
  }

  private get receiptPath(): string {
    return join(this.ctx.config.stateDir, STATE.closeReceipt);
  }

  /** Closed, or closing now: the state dir is an archive. */
  get closed(): boolean {
    return this.closing !== null || existsSync(this.receiptPath);
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
   * Close is a join: seal, let every live session end by itself for up to timeoutMs,
   * terminate the rest (TERM, grace, KILL; cause close), wait until each is settled (a
   * session that lost its evidence never gets a receipt, and is listed as unknown rather
   * than waited for), scan the workspaces, and write the signed close receipt. Calling it
   * again, even after a restart, returns the same close receipt.
   */
  close(sessions: () => Session[], timeoutMs: number, workspaces: string[]): Promise<CloseReceipt> {
    if (existsSync(this.receiptPath)) return Promise.resolve(readRecord('closeReceipt', this.receiptPath));
    this.closing ??= (async () => {
      const sealed = this.sealNow();
      const live = sessions().filter((s) => isLive(s.state));
      this.log.info({ sessions: live.length, timeout_ms: timeoutMs }, 'closing: settling sessions');
      const allSettled = Promise.all(live.map((s) => s.settled()));
      // setDeadline: a timeout past setTimeout's 2^31-1 ms (24.8 days; 30 are allowed) would fire at once.
      let cancel: () => void = () => {};
      const timedOut = await Promise.race([allSettled.then(() => false), new Promise<boolean>((r) => (cancel = setDeadline(() => r(true), timeoutMs)))]);
      cancel();
      const rest = timedOut ? live.filter((s) => !isSettled(s.state)) : [];
      await Promise.all(rest.map((s) => s.terminate('close')));
      await allSettled;
      const scans = await scanWorkspaces(workspaces);
      for (const s of scans) if (s.error) this.log.warn({ path: s.path, error: s.error, message: s.error_message }, 'workspace scan failed');
      const { instance, generation, bootId, mode } = this.ctx.identity;
      const receipt = this.ctx.signer.sign<CloseReceipt>({
        version: 1,
        kind: 'close',
        supervisor: { instance, generation, boot_id: bootId, mode },
        sealed: { generation: sealed.generation, sealed_at: sealed.sealed_at },
        closed_at: new Date().toISOString(),
        settle: { timeout_ms: timeoutMs, terminated: rest.length },
        sessions: sessions()
          .sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0))
          .map((s) => ({ session_id: s.id, invocation_key: s.req.invocationKey, state: s.state, outcome: s.receipt?.outcome ?? null, receipt_sha256: s.receipt ? receiptDigest(s.receipt) : null })),
        workspaces: scans,
      });
      createFileDurable(this.receiptPath, JSON.stringify(receipt, null, 2) + '\n');
      this.log.info({ sessions: receipt.sessions.length, terminated: rest.length }, 'closed');
      return receipt;
    })();
    this.closing.catch(() => (this.closing = null));
    return this.closing;
  }
}
