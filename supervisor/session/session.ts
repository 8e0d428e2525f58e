// What every session has, live or recovered after a restart: its id, request and dir, its lifecycle
// (lifecycle.ts: the one place its state changes), its streams as stored, its receipt, output removal for
// retention, its summary, and an operator's word for a session stuck unknown. What only a live session has
// (leader, drains, stdin, pty) is live.ts; what only a recovered one does (reconciliation) is recovered.ts.
// Not the registry, not the socket.
import { EventEmitter } from 'node:events';
import { existsSync, lstatSync, mkdirSync, readdirSync, renameSync } from 'node:fs';
import { join } from 'node:path';
import { SupervisorError } from '../../ipc/errors.js';
import type { Receipt, SessionState, SessionSummary, StreamName, StreamOutput, TerminationCause } from '../../ipc/protocol.js';
import { RECEIPT_FILE, unreadableName } from '../../core/state/names.js';
import { indexDigest, storedChunks } from '../../core/state/stream-files.js';
import { receiptDigest } from '../../core/receipts/verify.js';
import type { CgroupLeaf } from '../cgroup.js';
import { existsNoFollow, factsOf, writeReceiptFile, writeReservedFacts } from '../store/receipt-file.js';
import { fsyncDir } from '../../core/fs/durable.js';
import type { ReadRecord } from '../store/chunks.js';
import { readEscapeAttested, writeEscapeAttested, type AdmissionRecord, type EscapeAttestedRecord } from '../store/records.js';
import type { OperatorAttestation, SessionContext, SessionRequest } from './context.js';
import { operatorAttested, type DeathFacts } from './evidence.js';
import { stillEscaped } from './escape.js';
import { isSettled, Lifecycle, type InitialState } from './lifecycle.js';
import { buildReceipt, type ReceiptFacts } from './receipt.js';
import { errnoCode } from '../../ipc/errno.js';
import { ALL_STREAMS } from '../../core/state/names.js';

/** First and longest wait between attempts to write a receipt the disk had no room for. */
export const RECEIPT_RETRY_FIRST_MS = 1000;
/** Errors a receipt write is retried after (the resource comes back), with what they mean; any other is for good. */
const TRANSIENT_WRITE_ERRORS: Record<string, string> = {
  ENOSPC: 'no space in the state dir',
  EDQUOT: 'over the disk quota of the state dir',
  EMFILE: 'the supervisor has no file descriptor left (RLIMIT_NOFILE)',
  ENFILE: 'the system has no file descriptor left',
  ENOMEM: 'out of kernel memory',
};
const RECEIPT_RETRY_MAX_MS = 10_000;

export abstract class Session extends EventEmitter {
  readonly dir: string;
  private readonly lifecycle: Lifecycle;
  receipt: Receipt | null = null;
  startedAt: Date | null = null;
  leaderExitedAt: Date | null = null;
  endedAt: Date | null = null;
  /** Why the session is unknown (state "unknown"), for ps and logs. */
  unknownReason: string | null = null;
  /** The admission record as written (null until admitted, or unreadable). */
  admission: AdmissionRecord | null = null;
  /** The retention policy removed this session's output (its receipt stays). */
  outputRemoved = false;
  /** Resolves with the receipt once it is durable; never rejects. */
  readonly ended: Promise<Receipt | null>;
  private resolveEnded!: (r: Receipt | null) => void;
  protected leaf: CgroupLeaf | null = null;

  /** Whether the session has a cgroup leaf (signals reach every process in it, unknown or not); false in subreaper mode. */
  get hasCgroup(): boolean {
    return this.leaf !== null;
  }
  /** A signed receipt whose write the disk had no room for: retried until it is durable. */
  protected receiptAwaitingSpace: Receipt | null = null;
  /** Evidence (or an operator's word) is being turned into a receipt: one receipt per session, ever. */
  protected receiptOnItsWay = false;

  /** What endedOrStuck() hands out: one promise for every waiter, settled (and dropped) by checkStanding. */
  private standing: { promise: Promise<void>; resolve: () => void } | null = null;

  /** A receipt is on its way (evidence being written up, or a write waiting for space): ps's receipt_pending while unknown. */
  private get receiptPending(): boolean {
    return this.receiptOnItsWay || this.receiptAwaitingSpace !== null;
  }

  /**
   * Unknown with no receipt on its way (ps shows no receipt_pending): only new evidence or an
   * operator (sbx resolve) ends it.
   */
  get unknownWithoutReceipt(): boolean {
    return this.state === 'unknown' && !this.receiptPending;
  }

