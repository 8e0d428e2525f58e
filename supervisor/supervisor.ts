// The registry: every session by id and by invocation key, restored from the state dir at
// start (recovered sessions: ended, or unknown until reconciliation), launched (the request made
// by launch-request.ts, the decision admission.ts's), found for every request, and shut down so
// that each is settled. Seal and close are close.ts, retention retention.ts, status status.ts.
import { mkdirSync } from 'node:fs';
import { userInfo } from 'node:os';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { isSupervisorError, SupervisorError } from '../ipc/errors.js';
import type { GcResult, SealResult } from '../ipc/methods.js';
import {
  DEFAULT_TASK,
  type CloseReceipt,
  type LaunchParams,
  type LaunchResult,
  type Receipt,
  type SessionSelector,
  type StatusResult,
  type SupervisorMode,
  type TaskReceipt,
  type TaskSealResult,
} from '../ipc/protocol.js';
import { keyRecordName, STATE } from '../core/state/names.js';
import { admit, commandOf } from './admission.js';
import { launchRequest, SERVICE_KEY_PREFIX } from './launch-request.js';
import { CgroupTree } from './cgroup.js';
import { defaultLimitsProblem, hasLimits, limitHost, limitRefusal } from './limits.js';
import { Checkpoints, thawLeftFrozen } from './checkpoint/checkpoint.js';
import { Closing } from './close.js';
import { Tasks } from './task/close.js';
import { ConfigError, type Config } from './config.js';
import { faultPoint } from '../core/fault.js';
import { checkWorkspacePaths, WorkspaceWatcher } from './workspace/watcher.js';
import { EscapeWatch } from './session/escape.js';
import { newSessionId, readBootId, StateDirLock, takeGeneration } from './identity.js';
import { native } from '../core/fs/native.js';
import { Reaper } from './reaper.js';
import { restoreSessions } from './restore.js';
import { Retention } from './retention.js';
import type { OperatorAttestation, SessionContext, SessionRequest } from './session/context.js';
import { isSettled } from './session/lifecycle.js';
import { LiveSession } from './session/live.js';
import { RecoveredSession } from './session/recovered.js';
import type { Session } from './session/session.js';
import { ReceiptSigner } from './signing.js';
import { StatusReporter } from './status.js';
import { HashPool, hashWorkerPath } from './store/hasher.js';
import { KeyIndex } from './store/records.js';
import { StorageGuard, thresholdWarnings } from './store/storage.js';
import type { SupervisorMetrics } from './metrics/registry.js';
import { errnoCode } from '../ipc/errno.js';

/** The shortest session id prefix find() resolves (a shorter one must be the exact id): 3 characters, as `s-` starts every id. */
export const MIN_ID_PREFIX = 3;

/** At most this many ids in an ambiguous prefix's details.matches (details.count has them all). */
const MAX_PREFIX_MATCHES = 100;

export class Supervisor {
  private readonly sessions = new Map<string, Session>();
  private readonly byKey = new Map<string, Session>();
  private stopping: Promise<void> | null = null;
  /** True until reconciliation has decided the course of every session left unknown by a restart. */
  private reconciling = false;
  /** Reconciliation's background part (escalations of recovered sessions), for shutdown to settle. */
  private reconciliation: Promise<void> = Promise.resolve();
  /** Each recovered session's reconciliation while it runs, by session id (a task close waits for its own sessions' only). */
  private readonly reconcilingSessions = new Map<string, Promise<void>>();
  private readonly keys: KeyIndex;
  private readonly closing: Closing;
  private readonly retention: Retention;
  private readonly statusReporter: StatusReporter;
  /** Checkpoints of workspaces and their store (checkpoint/checkpoint.ts). */
  readonly checkpoints: Checkpoints;
  /** Task seals and task closes (task/close.ts). */
  private readonly tasks: Tasks;
  /**
   * The supervisor's own user (name, home: a session without --user gets them), looked up
   * once: getpwuid_r(3) opens the user database, so a launch at the fd limit would fail in it.
   */
  private readonly self = userInfo();

  /** Where the metrics endpoint listens (status shows it); null: metrics off. Set by main once it listens. */
  metricsAddress: string | null = null;
  /** The WebSocket listener's URL (status shows it); null: off. Set by main once it listens. */
  remoteUrl: string | null = null;

