// The registry: every session by id and by invocation key (session-table.ts), restored from the
// state dir at start, launched (the request made by launch-request.ts, the decision admission.ts's),
// found for every request, and shut down so that each is settled. Its parts are built and wired in
// compose.ts; seal and close are close.ts, tasks task/close.ts, retention retention.ts, status status.ts.
import { userInfo } from 'node:os';
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
import { keyRecordName } from '../core/state/names.js';
import { admit, commandOf } from './admission.js';
import { launchRequest, SERVICE_KEY_PREFIX } from './launch-request.js';
import { hasLimits, limitHost, limitRefusal } from './limits.js';
import type { Checkpoints } from './checkpoint/checkpoint.js';
import type { Closing } from './close.js';
import type { Tasks } from './task/close.js';
import type { Config } from './config.js';
import { faultPoint } from '../core/fault.js';
import { newSessionId, type StateDirLock } from './identity.js';
import type { Reconciliation } from './reconciliation.js';
import { restoreSessions } from './restore.js';
import type { Retention } from './retention.js';
import type { OperatorAttestation, SessionContext, SessionRequest } from './session/context.js';
import { isSettled } from './session/lifecycle.js';
import { LiveSession } from './session/live.js';
import type { Session } from './session/session.js';
import type { SessionTable } from './session-table.js';
import type { StatusReporter } from './status.js';
import type { KeyIndex } from './store/records.js';
import type { SupervisorMetrics } from './metrics/registry.js';
import { errnoCode } from '../ipc/errno.js';

/** What the registry is made of, each built by compose.ts before it (the session context reaches back for handoffs: admitHandoff). */
export interface RegistryParts {
  config: Config;
  log: Logger;
  ctx: SessionContext;
  /** This state dir's flock, held for the supervisor's life. */
  lock: StateDirLock;
  /** The Prometheus counters moved here and by the server and checkpoints (null: metrics off). */
  metrics: SupervisorMetrics | null;
  sessions: SessionTable;
  keys: KeyIndex;
  closing: Closing;
  retention: Retention;
  checkpoints: Checkpoints;
  tasks: Tasks;
  status: StatusReporter;
  reconciliation: Reconciliation;
  /** Aborted when shutdown begins (the task close reads it too). */
  stop: AbortController;
  /** Whether launches are taken now, and if not why (admission.ts admissionState over the parts above; status says the same). */
  admissionState: () => StatusResult['admission'];
}

export class Supervisor {
  readonly config: Config;
  readonly log: Logger;
  readonly ctx: SessionContext;
  readonly lock: StateDirLock;
  readonly metrics: SupervisorMetrics | null;
  /** Checkpoints of workspaces and their store (checkpoint/checkpoint.ts). */
  readonly checkpoints: Checkpoints;
  /** What `sbx status` says (status.ts); main sets its listeners' addresses once they listen. */
  readonly statusReporter: StatusReporter;
  private readonly sessions: SessionTable;
  private readonly keys: KeyIndex;
  private readonly closing: Closing;
  private readonly retention: Retention;
  /** Task seals and task closes (task/close.ts). */
  private readonly tasks: Tasks;
  private readonly reconciliation: Reconciliation;
  private readonly stop: AbortController;
  private readonly admissionNow: () => StatusResult['admission'];
  private stopping: Promise<void> | null = null;
  /**
   * The supervisor's own user (name, home: a session without --user gets them), looked up
   * once: getpwuid_r(3) opens the user database, so a launch at the fd limit would fail in it.
   */
  private readonly self = userInfo();

  constructor(parts: RegistryParts) {
    this.config = parts.config;
    this.log = parts.log;
    this.ctx = parts.ctx;
    this.lock = parts.lock;
    this.metrics = parts.metrics;
    this.checkpoints = parts.checkpoints;
    this.statusReporter = parts.status;
    this.sessions = parts.sessions;
    this.keys = parts.keys;
    this.closing = parts.closing;
    this.retention = parts.retention;
    this.tasks = parts.tasks;
    this.reconciliation = parts.reconciliation;
    this.stop = parts.stop;
    this.admissionNow = parts.admissionState;
  }

  get mode(): SupervisorMode {
    return this.ctx.identity.mode;
  }

  /**
   * Loads every session in the state dir (restore.ts): ended, unknown until reconcile(), or
   * broken (unreadable files, unknown with the reason). Never stops start-up. Called once, by
   * compose.ts, before anything is served.
   */
  restore(): void {
    for (const session of restoreSessions(this.ctx, this.keys, this.retention)) this.register(session);
    const unknown = [...this.sessions.all()].filter((s) => s.state === 'unknown').length;
    this.reconciliation.deciding = unknown > 0;
    this.metrics?.foundUnknown(unknown);
    this.log.info({ sessions: this.sessions.size, unknown }, 'state restored');
  }

  private register(session: Session): void {
    this.sessions.add(session);
    session.on('state', (state) => {
      this.metrics?.sessionState(session, state);
      if (state === 'ended') this.retention.keepFree();
    });
  }

