// The checkpoint thread (worker_threads; capture.ts runs it): a checkpoint up to its stored
// manifest (the capture, passes.ts; then the manifest built, canonicalised once, signed and
// written last, create-once) and the read-back of a stored manifest (bytes, form, signature,
// then every object re-hashed). Owns those steps and the message loop; blocking by design.
import { createHash, createPrivateKey, createPublicKey, sign, verify } from 'node:crypto';
import { closeSync, constants, fstatSync, lstatSync, openSync, readSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { parentPort, workerData } from 'node:worker_threads';
import { jcs } from '../../core/receipts/signature.js';
import { faultPoint } from '../../core/fault.js';
import { fsDecode, fsEncode, nameText, showPath } from '../../core/fs/names.js';
import { pathAt, ScanError } from '../../core/fs/walk.js';
import { STORE_DIRS } from '../../core/state/names.js';
import { LocalStoreFiles, objectKey } from '../../core/checkpoint/local-store.js';
import {
  checkManifest,
  manifestObjects,
  manifestTrees,
  showEntryPath,
  type CheckpointBoundary,
  type Manifest,
  type RuntimeFence,
} from '../../core/checkpoint/manifest.js';
import { pathOf, runCapture, runRehash, type CaptureRequest, type CaptureResult, type CapturedEntry, type WorkerProgress, type WorkerReply } from './passes.js';
import { StatCache, VerifiedObjects, type CaptureSeed } from './stat-cache.js';
import type { JournalHints } from '../workspace/journal.js';
import type { DirTree } from './trees.js';
import { objectsAfter, objectsOf } from './object-list.js';
import { StoreError } from '../../core/checkpoint/store.js';
import { errnoCode, systemError } from '../../ipc/errno.js';
import { testHooks } from '../../core/test-hooks.js';
import { boundThisHeap, heapTick, settleHeap } from './heap-bound.js';

export type { CaptureRequest, CaptureResult, CapturedEntry, RehashRequest, RehashResult, WorkerProgress, WorkerReply } from './passes.js';
export { runCapture, runRehash } from './passes.js';

/** What the manifest says besides its entries and scan, decided by the supervisor before the capture. */
export interface ManifestHeader {
  workspace: string;
  task: string | null;
  close_attempt?: number;
  started_at: string;
  boundary: CheckpointBoundary;
  supervisor: RuntimeFence;
}

/** The whole checkpoint up to its manifest, in the thread: capture, then the manifest built, signed and stored (last). */
export interface CheckpointRequest extends Omit<CaptureRequest, 'kind'> {
  kind: 'checkpoint';
  header: ManifestHeader;
  /** The signing key (PKCS#8 PEM) and its key id: the manifest is signed here, off the event loop. */
  signingKeyPem: string;
  keyId: string;
  /** For a remote store: the manifest's bytes and its objects come back too. */
  forRemote: boolean;
  /** The workspace journal (watcher.ts hints), taken after the boundary: what changed since the seed's checkpoint is read before the first walk. */
  journal?: JournalHints;
}

/** What the supervisor is told of a checkpoint whose manifest is stored (the entries stay in the thread: a big tree's manifest would be copied and re-parsed on the event loop). */
export interface CheckpointStepResult {
  id: string;
  created_at: string;
  scan: Manifest['scan'];
  consistent: boolean;
  /** The first SHOWN_UNSTABLE unstable paths, and how many in all. */
  unstable: string[];
  unstableCount: number;
  /** Of those, the first SHOWN_UNSTABLE held by another process's write lease (not captured in the last pass), and how many in all. */
  leased: string[];
  leasedCount: number;
  /** Mount points inside the workspace recorded as (empty) directories, not entered. */
  mountsSkipped: string[];
  objects: { referenced: number; bytes: number; written: number; bytesWritten: number };
  /** The tree objects (one per directory, unchanged ones shared): named by the manifest, new in the store, their bytes, and built this time (the rest kept from the last read-back checkpoint). */
  trees: { referenced: number; written: number; bytesWritten: number; built: number };
  /** Files the capture opened and read (every pass), and the bytes it hashed. */
  read: { files: number; bytes: number; hintedPaths: number };
  freeze: CaptureResult['freeze'];
  /** Why the stat cache's copy on disk was not used (stat-cache-file.ts loadStatCache), when there was one and it was not: every file was read. */
  statCacheRejected?: string;
  /** forRemote: the manifest's canonical bytes, and [sha256, size, a path using it] per object. */
  manifestBytes?: Uint8Array;
  objectList?: [string, number, string][];
  /** forRemote: which of objectList are tree objects. */
  treeIds?: string[];
}

/** The read-back of a stored manifest, in the thread: its bytes, canonical form, digest, fields and signature, then every object re-hashed. */
export interface ReadBackRequest {
  kind: 'readback';
  storeDir: string;
  storeFd: number;
  id: string;
  publicKeyPem: string;
  /** checkpoint.readBack (config.ts says what each looks at): 'changed', 'stat' or 'all'. */
  rehash: 'changed' | 'stat' | 'all';
}

export interface ReadBackResult {
  /** What is wrong with the manifest read back ([]: it is the one written); objects are not read then. */
  manifestProblems: string[];
  objects: number;
  bytes: number;
  /** Of those, re-read and re-hashed (the others confirmed by their file's stat, or not looked at: trustedObjects). */
  rehashedObjects: number;
  rehashedBytes: number;
  /** Of `objects`, not looked at (only under trees a read-back of this thread checked: checkpoint.readBack 'changed'). */
  trustedObjects: number;
  /** The tree objects checked (not in `objects`), of those re-hashed, and those not looked at. */
  trees: { objects: number; rehashedObjects: number; trustedObjects: number };
  problems: { sha256: string; problem: string; paths: string[] }[];
}

/** Answered once every step before it is done, the stat cache written included (capture.ts stop). */
interface FlushRequest {
  kind: 'flush';
}

export type CheckpointWorkerRequest = CheckpointRequest | ReadBackRequest | FlushRequest;

const SHOWN_UNSTABLE = 100;

/** How long the thread waits with nothing to do before its idle work (settle: the stat cache to disk, the heap's garbage), ms. */
const IDLE_WORK_MS = 500;

/** Kept for the thread's life (it is kept: capture.ts): each workspace's last read-back capture, and the objects re-hashed. */
const statCache = new StatCache();
const verified = new VerifiedObjects();

/** The test hook checkpointFlip (core/test-hooks.ts): an object corrupted exactly between its write and its read-back; once per run (the thread is kept), so the next checkpoint stores it again. */
let flipped = false;
function testFlipObject(storeDir: string, entries: CapturedEntry[]): void {
  const name = testHooks.checkpointFlip;
  if (!name || flipped) return;
  const entry = entries.find((e) => pathOf(e).toString('utf8') === name);
  if (!entry?.sha256 || !entry.size) return;
  flipped = true;
  const fd = openSync(join(storeDir, objectKey(entry.sha256)), constants.O_RDWR | constants.O_NOFOLLOW);
  try {
    const b = Buffer.alloc(1);
    readSync(fd, b, 0, 1, 0);
    b[0] ^= 0xff;
    writeSync(fd, b, 0, 1, 0);
  } finally {
    closeSync(fd);
  }
}

/**
 * The manifest this thread stored last, kept until its read-back (the same thread, next):
 * its id (the SHA-256 of its bytes: they are not kept), whether its signature verified when
 * it was made (under the public key of the signing key), and its objects with the first entry
 * using each. A read-back whose bytes hash to this id read back exactly the bytes built here,
 * and re-hashes the objects; any other bytes get the whole check (checkManifest), which names
 * what differs.
 */
let produced: {
  id: string;
  signatureVerified: boolean;
  objects: Map<string, CapturedEntry>;
  trees: Map<string, number>;
  /** Each directory's tree (by path, latin1; the root's ''). */
  dirs: Map<string, DirTree>;
  /** The trees of the workspace's last read-back checkpoint (a read-back of this thread checked everything under each), and what this capture wrote. */
  checkedTrees: ReadonlySet<string>;
  written: ReadonlySet<string>;
} | null = null;

/**
 * The objects a read-back in 'changed' mode looks at: what the capture wrote, and every object
 * of a directory whose tree is not one checked before; the rest are only under trees a
 * read-back of this thread checked, unchanged since (then not looked at again).
 */
function toLookAt(p: NonNullable<typeof produced>): Set<string> {
  const look = new Set<string>(p.written);
  const stack = [''];
  while (stack.length) {
    const tree = p.dirs.get(stack.pop()!);
    if (!tree || p.checkedTrees.has(tree.id)) continue;
    look.add(tree.id);
    for (const m of tree.members) {
      if (m.type === 'file' && m.sha256 !== undefined) look.add(m.sha256);
      else if (m.type === 'dir' && !m.mount) stack.push(m.key);
    }
  }
  return look;
}

/** The store's identity: its directory's and its objects/ directory's device and inode (either replaced, by a copy say: another store). */
function storeIdentity(storeFd: number): string {
  const root = fstatSync(storeFd, { bigint: true });
  let objects = '';
  try {
    const st = lstatSync(pathAt(storeFd, STORE_DIRS.objects), { bigint: true });
    objects = `${st.dev}:${st.ino}`;
  } catch {
    // no objects/ yet: the capture makes it
  }
  return `${root.dev}:${root.ino}/${objects}`;
}

/**
 * The journal's paths with events after since (the seed checkpoint's boundary), as bytes; none
 * when there is no journal or seed boundary, the epochs differ, or events since may be missing.
 */
function journalSince(journal: JournalHints | undefined, since: CaptureSeed['boundary']): Buffer[] | undefined {
  if (!journal || !since || journal.epoch !== since.epoch || journal.incompleteThrough > since.seq) return undefined;
  const paths: Buffer[] = [];
  for (const [path, seq] of journal.entries) if (seq > since.seq) paths.push(fsEncode(path));
  return paths;
}

/** Runs a checkpoint up to its stored manifest (blocking): capture, commit, manifest (JCS, signed), written create-once. */
export function runCheckpoint(
  req: CheckpointRequest,
  progress: (p: WorkerProgress['progress']) => void = () => {},
  onFrozen: (frozen: boolean) => void = () => {},
): CheckpointStepResult {
  produced = null;
  const { seed, rejected: statCacheRejected } = statCache.seed(req.root, {
    storeFd: req.storeFd,
    signingKeyPem: req.signingKeyPem,
    maxBytes: req.maxManifestBytes,
  });
  let cap: ReturnType<typeof runCapture>;
  try {
    cap = runCapture({ ...req, kind: 'capture' }, progress, onFrozen, seed, journalSince(req.journal, seed?.boundary ?? null));
  } catch (err) {
    // Failed other than as a checkpoint fails (a TypeError, say: an entry a bug wrote into the
    // seed or its copy): the seed and its copy go, so the next capture reads every file rather
    // than failing the same way every time, restarts included.
    if (seed && !(err instanceof ScanError) && !(err instanceof StoreError) && errnoCode(err) === undefined) statCache.drop(req.root, req.storeFd);
    throw err;
  }
  // Trees checked by the last read-back are trusted in that store only (not a copy put at its path since).
  const storeId = storeIdentity(req.storeFd);
  const checkedTrees = new Set(seed?.storeId === storeId ? [...(seed.trees?.values() ?? [])].map((t) => t.id) : []);
  const unstable = cap.unstable.map((p) => nameText(fsDecode(p)));
  // Version 2: the entries are in the tree objects (stored with the files' objects, trees.ts);
  // the manifest names the root's, and is signed and stored whole (a few hundred bytes).
  const unsigned: Omit<Manifest, 'entries' | 'signature'> = {
    version: 2,
    kind: 'checkpoint',
    workspace: req.header.workspace,
    task: req.header.task,
    ...(req.header.close_attempt !== undefined ? { close_attempt: req.header.close_attempt } : {}),
    started_at: req.header.started_at,
    created_at: new Date().toISOString(),
    boundary: req.header.boundary,
    scan: { digest: `sha256:${cap.trees.rootId}`, entries: cap.entries.length, files: cap.files, bytes: cap.bytes, passes: cap.passes },
    consistent: unstable.length === 0,
    unstable,
    ...(cap.freeze?.frozen ? { frozen: true } : {}),
    supervisor: req.header.supervisor,
    root: { mode: cap.root.mode, uid: cap.root.uid, gid: cap.root.gid, mtime_ns: String(cap.root.mtimeNs) },
    tree: cap.trees.rootId,
  };
  const covered = Buffer.from(jcs(unsigned));
  const signingKey = createPrivateKey(req.signingKeyPem);
  const signature = sign(null, covered, signingKey);
  const signatureVerified = verify(null, covered, createPublicKey(signingKey), signature);
  const manifest = { ...unsigned, signature: { alg: 'ed25519' as const, key_id: req.keyId, value: signature.toString('base64') } };
  const parts = [Buffer.from(jcs(manifest))];
  const id = createHash('sha256').update(parts[0]).digest('hex');
  // Each object once, with an entry using it (its path is made only when named): the seed's
  // when the capture kept exactly the seed's entries (made from those same entries), the
  // seed's updated in place when it kept the seed with the journal's paths over it; else
  // derived from every entry.
  const changes = seed && cap.keptOverlay?.base === seed.entries ? cap.keptOverlay.changes() : null;
  const updated = changes ? objectsAfter(seed!.objects, seed!.entries, changes, cap.entries) : undefined;
  const listing = (cap.keptSeed && seed?.objects) || updated || objectsOf(cap.entries);
  const { byId: objects, bytes: objectBytes, mounts } = listing;
  try {
    faultPoint('checkpoint:before-manifest');
    const store = LocalStoreFiles.open(req.storeDir, { create: false, viaFd: req.storeFd });
    try {
      if (!store.createRecord(store.manifestsFd, `${id}.json`, parts)) {
        const there = store.readRecord(store.manifestsFd, `${id}.json`);
        if (!there || !there.equals(Buffer.concat(parts)))
          throw new StoreError('conflict', `${req.storeDir}/manifests/${id}.json exists with other bytes`, `manifests/${id}.json`);
      }
    } finally {
      store.close();
    }
    faultPoint('checkpoint:after-manifest');
  } catch (err) {
    // The seed stays (this checkpoint was not offered); its list no longer fits its entries.
    if (updated) delete seed!.objects;
    throw err;
  }
  const b = req.header.boundary;
  statCache.offer(
    id,
    req.root,
    cap.entries,
    { dirs: cap.trees.dirs, storeId },
    {
      ...cap,
      boundary: b.epoch !== null && b.seq !== null ? { epoch: b.epoch, seq: b.seq } : null,
      kept: cap.keptSeed ? seed!.entries : null,
      update: changes ? { seed: seed!.entries, changes } : null,
      objects: listing,
      signingKeyPem: req.signingKeyPem,
      reserveBytes: req.reserveBytes,
    },
  );
  produced = { id, signatureVerified, objects, trees: cap.trees.trees, dirs: cap.trees.dirs, checkedTrees, written: new Set(cap.written) };
  testFlipObject(req.storeDir, cap.entries);
  const result: CheckpointStepResult = {
    id,
    created_at: manifest.created_at,
    scan: manifest.scan,
    consistent: manifest.consistent,
    unstable: unstable.slice(0, SHOWN_UNSTABLE),
    unstableCount: unstable.length,
    leased: cap.leased.slice(0, SHOWN_UNSTABLE).map((p) => nameText(fsDecode(p))),
    leasedCount: cap.leased.length,
    mountsSkipped: mounts,
    objects: { referenced: objects.size, bytes: objectBytes, written: cap.objectsWritten, bytesWritten: cap.bytesWritten },
    trees: { referenced: cap.trees.trees.size, written: cap.trees.written, bytesWritten: cap.trees.bytesWritten, built: cap.trees.built },
    read: { files: cap.filesRead, bytes: cap.bytesHashed, hintedPaths: cap.hintedPaths },
    freeze: cap.freeze,
    ...(statCacheRejected !== undefined ? { statCacheRejected } : {}),
  };
  if (req.forRemote) {
    result.manifestBytes = new Uint8Array(Buffer.concat(parts));
    // The trees first: a remote store holds every tree before any manifest names it (the files' objects too).
    result.objectList = [
      ...[...cap.trees.trees].map(([sha, size]): [string, number, string] => [sha, size, 'a tree object']),
      ...[...objects].map(([sha, e]): [string, number, string] => [sha, e.size, showPath(pathOf(e))]),
    ];
    result.treeIds = [...cap.trees.trees.keys()];
  }
  return result;
}

/** Reads a stored manifest back by id and re-hashes every object it names (blocking); what differs is reported, never thrown. */
export function runReadBack(req: ReadBackRequest): ReadBackResult {
  const store = LocalStoreFiles.open(req.storeDir, { create: false, viaFd: req.storeFd });
  try {
    return readBackIn(store, req);
  } finally {
    store.close();
  }
}

function readBackIn(store: LocalStoreFiles, req: ReadBackRequest): ReadBackResult {
  const bytes = store.readRecord(store.manifestsFd, `${req.id}.json`);
  const none = {
    objects: 0,
    bytes: 0,
    rehashedObjects: 0,
    rehashedBytes: 0,
    trustedObjects: 0,
    trees: { objects: 0, rehashedObjects: 0, trustedObjects: 0 },
    problems: [],
  };
  if (!bytes) {
    statCache.confirm(req.id, false, req.storeFd);
    return { manifestProblems: [`no manifest ${req.id} in ${req.storeDir}`], ...none };
  }
  let objects: Map<string, number>;
  let trees: ReadonlySet<string>;
  /** Not looked at (checkpoint.readBack 'changed', toLookAt): objects (not trees), their bytes, and trees. */
  const trusted = { objects: 0, bytes: 0, trees: 0 };
  let pathsOf: (sha: string) => string[];
  const mine = produced?.id === req.id ? produced : null;
  produced = null;
  if (mine && createHash('sha256').update(bytes).digest('hex') === mine.id) {
    // Exactly the bytes this thread built (their SHA-256 is its id: canonical, digest and
    // counts by construction, and checkManifest of the same builder in the tests); the
    // signature it verified when it was made.
    if (!mine.signatureVerified) {
      statCache.confirm(req.id, false, req.storeFd);
      return { manifestProblems: ["the manifest's signature does not verify under the supervisor's public key"], ...none };
    }
    const look = req.rehash === 'changed' ? toLookAt(mine) : null;
    objects = new Map();
    for (const [sha, size] of mine.trees) {
      if (!look || look.has(sha)) objects.set(sha, size);
      else trusted.trees++;
    }
    trees = new Set(objects.keys());
    for (const [sha, e] of mine.objects) {
      heapTick();
      if (!look || look.has(sha)) objects.set(sha, e.size);
      else {
        trusted.objects++;
        trusted.bytes += e.size;
      }
    }
    pathsOf = (sha) => {
      const e = mine.objects.get(sha);
      return [e ? showPath(pathOf(e)) : 'a tree object'];
    };
  } else {
    const check = checkManifest(bytes, { expectId: req.id, publicKeyPem: req.publicKeyPem, readTree: (sha) => store.readObjectBytes(sha) });
    if (check.problems.length || !check.manifest) {
      statCache.confirm(req.id, false, req.storeFd);
      return { manifestProblems: check.problems, ...none };
    }
    objects = manifestObjects(check.manifest);
    trees = new Set(manifestTrees(check.manifest).keys());
    const m = check.manifest;
    pathsOf = (sha) =>
      m.entries
        .filter((e) => e.sha256 === sha || e.chunks?.some((c) => c.sha256 === sha))
        .slice(0, 3)
        .map((e) => showEntryPath(e));
  }
  const rehash = runRehash({
    kind: 'rehash',
    storeDir: req.storeDir,
    storeFd: req.storeFd,
    objects: [...objects],
    trees,
    ...(req.rehash !== 'all' ? { trusted: (sha: string, sig: string) => verified.has(req.storeDir, sha, sig) } : {}),
    onRehashed: (sha, sig) => verified.add(req.storeDir, sha, sig),
  });
  statCache.confirm(req.id, rehash.problems.length === 0, req.storeFd);
  for (const p of rehash.problems) verified.forget(req.storeDir, p.sha256);
  return {
    manifestProblems: [],
    objects: rehash.objects + trusted.objects,
    bytes: rehash.bytes + trusted.bytes,
    rehashedObjects: rehash.rehashedObjects,
    rehashedBytes: rehash.rehashedBytes,
    trustedObjects: trusted.objects,
    trees: { objects: rehash.trees.objects + trusted.trees, rehashedObjects: rehash.trees.rehashedObjects, trustedObjects: trusted.trees },
    problems: rehash.problems.map((p) => ({ ...p, paths: pathsOf(p.sha256) })),
  };
}
function toReply(err: unknown): WorkerReply<never> {
  if (err instanceof ScanError) return { ok: false, code: err.code, message: err.message };
  if (err instanceof StoreError) return { ok: false, code: `store_${err.code}`, message: err.message };
  const e = systemError(err);
  return { ok: false, code: e.code ?? 'checkpoint_failed', message: e.message };
}

if (parentPort && workerData && (workerData as { checkpointWorker?: boolean }).checkpointWorker) {
  const port = parentPort;
  boundThisHeap();
  /** The idle work after a step's answer (settle): not yet run while a step came before IDLE_WORK_MS. */
  let idle: NodeJS.Timeout | null = null;
  const settle = () => {
    idle = null;
    // The stat cache a read-back confirmed, to disk (stat-cache.ts flush), then the heap's garbage.
    statCache.flush();
    settleHeap();
  };
  // One step at a time, in order; each answered by its id.
  port.on('message', ({ id, req }: { id: number; req: CheckpointWorkerRequest }) => {
    if (idle) clearTimeout(idle);
    idle = null;
    // The stop's barrier: answered once the stat cache is written.
    if (req.kind === 'flush') statCache.flush();
    let reply: WorkerReply<unknown>;
    try {
      reply = {
        ok: true,
        result:
          req.kind === 'checkpoint'
            ? runCheckpoint(
                req,
                (progress) => port.postMessage({ id, progress }),
                (frozen) => port.postMessage({ id, frozen }),
              )
            : req.kind === 'readback'
              ? runReadBack(req)
              : null,
      };
    } catch (err) {
      reply = toReply(err);
    }
    port.postMessage({ id, reply });
    // Once the thread has had nothing to do for IDLE_WORK_MS: a checkpoint asked right after
    // this answer (a task close after another checkpoint, a bench) does not wait for the write.
    idle = setTimeout(settle, IDLE_WORK_MS);
  });
}
