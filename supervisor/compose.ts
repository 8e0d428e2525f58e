// The composition root: builds every part of a supervisor in order (state dir, lock, identity,
// reaper, cgroup subtree, storage, signer, hashing threads, watchers; then the session table,
// reconciliation, seal, checkpoints, status, retention, tasks, the registry), each from parts
// already built. Three hooks reach a part built later and are set here once it exists: the
// reaper's fence (the watcher), storage's keep-free (retention), a session's handoff (the registry).
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from 'pino';
import type { SupervisorMode } from '../ipc/protocol.js';
import { STATE } from '../core/state/names.js';
import { native } from '../core/fs/native.js';
import { admissionState } from './admission.js';
import { CgroupParentInUse, CgroupTree } from './cgroup.js';
import { Checkpoints, thawLeftFrozen } from './checkpoint/checkpoint.js';
import { Closing } from './close.js';
import { ConfigError, type Config } from './config.js';
import { readBootId, StateDirLock, takeGeneration } from './identity.js';
import { defaultLimitsProblem, limitHost } from './limits.js';
import type { SupervisorMetrics } from './metrics/registry.js';
import { Reaper } from './reaper.js';
import { Reconciliation } from './reconciliation.js';
import { Retention } from './retention.js';
import type { SessionContext } from './session/context.js';
import { EscapeWatch } from './session/escape.js';
import { SessionTable } from './session-table.js';
import { ReceiptSigner } from './signing.js';
import { StatusReporter } from './status.js';
import { HashPool, hashWorkerPath } from './store/hasher.js';
import { KeyIndex } from './store/records.js';
import { StorageGuard, thresholdWarnings } from './store/storage.js';
import { Supervisor } from './supervisor.js';
import { Tasks } from './task/close.js';
import { pinnedCheckpoints } from './task/records.js';
import { checkWorkspacePaths, WorkspaceWatcher } from './workspace/watcher.js';

/**
 * A supervisor for config, its sessions restored from the state dir (unknown ones wait for
 * reconcile()), not yet serving. Takes the state dir's lock, becomes child subreaper, sets up
 * the cgroup subtree (or subreaper mode, unless cgroup.mode is 'cgroup'). Throws with a reason:
 * ConfigError (exit 2) for a configuration this host cannot honour (session.defaultLimits
 * without their controller), Error otherwise; the cgroup subtree made for it goes then.
 * metrics: the Prometheus hooks, or null.
 */
export function compose(config: Config, log: Logger, metrics: SupervisorMetrics | null = null): Supervisor {
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
      if (err instanceof CgroupParentInUse) throw err;
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
  // From here a failure (an unreadable receipt key, a watcher that cannot start, a store that
  // cannot be opened) leaves nothing: nothing ran, so the cgroup subtree made for this start goes.
  try {
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
    return wire(config, log, ctx, lock, metrics);
  } catch (err) {
    tree?.teardown();
    reaper.stop();
    throw err;
  }
}

/** The parts above the session context, each built from those before it; then the sessions restored. */
function wire(config: Config, log: Logger, ctx: SessionContext, lock: StateDirLock, metrics: SupervisorMetrics | null): Supervisor {
  const stop = new AbortController();
  const sessions = new SessionTable();
  const reconciliation = new Reconciliation(log, metrics);
  const closing = new Closing(ctx, log);
  const checkpoints = new Checkpoints({
    config,
    log,
    identity: ctx.identity,
    signer: ctx.signer,
    watcher: ctx.watcher,
    reserveBytes: () => Math.max(ctx.storage.minFreeBytes, ctx.storage.keepFreeBytes),
    pinned: () => pinnedCheckpoints(config.stateDir, log),
    metrics,
  });
  checkpoints.recover();
  // Whether launches are taken now, and if not why: what status says and what the registry answers.
  const admissionNow = () =>
    admissionState({ stopping: stop.signal.aborted, sealed: closing.seal !== null, reconciling: reconciliation.deciding, diskAdmits: ctx.storage.admits() });
  const status = new StatusReporter({
    ctx,
    sessionStates: () => [...sessions.all()].map((s) => s.state),
    admissionState: admissionNow,
    sealRecord: () => closing.seal,
    checkpointStore: () => checkpoints.location,
  });
  const retention = new Retention(config, log, ctx.storage, ctx.sessionsDir, {
    sessions: () => sessions.all(),
    forget: (s) => sessions.forget(s),
    isClosed: () => closing.closed,
    freed: () => status.invalidate(),
  });
  ctx.storage.onBelowKeepFree = () => retention.keepFree(); // storage was built before retention
  const tasks = new Tasks({
    ctx,
    checkpoints,
    // A service kept after close is the sandbox-wide close's, not its task's.
    sessionsOf: (task) => [...sessions.all()].filter((s) => (s.req.task === task || s.req.task === null) && !s.req.service?.keep_after_close),
    reconciled: (of) => reconciliation.of(of),
    retiredOf: (task) => retention.retiredOf(task),
    stopping: () => stop.signal.aborted,
  });
  const registry = new Supervisor({
    config,
    log,
    ctx,
    lock,
    metrics,
    sessions,
    keys: new KeyIndex(config.stateDir),
    closing,
    retention,
    checkpoints,
    tasks,
    status,
    reconciliation,
    stop,
    admissionState: admissionNow,
  });
  // A session's leftovers are handed off as a service the registry admits.
  ctx.admitHandoff = (origin) => registry.admitHandoff(origin);
  registry.restore();
  return registry;
}