  /**
   * `lock`: this state dir's flock, held for the supervisor's life. `metrics`: the Prometheus
   * counters moved here and by the server and checkpoints (null: metrics off).
   */
  private constructor(
    readonly config: Config,
    readonly log: Logger,
    readonly ctx: SessionContext,
    readonly lock: StateDirLock,
    readonly metrics: SupervisorMetrics | null,
  ) {
    this.keys = new KeyIndex(config.stateDir);
    ctx.admitHandoff = (origin) => this.admitHandoff(origin);
    this.closing = new Closing(ctx, log);
    this.retention = new Retention(config, log, ctx.storage, ctx.sessionsDir, {
      sessions: () => this.sessions.values(),
      forget: (s) => {
        this.sessions.delete(s.id);
        this.byKey.delete(s.req.invocationKey);
      },
      isClosed: () => this.closing.closed,
      freed: () => this.statusReporter.invalidate(),
    });
    this.statusReporter = new StatusReporter({
      ctx,
      sessionStates: () => [...this.sessions.values()].map((s) => s.state),
      admissionState: () => this.admissionState(),
      sealRecord: () => this.closing.seal,
      checkpointStore: () => this.checkpoints.location,
      metricsAddress: () => this.metricsAddress,
      remoteUrl: () => this.remoteUrl,
    });
    ctx.storage.onBelowKeepFree = () => this.retention.keepFree();
    this.checkpoints = new Checkpoints({
      config,
      log,
      identity: ctx.identity,
      signer: ctx.signer,
      watcher: ctx.watcher,
      reserveBytes: () => Math.max(ctx.storage.minFreeBytes, ctx.storage.keepFreeBytes),
      pinned: () => this.tasks.pinnedCheckpoints(),
      metrics,
    });
    this.checkpoints.recover();
    this.tasks = new Tasks({
      ctx,
      checkpoints: this.checkpoints,
      // A service kept after close is the sandbox-wide close's, not its task's.
      sessionsOf: (task) => [...this.sessions.values()].filter((s) => (s.req.task === task || s.req.task === null) && !s.req.service?.keep_after_close),
      reconciled: (sessions) => Promise.all(sessions.map((s) => this.reconcilingSessions.get(s.id))).then(() => {}),
      retiredOf: (task) => this.retention.retiredOf(task),
      stopping: () => this.stopping !== null,
    });
    this.restore();
  }

  /** Prepares the state dir, identity, subreaper and cgroup subtree; throws with a reason. metrics: the Prometheus hooks, or null. */
  static create(config: Config, log: Logger, metrics: SupervisorMetrics | null = null): Supervisor {
    const workspacePaths = checkWorkspacePaths(config.workspace.paths, config.stateDir);
    mkdirSync(config.stateDir, { recursive: true, mode: 0o700 });
    const lock = StateDirLock.take(config.stateDir);
    thawLeftFrozen(config, log); // before the watcher writes in a workspace a crash left frozen
    const sessionsDir = join(config.stateDir, STATE.sessionsDir);
    mkdirSync(sessionsDir, { recursive: true, mode: 0o700 });
    const { instance, generation } = takeGeneration(config.stateDir, sessionsDir, log);

    const reaper = new Reaper();
    reaper.start();
    let tree: CgroupTree | null = null;
    let mode: SupervisorMode = 'subreaper';
    if (config.cgroup.mode !== 'subreaper') {
      try {
        tree = CgroupTree.setup(config.cgroup.parent);
        mode = 'cgroup';
      } catch (err) {
        if (config.cgroup.mode === 'cgroup') {
          throw new Error(`cgroup mode was required but no writable cgroup2 is available: ${(err as Error).message}`);
        }
        log.warn({ reason: (err as Error).message }, 'no writable cgroup v2: running in subreaper mode (death evidence: subreaper_reaped)');
      }
    }
    // Default limits this host cannot enforce: no session may run without them, so none starts.
    const limitsProblem = defaultLimitsProblem(config.session.defaultLimits, limitHost(tree));
    if (limitsProblem) {
      tree?.teardown();
      reaper.stop();
      throw new ConfigError(limitsProblem);
    }
    const storage = new StorageGuard(config.stateDir, config.storage);
    for (const warning of thresholdWarnings(storage, storage.totalBytes)) log.warn({ state_dir: config.stateDir }, warning);
    hashWorkerPath(); // fails start-up, naming where it looked, rather than every receipt later
    const bootId = readBootId();
    const ctx: SessionContext = {
      config,
      log,
      reaper,
      tree,
      sessionsDir,
      identity: { instance, generation, bootId, mode, pid: process.pid },
      signer: ReceiptSigner.loadOrCreate(config.stateDir),
      storage,
      // Its threads start now, not with the first session: their ~20 MiB and ~40 ms are paid
      // once at start, not by the first command's receipt.
      hashPool: new HashPool((reason) =>
        log.error({ reason }, 'a hashing thread failed; replaced (its streams are hashed again from their chunk files)'),
      ).warm(),
      escapes: EscapeWatch.open(tree?.mount.mountPoint ?? null, log),
      watcher: new WorkspaceWatcher({
        paths: workspacePaths,
        stateDir: config.stateDir,
        bootId,
        cgroupMount: tree?.mount.mountPoint ?? '',
        log,
        barrierTimeoutMs: config.workspace.barrierTimeoutMs,
        scanDeadlineMs: config.workspace.scanDeadlineMs,
        changesMaxEntries: config.workspace.changesMaxEntries,
        batchMs: config.workspace.batchMs,
        maxQueuedEvents: config.workspace.maxQueuedEvents,
        reportModify: config.workspace.reportModify,
      }),
      admitHandoff: () => {
        throw new Error('no registry yet');
      },
    };
    // Exited children stay zombies until the watcher has read past them (their events' pidfds
    // still name their cgroup): attribution of writers that exit at once (reaper.ts).
    if (workspacePaths.length > 0 && config.workspace.holdExited) {
      const watcher = ctx.watcher;
      reaper.setFence(() => (watcher.watching ? watcher.readFence() : Promise.resolve(false)));
    }
    log.info({ instance, generation, mode, cgroup: tree?.basePath ?? null, subreaper: native().isChildSubreaper() }, 'supervisor ready');
    try {
      return new Supervisor(config, log, ctx, lock, metrics);
    } catch (err) {
      // Nothing ran: the cgroup subtree made for this start goes with it.
      tree?.teardown();
      throw err;
    }
  }

