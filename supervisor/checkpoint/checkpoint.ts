// The checkpoints of one supervisor (docs/guide/checkpoints.md "Checkpoints"): the local store,
// an optional remote one, the checkpoint thread and the one-at-a-time queue every checkpoint and
// gc waits in; the store's recovery at start. The pipeline is publish.ts, the read-back
// read-back.ts, gc gc.ts, queries published.ts; the format and stores are core/checkpoint/.
import { closeSync, constants, openSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { isSupervisorError, SupervisorError } from '../../ipc/errors.js';
import { errnoCode } from '../../ipc/errno.js';
import type { GcResult } from '../../ipc/methods.js';
import type { CheckpointResult } from '../../ipc/protocol.js';
import { STATE } from '../../core/state/names.js';
import { LocalStore } from '../../core/checkpoint/local-store.js';
import type { RuntimeFence } from '../../core/checkpoint/manifest.js';
import { type CheckpointStore, parseStoreUrl } from '../../core/checkpoint/store.js';
import type { Config } from '../config.js';
import type { SupervisorMetrics } from '../metrics/registry.js';
import type { ReceiptSigner } from '../signing.js';
import type { WorkspaceWatcher } from '../workspace/watcher.js';
import { CheckpointThread, thawPath } from './capture.js';
import { collectGarbage } from './gc.js';
import { publishCheckpoint } from './publish.js';
import { PublishedCheckpoints } from './published.js';
import { checkWorkspace } from './workspace-check.js';

export interface CheckpointDeps {
  config: Config;
  log: Logger;
  identity: { instance: string; generation: number; bootId: string; mode: string };
  signer: ReceiptSigner;
  watcher: WorkspaceWatcher;
  /** Bytes a checkpoint must leave free where it stores objects (the state dir's admission threshold). */
  reserveBytes: () => number;
  /** Checkpoints gc never removes: those complete task receipts name (their evidence); null: cannot tell, none is removed by age. */
  pinned?: () => Set<string> | null;
  /** Prometheus hooks (metrics/registry.ts): each checkpoint's duration, result and bytes; null: off. */
  metrics?: SupervisorMetrics | null;
}

/**
 * At start, before anything touches a workspace (the watcher writes its barrier there): a file
 * system a supervisor killed in a frozen pass left frozen (the store's `frozen` record names
 * it) is thawed (FITHAW; EINVAL: not frozen any more), and the record removed. Logs what it did.
 */
export function thawLeftFrozen(config: Config, log: Logger): void {
  const record = join(localStoreDir(config), 'frozen');
  let workspace: string;
  try {
    const fd = openSync(record, constants.O_RDONLY | constants.O_NOFOLLOW);
    try {
      workspace = readFileSync(fd, 'utf8');
    } finally {
      closeSync(fd);
    }
  } catch (err) {
    if (errnoCode(err) !== 'ENOENT') log.error({ err, record }, "the checkpoint store's frozen record cannot be read");
    return;
  }
  try {
    if (thawPath(workspace)) log.warn({ workspace }, 'a checkpoint was stopped while its workspace was frozen: thawed');
  } catch (err) {
    log.error({ err, workspace }, 'a workspace left frozen by a stopped checkpoint could not be thawed (fsfreeze -u it)');
  }
  rmSync(record, { force: true });
}

/** Checkpoints (and gc) waiting at once; the next is refused, retryable. */
const MAX_QUEUED = 16;

/** The local store's directory for a config: checkpoint.store when it is a directory, else <stateDir>/checkpoints. */
export function localStoreDir(config: Config): string {
  const dflt = join(config.stateDir, STATE.checkpointsDir);
  const url = parseStoreUrl(config.checkpoint.store, dflt);
  return url.kind === 'local' ? url.dir : dflt;
}

/** The checkpoints of one supervisor: its local store, an optional remote one, and the one-at-a-time queue. */
export class Checkpoints {
  readonly local: LocalStore;
  /** Published checkpoints as a task close asks for them. */
  readonly published: PublishedCheckpoints;
  private remote: Promise<CheckpointStore> | null = null;
  private chain: Promise<unknown> = Promise.resolve();
  private queued = 0;
  private readonly thread: CheckpointThread;

  constructor(private readonly deps: CheckpointDeps) {
    this.local = new LocalStore(localStoreDir(deps.config), true, true);
    this.published = new PublishedCheckpoints(this.local, deps.signer.publicKeyPem, () => this.remoteStore());
    this.thread = new CheckpointThread(
      (workspace, why, thawed, err) => {
        if (err) deps.log.error({ err, workspace, why }, 'a workspace frozen by a checkpoint could not be thawed (fsfreeze -u it)');
        else if (thawed) deps.log.error({ workspace, why }, "a checkpoint's frozen pass did not thaw its workspace: thawed by the supervisor");
        if (!err) {
          try {
            this.local.clearFrozen();
          } catch {
            // the next start finds the record and thaws again (EINVAL: nothing to do)
          }
        }
      },
      (workspace, frozen) =>
        deps.log.debug({ workspace }, frozen ? 'checkpoint: the workspace is frozen for the last pass' : 'checkpoint: the workspace is thawed'),
      deps.config.checkpoint.workerHeapMiB,
    );
  }

  /** Where checkpoints are published: the local directory or s3://bucket/prefix. */
  get location(): string {
    const url = parseStoreUrl(this.deps.config.checkpoint.store, this.local.dir);
    return url.kind === 's3' ? `s3://${url.bucket}/${url.prefix}` : this.local.dir;
  }

  private remoteStore(): Promise<CheckpointStore> | null {
    const url = parseStoreUrl(this.deps.config.checkpoint.store, this.local.dir);
    if (url.kind !== 's3') return null;
    // Loaded only for an s3:// store: the AWS SDK costs nothing otherwise.
    this.remote ??= import('../../core/checkpoint/s3-store.js').then(({ S3Store }) => new S3Store(url, this.deps.config.checkpoint.s3));
    return this.remote;
  }

  /** Runs fn after every step queued before it; LIMIT_EXCEEDED (retryable) past MAX_QUEUED waiting. */
  private serial<T>(fn: () => Promise<T>): Promise<T> {
    if (this.queued >= MAX_QUEUED) {
      return Promise.reject(
        new SupervisorError('LIMIT_EXCEEDED', `${this.queued} checkpoints (or gc) are queued already; checkpoints run one at a time`, {
          limit: 'checkpoints_queued',
          max: MAX_QUEUED,
        }),
      );
    }
    this.queued++;
    const run = this.chain.then(fn, fn).finally(() => this.queued--);
    this.chain = run.catch(() => {});
    return run;
  }

  private get fence(): RuntimeFence {
    const { instance, generation, bootId, mode } = this.deps.identity;
    return { instance, generation, boot_id: bootId, mode };
  }

  /** Resolves once the checkpoint thread's steps and its idle write of the stat cache are done (capture.ts settled). */
  settled(): Promise<void> {
    return this.thread.settled();
  }

  /** Ends the checkpoint thread (at shutdown), thawing what it froze. */
  stop(): Promise<void> {
    return this.thread.stop();
  }

  /** At the start of shutdown: a frozen pass is thawed now and none starts (writers the shutdown waits for would wait on it). */
  refuseFreezing(): void {
    this.thread.refuseFreezing();
  }

  /**
   * At start: temp files of a checkpoint that did not finish are removed, and so are
   * manifests never published (written, but their read-back did not complete: they claim
   * nothing, and no later run may publish what another generation wrote). Logs what it did.
   */
  recover(): void {
    try {
      this.local.open(); // a store that cannot be opened is logged, and fails each checkpoint
    } catch (err) {
      this.deps.log.error({ err, store: this.local.dir }, 'the checkpoint store cannot be opened; checkpoints will fail until it can');
      return;
    }
    // Past the opening, a failure is the start's (as any state it cannot clean): never logged as a store that cannot be opened.
    this.local.clearTemp();
    const unpublished = this.local.unpublishedIds();
    for (const id of unpublished) this.local.removeManifest(id);
    if (unpublished.length)
      this.deps.log.warn(
        { manifests: unpublished },
        'removed checkpoint manifests whose read-back never completed (a crash mid-checkpoint): they were never published',
      );
  }

  /**
   * Takes, stores, reads back and publishes one checkpoint (queued behind any other; publish.ts).
   * closeAttempt: the task close attempt it is taken for (in the manifest and the published
   * record, so a close resumed after a crash finds it: published.findForClose). SupervisorError
   * INVALID_ARGUMENT, CHECKPOINT_FAILED.
   */
  checkpoint(workspace: string, task: string | null, closeAttempt?: number): Promise<CheckpointResult> {
    return this.serial(async () => {
      const t0 = performance.now();
      try {
        const { config, log, signer, watcher, reserveBytes } = this.deps;
        const deps = {
          config,
          log,
          signer,
          watcher,
          reserveBytes,
          thread: this.thread,
          local: this.local,
          remote: () => this.remoteStore(),
          location: this.location,
          fence: this.fence,
        };
        const result = await publishCheckpoint(deps, workspace, task, closeAttempt);
        this.deps.metrics?.checkpointDone(result, (performance.now() - t0) / 1000);
        return result;
      } catch (err) {
        // A refused request (INVALID_ARGUMENT: not a watched workspace) was no attempt.
        if (!isSupervisorError(err, 'INVALID_ARGUMENT')) {
          this.deps.metrics?.checkpointDone(null, (performance.now() - t0) / 1000);
          const e = err as { code?: string; message?: string; details?: unknown };
          this.deps.log.warn(
            { workspace, task, code: e.code, details: e.details, ms: Math.round(performance.now() - t0) },
            `checkpoint failed: ${e.message ?? String(err)}`,
          );
        }
        throw err;
      }
    });
  }

  /** The workspace as walked (workspace-check.ts checkWorkspace against this state dir and store). SupervisorError INVALID_ARGUMENT. */
  checkWorkspace(path: string): string {
    return checkWorkspace(path, this.deps.config.stateDir, this.local.dir);
  }

  /** The local store's gc (sbx gc; gc.ts), queued behind any checkpoint. */
  gc(nowMs = Date.now()): Promise<NonNullable<GcResult['checkpoints']>> {
    return this.serial(() =>
      collectGarbage(this.local, {
        maxAgeMs: this.deps.config.checkpoint.maxAgeMs,
        pinned: this.deps.pinned ? this.deps.pinned() : new Set<string>(),
        log: this.deps.log,
        nowMs,
        publicKeyPem: this.deps.signer.publicKeyPem,
      }),
    );
  }
}
