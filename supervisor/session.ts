// One session: a launched command and everything it spawns, from admission to receipt.
// Every state transition lives here (SPEC.md "Session lifecycle"): admitted → running →
// leader_exited → terminating → ended, or unknown when death cannot be proven. Owns the
// leader, its cgroup leaf, the drains, termination (TERM to every process, KILL after the
// grace) and the durable receipt. Not the socket (server.ts) nor the registry (supervisor.ts).
import { EventEmitter } from 'node:events';
import { chmodSync, chownSync, closeSync, existsSync, lstatSync, mkdirSync, readdirSync, renameSync, rmSync } from 'node:fs';
import { OUTPUT_REMOVED_FILE, RECEIPT_FILE } from '../ipc/state-layout.js';
import { Socket } from 'node:net';
import { SupervisorError } from '../ipc/errors.js';
import { native } from './native.js';
import { join } from 'node:path';
import type { Logger } from 'pino';
import type { LingerPolicy, Receipt, SessionState, SessionSummary, StreamName, StreamOutput, SupervisorMode, TerminationCause } from '../ipc/protocol.js';
import type { Config } from './config.js';
import { CgroupLeaf, type CgroupTree } from './cgroup.js';
import { StreamDrain } from './drain.js';
import type { StorageGuard } from './storage.js';
import { createFileDurable, fsyncDir } from './durable.js';
import type { ReceiptSigner } from './signing.js';
import type { SessionUser } from './users.js';
import { buildReceipt, type ReceiptFacts, type SpawnFailureFact } from './receipt.js';
import { indexDigest, storedChunks } from '../ipc/state-layout.js';
import { StreamHasher } from './hasher.js';
import { existsNoFollow, factsOf, readStarted, receiptReservationBytes, reserveReceiptSpace, writeAdmission, writeReceiptFile, writeReservedFacts, writeStarted, type AdmissionRecord } from './store.js';
import type { Reaper } from './reaper.js';
import { LeaderProcess, signalNumber, type LeaderExit } from './spawn.js';
import { setDeadline } from './timers.js';
import { faultPoint } from './fault.js';

/** What every session shares: configuration, identity, the cgroup subtree, the reaper. */
export interface SessionContext {
  config: Config;
  log: Logger;
  reaper: Reaper;
  tree: CgroupTree | null;
  identity: { instance: string; generation: number; bootId: string; mode: SupervisorMode; pid: number };
  sessionsDir: string;
  signer: ReceiptSigner;
  /** Free space of the state dir (chunk writes stop at the reserve). */
  storage: StorageGuard;
}

export interface SessionRequest {
  argv: string[];
  cwd: string;
  /** Only what the request set (covered by the digest). */
  env: Record<string, string>;
  /** The environment the leader gets: the clean base plus the request's. */
  leaderEnv: Record<string, string>;
  invocationKey: string;
  commandDigest: string;
  timeoutMs: number;
  graceMs: number;
  linger: LingerPolicy;
  chunkBytes: number;
  /** The user as requested (name or uid; covered by the digest), null: the supervisor's. */
  user: string | null;
  /** That user resolved (null for restored sessions, which never spawn again). */
  sessionUser: SessionUser | null;
  /** A pseudo-terminal of that size as 0, 1 and 2 (one stream, "pty"); null: pipes. */
  pty: { cols: number; rows: number } | null;
  /** "stream": stdin is written by clients (write); "null": /dev/null, or a pty nobody types in. */
  stdin: 'null' | 'stream';
}

const ALL_STREAMS: StreamName[] = ['stdout', 'stderr', 'pty'];
/** A stream dir retention has decided to remove is first renamed to this prefix + its name. */
const REMOVED_PREFIX = '.removed-';
/** First and longest wait between attempts to write a receipt the disk had no room for. */
const RECEIPT_RETRY_FIRST_MS = 1000;
const RECEIPT_RETRY_MAX_MS = 10_000;
/** Quiet time on a pty master, after its writers are gone, before the slave is closed. */
const PTY_QUIET_MS = 20;

/** An operator's word that ends an unknown session (sbx resolve --as-operator). */
export interface OperatorAttestation {
  uid: number;
  pid: number;
  reason: string;
}

export class Session extends EventEmitter {
  readonly dir: string;
  state: SessionState = 'admitted';
  startedAt: Date | null = null;
  leaderExitedAt: Date | null = null;
  endedAt: Date | null = null;
  receipt: Receipt | null = null;
  readonly drains = new Map<StreamName, StreamDrain>();
  /** Durable bytes per stream of a session restored after a restart (no drain any more). */
  private readonly restoredCursors = new Map<StreamName, number>();
  /** Why the session is unknown (state "unknown"), for ps and logs. */
  unknownReason: string | null = null;
  /** The admission record as written (null until admitted). */
  admission: AdmissionRecord | null = null;
  /** Resolves with the receipt once it is durable; never rejects. */
  readonly ended: Promise<Receipt | null>;
  private resolveEnded!: (r: Receipt | null) => void;
  private leaf: CgroupLeaf | null = null;
  private leader: LeaderProcess | null = null;
  private exit: { code: number | null; signal: string | null } = { code: null, signal: null };
  private spawnFailure: SpawnFailureFact | null = null;
  private cause: TerminationCause | null = null;
  private readonly steps: { signal: string; at: Date; pids: number }[] = [];
  private descendantsTerminated: number | null = null;
  private terminating: Promise<void> | null = null;
  /** The pty (pty sessions): the slave is held open until death evidence. */
  private pty: { master: number; slave: number; path: string } | null = null;
  /** Where stdin bytes go (pipe write end, or the pty master); null without --stdin. */
  private stdinWriter: Socket | null = null;
  /** Bytes of stdin accepted so far (the stdin cursor), and whether it was closed. */
  stdinCursor = 0;
  private stdinClosed = false;
  private stdinLastByte: number | undefined;
  /** Writes to stdin in arrival order. */
  private stdinChain: Promise<unknown> = Promise.resolve();
  private cancelDeadline: () => void = () => {};

