// sbx restore: materialise a published checkpoint into an empty (or new) directory, byte for
// byte, then rescan it and compare with the manifest. Reads the store directly, so it works
// with the supervisor stopped. Owns the restore and the tree description it compares; not the
// format (manifest.ts) or the store (store.ts). Every name is created relative to the fd of its
// directory, O_EXCL|O_NOFOLLOW (mkdir, symlink, mknod never follow or replace either), so a
// link planted in the target is never followed: the restore fails naming it instead. Owners
// as recorded when they can be given; when one cannot (not root), set-user-ID and
// set-group-ID are dropped rather than handed to another owner. See open(2), mkdirat(2),
// symlinkat(2), mknodat(2), chown(2) (which clears set-ID bits: so chmod comes after it).
import { createHash } from 'node:crypto';
import {
  closeSync,
  constants,
  fchmodSync,
  fchownSync,
  fstatSync,
  lchownSync,
  mkdirSync,
  openSync,
  readdirSync,
  readSync,
  symlinkSync,
  chmodSync,
} from 'node:fs';
import { native } from '../native.js';
import { entryPath, openDirAt, walkTree } from '../workspace/walk.js';
import { checkManifest, entryPathBytes, entryTargetBytes, showEntryPath, toManifestEntry, type Manifest, type ManifestEntry } from './manifest.js';
import { writeAll } from './local-store.js';
import type { CheckpointStore } from './store.js';

/** Why a restore could not be done (nothing claimed): `code` not_published, bad_manifest, target, object, io. */
export class RestoreError extends Error {
  constructor(readonly code: 'not_published' | 'bad_manifest' | 'target' | 'object' | 'io', message: string) {
    super(message);
    this.name = 'RestoreError';
  }
}

export interface RestoreResult {
  checkpoint_id: string;
  target: string;
  entries: number;
  files: number;
  bytes: number;
  /** Entries whose recorded owner could not be given (chown EPERM: not root). */
  owners_not_given: number;
  /** Paths whose set-user-ID / set-group-ID bits were dropped because their owner could not be given. */
  setid_dropped: string[];
  /** The rescan equals the manifest (type, mode, owner, size, content, target, device, mtime to the ns). */
  identical: boolean;
  /** How it differs, one line per path and field. */
  differences: string[];
  ms: number;
}

const TYPE_BITS: Record<string, number> = { fifo: constants.S_IFIFO, socket: constants.S_IFSOCK, char: constants.S_IFCHR, block: constants.S_IFBLK };
const CREATE = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW;
const OPEN_DIR = constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW;
const SETID = 0o6000;

function code(err: unknown): string | undefined {
  return (err as NodeJS.ErrnoException).code;
}

/** Sets the atime and mtime of name in dirFd (null: dirFd itself) to the recorded ns, exactly, never through a link. */
function setTimes(dirFd: number, name: Buffer | null, ns: string): void {
  const t = BigInt(ns);
  native().setTimesAt(dirFd, name, Number(t / 1_000_000_000n), Number(t % 1_000_000_000n));
}

/** Opens (or makes) the target: a directory, not a link, empty. RestoreError target otherwise. */
function openTarget(target: string): number {
  try {
    mkdirSync(target, 0o700);
  } catch (err) {
    if (code(err) !== 'EEXIST') throw new RestoreError('target', `cannot make ${target}: ${(err as Error).message}`);
  }
  let fd: number;
  try {
    fd = openSync(target, OPEN_DIR);
  } catch (err) {
    if (code(err) === 'ELOOP' || code(err) === 'ENOTDIR') throw new RestoreError('target', `${target} is not a directory (a symlink is never followed): restore into an empty or new directory`);
    throw new RestoreError('target', `cannot open ${target}: ${(err as Error).message}`);
  }
  const names = readdirSync(`/proc/self/fd/${fd}`);
  if (names.length) {
    closeSync(fd);
    throw new RestoreError('target', `${target} is not empty (${names.length} entries, e.g. ${JSON.stringify(names[0])}): restore into an empty or new directory`);
  }
  return fd;
}

/**
 * Reads the published checkpoint id from store and checks it: published (its record is
 * there), the manifest's bytes hash to id and are canonical, its digest and counts hold, and
 * with publicKeyPem its signature. RestoreError not_published / bad_manifest.
 */
export async function loadCheckpoint(store: CheckpointStore, id: string, publicKeyPem?: string): Promise<Manifest> {
  const published = await store.readPublished(id);
  if (!published) throw new RestoreError('not_published', `checkpoint ${id} was never published in ${store.location} (its read-back did not complete, or no such checkpoint): it claims nothing`);
  let bytes: Buffer;
  try {
    bytes = await store.readManifest(id);
  } catch (err) {
    throw new RestoreError('bad_manifest', `checkpoint ${id}: ${(err as Error).message}`);
  }
  const { manifest, problems } = checkManifest(bytes, { expectId: id, publicKeyPem });
  if (!manifest || problems.length) throw new RestoreError('bad_manifest', `checkpoint ${id}: ${problems.join('; ')}`);
  return manifest;
}

