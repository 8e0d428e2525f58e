// The read-back (docs/guide/checkpoints.md "Checkpoints"): a checkpoint is
// published only once its manifest reads back by id and every object it names reads back
// exactly, from the local store (in the checkpoint thread) and from a remote one (re-read and
// re-hashed here). A bad local object is set aside; a bad remote one is uploaded again once.
import { createHash } from 'node:crypto';
import type { Logger } from 'pino';
import type { LocalStore } from '../../core/checkpoint/local-store.js';
import { type CheckpointStore, rehashObject, StoreError } from '../../core/checkpoint/store.js';
import { errnoCode } from '../../ipc/errno.js';
import type { CheckpointThread } from './capture.js';
import { checkpointFailed, inParallel, REMOTE_CONCURRENCY } from './stages.js';

export interface ReadBackDeps {
  thread: CheckpointThread;
  local: LocalStore;
  publicKeyPem: string;
  /** checkpoint.readBack: 'changed', 'stat' or 'all' (config.ts says what each looks at). */
  rehash: 'changed' | 'stat' | 'all';
  log: Logger;
}

/** What a remote read-back checked: objects and their bytes, all re-hashed, and how many were uploaded again. */
export interface RemoteReadBack {
  objects: number;
  bytes: number;
  rehashedObjects: number;
  rehashedBytes: number;
  /** None here: a bucket's objects are all re-hashed. */
  trustedObjects: number;
  /** The tree objects, all re-hashed (not in `objects`). */
  trees: { objects: number; rehashedObjects: number; trustedObjects: number };
  repaired: number;
}

/** The local read-back of manifest id (in the thread); what it re-hashed. CHECKPOINT_FAILED stage read_back when anything differs (bad objects set aside first). */
export async function readBackLocal(
  d: ReadBackDeps,
  id: string,
): Promise<{
  rehashedObjects: number;
  rehashedBytes: number;
  trustedObjects: number;
  trees: { objects: number; rehashedObjects: number; trustedObjects: number };
}> {
  const reply = await d.thread.run({ kind: 'readback', storeDir: d.local.dir, storeFd: d.local.rootFd, id, publicKeyPem: d.publicKeyPem, rehash: d.rehash });
  if (!reply.ok) throw checkpointFailed('read_back', `checkpoint ${id}: the read-back failed: ${reply.message}`);
  const { manifestProblems, problems } = reply.result;
  if (manifestProblems.length)
    throw checkpointFailed('read_back', `checkpoint ${id}: the manifest read back from ${d.local.dir} is not the one written: ${manifestProblems.join('; ')}`);
  if (problems.length === 0) {
    const { rehashedObjects, rehashedBytes, trustedObjects, trees } = reply.result;
    return { rehashedObjects, rehashedBytes, trustedObjects, trees };
  }
  // A bad object is set aside, so that the retry stores it afresh (create-once never replaces).
  for (const p of problems) setAside(d, p.sha256);
  const first = problems[0];
  throw checkpointFailed(
    'read_back',
    `checkpoint ${id} not published: ${first.problem} (used by ${first.paths.join(', ')})${problems.length > 1 ? `; and ${problems.length - 1} more objects` : ''}; set aside, a retry stores them again`,
    {
      object: first.sha256,
      paths: first.paths,
      objects: problems.map((p) => p.sha256),
    },
  );
}

/** Moves what sits at an object's name into quarantine/ (LocalStore.setAside), logging it; a failure to is logged, never thrown. */
function setAside(d: ReadBackDeps, sha256: string): void {
  try {
    const quarantine = d.local.setAside(sha256);
    d.log.error({ object: sha256, quarantine }, 'a checkpoint object failed its read-back: set aside');
  } catch (err) {
    // Nothing there (gone, or no fan dir): nothing to set aside. Anything else (quarantine/ a link, say) is said.
    if (errnoCode(err) === 'ENOENT' || (err instanceof StoreError && err.code === 'missing')) return;
    d.log.error({ err, object: sha256 }, 'a bad checkpoint object could not be set aside');
  }
}

/**
 * The remote read-back: the manifest must be the bytes written (`written`, checked whole in
 * the thread just before), and every object ([sha256, size, a path using it]; those in
 * `trees` are tree objects, counted apart) re-read and
 * re-hashed (a bucket's objects have no stat to trust); one that differs is uploaded again
 * from the local store and read again. CHECKPOINT_FAILED stage read_back.
 */
export async function readBackRemote(
  d: ReadBackDeps,
  store: CheckpointStore,
  id: string,
  version: Awaited<ReturnType<CheckpointStore['putManifest']>> | undefined,
  written: Buffer,
  objects: [string, number, string][],
  trees: ReadonlySet<string>,
): Promise<RemoteReadBack> {
  let bytes: Buffer;
  try {
    bytes = await store.readManifest(id, version);
  } catch (err) {
    throw checkpointFailed('read_back', `checkpoint ${id}: the manifest cannot be read back from ${store.location}: ${(err as Error).message}`);
  }
  if (!bytes.equals(written))
    throw checkpointFailed(
      'read_back',
      `checkpoint ${id}: the manifest read back from ${store.location} is not the one written (${bytes.length} bytes, sha256 ${createHash('sha256').update(bytes).digest('hex')})`,
    );
  let total = 0;
  let treeCount = 0;
  let repaired = 0;
  await inParallel(objects, REMOTE_CONCURRENCY, async ([sha, size, user]) => {
    let got = await rehashObject(store, sha);
    if ((got.error || got.sha256 !== sha || got.bytes !== size) && store.replaceObject) {
      // The local copy was read back exactly just before: put it over what the bucket holds.
      d.log.error(
        { object: sha, store: store.location, found: got.error ?? `${got.sha256} (${got.bytes} bytes)` },
        'a checkpoint object failed its read-back from the store: uploaded again from the local store',
      );
      try {
        await store.replaceObject(sha, d.local.objectPath(sha), size);
        repaired++;
        got = await rehashObject(store, sha);
      } catch (err) {
        got = { sha256: '', bytes: 0, error: `uploading it again failed: ${(err as Error).message}` };
      }
    }
    const where = `(used by ${user})`;
    if (got.error)
      throw checkpointFailed('read_back', `checkpoint ${id} not published: object ${sha} cannot be read back from ${store.location}: ${got.error} ${where}`, {
        object: sha,
      });
    if (got.sha256 !== sha || got.bytes !== size) {
      throw checkpointFailed(
        'read_back',
        `checkpoint ${id} not published: object ${sha} reads back from ${store.location} as ${got.sha256} (${got.bytes} bytes, ${size} expected), also after uploading it again ${where}`,
        { object: sha },
      );
    }
    if (trees.has(sha)) treeCount++;
    else total += got.bytes;
  });
  const files = objects.length - treeCount;
  return {
    objects: files,
    bytes: total,
    rehashedObjects: files,
    rehashedBytes: total,
    trustedObjects: 0,
    trees: { objects: treeCount, rehashedObjects: treeCount, trustedObjects: 0 },
    repaired,
  };
}
