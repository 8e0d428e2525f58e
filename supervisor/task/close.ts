// Tasks: their seals, and the close that ends one (docs/guide/tasks.md "Tasks: complete(task)"): close
// record, attempt, seal, settle, final checkpoint per workspace, fence, join (join.ts) and the signed task
// receipt, in that order (Tasks.run). A complete receipt is final; an incomplete one is replaced by the next
// attempt. Crash points (fault.ts): task-close:* and checkpoint:* (checkpoint/), listed at Tasks.run.
import { join, resolve } from 'node:path';
import { SupervisorError } from '../../ipc/errors.js';
import type { CheckpointResult, Receipt, TaskCheckpointEntry, TaskReceipt, TaskSealResult, TaskSessionEntry } from '../../ipc/protocol.js';
import { readRecord } from '../../core/state/records.js';
import { STATE, taskDirName } from '../../core/state/names.js';
import { receiptDigest } from '../../core/receipts/verify.js';
import type { Checkpoints } from '../checkpoint/checkpoint.js';
import type { PublishedCheckpoint } from '../checkpoint/published.js';
import { realWorkspace } from '../checkpoint/workspace-check.js';
import { mountsSkipped } from '../../core/checkpoint/manifest.js';
import { faultPoint } from '../../core/fault.js';
import { setDeadline } from '../timers.js';
import type { SessionContext } from '../session/context.js';
import { isLive, isSettled } from '../session/lifecycle.js';
import type { Session } from '../session/session.js';
import { evaluateTask, receiptWorkspaces, sealFloor, sessionCovered, type JoinSession, type JoinWorkspace } from '../../core/task/join.js';
import type { TombstoneRecord } from '../store/records.js';
import { readTaskSeals, sweepTaskTemps, TaskFiles, type TaskAttemptRecord, type TaskCloseRecord, type TaskSealRecord } from './records.js';
import { testHooks } from '../../core/test-hooks.js';

export interface TaskDeps {
  ctx: SessionContext;
  checkpoints: Checkpoints;
  /** The sessions of a task: those launched in it, and those whose task cannot be read (they may be its). */
  sessionsOf: (task: string) => Session[];
  /** Resolves once the reconciliation of these sessions (those a restart left) is done: their receipts written, or stuck unknown. Another task's are not waited for. */
  reconciled: (sessions: Session[]) => Promise<void>;
  /** Tombstones of the task's sessions the retention policy removed whole. */
  retiredOf: (task: string) => TombstoneRecord[];
  /** Whether the supervisor is stopping (a close then claims nothing: SHUTTING_DOWN). */
  stopping: () => boolean;
}

/** How long a task's sessions may end by themselves before close terminates them, when not given. */
export const DEFAULT_TASK_CLOSE_TIMEOUT_MS = 60_000;

function sameSet(a: string[], b: string[]): boolean {
  const x = [...new Set(a)].sort();
  const y = [...new Set(b)].sort();
  return x.length === y.length && x.every((v, i) => v === y[i]);
}

/** A workspace with no published checkpoint: why (error), or none yet (waiting for a session's end). */
function noCheckpoint(workspace: string, err: SupervisorError | null, attempt: number | null): TaskCheckpointEntry {
  const stage = typeof err?.details?.stage === 'string' ? err.details.stage : null;
  return {
    workspace,
    checkpoint_id: null,
    store: null,
    started_at: null,
    boundary: null,
    scan_digest: null,
    consistent: null,
    unstable: [],
    unstable_count: 0,
    mounts_skipped: [],
    read_back: null,
    fence: null,
    close_attempt: attempt,
    error: err ? { code: err.code, stage, message: err.message } : null,
  };
}

/** A session the retention policy removed whole, as the task receipt lists it (from its tombstone). */
function retiredEntry(r: TombstoneRecord, workspaces: JoinWorkspace[]): TaskSessionEntry {
  return {
    session_id: r.session_id,
    invocation_key: r.invocation_key,
    task: r.task === undefined ? 'default' : r.task,
    state: 'retired',
    outcome: r.outcome as TaskSessionEntry['outcome'],
    exit: null,
    receipt_sha256: r.receipt_sha256,
    uid: null,
    death: null,
    ended_at: r.ended_at,
    output: {},
    workspace: workspaces.map((w) => ({
      path: w.path,
      root: w.root,
      epoch: null,
      terminal_mutation: null,
      gap: w.root === null ? 'not_watched' : null,
      scan_digest: null,
    })),
  };
}

