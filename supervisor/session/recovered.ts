// A session found in the state dir at start: ended (its receipt is on disk) or unknown (the
// supervisor that ran it is gone) until reconciliation finds evidence (evidence.ts): another
// boot, or its cgroup leaf ended with the same escalation as a live session (escalation.ts)
// and then read empty. A recovered session never spawns and has no leader, drains or stdin:
// its streams are what is on disk. What every session has is session.ts.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { DEFAULT_TASK, type Receipt, type StreamName, type TerminationCause } from '../../ipc/protocol.js';
import { OUTPUT_REMOVED_FILE } from '../../core/state/names.js';
import { storedChunks } from '../../core/state/stream-files.js';
import { CgroupLeaf, continuePids } from '../cgroup.js';
import { readStarted, type AdmissionRecord } from '../store/records.js';
import type { SessionContext, SessionRequest } from './context.js';
import { escalate, type EscalationStep } from './escalation.js';
import { bootChanged, cgroupEmpty, recoveredCourse } from './evidence.js';
import { RECEIPT_RETRY_FIRST_MS, Session } from './session.js';
import { ALL_STREAMS } from '../../core/state/names.js';
import { finishOutputRemoval, outputRemovalBegun } from '../store/output-removal.js';

export class RecoveredSession extends Session {
  /** Durable bytes per stream on disk (what the supervisor that drained them stored). */
  private readonly restoredCursors = new Map<StreamName, number>();
  /** While reconciliation waits out the grace of a recovered leaf: ends that wait (KILL now). */
  private cutGrace: (() => void) | null = null;

  private constructor(id: string, req: SessionRequest, ctx: SessionContext, admittedAt: Date, receipt: Receipt | null) {
    super(id, req, ctx, admittedAt, receipt ? 'ended' : 'unknown');
  }

  /**
   * A session found with its admission record: ended if it has a receipt, else unknown
   * until reconcile() finds evidence. Finishes an output removal a crash interrupted and
   * removes the empty leaf of an ended one.
   */
  static fromRecords(record: AdmissionRecord, receipt: Receipt | null, ctx: SessionContext): RecoveredSession {
    const req: SessionRequest = {
      argv: record.argv,
      cwd: record.cwd,
      env: record.env,
      leaderEnv: {},
      invocationKey: record.invocation_key,
      commandDigest: record.command_digest,
      timeoutMs: record.timeout_ms,
      graceMs: record.grace_ms,
      linger: record.linger,
      chunkBytes: record.chunk_bytes,
      user: record.user ?? null,
      sessionUser: null,
      pty: record.pty ?? null,
      stdin: record.stdin ?? 'null',
      task: record.task ?? DEFAULT_TASK,
      service: record.service ?? null,
    };
    const session = new RecoveredSession(record.session_id, req, ctx, new Date(record.admitted_at), receipt);
    session.admission = record;
    const removing = outputRemovalBegun(session.dir);
    session.outputRemoved = removing || existsSync(join(session.dir, OUTPUT_REMOVED_FILE));
    if (removing) {
      try {
        finishOutputRemoval(session.dir, null);
      } catch (err) {
        ctx.log.warn({ err, session_id: session.id }, 'could not finish removing output a crash interrupted');
      }
    }
    if (record.cgroup) session.leaf = new CgroupLeaf(record.cgroup);
    // The streams it was admitted with, whether or not it got to open them (a crash between
    // admission and spawn leaves none on disk: they are empty, and a retry replays nothing).
    for (const stream of [...session.declaredStreams(), ...ALL_STREAMS.filter((s) => existsSync(session.streamDir(s)))]) {
      session.restoredCursors.set(stream, receipt ? 0 : storedChunks(session.dir, stream, req.chunkBytes).final_cursor);
    }
    if (receipt) {
      session.restoreEnded(receipt);
      // Death was proven before the receipt was written: a leaf a crash left behind is empty.
      session.removeLeftoverLeaf();
    } else {
      const started = readStarted(session.dir);
      session.startedAt = started ? new Date(started.started_at) : null;
      session.unknownReason = 'the supervisor restarted while the session ran (owner lost); reconciling';
    }
    return session;
  }

  /**
   * A session whose files could not be read at start: unknown with the reason, so its key
   * (if known) is blocked and nothing else is affected. Its leaf, if any, is found by its id:
   * what runs there is still ours to end. With its receipt (readable, signed by this
   * supervisor): ended, in the task the receipt names (none named: unknown, every task's).
   */
  static broken(sessionId: string, key: string, reason: string, ctx: SessionContext, receipt: Receipt | null = null): RecoveredSession {
    const req: SessionRequest = {
      argv: [],
      cwd: '/',
      env: {},
      leaderEnv: {},
      invocationKey: key,
      commandDigest: '',
      timeoutMs: 0,
      graceMs: ctx.config.session.defaultGraceMs,
      linger: 'kill',
      chunkBytes: ctx.config.drain.chunkBytes,
      user: null,
      sessionUser: null,
      pty: null,
      stdin: 'null',
      task: typeof receipt?.task === 'string' ? receipt.task : null,
      service: receipt?.service ?? null,
    };
    const session = new RecoveredSession(sessionId, req, ctx, receipt?.admitted_at ? new Date(receipt.admitted_at) : new Date(), receipt);
    if (receipt) {
      session.restoreEnded(receipt);
      return session;
    }
    session.unknownReason = reason;
    if (ctx.tree) {
      const leaf = join(ctx.tree.sessionsPath, sessionId);
      if (existsSync(leaf)) session.leaf = new CgroupLeaf(leaf);
    }
    return session;
  }

