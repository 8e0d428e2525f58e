// Taking and publishing checkpoints (docs/guide/checkpoints.md "Checkpoints"), one at a time per supervisor:
// the boundary first (a watcher barrier), then the capture in a thread (objects stored
// create-once in the local store), the manifest last (JCS, signed, id = its SHA-256), then
// the read-back (the manifest by id: digest, canonical form, signature; every object re-read
// and re-hashed), and only then the signed published record. Where a checkpoint is decided
// published; also the store's recovery at start and its gc. Not the format (manifest.ts), the
// scan (capture-worker.ts) or the files (local-store.ts, s3-store.ts).
import { createHash } from 'node:crypto';
import {
  closeSync,
  constants,
  existsSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  realpathSync,
  renameSync,
  rmSync,
  statSync,
} from 'node:fs';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { isSupervisorError, SupervisorError } from '../../ipc/errors.js';
import type { GcResult } from '../../ipc/methods.js';
import type { CheckpointResult, Receipt, TaskCheckpointEntry } from '../../ipc/protocol.js';
import { STATE } from '../../core/state/names.js';
import { jcs, verifySignature } from '../../core/receipts/verify.js';
import type { Config } from '../config.js';
import { faultPoint } from '../../core/fault.js';
import type { ReceiptSigner } from '../signing.js';
import { pathAt } from '../../core/fs/walk.js';
import type { WorkspaceWatcher } from '../workspace/watcher.js';
import { CheckpointThread, thawPath } from './capture.js';
import { LocalStore, objectKey } from '../../core/checkpoint/local-store.js';
import { STORE_DIRS } from '../../core/state/names.js';
import {
  checkManifest,
  manifestObjects,
  mountsSkipped,
  type CheckpointBoundary,
  type Manifest,
  type PublishedRecord,
  type RuntimeFence,
} from '../../core/checkpoint/manifest.js';
import { type CheckpointStore, parseStoreUrl, rehashObject, StoreError } from '../../core/checkpoint/store.js';
import type { SupervisorMetrics } from '../metrics/registry.js';
import { errnoCode } from '../../ipc/errno.js';

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

/** Requests to a remote store at once (uploads, read-back): one at a time, radosgw took ~45 ms an object. */
const REMOTE_CONCURRENCY = 8;