/** What a task receipt says of a published checkpoint read back from the local store (published.ts): its manifest's facts and its record's read-back. */
function publishedEntry(workspace: string, p: PublishedCheckpoint, store: string): TaskCheckpointEntry {
  const { manifest, record } = p;
  return {
    workspace,
    checkpoint_id: p.id,
    store,
    started_at: manifest.started_at,
    boundary: manifest.boundary,
    scan_digest: manifest.scan.digest,
    consistent: manifest.consistent,
    unstable: manifest.unstable.slice(0, 100),
    unstable_count: manifest.unstable.length,
    mounts_skipped: mountsSkipped(manifest),
    read_back: { exact: true, objects: record.read_back.objects, bytes: record.read_back.bytes, at: record.read_back.at },
    fence: { instance: manifest.supervisor.instance, generation: manifest.supervisor.generation, boot_id: manifest.supervisor.boot_id },
    close_attempt: manifest.close_attempt ?? null,
    error: null,
  };
}

/** A published checkpoint as the task receipt lists it. */
function checkpointEntry(workspace: string, r: CheckpointResult, attempt: number): TaskCheckpointEntry {
  return {
    workspace,
    checkpoint_id: r.checkpoint_id,
    store: r.store,
    started_at: r.started_at,
    boundary: r.boundary,
    scan_digest: r.scan.digest,
    consistent: r.consistent,
    unstable: r.unstable,
    unstable_count: r.unstable_count,
    leased: r.leased,
    leased_count: r.leased_count,
    mounts_skipped: r.mounts_skipped,
    read_back: { exact: true, objects: r.read_back.objects, bytes: r.read_back.bytes, at: r.read_back.at },
    fence: { instance: r.supervisor.instance, generation: r.supervisor.generation, boot_id: r.supervisor.boot_id },
    close_attempt: attempt,
    error: null,
  };
}

/** The task seals of one state dir, and the close of each task. */
export class Tasks {
  private readonly seals: Map<string, TaskSealRecord>;
  /** Task dirs whose seal cannot be read: their task (a hash) is sealed, the safe reading. */
  private readonly unreadableSeals = new Set<string>();
  private readonly closing = new Map<string, { workspaces: string[]; done: Promise<TaskReceipt> }>();

  constructor(private readonly deps: TaskDeps) {
    const { config, log } = deps.ctx;
    this.seals = readTaskSeals(config.stateDir, (dir, err) => {
      this.unreadableSeals.add(dir.slice(-64));
      log.error({ dir, err }, 'a task seal is unreadable; that task stays sealed');
    });
    const swept = sweepTaskTemps(config.stateDir);
    if (swept) log.warn({ files: swept }, 'removed temp files of task records a crash cut short');
  }

  /** The task's seal, if sealed (a task whose seal cannot be read is sealed). */
  sealOf(task: string): { generation: number; sealed_at: string; task: string } | null {
    const seal = this.seals.get(task);
    if (seal) return seal;
    if (this.unreadableSeals.size && this.unreadableSeals.has(taskDirName(task)))
      return { task, generation: this.deps.ctx.identity.generation, sealed_at: new Date(0).toISOString() };
    return null;
  }

  /** Seals the task's admission for good (durable; a restart does not unseal). Idempotent. */
  seal(task: string): TaskSealResult {
    const had = this.sealOf(task);
    if (had) return { task, generation: had.generation, sealed_at: had.sealed_at, already_sealed: true };
    const record: TaskSealRecord = { task, generation: this.deps.ctx.identity.generation, sealed_at: new Date().toISOString() };
    new TaskFiles(this.deps.ctx.config.stateDir, task).writeSeal(record);
    this.seals.set(task, record);
    this.deps.ctx.log.info(record, 'task admission sealed');
    return { ...record, already_sealed: false };
  }