  /**
   * Resolves once the session has its receipt or is unknown with none on its way (now: at once).
   * One promise shared by every waiter (a wait with unknown "fail"), so a thousand waits cost one
   * promise, not a listener each; a waiter that went away leaves nothing behind once it settles.
   */
  endedOrStuck(): Promise<void> {
    if (this.state === 'ended' || this.unknownWithoutReceipt) return Promise.resolve();
    if (!this.standing) {
      let resolve!: () => void;
      const promise = new Promise<void>((r) => (resolve = r));
      this.standing = { promise, resolve };
    }
    return this.standing.promise;
  }

  /** Settles endedOrStuck()'s promise when the session has ended or is stuck unknown: called on each state change and wherever receipt_pending changes. */
  protected checkStanding(): void {
    if (!this.standing || (this.state !== 'ended' && !this.unknownWithoutReceipt)) return;
    this.standing.resolve();
    this.standing = null;
  }

  constructor(
    readonly id: string,
    readonly req: SessionRequest,
    protected readonly ctx: SessionContext,
    readonly admittedAt: Date,
    initial: InitialState,
  ) {
    super();
    this.setMaxListeners(0);
    this.dir = join(ctx.sessionsDir, id);
    this.ended = new Promise((resolve) => (this.resolveEnded = resolve));
    this.lifecycle = new Lifecycle(initial, (from, to) => {
      ctx.log.debug({ session_id: id, from, to }, 'session state');
      this.emit('state', to);
      this.checkStanding();
    });
  }

  get state(): SessionState {
    return this.lifecycle.state;
  }

  protected transition(next: SessionState): void {
    this.lifecycle.to(next);
  }

  /** A session found ended at start: its receipt is the one on disk. */
  protected restoreEnded(receipt: Receipt): void {
    this.receipt = receipt;
    this.startedAt = receipt.started_at ? new Date(receipt.started_at) : null;
    this.leaderExitedAt = receipt.leader_exited_at ? new Date(receipt.leader_exited_at) : null;
    this.endedAt = new Date(receipt.ended_at);
    this.resolveEnded(receipt);
  }

  // --- What a live session does; these are the answers of a session with no process of ours.

  /** The pid of its shim, while one runs. */
  get pid(): number | null {
    return null;
  }

  /** Bytes of stdin accepted so far (sessions started with --stdin). */
  get stdinCursor(): number {
    return 0;
  }

  /** Ends every process of the session (TERM, grace, KILL); the first cause is the receipt's. */
  abstract terminate(cause: TerminationCause, graceMs?: number): Promise<void>;

  /** Sends sig to every process of the session; resolves with how many pids it reached. */
  abstract signal(signal: NodeJS.Signals): Promise<number>;

  /** Stdin bytes at an offset (stdin.ts); only a live session started with --stdin takes them. */
  write(_data: Buffer, _offset: number | undefined, _eof: boolean, _writer?: string): Promise<number> {
    return Promise.reject(
      new SupervisorError(
        'INVALID_ARGUMENT',
        `session ${this.id} takes no stdin: ${this.req.stdin === 'stream' ? 'its stdin went with the supervisor that ran it' : 'it was not started with --stdin'}`,
      ),
    );
  }

  /** The pty's size; only a live pty session has one. */
  resize(_cols: number, _rows: number): void {
    throw new SupervisorError('INVALID_ARGUMENT', `session ${this.id} has no live pty`);
  }

  /** sbx cancel of a recovered session being ended (recovered.ts); false: nothing of the kind. */
  cancelRecovered(_graceMs: number): boolean {
    return false;
  }

  // --- Streams as stored.

  /** The streams it was admitted with (none for a session whose admission is unreadable). */
  protected declaredStreams(): StreamName[] {
    if (this.req.argv.length === 0) return [];
    return this.req.pty ? ['pty'] : ['stdout', 'stderr'];
  }

  /** Stored bytes of a stream that is not in the receipt (a live drain's cursor, or what is on disk). */
  protected abstract storedCursor(stream: StreamName): number | undefined;

  /** Stored bytes of a stream so far. */
  cursor(stream: StreamName): number {
    return this.receipt?.output[stream]?.final_cursor ?? this.storedCursor(stream) ?? 0;
  }

  /** Whether a stream will never grow again (a live session's drain may still be open). */
  streamFinal(_stream: StreamName): boolean {
    return true;
  }

