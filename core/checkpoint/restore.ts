// sbx restore: materialise a published checkpoint into an empty (or new) directory, byte for byte, then
// rescan it and compare with the manifest. Reads the store directly, so it works with the supervisor stopped.
// Owns the restore and the tree description it compares; not the format (manifest.ts) or the store
// (store.ts). See open(2), mkdirat(2), symlinkat(2), mknodat(2), utimensat(2), chown(2), tar(1) --same-owner.
import { createHash } from 'node:crypto';
import {
  closeSync,
  constants,
  fchmodSync,
  fchownSync,
  fstatSync,
  lchownSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readSync,
  symlinkSync,
} from 'node:fs';
import { native } from '../fs/native.js';
import { pathAt, openDirAt, walkTree } from '../fs/walk.js';
import { writeAll } from '../fs/durable.js';
import { showPath } from '../fs/names.js';
import {
  checkManifestAsync,
  checkPublished,
  entryPathBytes,
  entryTargetBytes,
  mountsSkipped,
  notCaptured,
  showEntryPath,
  toManifestEntry,
  type Manifest,
  type ManifestEntry,
} from './manifest.js';
import { treeReader, type CheckpointStore } from './store.js';
import { errnoCode } from '../../ipc/errno.js';

/** Why a restore could not be done (nothing claimed): `code` not_published, no_such_checkpoint, bad_manifest, target, object, io. */
export class RestoreError extends Error {
  constructor(
    readonly code: 'not_published' | 'no_such_checkpoint' | 'bad_manifest' | 'target' | 'object' | 'io',
    message: string,
  ) {
    super(message);
    this.name = 'RestoreError';
  }
}

/** One way the restored tree differs from the manifest: a path ('.' for DIR itself) and a field (`missing`, `extra`, or an entry field). */
export interface Difference {
  path: string;
  field: string;
  found: unknown;
  expected: unknown;
}

export interface RestoreResult {
  checkpoint_id: string;
  target: string;
  entries: number;
  files: number;
  bytes: number;
  /** same: owners as recorded (root); not_given: the restorer's (not root, or --no-same-owner), and uid/gid are not compared. */
  owners: 'same' | 'not_given';
  /** Paths whose set-user-ID / set-group-ID bits were dropped because their owner was not given. */
  setid_dropped: string[];
  /** From the manifest: false when paths kept changing while it was taken (listed in `unstable`). */
  consistent: boolean;
  unstable: string[];
  /** Of `unstable`, those the manifest has no entry for: not captured, so not restored (gone, or held by another process's write lease, when it was taken). */
  not_captured: string[];
  /** From the manifest: mount points the checkpoint did not enter, restored as empty directories. */
  mounts_skipped: string[];
  /** The rescan equals the manifest (type, mode, owner when given, size, content, target, device, mtime to the ns; DIR's own mode, owner and mtime). */
  identical: boolean;
  differences: Difference[];
  ms: number;
}

const TYPE_BITS: Record<string, number> = { fifo: constants.S_IFIFO, socket: constants.S_IFSOCK, char: constants.S_IFCHR, block: constants.S_IFBLK };
const CREATE = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW;
const OPEN_DIR = constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW;
const SETID = 0o6000;
/** Objects fetched ahead from a remote store while earlier ones are written, and the largest so fetched. */
const PREFETCH_OBJECTS = 8;
const PREFETCH_MAX_BYTES = 8 << 20;

/** Sets the atime and mtime of name in dirFd (null: dirFd itself) to the recorded ns, exactly, never through a link. */
function setTimes(dirFd: number, name: Buffer | null, ns: string): void {
  const t = BigInt(ns);
  native().setTimesAt(dirFd, name, Number(t / 1_000_000_000n), Number(t % 1_000_000_000n));
}

/**
 * Opens (or makes) the target: a directory, not a link, empty (a watched workspace too: the
 * supervisor keeps nothing in it). RestoreError target otherwise.
 */
