// The local checkpoint store (docs/reference/state-dir.md): objects/<aa>/<sha256>, manifests/, published/, tmp/.
// Owns its files and their create-once writes: a temp O_EXCL|O_NOFOLLOW in tmp/, fsync or syncfs, then
// renameat2 RENAME_NOREPLACE or link(2) into place (EEXIST: there already, never replaced), directory fsync;
// everything through directory fds opened O_NOFOLLOW (a planted link is refused, never followed). Synchronous
// primitives (LocalStoreFiles: the checkpoint thread, sbx restore) and the async CheckpointStore. See open(2), rename(2).
import { randomBytes } from 'node:crypto';
import {
  readFileSync,
  closeSync,
  constants,
  fstatSync,
  fsyncSync,
  ftruncateSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readSync,
  renameSync,
  rmSync,
  statfsSync,
  unlinkSync,
  writeSync,
  type BigIntStats,
} from 'node:fs';
import { join } from 'node:path';
import { type NoReplace, placeNoReplaceAt, writeAll, writeTempAt, writeTempBytesAt } from '../fs/durable.js';
import { native, timeNsAt } from '../fs/native.js';
import { hashWholeAt, isRegular } from '../fs/file-at.js';
import { pathAt, openDirAt, SD, statDirRaw, type StatFacts } from '../fs/walk.js';
import { type CheckpointStore, isSha256Hex, StoreError, type WrittenVersion } from './store.js';
import { STORE_DIRS } from '../state/names.js';
import { errnoCode } from '../../ipc/errno.js';
import { racyMarginNs } from '../fs/granule.js';
import { MAX_TREE_BYTES } from './tree.js';
import { ObjectNames } from './object-names.js';

const OPEN_DIR = constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW;
const OPEN_READ = constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK;
/** OPEN_READ's flags beyond what readWholeAt always sets. */
const READ_EXTRA = constants.O_NONBLOCK;
/** In the store's root while a workspace's file system is frozen: its path. */
const FROZEN_FILE = 'frozen';
/** Objects committed at most with an fsync each (and of each fan directory named in), not a syncfs of the file system (commitObjects). */
const FSYNC_EACH_MAX = 128;
/** Object fan directories kept open at once (256 exist): the capture must not eat the fd limit (callers go through objects in fan order). */
const MAX_FAN_FDS = 16;
/** How long needRoom trusts a statfs (less what it counted since), while more than ROOM_SLACK_BYTES above the reserve. */
const ROOM_REFRESH_MS = 50;
const ROOM_SLACK_BYTES = 64 << 20;

/** A temp file's name in tmp/ (100,000 may wait for commitObjects: its path is made when needed, tempPath). */
type TempFile = Buffer;

/** Objects, manifests and records are read-only once written. */
export const STORED_MODE = 0o444;

/** The relative name of an object in the store. */
export function objectKey(sha256: string): string {
  return `${STORE_DIRS.objects}/${sha256.slice(0, 2)}/${sha256}`;
}

/** Opens (making it, when create) the directory name in dirFd, never through a link; StoreError refused for a link or another type. */
function dirAt(dirFd: number, name: string, create: boolean, what: string): number {
  const b = Buffer.from(name);
  try {
    return openDirAt(dirFd, b);
  } catch (err) {
    if (errnoCode(err) === 'ENOENT' && create) {
      try {
        mkdirSync(pathAt(dirFd, b), 0o700);
      } catch (e) {
        if (errnoCode(e) !== 'EEXIST') throw e;
      }
      return dirAt(dirFd, name, false, what);
    }
    if (errnoCode(err) === 'ENOTDIR' || errnoCode(err) === 'ELOOP')
      throw new StoreError('refused', `${what}: not a directory (a link or another file is there; the store never follows one)`, name);
    if (errnoCode(err) === 'ENOENT') throw new StoreError('missing', `${what}: no such directory`, name);
    throw err;
  }
}

/**
 * Fds to one local store's directories, for one thread's synchronous use; close() when done.
 * Throws StoreError refused (a link where a directory should be), missing (no store and not
 * create), or the errno Error.
 */
export class LocalStoreFiles {
  private readonly fanFds = new Map<string, number>();
  /** Objects written to temp files but not yet synced and moved into place (commitObjects), by digest. */
  private readonly pending = new Map<string, TempFile>();
  /** Temp names: a random stem per opening of the store, then a count (no random bytes per object). */
  private readonly tempStem = randomBytes(8).toString('hex');
  private tempSeq = 0;
  /** needRoom's last statfs (free bytes, block size, when) and the bytes counted since; refreshed every ROOM_REFRESH_MS, and at every call within ROOM_SLACK_BYTES of the reserve. */
  private room: { freeBytes: number; bsize: number; atMs: number; countedSince: number } | null = null;

  private constructor(
    readonly dir: string,
    readonly rootFd: number,
    readonly objectsFd: number,
    readonly manifestsFd: number,
    readonly publishedFd: number,
    readonly tmpFd: number,
  ) {}

  /** Bytes that storing an object must leave free in the store's file system (createObject*: StoreError io "ENOSPC" past it). */
  reserveBytes = 0;

  /**
   * Opens the store at dir (made when create), or, with viaFd, the very directory that fd (of
   * this process: a checkpoint thread shares the supervisor's fds) holds open, so a store
   * renamed or removed meanwhile is never half written at its old name and half at a new one.
   */
  static open(dir: string, options: { create: boolean; viaFd?: number }): LocalStoreFiles {
    if (options.create && options.viaFd === undefined) mkdirSync(dir, { recursive: true, mode: 0o700 });
    let rootFd: number;
    try {
      // /proc/self/fd/N is a magic link: opened without O_NOFOLLOW (it names an fd, not a path).
      rootFd = options.viaFd !== undefined ? openSync(`/proc/self/fd/${options.viaFd}`, constants.O_RDONLY | constants.O_DIRECTORY) : openSync(dir, OPEN_DIR);
    } catch (err) {
      if (errnoCode(err) === 'ENOENT') throw new StoreError('missing', `no checkpoint store at ${dir}`);
      if (errnoCode(err) === 'ENOTDIR' || errnoCode(err) === 'ELOOP')
        throw new StoreError('refused', `the checkpoint store ${dir} is not a directory (or is a link: never followed)`);
      throw err;
    }
    const fds: number[] = [];
    try {
      for (const name of [STORE_DIRS.objects, STORE_DIRS.manifests, STORE_DIRS.published, STORE_DIRS.tmp])
        fds.push(dirAt(rootFd, name, options.create, `${dir}/${name}`));
    } catch (err) {
      for (const fd of [rootFd, ...fds]) closeSync(fd);
      throw err;
    }
    return new LocalStoreFiles(dir, rootFd, fds[0], fds[1], fds[2], fds[3]);
  }