  /**
   * Index records not yet in index.bin whose bytes are stored, from the one ending past
   * `from` (at most limit), and the arrival of the first read whose bytes are not stored yet
   * (null: none): only a live drain has any (StreamLog.pendingRecords).
   */
  pendingIndex(_stream: StreamName, _from: number, _limit: number): { records: ReadRecord[]; unstoredAtUs: number | null } {
    return { records: [], unstoredAtUs: null };
  }

  /** Whether the session has (or was admitted with) that stream; one that never got to open it reads as empty. */
  hasStream(stream: StreamName): boolean {
    return this.declaredStreams().includes(stream) || this.storedCursor(stream) !== undefined || this.receipt?.output[stream] !== undefined;
  }

  /** Directory of a stream's chunk files and index. */
  streamDir(stream: StreamName): string {
    return join(this.dir, stream);
  }

  /** Bytes of this session's stream files on disk (chunk files and index). */
  outputBytes(): number {
    if (this.outputRemoved) return 0;
    let bytes = 0;
    for (const stream of ALL_STREAMS) {
      const dir = this.streamDir(stream);
      if (!existsSync(dir)) continue;
      for (const name of readdirSync(dir)) {
        try {
          bytes += lstatSync(join(dir, name)).size;
        } catch {
          // gone meanwhile
        }
      }
    }
    return bytes;
  }

  /** Live processes in the session now (cgroup mode), else null. */
  livePids(): number | null {
    return this.leaf && this.state !== 'ended' ? this.leaf.pids().length : null;
  }

  summary(): SessionSummary {
    const cursors: Partial<Record<StreamName, number>> = {};
    for (const s of ALL_STREAMS) if (this.hasStream(s)) cursors[s] = this.cursor(s);
    return {
      session_id: this.id,
      invocation_key: this.req.invocationKey,
      task: this.req.task,
      state: this.state,
      argv: this.req.argv,
      pid: this.pid,
      admitted_at: this.admittedAt.toISOString(),
      started_at: this.startedAt?.toISOString() ?? null,
      ended_at: this.endedAt?.toISOString() ?? null,
      outcome: this.receipt?.outcome ?? null,
      exit: this.receipt ? { code: this.receipt.exit.code, signal: this.receipt.exit.signal } : null,
      termination_cause: this.receipt?.termination.cause ?? null,
      user: this.req.user,
      live_pids: this.livePids(),
      cursors,
      usage: this.receipt?.usage ?? this.leaf?.usage() ?? {},
      ...(this.unknownReason ? { reason: this.unknownReason } : {}),
      ...(this.state === 'unknown' && this.receiptPending ? { receipt_pending: true as const } : {}),
      ...(this.req.service ? { service: { ...this.req.service } } : {}),
      ...(this.receipt?.handed_off ? { handed_off_to: this.receipt.handed_off.service_id } : {}),
      ...(this.receipt?.death.evidence === 'cgroup_escaped' ? { escaped: this.escapeAttested() ? ('attested' as const) : ('unproven' as const) } : {}),
    };
  }

  /** Resolves once the session is settled: a receipt, or unknown (no receipt without evidence). */
  settled(): Promise<void> {
    if (isSettled(this.state)) return Promise.resolve();
    return new Promise((resolve) => {
      const onState = (state: SessionState) => {
        if (!isSettled(state)) return;
        this.off('state', onState);
        resolve();
      };
      this.on('state', onState);
    });
  }

  // --- The receipt.

  /** What every receipt of this session says about what was admitted, and by whom. */
  protected identityFacts() {
    return {
      sessionId: this.id,
      invocationKey: this.req.invocationKey,
      task: this.req.task,
      commandDigest: this.req.commandDigest,
      argv: this.req.argv,
      cwd: this.req.cwd,
      user: this.req.user,
      uid: this.admission?.uid ?? null,
      gid: this.admission?.gid ?? null,
      limits: this.admission?.limits,
      supervisor: this.ctx.identity,
      admittedAt: this.admittedAt,
      service: this.req.service,
    };
  }

