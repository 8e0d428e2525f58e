// A session launched by this supervisor: admitted (its record and receipt reservation durable before anything
// runs), started in its cgroup leaf through the exec shim (spawn.ts), drained (drain.ts), fed stdin
// (stdin.ts), ended by its deadline, a cancel, a linger rule, shutdown or close (escalation.ts), and
// receipted once death is proven (evidence.ts). Owns the leader, the pty, the drains and the stdin writer;
// what any session has is session.ts. See cgroups(7), pty(7), docs/design/facts.md 8, 9, 15, 16.
import { chmodSync, chownSync, closeSync, existsSync, mkdirSync, rmSync } from 'node:fs';
import { isatty } from 'node:tty';
import { Socket } from 'node:net';
import { SupervisorError } from '../../ipc/errors.js';
import type { HandoffFacts, SessionLimits, StreamName, StreamOutput, TerminationCause } from '../../ipc/protocol.js';
import { applyLimits, continuePids, type CgroupLeaf } from '../cgroup.js';
import { hasLimits, LIMITS } from '../limits.js';
import { faultPoint } from '../../core/fault.js';
import { native } from '../../core/fs/native.js';
import { StreamLog, type ReadRecord } from '../store/chunks.js';
import { fsyncDir } from '../../core/fs/durable.js';
import { testHooks } from '../../core/test-hooks.js';
import { receiptReservationBytes, reserveReceiptSpace } from '../store/receipt-file.js';
import { removeSessionDir, writeAdmission, writeStarted } from '../store/records.js';
import { setDeadline } from '../timers.js';
import type { SessionContext, SessionRequest } from './context.js';
import { StreamDrain, type StorePolicy } from './drain.js';
import { escalate, type EscalationStep, type EscalationTarget } from './escalation.js';
import { ESCAPES_RESERVE_BYTES, type EscapeReport } from './escape.js';
import { cgroupEmpty, liveDeath, missingShimReport, qualifyEscapes } from './evidence.js';
import { causeWithOom, type SpawnFailureFact } from './receipt.js';
import { Session } from './session.js';
import { LeaderProcess, signalNumber } from './spawn.js';
import { StdinWriter } from './stdin.js';
import { handOffLeftovers } from './handoff.js';
import { errnoCode } from '../../ipc/errno.js';
import { systemError } from '../../ipc/errno.js';

/** How long KILLs through a shim that stays (pty, subreaper mode) may take before cgroup.kill takes it too (no cgroup: the supervisor kills its tree): 10 s (a test may set it: SBX_TEST_SHIM_KILL_GIVE_UP_MS). */
const SHIM_KILL_GIVE_UP_MS = testHooks.shimKillGiveUpMs;

export class LiveSession extends Session {
  readonly drains = new Map<StreamName, StreamDrain>();
  private leader: LeaderProcess | null = null;
  private exit: { code: number | null; signal: string | null } = { code: null, signal: null };
  private spawnFailure: SpawnFailureFact | null = null;
  private cause: TerminationCause | null = null;
  private readonly steps: EscalationStep[] = [];
  /** Every signal the supervisor sent the session (the receipt's exit.signal_source). */
  private readonly signalsSent = new Set<string>();
  private descendantsTerminated: number | null = null;
  private terminating: Promise<void> | null = null;
  /** The started record's write (records.ts writeStarted), once the exec is reported; settled before the receipt. */
  private startedRecord: Promise<void> = Promise.resolve();
  /** The pty (pty sessions): the slave is held open until death evidence. */
  private pty: { master: number; slave: number; path: string } | null = null;
  private stdin: StdinWriter | null = null;
  private cancelDeadline: () => void = () => {};
  /** What the leftovers went on as (linger handoff), once handed off. */
  private handedOff: HandoffFacts | null = null;
  /** The leader died of a SIGKILL nobody here sent, before any cause: the OOM killer's if memory.events counts one. */
  private leaderKilledUnasked = false;
  /** A service's streams no process held at the hand-off: stored empty, final (the receipt names every stream it has). */
  private readonly emptyStreams: StreamLog[] = [];

  constructor(id: string, req: SessionRequest, ctx: SessionContext, admittedAt = new Date()) {
    super(id, req, ctx, admittedAt, 'admitted');
  }