  get mode(): SupervisorMode {
    return this.ctx.identity.mode;
  }

  /**
   * Loads every session in the state dir (restore.ts): ended, unknown until reconcile(), or
   * broken (unreadable files, unknown with the reason). Never stops start-up.
   */
  private restore(): void {
    for (const session of restoreSessions(this.ctx, this.keys, this.retention)) this.register(session);
    const unknown = [...this.sessions.values()].filter((s) => s.state === 'unknown').length;
    this.reconciling = unknown > 0;
    this.metrics?.foundUnknown(unknown);
    this.log.info({ sessions: this.sessions.size, unknown }, 'state restored');
  }

  private register(session: Session): void {
    this.sessions.set(session.id, session);
    this.byKey.set(session.req.invocationKey, session);
    session.on('state', (state) => {
      this.metrics?.sessionState(session, state);
      if (state === 'ended') this.retention.keepFree();
    });
  }

  /**
   * Settles every unknown session with evidence where there is some (owner_lost receipts).
   * Each session's course is decided at once (RecoveredSession.reconcile decides before its
   * first await) and admission of new keys opens right after, in the same tick: ending a
   * TERM-ignoring leaf takes its grace (up to 30 days), and runs on in the background while
   * retries of its key answer with the session, unknown until its receipt is written.
   * Resolves once every one of them is settled.
   */
  reconcile(): Promise<void> {
    const unknown = [...this.sessions.values()].filter((s): s is RecoveredSession => s instanceof RecoveredSession && s.state === 'unknown');
    const settling = unknown.map((s) => {
      const done = s
        .reconcile()
        .then(
          () => this.metrics?.reconciled(s.state === 'ended' ? 'ended' : 'unknown'),
          (err: Error) => {
            this.metrics?.reconciled('failed');
            this.log.error({ err, session_id: s.id }, 'reconciliation failed; the session stays unknown');
          },
        )
        .finally(() => this.reconcilingSessions.delete(s.id));
      this.reconcilingSessions.set(s.id, done);
      return done;
    });
    this.reconciling = false;
    this.log.info({ sessions: unknown.length, being_ended: unknown.filter((s) => s.state === 'unknown').length }, 'reconciliation decided; admission open');
    this.reconciliation = Promise.all(settling).then(() => {
      const left = unknown.filter((s) => s.state === 'unknown').length;
      this.log.info({ reconciled: unknown.length - left, still_unknown: left }, 'reconciliation done');
    });
    return this.reconciliation;
  }