function openTarget(target: string): number {
  try {
    mkdirSync(target, 0o700);
  } catch (err) {
    if (errnoCode(err) !== 'EEXIST') throw new RestoreError('target', `cannot make ${target}: ${(err as Error).message}`);
  }
  let fd: number;
  try {
    fd = openSync(target, OPEN_DIR);
  } catch (err) {
    // O_DIRECTORY|O_NOFOLLOW of a symlink fails ENOTDIR (../fs/walk.ts): lstat says which it was.
    let link = false;
    try {
      link = lstatSync(target).isSymbolicLink();
    } catch {
      // gone meanwhile
    }
    if (link) throw new RestoreError('target', `${target} is a symlink (never followed): restore into an empty or new directory`);
    if (errnoCode(err) === 'ENOTDIR') throw new RestoreError('target', `${target} is not a directory: restore into an empty or new directory`);
    throw new RestoreError('target', `cannot open ${target}: ${(err as Error).message}`);
  }
  const notEmpty = () => {
    // As bytes: a name that is not UTF-8 is shown with \xNN (showPath), as sbx shows names everywhere.
    const names = readdirSync(`/proc/self/fd/${fd}`, { encoding: 'buffer' });
    return names.length
      ? new RestoreError(
          'target',
          `${target} is not empty (${names.length} ${names.length === 1 ? 'entry' : 'entries'}, e.g. "${showPath(names[0], 80)}"): restore into an empty or new directory`,
        )
      : null;
  };
  try {
    // Nobody else may write in it while the restore runs: names made there by another user
    // could be swapped for links between a create and a chown. Root takes it over (0700, its
    // own) until the end, when the workspace's mode and owner are given to it; anyone else
    // restores only into a directory of their own that no one else can write. A refusal
    // changes nothing: emptiness is checked before the takeover, and again after it (a name
    // planted in between), and then the directory gets its owner and mode back.
    const st = fstatSync(fd);
    const me = process.getuid?.() ?? -1;
    const refused = notEmpty();
    if (refused) throw refused;
    if (me === 0) {
      if (st.uid !== 0 || st.gid !== 0) fchownSync(fd, 0, 0);
      fchmodSync(fd, 0o700);
      const late = notEmpty();
      if (late) {
        fchownSync(fd, st.uid, st.gid);
        fchmodSync(fd, st.mode & 0o7777);
        throw late;
      }
    } else if (st.uid !== me) {
      throw new RestoreError(
        'target',
        `${target} is owned by uid ${st.uid}, not by you (uid ${me}): restore into a new directory, or one of your own that only you can write`,
      );
    } else if ((st.mode & 0o022) !== 0) {
      throw new RestoreError(
        'target',
        `${target} is writable by others (mode 0${(st.mode & 0o7777).toString(8)}): another user could plant names in it during the restore; restore into a new directory, or one only you can write`,
      );
    }
  } catch (err) {
    closeSync(fd);
    throw err;
  }
  return fd;
}

/**
 * Reads the published checkpoint id from store and checks it: published (its record is
 * there), the manifest's bytes hash to id and are canonical, its digest and counts hold, and
 * with publicKeyPem its signature. RestoreError not_published / no_such_checkpoint / bad_manifest.
 */
export async function loadCheckpoint(store: CheckpointStore, id: string, publicKeyPem?: string): Promise<Manifest> {
  const published = await store.readPublished(id);
  let bytes: Buffer | null = null;
  let readError: Error | null = null;
  try {
    bytes = await store.readManifest(id);
  } catch (err) {
    readError = err as Error;
  }
  if (!published) {
    if (bytes)
      throw new RestoreError('not_published', `checkpoint ${id} in ${store.location} was never published (its read-back did not complete): it claims nothing`);
    throw new RestoreError('no_such_checkpoint', `no checkpoint ${id} in ${store.location} (never taken there, or removed by gc)`);
  }
  if (!bytes) throw new RestoreError('bad_manifest', `checkpoint ${id}: its published record is there but its manifest is not: ${readError?.message}`);
  const recordProblems = checkPublished(published, id, publicKeyPem);
  if (recordProblems.length) throw new RestoreError('not_published', `checkpoint ${id}: its published record does not hold: ${recordProblems.join('; ')}`);
  let checked: { manifest: Manifest | null; problems: string[] };
  try {
    checked = await checkManifestAsync(bytes, { expectId: id, publicKeyPem, readTree: treeReader(store) });
  } catch (err) {
    throw new RestoreError('bad_manifest', `checkpoint ${id}: its trees cannot be read from ${store.location}: ${(err as Error).message}`);
  }
  const { manifest, problems } = checked;
  if (!manifest || problems.length) throw new RestoreError('bad_manifest', `checkpoint ${id}: ${problems.join('; ')}`);
  return manifest;
}

/** A remote store's small objects fetched a few ahead of the restore (bounded: PREFETCH_OBJECTS of at most PREFETCH_MAX_BYTES). */
class Prefetch {
  private readonly ahead = new Map<string, Promise<Buffer | Error>>();
  private next = 0;

  constructor(
    private readonly store: CheckpointStore,
    private readonly order: { sha256: string; size: number }[],
  ) {}