  /**
   * Durable admission (fsync'ed, with its directory, before anything runs: docs/design/facts.md 9), the
   * cgroup leaf, and the receipt's reserved space. Throws if any of it cannot be made; then
   * nothing was started (abandon() undoes it).
   */
  admit(): void {
    const { tree, identity } = this.ctx;
    mkdirSync(this.dir, { mode: 0o700 });
    if (tree) this.leaf = tree.createLeaf(this.id);
    // A service made of a command's leftovers: its leaf stays frozen until they are all in it (handoff.ts).
    if (this.leaf && this.req.service?.handed_off_from) this.leaf.freeze(true);
    const limits = this.req.limits ?? {};
    if (hasLimits(limits)) this.applyLimits(limits);
    this.admission = {
      session_id: this.id,
      invocation_key: this.req.invocationKey,
      ...(this.req.task !== null ? { task: this.req.task } : {}),
      command_digest: this.req.commandDigest,
      argv: this.req.argv,
      cwd: this.req.cwd,
      env: this.req.env,
      timeout_ms: this.req.timeoutMs,
      grace_ms: this.req.graceMs,
      linger: this.req.linger,
      chunk_bytes: this.req.chunkBytes,
      user: this.req.user,
      uid: this.req.sessionUser?.uid ?? process.getuid!(),
      gid: this.req.sessionUser?.gid ?? process.getgid!(),
      pty: this.req.pty,
      stdin: this.req.stdin,
      cgroup: this.leaf?.path ?? null,
      mode: identity.mode,
      boot_id: identity.bootId,
      generation: identity.generation,
      instance: identity.instance,
      admitted_at: this.admittedAt.toISOString(),
      ...(this.req.service ? { service: this.req.service } : {}),
      ...(hasLimits(limits) ? { limits } : {}),
    };
    writeAdmission(this.dir, this.admission);
    fsyncDir(this.ctx.sessionsDir);
    // Room for the receipt's chunk lists too: a stream stores at most its quota.
    const quota = this.ctx.config.drain.quotaBytes;
    const chunksPerStream = quota > 0 ? Math.ceil(quota / this.req.chunkBytes) + 1 : Infinity;
    // And each workspace entry: its path, a last_path (at most PATH_MAX, JSON-escaped), numbers.
    const workspaceBytes = this.ctx.watcher.paths.reduce((sum, p) => sum + 2 * Buffer.byteLength(p) + 2 * 4096 + 1024, 0);
    // And the escapes its death may list (escape.ts).
    reserveReceiptSpace(
      this.dir,
      receiptReservationBytes(
        Buffer.byteLength(JSON.stringify(this.admission)),
        (this.req.pty ? 1 : 2) * chunksPerStream,
        workspaceBytes + ESCAPES_RESERVE_BYTES,
      ),
    );
  }

  /**
   * Writes the limits into the leaf before anything runs in it (the supervisor refused the
   * launch already where a controller is absent: limits.ts). A write the kernel refuses all
   * the same (the controller went away, a value it does not take) is LIMIT_UNAVAILABLE too:
   * never run without the limit.
   */
  private applyLimits(limits: SessionLimits): void {
    for (const { limit, controller } of LIMITS) {
      if (limits[limit] === undefined) continue;
      const cgroup = this.ctx.tree?.sessionsPath ?? null;
      if (!this.leaf)
        throw new SupervisorError(
          'LIMIT_UNAVAILABLE',
          `${limit} needs the ${controller} controller in cgroup v2, and this supervisor has no cgroup (subreaper mode). Nothing was run.`,
          { controller, limit, cgroup },
        );
      try {
        applyLimits(this.leaf.path, { [limit]: limits[limit] });
      } catch (err) {
        throw new SupervisorError('LIMIT_UNAVAILABLE', `${limit} could not be applied: ${(err as Error).message}. Nothing was run.`, {
          controller,
          limit,
          cgroup,
          errno: errnoCode(err) ?? null,
        });
      }
    }
  }