  /**
   * The close of one task (the order is run()'s). workspaces: absolute paths,
   * default the task's first close's, else every watched workspace. Resolves with the task
   * receipt (complete or not); rejects with TASK_CONFLICT when the task's close named other
   * workspaces, INVALID_ARGUMENT when a first close names one no checkpoint can be taken of
   * (nothing recorded), or with the error of a step that could not be recorded (nothing is
   * claimed then; close again). settled: the sandbox-wide close settled every session already
   * (settleSessions), ending these ids. archived: the state dir's close receipt is final (a
   * task in it): its complete task receipt answers, else ADMISSION_SEALED; nothing is written.
   */
  close(task: string, timeoutMs: number, workspacesArg: string[] | undefined, settled?: Set<string>, archived = false): Promise<TaskReceipt> {
    const normalise = (paths: string[]) => [...new Set(paths.map((p) => resolve(p)))];
    const running = this.closing.get(task);
    const recorded = running ? null : this.recordedWorkspaces(task);
    const named = (workspacesArg?.length ?? 0) > 0;
    // Not named: the workspaces this task's close named first, else every watched one.
    const workspaces = named
      ? normalise(workspacesArg!)
      : (running?.workspaces ?? (recorded && recorded !== 'unreadable' ? recorded.workspaces : null) ?? normalise(this.deps.ctx.watcher.paths));
    if (running) {
      if (!sameSet(running.workspaces, workspaces)) throw this.conflict(task, running.workspaces, workspaces);
      return running.done;
    }
    // The first close names its workspaces for good (or a named set replaces a defaulted one:
    // run()): a path that cannot be checkpointed, or whose writes no watcher orders, is refused
    // before anything is recorded or sealed.
    if (archived) return Promise.resolve(this.archivedReceipt(task, recorded, workspaces));
    if (
      recorded === null ||
      (named && recorded !== 'unreadable' && recorded.defaulted === true && !sameSet(recorded.workspaces, workspaces) && !this.completeReceipt(task))
    )
      this.checkWorkspaces(workspaces);
    const done = this.run(task, timeoutMs, workspaces, named, settled).finally(() => this.closing.delete(task));
    this.closing.set(task, { workspaces, done });
    return done;
  }

  /**
   * INVALID_ARGUMENT unless a checkpoint can be taken of each path (it exists, is a directory,
   * holds neither the state dir nor the store: Checkpoints.checkWorkspace) and it is in a
   * watched workspace.
   */
  private checkWorkspaces(workspaces: string[]): void {
    const watched = this.deps.ctx.watcher.paths;
    for (const path of workspaces) {
      let real: string;
      try {
        real = this.deps.checkpoints.checkWorkspace(path);
      } catch (err) {
        if (!(err instanceof SupervisorError)) throw err;
        const why = err.message.replace(`checkpoint: workspace ${path}: `, '').replace(/^checkpoint: /, '');
        throw new SupervisorError('INVALID_ARGUMENT', `close: no checkpoint can be taken of ${path}: ${why}. Nothing was recorded or sealed`, {
          ...err.details,
          workspace: path,
        });
      }
      if (this.deps.ctx.watcher.rootOf(real) === null) {
        throw new SupervisorError(
          'INVALID_ARGUMENT',
          `close: ${path} is not in a watched workspace (${watched.length ? watched.join(', ') : 'none is watched'}): no session's writes there are ordered, so the task could never be complete; name a watched workspace (or a directory in one), or watch it (workspace.paths, serve --workspace) before the task runs. Nothing was recorded or sealed`,
          { field: 'workspaces', workspace: path, watched },
        );
      }
    }
  }

  /** Whether the task has a complete (final) task receipt; false when it cannot be read (run() says why). */
  private completeReceipt(task: string): boolean {
    try {
      return new TaskFiles(this.deps.ctx.config.stateDir, task).readReceipt()?.complete === true;
    } catch {
      return false;
    }
  }

  /** A task close on a closed state dir (an archive: nothing is written): the task's final receipt, for the workspaces its close named. */
  private archivedReceipt(task: string, recorded: TaskCloseRecord | null | 'unreadable', workspaces: string[]): TaskReceipt {
    const previous = recorded === null ? null : new TaskFiles(this.deps.ctx.config.stateDir, task).readReceipt();
    if (!previous?.complete || recorded === null || recorded === 'unreadable') {
      throw new SupervisorError(
        'ADMISSION_SEALED',
        `the sandbox is closed (its close receipt is final) and task ${JSON.stringify(task)} has no final task receipt in it: it had no sessions (is the task name right?). Nothing was recorded or sealed`,
        { task },
      );
    }
    if (!sameSet(recorded.workspaces, workspaces)) throw this.conflict(task, recorded.workspaces, workspaces);
    return previous;
  }