  /** Whether new launches are taken, and if not why. */
  admissionState(): StatusResult['admission'] {
    return this.stopping ? 'stopping' : this.closing.seal ? 'sealed' : this.reconciling ? 'reconciling' : this.ctx.storage.admits() ? 'open' : 'disk_low';
  }

  /** Stops admission for good (durable; a restart does not unseal). Idempotent. */
  seal(): SealResult {
    return this.closing.sealNow();
  }

  /** Stops admission of new keys in one task for good (durable); other tasks go on. Idempotent. */
  sealTask(task: string): TaskSealResult {
    return this.tasks.seal(task);
  }

  /** The sandbox-wide close (close.ts): seal, settle every session, every task's close, scan, the signed close receipt (written once complete). */
  close(timeoutMs: number, workspaces: string[]): Promise<CloseReceipt> {
    if (this.stopping) return Promise.reject(new SupervisorError('SHUTTING_DOWN', 'the supervisor is stopping'));
    return this.closing.close(
      { sessions: () => [...this.sessions.values()], tasks: this.tasks, taskNames: () => this.taskNames(), stopping: () => this.stopping !== null },
      timeoutMs,
      workspaces,
    );
  }

  /**
   * Every task with a session or a retired one's tombstone, sorted; a session (or tombstone)
   * of no known task puts the task default in (it is every task's: each join lists it).
   */
  private taskNames(): string[] {
    const names = new Set<string>();
    const add = (task: string | null | undefined) => names.add(task ?? DEFAULT_TASK);
    for (const s of this.sessions.values()) add(s.req.task);
    for (const task of this.retention.retiredTasks()) add(task);
    return [...names].sort();
  }

  /** One task's close (task/close.ts): seal, settle, checkpoint, read back, fence, the signed task receipt. TASK_CONFLICT, INVALID_ARGUMENT. */
  closeTask(task: string, timeoutMs: number, workspaces: string[] | undefined): Promise<TaskReceipt> {
    if (this.stopping) return Promise.reject(new SupervisorError('SHUTTING_DOWN', 'the supervisor is stopping'));
    // A closed state dir is an archive: a task close answers from it and writes nothing.
    return this.tasks.close(task, timeoutMs, workspaces, undefined, this.closing.final);
  }

  /** Applies the retention policy now (sbx gc): sessions' output and receipts, then the checkpoint store's unreferenced objects. */
  async gc(nowMs = Date.now()): Promise<GcResult> {
    const result = this.retention.gc(nowMs);
    if (result.closed) return result; // an archive: nothing is removed
    return { ...result, checkpoints: await this.checkpoints.gc(nowMs) };
  }

  /** Runs retention every retention.intervalMs (0: never by itself). */
  startRetention(): void {
    this.retention.start();
  }

  status(socketPath: string): Promise<StatusResult> {
    return this.statusReporter.status(socketPath);
  }

  /** Ends an unknown session on an operator's word (never automatic). */
  async resolve(selector: SessionSelector, operator: OperatorAttestation): Promise<Receipt> {
    const session = this.find(selector);
    const escaped = session.state === 'ended';
    const receipt = await session.resolveAsOperator(operator);
    this.log.warn(
      { session_id: session.id, operator },
      escaped ? "operator attested that an escaped session's processes are ended" : 'operator attested the end of an unknown session',
    );
    return receipt;
  }

  /**
   * Admits and starts a session, or returns the existing one for the same invocation key
   * and command digest (admission.ts decides); KEY_CONFLICT when the key was used for
   * another command. Admission record, key record, then spawn: all synchronous, so a
   * concurrent launch with this key finds it registered. Counted by outcome (metrics).
   */
  launch(params: LaunchParams): { result: LaunchResult; session: Session | null } {
    let launched: { result: LaunchResult; session: Session | null };
    try {
      launched = this.admitAndStart(params);
    } catch (err) {
      this.metrics?.launchRefused(err);
      throw err;
    }
    this.metrics?.launched(launched.result.existing ? 'existing' : 'started');
    return launched;
  }

