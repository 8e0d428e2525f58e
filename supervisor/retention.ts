// Retention carried out (the plan is store/retention.ts, a pure function): `sbx gc`, every
// retention.intervalMs, and keep-free (keepFree). Owns the tombstones of sessions removed whole
// (<state>/retired/), by id and by key, so a retired key still answers and never runs again; never touches a
// running or unknown session, nor one of no known task (every task's), never a key record, never a closed
// state dir (an archive).
import { join } from 'node:path';
import type { Logger } from 'pino';
import type { GcResult } from '../ipc/methods.js';
import { STATE } from '../core/state/names.js';
import { receiptDigest } from '../core/receipts/verify.js';
import type { Config } from './config.js';
import type { Session } from './session/session.js';
import { readReceipt } from './store/receipt-file.js';
import { readRetired, removeSessionDir, writeRetired, type TombstoneRecord as RetiredRecord } from './store/records.js';
import { planRetention } from './store/retention.js';
import type { StorageGuard } from './store/storage.js';
import { beginOutputRemoval, finishOutputRemoval } from './store/output-removal.js';
import { byIdOrPrefix } from './session-table.js';

/** What retention needs of the registry. */
export interface RetentionHost {
  sessions(): Iterable<Session>;
  /** Removes a retired session from the registry (by id and key). */
  forget(session: Session): void;
  /** Closed (or closing): an archive, left alone. */
  isClosed(): boolean;
  /** Retention freed space (the status cache of the state dir's size is stale). */
  freed(): void;
}

/** How often keep-free runs at most. */
const KEEP_FREE_EVERY_MS = 1000;

export class Retention {
  /** Sessions the retention policy removed whole, by id and by key. */
  private readonly retired = new Map<string, RetiredRecord>();
  private readonly retiredByKey = new Map<string, RetiredRecord>();
  private timer: NodeJS.Timeout | null = null;
  private keepFreeAt = -Infinity;
  private keepFreeTimer: NodeJS.Timeout | null = null;

  constructor(
    private readonly config: Config,
    private readonly log: Logger,
    private readonly storage: StorageGuard,
    private readonly sessionsDir: string,
    private readonly host: RetentionHost,
  ) {}

  private get retiredDir(): string {
    return join(this.config.stateDir, STATE.retiredDir);
  }

  /**
   * At start: loads the tombstones (an unreadable one is logged and ignored) and finishes the
   * retirements a crash interrupted: a session dir whose tombstone is of its very receipt goes;
   * one whose tombstone is not (a stray tombstone) is kept and the tombstone ignored.
   */
  restore(sessionDirNames: string[]): void {
    const tombstones = readRetired(this.retiredDir);
    for (const e of tombstones.errors) this.log.error(e, 'unreadable tombstone; ignored');
    for (const r of tombstones.records) this.remember(r);
    for (const name of sessionDirNames) {
      const tombstone = this.retired.get(name);
      if (!tombstone) continue;
      let receipt = null;
      try {
        receipt = readReceipt(join(this.sessionsDir, name), name);
      } catch {
        // unreadable: not the receipt the tombstone names
      }
      if (receipt && receiptDigest(receipt) === tombstone.receipt_sha256 && receipt.invocation_key === tombstone.invocation_key) {
        removeSessionDir(this.sessionsDir, name);
        continue;
      }
      this.log.error({ session_id: name }, "a tombstone that is not of this session's receipt; the session is kept and the tombstone ignored");
      this.retired.delete(name);
      if (this.retiredByKey.get(tombstone.invocation_key) === tombstone) this.retiredByKey.delete(tombstone.invocation_key);
    }
  }

  private remember(r: RetiredRecord): void {
    this.retired.set(r.session_id, r);
    this.retiredByKey.set(r.invocation_key, r);
  }

  /** The tombstone of a retired session, by id (or its unique prefix: session-table.ts byIdOrPrefix) or key. */
  tombstone(by: { sessionId?: string; invocationKey?: string }): RetiredRecord | undefined {
    return by.sessionId !== undefined
      ? byIdOrPrefix(this.retired, by.sessionId)
      : by.invocationKey !== undefined
        ? this.retiredByKey.get(by.invocationKey)
        : undefined;
  }

  /** The tasks of every tombstone (undefined: written before tasks, the task default's; null: no known task). */
  retiredTasks(): (string | null | undefined)[] {
    return [...this.retired.values()].map((r) => r.task);
  }

  /** Tombstones of the sessions retired from a task (those written before tasks are the task `default`'s; an unknown task's are every task's). */
  retiredOf(task: string): RetiredRecord[] {
    return [...this.retired.values()].filter((r) => (r.task === undefined ? 'default' : r.task) === task || r.task === null);
  }