  /** The task's close record (the workspaces it names); null: none yet; 'unreadable': run() says why. */
  private recordedWorkspaces(task: string): TaskCloseRecord | null | 'unreadable' {
    try {
      return new TaskFiles(this.deps.ctx.config.stateDir, task).readClose();
    } catch {
      return 'unreadable';
    }
  }

  private conflict(task: string, had: string[], asked: string[]): SupervisorError {
    return new SupervisorError(
      'TASK_CONFLICT',
      `task ${JSON.stringify(task)} is closed (or closing) with workspaces ${JSON.stringify(had)}; this close names ${JSON.stringify(asked)}: close it with the same workspaces (its task receipt answers for those only)`,
      { task, workspaces: had },
    );
  }

  /**
   * The close, in order: the close record (the workspaces it names; a later close naming others is
   * TASK_CONFLICT), the attempt (resumed when a crash stopped it before its receipt, else the
   * next one), the seal, the settle (the task's sessions end by themselves for up to the
   * timeout, then TERM, grace, KILL with cause close; recovered sessions being reconciled too,
   * then KILL: settleSessions, also the sandbox-wide close's), the watched workspaces the task's
   * receipts name added to the set, then per workspace the final checkpoint (boundary, capture, objects, manifest,
   * read-back, published; taken for this attempt, or found published for it after a crash, or
   * an earlier attempt's that still covers: never a second manifest for one attempt), then the
   * fence (supervisor.json still names this run), the join (join.ts) and the signed task
   * receipt. Crash points (fault.ts): task-close:after-attempt, task-close:after-seal, task-close:settling,
   * task-close:after-last-death, checkpoint:* (checkpoint/), task-close:after-checkpoint,
   * task-close:after-receipt-temp, task-close:after-receipt-rename.
   */
  private async run(task: string, timeoutMs: number, workspaces: string[], named: boolean, settled: Set<string> | undefined): Promise<TaskReceipt> {
    const { ctx } = this.deps;
    const { identity, log } = ctx;
    const files = new TaskFiles(ctx.config.stateDir, task);
    let closeRecord = files.readClose();
    const previous = files.readReceipt();
    if (closeRecord && !sameSet(closeRecord.workspaces, workspaces)) {
      // A set no close named (the default, every watched workspace: close --all, close --task
      // without --workspace) gives way to the first named one while the task is incomplete.
      if (!(named && closeRecord.defaulted === true && !previous?.complete)) throw this.conflict(task, closeRecord.workspaces, workspaces);
      closeRecord = { ...closeRecord, workspaces, defaulted: false };
      files.replaceClose(closeRecord);
      log.info({ task, workspaces }, 'task close: the workspaces named replace the defaulted set');
    }
    if (previous?.complete) return previous;
    // The workspaces were checked by close() (checkWorkspaces): the record binds the task to them.
    if (!closeRecord)
      files.writeClose({ task, workspaces, requested_at: new Date().toISOString(), generation: identity.generation, ...(named ? {} : { defaulted: true }) });

    // The attempt: resumed when a crash stopped it before its receipt, else the next one.
    let attempt = files.readAttempt();
    if (!attempt || (previous && previous.attempt >= attempt.attempt)) {
      // Past both records: an attempt record lost while the receipt stayed never numbers an attempt again.
      attempt = {
        task,
        attempt: Math.max(attempt?.attempt ?? 0, previous?.attempt ?? 0) + 1,
        started_at: new Date().toISOString(),
        generation: identity.generation,
        settle: null,
        checkpoints: {},
      };
      files.writeAttempt(attempt);
    } else {
      log.warn({ task, attempt: attempt.attempt, started_at: attempt.started_at }, 'resuming a task close a restart interrupted');
    }
    faultPoint('task-close:after-attempt');
    const seal = this.seal(task);
    // A seal that cannot be read seals the task, but says nothing of when: the receipt does not invent it.
    const sealKnown = this.seals.has(task);
    faultPoint('task-close:after-seal');
    if (testHooks.taskEarlyCheckpoint && Object.keys(attempt.checkpoints).length === 0) await this.testEarlyCheckpoints(task, attempt, workspaces);

    // Settle: the task's sessions end by themselves, or are ended (cause close); by the
    // sandbox-wide close already (settled: the ids it ended), for every task at once.
    const settle = settled
      ? settleOf(
          timeoutMs,
          new Set(
            this.deps
              .sessionsOf(task)
              .filter((s) => settled.has(s.id))
              .map((s) => s.id),
          ),
        )
      : (await this.settleSessions(() => this.deps.sessionsOf(task), timeoutMs, { task })).settle;
    if (attempt.settle === null) {
      attempt.settle = settle;
      files.writeAttempt(attempt);
    }
    faultPoint('task-close:after-last-death');

    let { sessions, retired, joinSessions } = this.sessionFacts(task);
    // A session without a receipt may still write (a retired one cannot: it ended long ago).
    const waiting = joinSessions.some((s) => !s.receipt && s.state !== 'retired');
    const toJoin = (paths: string[]): JoinWorkspace[] =>
      paths.map((path) => {
        const real = realWorkspace(path);
        return { path, root: real ? ctx.watcher.rootOf(real) : null };
      });
    // The close covers every watched workspace the task's receipts name, recorded so that
    // every later close covers it too; one no longer watched stays an obligation (join.ts).
    const record = files.readClose() ?? closeRecord;
    const covered = [...workspaces, ...(record?.added_workspaces ?? []).filter((p) => !workspaces.includes(p))];
    const { include } = receiptWorkspaces(joinSessions, toJoin(covered), ctx.watcher.paths);
    if (include.length && record) {
      files.replaceClose({ ...record, added_workspaces: [...(record.added_workspaces ?? []), ...include] });
      log.info({ task, workspaces: include }, "task close: added the watched workspaces the task's receipts name");
    }
    workspaces = [...covered, ...include];
    const joinWorkspaces = toJoin(workspaces);

    // The final checkpoint of each workspace.
    const checkpoints: TaskCheckpointEntry[] = [];
    for (const w of joinWorkspaces) {
      const entry = await this.checkpointFor(task, attempt, w, previous, joinSessions, waiting, seal.generation);
      if (entry && !attempt.checkpoints[w.path]) {
        attempt.checkpoints[w.path] = entry;
        files.writeAttempt(attempt);
      }
      checkpoints.push(entry ?? noCheckpoint(w.path, null, null));
    }

    // The fence: supervisor.json must still name this run.
    let fenceOnDisk: { instance: string; generation: number } | null = null;
    try {
      fenceOnDisk = readRecord('identity', join(ctx.config.stateDir, STATE.identity));
    } catch (err) {
      log.error({ err }, 'task close: supervisor.json cannot be read');
    }
    const fence = { instance: identity.instance, generation: identity.generation, boot_id: identity.bootId };
    // Each checkpoint named must still be published (sbx gc may have removed one meanwhile: a
    // resumed attempt's, an earlier attempt's reused); checked in one synchronous stretch with
    // the signing and the write below, so no gc (it runs between awaits) comes in between.
    checkpoints.forEach((cp, i) => {
      if (cp.checkpoint_id === null || this.deps.checkpoints.published.isPublished(cp.checkpoint_id)) return;
      const gone = new SupervisorError(
        'CHECKPOINT_FAILED',
        `checkpoint ${cp.checkpoint_id} is no longer published in ${this.deps.checkpoints.local.dir} (removed by sbx gc?)`,
        { stage: 'store' },
      );
      checkpoints[i] = noCheckpoint(cp.workspace, gone, cp.close_attempt);
    });
    // The sessions again, in the same synchronous stretch: one the retention policy retired
    // while the checkpoints were taken is listed from its tombstone (its receipt's facts are
    // gone), never as a receipt the state dir no longer has.
    ({ sessions, retired, joinSessions } = this.sessionFacts(task));
    // A supervisor stopping claims nothing: the attempt resumes at the next start.
    if (this.deps.stopping())
      throw new SupervisorError('SHUTTING_DOWN', 'the supervisor is stopping; the task close resumes when it starts again (close again then)');
    const unwatched = receiptWorkspaces(joinSessions, joinWorkspaces, ctx.watcher.paths).unwatched.map((u) => u.root);
    const verdict = evaluateTask({
      sealed: true,
      sessions: joinSessions,
      workspaces: joinWorkspaces,
      checkpoints,
      sealGeneration: sealKnown ? seal.generation : null,
      fence,
      fenceOnDisk,
    });

    const receipt = ctx.signer.sign<TaskReceipt>({
      version: 1,
      kind: 'task',
      task,
      attempt: attempt.attempt,
      supervisor: { instance: identity.instance, generation: identity.generation, boot_id: identity.bootId, mode: identity.mode },
      sealed: sealKnown ? { generation: seal.generation, sealed_at: seal.sealed_at } : { generation: null, sealed_at: null },
      closed_at: new Date().toISOString(),
      settle: attempt.settle ?? settle,
      sessions: [...sessions.map((s) => this.sessionEntry(s, joinWorkspaces, unwatched)), ...retired.map((r) => retiredEntry(r, joinWorkspaces))].sort(
        (a, b) => (a.session_id < b.session_id ? -1 : a.session_id > b.session_id ? 1 : 0),
      ),
      workspaces,
      checkpoints,
      fence,
      complete: verdict.complete,
      conditions: verdict.conditions,
      obligations: verdict.obligations,
      ...(verdict.trust ? { trust: verdict.trust } : {}),
    });
    files.writeReceipt(receipt);
    log.info({ task, attempt: attempt.attempt, complete: receipt.complete, sessions: sessions.length, obligations: receipt.obligations.length }, 'task closed');
    return receipt;
  }