  /**
   * Receipt facts of a session whose leader nobody watched end (reconciliation, an operator's
   * word): exit unknown; each stream it was admitted with (or has on disk) as it is on disk,
   * hashed by the hashing threads (never here: it may be gigabytes).
   */
  protected async ownerLostFacts(death: DeathFacts, steps: ReceiptFacts['steps']): Promise<ReceiptFacts> {
    const output: Partial<Record<StreamName, StreamOutput>> = {};
    const streams = new Set([...this.declaredStreams(), ...ALL_STREAMS.filter((s) => existsSync(this.streamDir(s)))]);
    for (const stream of streams) {
      const { final_cursor, chunks } = storedChunks(this.dir, stream, this.req.chunkBytes);
      const sha256 = await this.ctx.hashPool.stream(this.streamDir(stream), this.req.chunkBytes).digest(final_cursor);
      output[stream] = {
        final_cursor,
        sha256,
        complete: false,
        reason: 'owner_lost',
        dropped_bytes: 0,
        drain_end: 'lost',
        index_sha256: indexDigest(this.dir, stream),
        chunks,
      };
    }
    return {
      ...this.identityFacts(),
      // Known only when the started record survived: the command started then.
      startedAt: this.startedAt,
      leaderExitedAt: null,
      endedAt: new Date(),
      exit: { code: null, signal: null },
      spawnFailure: null,
      cause: 'reconcile',
      steps,
      death,
      output,
      usage: {},
      descendantsTerminated: steps.length ? steps[0].pids : 0,
      // Its events were another listener's (or this one lost it): each workspace is a gap with a scan.
      workspace: await this.ctx.watcher.restartEntries(),
    };
  }

  /**
   * Writes the receipt durably, then (only then) reports the end and removes the leaf: built from facts,
   * signed, made durable into the space reserved at admission (publish), then reported.
   */
  protected async finish(facts: ReceiptFacts, extra: Partial<Receipt> = {}): Promise<void> {
    const receipt = this.ctx.signer.sign({ ...buildReceipt(facts), ...extra });
    this.publish(receipt, facts.endedAt, RECEIPT_RETRY_FIRST_MS);
    // Death was proven either way: the empty leaf goes.
    if (this.leaf) {
      try {
        await this.leaf.remove();
      } catch (err) {
        this.ctx.log.warn({ err, session_id: this.id }, 'could not remove the session cgroup');
      }
    }
  }

  /**
   * Makes the receipt durable (into the space reserved at admission: store/receipt-file.ts), then
   * ends the session. No room (a receipt that outgrew its reservation on a full disk), or no
   * fd or memory left (EMFILE, ENFILE, ENOMEM): its facts go into the reservation in place, the
   * session is unknown meanwhile with the reason, and the write is tried again with a growing
   * pause until it succeeds. Anything else
   * already where the receipt goes (a planted link: EEXIST) fails closed: unknown, never
   * written through. One receipt per session: a later writer never unsettles an ended one.
   */
  protected publish(receipt: Receipt, endedAt: Date, retryMs: number): void {
    if (this.state === 'ended') return;
    try {
      writeReceiptFile(this.dir, JSON.stringify(receipt) + '\n');
    } catch (err) {
      const code = errnoCode(err) ?? '';
      const why = TRANSIENT_WRITE_ERRORS[code];
      if (!why) {
        // For good: nothing is on its way any more (an operator may resolve it).
        this.receiptAwaitingSpace = null;
        this.receiptOnItsWay = false;
        this.becomeUnknown(`the receipt could not be written: ${(err as Error).message}`);
        return;
      }
      // Pending before it is unknown: a wait with unknown "fail" must never see it stuck.
      const first = !this.receiptAwaitingSpace;
      this.receiptAwaitingSpace = receipt;
      if (first) {
        // Its facts, small and without the lists the disk gives back, go into the reservation
        // in place (no block allocated), so a crash meanwhile loses nothing either.
        let kept = 'in memory';
        try {
          writeReservedFacts(this.dir, JSON.stringify(this.ctx.signer.sign(factsOf(receipt))));
          kept = 'in its reservation';
        } catch (factsErr) {
          this.ctx.log.warn({ session_id: this.id, code: errnoCode(factsErr) }, "could not keep the receipt's facts in its reservation");
        }
        this.becomeUnknown(
          `the receipt could not be written (${code}: ${why}); its facts are kept ${kept} and the write is retried until ${code === 'ENOSPC' || code === 'EDQUOT' ? 'space returns' : 'it succeeds'}`,
        );
      }
      setTimeout(() => this.publish(receipt, endedAt, Math.min(retryMs * 2, RECEIPT_RETRY_MAX_MS)), retryMs).unref();
      return;
    }
    this.receiptAwaitingSpace = null;
    this.receipt = receipt;
    this.endedAt = endedAt;
    this.unknownReason = null;
    this.transition('ended');
    this.resolveEnded(receipt);
    for (const stream of ALL_STREAMS) this.emit('output', stream);
  }

  /** No evidence of death (yet): unknown with the reason, never failed. */
  protected becomeUnknown(reason: string): void {
    this.ctx.log.warn({ session_id: this.id, reason }, 'session is unknown: no evidence of death');
    this.unknownReason = reason;
    if (this.state !== 'unknown') this.transition('unknown');
    else this.checkStanding();
  }

