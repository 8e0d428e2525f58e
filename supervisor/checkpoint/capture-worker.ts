// The checkpoint thread (worker_threads; one kept per supervisor, capture.ts runs it): a
// checkpoint up to its stored manifest (the capture, passes.ts; then the manifest built,
// canonicalised once, signed and written last, create-once) and the read-back of a stored
// manifest (its bytes, form and signature, then every object re-hashed). Owns those steps and
// the thread's message loop; nothing of a tree's size goes back to the event loop. Blocking
// by design: never on the event loop.
import { createPrivateKey, sign } from 'node:crypto';
import { closeSync, constants, openSync, readSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { parentPort, workerData } from 'node:worker_threads';
import { jcs } from '../../ipc/signature.js';
import { faultPoint } from '../fault.js';
import { fsDecode, nameText } from '../workspace/names.js';
import { ScanError } from '../workspace/walk.js';
import { LocalStoreFiles, objectKey } from './local-store.js';
import { checkManifest, manifestBytes, manifestJcs, manifestObjects, mountsSkipped, scanDigest, showEntryPath, toManifestEntry, type CheckpointBoundary, type Manifest, type RuntimeFence } from './manifest.js';
import { runCapture, runRehash, type CaptureRequest, type CaptureResult, type WorkerProgress, type WorkerReply } from './passes.js';
import { StoreError } from './store.js';

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
  freeze: CaptureResult['freeze'];
  /** forRemote: the manifest's canonical bytes, and [sha256, size, a path using it] per object. */
  manifestBytes?: Uint8Array;
  objectList?: [string, number, string][];
}

/** The read-back of a stored manifest, in the thread: its bytes, canonical form, digest, fields and signature, then every object re-hashed. */
export interface ReadBackRequest {
  kind: 'readback';
  storeDir: string;
  storeFd: number;
  id: string;
  publicKeyPem: string;
}

export interface ReadBackResult {
  /** What is wrong with the manifest read back ([]: it is the one written); objects are not read then. */
  manifestProblems: string[];
  objects: number;
  bytes: number;
  problems: { sha256: string; problem: string; paths: string[] }[];
}

export type CheckpointWorkerRequest = CheckpointRequest | ReadBackRequest;

const SHOWN_UNSTABLE = 100;

/**
 * Test hook (only tests set it): SBX_TEST_CHECKPOINT_FLIP=NAME flips the first byte of the
 * stored object of the workspace's file NAME after the manifest is written and before the
 * read-back, so a test can corrupt an object exactly between its write and its read-back.
 * Once per supervisor run (the thread is kept): the next checkpoint stores it again.
 */