/** Materialises the checkpoint id (published; see loadCheckpoint) into target, then rescans and compares. Throws RestoreError. */
export async function restoreCheckpoint(store: CheckpointStore, id: string, target: string, options: { publicKeyPem?: string } = {}): Promise<RestoreResult> {
  const t0 = performance.now();
  const manifest = await loadCheckpoint(store, id, options.publicKeyPem);
  const rootFd = openTarget(target);
  const root = process.getuid?.() === 0;
  const stack: { fd: number; name: Buffer; entry: ManifestEntry }[] = [];
  let ownersNotGiven = 0;
  const setidDropped: string[] = [];
  let files = 0;
  let bytes = 0;

  /** chown as recorded (via fn); false when it cannot be given (EPERM), so set-ID bits go. */
  const giveOwner = (e: ManifestEntry, fn: () => void): boolean => {
    try {
      fn();
      return true;
    } catch (err) {
      if (code(err) !== 'EPERM' && code(err) !== 'EINVAL') throw err;
      ownersNotGiven++;
      return false;
    }
  };
  const modeFor = (e: ManifestEntry, owned: boolean): number => {
    if (owned || (e.mode & SETID) === 0) return e.mode;
    setidDropped.push(showEntryPath(e));
    return e.mode & ~SETID;
  };
  const finishDir = (d: { fd: number; entry: ManifestEntry }) => {
    try {
      const owned = giveOwner(d.entry, () => fchownSync(d.fd, d.entry.uid, d.entry.gid));
      fchmodSync(d.fd, modeFor(d.entry, owned));
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
        if (!stack[i] || !stack[i].name.equals(comps[i])) throw new RestoreError('bad_manifest', `checkpoint ${id}: entry ${JSON.stringify(showEntryPath(e))} comes before (or without) its directory`);
      }
      const dirFd = stack.length ? stack[stack.length - 1].fd : rootFd;
      const at = entryPath(dirFd, name);
      const where = JSON.stringify(showEntryPath(e));
      try {
        if (e.type === 'dir') {
          mkdirSync(at, 0o700);
          stack.push({ fd: openDirAt(dirFd, name), name, entry: e });
        } else if (e.type === 'file') {
          const fd = openSync(at, CREATE, 0o600);
          try {
            const parts = e.chunks ?? [{ sha256: e.sha256!, size: e.size }];
            for (const part of parts) await copyObject(store, part.sha256, part.size, fd, where);
            const owned = giveOwner(e, () => fchownSync(fd, e.uid, e.gid));
            fchmodSync(fd, modeFor(e, owned));
            setTimes(fd, null, e.mtime_ns);
          } finally {
            closeSync(fd);
          }
          files++;
          bytes += e.size;
        } else if (e.type === 'symlink') {
          symlinkSync(entryTargetBytes(e), at);
          giveOwner(e, () => lchownSync(at, e.uid, e.gid));
          setTimes(dirFd, name, e.mtime_ns);
        } else {
          native().mknodAt(dirFd, name, TYPE_BITS[e.type] | (e.mode & 0o777), e.rdev ?? 0);
          // Not a link (just made, O_EXCL-like: mknod never replaces), so chown/chmod by name act on it.
          const owned = giveOwner(e, () => lchownSync(at, e.uid, e.gid));
          chmodSync(at, modeFor(e, owned));
          setTimes(dirFd, name, e.mtime_ns);
        }
      } catch (err) {
        if (err instanceof RestoreError) throw err;
        if (code(err) === 'EEXIST') throw new RestoreError('target', `${target}: ${where} appeared while restoring (planted?): never written through or replaced; the restore stops here`);
        throw new RestoreError('io', `${target}: restoring ${where} failed: ${(err as Error).message}`);
      }
    }
    while (stack.length) finishDir(stack.pop()!);
  } finally {
    for (const d of stack) closeSync(d.fd);
    closeSync(rootFd);
  }
  const differences = compareTree(manifest.entries, describeTree(target));
  return {
    checkpoint_id: id,
    target,
    entries: manifest.entries.length,
    files,
    bytes,
    owners_not_given: ownersNotGiven,
    setid_dropped: setidDropped,
    identical: differences.length === 0,
    differences,
    ms: Math.round(performance.now() - t0),
  };
}

/** Copies one object into fd, hashing what it reads: a digest or size that differs stops the restore naming the object. */
async function copyObject(store: CheckpointStore, sha256: string, size: number, fd: number, where: string): Promise<void> {
  const hash = createHash('sha256');
  let n = 0;
  try {
    for await (const chunk of store.readObject(sha256)) {
      hash.update(chunk);
      writeAll(fd, chunk);
      n += chunk.length;
    }
  } catch (err) {
    throw new RestoreError('object', `${where}: object ${sha256}: ${(err as Error).message}`);
  }
  const got = hash.digest('hex');
  if (got !== sha256 || n !== size) throw new RestoreError('object', `${where}: object ${sha256} in ${store.location} reads as ${got} (${n} bytes, ${size} expected): the store's copy is damaged; the restore stops here`);
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
      const fd = openSync(entryPath(e.dirFd, e.name), constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
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

/** How found differs from expected: missing or extra paths, and per path each field (mtime to the ns). */
export function compareTree(expected: ManifestEntry[], found: ManifestEntry[]): string[] {
  const key = (e: ManifestEntry) => entryPathBytes(e).toString('latin1');
  const got = new Map(found.map((e) => [key(e), e]));
  const out: string[] = [];
  for (const e of expected) {
    const k = key(e);
    const f = got.get(k);
    const where = showEntryPath(e);
    if (!f) {
      out.push(`${where}: missing`);
      continue;
    }
    got.delete(k);
    for (const field of ['type', 'mode', 'uid', 'gid', 'size', 'sha256', 'target', 'target_b64', 'rdev'] as const) {
      if (field === 'sha256' && e.sha256 === undefined) continue; // chunked: each chunk was checked as it was written
      if (e[field] !== f[field]) out.push(`${where}: ${field} ${JSON.stringify(f[field] ?? null)}, the manifest says ${JSON.stringify(e[field] ?? null)}`);
    }
    if (f.mtime_ns !== e.mtime_ns) out.push(`${where}: mtime_ns ${f.mtime_ns}, the manifest says ${e.mtime_ns}`);
  }
  for (const f of got.values()) out.push(`${showEntryPath(f)}: not in the manifest`);
  return out;
}