  /**
   * Applies the policy now: output of old ended sessions (and while over the total, or under
   * the keep-free target) oldest first; whole sessions past receiptMaxAgeMs, leaving a
   * tombstone. Output first: on a full disk it frees the room a tombstone then needs. One that
   * fails is logged and left for the next run; the rest go on. nowMs is wall-clock time, as
   * the receipts' ended_at that ages are counted from.
   */
  gc(nowMs = Date.now()): GcResult {
    if (this.host.isClosed()) return { removed_output: [], retired: [], freed_bytes: 0, closed: true };
    const sessions = new Map([...this.host.sessions()].map((s) => [s.id, s]));
    const candidates = [...sessions.values()].map((s) => ({
      sessionId: s.id,
      // A session of no known task (its admission record unreadable) is every task's: removed
      // whole, its facts would be gone from every later task's close. It keeps all it has.
      ended: s.state === 'ended' && s.receipt !== null && s.req.task !== null,
      endedAtMs: s.receipt ? Date.parse(s.receipt.ended_at) : 0,
      outputBytes: s.outputBytes(),
      outputRemoved: s.outputRemoved,
    }));
    const plan = planRetention(candidates, this.config.retention, nowMs, { freeBytes: this.storage.freeBytes(), keepFreeBytes: this.storage.keepFreeBytes });
    let freed = 0;
    const removedOutput: string[] = [];
    const retired: string[] = [];
    for (const id of plan.removeOutput) {
      try {
        const s = sessions.get(id)!;
        if (s.state !== 'ended' || s.outputRemoved) continue;
        const bytes = s.outputBytes();
        beginOutputRemoval(s.dir);
        s.outputRemoved = true; // from the rename on, its output is gone to readers
        finishOutputRemoval(s.dir, bytes);
        freed += bytes;
        removedOutput.push(id);
      } catch (err) {
        this.log.error({ err, session_id: id }, 'retention could not remove this output; left for the next run');
      }
    }
    for (const id of plan.retire) {
      const s = sessions.get(id)!;
      const bytes = s.outputBytes();
      const record: RetiredRecord = {
        session_id: s.id,
        invocation_key: s.req.invocationKey,
        command_digest: s.req.commandDigest,
        outcome: s.receipt!.outcome,
        ended_at: s.receipt!.ended_at,
        receipt_sha256: receiptDigest(s.receipt),
        retired_at: new Date(nowMs).toISOString(),
        task: s.req.task,
      };
      try {
        // Tombstone first, then the dir leaves the sessions list in one rename, then its files
        // go: a crash at any point leaves either the session whole or a tombstone of its
        // receipt, and restore() finishes what was started.
        writeRetired(this.retiredDir, record);
        removeSessionDir(this.sessionsDir, s.id);
      } catch (err) {
        this.log.error({ err, session_id: id }, 'retention could not retire this session; left for the next run');
        continue;
      }
      freed += bytes;
      this.host.forget(s);
      this.remember(record);
      retired.push(id);
    }
    if (retired.length || removedOutput.length)
      this.log.info({ removed_output: removedOutput.length, retired: retired.length, freed_bytes: freed }, 'retention applied');
    this.host.freed();
    return { removed_output: removedOutput, retired, freed_bytes: freed };
  }

  /**
   * Keep-free (journald's SystemKeepFree=), called while streams store, when a session ends, when a
   * launch is refused for disk low: when free space in the state dir is below storage.keepFreeBytes,
   * gc(): at most once a second; a call within a second of the last run is deferred to the end of
   * that second, never dropped (the end of the session that held the space must not go unnoticed).
   */
  keepFree(): void {
    if (this.keepFreeTimer) return;
    const waitMs = this.keepFreeAt + KEEP_FREE_EVERY_MS - performance.now();
    if (waitMs > 0) {
      this.keepFreeTimer = setTimeout(() => {
        this.keepFreeTimer = null;
        this.keepFree();
      }, Math.ceil(waitMs));
      this.keepFreeTimer.unref();
      return;
    }
    if (this.storage.freeBytes() >= this.storage.keepFreeBytes) return;
    this.keepFreeAt = performance.now();
    try {
      this.gc();
    } catch (err) {
      this.log.error({ err }, 'retention (keep-free) failed');
    }
  }

  /** Runs gc() every retention.intervalMs (0: never by itself). */
  start(): void {
    const every = this.config.retention.intervalMs;
    if (every <= 0 || this.timer) return;
    this.timer = setInterval(() => {
      try {
        this.gc();
      } catch (err) {
        this.log.error({ err }, 'retention failed');
      }
    }, every);
    this.timer.unref();
  }
}