  /** The task's sessions (by id), the tombstones of those retired whole, and both as the join sees them. */
  private sessionFacts(task: string): { sessions: Session[]; retired: TombstoneRecord[]; joinSessions: JoinSession[] } {
    const byId =
      <T>(id: (x: T) => string) =>
      (a: T, b: T) =>
        id(a) < id(b) ? -1 : id(a) > id(b) ? 1 : 0;
    const sessions = this.deps.sessionsOf(task).sort(byId((s) => s.id));
    const retired = this.deps.retiredOf(task);
    const joinSessions: JoinSession[] = [
      ...sessions.map((s) => {
        const summary = s.state === 'unknown' ? s.summary() : null;
        return {
          sessionId: s.id,
          state: s.state as string,
          receipt: s.receipt,
          unknownReason: summary?.reason ?? null,
          receiptPending: summary?.receipt_pending === true,
          uid: s.receipt?.uid ?? s.admission?.uid ?? null,
          escapeAttested: s.receipt?.death.evidence === 'cgroup_escaped' && s.escapeAttested()?.receipt_sha256 === receiptDigest(s.receipt),
        };
      }),
      ...retired.map((r) => ({ sessionId: r.session_id, state: 'retired', receipt: null, unknownReason: null })),
    ].sort(byId((s) => s.sessionId));
    return { sessions, retired, joinSessions };
  }