  /** The bytes of the object at position i of the order, when it is one fetched ahead (else null: stream it). */
  async take(i: number): Promise<Buffer | Error | null> {
    const part = this.order[i];
    if (part.size > PREFETCH_MAX_BYTES) return null;
    while (this.next < this.order.length && this.next < i + PREFETCH_OBJECTS) {
      const p = this.order[this.next++];
      if (p.size <= PREFETCH_MAX_BYTES && !this.ahead.has(p.sha256)) this.ahead.set(p.sha256, this.fetch(p.sha256));
    }
    const got = this.ahead.get(part.sha256) ?? this.fetch(part.sha256);
    this.ahead.delete(part.sha256);
    return got;
  }

  private async fetch(sha256: string): Promise<Buffer | Error> {
    try {
      const parts: Uint8Array[] = [];
      for await (const c of this.store.readObject(sha256)) parts.push(c);
      return Buffer.concat(parts);
    } catch (err) {
      return err as Error;
    }
  }
}

/**
 * Materialises the checkpoint id (published; see loadCheckpoint) into target, then rescans and
 * compares. sameOwner (default: when root) gives every entry its recorded owner. remote: fetch
 * small objects a few ahead (an S3 store answers each in tens of ms). Throws RestoreError.
 * Every name is created relative to the fd of its directory, O_EXCL|O_NOFOLLOW (mkdir, symlink,
 * mknod never follow or replace either), so a link planted in the target is never followed: the
 * restore fails naming it instead. Owners as recorded when the restorer can give them (root, as
 * tar's --same-owner); otherwise the restorer's, and then set-user-ID and set-group-ID are dropped
 * rather than handed to another owner. chown(2) clears set-ID bits: so chmod comes after it.
 */