  constructor(readonly id: string, readonly req: SessionRequest, private readonly ctx: SessionContext, readonly admittedAt = new Date()) {
    super();
    this.setMaxListeners(0);
    this.dir = join(ctx.sessionsDir, id);
    this.ended = new Promise((resolve) => (this.resolveEnded = resolve));
  }

  /**
   * A session found in the state dir at start-up: ended if it has a receipt, else unknown
   * until reconcile() finds evidence. Its streams are what is durably on disk.
   */
  static restore(record: AdmissionRecord, receipt: Receipt | null, ctx: SessionContext): Session {
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
    };
    const session = new Session(record.session_id, req, ctx, new Date(record.admitted_at));
    session.admission = record;
    const removing = ALL_STREAMS.some((stream) => existsSync(join(session.dir, `${REMOVED_PREFIX}${stream}`)));
    session.outputRemoved = removing || existsSync(join(session.dir, OUTPUT_REMOVED_FILE));
    if (removing) {
      try {
        session.finishOutputRemoval(null);
      } catch (err) {
        ctx.log.warn({ err, session_id: session.id }, 'could not finish removing output a crash interrupted');
      }
    }
    if (record.cgroup) session.leaf = new CgroupLeaf(record.cgroup);
    // The streams it was admitted with, whether or not it got to open them (a crash between
    // admission and spawn leaves none on disk: they are empty, and a retry replays nothing).
    for (const stream of req.pty ? (['pty'] as const) : (['stdout', 'stderr'] as const)) session.restoredCursors.set(stream, 0);
    for (const stream of ALL_STREAMS) {
      if (existsSync(join(session.dir, stream))) session.restoredCursors.set(stream, 0);
    }
    if (receipt) {
      session.receipt = receipt;
      session.startedAt = receipt.started_at ? new Date(receipt.started_at) : null;
      session.leaderExitedAt = receipt.leader_exited_at ? new Date(receipt.leader_exited_at) : null;
      session.endedAt = new Date(receipt.ended_at);
      session.state = 'ended';
      session.resolveEnded(receipt);
      // Death was proven before the receipt was written: a leaf a crash left behind is empty.
      if (session.leaf && existsSync(session.leaf.path)) {
        session.leaf.remove().catch((err: Error) => ctx.log.warn({ err, session_id: session.id }, 'could not remove the cgroup of an ended session'));
      }
    } else {
      for (const stream of session.restoredCursors.keys()) {
        session.restoredCursors.set(stream, storedChunks(session.dir, stream, req.chunkBytes).final_cursor);
      }
      const started = readStarted(session.dir);
      session.startedAt = started ? new Date(started.started_at) : null;
      session.state = 'unknown';
      session.unknownReason = 'the supervisor restarted while the session ran (owner lost); reconciling';
    }
    return session;
  }

  /**
   * A session whose files could not be read at start-up: unknown with the reason, so its
   * key (if known) is blocked and nothing else is affected.
   */
  static broken(sessionId: string, key: string, reason: string, ctx: SessionContext): Session {
    // Its leaf, if any, is found by its id: what runs there is still ours to end.
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
    };
    const session = new Session(sessionId, req, ctx);
    session.state = 'unknown';
    session.unknownReason = reason;
    if (ctx.tree) {
      const leaf = join(ctx.tree.sessionsPath, sessionId);
      if (existsSync(leaf)) session.leaf = new CgroupLeaf(leaf);
    }
    return session;
  }

  /**
   * Durable admission (fsync'ed, with its directory, before anything runs: DESIGN.md 9) and
   * the cgroup leaf. Throws if the record cannot be written; then nothing was started.
   */
  admit(): void {
    const { tree, identity } = this.ctx;
    mkdirSync(this.dir, { mode: 0o700 });
    if (tree) this.leaf = tree.createLeaf(this.id);
    this.admission = {
      session_id: this.id,
      invocation_key: this.req.invocationKey,
      command_digest: this.req.commandDigest,
      argv: this.req.argv,
      cwd: this.req.cwd,
      env: this.req.env,
      timeout_ms: this.req.timeoutMs,
      grace_ms: this.req.graceMs,
      linger: this.req.linger,
      chunk_bytes: this.req.chunkBytes,
      user: this.req.user,
      pty: this.req.pty,
      stdin: this.req.stdin,
      cgroup: this.leaf?.path ?? null,
      mode: identity.mode,
      boot_id: identity.bootId,
      generation: identity.generation,
      instance: identity.instance,
      admitted_at: this.admittedAt.toISOString(),
    };
    writeAdmission(this.dir, this.admission);
    fsyncDir(this.ctx.sessionsDir);
    // Room for the receipt's chunk lists too: a stream stores at most its quota.
    const quota = this.ctx.config.drain.quotaBytes;
    const chunksPerStream = quota > 0 ? Math.ceil(quota / this.req.chunkBytes) + 1 : Infinity;
    reserveReceiptSpace(this.dir, receiptReservationBytes(Buffer.byteLength(JSON.stringify(this.admission)), (this.req.pty ? 1 : 2) * chunksPerStream));
  }

  /** Undoes a failed admit(): nothing ran, so the directory and the leaf go. */
  abandon(): void {
    rmSync(this.dir, { recursive: true, force: true });
    void this.leaf?.remove().catch(() => {});
  }

  /** Starts the leader in its leaf (after admit()), the drains and the deadline. */
  start(): void {
    const { config, identity } = this.ctx;
    let leader: LeaderProcess;
    try {
      if (this.req.pty) {
        this.pty = native().openPty(this.req.pty.cols, this.req.pty.rows);
        // The terminal is the session user's, as login(1) does it: they may reopen it by name.
        if (this.req.sessionUser) {
          chownSync(this.pty.path, this.req.sessionUser.uid, this.req.sessionUser.gid);
          chmodSync(this.pty.path, 0o620);
        }
      }
      leader = new LeaderProcess(
        {
          argv: this.req.argv,
          cwd: this.req.cwd,
          env: this.req.leaderEnv,
          cgroupProcsPath: this.leaf?.procsPath ?? null,
          subreaper: identity.mode === 'subreaper',
          pipeBytes: config.drain.pipeBytes,
          user: this.req.sessionUser,
          ptySlaveFd: this.pty?.slave ?? null,
          stdinPipe: this.req.stdin === 'stream',
        },
        this.ctx.reaper,
      );
    } catch (err) {
      // No pty, no pipe or no fork (EMFILE, EAGAIN): nothing ran, and the empty leaf says so.
      if (this.pty) for (const fd of [this.pty.master, this.pty.slave]) closeSync(fd);
      this.pty = null;
      void this.failToStart(err as NodeJS.ErrnoException);
      return;
    }
    this.leader = leader;
    this.startedAt = new Date();
    this.transition('running');
    if (this.pty) {
      const drain = new StreamDrain(this.dir, 'pty', this.pty.master, this.storePolicy(), true);
      this.drains.set('pty', drain);
      if (this.req.stdin === 'stream') this.stdinWriter = drain.socket;
    } else {
      this.drains.set('stdout', new StreamDrain(this.dir, 'stdout', leader.stdoutFd, this.storePolicy()));
      this.drains.set('stderr', new StreamDrain(this.dir, 'stderr', leader.stderrFd, this.storePolicy()));
      if (leader.stdinFd >= 0) {
        this.stdinWriter = new Socket({ fd: leader.stdinFd, readable: false, writable: true });
        this.stdinWriter.on('error', () => (this.stdinClosed = true)); // EPIPE: nobody reads stdin any more
      }
    }
    for (const drain of this.drains.values()) {
      drain.on('advance', () => this.emit('output', drain.stream));
      drain.on('end', () => this.emit('output', drain.stream));
    }
    if (this.req.timeoutMs > 0) {
      this.cancelDeadline = setDeadline(() => void this.terminate('deadline'), this.req.timeoutMs);
    }
    this.run(leader).catch((err: Error) => {
      this.ctx.log.error({ err, session_id: this.id }, 'session lifecycle failed');
      this.becomeUnknown(`internal error: ${err.message}`);
    });
  }

  private storePolicy(): { chunkBytes: number; quotaBytes: number; guard: StorageGuard } {
    const quota = this.ctx.config.drain.quotaBytes;
    return { chunkBytes: this.req.chunkBytes, quotaBytes: quota > 0 ? quota : Number.MAX_SAFE_INTEGER, guard: this.ctx.storage };
  }

  get pid(): number | null {
    return this.leader && this.leader.pid > 0 ? this.leader.pid : null;
  }

  /** Stored bytes of a stream so far. */
  cursor(stream: StreamName): number {
    return this.receipt?.output[stream]?.final_cursor ?? this.drains.get(stream)?.cursor ?? this.restoredCursors.get(stream) ?? 0;
  }

  /** Whether a stream will never grow again. */
  streamFinal(stream: StreamName): boolean {
    const drain = this.drains.get(stream);
    return !drain || drain.ended !== null;
  }

  /** Whether the session has (or was admitted with) that stream; one that never got to open it reads as empty. */
  hasStream(stream: StreamName): boolean {
    const admitted = this.req.argv.length > 0 && (this.req.pty ? stream === 'pty' : stream !== 'pty');
    return admitted || this.drains.has(stream) || this.restoredCursors.has(stream) || this.receipt?.output[stream] !== undefined;
  }

  /**
   * Writes stdin bytes at `offset` (default: the stdin cursor), exactly once: bytes before
   * the cursor were already delivered (a retry after a reconnect) and are skipped; a gap is
   * INVALID_ARGUMENT. Resolves once the bytes are handed to the pipe or pty (backpressure),
   * with the new cursor. eof closes stdin (a pipe's end; ^D on a pty).
   */
  write(data: Buffer, offset: number | undefined, eof: boolean): Promise<number> {
    const run = async (): Promise<number> => {
      if (!this.stdinWriter) throw new SupervisorError('INVALID_ARGUMENT', `session ${this.id} was not started with --stdin`);
      const start = offset ?? this.stdinCursor;
      if (start > this.stdinCursor) throw new SupervisorError('INVALID_ARGUMENT', `stdin offset ${start} is past the stdin cursor ${this.stdinCursor}`, { cursor: this.stdinCursor });
      const fresh = data.subarray(Math.min(data.length, this.stdinCursor - start));
      if (this.stdinClosed) {
        if (fresh.length === 0) return this.stdinCursor; // a retried eof
        throw new SupervisorError('INVALID_ARGUMENT', `stdin of session ${this.id} is closed`, { cursor: this.stdinCursor });
      }
      const writer = this.stdinWriter;
      if (fresh.length > 0) {
        this.stdinCursor += fresh.length;
        this.stdinLastByte = fresh[fresh.length - 1];
        if (!writer.write(fresh)) {
          await new Promise<void>((resolve) => {
            const done = () => {
              writer.off('drain', done);
              writer.off('close', done);
              resolve();
            };
            writer.on('drain', done);
            writer.on('close', done);
          });
        }
      }
      if (eof) {
        this.stdinClosed = true;
        // VEOF: after a partial line the first ^D only hands that line over; a second one is
        // the end of input (termios(3), VEOF).
        if (this.pty) writer.write(Buffer.from(this.stdinLastByte === undefined || this.stdinLastByte === 10 ? [4] : [4, 4]));
        else writer.end();
      }
      return this.stdinCursor;
    };
    const result = this.stdinChain.then(run, run);
    this.stdinChain = result.catch(() => {});
    return result;
  }

  /** Sets the pty's size (the foreground process group gets SIGWINCH). */
  resize(cols: number, rows: number): void {
    if (!this.pty || this.state === 'ended') throw new SupervisorError('INVALID_ARGUMENT', `session ${this.id} has no live pty`);
    native().setWindowSize(this.pty.master, cols, rows);
  }

  /** Directory of a stream's chunk files and index. */
  streamDir(stream: StreamName): string {
    return join(this.dir, stream);
  }

  /** The retention policy removed this session's output (its receipt stays). */
  outputRemoved = false;

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

  /**
   * Removes an ended session's chunk files and index (retention); the receipt and admission
   * record stay. Each stream dir is first renamed `.removed-<stream>` (durably: that rename is
   * the decision, and needs no free block, so it works on a full disk), then its files go,
   * then the marker (output-removed.json) says so to readers and `sbx verify`; a restart
   * finishes what a crash interrupted (finishOutputRemoval). Returns the bytes freed.
   */
  removeOutput(): number {
    if (this.state !== 'ended' || this.outputRemoved) return 0;
    const bytes = this.outputBytes();
    for (const stream of ALL_STREAMS) {
      if (existsSync(this.streamDir(stream))) renameSync(this.streamDir(stream), join(this.dir, `${REMOVED_PREFIX}${stream}`));
    }
    fsyncDir(this.dir);
    this.outputRemoved = true;
    this.finishOutputRemoval(bytes);
    return bytes;
  }

  /**
   * Empties the renamed stream dirs (the space comes back), writes the marker (if it is not
   * there yet), and only then removes the empty dirs: until the marker is durable, an empty
   * `.removed-<stream>` stays as the trace a restart finishes from.
   */
  private finishOutputRemoval(bytes: number | null): void {
    const renamed = ALL_STREAMS.map((stream) => join(this.dir, `${REMOVED_PREFIX}${stream}`)).filter((dir) => existsSync(dir));
    for (const dir of renamed) for (const name of readdirSync(dir)) rmSync(join(dir, name), { force: true });
    if (!existsSync(join(this.dir, OUTPUT_REMOVED_FILE))) {
      faultPoint('retention:before-marker');
      createFileDurable(join(this.dir, OUTPUT_REMOVED_FILE), JSON.stringify({ removed_at: new Date().toISOString(), bytes }) + '\n');
    }
    for (const dir of renamed) rmSync(dir, { recursive: true, force: true });
    fsyncDir(this.dir);
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
      state: this.state,
      argv: this.req.argv,
      pid: this.pid,
      admitted_at: this.admittedAt.toISOString(),
      ended_at: this.endedAt?.toISOString() ?? null,
      outcome: this.receipt?.outcome ?? null,
      live_pids: this.livePids(),
      cursors,
      usage: this.receipt?.usage ?? this.leaf?.usage() ?? {},
      ...(this.unknownReason ? { reason: this.unknownReason } : {}),
      ...(this.state === 'unknown' && (this.receiptOnItsWay || this.receiptAwaitingSpace) ? { receipt_pending: true as const } : {}),
    };
  }

  /**
   * Ends every process of the session: SIGTERM to each (all of the cgroup, not just the
   * leader or its process group), cgroup.kill once graceMs passes, then waits for death.
   * The first cause is the one the receipt keeps; later calls join the running escalation.
   */
  terminate(cause: TerminationCause, graceMs: number = this.req.graceMs): Promise<void> {
    this.cause ??= cause;
    if (this.terminating) return this.terminating;
    if (this.state === 'ended' || this.state === 'unknown') return Promise.resolve();
    this.cancelDeadline();
    this.transition('terminating');
    this.terminating = this.escalate(graceMs);
    return this.terminating;
  }

  private async escalate(graceMs: number): Promise<void> {
    const leader = this.leader!;
    // Not before the shim has joined the cgroup (it reports exec, or its failure, only after):
    // an empty leaf before that proves nothing, and a signal then would miss the command.
    await leader.exec;
    const leaderPid = this.leaderExitedAt ? null : leader.leaderPid;
    const leaf = this.leaf;
    if (graceMs > 0) {
      const reached = await this.signal('SIGTERM');
      this.steps.push({ signal: 'SIGTERM', at: new Date(), pids: reached });
      this.descendantsTerminated ??= Math.max(0, reached - (leaderPid !== null ? 1 : 0));
      if (await this.waitDead(graceMs)) return;
    }
    if (leaf && !leader.holdsSession) {
      const pids = leaf.pids();
      this.descendantsTerminated ??= pids.filter((pid) => pid !== leaderPid).length;
      leaf.kill();
      this.steps.push({ signal: 'SIGKILL', at: new Date(), pids: pids.length });
      await leaf.waitEmpty(null);
      return;
    }
    // The shim stays (subreaper mode, or a pty's session leader): KILL everything else, again
    // until the shim reports all reaped; past a bound, cgroup.kill takes the shim too.
    let first = true;
    let done = false;
    void leader.allReaped.then(() => (done = true));
    const giveUpAt = Date.now() + 10_000;
    while (!done) {
      const reached = await this.signal('SIGKILL');
      if (first) {
        this.steps.push({ signal: 'SIGKILL', at: new Date(), pids: reached });
        this.descendantsTerminated ??= Math.max(0, reached - (leaderPid !== null ? 1 : 0));
        first = false;
      }
      if (leaf && Date.now() > giveUpAt) {
        leaf.kill();
        await leaf.waitEmpty(null);
        return;
      }
      await Promise.race([leader.allReaped, new Promise((r) => setTimeout(r, 100))]);
    }
  }

  /**
   * Sends sig to every process of the session (all of the cgroup; in subreaper mode every
   * descendant of the shim); resolves with how many pids it reached. 0 once ended.
   */
  async signal(signal: NodeJS.Signals): Promise<number> {
    if (this.state === 'ended') return 0;
    // A session recovered after a restart has no leader here, but what runs in its leaf is ours.
    if (!this.leader) return this.leaf && this.state === 'unknown' ? this.leaf.signalAll(signal).size : 0;
    if (this.state === 'unknown') return 0;
    if (!this.leaf) return this.leader.signalViaShim(signalNumber(signal));
    // A shim that stays as the pty's session leader is not signalled: it absorbs signals
    // and goes when released, after the drain.
    const skip = this.leader.holdsSession ? new Set([this.leader.pid]) : new Set<number>();
    return this.leaf.signalAll(signal, skip).size;
  }

  /** Waits up to timeoutMs (null: unbounded) for proof that nothing of the session runs. */
  private async waitDead(timeoutMs: number | null): Promise<boolean> {
    if (this.leaf && !this.leader!.holdsSession) return this.leaf.waitEmpty(timeoutMs);
    const all = this.leader!.allReaped.then(() => true);
    if (timeoutMs === null) return all;
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<boolean>((r) => (timer = setTimeout(() => r(false), timeoutMs)));
    const result = await Promise.race([all, timeout]);
    clearTimeout(timer);
    return result;
  }

  private async run(leader: LeaderProcess): Promise<void> {
    const failure = await leader.exec;
    // The shim reports exec only once it is in the cgroup and the command runs: a record now
    // is evidence, for an owner_lost receipt after a crash, that the command started.
    if (!failure) {
      try {
        writeStarted(this.dir, { started_at: this.startedAt!.toISOString(), pid: leader.leaderPid });
      } catch (err) {
        // Only an owner_lost receipt after a crash would miss started_at; nothing else depends on it.
        this.ctx.log.warn({ session_id: this.id, code: (err as NodeJS.ErrnoException).code }, 'could not record the start');
      }
      faultPoint('session:started-recorded');
    }
    const exit: LeaderExit = await leader.leaderExit;
    this.leaderExitedAt = exit.at;
    this.exit = { code: exit.code, signal: exit.signal };
    this.spawnFailure = failure;
    if (this.state === 'running') this.transition('leader_exited');
    this.ctx.reaper.reapNow();

    // Descendants left behind: end them (systemd's and docker's default) or wait for them.
    const alive = this.leaf && !leader.holdsSession ? this.leaf.populated() : !(await this.waitDead(0));
    if (alive && this.req.linger === 'kill') await this.terminate('linger');

    let evidence: Receipt['death'];
    if (leader.holdsSession || !this.leaf) {
      const reaped = await leader.allReaped;
      if (!reaped) {
        // The shim died without reporting: no proof of death. Unknown, never failed.
        this.becomeUnknown('the exec shim (the session\'s subreaper) died before reporting all descendants reaped');
        return;
      }
      if (leader.holdsSession) {
        // Everything but the session leader is gone: read the pty to its end while the
        // session (and so the tty) still stands, then let the shim go.
        await this.ptyQuiet();
        this.releaseStdio();
        await this.drainAll();
        leader.release();
      }
      evidence = this.leaf
        ? { evidence: 'cgroup_empty', observed_at: '', cgroup: this.leaf.path }
        : { evidence: 'subreaper_reaped', observed_at: new Date().toISOString(), reaped: reaped.reaped };
    } else {
      evidence = { evidence: 'cgroup_empty', observed_at: '', cgroup: this.leaf.path };
    }
    if (this.leaf) {
      await this.leaf.waitEmpty(null);
      evidence.observed_at = new Date().toISOString();
    }
    this.cancelDeadline();
    if (this.terminating) await this.terminating;
    leader.release();
    this.ctx.reaper.reapNow();
    this.releaseStdio();

    await this.drainAll();

    const output: Partial<Record<StreamName, StreamOutput>> = {};
    for (const [name, drain] of this.drains) {
      output[name] = await drain.finalize();
      if (drain.log.failureError) this.ctx.log.error({ session_id: this.id, stream: name, error: drain.log.failureError }, 'the stream stopped storing');
    }
    const usage = this.leaf?.usage() ?? {};
    await this.finish({
      ...this.identityFacts(),
      startedAt: this.startedAt,
      leaderExitedAt: this.leaderExitedAt,
      endedAt: new Date(),
      exit: this.exit,
      spawnFailure: this.spawnFailure,
      cause: this.cause,
      steps: this.steps,
      death: {
        evidence: evidence.evidence,
        observedAt: new Date(evidence.observed_at),
        ...(evidence.cgroup ? { cgroup: evidence.cgroup.slice(this.ctx.tree!.mount.mountPoint.length) } : {}),
        ...(evidence.reaped !== undefined ? { reaped: evidence.reaped } : {}),
      },
      output,
      usage,
      descendantsTerminated: this.descendantsTerminated ?? 0,
    });
  }

  /** A signed receipt whose write the disk had no room for: retried until it is durable. */
  private receiptAwaitingSpace: Receipt | null = null;
  /** Reconciliation has found this recovered session's evidence (or is ending its leaf): its receipt follows. */
  private receiptOnItsWay = false;
  /** While reconciliation waits out the grace of a recovered leaf: ends that wait (KILL now). */
  private cutGrace: (() => void) | null = null;

  /**
   * `sbx cancel` of a recovered session reconciliation is ending (TERM sent): its KILL comes
   * after graceMs (0: now) instead of the rest of its grace. False when nothing of the kind
   * is under way (an unknown session with no evidence to come: nothing to cancel).
   */
  cancelRecovered(graceMs: number): boolean {
    const cut = this.cutGrace;
    if (this.state !== 'unknown' || !cut) return false;
    if (graceMs > 0) setTimeout(cut, graceMs).unref();
    else cut();
    return true;
  }

  /** Writes the receipt durably, then (only then) reports the end and removes the leaf. */
  private async finish(facts: ReceiptFacts, extra: Partial<Receipt> = {}): Promise<void> {
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
   * Makes the receipt durable (into the space reserved at admission: store.ts), then ends the
   * session. No room (a receipt that outgrew its reservation on a full disk): the facts are
   * kept, the session is unknown meanwhile with the reason, and the write is tried again with
   * a growing pause until space returns. Anything else already where the receipt goes (a
   * planted link: EEXIST) fails closed: unknown, never written through.
   */
  private publish(receipt: Receipt, endedAt: Date, retryMs: number): void {
    // One receipt per session: whoever wrote first won (a later writer never unsettles it).
    if (this.state === 'ended') return;
    try {
      writeReceiptFile(this.dir, JSON.stringify(receipt) + '\n');
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code !== 'ENOSPC' && code !== 'EDQUOT') {
        // For good: nothing is on its way any more (an operator may resolve it).
        this.receiptAwaitingSpace = null;
        this.receiptOnItsWay = false;
        this.becomeUnknown(`the receipt could not be written: ${(err as Error).message}`);
        return;
      }
      if (!this.receiptAwaitingSpace) {
        // Its facts, small and without the lists the disk gives back, go into the reservation
        // in place (no block allocated), so a crash meanwhile loses nothing either.
        let kept = 'in memory';
        try {
          writeReservedFacts(this.dir, JSON.stringify(this.ctx.signer.sign(factsOf(receipt))));
          kept = 'in its reservation';
        } catch (factsErr) {
          this.ctx.log.warn({ session_id: this.id, code: (factsErr as NodeJS.ErrnoException).code }, 'could not keep the receipt\'s facts in its reservation');
        }
        this.becomeUnknown(`the receipt could not be written (${code}: no space in the state dir); its facts are kept ${kept} and the write is retried until space returns`);
      }
      this.receiptAwaitingSpace = receipt;
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

  /**
   * Closes what we held of the session's stdio: the pty slave (the master then reads what is
   * buffered, then EIO: DESIGN.md 16) and the stdin pipe. Idempotent.
   */
  private releaseStdio(): void {
    if (this.pty && this.pty.slave >= 0) {
      closeSync(this.pty.slave);
      this.pty.slave = -1;
    }
    if (this.stdinWriter && this.stdinWriter !== this.drains.get('pty')?.socket) this.stdinWriter.destroy();
  }

  /**
   * After every writer of the pty is gone, waits until the master has been quiet for
   * PTY_QUIET_MS (bytes still in flight in the tty layer arrive within that), bounded by the
   * post-death drain; only then is the slave closed.
   */
  private async ptyQuiet(): Promise<void> {
    const drain = this.drains.get('pty');
    if (!drain) return;
    const giveUpAt = Date.now() + this.ctx.config.drain.postDeathDrainMs;
    for (;;) {
      const before = drain.cursor;
      await new Promise((r) => setTimeout(r, PTY_QUIET_MS));
      if (drain.cursor === before || drain.ended || Date.now() > giveUpAt) return;
    }
  }

  /**
   * Waits for every stream to end. Every writer in the session is dead by now; an fd passed
   * outside may still hold a pipe, so this is bounded (postDeathDrainMs) and a cut stream is
   * marked incomplete.
   */
  private async drainAll(): Promise<void> {
    const bound = setTimeout(() => {
      for (const d of this.drains.values()) d.cut();
    }, this.ctx.config.drain.postDeathDrainMs);
    await Promise.all([...this.drains.values()].map((d) => d.done));
    clearTimeout(bound);
  }

  private async failToStart(err: NodeJS.ErrnoException): Promise<void> {
    this.ctx.log.error({ session_id: this.id, code: err.code, message: err.message }, 'could not start the exec shim');
    const now = new Date();
    const facts = await this.ownerLostFacts(
      this.leaf ? { evidence: 'cgroup_empty', observedAt: now, cgroup: this.leaf.path.slice(this.ctx.tree!.mount.mountPoint.length) } : { evidence: 'subreaper_reaped', observedAt: now, reaped: 0 },
      [],
    );
    await this.finish({ ...facts, cause: null, spawnFailure: { stage: 'spawn', errno: -(err.errno ?? 0), code: err.code ?? 'EUNKNOWN' } });
  }

  private becomeUnknown(reason: string): void {
    this.ctx.log.warn({ session_id: this.id, reason }, 'session is unknown: no evidence of death');
    this.unknownReason = reason;
    this.transition('unknown');
  }

  /** What every receipt of this session says about what was admitted, and by whom. */
  private identityFacts() {
    return {
      sessionId: this.id,
      invocationKey: this.req.invocationKey,
      commandDigest: this.req.commandDigest,
      argv: this.req.argv,
      cwd: this.req.cwd,
      user: this.req.user,
      supervisor: this.ctx.identity,
      admittedAt: this.admittedAt,
    };
  }

  /**
   * Receipt facts shared by reconciliation and operator resolution: nothing observed of the
   * leader; each stream as it is on disk, hashed by the hashing workers (never here: it may be
   * gigabytes).
   */
  private async ownerLostFacts(death: ReceiptFacts['death'], steps: ReceiptFacts['steps']): Promise<ReceiptFacts> {
    const output: Partial<Record<StreamName, StreamOutput>> = {};
    for (const stream of this.restoredCursors.keys()) {
      const { final_cursor, chunks } = storedChunks(this.dir, stream, this.req.chunkBytes);
      const sha256 = await new StreamHasher(join(this.dir, stream), this.req.chunkBytes).digest(final_cursor);
      output[stream] = { final_cursor, sha256, complete: false, reason: 'owner_lost', dropped_bytes: 0, drain_end: 'lost', index_sha256: indexDigest(this.dir, stream), chunks };
    }
    return {
      ...this.identityFacts(),
      // Known only when the started record survived: the spawn happened then.
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
    };
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
      throw err;
    }
  }

  /** reconcile()'s decisions, in order (see there). */
  private async settleRecovered(): Promise<void> {
    if (this.state !== 'unknown' || this.receiptAwaitingSpace) return;
    if (!this.admission) {
      // Torn files: no receipt can be written, but nothing of it may run on unowned.
      if (this.leaf && this.leaf.populated()) {
        const reason = this.unknownReason;
        await this.endLeaf([]);
        this.unknownReason = `${reason}; its processes were ended (TERM, then KILL)`;
      }
      return;
    }
    const mount = this.ctx.tree?.mount.mountPoint;
    if (this.admission.boot_id !== this.ctx.identity.bootId) {
      this.receiptOnItsWay = true;
      await this.finish(await this.ownerLostFacts({ evidence: 'boot_changed', observedAt: new Date() }, []));
      return;
    }
    if (!this.leaf || !mount || !this.leaf.path.startsWith(mount + '/')) {
      this.unknownReason = 'owner lost in subreaper mode: no cgroup to prove the session dead (sbx resolve --as-operator)';
      return;
    }
    this.receiptOnItsWay = true;
    const steps: ReceiptFacts['steps'] = [];
    if (existsSync(this.leaf.path) && this.leaf.populated()) await this.endLeaf(steps);
    const cgroup = this.leaf.path.slice(mount.length);
    await this.finish(await this.ownerLostFacts({ evidence: 'cgroup_empty', observedAt: new Date(), cgroup }, steps));
  }

  /**
   * TERM to every process of the leaf, the grace, then cgroup.kill; records the steps. The
   * TERM goes out before the first await, so the caller's decision is in effect at once and
   * ps says what is being done meanwhile.
   */
  private async endLeaf(steps: ReceiptFacts['steps']): Promise<void> {
    const leaf = this.leaf!;
    const reason = this.unknownReason;
    if (this.req.graceMs > 0) {
      const at = new Date();
      steps.push({ signal: 'SIGTERM', at, pids: leaf.signalAll('SIGTERM').size });
      this.unknownReason = `${reason}; being ended: SIGTERM sent to ${steps[steps.length - 1].pids} processes at ${at.toISOString()}, cgroup.kill after its grace of ${this.req.graceMs} ms`;
      await Promise.race([leaf.waitEmpty(this.req.graceMs), new Promise<void>((resolve) => (this.cutGrace = resolve))]);
      this.cutGrace = null;
    }
    if (leaf.populated()) {
      steps.push({ signal: 'SIGKILL', at: new Date(), pids: leaf.pids().length });
      leaf.kill();
      await leaf.waitEmpty(null);
    }
  }

  /** Ends an unknown session on an operator's word: evidence operator_attested, never automatic. */
  async resolveAsOperator(operator: OperatorAttestation): Promise<Receipt> {
    if (this.state !== 'unknown') throw new SupervisorError('INVALID_ARGUMENT', `session ${this.id} is ${this.state}; only an unknown session can be resolved by an operator`);
    if (this.receiptAwaitingSpace) {
      throw new SupervisorError('INVALID_ARGUMENT', `session ${this.id} ended with evidence; its receipt waits for space in the state dir and is written once there is room (free some space)`);
    }
    if (this.receiptOnItsWay) {
      // Evidence (or an operator's word) is already being written: one receipt per session, ever.
      throw new SupervisorError('INVALID_ARGUMENT', `session ${this.id} has evidence on its way (${this.unknownReason ?? 'reconciling'}); its receipt follows (sbx wait ${this.id}), nothing is left to attest`);
    }
    if (this.leaf?.populated()) {
      throw new SupervisorError('INVALID_ARGUMENT', `session ${this.id} still has ${this.leaf.pids().length} processes in its cgroup; nothing is attested over a live session`);
    }
    this.receiptOnItsWay = true;
    try {
      // An unreadable receipt is kept beside, never silently replaced.
      // Whatever is there, a planted link included (lstat: never followed; rename moves the name).
      const torn = join(this.dir, RECEIPT_FILE);
      if (existsNoFollow(torn)) renameSync(torn, join(this.dir, `receipt.unreadable-${Date.now()}.json`));
      await this.finish(await this.ownerLostFacts({ evidence: 'operator_attested', observedAt: new Date() }, []), {
        operator: { uid: operator.uid, pid: operator.pid, reason: operator.reason, unknown_reason: this.unknownReason },
      });
    } finally {
      this.receiptOnItsWay = false;
    }
    if (!this.receipt) throw new SupervisorError('INTERNAL', `session ${this.id}: the operator's receipt could not be written: ${this.unknownReason}`);
    return this.receipt;
  }

  /**
   * After a restart: the receipt rebuilt from the facts record a crash left in the
   * reservation (the disk had no room for the whole receipt); it is written as soon as there
   * is room, and reconciliation leaves the session alone (its evidence is known).
   */
  resumeReceipt(receipt: Receipt): void {
    // Death was proven before the facts were written: a leaf a crash left behind is empty.
    if (this.leaf && existsSync(this.leaf.path)) this.leaf.remove().catch((err: Error) => this.ctx.log.warn({ err, session_id: this.id }, 'could not remove the cgroup of an ended session'));
    this.receiptAwaitingSpace = receipt;
    this.unknownReason = 'its receipt (its facts were kept in its reservation across a restart) waits for space in the state dir; the write is retried until space returns';
    this.publish(receipt, new Date(receipt.ended_at), RECEIPT_RETRY_FIRST_MS);
  }

  /** Resolves once the session has a receipt or is unknown (no receipt without evidence). */
  settled(): Promise<void> {
    if (this.state === 'ended' || this.state === 'unknown') return Promise.resolve();
    return new Promise((resolve) => {
      const onState = (state: SessionState) => {
        if (state !== 'ended' && state !== 'unknown') return;
        this.off('state', onState);
        resolve();
      };
      this.on('state', onState);
    });
  }

  private transition(next: SessionState): void {
    this.ctx.log.debug({ session_id: this.id, from: this.state, to: next }, 'session state');
    this.state = next;
    this.emit('state', next);
  }
}


