// The publish pipeline of one checkpoint (docs/guide/checkpoints.md "Checkpoints"): the boundary
// first (a watcher barrier), the capture and the signed manifest in the checkpoint thread, the
// upload to a remote store, the read-back (read-back.ts), and only then the signed published
// record, local first. Where a checkpoint is decided published; the queue is checkpoint.ts's.
import type { Logger } from 'pino';
import type { CheckpointResult } from '../../ipc/protocol.js';
import { jcs } from '../../core/receipts/signature.js';
import { faultPoint } from '../../core/fault.js';
import type { LocalStore } from '../../core/checkpoint/local-store.js';
import type { CheckpointBoundary, PublishedRecord, RuntimeFence } from '../../core/checkpoint/manifest.js';
import { type CheckpointStore, StoreError } from '../../core/checkpoint/store.js';
import type { Config } from '../config.js';
import type { ReceiptSigner } from '../signing.js';
import type { WorkspaceWatcher } from '../workspace/watcher.js';
import type { CheckpointThread } from './capture.js';
import { readBackLocal, readBackRemote } from './read-back.js';
import { checkpointFailed, inParallel, REMOTE_CONCURRENCY } from './stages.js';
import { checkWorkspace, freezePlan } from './workspace-check.js';

/** What the pipeline works with (Checkpoints holds them). */
export interface PublishDeps {
  config: Config;
  log: Logger;
  signer: ReceiptSigner;
  watcher: WorkspaceWatcher;
  thread: CheckpointThread;
  local: LocalStore;
  /** The remote store (s3://), loaded on first use; null: local only. */
  remote: () => Promise<CheckpointStore> | null;
  /** Where checkpoints are published (the result's `store`). */
  location: string;
  /** The supervisor run that writes: in the manifest and the published record. */
  fence: RuntimeFence;
  /** Bytes a checkpoint must leave free where it stores objects. */
  reserveBytes: () => number;
}

/**
 * Takes, stores, reads back and publishes one checkpoint of workspaceArg (the caller queues it:
 * one at a time). closeAttempt: the task close attempt it is taken for (in the manifest and the
 * published record). SupervisorError INVALID_ARGUMENT, CHECKPOINT_FAILED.
 */