export async function restoreCheckpoint(
  store: CheckpointStore,
  id: string,
  target: string,
  options: {
    publicKeyPem?: string;
    sameOwner?: boolean;
    remote?: boolean;
    onProgress?: (p: { objects: number; totalObjects: number; bytes: number; totalBytes: number }) => void;
  } = {},
): Promise<RestoreResult> {
  const t0 = performance.now();
  const manifest = await loadCheckpoint(store, id, options.publicKeyPem);
  const sameOwner = options.sameOwner ?? process.getuid?.() === 0;
  const myUid = process.getuid?.() ?? -1;
  const myGid = process.getgid?.() ?? -1;
  const rootFd = openTarget(target);
  const stack: { fd: number; name: Buffer; entry: ManifestEntry }[] = [];
  const setidDropped: string[] = [];
  const dropped = new Set<ManifestEntry | 'root'>();
  let files = 0;
  let bytes = 0;
  const parts: { sha256: string; size: number }[] = [];
  for (const e of manifest.entries) if (e.type === 'file') parts.push(...(e.chunks ?? [{ sha256: e.sha256!, size: e.size }]));
  const prefetch = options.remote ? new Prefetch(store, parts) : null;
  let partIndex = 0;
  // Objects (file parts) copied so far, for a progress line (sbx restore on a terminal).
  const totalBytes = parts.reduce((sum, p) => sum + p.size, 0);
  let bytesCopied = 0;
  const progress = () => options.onProgress?.({ objects: partIndex, totalObjects: parts.length, bytes: bytesCopied, totalBytes });
  progress();

  /** The mode an entry gets: as recorded, without set-ID bits when its recorded owner is not given. */
  const modeFor = (e: { mode: number; uid: number; gid: number }, key: ManifestEntry | 'root', where: string): number => {
    const given = sameOwner || (e.uid === myUid && e.gid === myGid);
    if (given || (e.mode & SETID) === 0) return e.mode;
    setidDropped.push(where);
    dropped.add(key);
    return e.mode & ~SETID;
  };
  const finishDir = (d: { fd: number; entry: ManifestEntry }) => {
    try {
      if (sameOwner) fchownSync(d.fd, d.entry.uid, d.entry.gid);
      fchmodSync(d.fd, modeFor(d.entry, d.entry, showEntryPath(d.entry)));
      setTimes(d.fd, null, d.entry.mtime_ns);
    } finally {
      closeSync(d.fd);
    }
  };

  try {
    for (const e of manifest.entries) {
      const comps = splitPath(entryPathBytes(e));
      const name = comps[comps.length - 1];
      while (stack.length > comps.length - 1) finishDir(stack.pop()!);
      for (let i = 0; i < comps.length - 1; i++) {
        if (!stack[i] || !stack[i].name.equals(comps[i]))
          throw new RestoreError('bad_manifest', `checkpoint ${id}: entry ${JSON.stringify(showEntryPath(e))} comes before (or without) its directory`);
      }
      const dirFd = stack.length ? stack[stack.length - 1].fd : rootFd;
      const at = pathAt(dirFd, name);
      const where = JSON.stringify(showEntryPath(e));
      try {
        if (e.type === 'dir') {
          mkdirSync(at, 0o700);
          stack.push({ fd: openDirAt(dirFd, name), name, entry: e });
        } else if (e.type === 'file') {
          const fd = openSync(at, CREATE, 0o600);
          try {
            for (const part of e.chunks ?? [{ sha256: e.sha256!, size: e.size }]) {
              const ahead = prefetch ? await prefetch.take(partIndex) : null;
              partIndex++;
              await copyObject(store, part.sha256, part.size, fd, where, ahead);
              bytesCopied += part.size;
              progress();
            }
            if (sameOwner) fchownSync(fd, e.uid, e.gid);
            fchmodSync(fd, modeFor(e, e, showEntryPath(e)));
            setTimes(fd, null, e.mtime_ns);
          } finally {
            closeSync(fd);
          }
          files++;
          bytes += e.size;
        } else if (e.type === 'symlink') {
          symlinkSync(entryTargetBytes(e), at);
          if (sameOwner) lchownSync(at, e.uid, e.gid);
          setTimes(dirFd, name, e.mtime_ns);
        } else {
          // Made with its final mode (umask 0 meanwhile): nothing is done to it by name but
          // lchown, which never follows a link (and DIR is the restorer's alone meanwhile).
          const mode = modeFor(e, e, showEntryPath(e));
          const umask = process.umask(0);
          try {
            native().mknodAt(dirFd, name, TYPE_BITS[e.type] | (mode & 0o7777), e.rdev ?? 0);
          } finally {
            process.umask(umask);
          }
          if (sameOwner) lchownSync(at, e.uid, e.gid);
          setTimes(dirFd, name, e.mtime_ns);
        }
      } catch (err) {
        if (err instanceof RestoreError) throw err;
        if (errnoCode(err) === 'EEXIST')
          throw new RestoreError(
            'target',
            `${target}: ${where} appeared while restoring (planted?): never written through or replaced; the restore stops here`,
          );
        throw new RestoreError('io', `${target}: restoring ${where} failed: ${(err as Error).message}`);
      }
    }
    while (stack.length) finishDir(stack.pop()!);
    // DIR itself last: its mode, owner and mtime as the workspace had them.
    const r = manifest.root;
    if (r) {
      if (sameOwner) fchownSync(rootFd, r.uid, r.gid);
      fchmodSync(rootFd, modeFor(r, 'root', '.'));
      setTimes(rootFd, null, r.mtime_ns);
    }
  } catch (err) {
    if (err instanceof RestoreError) throw err;
    throw new RestoreError('io', `${target}: ${(err as Error).message}`);
  } finally {
    for (const d of stack) closeSync(d.fd);
    closeSync(rootFd);
  }
  const differences = compareTree(manifest, target, { compareOwners: sameOwner, setidDropped: dropped });
  return {
    checkpoint_id: id,
    target,
    entries: manifest.entries.length,
    files,
    bytes,
    owners: sameOwner ? 'same' : 'not_given',
    setid_dropped: setidDropped,
    consistent: manifest.consistent,
    unstable: manifest.unstable,
    not_captured: notCaptured(manifest),
    mounts_skipped: mountsSkipped(manifest),
    identical: differences.length === 0,
    differences,
    ms: Math.round(performance.now() - t0),
  };
}

/** Copies one object into fd (from `ahead` when it was fetched ahead), hashing what it reads: a digest or size that differs stops the restore naming the object. */
async function copyObject(store: CheckpointStore, sha256: string, size: number, fd: number, where: string, ahead: Buffer | Error | null): Promise<void> {
  const hash = createHash('sha256');
  let n = 0;
  try {
    if (ahead instanceof Error) throw ahead;
    if (ahead) {
      hash.update(ahead);
      writeAll(fd, ahead);
      n = ahead.length;
    } else {
      for await (const chunk of store.readObject(sha256)) {
        hash.update(chunk);
        writeAll(fd, chunk);
        n += chunk.length;
      }
    }
  } catch (err) {
    throw new RestoreError('object', `${where}: object ${sha256}: ${(err as Error).message}`);
  }
  const got = hash.digest('hex');
  if (got !== sha256)
    throw new RestoreError(
      'object',
      `${where}: object ${sha256} in ${store.location} reads as ${got} (${n} bytes): the store's copy is damaged; the restore stops here`,
    );
  if (n !== size) throw new RestoreError('object', `${where}: object ${sha256} holds ${n} bytes, the manifest says ${size}; the restore stops here`);
}