  close(): void {
    for (const fd of this.fanFds.values()) closeSync(fd);
    this.fanFds.clear();
    if (this.lockFd >= 0) closeSync(this.lockFd);
    this.lockFd = -1;
    for (const fd of [this.rootFd, this.objectsFd, this.manifestsFd, this.publishedFd, this.tmpFd]) closeSync(fd);
  }

  /** The fd of an object fan directory; at most MAX_FAN_FDS kept open (the least recently used closed: the links made in it are made durable by commitObjects' syncfs, or its fsync of each, reopened). */
  private fan(sha256: string, create: boolean): number {
    const name = sha256.slice(0, 2);
    let fd = this.fanFds.get(name);
    if (fd !== undefined) {
      this.fanFds.delete(name); // most recently used last
      this.fanFds.set(name, fd);
      return fd;
    }
    fd = dirAt(this.objectsFd, name, create, `${this.dir}/${STORE_DIRS.objects}/${name}`);
    this.fanFds.set(name, fd);
    if (this.fanFds.size > MAX_FAN_FDS) {
      const [oldName, oldFd] = this.fanFds.entries().next().value as [string, number];
      this.fanFds.delete(oldName);
      closeSync(oldFd);
    }
    return fd;
  }

  /**
   * Takes the store's lock (`lock`, flock(2) exclusive, held while this stays open): one
   * supervisor per store, since one's gc would remove another's objects in flight. StoreError
   * conflict naming the holder's pid when another holds it.
   */
  lock(): void {
    const fd = openSync(pathAt(this.rootFd, Buffer.from('lock')), constants.O_RDWR | constants.O_CREAT | constants.O_NOFOLLOW, 0o600);
    if (!native().tryLockExclusive(fd)) {
      const holder = readFd(fd, 64).toString('utf8').trim();
      closeSync(fd);
      throw new StoreError(
        'conflict',
        `the checkpoint store ${this.dir} is in use by another supervisor (pid ${holder || 'unknown'}); give each supervisor its own checkpoint.store`,
      );
    }
    const pid = Buffer.from(`${process.pid}\n`);
    try {
      writeSync(fd, pid, 0, pid.length, 0);
      ftruncateSync(fd, pid.length);
    } catch {
      // the pid is for people; the flock is what counts
    }
    this.lockFd = fd;
  }

  private lockFd = -1;