  /** The operator's word that what this session's receipt says escaped its cgroup is ended (null: none; unreadable: none, logged). */
  escapeAttested(): EscapeAttestedRecord | null {
    try {
      return readEscapeAttested(this.dir);
    } catch (err) {
      this.ctx.log.error({ session_id: this.id, err }, 'the escape attestation is unreadable: not counted');
      return null;
    }
  }

  /** The escape attestation bound to this session's receipt, as a receipt answer shows it (null: none). */
  escapeAttestedAnswer(): { uid: number; pid: number; reason: string; attested_at: string } | null {
    if (!this.receipt || this.receipt.death.evidence !== 'cgroup_escaped') return null;
    const a = this.escapeAttested();
    if (!a || a.receipt_sha256 !== receiptDigest(this.receipt)) return null;
    return { uid: a.uid, pid: a.pid, reason: a.reason, attested_at: a.attested_at };
  }

  /**
   * Records an operator's word that the processes an ended session's receipt says left its
   * cgroup (death evidence cgroup_escaped) are ended: complete(task) then counts it, showing
   * the word. Refused while a destination the receipt names still holds processes, unless
   * forced. The receipt stays as it is; returned.
   */
  private attestEscape(receipt: Receipt, operator: OperatorAttestation): Receipt {
    if (this.escapeAttested()) throw new SupervisorError('INVALID_ARGUMENT', `session ${this.id}'s escape is attested already`);
    const live = stillEscaped(receipt.death.escapes ?? []);
    if (live.length > 0 && !operator.force) {
      throw new SupervisorError(
        'INVALID_ARGUMENT',
        `session ${this.id}: what left its cgroup still runs (${live.join('; ')}): end it first, or attest anyway with --force`,
        { still_running: live },
      );
    }
    writeEscapeAttested(this.dir, {
      session_id: this.id,
      receipt_sha256: receiptDigest(receipt),
      uid: operator.uid,
      pid: operator.pid,
      reason: operator.reason,
      attested_at: new Date().toISOString(),
    });
    return receipt;
  }

  /** Ends an unknown session on an operator's word: evidence operator_attested, never automatic; or attests an ended session's escape (attestEscape). */
  async resolveAsOperator(operator: OperatorAttestation): Promise<Receipt> {
    if (this.state === 'ended' && this.receipt?.death.evidence === 'cgroup_escaped') return this.attestEscape(this.receipt, operator);
    if (this.state !== 'unknown')
      throw new SupervisorError('INVALID_ARGUMENT', `session ${this.id} is ${this.state}; only an unknown session can be resolved by an operator`);
    if (this.receiptAwaitingSpace) {
      throw new SupervisorError(
        'INVALID_ARGUMENT',
        `session ${this.id} ended with evidence; its receipt waits for space in the state dir and is written once there is room (free some space)`,
      );
    }
    if (this.receiptOnItsWay) {
      throw new SupervisorError(
        'INVALID_ARGUMENT',
        `session ${this.id} has evidence on its way (${this.unknownReason ?? 'reconciling'}); its receipt follows (sbx wait ${this.id}), nothing is left to attest`,
      );
    }
    if (this.leaf?.populated()) {
      throw new SupervisorError(
        'INVALID_ARGUMENT',
        `session ${this.id} still has ${this.leaf.pids().length} processes in its cgroup; nothing is attested over a live session`,
      );
    }
    this.receiptOnItsWay = true;
    try {
      // A key record naming a session whose directory is gone (restore.ts): the operator's
      // receipt is its only record, in a directory made for it.
      if (!existsSync(this.dir)) {
        mkdirSync(this.dir, { mode: 0o700 });
        fsyncDir(this.ctx.sessionsDir);
      }
      // Whatever is where the receipt goes (an unreadable receipt, a planted link: lstat, never
      // followed; rename moves the name) is kept beside, never silently replaced.
      const torn = join(this.dir, RECEIPT_FILE);
      if (existsNoFollow(torn)) renameSync(torn, join(this.dir, unreadableName(RECEIPT_FILE, Date.now())));
      await this.finish(await this.ownerLostFacts(operatorAttested(new Date()), []), {
        operator: { uid: operator.uid, pid: operator.pid, reason: operator.reason, unknown_reason: this.unknownReason },
      });
    } finally {
      this.receiptOnItsWay = false;
      this.checkStanding();
    }
    if (!this.receipt) throw new SupervisorError('INTERNAL', `session ${this.id}: the operator's receipt could not be written: ${this.unknownReason}`);
    return this.receipt;
  }
}