  private removeLeftoverLeaf(): void {
    if (this.leaf && existsSync(this.leaf.path)) {
      this.leaf.remove().catch((err: Error) => this.ctx.log.warn({ err, session_id: this.id }, 'could not remove the cgroup of an ended session'));
    }
  }

  protected storedCursor(stream: StreamName): number | undefined {
    return this.restoredCursors.get(stream);
  }

  /** Nothing of it is the supervisor's to terminate but through reconciliation (or cancelRecovered). */
  terminate(_cause: TerminationCause): Promise<void> {
    return Promise.resolve();
  }

  /** Sends sig to what runs in its leaf (a recovered session has no leader, but its leaf is ours). */
  async signal(signal: NodeJS.Signals): Promise<number> {
    return this.leaf && this.state === 'unknown' ? this.leaf.signalAll(signal).size : 0;
  }

  /**
   * `sbx cancel` of a recovered session reconciliation is ending (TERM sent): its KILL comes
   * after graceMs (0: now) instead of the rest of its grace. False when nothing of the kind
   * is under way (an unknown session with no evidence to come: nothing to cancel).
   */
  override cancelRecovered(graceMs: number): boolean {
    const cut = this.cutGrace;
    if (this.state !== 'unknown' || !cut) return false;
    if (graceMs > 0) setTimeout(cut, graceMs).unref();
    else cut();
    return true;
  }

  /**
   * After a restart: find evidence for an unknown session and write its owner_lost receipt.
   * boot_id changed → boot_changed; cgroup populated → TERM, grace, cgroup.kill, then
   * cgroup_empty; cgroup empty or gone → cgroup_empty as observed now. Without a cgroup
   * (subreaper mode) there is no evidence: the session stays unknown. The decision and its
   * first step are taken synchronously, before the first await (the caller relies on it to
   * open admission at once); the promise settles when the session has (or stays without) a
   * receipt, which for a TERM-ignoring leaf is only after its grace.
   */
  async reconcile(): Promise<void> {
    try {
      await this.settleRecovered();
    } catch (err) {
      this.receiptOnItsWay = false;
      this.unknownReason = `reconciliation failed: ${(err as Error).message}`;
      this.checkStanding();
      throw err;
    }
  }

  /** reconcile()'s decisions, in order (see there). */
  private async settleRecovered(): Promise<void> {
    if (this.state !== 'unknown' || this.receiptAwaitingSpace) return;
    if (!this.admission) {
      // Torn files: no receipt can be written, but nothing of it may run on unowned.
      if (this.leaf?.populated()) {
        const reason = this.unknownReason;
        await this.endLeaf([]);
        this.unknownReason = `${reason}; its processes were ended (TERM, then KILL)`;
      }
      return;
    }
    const mount = this.ctx.tree?.mount.mountPoint ?? null;
    const course = recoveredCourse({
      admittedBootId: this.admission.boot_id,
      bootId: this.ctx.identity.bootId,
      leafPath: this.leaf?.path ?? null,
      mountPoint: mount,
    });
    if (course.kind === 'no_evidence') {
      this.unknownReason = course.reason;
      return;
    }
    this.receiptOnItsWay = true;
    if (course.kind === 'boot_changed') {
      await this.finish(await this.ownerLostFacts(bootChanged(new Date()), []));
      return;
    }
    const steps: EscalationStep[] = [];
    if (existsSync(course.leafPath) && this.leaf!.populated()) await this.endLeaf(steps);
    // Nothing watched its leaf while it had no owner: an escape then would not be known.
    await this.finish(await this.ownerLostFacts({ ...cgroupEmpty(course.leafPath, mount!, new Date()), escapeWatch: 'unavailable' }, steps));
  }

  /**
   * The escalation on the leaf (TERM, the session's grace, cgroup.kill), with the steps
   * recorded. The TERM goes out before the first await, so reconciliation's decision is in
   * effect at once, and ps says what is being done meanwhile.
   */
  private async endLeaf(steps: EscalationStep[]): Promise<void> {
    const leaf = this.leaf!;
    const reason = this.unknownReason;
    const cut = new Promise<void>((resolve) => (this.cutGrace = resolve));
    await escalate(
      {
        term: () => {
          const pids = leaf.signalAll('SIGTERM');
          continuePids(pids);
          return pids.size;
        },
        waitDead: (timeoutMs) => leaf.waitEmpty(timeoutMs),
        killAll: async (killed) => {
          if (!leaf.populated()) return;
          killed(leaf.pids().length);
          leaf.kill();
          await leaf.waitEmpty(null);
        },
      },
      this.req.graceMs,
      (step) => {
        steps.push(step);
        if (step.signal === 'SIGTERM')
          this.unknownReason = `${reason}; being ended: SIGTERM sent to ${step.pids} processes at ${step.at.toISOString()}, cgroup.kill after its grace of ${this.req.graceMs} ms`;
      },
      cut,
    );
    this.cutGrace = null;
  }

  /**
   * After a restart: the receipt rebuilt from the facts record a crash left in the
   * reservation (the disk had no room for the whole receipt); it is written as soon as there
   * is room, and reconciliation leaves the session alone (its evidence is known).
   */
  resumeReceipt(receipt: Receipt): void {
    // Death was proven before the facts were written: a leaf a crash left behind is empty.
    this.removeLeftoverLeaf();
    this.receiptAwaitingSpace = receipt;
    this.unknownReason =
      'its receipt (its facts were kept in its reservation across a restart) waits for space in the state dir; the write is retried until space returns';
    this.publish(receipt, new Date(receipt.ended_at), RECEIPT_RETRY_FIRST_MS);
  }
}