  /** Settles every session a restart left unknown (reconciliation.ts); admission opens in the same tick. Resolves once every one is settled. */
  reconcile(): Promise<void> {
    return this.reconciliation.begin(this.sessions.all());
  }

  /** Whether new launches are taken, and if not why (admission.ts admissionState): what status says. */
  admissionState(): StatusResult['admission'] {
    return this.admissionNow();
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
    if (this.stop.signal.aborted) return Promise.reject(new SupervisorError('SHUTTING_DOWN', 'the supervisor is stopping'));
    return this.closing.close(
      {
        sessions: () => [...this.sessions.all()],
        tasks: this.tasks,
        taskNames: () => this.taskNames(),
        stopping: () => this.stop.signal.aborted,
        checkpointsSettled: () => this.checkpoints.settled(),
      },
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
    for (const s of this.sessions.all()) add(s.req.task);
    for (const task of this.retention.retiredTasks()) add(task);
    return [...names].sort();
  }

  /** One task's close (task/close.ts): seal, settle, checkpoint, read back, fence, the signed task receipt. TASK_CONFLICT, INVALID_ARGUMENT. */
  closeTask(task: string, timeoutMs: number, workspaces: string[] | undefined): Promise<TaskReceipt> {
    if (this.stop.signal.aborted) return Promise.reject(new SupervisorError('SHUTTING_DOWN', 'the supervisor is stopping'));
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
    const stopping = this.stop.signal.aborted;
    const { request, command } = launchRequest(params, { config: this.config, self: this.self, cgroup: this.ctx.tree !== null });
    const { invocationKey: key, commandDigest: digest } = request;
    const limits = request.limits ?? {};
    const task = request.task ?? DEFAULT_TASK;

    const storage = this.ctx.storage;
    let freeBytes = storage.freeBytes();
    // (Stopping: retention removes nothing to make room for a launch that will be refused.)
    if (freeBytes < storage.minFreeBytes && !stopping) {
      this.retention.keepFree();
      freeBytes = storage.freeBytes();
    }
    const existing = this.sessions.byKey(key);
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
        liveSessions: this.sessions.liveCount(),
        maxSessions: this.config.session.maxSessions,
        reconciling: this.reconciliation.deciding,
        disk: { admits: freeBytes >= storage.minFreeBytes, freeBytes, minFreeBytes: storage.minFreeBytes },
        limitRefusal: hasLimits(limits) ? limitRefusal(limits, limitHost(this.ctx.tree)) : null,
        stopping,
      },
    );
    if (decision.kind === 'refuse') throw decision.error;
    if (decision.kind === 'existing')
      return {
        result: { session_id: decision.sessionId, invocation_key: key, existing: true, state: decision.state, command_digest: digest },
        session: this.sessions.get(decision.sessionId) ?? null,
      };

    const session = new LiveSession(newSessionId(), request, this.ctx);
    // Admission record (durable), then key record (rebuilt from it after a crash), then spawn (docs/design/facts.md 9).
    let keyStep = false;
    try {
      session.admit();
      keyStep = true;
      this.keys.writeAfterAdmission({ invocation_key: key, session_id: session.id, command_digest: digest, admitted_at: session.admittedAt.toISOString() });
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
  admitHandoff(origin: { id: string; req: SessionRequest }): LiveSession {
    if (this.stop.signal.aborted) throw new SupervisorError('SHUTTING_DOWN', 'the supervisor is stopping');
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
      this.keys.writeAfterAdmission({
        invocation_key: key,
        session_id: service.id,
        command_digest: origin.req.commandDigest,
        admitted_at: service.admittedAt.toISOString(),
      });
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
      ? this.sessions.byIdOrPrefix(selector.session_id)
      : selector.invocation_key
        ? this.sessions.byKey(selector.invocation_key)
        : undefined;
    if (session) return session;
    const gone = this.retention.tombstone({ sessionId: selector.session_id, invocationKey: selector.invocation_key });
    const what = selector.session_id
      ? `session ${gone && gone.session_id !== selector.session_id ? `${gone.session_id} (by its prefix ${selector.session_id})` : selector.session_id}`
      : `invocation key ${JSON.stringify(selector.invocation_key)}`;
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

  /** Sessions not ended, or every one. */
  list(all: boolean): Session[] {
    return [...this.sessions.all()].filter((s) => all || s.state !== 'ended');
  }

  /**
   * Stops admission, terminates every session (cause shutdown), and waits until each is
   * settled: a receipt, or unknown (one whose receipt cannot be written, or whose evidence was
   * lost, never gets one: waiting for its `ended` would never return). Recovered sessions
   * still being ended by reconciliation are waited for too.
   */
  shutdown(): Promise<void> {
    this.stopping ??= (async () => {
      this.stop.abort();
      this.checkpoints.refuseFreezing(); // a session writing to a frozen workspace could not end
      const live = [...this.sessions.all()].filter((s) => !isSettled(s.state));
      this.log.info({ sessions: live.length }, 'shutting down: terminating sessions');
      await Promise.all(live.map((s) => s.terminate('shutdown')));
      await Promise.all(live.map((s) => s.settled()));
      await this.reconciliation.settled();
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