function splitPath(p: Buffer): Buffer[] {
  const out: Buffer[] = [];
  let start = 0;
  for (let i = 0; i <= p.length; i++) {
    if (i === p.length || p[i] === 0x2f) {
      out.push(p.subarray(start, i));
      start = i + 1;
    }
  }
  return out;
}

/** Every entry under root as a manifest would record it, files hashed (blocking; no link followed). */
export function describeTree(root: string): ManifestEntry[] {
  const out: ManifestEntry[] = [];
  const block = Buffer.allocUnsafe(1 << 20);
  for (const e of walkTree(root)) {
    if (e.type === 'unknown') continue;
    let sha256: string | undefined;
    let size = 0;
    if (e.type === 'file') {
      const fd = openSync(pathAt(e.dirFd, e.name), constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
      try {
        if (!fstatSync(fd).isFile()) continue;
        const h = createHash('sha256');
        for (;;) {
          const r = readSync(fd, block, 0, block.length, size);
          if (r === 0) break;
          h.update(block.subarray(0, r));
          size += r;
        }
        sha256 = h.digest('hex');
      } finally {
        closeSync(fd);
      }
    } else if (e.type === 'symlink') size = e.linkTarget?.length ?? 0;
    out.push(
      toManifestEntry({
        path: e.path,
        type: e.type,
        mode: e.mode & 0o7777,
        uid: e.uid,
        gid: e.gid,
        size,
        mtimeNs: e.mtimeNs,
        sha256,
        target: e.type === 'symlink' ? (e.linkTarget ?? Buffer.alloc(0)) : undefined,
        rdev: e.type === 'char' || e.type === 'block' ? Number(e.rdev) : undefined,
      }),
    );
  }
  return out;
}

/** A difference for people: one line, modes in octal. */
export function showDifference(d: Difference): string {
  if (d.field === 'missing') return `${d.path}: missing`;
  if (d.field === 'extra') return `${d.path}: not in the manifest`;
  const show = (v: unknown) => (d.field === 'mode' && typeof v === 'number' ? `0${v.toString(8)}` : JSON.stringify(v ?? null));
  return `${d.path}: ${d.field} ${show(d.found)}, the manifest says ${show(d.expected)}`;
}

/**
 * How the tree at target differs from the manifest: missing and extra paths, and per path each
 * field (mtime to the ns); uid and gid only with compareOwners; a mode whose set-ID bits the
 * restore dropped (setidDropped) is compared without them. DIR itself is path '.'.
 */
export function compareTree(manifest: Manifest, target: string, options: { compareOwners: boolean; setidDropped: Set<ManifestEntry | 'root'> }): Difference[] {
  const out: Difference[] = [];
  const fields: (keyof ManifestEntry)[] = [
    'type',
    'mode',
    ...(options.compareOwners ? (['uid', 'gid'] as const) : []),
    'size',
    'sha256',
    'target',
    'target_b64',
    'rdev',
    'mtime_ns',
  ];
  const expectedMode = (mode: number, key: ManifestEntry | 'root') => (options.setidDropped.has(key) ? mode & ~SETID : mode);
  if (manifest.root) {
    const st = lstatSync(target, { bigint: true });
    const found = { mode: Number(st.mode) & 0o7777, uid: Number(st.uid), gid: Number(st.gid), mtime_ns: String(st.mtimeNs) };
    const want = { ...manifest.root, mode: expectedMode(manifest.root.mode, 'root') };
    for (const f of ['mode', ...(options.compareOwners ? (['uid', 'gid'] as const) : []), 'mtime_ns'] as const) {
      if (found[f] !== want[f]) out.push({ path: '.', field: f, found: found[f], expected: want[f] });
    }
  }
  const key = (e: ManifestEntry) => entryPathBytes(e).toString('latin1');
  const got = new Map(describeTree(target).map((e) => [key(e), e]));
  for (const e of manifest.entries) {
    const k = key(e);
    const f = got.get(k);
    const where = showEntryPath(e);
    if (!f) {
      out.push({ path: where, field: 'missing', found: null, expected: e.type });
      continue;
    }
    got.delete(k);
    for (const field of fields) {
      if (field === 'sha256' && e.sha256 === undefined) continue; // chunked: each chunk was checked as it was written
      const want = field === 'mode' ? expectedMode(e.mode, e) : e[field];
      if (want !== f[field]) out.push({ path: where, field, found: f[field] ?? null, expected: want ?? null });
    }
  }
  for (const f of got.values()) out.push({ path: showEntryPath(f), field: 'extra', found: f.type, expected: null });
  return out;
}