/** Runs fn over items, at most `limit` at once; rejects with the first failure (after the running ones settle). */
async function inParallel<T>(items: T[], limit: number, fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  let failure: unknown = null;
  const lane = async () => {
    while (failure === null && next < items.length) {
      const item = items[next++];
      try {
        await fn(item);
      } catch (err) {
        failure ??= err;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, lane));
  if (failure !== null) throw failure;
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

function failed(stage: 'scan' | 'store' | 'read_back', message: string, details: Record<string, unknown> = {}): SupervisorError {
  return new SupervisorError('CHECKPOINT_FAILED', message, { stage, ...details });
}

/** The checkpoints of one supervisor: its local store, an optional remote one, and the one-at-a-time queue. */
export class Checkpoints {
  readonly local: LocalStore;
  private remote: Promise<CheckpointStore> | null = null;
  private chain: Promise<unknown> = Promise.resolve();
  private readonly thread: CheckpointThread;

  constructor(private readonly deps: CheckpointDeps) {
    this.local = new LocalStore(localStoreDir(deps.config), true, true);
    this.thread = new CheckpointThread(
      (workspace, why, thawed, err) => {
        if (err) deps.log.error({ err, workspace, why }, 'a workspace frozen by a checkpoint could not be thawed (fsfreeze -u it)');
        else if (thawed) deps.log.error({ workspace, why }, "a checkpoint's frozen pass did not thaw its workspace: thawed by the supervisor");
        if (!err) {
          try {
            this.local.fs.clearFrozen();
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

  private queued = 0;

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
    let fs;
    try {
      fs = this.local.fs;
    } catch (err) {
      this.deps.log.error({ err, store: this.local.dir }, 'the checkpoint store cannot be opened; checkpoints will fail until it can');
      return;
    }
    for (const name of fs.list(fs.tmpFd)) fs.remove(fs.tmpFd, name);
    const unpublished = this.unpublished();
    for (const id of unpublished) fs.remove(fs.manifestsFd, `${id}.json`);
    if (unpublished.length)
      this.deps.log.warn(
        { manifests: unpublished },
        'removed checkpoint manifests whose read-back never completed (a crash mid-checkpoint): they were never published',
      );
  }

  private unpublished(): string[] {
    const fs = this.local.fs;
    const published = new Set(fs.list(fs.publishedFd));
    return fs
      .list(fs.manifestsFd)
      .filter((n) => /^[0-9a-f]{64}\.json$/.test(n) && !published.has(n))
      .map((n) => n.slice(0, 64));
  }

  /**
   * Takes, stores, reads back and publishes one checkpoint (queued behind any other).
   * closeAttempt: the task close attempt it is taken for (in the manifest and the published
   * record, so a close resumed after a crash finds it: findClosePublished). SupervisorError
   * INVALID_ARGUMENT, CHECKPOINT_FAILED.
   */
  checkpoint(workspace: string, task: string | null, closeAttempt?: number): Promise<CheckpointResult> {
    return this.serial(async () => {
      const t0 = performance.now();
      try {
        const result = await this.take(workspace, task, closeAttempt);
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

  /** The workspace as a checkpoint names it (its real path), or null when it cannot be resolved. */
  static realWorkspace(path: string): string | null {
    try {
      return realpathSync(path);
    } catch {
      return null;
    }
  }

  /** The published checkpoint of a workspace (its real path) taken for a task's close attempt, if one is in the local store. */
  findClosePublished(task: string, closeAttempt: number, workspace: string): string | null {
    const fs = this.local.fs;
    for (const name of fs.list(fs.publishedFd)) {
      if (!/^[0-9a-f]{64}\.json$/.test(name)) continue;
      let record: PublishedRecord;
      try {
        record = JSON.parse(fs.readRecord(fs.publishedFd, name)?.toString('utf8') ?? 'null') as PublishedRecord;
      } catch {
        continue;
      }
      if (record?.task === task && record.close_attempt === closeAttempt && record.workspace === workspace && record.checkpoint_id === name.slice(0, 64))
        return record.checkpoint_id;
    }
    return null;
  }

  /** Whether checkpoint id is published in the local store now (its published record is there: gc removes it first); false when the store cannot be read. */
  isPublished(id: string): boolean {
    try {
      const fs = this.local.fs;
      return fs.readRecord(fs.publishedFd, `${id}.json`) !== null;
    } catch {
      return false;
    }
  }

  /**
   * With a remote store: puts the local published record of id there (create-once: a no-op
   * when it is there), for a checkpoint a crash stopped between the two records. Throws
   * CHECKPOINT_FAILED (stage store) when it cannot.
   */
  async publishRemote(id: string): Promise<void> {
    const remote = this.remoteStore();
    if (!remote) return;
    const bytes = this.local.fs.readRecord(this.local.fs.publishedFd, `${id}.json`);
    if (!bytes) throw failed('store', `checkpoint ${id} is not published in ${this.local.dir}`);
    const store = await remote;
    try {
      await store.putPublished(id, bytes);
    } catch (err) {
      throw failed('store', `checkpoint ${id}: the published record could not be written to ${store.location}: ${(err as Error).message}`);
    }
  }

  /**
   * What a task receipt says of a published checkpoint, from its manifest and its signed
   * published record in the local store (both signature-checked); throws when either is
   * missing or does not verify.
   */
  describePublished(id: string): Omit<TaskCheckpointEntry, 'workspace' | 'error'> & { manifestWorkspace: string } {
    const fs = this.local.fs;
    const recordBytes = fs.readRecord(fs.publishedFd, `${id}.json`);
    const manifestBytesIn = fs.readRecord(fs.manifestsFd, `${id}.json`);
    if (!recordBytes || !manifestBytesIn) throw new Error(`checkpoint ${id} is not published in ${this.local.dir}`);
    const { manifest, problems } = checkManifest(manifestBytesIn, { expectId: id, publicKeyPem: this.deps.signer.publicKeyPem });
    if (!manifest || problems.length) throw new Error(`checkpoint ${id}: ${problems.join('; ') || 'not a manifest'}`);
    const record = JSON.parse(recordBytes.toString('utf8')) as PublishedRecord;
    const sigProblems = verifySignature(record as unknown as Receipt, this.deps.signer.publicKeyPem);
    if (sigProblems.length) throw new Error(`checkpoint ${id}: its published record: ${sigProblems.join('; ')}`);
    return {
      checkpoint_id: id,
      store: this.location,
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
      manifestWorkspace: manifest.workspace,
    };
  }

  /**
   * Whether the last pass may run frozen (checkpoint.freeze): only a workspace that is its own
   * mount, on a file system holding neither the state dir nor the store (their writes would
   * wait for the thaw). refused: why not (null: it may).
   */
  private freezePlan(workspace: string): { asked: boolean; refused: string | null } {
    if (!this.deps.config.checkpoint.freeze) return { asked: false, refused: 'off' };
    try {
      const dev = statSync(workspace).dev;
      if (workspace !== '/' && statSync(join(workspace, '..')).dev === dev)
        return { asked: true, refused: 'the workspace is not its own mount: freezing would stop every writer of the file system it is on' };
      if (statSync(this.deps.config.stateDir).dev === dev) return { asked: true, refused: "the state dir is on the workspace's file system" };
      if (statSync(this.local.dir).dev === dev) return { asked: true, refused: "the checkpoint store is on the workspace's file system" };
    } catch (err) {
      return { asked: true, refused: `cannot tell: ${(err as Error).message}` };
    }
    return { asked: true, refused: null };
  }

  /** The workspace as walked: its real path, a directory, holding neither the state dir nor the store. SupervisorError INVALID_ARGUMENT. */
  checkWorkspace(path: string): string {
    let real: string;
    try {
      real = realpathSync(path);
      if (!statSync(real).isDirectory()) throw Object.assign(new Error(`${path} is not a directory`), { code: 'ENOTDIR' });
    } catch (err) {
      throw new SupervisorError(
        'INVALID_ARGUMENT',
        `checkpoint: workspace ${path}: ${errnoCode(err) === 'ENOENT' ? 'does not exist' : (err as Error).message}`,
        { field: 'workspace' },
      );
    }
    const inside = (a: string, b: string) => a === b || a.startsWith(b.endsWith('/') ? b : b + '/');
    for (const [what, dir] of [
      ['state dir', this.deps.config.stateDir],
      ['checkpoint store', this.local.dir],
    ]) {
      let d = dir;
      try {
        d = realpathSync(dir);
      } catch {
        // not made yet
      }
      if (inside(d, real))
        throw new SupervisorError('INVALID_ARGUMENT', `checkpoint: the directory ${path} holds the ${what} ${dir}: a checkpoint would hold itself`, {
          field: 'workspace',
        });
      if (inside(real, d)) throw new SupervisorError('INVALID_ARGUMENT', `checkpoint: workspace ${path} is inside the ${what} ${dir}`, { field: 'workspace' });
    }
    return real;
  }

  private async take(workspaceArg: string, task: string | null, closeAttempt?: number): Promise<CheckpointResult> {
    const t0 = performance.now();
    const { config, log, signer } = this.deps;
    const workspace = this.checkWorkspace(workspaceArg);
    if (this.local.reopenIfMoved())
      log.warn({ store: this.local.dir }, 'the checkpoint store was moved or removed since it was opened: opened (made) again at its path');
    let storeFd: number;
    try {
      storeFd = this.local.fs.rootFd;
    } catch (err) {
      throw failed('store', `checkpoint of ${workspace}: the checkpoint store cannot be used: ${(err as Error).message}`);
    }
    const startedAt = new Date().toISOString();
    // 1. The boundary, before anything is read: every write closed before it is seen by the scan.
    const boundary: CheckpointBoundary = await this.deps.watcher.boundary(workspace);
    // The watched file system is what is captured: a walk that finds another (mounted over it) fails.
    const expectFs = this.deps.watcher.fsIdentity(workspace);
    faultPoint('checkpoint:after-boundary');
    const tBoundary = performance.now();
    const remote = this.remoteStore();
    const freeze = this.freezePlan(workspace);
    // 2-4. In the checkpoint thread: capture (hash, store, pass again until still or the
    // bound), then the manifest, built, signed and stored last. Nothing of the tree's size
    // is copied to or canonicalised on the event loop.
    const captured = await this.thread.run({
      kind: 'checkpoint',
      root: workspace,
      ...(expectFs ? { expectFs } : {}),
      storeDir: this.local.dir,
      storeFd,
      reserveBytes: this.deps.reserveBytes(),
      maxManifestBytes: config.checkpoint.maxManifestBytes,
      deadlineMs: config.checkpoint.deadlineMs,
      startHrNs: process.hrtime.bigint(),
      maxPasses: config.checkpoint.maxPasses,
      verifyContent: config.checkpoint.verifyContent,
      freezeMaxMs: freeze.refused === null ? config.checkpoint.freezeMaxMs : 0,
      header: {
        workspace,
        task,
        ...(closeAttempt !== undefined ? { close_attempt: closeAttempt } : {}),
        started_at: startedAt,
        boundary,
        supervisor: this.fence,
      },
      signingKeyPem: signer.privateKeyPem,
      keyId: signer.keyId,
      forRemote: remote !== null,
    });
    if (!captured.ok) {
      const stage = captured.code.startsWith('store_') ? 'store' : 'scan';
      throw failed(stage, `checkpoint of ${workspace} failed (${stage}): ${captured.message}`, { code: captured.code });
    }
    const cap = captured.result;
    const id = cap.id;
    const tCapture = performance.now();
    let store: CheckpointStore = this.local;
    let version;
    let uploaded = 0;
    const manifestBytesOut = cap.manifestBytes ? Buffer.from(cap.manifestBytes.buffer, cap.manifestBytes.byteOffset, cap.manifestBytes.byteLength) : null;
    try {
      if (remote) {
        store = await remote;
        const target = store;
        await inParallel(cap.objectList!, REMOTE_CONCURRENCY, async ([sha, size]) => {
          if ((await target.putObject(sha, join(this.local.dir, objectKey(sha)), size)).stored) uploaded++;
        });
        version = await store.putManifest(id, manifestBytesOut!);
      }
    } catch (err) {
      this.local.fs.remove(this.local.fs.manifestsFd, `${id}.json`);
      throw failed(
        'store',
        `checkpoint of ${workspace}: writing to ${store.location} failed: ${(err as Error).message}`,
        err instanceof StoreError && err.key ? { key: err.key } : {},
      );
    }
    const tStore = performance.now();
    // 5. Read back: the manifest by id, then every object, re-hashed. Only then published.
    let readBack = { objects: cap.objects.referenced, bytes: cap.objects.bytes, rehashedObjects: 0, rehashedBytes: 0, repaired: 0 };
    try {
      const local = await this.readBackLocal(id);
      readBack = { ...readBack, rehashedObjects: local.rehashedObjects, rehashedBytes: local.rehashedBytes };
      if (remote) readBack = await this.readBackRemote(store, id, version, manifestBytesOut!, cap.objectList!);
    } catch (err) {
      // Never published: the manifest goes at once (it claims nothing; gc would remove a local one too).
      const fs = this.local.fs;
      fs.remove(fs.manifestsFd, `${id}.json`);
      if (remote && store.deleteManifest)
        await store
          .deleteManifest(id)
          .catch((e: Error) => log.warn({ err: e, checkpoint_id: id }, 'an unpublished manifest could not be removed from the store'));
      throw err;
    }
    const readBackMs = Math.round(performance.now() - tStore);
    faultPoint('checkpoint:after-read-back');
    const readBackAt = new Date().toISOString();
    const record = signer.sign<PublishedRecord>({
      version: 1,
      kind: 'checkpoint_published',
      checkpoint_id: id,
      workspace,
      task,
      ...(closeAttempt !== undefined ? { close_attempt: closeAttempt } : {}),
      boundary,
      read_back: {
        at: readBackAt,
        objects: readBack.objects,
        bytes: readBack.bytes,
        rehashed_objects: readBack.rehashedObjects,
        rehashed_bytes: readBack.rehashedBytes,
        ms: readBackMs,
      },
      supervisor: this.fence,
    });
    const recordBytes = Buffer.from(jcs(record));
    // The local record first: it is what a restart finds (a task close resumed after a crash
    // looks there, and puts a remote record that is missing: publishRemote). A remote record
    // that cannot be written takes the local one back: published everywhere, or nowhere.
    try {
      await this.local.putPublished(id, recordBytes);
    } catch (err) {
      throw failed('store', `checkpoint ${id}: the published record could not be written to ${this.local.dir}: ${(err as Error).message}`);
    }
    faultPoint('checkpoint:after-local-published');
    if (remote) {
      try {
        await store.putPublished(id, recordBytes);
      } catch (err) {
        this.local.fs.remove(this.local.fs.publishedFd, `${id}.json`);
        throw failed('store', `checkpoint ${id}: the published record could not be written to ${store.location}: ${(err as Error).message}`);
      }
    }
    const result: CheckpointResult = {
      checkpoint_id: id,
      workspace,
      task,
      store: this.location,
      started_at: startedAt,
      created_at: cap.created_at,
      boundary,
      scan: cap.scan,
      consistent: cap.consistent,
      freeze: freeze.asked ? (cap.freeze ?? { frozen: false, ms: 0, reason: freeze.refused }) : null,
      unstable: cap.unstable,
      unstable_count: cap.unstableCount,
      leased: cap.leased,
      leased_count: cap.leasedCount,
      mounts_skipped: cap.mountsSkipped,
      objects: {
        referenced: cap.objects.referenced,
        written: cap.objects.written,
        bytes_written: cap.objects.bytesWritten,
        ...(remote ? { uploaded: uploaded + readBack.repaired, repaired: readBack.repaired } : {}),
      },
      read: { files: cap.read.files, bytes: cap.read.bytes },
      read_back: {
        objects: readBack.objects,
        bytes: readBack.bytes,
        rehashed_objects: readBack.rehashedObjects,
        rehashed_bytes: readBack.rehashedBytes,
        ms: readBackMs,
        at: readBackAt,
      },
      supervisor: this.fence,
      duration_ms: Math.round(performance.now() - t0),
      phases_ms: {
        boundary: Math.round(tBoundary - t0),
        capture: Math.round(tCapture - tBoundary),
        store: Math.round(tStore - tCapture),
        read_back: readBackMs,
      },
    };
    log.info(
      {
        checkpoint_id: id,
        workspace,
        task,
        entries: cap.scan.entries,
        bytes: cap.scan.bytes,
        written: cap.objects.written,
        passes: cap.scan.passes,
        unstable: cap.unstableCount,
        boundary,
        ms: result.duration_ms,
      },
      'checkpoint published',
    );
    return result;
  }

  /** The local read-back of manifest id (in the thread); what it re-hashed. CHECKPOINT_FAILED stage read_back when anything differs. */
  private async readBackLocal(id: string): Promise<{ rehashedObjects: number; rehashedBytes: number }> {
    const reply = await this.thread.run({
      kind: 'readback',
      storeDir: this.local.dir,
      storeFd: this.local.fs.rootFd,
      id,
      publicKeyPem: this.deps.signer.publicKeyPem,
      rehash: this.deps.config.checkpoint.readBack,
    });
    if (!reply.ok) throw failed('read_back', `checkpoint ${id}: the read-back failed: ${reply.message}`);
    const { manifestProblems, problems } = reply.result;
    if (manifestProblems.length)
      throw failed('read_back', `checkpoint ${id}: the manifest read back from ${this.local.dir} is not the one written: ${manifestProblems.join('; ')}`);
    if (problems.length === 0) return { rehashedObjects: reply.result.rehashedObjects, rehashedBytes: reply.result.rehashedBytes };
    // A bad object is set aside, so that the retry stores it afresh (create-once never replaces).
    for (const p of problems) this.setAside(p.sha256);
    const first = problems[0];
    throw failed(
      'read_back',
      `checkpoint ${id} not published: ${first.problem} (used by ${first.paths.join(', ')})${problems.length > 1 ? `; and ${problems.length - 1} more objects` : ''}; set aside, a retry stores them again`,
      {
        object: first.sha256,
        paths: first.paths,
        objects: problems.map((p) => p.sha256),
      },
    );
  }

  /** Moves what sits at an object's name (a corrupt file, a planted link: never followed) into quarantine/. */
  private setAside(sha256: string): void {
    const fs = this.local.fs;
    try {
      const q = join(this.local.dir, STORE_DIRS.quarantine);
      mkdirSync(q, { recursive: true, mode: 0o700 });
      const fan = fs.fanDir(sha256.slice(0, 2));
      try {
        const from = pathAt(fan, Buffer.from(sha256));
        lstatSync(from);
        renameSync(from, join(q, `${sha256}.${Date.now()}`));
      } finally {
        closeSync(fan);
      }
      this.deps.log.error({ object: sha256, quarantine: q }, 'a checkpoint object failed its read-back: set aside');
    } catch (err) {
      if (errnoCode(err) !== 'ENOENT' && !(err instanceof StoreError))
        this.deps.log.error({ err, object: sha256 }, 'a bad checkpoint object could not be set aside');
    }
  }

  private async readBackRemote(
    store: CheckpointStore,
    id: string,
    version: Awaited<ReturnType<CheckpointStore['putManifest']>> | undefined,
    written: Buffer,
    objects: [string, number, string][],
  ): Promise<{ objects: number; bytes: number; rehashedObjects: number; rehashedBytes: number; repaired: number }> {
    let bytes: Buffer;
    try {
      bytes = await store.readManifest(id, version);
    } catch (err) {
      throw failed('read_back', `checkpoint ${id}: the manifest cannot be read back from ${store.location}: ${(err as Error).message}`);
    }
    // The local copy was just checked whole in the thread: the remote one must be those bytes.
    if (!bytes.equals(written))
      throw failed(
        'read_back',
        `checkpoint ${id}: the manifest read back from ${store.location} is not the one written (${bytes.length} bytes, sha256 ${createHash('sha256').update(bytes).digest('hex')})`,
      );
    let total = 0;
    let repaired = 0;
    await inParallel(objects, REMOTE_CONCURRENCY, async ([sha, size, user]) => {
      let got = await rehashObject(store, sha);
      if ((got.error || got.sha256 !== sha || got.bytes !== size) && store.replaceObject) {
        // The local copy was read back exactly just before: put it over what the bucket holds.
        this.deps.log.error(
          { object: sha, store: store.location, found: got.error ?? `${got.sha256} (${got.bytes} bytes)` },
          'a checkpoint object failed its read-back from the store: uploaded again from the local store',
        );
        try {
          await store.replaceObject(sha, join(this.local.dir, objectKey(sha)), size);
          repaired++;
          got = await rehashObject(store, sha);
        } catch (err) {
          got = { sha256: '', bytes: 0, error: `uploading it again failed: ${(err as Error).message}` };
        }
      }
      const where = `(used by ${user})`;
      if (got.error)
        throw failed('read_back', `checkpoint ${id} not published: object ${sha} cannot be read back from ${store.location}: ${got.error} ${where}`, {
          object: sha,
        });
      if (got.sha256 !== sha || got.bytes !== size) {
        throw failed(
          'read_back',
          `checkpoint ${id} not published: object ${sha} reads back from ${store.location} as ${got.sha256} (${got.bytes} bytes, ${size} expected), also after uploading it again ${where}`,
          { object: sha },
        );
      }
      total += got.bytes;
    });
    // Every remote object is re-read and re-hashed (a bucket's objects have no stat to trust).
    return { objects: objects.length, bytes: total, rehashedObjects: objects.length, rehashedBytes: total, repaired };
  }

  /**
   * The local store's gc (sbx gc), queued behind any checkpoint: manifests never published and
   * manifests past checkpoint.maxAgeMs go (published record first), then every object no kept
   * manifest names, then temp files. A manifest that cannot be read keeps every object.
   */
  gc(nowMs = Date.now()): Promise<NonNullable<GcResult['checkpoints']>> {
    return this.serial(async () => {
      const fs = this.local.fs;
      const removed: string[] = [];
      const maxAgeMs = this.deps.config.checkpoint.maxAgeMs;
      for (const id of this.unpublished()) {
        fs.remove(fs.manifestsFd, `${id}.json`);
        removed.push(id);
      }
      const referenced = new Set<string>();
      let unreadable = false;
      let kept = 0;
      const pinned = this.deps.pinned ? this.deps.pinned() : new Set<string>();
      for (const id of await this.local.listManifests()) {
        let manifest: Manifest | null = null;
        try {
          const bytes = fs.readRecord(fs.manifestsFd, `${id}.json`);
          manifest = bytes ? checkManifest(bytes).manifest : null;
        } catch {
          // a directory or a link where a manifest should be: unreadable
        }
        if (!manifest) {
          unreadable = true;
          this.deps.log.error({ manifest: id }, 'gc: a checkpoint manifest cannot be read; no object is removed');
          continue;
        }
        if (maxAgeMs > 0 && nowMs - Date.parse(manifest.created_at) > maxAgeMs && pinned !== null && !pinned.has(id)) {
          fs.remove(fs.publishedFd, `${id}.json`);
          fs.remove(fs.manifestsFd, `${id}.json`);
          removed.push(id);
          continue;
        }
        kept++;
        for (const sha of manifestObjects(manifest).keys()) referenced.add(sha);
      }
      let removedObjects = 0;
      let freed = 0;
      if (!unreadable) {
        for (const fan of fs.fanNames()) {
          const fanFd = fs.fanDir(fan);
          try {
            for (const name of fs.list(fanFd)) {
              if (referenced.has(name)) continue;
              const p = pathAt(fanFd, Buffer.from(name));
              try {
                freed += lstatSync(p).size;
              } catch {
                continue;
              }
              fs.remove(fanFd, name);
              removedObjects++;
            }
          } finally {
            closeSync(fanFd);
          }
        }
      }
      for (const name of fs.list(fs.tmpFd)) fs.remove(fs.tmpFd, name);
      // What failed a read-back was kept for a look (the log names each); gc lets it go.
      const quarantine = join(this.local.dir, STORE_DIRS.quarantine);
      let quarantined = 0;
      if (existsSync(quarantine)) {
        for (const name of readdirSync(quarantine)) {
          try {
            freed += lstatSync(join(quarantine, name)).size;
            rmSync(join(quarantine, name), { recursive: true, force: true });
            quarantined++;
          } catch {
            // gone meanwhile
          }
        }
      }
      if (removed.length || removedObjects || quarantined)
        this.deps.log.info(
          { removed_manifests: removed.length, removed_objects: removedObjects, removed_quarantined: quarantined, freed_bytes: freed },
          'checkpoint gc',
        );
      return { removed_manifests: removed, removed_objects: removedObjects, removed_quarantined: quarantined, freed_bytes: freed, kept_manifests: kept };
    });
  }
}
