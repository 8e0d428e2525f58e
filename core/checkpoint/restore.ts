// sbx restore: materialise a published checkpoint into an empty (or new) directory, byte for byte, then
// rescan it and compare with the manifest. Reads the store directly, so it works with the supervisor stopped.
// Owns the restore and the tree description it compares; not the format (manifest.ts) or the store
// (store.ts). See open(2), mkdirat(2), symlinkat(2), mknodat(2), utimensat(2), chown(2), tar(1) --same-owner.
import { createHash } from 'node:crypto';
import {
  closeSync,
  constants,
  existsSync,
  fchmodSync,
  fchownSync,
  fstatSync,
  lchownSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  readSync,
  realpathSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { native } from '../fs/native.js';
import { pathAt, openDirAt, walkTree } from '../fs/walk.js';
import { writeAll } from '../fs/durable.js';
import { showPath } from '../fs/names.js';
import {
  checkManifestHead,
  checkPublished,
  comparePaths,
  entriesBound,
  EntriesCheck,
  EntriesSummary,
  entryPathBytes,
  entryTargetBytes,
  showEntryPath,
  toManifestEntry,
  type Manifest,
  type ManifestEntry,
} from './manifest.js';
import { treeReader, type CheckpointStore } from './store.js';
import { TREE_CACHE_BYTES, TreeCache, walkTreeSteps, type WalkStep } from './tree.js';
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
/** Entries read ahead of the one restored, at most, to find the next PREFETCH_OBJECTS objects to fetch. */
const LOOKAHEAD_ENTRIES = 256;

/** Sets the atime and mtime of name in dirFd (null: dirFd itself) to the recorded ns, exactly, never through a link. */
function setTimes(dirFd: number, name: Buffer | null, ns: string): void {
  const t = BigInt(ns);
  // Floor division: before 1970 with a fraction (-0.75 s) is -1 s + 250,000,000 ns (BigInt's / and % round toward zero: a negative nsec, EINVAL).
  let sec = t / 1_000_000_000n;
  let nsec = t % 1_000_000_000n;
  if (nsec < 0n) {
    nsec += 1_000_000_000n;
    sec -= 1n;
  }
  native().setTimesAt(dirFd, name, Number(sec), Number(nsec));
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

/** A published checkpoint as restore reads it: its head (a version 2 manifest's `entries` stay empty: they are walked from its trees, never held) and what one walk of its entries found. */
export interface LoadedCheckpoint {
  manifest: Manifest;
  /** Its entries, and its files' objects (chunks counted each) and their bytes, for progress. */
  entries: number;
  parts: number;
  partBytes: number;
  notCaptured: string[];
  mountsSkipped: string[];
}

/**
 * The entries of a checked manifest in its order: version 1's as it holds them, version 2's
 * walked from its trees (tree.ts walkTreeSteps, TREE_CACHE_BYTES of them kept), each tree read
 * and checked again at every walk. RestoreError bad_manifest: a tree missing, unreadable or not
 * holding, or more entries than the manifest says.
 */
async function* entriesOf(
  store: CheckpointStore,
  id: string,
  m: Manifest,
  readTree: (id: string) => Promise<Buffer | null>,
): AsyncGenerator<ManifestEntry, void, undefined> {
  if (m.version !== 2) {
    yield* m.entries;
    return;
  }
  const steps = walkTreeSteps(m.tree!, readTree, entriesBound(m), new TreeCache(TREE_CACHE_BYTES));
  for (;;) {
    let s: IteratorResult<WalkStep, string | null>;
    try {
      s = await steps.next();
    } catch (err) {
      // A system error (EMFILE in a deep tree, say) is the restore's, not the manifest's.
      const code = /^E[A-Z0-9]+$/.test(errnoCode(err) ?? '') ? 'io' : 'bad_manifest';
      throw new RestoreError(code, `checkpoint ${id}: its trees cannot be read from ${store.location}: ${(err as Error).message}`);
    }
    if (s.done) {
      if (s.value !== null) throw new RestoreError('bad_manifest', `checkpoint ${id}: ${s.value}`);
      return;
    }
    if ('entry' in s.value) yield s.value.entry;
  }
}

/** A file entry's objects: its chunks, or its one object. */
function fileParts(e: ManifestEntry): { sha256: string; size: number }[] {
  return e.chunks ?? [{ sha256: e.sha256!, size: e.size }];
}

/**
 * Reads the published checkpoint id from store and checks it: published (its record is
 * there), the manifest's bytes hash to id and are canonical, its digest and counts hold, and
 * with publicKeyPem its signature; then its entries, walked once (order, paths, fields, count),
 * none kept. RestoreError not_published / no_such_checkpoint / bad_manifest.
 */
export async function loadCheckpoint(
  store: CheckpointStore,
  id: string,
  publicKeyPem?: string,
  readTree: (id: string) => Promise<Buffer | null> = treeReader(store),
): Promise<LoadedCheckpoint> {
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
  const head = checkManifestHead(bytes, { expectId: id, publicKeyPem });
  const manifest = head.manifest;
  const problems = [...head.problems];
  if (manifest && manifest.version === 2 && publicKeyPem !== undefined && !head.signed) problems.push('its trees were not read: its signature does not verify');
  if (!manifest || problems.length) throw new RestoreError('bad_manifest', `checkpoint ${id}: ${problems.join('; ')}`);
  // Version 1's entries were checked with its head.
  const check = manifest.version === 2 ? new EntriesCheck() : null;
  const summary = new EntriesSummary(manifest.unstable ?? []);
  const loaded: LoadedCheckpoint = { manifest, entries: 0, parts: 0, partBytes: 0, notCaptured: [], mountsSkipped: [] };
  for await (const e of entriesOf(store, id, manifest, readTree)) {
    check?.add(e);
    summary.add(e);
    loaded.entries++;
    if (e.type !== 'file') continue;
    for (const part of fileParts(e)) {
      loaded.parts++;
      loaded.partBytes += part.size;
    }
  }
  if (check) {
    for (const p of check.problems) problems.push(p);
    if (manifest.scan?.entries !== check.count) problems.push(`the manifest says ${manifest.scan?.entries} entries and its trees hold ${check.count}`);
    if (problems.length) throw new RestoreError('bad_manifest', `checkpoint ${id}: ${problems.join('; ')}`);
  }
  loaded.notCaptured = summary.notCaptured;
  loaded.mountsSkipped = summary.mountsSkipped;
  return loaded;
}

/** The temp directories of the restores running in this process (TreeSpool). */
const liveSpools = new Set<TreeSpool>();

/** Removes the temp directories of the restores running in this process, synchronously: for a CLI ended by a signal (sbx restore), whose `finally` never runs. */
export function removeRestoreTemp(): void {
  for (const spool of liveSpools) spool.close();
}

/**
 * A remote store's tree objects as a restore reads them (three walks): each kept in a temp
 * directory (mkdtemp in $TMPDIR, 0700, made at the first tree) the first time, so that the
 * later walks read it from local disk, not the network; every read is checked against its id
 * again (tree.ts checkTree), so a copy changed meanwhile fails the walk. Without a usable
 * $TMPDIR (missing, full, or the restore's own DIR, which must stay empty) each walk reads
 * the store. close() removes it.
 */
class TreeSpool {
  private dir: string | null = null;
  private off = false;

  constructor(
    private readonly remote: (id: string) => Promise<Buffer | null>,
    private readonly target: string,
  ) {
    liveSpools.add(this);
  }

  /** The directory, made at the first call; null when there is none to be had. */
  private where(): string | null {
    if (this.dir !== null || this.off) return this.dir;
    try {
      const parent = tmpdir();
      if (existsSync(this.target) && realpathSync(parent) === realpathSync(this.target)) this.off = true;
      else this.dir = mkdtempSync(join(parent, 'sbx-restore-trees-'));
    } catch {
      this.off = true;
    }
    return this.dir;
  }

  readonly read = async (id: string): Promise<Buffer | null> => {
    const name = id.replace(/[^0-9a-f]/g, '_');
    if (this.dir !== null) {
      try {
        return readFileSync(join(this.dir, name));
      } catch (err) {
        if (errnoCode(err) !== 'ENOENT') throw err;
      }
    }
    const bytes = await this.remote(id);
    const dir = bytes ? this.where() : null;
    if (bytes && dir !== null) {
      const path = join(dir, name);
      try {
        writeFileSync(path, bytes, { flag: 'wx', mode: 0o600 });
      } catch {
        rmSync(path, { force: true }); // not kept (a full $TMPDIR, say): read from the store again next time
      }
    }
    return bytes;
  };

  close(): void {
    liveSpools.delete(this);
    this.off = true;
    if (this.dir !== null) rmSync(this.dir, { recursive: true, force: true });
    this.dir = null;
  }
}

/**
 * A remote store's small objects fetched a few ahead of the restore: the next PREFETCH_OBJECTS
 * parts of the entries read ahead (add), each of at most PREFETCH_MAX_BYTES; a larger one is
 * streamed when its turn comes.
 */
class Prefetch {
  private readonly ahead = new Map<string, Promise<Buffer | Error>>();
  /** The parts of the entries read ahead, in order, not taken yet. */
  private readonly upcoming: { sha256: string; size: number }[] = [];

  constructor(private readonly store: CheckpointStore) {}

  get waiting(): number {
    return this.upcoming.length;
  }

  /** The parts of an entry read ahead of the one restored. */
  add(parts: { sha256: string; size: number }[]): void {
    for (const p of parts) this.upcoming.push(p);
    this.topUp();
  }

  /** The bytes of the next part (the first added and not taken), when fetched ahead; else null: stream it. */
  take(): Promise<Buffer | Error> | null {
    const part = this.upcoming.shift()!;
    const got = this.ahead.get(part.sha256) ?? null;
    this.ahead.delete(part.sha256);
    this.topUp();
    return got;
  }

  private topUp(): void {
    for (let i = 0; i < this.upcoming.length && i < PREFETCH_OBJECTS; i++) {
      const p = this.upcoming[i];
      if (p.size <= PREFETCH_MAX_BYTES && !this.ahead.has(p.sha256)) this.ahead.set(p.sha256, this.fetch(p.sha256));
    }
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

/** The entries of a loaded checkpoint one at a time, those read ahead of it handed to prefetch (remote: PREFETCH_OBJECTS parts ahead, at most LOOKAHEAD_ENTRIES entries). */
class EntryQueue {
  private readonly queue: ManifestEntry[] = [];
  private readonly it: AsyncIterator<ManifestEntry, void, undefined>;
  private done = false;

  constructor(
    entries: AsyncGenerator<ManifestEntry, void, undefined>,
    private readonly prefetch: Prefetch | null,
  ) {
    this.it = entries[Symbol.asyncIterator]();
  }

  /** The next entry, or null after the last. */
  async next(): Promise<ManifestEntry | null> {
    const p = this.prefetch;
    while (!this.done && (this.queue.length === 0 || (p && p.waiting < PREFETCH_OBJECTS && this.queue.length < LOOKAHEAD_ENTRIES))) {
      const r = await this.it.next();
      if (r.done) {
        this.done = true;
        break;
      }
      this.queue.push(r.value);
      if (p && r.value.type === 'file') p.add(fileParts(r.value));
    }
    return this.queue.shift() ?? null;
  }
}

/** restoreCheckpoint's options. */
export interface RestoreOptions {
  /** The key the manifest's and its published record's signatures must verify under. */
  publicKeyPem?: string;
  /** Every entry gets its recorded owner (default: when root). */
  sameOwner?: boolean;
  /** A remote store (S3): its small objects fetched a few ahead, its trees kept in a temp dir for the later walks. */
  remote?: boolean;
  /** Objects (file parts) and bytes copied so far, of the totals. */
  onProgress?: (p: { objects: number; totalObjects: number; bytes: number; totalBytes: number }) => void;
}

/**
 * Materialises the checkpoint id (published; see loadCheckpoint) into target, then rescans and
 * compares. sameOwner (default: when root) gives every entry its recorded owner. remote: fetch
 * small objects a few ahead (an S3 store answers each in tens of ms). Throws RestoreError.
 * A version 2 manifest's trees are walked three times (checked and counted, restored, compared
 * beside a walk of target), its entries never held: memory grows with the depth and the widest
 * directory (and the differences found), not with the entries.
 * Every name is created relative to the fd of its directory, O_EXCL|O_NOFOLLOW (mkdir, symlink,
 * mknod never follow or replace either), so a link planted in the target is never followed: the
 * restore fails naming it instead. Owners as recorded when the restorer can give them (root, as
 * tar's --same-owner); otherwise the restorer's, and then set-user-ID and set-group-ID are dropped
 * rather than handed to another owner. chown(2) clears set-ID bits: so chmod comes after it.
 */
export async function restoreCheckpoint(store: CheckpointStore, id: string, target: string, options: RestoreOptions = {}): Promise<RestoreResult> {
  const t0 = performance.now();
  const spool = options.remote ? new TreeSpool(treeReader(store), target) : null;
  try {
    return await restoreWith(store, id, target, options, spool?.read ?? treeReader(store), t0);
  } finally {
    spool?.close();
  }
}

/** restoreCheckpoint with its trees read through readTree (three walks: checked, restored, compared). */
async function restoreWith(
  store: CheckpointStore,
  id: string,
  target: string,
  options: RestoreOptions,
  readTree: (id: string) => Promise<Buffer | null>,
  t0: number,
): Promise<RestoreResult> {
  const loaded = await loadCheckpoint(store, id, options.publicKeyPem, readTree);
  const { manifest } = loaded;
  const sameOwner = options.sameOwner ?? process.getuid?.() === 0;
  const myUid = process.getuid?.() ?? -1;
  const myGid = process.getgid?.() ?? -1;
  const rootFd = openTarget(target);
  const stack: { fd: number; name: Buffer; entry: ManifestEntry }[] = [];
  const setidDropped: string[] = [];
  // The entries whose set-ID bits were dropped, by path (entryKey), and '.' for DIR itself (never an entry's path).
  const dropped = new Set<string>();
  let files = 0;
  let bytes = 0;
  const prefetch = options.remote ? new Prefetch(store) : null;
  // Objects (file parts) copied so far, for a progress line (sbx restore on a terminal).
  let partsCopied = 0;
  let bytesCopied = 0;
  const progress = () => options.onProgress?.({ objects: partsCopied, totalObjects: loaded.parts, bytes: bytesCopied, totalBytes: loaded.partBytes });
  progress();

  /** The mode an entry gets: as recorded, without set-ID bits when its recorded owner is not given. */
  const modeFor = (e: { mode: number; uid: number; gid: number }, key: string, where: string): number => {
    const given = sameOwner || (e.uid === myUid && e.gid === myGid);
    if (given || (e.mode & SETID) === 0) return e.mode;
    setidDropped.push(where);
    dropped.add(key);
    return e.mode & ~SETID;
  };
  const finishDir = (d: { fd: number; entry: ManifestEntry }) => {
    try {
      if (sameOwner) fchownSync(d.fd, d.entry.uid, d.entry.gid);
      fchmodSync(d.fd, modeFor(d.entry, entryKey(d.entry), showEntryPath(d.entry)));
      setTimes(d.fd, null, d.entry.mtime_ns);
    } finally {
      closeSync(d.fd);
    }
  };

  try {
    const queue = new EntryQueue(entriesOf(store, id, manifest, readTree), prefetch);
    for (let e = await queue.next(); e !== null; e = await queue.next()) {
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
            for (const part of fileParts(e)) {
              const ahead = prefetch ? await prefetch.take() : null;
              partsCopied++;
              await copyObject(store, part.sha256, part.size, fd, where, ahead);
              bytesCopied += part.size;
              progress();
            }
            if (sameOwner) fchownSync(fd, e.uid, e.gid);
            fchmodSync(fd, modeFor(e, entryKey(e), showEntryPath(e)));
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
          const mode = modeFor(e, entryKey(e), showEntryPath(e));
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
      fchmodSync(rootFd, modeFor(r, '.', '.'));
      setTimes(rootFd, null, r.mtime_ns);
    }
  } catch (err) {
    if (err instanceof RestoreError) throw err;
    throw new RestoreError('io', `${target}: ${(err as Error).message}`);
  } finally {
    for (const d of stack) closeSync(d.fd);
    closeSync(rootFd);
  }
  const differences = await compareTree(entriesOf(store, id, manifest, readTree), manifest.root, target, { compareOwners: sameOwner, setidDropped: dropped });
  return {
    checkpoint_id: id,
    target,
    entries: loaded.entries,
    files,
    bytes,
    owners: sameOwner ? 'same' : 'not_given',
    setid_dropped: setidDropped,
    consistent: manifest.consistent,
    unstable: manifest.unstable,
    not_captured: loaded.notCaptured,
    mounts_skipped: loaded.mountsSkipped,
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

/** Every entry under root as a manifest would record it, one at a time, in the manifest's order (manifest.ts comparePaths), files hashed (blocking; no link followed). */
export function* describeEntries(root: string): Generator<ManifestEntry, void, undefined> {
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
    yield toManifestEntry({
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
    });
  }
}

/** An entry's path as a Set or Map key (its bytes as latin1: one char per byte). */
function entryKey(e: ManifestEntry): string {
  return entryPathBytes(e).toString('latin1');
}

/** A difference for people: one line, modes in octal. */
export function showDifference(d: Difference): string {
  if (d.field === 'missing') return `${d.path}: missing`;
  if (d.field === 'extra') return `${d.path}: not in the manifest`;
  const show = (v: unknown) => (d.field === 'mode' && typeof v === 'number' ? `0${v.toString(8)}` : JSON.stringify(v ?? null));
  return `${d.path}: ${d.field} ${show(d.found)}, the manifest says ${show(d.expected)}`;
}

/**
 * How the tree at target differs from the manifest's entries (in its order) and root: missing
 * and extra paths, and per path each field (mtime to the ns); uid and gid only with
 * compareOwners; a mode whose set-ID bits the restore dropped (setidDropped, by entryKey; '.'
 * for DIR itself) is compared without them. DIR itself is path '.' (root null: not compared). The target is walked beside
 * the entries (describeEntries: the same order), so neither is held: the differences (extra
 * paths last) are.
 */
export async function compareTree(
  entries: AsyncIterable<ManifestEntry> | Iterable<ManifestEntry>,
  root: Manifest['root'] | null,
  target: string,
  options: { compareOwners: boolean; setidDropped: Set<string> },
): Promise<Difference[]> {
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
  const expectedMode = (mode: number, key: string) => (options.setidDropped.has(key) ? mode & ~SETID : mode);
  if (root) {
    const st = lstatSync(target, { bigint: true });
    const found = { mode: Number(st.mode) & 0o7777, uid: Number(st.uid), gid: Number(st.gid), mtime_ns: String(st.mtimeNs) };
    const want = { ...root, mode: expectedMode(root.mode, '.') };
    for (const f of ['mode', ...(options.compareOwners ? (['uid', 'gid'] as const) : []), 'mtime_ns'] as const) {
      if (found[f] !== want[f]) out.push({ path: '.', field: f, found: found[f], expected: want[f] });
    }
  }
  const extra: Difference[] = [];
  const isExtra = (d: ManifestEntry) => extra.push({ path: showEntryPath(d), field: 'extra', found: d.type, expected: null });
  const onDisk = (function* () {
    for (const d of describeEntries(target)) yield { d, path: entryPathBytes(d) };
  })();
  // The target's next entry and its path's bytes.
  let f = onDisk.next().value ?? null;
  for await (const e of entries) {
    const p = entryPathBytes(e);
    // What the target has before e (in the order both are walked in) is not in the manifest.
    for (; f !== null && comparePaths(f.path, p) < 0; f = onDisk.next().value ?? null) isExtra(f.d);
    const where = showEntryPath(e);
    if (f === null || comparePaths(f.path, p) !== 0) {
      out.push({ path: where, field: 'missing', found: null, expected: e.type });
      continue;
    }
    for (const field of fields) {
      if (field === 'sha256' && e.sha256 === undefined) continue; // chunked: each chunk was checked as it was written
      const want = field === 'mode' ? expectedMode(e.mode, entryKey(e)) : e[field];
      if (want !== f.d[field]) out.push({ path: where, field, found: f.d[field] ?? null, expected: want ?? null });
    }
    f = onDisk.next().value ?? null;
  }
  for (; f !== null; f = onDisk.next().value ?? null) isExtra(f.d);
  return [...out, ...extra];
}