  /** Records (durably) that the file system of workspace is being frozen: a start finding it thaws it (supervisor/checkpoint/checkpoint.ts thawLeftFrozen). */
  markFrozen(workspace: string): void {
    const fd = openSync(
      pathAt(this.rootFd, Buffer.from(FROZEN_FILE)),
      constants.O_WRONLY | constants.O_CREAT | constants.O_TRUNC | constants.O_NOFOLLOW,
      0o600,
    );
    try {
      writeAll(fd, Buffer.from(workspace));
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    fsyncSync(this.rootFd);
  }

  clearFrozen(): void {
    this.remove(this.rootFd, FROZEN_FILE);
  }

  /** Whether the store's path still names the directory these fds hold (an operator may have moved or removed it). */
  stillAt(dir: string): boolean {
    try {
      const a = fstatSync(this.rootFd);
      const b = lstatSync(dir);
      return b.isDirectory() && a.ino === b.ino && a.dev === b.dev;
    } catch {
      return false;
    }
  }

  /**
   * StoreError io (ENOSPC, with the numbers) when storing `bytes` more (counted as whole blocks
   * and one more) would leave less than reserveBytes free (statfs(2) of the store: f_bavail x
   * f_bsize). what: what would be stored, for the message ("object <sha>", "<path> (<n> bytes)").
   */
  needRoom(bytes: number, what: string): void {
    if (this.reserveBytes <= 0) return;
    // What storing takes, counted high: whole blocks, and one more (its inode, its name in
    // tmp/): a 100-byte object takes a 4 KiB block, so counting its bytes let 800 of them in
    // 50 ms take 3 MB unseen (a breaker's keep-free retention removed a session's output).
    const bsize = this.room?.bsize ?? 4096;
    const cost = Math.ceil(bytes / bsize) * bsize + bsize;
    // Far from the reserve, one statfs per ROOM_REFRESH_MS less what was counted since (a
    // statfs per object cost 0.7 s of a 100,000-file first checkpoint); within ROOM_SLACK_BYTES
    // of it, a statfs per object, so every refusal, and every object near one, is decided on
    // a fresh statfs.
    const now = performance.now();
    let r = this.room;
    if (r === null || now - r.atMs >= ROOM_REFRESH_MS || r.freeBytes - r.countedSince - cost < this.reserveBytes + ROOM_SLACK_BYTES) {
      const st = statfsSync(`/proc/self/fd/${this.rootFd}`);
      r = this.room = { freeBytes: Number(st.bavail) * Number(st.bsize), bsize: Number(st.bsize) || 4096, atMs: now, countedSince: 0 };
    }
    const free = r.freeBytes - r.countedSince;
    r.countedSince += cost;
    if (free - cost < this.reserveBytes) {
      throw new StoreError(
        'io',
        `ENOSPC: storing ${what} would leave ${Math.max(0, free - cost)} bytes free in the file system of the checkpoint store ${this.dir} (${free} free now), below the ${this.reserveBytes} kept free for sessions' output (storage.keepFreeBytes, storage.minFreeBytes); nothing of this checkpoint was kept`,
      );
    }
  }

  /**
   * True when a regular file is at the object's name: the object, or what only looks like it
   * (a damaged file). Never replaced; the read-back re-hashes it (openObject, O_NOFOLLOW) when
   * it looks at it. False for anything else there (a planted link): the object is written
   * again, its commit finds the name taken (never replaced), and the read-back looks at it.
   */
  hasObject(sha256: string): boolean {
    if (!isSha256Hex(sha256)) throw new StoreError('refused', `not a SHA-256: ${JSON.stringify(sha256)}`);
    return this.hasOwnObject(sha256);
  }

  /**
   * hasObject for a digest this process computed itself (a stat cache entry's, hashed by a
   * capture): its form is not checked again (the check cost ~60 ms of each checkpoint of
   * 100,000 files). Never for a digest read from anywhere else.
   */
  hasOwnObject(sha256: string): boolean {
    if (this.pending.has(sha256)) return true;
    return this.namesIn(sha256).hasDigest(sha256);
  }

  /**
   * Whether every name the fan listings of this store held when removalGen() gave `gen` is
   * still in its fan directory: each of the 256 fans' stat is compared with its listing's, and
   * one that moved (or was not trusted) is listed again, which says whether a name went. 256
   * lstats when nothing moved; the capture then trusts every object a seed it built at `gen`
   * named (passes.ts) instead of a lookup per entry (~100 ms at 100,000).
   */
  namesKeptSince(gen: number): boolean {
    for (let i = 0; i < 256; i++) this.namesIn(FANS[i]!);
    return removalGen(this.dir) === gen;
  }

  /** The store's removal generation (in this thread): moves on whenever a fan directory is listed again and lost a name, or is listed with names and no listing before it to compare. */
  removalGen(): number {
    return removalGen(this.dir);
  }

  /**
   * The names in one object fan directory, listed once per opening of the store (one readdir
   * where a lookup per file cost 4 µs through /proc: measured 15 ms of an unchanged 4,115-file
   * checkpoint); only this supervisor writes objects (the lock), and what it links is added.
   */
  private namesIn(sha256: string): ObjectNames {
    const fan = sha256.slice(0, 2);
    let names = this.listed.get(fan);
    if (!names) {
      names = this.fanNamesCached(fan, sha256);
      this.listed.set(fan, names);
    }
    return names;
  }

  /**
   * A fan directory's names: as listed by an earlier opening of this store (in this process)
   * while the directory's inode, mtime and ctime are still those it had then, longer than
   * their granule before that listing (granule.ts: a name added or removed since moves them);
   * else listed now. An unchanged 100,000-object store's 256 listings cost ~0.3 s a checkpoint.
   */
  private fanNamesCached(fan: string, sha256: string): ObjectNames {
    const key = `${this.dir}\0${fan}`;
    const { sig, newestNs } = this.fanStat(fan);
    const cached = FAN_LISTINGS.get(key);
    if (sig !== null && cached?.sig === sig && cached.trusted) return cached.names;
    const listedAtNs = BigInt(Date.now()) * 1_000_000n;
    let names: ObjectNames;
    let listedIsAtPath = false;
    try {
      // Through the fan directory's own fd (opened O_NOFOLLOW: a link there is refused, never
      // listed). Regular files only (d_type): what else sits at an object's name (a planted
      // link, a directory) is no object, so the capture stores the object again and its commit,
      // finding the name taken, has the read-back look at it (and set it aside).
      const fd = this.fan(sha256, false);
      listedIsAtPath = LocalStoreFiles.isAtPath({ sig, newestNs }, fd);
      names = new ObjectNames(
        readdirSync(`/proc/self/fd/${fd}`, { withFileTypes: true })
          .filter((d) => d.isFile())
          .map((d) => d.name),
      );
    } catch (err) {
      if (!(err instanceof StoreError && err.code === 'missing')) throw err;
      names = new ObjectNames();
    }
    this.recordListing(fan, { sig, newestNs }, listedAtNs, listedIsAtPath, names);
    return names;
  }

  /** A fan directory's stat at its path (sig: dev, ino, mtime, ctime; null when it is not a directory or is gone) and the later of its mtime and ctime. */
  private fanStat(fan: string): FanStat {
    try {
      const st = lstatSync(pathAt(this.objectsFd, Buffer.from(fan)), { bigint: true });
      if (st.isDirectory()) return { sig: `${st.dev}:${st.ino}:${st.mtimeNs}:${st.ctimeNs}`, newestNs: st.ctimeNs > st.mtimeNs ? st.ctimeNs : st.mtimeNs };
    } catch (err) {
      if (errnoCode(err) !== 'ENOENT') throw err;
    }
    return { sig: null, newestNs: 0n };
  }

  /** Whether the fan directory open on fanFd is the one at its path whose stat is `at` (an fd this opening holds may be of one replaced since). */
  private static isAtPath(at: FanStat, fanFd: number): boolean {
    const st = fstatSync(fanFd, { bigint: true });
    return at.sig !== null && at.sig.startsWith(`${st.dev}:${st.ino}:`);
  }

  /**
   * Keeps a fan directory's listing across openings (FAN_LISTINGS): its stat before the listing,
   * whether that stat was old enough to trust, and its regular files' names. A name gone since
   * the listing kept, or names and no listing to compare with: the removal generation moves on.
   */
  private recordListing(fan: string, at: FanStat, listedAtNs: bigint, listedIsAtPath: boolean, names: ObjectNames): void {
    const key = `${this.dir}\0${fan}`;
    const cached = FAN_LISTINGS.get(key);
    let lost = cached === undefined && names.size > 0;
    if (cached) for (const n of cached.names) if (!names.has(n)) lost = true;
    if (lost) REMOVAL_GEN.set(this.dir, removalGen(this.dir) + 1);
    // A fan not there (yet) is kept too, with its names (none; what this opening commits into it
    // is added): a later listing compares with them, where nothing to compare with would count as a loss.
    if (at.sig === null) FAN_LISTINGS.set(key, { sig: null, names, trusted: false });
    else FAN_LISTINGS.set(key, { sig: at.sig, names, trusted: listedIsAtPath && at.newestNs + racyMarginNs(at.newestNs) < listedAtNs });
  }

  private readonly listed = new Map<string, ObjectNames>();

  /**
   * The objects of sha256's fan directory, by name, each with whether it is a regular file,
   * its size and its stat signature (objectSigOf), from one listing with their lstat
   * (walk.ts statDirRaw: getdents and fstatat(AT_SYMLINK_NOFOLLOW) relative to the fan's fd,
   * no open per object). null without the native helper's listing; empty when the fan is missing.
   */
  listObjects(sha256: string): Map<string, ListedObject> | null {
    let fanFd: number;
    try {
      fanFd = this.fan(sha256, false);
    } catch (err) {
      if (err instanceof StoreError && err.code === 'missing') return new Map();
      throw err;
    }
    // The fan's stat first: this listing is also kept as the fan's names (recordListing), as
    // fanNamesCached's would be, so the next capture need not list the fan again.
    const fan = sha256.slice(0, 2);
    const at = this.fanStat(fan);
    const atPath = LocalStoreFiles.isAtPath(at, fanFd);
    const listedAtNs = BigInt(Date.now()) * 1_000_000n;
    // Straight from the native listing: no object per entry but the one kept (100,000 objects listed in ~0.2 s).
    const raw = statDirRaw(fanFd);
    if (!raw) return null; // no native listing: nothing is trusted by it
    const out = new Map<string, ListedObject>();
    const names: string[] = [];
    let complete = true;
    const v = raw.stats;
    for (let i = 0, b = 0; i < raw.count; i++, b += raw.fields) {
      const name = raw.names.toString('latin1', raw.nameStart[i], raw.nameEnd[i]);
      if (v[b + SD.errno] !== 0n) {
        complete = false; // its lstat failed: opened (and named) the ordinary way; the names are not known whole
        continue;
      }
      const mode = Number(v[b + SD.mode]);
      const sig = objectSig(
        v[b + SD.dev],
        v[b + SD.ino],
        v[b + SD.size],
        timeNsAt(v, b + SD.mtimeNs, b + SD.mtimeSec),
        timeNsAt(v, b + SD.ctimeNs, b + SD.ctimeSec),
      );
      const regular = (mode & 0o170000) === 0o100000;
      out.set(name, { regular, size: Number(v[b + SD.size]), sig });
      if (regular) names.push(name);
    }
    if (complete && !this.listed.has(fan)) this.recordListing(fan, at, listedAtNs, atPath, new ObjectNames(names));
    return out;
  }

  /**
   * One object's lstat as listObjects gives it (fstatat(AT_SYMLINK_NOFOLLOW) relative to its fan
   * directory's fd): for a few objects of a fan, cheaper than listing the fan. undefined when
   * there is nothing at its name (or its fan is missing).
   */
  statObject(sha256: string): ListedObject | undefined {
    let fanFd: number;
    try {
      fanFd = this.fan(sha256, false);
    } catch (err) {
      if (err instanceof StoreError && err.code === 'missing') return undefined;
      throw err;
    }
    let st: BigIntStats;
    try {
      st = lstatSync(pathAt(fanFd, Buffer.from(sha256)), { bigint: true });
    } catch (err) {
      if (errnoCode(err) === 'ENOENT') return undefined;
      throw err;
    }
    return { regular: st.isFile(), size: Number(st.size), sig: objectSigOf(st) };
  }

  /**
   * Writes the object sha256 holding bytes to a fresh temp file (mode 0444; one native call,
   * durable.ts writeTempBytesAt); the caller has hashed exactly those bytes. Not yet in place:
   * commitObjects() syncs every temp file at once and then links each to its name (so a name
   * never points at bytes not on disk). Returns false when the object is there (or pending) already.
   */
  createObject(sha256: string, bytes: Buffer): boolean {
    if (this.hasObject(sha256)) return false;
    this.needRoom(bytes.length, `object ${sha256} (${bytes.length} bytes)`);
    const name = this.tempName(sha256.slice(0, 16));
    writeTempBytesAt(this.tmpFd, name, STORED_MODE, bytes);
    this.pending.set(sha256, name);
    return true;
  }

  /**
   * Writes an object from what write(fd) writes to a fresh temp file; write returns the hex
   * SHA-256 of exactly the bytes it wrote (the name is known only at the end: a copy hashed as
   * it is written), or null to abandon it. Returns the digest and whether it is new (false:
   * there or pending already, the temp removed); committed by commitObjects().
   */
  createObjectHashed(write: (fd: number) => string | null, size = 0): { sha256: string; stored: boolean } | null {
    this.needRoom(size, `an object (${size} bytes)`);
    let sha: string | null = null;
    const tmp = this.writeTemp('object', (fd) => (sha = write(fd)), false);
    if (sha === null) {
      unlinkSync(this.tempPath(tmp));
      return null;
    }
    const sha256: string = sha;
    if (this.hasObject(sha256)) {
      unlinkSync(this.tempPath(tmp));
      return { sha256, stored: false };
    }
    this.pending.set(sha256, tmp);
    return { sha256, stored: true };
  }

  /**
   * Makes every object written since the last call durable and in place: syncfs(2) of the
   * store's file system (one journal commit for them all, where an fsync per file costs one
   * each), or for at most FSYNC_EACH_MAX objects an fsync(2) of each (a syncfs also waits for
   * every other file's dirty data on that file system: a build's, a session's); then each temp
   * file moved to its name, in fan order (one fan directory opened at a time) by renameat2(2)
   * RENAME_NOREPLACE (EEXIST: there already, never replaced; the temp removed), or link(2) and
   * unlink(2) where the helper or the file system cannot; then the names made durable the same
   * way (syncfs again, or an fsync of each fan directory a name was made in and of tmp/).
   * Returns the objects moved into place. StoreError io when a sync fails.
   */
  commitObjects(): number {
    if (this.pending.size === 0) return 0;
    const few = this.pending.size <= FSYNC_EACH_MAX;
    // The bytes on disk before any name points at them.
    if (few) for (const tmp of this.pending.values()) this.syncing(() => fsyncAt(this.tmpFd, tmp));
    else syncFileSystem(this.rootFd, this.dir);
    let linked = 0;
    const fans = new Map<string, string>(); // fan -> an object named in it
    const order = [...this.pending.keys()].sort();
    for (const sha256 of order) {
      const tmp = this.pending.get(sha256)!;
      const fanFd = this.fan(sha256, true);
      if (this.moveTemp(tmp, fanFd, sha256)) {
        this.listed.get(sha256.slice(0, 2))?.add(sha256);
        fans.set(sha256.slice(0, 2), sha256);
        linked++;
      }
    }
    this.pending.clear();
    if (linked > 0) {
      // The links durable: one more syncfs (one journal commit), or an fsync per directory changed.
      if (few) {
        for (const sha256 of fans.values()) this.syncing(() => fsyncSync(this.fan(sha256, false)));
        this.syncing(() => fsyncSync(this.tmpFd));
      } else syncFileSystem(this.rootFd, this.dir);
    }
    return linked;
  }

  /** fn (an fsync), its failure a StoreError io naming the store. */
  private syncing(fn: () => void): void {
    try {
      fn();
    } catch (err) {
      throw new StoreError('io', `fsync in the checkpoint store ${this.dir} failed: ${(err as Error).message}`);
    }
  }

  /** The objects written and not yet committed (their names). */
  pendingObjects(): string[] {
    return [...this.pending.keys()];
  }

  /** Removes the temp files of objects not committed (a capture that failed). */
  abandonObjects(): void {
    for (const tmp of this.pending.values()) {
      try {
        unlinkSync(this.tempPath(tmp));
      } catch {
        // swept at the next start
      }
    }
    this.pending.clear();
  }

  /**
   * Objects of one fan directory (sha256s share their first two digits) each read whole in one
   * call (O_NOFOLLOW: a planted link is refused) and hashed, at once on up to `threads`
   * threads, each into a buffer of `cap` bytes (file-at.ts hashWholeAt). Per object, in order:
   * `read`, the SHA-256 (hex) of the bytes read, their count, and the object file's size and
   * stat signature before the read (objectSigOf); null when it holds cap bytes or more, or
   * changed while it was read (read it with openObject); or the error: StoreError missing or refused as openObject's (refused too
   * for a name that is no SHA-256 of this fan, or no regular file), else the errno Error.
   */
  hashObjectsWhole(sha256s: string[], cap: number, threads: number): ({ read: string; bytes: number; size: number; sig: string } | null | Error)[] {
    const out: ({ read: string; bytes: number; size: number; sig: string } | null | Error)[] = new Array(sha256s.length).fill(null);
    // Each name checked as objectFan checks it; the fan directory opened once.
    const fan = sha256s[0]?.slice(0, 2);
    const batch: number[] = [];
    sha256s.forEach((sha256, i) => {
      if (!isSha256Hex(sha256) || sha256.slice(0, 2) !== fan) out[i] = new StoreError('refused', `not a SHA-256 of fan ${fan}: ${JSON.stringify(sha256)}`);
      else batch.push(i);
    });
    if (batch.length === 0) return out;
    let fanFd: number;
    try {
      fanFd = this.objectFan(sha256s[batch[0]!]!);
    } catch (err) {
      // No such fan directory: each object is missing, named as openObject names it.
      const missing = err instanceof StoreError && err.code === 'missing';
      for (const i of batch) {
        const sha256 = sha256s[i]!;
        out[i] = missing ? new StoreError('missing', `object ${sha256} is missing from ${this.dir}`, objectKey(sha256)) : (err as Error);
      }
      return out;
    }
    const got = hashWholeAt(
      fanFd,
      batch.map((i) => Buffer.from(sha256s[i]!)),
      READ_EXTRA,
      cap,
      threads,
    );
    got.forEach((g, k) => {
      const i = batch[k]!;
      const sha256 = sha256s[i]!;
      const key = objectKey(sha256);
      if ('code' in g) out[i] = this.openFailure(Object.assign(new Error(`${g.code}: reading ${this.dir}/${key}`), g), sha256) as Error;
      else if (!isRegular(g.before)) out[i] = new StoreError('refused', `${this.dir}/${key} is not a regular file`, key);
      else if (g.sha256 !== null) out[i] = { read: g.sha256, bytes: g.bytes, size: Number(g.before.size), sig: objectSigOf(g.before) };
    });
    return out;
  }

  /** The fan directory of an object to read: StoreError refused (not a SHA-256), missing (no such fan). */
  private objectFan(sha256: string): number {
    if (!isSha256Hex(sha256)) throw new StoreError('refused', `not a SHA-256: ${JSON.stringify(sha256)}`);
    try {
      return this.fan(sha256, false);
    } catch (err) {
      if (err instanceof StoreError && err.code === 'missing')
        throw new StoreError('missing', `object ${sha256} is missing from ${this.dir}`, objectKey(sha256));
      throw err;
    }
  }

  /** An object's open failing as the store says it: ENOENT missing, ELOOP refused (a planted link), else the error itself. */
  private openFailure(err: unknown, sha256: string): unknown {
    const key = objectKey(sha256);
    if (errnoCode(err) === 'ENOENT') return new StoreError('missing', `object ${sha256} is missing from ${this.dir}`, key);
    if (errnoCode(err) === 'ELOOP') return new StoreError('refused', `${this.dir}/${key} is a symlink (planted; never followed)`, key);
    return err;
  }

  /** Opens the object for reading (O_NOFOLLOW: a planted link is refused); StoreError missing/refused. Returns the fd and its size. */
  openObject(sha256: string): { fd: number; size: number } {
    const key = objectKey(sha256);
    const fanFd = this.objectFan(sha256);
    let fd: number;
    try {
      fd = openSync(pathAt(fanFd, Buffer.from(sha256)), OPEN_READ);
    } catch (err) {
      throw this.openFailure(err, sha256);
    }
    const st = fstatSync(fd);
    if (!st.isFile()) {
      closeSync(fd);
      throw new StoreError('refused', `${this.dir}/${key} is not a regular file`, key);
    }
    return { fd, size: st.size };
  }

  /** A tree object's bytes, or null when it is missing; StoreError refused for a link or non-file, io past MAX_TREE_BYTES (not read). */
  readObjectBytes(sha256: string): Buffer | null {
    let opened: { fd: number; size: number };
    try {
      opened = this.openObject(sha256);
    } catch (err) {
      if (err instanceof StoreError && err.code === 'missing') return null;
      throw err;
    }
    try {
      if (opened.size > MAX_TREE_BYTES)
        throw new StoreError('io', `object ${sha256} in ${this.dir} is ${opened.size} bytes, over the ${MAX_TREE_BYTES} of a tree`);
      return readFileSync(opened.fd);
    } finally {
      closeSync(opened.fd);
    }
  }

  /** Creates name in dirFd (manifests or published) holding bytes (or these parts, one after another), create-once, durable; false when it was there already. */
  createRecord(dirFd: number, name: string, bytes: Buffer | Buffer[]): boolean {
    const stored = this.createAt(dirFd, name, (fd) => {
      for (const part of Array.isArray(bytes) ? bytes : [bytes]) writeAll(fd, part);
    });
    if (stored) fsyncSync(dirFd);
    return stored;
  }

  /** The bytes of name in dirFd (O_NOFOLLOW), or null when absent; StoreError refused for a link or non-file. */
  readRecord(dirFd: number, name: string): Buffer | null {
    let fd: number;
    try {
      fd = openSync(pathAt(dirFd, Buffer.from(name)), OPEN_READ);
    } catch (err) {
      if (errnoCode(err) === 'ENOENT') return null;
      if (errnoCode(err) === 'ELOOP') throw new StoreError('refused', `${this.dir}: ${name} is a symlink (planted; never followed)`, name);
      throw err;
    }
    try {
      const st = fstatSync(fd);
      if (!st.isFile()) throw new StoreError('refused', `${this.dir}: ${name} is not a regular file`, name);
      return readFd(fd, st.size);
    } finally {
      closeSync(fd);
    }
  }

  /** Names in a directory of the store. */
  list(dirFd: number): string[] {
    return readdirSync(`/proc/self/fd/${dirFd}`);
  }

  /** Removes name from dirFd (no error when already gone); a directory there (put by someone else) is removed whole, never followed. */
  remove(dirFd: number, name: string): void {
    const at = pathAt(dirFd, Buffer.from(name));
    try {
      unlinkSync(at);
    } catch (err) {
      if (errnoCode(err) === 'ENOENT') return;
      if (errnoCode(err) !== 'EISDIR' && errnoCode(err) !== 'EPERM') throw err;
      rmSync(at, { recursive: true, force: true });
    }
  }

  /** The object fan directory names (two hex digits) and, for one, its object names. */
  fanNames(): string[] {
    return this.list(this.objectsFd).filter((n) => /^[0-9a-f]{2}$/.test(n));
  }

  fanDir(name: string): number {
    return dirAt(this.objectsFd, name, false, `${this.dir}/${STORE_DIRS.objects}/${name}`);
  }

  private createAt(dirFd: number, name: string, write: (fd: number) => void): boolean {
    return this.moveTemp(this.writeTemp(name.slice(0, 16), write, true), dirFd, name);
  }

  /** A fresh temp file in tmp/ (O_EXCL|O_NOFOLLOW, 0444) holding what write wrote, fsync'ed when sync; its name in tmp/. */
  private writeTemp(stem: string, write: (fd: number) => void, sync: boolean): TempFile {
    const name = this.tempName(stem);
    writeTempAt(this.tmpFd, name, STORED_MODE, write, sync);
    return name;
  }

  /** A temp name not used before in this opening of the store. */
  private tempName(stem: string): TempFile {
    return Buffer.from(`${stem}.${this.tempStem}.${++this.tempSeq}.tmp`);
  }

  /** A temp file's path, through the tmp fd. */
  private tempPath(name: TempFile): Buffer {
    return pathAt(this.tmpFd, name);
  }

  /** The temp moved to name in dirFd, never replacing (placeNoReplaceAt): true when made, false when the name exists (the temp removed). */
  private moveTemp(tmp: TempFile, dirFd: number, name: string): boolean {
    return placeNoReplaceAt(this.tmpFd, tmp, dirFd, Buffer.from(name), this.noReplace);
  }

  /** renameat2 RENAME_NOREPLACE until this store's file system answers EINVAL, then link + unlink. */
  private readonly noReplace: NoReplace = { renameWorks: true };
}

/** fsync(2) of the file name in dirFd (opened read-only, never through a link). */
function fsyncAt(dirFd: number, name: Buffer): void {
  const fd = openSync(pathAt(dirFd, name), constants.O_RDONLY | constants.O_NOFOLLOW);
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/** Reads exactly size bytes from fd from offset 0 (fewer if it ends sooner). */
function readFd(fd: number, size: number): Buffer {
  const buf = Buffer.allocUnsafe(size);
  let off = 0;
  while (off < size) {
    const n = readSync(fd, buf, off, size - off, off);
    if (n === 0) break;
    off += n;
  }
  return buf.subarray(0, off);
}

/** Fan directories' listings across openings of a store (LocalStoreFiles.fanNamesCached), by store and fan: the directory's stat then, its names, and whether that stat was old enough to be trusted. */
const FAN_LISTINGS = new Map<string, { sig: string | null; names: ObjectNames; trusted: boolean }>();
/** A fan directory's stat at its path (LocalStoreFiles.fanStat). */
interface FanStat {
  sig: string | null;
  newestNs: bigint;
}
/** Per store directory: its removal generation (LocalStoreFiles.removalGen). */
const REMOVAL_GEN = new Map<string, number>();
const removalGen = (dir: string): number => REMOVAL_GEN.get(dir) ?? 0;
/** The 256 fan directory names, 00 to ff. */
const FANS = Array.from({ length: 256 }, (_, i) => i.toString(16).padStart(2, '0'));

/** Bytes read from an object at a time. */
const READ_BLOCK = 1 << 20;

/** The local store as a CheckpointStore (for the supervisor's orchestration and sbx restore). Objects are written by the scanning thread, so putObject only checks they are there. */
export class LocalStore implements CheckpointStore {
  readonly location: string;
  private files: LocalStoreFiles | null = null;

  /** create: make the store if absent (the supervisor; sbx reads only); lock: hold its lock (the supervisor: one per store). */
  constructor(
    readonly dir: string,
    private readonly create: boolean,
    private readonly takeLock = false,
  ) {
    this.location = dir;
  }

  /**
   * The store's fds, reopened when its path no longer names the directory they hold (moved or
   * removed by an operator: what follows goes wholly to the store at the path, made afresh);
   * returns whether they were reopened.
   */
  reopenIfMoved(): boolean {
    if (!this.files || this.files.stillAt(this.dir)) return false;
    this.close();
    return true;
  }

  /** The store's fds, opened on first use (StoreError missing when there is no store and create is false). */
  get fs(): LocalStoreFiles {
    if (!this.files) {
      const files = LocalStoreFiles.open(this.dir, { create: this.create });
      try {
        if (this.takeLock) files.lock();
      } catch (err) {
        files.close();
        throw err;
      }
      this.files = files;
    }
    return this.files;
  }

  close(): void {
    this.files?.close();
    this.files = null;
  }

  async putObject(sha256: string): Promise<{ stored: boolean }> {
    if (!this.fs.hasObject(sha256)) throw new StoreError('missing', `object ${sha256} was not written to ${this.dir}`, objectKey(sha256));
    return { stored: false };
  }

  async *readObject(sha256: string): AsyncIterable<Uint8Array> {
    const { fd, size } = this.fs.openObject(sha256);
    try {
      for (let pos = 0; ;) {
        // No bigger than what is left (+1 to see the end): a 16 KiB object is not read into 1 MiB.
        const want = Math.min(READ_BLOCK, Math.max(1, size - pos + 1));
        const buf = Buffer.allocUnsafe(want);
        const n = readSync(fd, buf, 0, want, pos);
        if (n === 0) return;
        pos += n;
        yield buf.subarray(0, n);
      }
    } finally {
      closeSync(fd);
    }
  }

  async putManifest(id: string, bytes: Buffer): Promise<WrittenVersion> {
    const name = `${id}.json`;
    if (!this.fs.createRecord(this.fs.manifestsFd, name, bytes)) {
      const there = this.fs.readRecord(this.fs.manifestsFd, name);
      if (!there || !there.equals(bytes)) throw new StoreError('conflict', `${this.dir}/manifests/${name} exists with other bytes`, name);
    }
    return { etag: null, versionId: null };
  }

  async readManifest(id: string): Promise<Buffer> {
    const bytes = this.fs.readRecord(this.fs.manifestsFd, `${id}.json`);
    if (!bytes) throw new StoreError('missing', `no manifest ${id} in ${this.dir}`, `manifests/${id}.json`);
    return bytes;
  }

  async putPublished(id: string, bytes: Buffer): Promise<void> {
    this.fs.createRecord(this.fs.publishedFd, `${id}.json`, bytes);
  }

  async readPublished(id: string): Promise<Buffer | null> {
    return this.fs.readRecord(this.fs.publishedFd, `${id}.json`);
  }

  async listManifests(): Promise<string[]> {
    return this.manifestIds();
  }

  // --- Upkeep, synchronous: the supervisor's recovery, read-back, published queries and gc
  // (supervisor/checkpoint/), through names and ids, never the store's fds.

  /** The ids of the manifests in manifests/ (`<64 hex>.json`; anything else there is not one). */
  manifestIds(): string[] {
    return idsIn(this.fs.list(this.fs.manifestsFd));
  }

  /** The ids of the published records in published/. */
  publishedIds(): string[] {
    return idsIn(this.fs.list(this.fs.publishedFd));
  }

  /** Manifests with no published record: written, but their read-back never completed (they claim nothing). */
  unpublishedIds(): string[] {
    const published = new Set(this.publishedIds());
    return this.manifestIds().filter((id) => !published.has(id));
  }

  /** A tree object's bytes (LocalStoreFiles.readObjectBytes), or null when it is missing. */
  readObjectBytes(sha256: string): Buffer | null {
    return this.fs.readObjectBytes(sha256);
  }

  /** The bytes of manifest id, or null when it is not there; StoreError refused for a link or non-file. */
  manifestBytes(id: string): Buffer | null {
    return this.fs.readRecord(this.fs.manifestsFd, `${id}.json`);
  }

  /** The bytes of the published record of id, or null when it is not published here. */
  publishedBytes(id: string): Buffer | null {
    return this.fs.readRecord(this.fs.publishedFd, `${id}.json`);
  }

  /** Removes manifest id (no error when gone). */
  removeManifest(id: string): void {
    this.fs.remove(this.fs.manifestsFd, `${id}.json`);
  }

  /** Removes the published record of id (no error when gone): the checkpoint is no longer published here. */
  removePublished(id: string): void {
    this.fs.remove(this.fs.publishedFd, `${id}.json`);
  }

  /** The store's root directory fd (for the checkpoint thread, which opens the store through it); opens the store when needed. */
  get rootFd(): number {
    return this.fs.rootFd;
  }

  /** Removes the store's record of a frozen workspace (the thaw is done). */
  clearFrozen(): void {
    this.fs.clearFrozen();
  }

  /** Removes every temp file in tmp/ (a checkpoint that did not finish). */
  clearTemp(): void {
    const fs = this.fs;
    for (const name of fs.list(fs.tmpFd)) fs.remove(fs.tmpFd, name);
  }

  /** The object's path (for an upload that reads it by path). */
  objectPath(sha256: string): string {
    return join(this.dir, objectKey(sha256));
  }

  /**
   * Moves what sits at an object's name (a corrupt file, a planted link or dir: never followed)
   * into quarantine/ as `<sha256>.<ms>`, so a retry stores it afresh (create-once never
   * replaces); returns the quarantine dir. Throws ENOENT when nothing is there.
   */
  setAside(sha256: string): string {
    const q = join(this.dir, STORE_DIRS.quarantine);
    const qFd = this.quarantineFd(true)!;
    try {
      const fan = this.fs.fanDir(sha256.slice(0, 2));
      try {
        const from = pathAt(fan, Buffer.from(sha256));
        lstatSync(from);
        renameSync(from, pathAt(qFd, `${sha256}.${Date.now()}`));
      } finally {
        closeSync(fan);
      }
    } finally {
      closeSync(qFd);
    }
    return q;
  }

  /**
   * quarantine/ opened O_DIRECTORY|O_NOFOLLOW through the store's root fd (made when `create`),
   * or null when absent: a link or file there is refused (StoreError refused), never followed,
   * so neither a set-aside nor gc reaches outside the store.
   */
  private quarantineFd(create: boolean): number | null {
    try {
      return dirAt(this.fs.rootFd, STORE_DIRS.quarantine, create, `${this.dir}/${STORE_DIRS.quarantine}`);
    } catch (err) {
      if (!create && err instanceof StoreError && err.code === 'missing') return null;
      throw err;
    }
  }

  /** Opens (makes, for the supervisor) the store now; throws what opening it throws. */
  open(): void {
    void this.fs;
  }

  /** Removes every object not in `keep`; what was removed and the bytes it held (lstat sizes). */
  removeObjectsExcept(keep: Set<string>): { removed: number; freedBytes: number } {
    const fs = this.fs;
    let removed = 0;
    let freedBytes = 0;
    for (const fan of fs.fanNames()) {
      const fanFd = fs.fanDir(fan);
      try {
        for (const name of fs.list(fanFd)) {
          if (keep.has(name)) continue;
          try {
            freedBytes += lstatSync(pathAt(fanFd, Buffer.from(name))).size;
          } catch {
            continue; // gone meanwhile
          }
          fs.remove(fanFd, name);
          removed++;
        }
      } finally {
        closeSync(fanFd);
      }
    }
    return { removed, freedBytes };
  }

  /** Removes what quarantine/ holds (each entry whole); how many and the bytes (lstat sizes of the top entries). */
  clearQuarantine(): { removed: number; freedBytes: number } {
    let removed = 0;
    let freedBytes = 0;
    const qFd = this.quarantineFd(false);
    if (qFd === null) return { removed, freedBytes };
    try {
      for (const name of readdirSync(pathAt(qFd, ''))) {
        try {
          const at = pathAt(qFd, name);
          freedBytes += lstatSync(at).size;
          rmSync(at, { recursive: true, force: true }); // entries are lstat'ed, never followed
          removed++;
        } catch {
          // gone meanwhile
        }
      }
    } finally {
      closeSync(qFd);
    }
    return { removed, freedBytes };
  }
}

/** The ids named by `<64 hex>.json` entries of a listing. */
function idsIn(names: string[]): string[] {
  return names.filter((n) => /^[0-9a-f]{64}\.json$/.test(n)).map((n) => n.slice(0, 64));
}

/**
 * syncfs(2) of the store's file system through the addon (loaded in the checkpoint thread too):
 * never a `sync -f` child, whose exit the supervisor's subreaper could reap before the thread's
 * spawnSync did (which then waits for good). StoreError io when it fails.
 */
function syncFileSystem(dirFd: number, dir: string): void {
  try {
    native().syncfsFd(dirFd);
  } catch (err) {
    throw new StoreError('io', `syncfs of the checkpoint store ${dir} failed: ${(err as Error).message}`);
  }
}

/** An object file as a fan directory's listing shows it (LocalStoreFiles.listObjects). */
export interface ListedObject {
  regular: boolean;
  size: number;
  sig: string;
}

/** An object file's stat signature: device, inode, size, mtime, ctime (an object is never written after it is linked in: any write moves them). */
export function objectSigOf(st: Pick<StatFacts, 'dev' | 'ino' | 'size' | 'mtimeNs' | 'ctimeNs'>): string {
  return objectSig(st.dev, st.ino, st.size, st.mtimeNs, st.ctimeNs);
}

const U64_MAX = (1n << 64n) - 1n;
const I64_MIN = -(1n << 63n);
const I64_MAX = (1n << 63n) - 1n;
/** Whether v is 64 bits signed or unsigned: stat gives dev, ino and size signed (an inode number of 2^63 or more, overlayfs xino's say, is negative there), so both forms are the same 64 bits. */
const fits64 = (v: bigint): boolean => v >= I64_MIN && v <= U64_MAX;

/** One thread's scratch for objectSig (a module instance per worker thread). */
const SIG_SCRATCH = Buffer.alloc(41);

/**
 * objectSigOf of the fields themselves (a listing's, with no stat object made per entry). A
 * flat string of 41 latin1 chars: 0x01, then dev, ino and size (their 64 bits) and mtime and ctime
 * (i64 ns), little endian. It is kept per object re-hashed (stat-cache.ts VerifiedObjects):
 * a template literal of five bigints is a tree of cons strings over decimal ones, ~450 bytes
 * of heap per object against ~56 here. A time past the i64 range gives the decimal fields
 * after a ':' (never 0x01: the two forms never meet).
 */
function objectSig(dev: bigint, ino: bigint, size: bigint, mtimeNs: bigint, ctimeNs: bigint): string {
  const b = SIG_SCRATCH;
  if (fits64(dev) && fits64(ino) && fits64(size) && mtimeNs >= I64_MIN && mtimeNs <= I64_MAX && ctimeNs >= I64_MIN && ctimeNs <= I64_MAX) {
    b[0] = 1;
    b.writeBigUInt64LE(BigInt.asUintN(64, dev), 1);
    b.writeBigUInt64LE(BigInt.asUintN(64, ino), 9);
    b.writeBigUInt64LE(BigInt.asUintN(64, size), 17);
    b.writeBigInt64LE(mtimeNs, 25);
    b.writeBigInt64LE(ctimeNs, 33);
    return b.toString('latin1');
  }
  // Buffer's toString gives one flat string (the template literal alone would be cons strings).
  return Buffer.from(`:${dev}:${ino}:${size}:${mtimeNs}:${ctimeNs}`, 'latin1').toString('latin1');
}