  /**
   * The test hook taskEarlyCheckpoint (core/test-hooks.ts): the attempt's checkpoints before
   * the settle, out of the close's order, so a test can show the join naming a checkpoint
   * older than a session's terminal_mutation.
   */
  private async testEarlyCheckpoints(task: string, attempt: TaskAttemptRecord, workspaces: string[]): Promise<void> {
    for (const path of workspaces) {
      const r = await this.deps.checkpoints.checkpoint(path, task, attempt.attempt);
      attempt.checkpoints[path] = checkpointEntry(path, r, attempt.attempt);
    }
    new TaskFiles(this.deps.ctx.config.stateDir, task).writeAttempt(attempt);
  }

  /**
   * The settle of both closes (a task's, the sandbox-wide one's): the live sessions end by
   * themselves for up to timeoutMs, and so do those a restart left to reconciliation (their
   * TERM went out when it began); then the rest are ended, cause close: a live one with TERM,
   * its grace, KILL; a recovered one still in its grace with KILL now. Resolves once each has
   * its receipt or stays unknown (no evidence to come). terminated: the ids ended here.
   */
  async settleSessions(
    sessionsNow: () => Session[],
    timeoutMs: number,
    what: Record<string, unknown>,
  ): Promise<{ settle: { timeout_ms: number; terminated: number; terminated_ids: string[] }; terminated: Set<string> }> {
    const sessions = sessionsNow();
    // A live service is not waited for (it is meant to keep running): it is ended once the commands have settled.
    const live = sessions.filter((s) => isLive(s.state) && !s.req.service);
    const recovered = sessions.filter((s) => s.state === 'unknown');
    this.deps.ctx.log.info({ ...what, sessions: live.length, being_reconciled: recovered.length, timeout_ms: timeoutMs }, 'close: settling sessions');
    faultPoint('task-close:settling');
    const allSettled = Promise.all([...live.map((s) => s.settled()), this.deps.reconciled(recovered)]);
    // setDeadline: a plain setTimeout past 2^31-1 ms (24.8 days; --timeout allows 30) fires at once.
    let cancel = () => {};
    const timedOut = await Promise.race([allSettled.then(() => false), new Promise<boolean>((r) => (cancel = setDeadline(() => r(true), timeoutMs)))]);
    cancel();
    const terminated = new Set<string>();
    if (timedOut) {
      for (const s of live) if (!isSettled(s.state)) terminated.add(s.id);
      // cancelRecovered: false when reconciliation is not ending it (no evidence to come: it stays unknown).
      for (const s of recovered) if (s.state === 'unknown' && s.cancelRecovered(0)) terminated.add(s.id);
    }
    await Promise.all(live.filter((s) => terminated.has(s.id)).map((s) => s.terminate('close')));
    await allSettled;
    // Then the services, those the commands handed their leftovers to meanwhile included: TERM, grace, KILL.
    const services = sessionsNow().filter((s) => s.req.service && isLive(s.state));
    for (const s of services) terminated.add(s.id);
    await Promise.all(services.map((s) => s.terminate('close')));
    await Promise.all(services.map((s) => s.settled()));
    return { settle: settleOf(timeoutMs, terminated), terminated };
  }