let flipped = false;
function testFlipObject(storeDir: string, manifest: Manifest): void {
  const name = process.env.SBX_TEST_CHECKPOINT_FLIP;
  if (!name || flipped) return;
  const entry = manifest.entries.find((e) => e.path === name);
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

/** Runs a checkpoint up to its stored manifest (blocking): capture, commit, manifest (JCS, signed), written create-once. */
export function runCheckpoint(req: CheckpointRequest, progress: (p: WorkerProgress['progress']) => void = () => {}, onFrozen: (frozen: boolean) => void = () => {}): CheckpointStepResult {
  const cap = runCapture({ ...req, kind: 'capture' }, progress, onFrozen);
  const entries = cap.entries.map(toManifestEntry);
  const entriesJcs = jcs(entries); // once: the rest of the manifest is small
  const unstable = cap.unstable.map((p) => nameText(fsDecode(p)));
  const unsigned: Manifest = {
    version: 1,
    kind: 'checkpoint',
    workspace: req.header.workspace,
    task: req.header.task,
    ...(req.header.close_attempt !== undefined ? { close_attempt: req.header.close_attempt } : {}),
    started_at: req.header.started_at,
    created_at: new Date().toISOString(),
    boundary: req.header.boundary,
    scan: { digest: scanDigest(entries, entriesJcs), entries: entries.length, files: cap.files, bytes: cap.bytes, passes: cap.passes },
    consistent: unstable.length === 0,
    unstable,
    ...(cap.freeze?.frozen ? { frozen: true } : {}),
    supervisor: req.header.supervisor,
    root: { mode: cap.root.mode, uid: cap.root.uid, gid: cap.root.gid, mtime_ns: String(cap.root.mtimeNs) },
    entries,
  };
  const value = sign(null, Buffer.from(manifestJcs(unsigned, entriesJcs)), createPrivateKey(req.signingKeyPem)).toString('base64');
  const manifest: Manifest = { ...unsigned, signature: { alg: 'ed25519', key_id: req.keyId, value } };
  const { bytes, id } = manifestBytes(manifest, entriesJcs);
  const objects = manifestObjects(manifest);
  let objectBytes = 0;
  for (const size of objects.values()) objectBytes += size;
  faultPoint('checkpoint:before-manifest');
  const store = LocalStoreFiles.open(req.storeDir, { create: false, viaFd: req.storeFd });
  try {
    if (!store.createRecord(store.manifestsFd, `${id}.json`, bytes)) {
      const there = store.readRecord(store.manifestsFd, `${id}.json`);
      if (!there || !there.equals(bytes)) throw new StoreError('conflict', `${req.storeDir}/manifests/${id}.json exists with other bytes`, `manifests/${id}.json`);
    }
  } finally {
    store.close();
  }
  faultPoint('checkpoint:after-manifest');
  testFlipObject(req.storeDir, manifest);
  const result: CheckpointStepResult = {
    id,
    created_at: manifest.created_at,
    scan: manifest.scan,
    consistent: manifest.consistent,
    unstable: unstable.slice(0, SHOWN_UNSTABLE),
    unstableCount: unstable.length,
    leased: cap.leased.slice(0, SHOWN_UNSTABLE).map((p) => nameText(fsDecode(p))),
    leasedCount: cap.leased.length,
    mountsSkipped: mountsSkipped(manifest),
    objects: { referenced: objects.size, bytes: objectBytes, written: cap.objectsWritten, bytesWritten: cap.bytesWritten },
    freeze: cap.freeze,
  };
  if (req.forRemote) {
    result.manifestBytes = new Uint8Array(bytes);
    const firstUser = new Map<string, string>();
    for (const e of manifest.entries) for (const sha of e.chunks ? e.chunks.map((c) => c.sha256) : e.sha256 ? [e.sha256] : []) if (!firstUser.has(sha)) firstUser.set(sha, showEntryPath(e));
    result.objectList = [...objects].map(([sha, size]) => [sha, size, firstUser.get(sha) ?? '']);
  }
  return result;
}

/** Reads a stored manifest back by id and re-hashes every object it names (blocking); what differs is reported, never thrown. */
export function runReadBack(req: ReadBackRequest): ReadBackResult {
  const store = LocalStoreFiles.open(req.storeDir, { create: false, viaFd: req.storeFd });
  let bytes: Buffer | null;
  try {
    bytes = store.readRecord(store.manifestsFd, `${req.id}.json`);
  } finally {
    store.close();
  }
  if (!bytes) return { manifestProblems: [`no manifest ${req.id} in ${req.storeDir}`], objects: 0, bytes: 0, problems: [] };
  const check = checkManifest(bytes, { expectId: req.id, publicKeyPem: req.publicKeyPem });
  if (check.problems.length || !check.manifest) return { manifestProblems: check.problems, objects: 0, bytes: 0, problems: [] };
  const objects = manifestObjects(check.manifest);
  const rehash = runRehash({ kind: 'rehash', storeDir: req.storeDir, storeFd: req.storeFd, objects: [...objects] });
  const paths = (sha: string) =>
    check.manifest!.entries
      .filter((e) => e.sha256 === sha || e.chunks?.some((c) => c.sha256 === sha))
      .slice(0, 3)
      .map((e) => showEntryPath(e));
  return { manifestProblems: [], objects: rehash.objects, bytes: rehash.bytes, problems: rehash.problems.map((p) => ({ ...p, paths: paths(p.sha256) })) };
}
function toReply(err: unknown): WorkerReply<never> {
  if (err instanceof ScanError) return { ok: false, code: err.code, message: err.message };
  if (err instanceof StoreError) return { ok: false, code: `store_${err.code}`, message: err.message };
  const e = err as NodeJS.ErrnoException;
  return { ok: false, code: e.code ?? 'checkpoint_failed', message: e.message };
}

if (parentPort && workerData && (workerData as { checkpointWorker?: boolean }).checkpointWorker) {
  const port = parentPort;
  // One step at a time, in order; each answered by its id.
  port.on('message', ({ id, req }: { id: number; req: CheckpointWorkerRequest }) => {
    let reply: WorkerReply<unknown>;
    try {
      reply = {
        ok: true,
        result: req.kind === 'checkpoint' ? runCheckpoint(req, (progress) => port.postMessage({ id, progress }), (frozen) => port.postMessage({ id, frozen })) : runReadBack(req),
      };
    } catch (err) {
      reply = toReply(err);
    }
    port.postMessage({ id, reply });
  });
}