  private admitAndStart(params: LaunchParams): { result: LaunchResult; session: Session | null } {
    if (this.stopping) throw new SupervisorError('SHUTTING_DOWN', 'the supervisor is stopping');
    const { request, command } = launchRequest(params, { config: this.config, self: this.self, cgroup: this.ctx.tree !== null });
    const { invocationKey: key, commandDigest: digest } = request;
    const limits = request.limits ?? {};
    const task = request.task ?? DEFAULT_TASK;

    const storage = this.ctx.storage;
    let freeBytes = storage.freeBytes();
    if (freeBytes < storage.minFreeBytes) {
      this.retention.keepFree();
      freeBytes = storage.freeBytes();
    }
    const existing = this.byKey.get(key);
    const retired = existing ? undefined : this.retention.tombstone({ invocationKey: key });
    const decision = admit(
      { invocationKey: key, commandDigest: digest, task, command },
      {
        existing: existing
          ? {
              sessionId: existing.id,
              commandDigest: existing.req.commandDigest,
              state: existing.state,
              task: existing.req.task,
              command: commandOf(existing.req),
            }
          : null,
        retired: retired
          ? { sessionId: retired.session_id, commandDigest: retired.command_digest, task: retired.task === undefined ? DEFAULT_TASK : retired.task }
          : null,
        sealed: this.closing.seal ?? this.tasks.sealOf(task),
        liveSessions: this.liveSessions(),
        maxSessions: this.config.session.maxSessions,
        reconciling: this.reconciling,
        disk: { admits: freeBytes >= storage.minFreeBytes, freeBytes, minFreeBytes: storage.minFreeBytes },
        limitRefusal: hasLimits(limits) ? limitRefusal(limits, limitHost(this.ctx.tree)) : null,
      },
    );
    if (decision.kind === 'refuse') throw decision.error;
    if (decision.kind === 'existing')
      return {
        result: { session_id: decision.sessionId, invocation_key: key, existing: true, state: decision.state, command_digest: digest },
        session: this.sessions.get(decision.sessionId) ?? null,
      };

    const session = new LiveSession(newSessionId(), request, this.ctx);
    // Admission record, then key record, both durable, then spawn (docs/design/facts.md 9).
    let keyStep = false;
    try {
      session.admit();
      keyStep = true;
      this.keys.write({ invocation_key: key, session_id: session.id, command_digest: digest, admitted_at: session.admittedAt.toISOString() });
    } catch (err) {
      this.log.error({ err, session_id: session.id }, 'admission failed');
      session.abandon();
      // A limit the kernel refused to take (live.ts admit): nothing ran, the key is not taken.
      if (isSupervisorError(err, 'LIMIT_UNAVAILABLE')) throw err;
      if (keyStep && errnoCode(err) === 'EEXIST') {
        // The key has a record no session of ours claims: one the start found unreadable
        // (logged then). The key may have run; it never runs again.
        throw new SupervisorError(
          'KEY_CONFLICT',
          `invocation key ${JSON.stringify(key)} has a key record that cannot be read (${keyRecordName(key)}; see the supervisor's log); the key may have run and cannot run again`,
        );
      }
      throw new SupervisorError('ADMISSION_DENIED', `cannot record the admission: ${(err as Error).message}`, { retry_after_ms: 1000 });
    }
    this.register(session);
    faultPoint('launch:before-spawn');
    session.start();
    faultPoint('launch:started');
    // The command by its digest and name: argv may be megabytes (the kernel's ARG_MAX), and a
    // log line is written on the launch path.
    this.log.info(
      {
        session_id: session.id,
        invocation_key: key,
        task,
        command: params.argv[0].slice(0, 256),
        argc: params.argv.length,
        command_digest: digest,
        pid: session.pid,
      },
      'session launched',
    );
    void session.ended.then((receipt) => {
      if (receipt) this.log.info({ session_id: session.id, outcome: receipt.outcome, exit: receipt.exit }, 'session ended');
    });
    return { result: { session_id: session.id, invocation_key: key, existing: false, state: session.state, command_digest: digest }, session };
  }

  /**
   * The service a command's leftovers go on as (linger handoff, live.ts): the command's request
   * as it was (argv, cwd, env, user, task: what its processes are), with no stdin, pty or
   * deadline of its own, and its own key (`service:<origin id>`); admitted (record, key record,
   * frozen leaf) and registered as launch() does, not started. Throws when any step fails
   * (the origin then ends the leftovers: linger kill); nothing of it is left then.
   */
  private admitHandoff(origin: { id: string; req: SessionRequest }): LiveSession {
    if (this.stopping) throw new SupervisorError('SHUTTING_DOWN', 'the supervisor is stopping');
    const key = `${SERVICE_KEY_PREFIX}${origin.id}`;
    const service = new LiveSession(
      newSessionId(),
      {
        ...origin.req,
        invocationKey: key,
        timeoutMs: 0,
        linger: 'kill',
        pty: null,
        stdin: 'null',
        service: { handed_off_from: origin.id, keep_after_close: false },
      },
      this.ctx,
    );
    try {
      service.admit();
      this.keys.write({ invocation_key: key, session_id: service.id, command_digest: origin.req.commandDigest, admitted_at: service.admittedAt.toISOString() });
    } catch (err) {
      service.abandon();
      throw err;
    }
    this.register(service);
    this.log.info({ session_id: service.id, handed_off_from: origin.id }, 'service admitted for leftovers');
    return service;
  }