  /**
   * The checkpoint of one workspace for this attempt: the one it recorded, the one it published
   * before a crash kept it from recording it, an earlier attempt's that still covers every
   * session, or a new one. None (null) while a session has no receipt: it may still write.
   */
  private async checkpointFor(
    task: string,
    attempt: TaskAttemptRecord,
    w: JoinWorkspace,
    previous: TaskReceipt | null,
    sessions: JoinSession[],
    waiting: boolean,
    sealGeneration: number,
  ): Promise<TaskCheckpointEntry | null> {
    const recorded = attempt.checkpoints[w.path];
    if (recorded) return recorded;
    const { checkpoints, ctx } = this.deps;
    const real = realWorkspace(w.path);
    const describe = (id: string): TaskCheckpointEntry | null => {
      try {
        const published = checkpoints.published.read(id);
        // Of this directory as it resolves now (a symlinked workspace retargeted since is another tree).
        if (published.manifest.workspace !== real) return null;
        return publishedEntry(w.path, published, checkpoints.location);
      } catch (err) {
        ctx.log.warn({ err, checkpoint_id: id, task }, 'task close: a checkpoint it took cannot be used');
        return null;
      }
    };
    const found = real ? checkpoints.published.findForClose(task, attempt.attempt, real) : null;
    if (found) {
      const entry = describe(found);
      if (entry) {
        // A crash may have come between its local and its remote published record.
        try {
          await checkpoints.published.putRemote(found);
        } catch (err) {
          if (!(err instanceof SupervisorError)) throw err;
          return noCheckpoint(w.path, err, attempt.attempt);
        }
        return entry;
      }
    }
    if (waiting) return null;
    // Of the store checkpoints are published to now (one from before a change of checkpoint.store is not in it).
    const prev = previous?.checkpoints.find((c) => c.workspace === w.path && c.checkpoint_id !== null && c.store === checkpoints.location);
    if (prev && prev.checkpoint_id) {
      const entry = describe(prev.checkpoint_id);
      // Reused only if it would pass the join: consistent, fenced by this state dir's
      // supervisor (another instance's, say after a torn supervisor.json, never would; nor one
      // from before the generation the task counts as sealed at: this run's when its seal
      // cannot be read, or is another instance's from above this run's: sealFloor), covering.
      const { identity } = ctx;
      const floor = sealFloor(sealGeneration, identity) ?? 0;
      const fenced = (e: TaskCheckpointEntry) =>
        e.fence !== null && e.fence.instance === identity.instance && e.fence.generation <= identity.generation && e.fence.generation >= floor;
      const covers = (e: TaskCheckpointEntry) => w.root !== null && e.consistent === true && fenced(e) && sessions.every((s) => sessionCovered(e, s, w.root!));
      if (entry && covers(entry)) return entry;
    }
    try {
      const r = await checkpoints.checkpoint(w.path, task, attempt.attempt);
      faultPoint('task-close:after-checkpoint');
      return checkpointEntry(w.path, r, attempt.attempt);
    } catch (err) {
      // A checkpoint cut short by the supervisor stopping is not a fact of the workspace: not recorded.
      if (this.deps.stopping())
        throw new SupervisorError('SHUTTING_DOWN', 'the supervisor is stopping; the task close resumes when it starts again (close again then)');
      if (!(err instanceof SupervisorError) || (err.code !== 'CHECKPOINT_FAILED' && err.code !== 'INVALID_ARGUMENT')) throw err;
      ctx.log.warn({ task, workspace: w.path, code: err.code, message: err.message }, 'task close: the checkpoint failed');
      return noCheckpoint(w.path, err, attempt.attempt);
    }
  }