  /**
   * Undoes a failed admit(): nothing ran, so the directory and the leaf go. The directory
   * leaves durably (renamed aside, the sessions directory fsync'ed, then removed: records.ts
   * removeSessionDir), or a crash could bring its durable admission record back, and a start
   * would rebuild the key's record from it: a refused launch would own its key.
   */
  abandon(): void {
    try {
      if (existsSync(this.dir)) removeSessionDir(this.ctx.sessionsDir, this.id);
    } catch {
      rmSync(this.dir, { recursive: true, force: true });
    }
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
      if (this.leaf) this.ctx.escapes.beforeSpawn();
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
      void this.failToStart(systemError(err));
      return;
    }
    this.leader = leader;
    this.startedAt = new Date();
    if (testHooks.spawnToTrackMs > 0) Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, testHooks.spawnToTrackMs);
    // Before the exec (the shim waits for its start in the leaf): every write is the session's.
    this.ctx.watcher.track(this.id, this.leaf?.path ?? null, this.dir);
    if (this.leaf) this.ctx.escapes.track(this.id, this.leaf.path, leader.pid, this.admission!.uid ?? 0);
    this.transition('running');
    if (this.pty) {
      const drain = new StreamDrain(this.dir, 'pty', this.pty.master, this.storePolicy(), true);
      this.drains.set('pty', drain);
      if (this.req.stdin === 'stream') this.stdin = new StdinWriter(this.id, drain.socket, true);
    } else {
      this.drains.set('stdout', new StreamDrain(this.dir, 'stdout', leader.stdoutFd, this.storePolicy()));
      this.drains.set('stderr', new StreamDrain(this.dir, 'stderr', leader.stderrFd, this.storePolicy()));
      if (leader.stdinFd >= 0) this.stdin = new StdinWriter(this.id, new Socket({ fd: leader.stdinFd, readable: false, writable: true }), false);
    }
    this.announceDrains();
    if (this.req.timeoutMs > 0) {
      this.cancelDeadline = setDeadline(() => void this.terminate('deadline'), this.req.timeoutMs);
    }
    this.run(leader).catch((err: Error) => this.lifecycleFailed(err));
  }

  /** Each drain's advance and end is the session's 'output' (readers following a stream wake on it). */
  private announceDrains(): void {
    for (const drain of this.drains.values()) {
      drain.on('advance', () => this.emit('output', drain.stream));
      drain.on('end', () => this.emit('output', drain.stream));
    }
  }

  /** A bug in the lifecycle (logged): the session is unknown, never failed, never relaunched. */
  private lifecycleFailed(err: Error): void {
    this.ctx.log.error({ err, session_id: this.id }, 'session lifecycle failed');
    this.ctx.escapes.forget(this.id);
    this.becomeUnknown(`internal error: ${err.message}`);
  }

  /**
   * Starts a service admitted for a command's leftovers (handoff.ts), once they are all in its
   * frozen leaf: drains the pipes they inherited (`fds`: new read ends of the command's
   * stdout/stderr; a stream nobody held is absent), tracks its writes, then thaws it. It has
   * no leader: it ends when its leaf is empty (or by cancel, kill, close, shutdown).
   */
  startHandedOff(fds: Partial<Record<'stdout' | 'stderr', number>>): void {
    const leaf = this.leaf!;
    this.startedAt = new Date();
    this.ctx.watcher.track(this.id, leaf.path, this.dir);
    this.ctx.escapes.track(this.id, leaf.path, -1, this.admission!.uid ?? 0, this.req.service?.handed_off_from ?? undefined);
    this.transition('running');
    for (const stream of ['stdout', 'stderr'] as const) {
      const fd = fds[stream];
      if (fd === undefined) {
        const p = this.storePolicy();
        this.emptyStreams.push(new StreamLog(this.dir, stream, p.chunkBytes, p.hashPool, p.quotaBytes, p.guard));
        continue;
      }
      this.drains.set(stream, new StreamDrain(this.dir, stream, fd, this.storePolicy()));
    }
    this.announceDrains();
    this.startedRecord = writeStarted(this.dir, { started_at: this.startedAt.toISOString(), pid: 0 }).catch(
      (err: NodeJS.ErrnoException) => void this.ctx.log.warn({ session_id: this.id, code: err.code }, 'could not record the start'),
    );
    leaf.freeze(false);
    (async () => {
      await leaf.waitEmpty(null);
      await this.receiptOnceDead(null);
    })().catch((err: Error) => this.lifecycleFailed(err));
  }

  private storePolicy(): StorePolicy {
    const quota = this.ctx.config.drain.quotaBytes;
    return { chunkBytes: this.req.chunkBytes, quotaBytes: quota > 0 ? quota : Number.MAX_SAFE_INTEGER, guard: this.ctx.storage, hashPool: this.ctx.hashPool };
  }

  /** Its cgroup leaf (null in subreaper mode). */
  get cgroup(): CgroupLeaf | null {
    return this.leaf;
  }

  override get pid(): number | null {
    return this.leader && this.leader.pid > 0 ? this.leader.pid : null;
  }

  override get stdinCursor(): number {
    return this.stdin?.cursor ?? 0;
  }

  protected storedCursor(stream: StreamName): number | undefined {
    return this.drains.get(stream)?.cursor;
  }

  override pendingIndex(stream: StreamName, from: number, limit: number): { records: ReadRecord[]; unstoredAtUs: number | null } {
    return this.drains.get(stream)?.log.pendingRecords(from, limit) ?? super.pendingIndex(stream, from, limit);
  }

  override streamFinal(stream: StreamName): boolean {
    const drain = this.drains.get(stream);
    return !drain || drain.ended !== null;
  }

  override write(data: Buffer, offset: number | undefined, eof: boolean, writer?: string): Promise<number> {
    return this.stdin ? this.stdin.write(data, offset, eof, writer) : super.write(data, offset, eof, writer);
  }

  override resize(cols: number, rows: number): void {
    if (!this.pty || this.state === 'ended') return super.resize(cols, rows);
    native().setWindowSize(this.pty.master, cols, rows);
  }

  /**
   * Ends every process of the session: SIGTERM to each (all of the cgroup, not just the
   * leader or its process group), cgroup.kill once graceMs passes, then waits for death.
   * The first cause is the one the receipt keeps; later calls join the running escalation.
   */
  terminate(cause: TerminationCause, graceMs: number = this.req.graceMs): Promise<void> {
    this.cause ??= cause;
    if (this.terminating) return this.terminating;
    if (this.state !== 'running' && this.state !== 'leader_exited') return Promise.resolve();
    this.cancelDeadline();
    this.transition('terminating');
    this.terminating = this.escalate(graceMs);
    return this.terminating;
  }

  private async escalate(graceMs: number): Promise<void> {
    const leader = this.leader;
    // Not before the shim has joined the cgroup (it reports exec, or its failure, only after):
    // an empty leaf before that proves nothing, and a signal then would miss the command.
    // A service of leftovers has no leader: its processes are in its leaf already. A shim that
    // stays is in its leaf (if any) before it forks, and may be stopped by its command before it
    // says "started": past the shim's answer bound the escalation goes on without it.
    if (leader && !(await leader.execHeardWithin())) {
      this.ctx.log.warn({ session_id: this.id }, 'the exec shim did not report the exec in time: the escalation goes on without it');
    }
    const leaderPid = !leader || this.leaderExitedAt ? null : leader.leaderPid;
    // The pids the latest step reached, where they are known (a cgroup); null: only a count.
    let reached: ReadonlySet<number> | null = null;
    await escalate(
      this.escalationTarget(leader, (pids) => (reached = pids)),
      graceMs,
      (step) => {
        this.steps.push(step);
        // Descendants: every pid the first step reached but the leader. A leader that exited and
        // is not reaped yet is in no cgroup.procs any more: it is subtracted only if reached.
        const leaderReached = leaderPid !== null && (reached === null || reached.has(leaderPid));
        this.descendantsTerminated ??= Math.max(0, step.pids - (leaderReached ? 1 : 0));
      },
    );
  }

  /**
   * How the escalation reaches this session: its cgroup, or through a shim that stays.
   * `reached` hears the pids each step reached when the cgroup names them (null: a count only).
   */
  private escalationTarget(leader: LeaderProcess | null, reached: (pids: ReadonlySet<number> | null) => void): EscalationTarget {
    const leaf = this.leaf;
    return {
      term: async () => {
        const r = await this.signalPids('SIGTERM');
        reached(r.pids);
        this.continueAfterTerm(r.pids);
        return r.count;
      },
      waitDead: (timeoutMs) => this.waitDead(timeoutMs),
      killAll: async (killed) => {
        if (leaf && !leader?.holdsSession) {
          const pids = leaf.pids();
          reached(new Set(pids));
          killed(pids.length);
          this.signalsSent.add('SIGKILL');
          leaf.kill();
          await leaf.waitEmpty(null);
          return;
        }
        // The shim stays (subreaper mode, or a pty's session leader): KILL everything else,
        // again until the shim reports all reaped; past a bound, cgroup.kill takes the shim too.
        if (!leader) return;
        let first = true;
        let done = false;
        void leader.allReaped.then(() => (done = true));
        const giveUpAt = performance.now() + SHIM_KILL_GIVE_UP_MS;
        while (!done) {
          const r = await this.signalPids('SIGKILL');
          if (first) {
            reached(r.pids);
            killed(r.count);
          }
          first = false;
          if (performance.now() > giveUpAt) {
            this.signalsSent.add('SIGKILL');
            if (leaf) {
              leaf.kill();
              await leaf.waitEmpty(null);
              return;
            }
            // No cgroup to take it all: the shim answers no more (stopped past our SIGCONTs, or
            // stuck). Its tree is killed from here; without its report the session is unknown.
            const pids = leader.killShimTree();
            this.ctx.log.warn(
              { session_id: this.id, pids },
              'the exec shim did not report all reaped within the kill bound: its tree killed from the supervisor',
            );
            await leader.allReaped;
            return;
          }
          await Promise.race([leader.allReaped, new Promise((r) => setTimeout(r, 100))]);
        }
      },
    };
  }

  /**
   * SIGCONT right after the escalation's SIGTERM (cgroup.ts continuePids). pids: what the TERM
   * reached in the cgroup; null: through the shim, to every descendant.
   */
  private continueAfterTerm(pids: ReadonlySet<number> | null): void {
    // Through the shim not waited for: its answer comes in order, before the next signal's.
    if (pids === null) void this.leader?.signalViaShim(signalNumber('SIGCONT'));
    else continuePids(pids);
  }

  /**
   * Sends sig to every process of the session (all of the cgroup; in subreaper mode every
   * descendant of the shim); resolves with how many pids it reached. 0 once settled.
   */
  async signal(signal: NodeJS.Signals): Promise<number> {
    return (await this.signalPids(signal)).count;
  }

  /** signal(), with the pids reached when the cgroup names them (null: through the shim, a count only). */
  private async signalPids(signal: NodeJS.Signals): Promise<{ count: number; pids: ReadonlySet<number> | null }> {
    if ((!this.leader && !this.startedAt) || this.state === 'ended' || (this.state === 'unknown' && !this.leaf)) return { count: 0, pids: new Set() };
    this.signalsSent.add(signal);
    if (!this.leaf) {
      const count = await this.leader!.signalViaShim(signalNumber(signal));
      if (count === null) this.ctx.log.warn({ session_id: this.id, signal }, 'the exec shim did not answer a signal in time: counted as reaching none');
      return { count: count ?? 0, pids: null };
    }
    // A shim that stays as the pty's session leader is not signalled: it absorbs signals
    // and goes when released, after the drain.
    const skip = this.leader?.holdsSession ? new Set([this.leader.pid]) : new Set<number>();
    const pids = this.leaf.signalAll(signal, skip);
    return { count: pids.size, pids };
  }

  /** Waits up to timeoutMs (null: unbounded) for proof that nothing of the session runs. */
  private async waitDead(timeoutMs: number | null): Promise<boolean> {
    if (this.leaf && !this.leader?.holdsSession) return this.leaf.waitEmpty(timeoutMs);
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
      // Not awaited: the exit of a command that has already ended is handled meanwhile.
      this.startedRecord = writeStarted(this.dir, { started_at: this.startedAt!.toISOString(), pid: leader.leaderPid }).then(
        () => faultPoint('session:started-recorded'),
        // Only an owner_lost receipt after a crash would miss started_at; nothing else depends on it.
        (err: NodeJS.ErrnoException) => void this.ctx.log.warn({ session_id: this.id, code: err.code }, 'could not record the start'),
      );
    }
    const exit = await leader.leaderExit;
    // The shim was the leader and is reaped: its pid may be anyone's now (escape.ts).
    if (!leader.staysAsSubreaper && this.leaf) this.ctx.escapes.shimReaped(this.id);
    this.leaderExitedAt = exit.at;
    this.exit = { code: exit.code, signal: exit.signal };
    // A SIGKILL nobody here sent, and no cause yet: the OOM killer's, if memory.events counts one at death.
    this.leaderKilledUnasked = exit.signal === 'SIGKILL' && !this.signalsSent.has('SIGKILL') && this.cause === null;
    this.spawnFailure = failure;
    if (this.state === 'running') this.transition('leader_exited');
    this.ctx.reaper.reapNow();

    // Descendants left behind: end them (systemd's and docker's default) or wait for them.
    const alive = this.leaf && !leader.holdsSession ? this.leaf.populated() : !(await this.waitDead(0));
    // handoff: they go on as a service (handoff.ts); what could not be moved is ended as with kill.
    if (alive && this.req.linger === 'handoff' && this.leaf && !this.terminating) {
      this.handedOff = await handOffLeftovers({
        originId: this.id,
        leaf: this.leaf,
        drains: this.drains,
        admit: () => this.ctx.admitHandoff(this),
        log: this.ctx.log,
      });
    }
    if (alive && (this.req.linger === 'kill' || (this.req.linger === 'handoff' && this.leaf?.populated()))) await this.terminate('linger');

    const reportNeeded = leader.holdsSession || !this.leaf;
    const shimReport = reportNeeded ? await leader.allReaped : null;
    const noProof = missingShimReport({ reportNeeded, shimReport });
    if (noProof) {
      this.ctx.escapes.forget(this.id);
      // A pty's session leader (the shim) is gone, so the tty is hung up (tty_ioctl(4)): nothing
      // writes to it any more, and our slave fd alone kept the master from its end (EIO).
      if (leader.holdsSession) this.releaseStdio();
      this.becomeUnknown(noProof);
      return;
    }
    if (leader.holdsSession) {
      // Everything but the session leader is gone: close our slave and read the master to
      // its end (EIO: n_tty_read hands over what the tty layer still holds first; the drain
      // reads past libuv's early EOF, StreamDrain.ptyEnd) while the session (and so the tty)
      // still stands, then let the shim go.
      this.releaseStdio();
      await this.drainAll();
      leader.release();
    }
    if (this.leaf) await this.leaf.waitEmpty(null);
    await this.receiptOnceDead(shimReport);
  }

  /**
   * Once nothing of the session runs (its leaf read empty, or its shim reported all reaped):
   * the death proof, the workspace barrier, the drains to their end, and the receipt.
   */
  private async receiptOnceDead(shimReport: { reaped: number } | null): Promise<void> {
    const proof = liveDeath({ leafPath: this.leaf?.path ?? null, mountPoint: this.ctx.tree?.mount.mountPoint ?? null, shimReport }, new Date());
    // Every write to a cgroup.procs queued before the leaf emptied is read, and our descendants
    // walked (escape.ts settle: about 2 ms for a root session), while the drains finish and
    // fsync: an escape qualifies the proof the receipt says. Its walks may now come after the
    // reapNow() below: a reaped zombie is no stray either way (the walk skips zombies).
    const escapes = proof && this.leaf ? this.ctx.escapes.settle(this.id) : null;
    escapes?.catch(() => {}); // awaited below (or on a failure); never an unhandled rejection meanwhile
    try {
      await this.receiptWith(proof, escapes);
    } catch (err) {
      // The settle is let finish first: the session is then no longer tracked, so the caller's
      // forget() (lifecycleFailed) does not keep its leaf, proven empty, as unproven, where a
      // later session's stray would go unseen.
      await escapes?.catch(() => {});
      throw err;
    }
  }

  /** The rest of receiptOnceDead: proof is the death seen, escapes its settle under way (null: none). */
  private async receiptWith(proof: ReturnType<typeof liveDeath>, escapes: Promise<EscapeReport> | null): Promise<void> {
    const leader = this.leader;
    // Nothing of the session can write any more: its barrier goes out now, while the drains finish.
    const workspace = this.ctx.watcher.settle(this.id);
    this.cancelDeadline();
    if (this.terminating) await this.terminating;
    leader?.release();
    // Exited processes stay zombies until the watcher has read past them (their writes are
    // attributed by their cgroup); the receipt says nothing of them is left: reaped first.
    this.ctx.reaper.reapNow();
    const reaped = this.ctx.reaper.settled();
    this.releaseStdio();

    await this.drainAll();

    // Every stream's fsyncs at once (on the threadpool: one journal commit serves them all).
    const usage = this.leaf?.usage() ?? {};
    // The leader's end was the OOM killer's (memory.events oom_kill, read once every process is
    // dead): said as such, not as a bare SIGKILL (receipt.ts causeWithOom).
    this.cause = causeWithOom(this.cause, { leaderKilledUnasked: this.leaderKilledUnasked, oomKills: usage.oom_kills });
    const output: Partial<Record<StreamName, StreamOutput>> = {};
    const finals = await Promise.all([...this.drains.values()].map((drain) => drain.finalize()));
    for (const log of this.emptyStreams) {
      const { sha256, indexSha256, chunks } = await log.finalize();
      output[log.stream] = { final_cursor: 0, sha256, complete: true, reason: null, dropped_bytes: 0, drain_end: 'eof', index_sha256: indexSha256, chunks };
    }
    await this.startedRecord;
    const death = escapes ? qualifyEscapes(proof!, await escapes) : proof;
    [...this.drains].forEach(([name, drain], i) => {
      output[name] = finals[i];
      if (drain.log.failureError) this.ctx.log.error({ session_id: this.id, stream: name, error: drain.log.failureError }, 'the stream stopped storing');
    });
    await this.finish({
      ...this.identityFacts(),
      startedAt: this.startedAt,
      leaderExitedAt: this.leaderExitedAt,
      endedAt: new Date(),
      exit: this.exit,
      spawnFailure: this.spawnFailure,
      cause: this.cause,
      steps: this.steps,
      signalsSent: this.signalsSent,
      death: death!,
      output,
      usage,
      descendantsTerminated: this.descendantsTerminated ?? 0,
      workspace: await workspace.then(async (w) => (await reaped, w)),
      handedOff: this.handedOff,
    });
  }

  /**
   * Closes what we held of the session's stdio: the pty slave (the master then reads what is
   * buffered, then EIO: docs/design/facts.md 16) and the stdin pipe. Idempotent. A slave fd
   * that is no terminal any more was hung up (vhangup(2), TIOCVHANGUP: every open file of the
   * tty then answers EIO, tty_ioctl(4)), and the hangup flushed what was in flight to the
   * master, unseen there: the pty stream is then never complete (pty_hangup).
   */
  private releaseStdio(): void {
    if (this.pty && this.pty.slave >= 0) {
      if (!isatty(this.pty.slave)) this.drains.get('pty')?.sawHangup();
      closeSync(this.pty.slave);
      this.pty.slave = -1;
    }
    this.stdin?.release();
  }

  /**
   * Waits for every stream to end. Every writer in the session is dead by now; an fd passed
   * outside may still hold a pipe, so each stream's wait is bounded (postDeathDrainMs, not
   * counting time it waits on its own disk writes for what the pipe held at the writers'
   * death: StreamDrain.startBound) and a cut stream is marked incomplete.
   */
  private async drainAll(): Promise<void> {
    for (const d of this.drains.values()) d.startBound(this.ctx.config.drain.postDeathDrainMs, this.ctx.config.drain.pipeBytes);
    await Promise.all([...this.drains.values()].map((d) => d.done));
  }

  /** The shim could not be started at all (no fork, no pipe): nothing ran, and the empty leaf (or nothing) says so. */
  private async failToStart(err: NodeJS.ErrnoException): Promise<void> {
    this.ctx.log.error({ session_id: this.id, code: err.code, message: err.message }, 'could not start the exec shim');
    const now = new Date();
    const mount = this.ctx.tree?.mount.mountPoint ?? null;
    const death =
      this.leaf && mount ? cgroupEmpty(this.leaf.path, mount, now) : liveDeath({ leafPath: null, mountPoint: null, shimReport: { reaped: 0 } }, now)!;
    await this.finish({
      ...this.identityFacts(),
      startedAt: null,
      leaderExitedAt: null,
      endedAt: now,
      exit: { code: null, signal: null },
      spawnFailure: { stage: 'spawn', errno: -(err.errno ?? 0), code: err.code ?? 'EUNKNOWN' },
      cause: null,
      steps: [],
      death,
      output: {},
      usage: {},
      descendantsTerminated: 0,
      workspace: await this.ctx.watcher.settle(this.id),
    });
  }
}