  /**
   * The session named by id or key, for every verb that takes one (the one place ids are
   * looked up). An id is taken as docker takes container ids: the exact id first, else a
   * unique prefix of at least MIN_ID_PREFIX characters among the sessions held (ended ones
   * included, retired ones not). Throws INVALID_ARGUMENT when the prefix names several,
   * details {field, prefix, matches: [ids, sorted, at most 100], count}; SESSION_NOT_FOUND when none (saying so when
   * retention removed it).
   */
  find(selector: SessionSelector): Session {
    const session = selector.session_id
      ? this.byIdOrPrefix(selector.session_id)
      : selector.invocation_key
        ? this.byKey.get(selector.invocation_key)
        : undefined;
    if (session) return session;
    const what = selector.session_id ? `session ${selector.session_id}` : `invocation key ${JSON.stringify(selector.invocation_key)}`;
    const gone = this.retention.tombstone({ sessionId: selector.session_id, invocationKey: selector.invocation_key });
    if (gone) {
      throw new SupervisorError(
        'SESSION_NOT_FOUND',
        `${what} was removed by the retention policy at ${gone.retired_at} (it ended ${gone.outcome}; receipt ${gone.receipt_sha256}); its key stays used`,
        {
          retired_at: gone.retired_at,
          receipt_sha256: gone.receipt_sha256,
          outcome: gone.outcome,
        },
      );
    }
    throw new SupervisorError('SESSION_NOT_FOUND', `no ${what}`);
  }

  /** The session of this exact id, else the one session whose id starts with it (3+ characters); undefined when none. */
  private byIdOrPrefix(id: string): Session | undefined {
    const exact = this.sessions.get(id);
    if (exact || id.length < MIN_ID_PREFIX) return exact;
    const matches: Session[] = [];
    for (const [sid, s] of this.sessions) if (sid.startsWith(id)) matches.push(s);
    if (matches.length <= 1) return matches[0];
    const ids = matches.map((s) => s.id).sort();
    const shown = ids.length > 10 ? `${ids.slice(0, 10).join(', ')}, ... (${ids.length} in all)` : ids.join(', ');
    throw new SupervisorError('INVALID_ARGUMENT', `session id prefix ${JSON.stringify(id)} is ambiguous: it matches ${shown}; give more of the id`, {
      field: 'session_id',
      prefix: id,
      matches: ids.slice(0, MAX_PREFIX_MATCHES),
      count: ids.length,
    });
  }

  /** Sessions not ended (unknown ones included: they may still run), against session.maxSessions. */
  liveSessions(): number {
    let n = 0;
    for (const s of this.sessions.values()) if (s.state !== 'ended') n++;
    return n;
  }

  /** Sessions not ended, or every one. */
  list(all: boolean): Session[] {
    return [...this.sessions.values()].filter((s) => all || s.state !== 'ended');
  }

  /**
   * Stops admission, terminates every session (cause shutdown), and waits until each is
   * settled: a receipt, or unknown (one whose receipt cannot be written, or whose evidence was
   * lost, never gets one: waiting for its `ended` would never return). Recovered sessions
   * still being ended by reconciliation are waited for too.
   */
  shutdown(): Promise<void> {
    this.stopping ??= (async () => {
      this.checkpoints.refuseFreezing(); // a session writing to a frozen workspace could not end
      const live = [...this.sessions.values()].filter((s) => !isSettled(s.state));
      this.log.info({ sessions: live.length }, 'shutting down: terminating sessions');
      await Promise.all(live.map((s) => s.terminate('shutdown')));
      await Promise.all(live.map((s) => s.settled()));
      await this.reconciliation;
      this.ctx.reaper.reapNow();
      this.ctx.reaper.stop();
      this.ctx.tree?.teardown();
      await this.ctx.watcher.stop();
      this.ctx.escapes.stop();
      await this.checkpoints.stop();
    })();
    return this.stopping;
  }
}