export async function publishCheckpoint(d: PublishDeps, workspaceArg: string, task: string | null, closeAttempt?: number): Promise<CheckpointResult> {
  const t0 = performance.now();
  const { config, log, signer, local, fence } = d;
  const workspace = checkWorkspace(workspaceArg, config.stateDir, local.dir);
  if (local.reopenIfMoved()) log.warn({ store: local.dir }, 'the checkpoint store was moved or removed since it was opened: opened (made) again at its path');
  let storeFd: number;
  try {
    storeFd = local.rootFd;
  } catch (err) {
    throw checkpointFailed('store', `checkpoint of ${workspace}: the checkpoint store cannot be used: ${(err as Error).message}`);
  }
  const startedAt = new Date().toISOString();
  // 1. The boundary, before anything is read: every write closed before it is seen by the scan.
  const boundary: CheckpointBoundary = await d.watcher.boundary(workspace);
  // The watched file system is what is captured: a walk that finds another (mounted over it) fails.
  const expectFs = d.watcher.fsIdentity(workspace);
  // What had events (every one before the boundary is in it): read before the first walk.
  const journal = d.watcher.hints(workspace);
  faultPoint('checkpoint:after-boundary');
  const tBoundary = performance.now();
  const remote = d.remote();
  const freeze = freezePlan(workspace, config.checkpoint.freeze, config.stateDir, local.dir);
  // 2-4. In the checkpoint thread: capture (hash, store, pass again until still or the
  // bound), then the manifest, built, signed and stored last. Nothing of the tree's size
  // is copied to or canonicalised on the event loop.
  const captured = await d.thread.run({
    kind: 'checkpoint',
    root: workspace,
    ...(expectFs ? { expectFs } : {}),
    storeDir: local.dir,
    storeFd,
    reserveBytes: d.reserveBytes(),
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
      supervisor: fence,
    },
    signingKeyPem: signer.privateKeyPem,
    keyId: signer.keyId,
    forRemote: remote !== null,
    ...(journal ? { journal } : {}),
  });
  if (!captured.ok) {
    const stage = captured.code.startsWith('store_') ? 'store' : 'scan';
    throw checkpointFailed(stage, `checkpoint of ${workspace} failed (${stage}): ${captured.message}`, { code: captured.code });
  }
  const cap = captured.result;
  const id = cap.id;
  if (cap.statCacheRejected !== undefined)
    log.warn(
      { workspace, reason: cap.statCacheRejected },
      "the stat cache's copy in the checkpoint store's index/ was not used: every file of this checkpoint is read (it is written again once its read-back passes)",
    );
  const tCapture = performance.now();
  let store: CheckpointStore = local;
  let version;
  let uploaded = 0;
  const manifestBytesOut = cap.manifestBytes ? Buffer.from(cap.manifestBytes.buffer, cap.manifestBytes.byteOffset, cap.manifestBytes.byteLength) : null;
  try {
    if (remote) {
      store = await remote;
      const target = store;
      await inParallel(cap.objectList!, REMOTE_CONCURRENCY, async ([sha, size]) => {
        if ((await target.putObject(sha, local.objectPath(sha), size)).stored) uploaded++;
      });
      version = await store.putManifest(id, manifestBytesOut!);
    }
  } catch (err) {
    local.removeManifest(id);
    throw checkpointFailed(
      'store',
      `checkpoint of ${workspace}: writing to ${store.location} failed: ${(err as Error).message}`,
      err instanceof StoreError && err.key ? { key: err.key } : {},
    );
  }
  const tStore = performance.now();
  // 5. Read back: the manifest by id, then every object, re-hashed. Only then published.
  let readBack = {
    objects: cap.objects.referenced,
    bytes: cap.objects.bytes,
    rehashedObjects: 0,
    rehashedBytes: 0,
    trustedObjects: 0,
    trees: { objects: cap.trees.referenced, rehashedObjects: 0, trustedObjects: 0 },
    repaired: 0,
  };
  try {
    const readBackDeps = { thread: d.thread, local, publicKeyPem: signer.publicKeyPem, rehash: config.checkpoint.readBack, log };
    const here = await readBackLocal(readBackDeps, id);
    readBack = { ...readBack, ...here };
    if (remote) readBack = await readBackRemote(readBackDeps, store, id, version, manifestBytesOut!, cap.objectList!, new Set(cap.treeIds));
  } catch (err) {
    // Never published: the manifest goes at once (it claims nothing; gc would remove a local one too).
    local.removeManifest(id);
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
      trusted_objects: readBack.trustedObjects,
      trees: { objects: readBack.trees.objects, rehashed_objects: readBack.trees.rehashedObjects, trusted_objects: readBack.trees.trustedObjects },
      ms: readBackMs,
    },
    supervisor: fence,
  });
  const recordBytes = Buffer.from(jcs(record));
  // The local record first: it is what a restart finds (a task close resumed after a crash
  // looks there, and puts a remote record that is missing: published.ts putRemote). A remote record
  // that cannot be written takes the local one back: published everywhere, or nowhere.
  try {
    await local.putPublished(id, recordBytes);
  } catch (err) {
    throw checkpointFailed('store', `checkpoint ${id}: the published record could not be written to ${local.dir}: ${(err as Error).message}`);
  }
  faultPoint('checkpoint:after-local-published');
  if (remote) {
    try {
      await store.putPublished(id, recordBytes);
    } catch (err) {
      local.removePublished(id);
      throw checkpointFailed('store', `checkpoint ${id}: the published record could not be written to ${store.location}: ${(err as Error).message}`);
    }
  }
  const result: CheckpointResult = {
    checkpoint_id: id,
    workspace,
    task,
    store: d.location,
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
    trees: { referenced: cap.trees.referenced, written: cap.trees.written, bytes_written: cap.trees.bytesWritten, built: cap.trees.built },
    read: { files: cap.read.files, bytes: cap.read.bytes, hinted_paths: cap.read.hintedPaths },
    read_back: {
      objects: readBack.objects,
      bytes: readBack.bytes,
      rehashed_objects: readBack.rehashedObjects,
      rehashed_bytes: readBack.rehashedBytes,
      trusted_objects: readBack.trustedObjects,
      trees: { objects: readBack.trees.objects, rehashed_objects: readBack.trees.rehashedObjects, trusted_objects: readBack.trees.trustedObjects },
      ms: readBackMs,
      at: readBackAt,
    },
    supervisor: fence,
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