  /** An escaped session's attestation as its task entry shows it ({}: none). */
  private escapeAttestation(s: Session, r: Receipt): { escape_attested?: { uid: number; pid: number; reason: string; attested_at: string } } {
    if (r.death.evidence !== 'cgroup_escaped') return {};
    const a = s.escapeAttested();
    return a && a.receipt_sha256 === receiptDigest(r) ? { escape_attested: { uid: a.uid, pid: a.pid, reason: a.reason, attested_at: a.attested_at } } : {};
  }

  /** unwatched: the roots the task's receipts name that no workspace of the close covers nor this supervisor watches. */
  private sessionEntry(s: Session, workspaces: JoinWorkspace[], unwatched: string[]): TaskSessionEntry {
    const r = s.receipt;
    const output: TaskSessionEntry['output'] = {};
    for (const [stream, o] of Object.entries(r?.output ?? {}))
      if (o) output[stream] = { final_cursor: o.final_cursor, complete: o.complete, reason: o.reason ?? null };
    return {
      session_id: s.id,
      invocation_key: s.req.invocationKey,
      task: s.req.task,
      state: s.state,
      outcome: r?.outcome ?? null,
      exit: r ? { code: r.exit.code, signal: r.exit.signal } : null,
      receipt_sha256: r ? receiptDigest(r) : null,
      uid: r?.uid ?? s.admission?.uid ?? null,
      death: r
        ? {
            evidence: r.death.evidence,
            observed_at: r.death.observed_at,
            ...(r.death.escapes ? { escapes: r.death.escapes } : {}),
            ...this.escapeAttestation(s, r),
          }
        : null,
      ended_at: r?.ended_at ?? null,
      output,
      ...(s.req.service ? { service: { ...s.req.service } } : {}),
      workspace: [
        ...workspaces.map((w) => {
          const e = r && w.root ? (r.workspace?.find((x) => x.path === w.root) ?? null) : null;
          // not_watched: no watched root holds the path, or the receipt has no entry for it (not watched while the session ran).
          return {
            path: w.path,
            root: w.root,
            epoch: e?.epoch ?? null,
            terminal_mutation: e?.terminal_mutation ?? null,
            gap: w.root === null || (r && !e) ? 'not_watched' : (e?.gap ?? null),
            scan_digest: e?.scan?.digest ?? null,
          };
        }),
        // The receipt's entries for workspaces no longer watched that it may have written (the obligation naming them: join.ts).
        ...(r?.workspace ?? [])
          .filter((e) => unwatched.includes(e.path))
          .map((e) => ({ path: e.path, root: null, epoch: e.epoch, terminal_mutation: e.terminal_mutation, gap: e.gap, scan_digest: e.scan?.digest ?? null })),
      ],
    };
  }
}

/** A receipt's settle: the timeout, and the sessions the close ended (count and ids, sorted). */
function settleOf(timeoutMs: number, terminated: Set<string>): { timeout_ms: number; terminated: number; terminated_ids: string[] } {
  return { timeout_ms: timeoutMs, terminated: terminated.size, terminated_ids: [...terminated].sort() };
}
