// The capture (in the checkpoint thread): walks a workspace (core/fs/walk.ts), hashes each regular
// file into the local store create-once, then walks again comparing type, size, mode, owner,
// mtime, ctime and inode, re-capturing what moved, until a whole pass sees nothing move (else
// `unstable`); optionally one last pass frozen (FIFREEZE). Owns those loops and their bounds
// (deadline, free space); not the manifest (capture-worker.ts) or publication (publish.ts).
import { createHash } from 'node:crypto';
import { availableParallelism } from 'node:os';
import { appendFileSync, closeSync, constants, fstatSync, lstatSync, openSync, readFileSync, readSync, writeSync } from 'node:fs';
import { faultPoint } from '../../core/fault.js';
import { native, TIME_OUT_OF_RANGE } from '../../core/fs/native.js';
import { isRegular, readWholeAt, sameStat, statAfter, statBefore } from '../../core/fs/file-at.js';
import { isUtf8 } from 'node:buffer';
import { showPath } from '../../core/fs/names.js';
import { racyMarginNs } from '../../core/fs/granule.js';
import {
  checkFsIdentity,
  int64Number,
  mountIdOf,
  pathAt,
  ScanError,
  SD,
  small32,
  walkTree,
  type FsIdentity,
  type ListedRow,
  type WalkEntry,
} from '../../core/fs/walk.js';
import { type ListedObject, LocalStoreFiles, objectSigOf } from '../../core/checkpoint/local-store.js';
import { writeAll } from '../../core/fs/durable.js';
import type { EntryFacts } from '../../core/checkpoint/manifest.js';
import type { CaptureSeed } from './stat-cache.js';
import { storeTrees, type CaptureTrees } from './trees.js';
import { readHinted, type SeedOverlay } from './hints.js';
import { WalkOrder } from './walk-order.js';
import { StoreError } from '../../core/checkpoint/store.js';
import { errnoCode, systemError } from '../../ipc/errno.js';
import { testHooks } from '../../core/test-hooks.js';
import { heapTick } from './heap-bound.js';

/*
 * Why a still pass proves a consistent state: every entry was unchanged from its capture (in an
 * earlier pass) to its check (in the last one), and every such interval contains the instant
 * between the two passes, so at that instant the tree was exactly what was captured. The walk
 * takes directory fds, follows no link and stays on one file system; a file another process's
 * write lease keeps shut is `unstable` too; with verifyContent each pass compares content.
 */
export interface CaptureRequest {
  kind: 'capture';
  root: string;
  /** A watched workspace (or a directory in it): the file system (and mount) every pass must walk, else fs_changed (something mounted over it). */
  expectFs?: FsIdentity;
  /** The store's path (for messages) and the supervisor's fd holding it open (what is written to). */
  storeDir: string;
  storeFd: number;
  /** Bytes storing must leave free in the store's file system (the state dir's keep-free and admission thresholds): a file whose object may be new is counted at its size before it is read. */
  reserveBytes: number;
  /** The manifest's size bound (checkpoint.maxManifestBytes): a walk whose entries would make a bigger one fails manifest_too_large. */
  maxManifestBytes?: number;
  deadlineMs?: number;
  startHrNs: bigint;
  /** Walks at most: the first captures, each later one checks (and re-captures what moved). At least 2. */
  maxPasses: number;
  /** Later passes also re-hash every file whose stat did not move (a write through a shared mmap moves no timestamp). */
  verifyContent?: boolean;
  /**
   * Freeze the workspace's file system (FIFREEZE; its own mount, checked by the supervisor)
   * around one last pass, at most this many ms (then thawed, whatever the pass); 0: no freeze.
   */
  freezeMaxMs?: number;
  /**
   * Shared with the supervisor's thread (capture.ts): FREEZE_IDLE, FREEZE_HELD while this
   * capture freezes or holds the file system frozen, FREEZE_REFUSED once the supervisor stops
   * (no freeze starts; one held is thawed at once). The supervisor thaws it itself when this
   * thread dies, stops, or overruns freezeMaxMs.
   */
  freezeState?: Int32Array;
}

export const FREEZE_IDLE = 0;
export const FREEZE_HELD = 1;
export const FREEZE_REFUSED = 2;

/**
 * One captured entry: what the manifest records, and the stat the next pass compares. Its path
 * is kept once, as `key` (pathOf gives the bytes back): 100,000 entries are kept between
 * checkpoints (stat-cache.ts), so each field costs.
 */
export interface CapturedEntry extends Omit<EntryFacts, 'path'> {
  /** A file: the bytes stored (what sha256 covers); a symlink: its target's length; others 0. */
  size: number;
  target?: Buffer;
  /** The path's bytes as a latin1 string (one char per byte): its key in the maps a pass keeps. */
  key: string;
  /** What the next pass compares (with type, uid, gid, mtimeNs, ctimeNs and a link's target), as seen before the content was read: st_mode, st_size, st_ino, st_rdev (numbers where they fit: small ones cost no allocation). */
  stMode: number;
  stSize: number;
  ino: bigint;
  stRdev: number;
  /** st_dev: a file of another file system (one bind-mounted over a file of the workspace) is not the one captured, whatever its inode and times. */
  stDev: number;
  /** The ctime of that stat (the stat cache leaves out entries changed too near their capture: stat-cache.ts). */
  ctimeNs: bigint;
  /** The file changed while it was read (its stat before and after differ). */
  moved?: boolean;
  /** Its manifest entry's bytes (entryJsonBytes), kept by the walk: they depend on its path and on what sameAsCaptured compares, so a copy under another path drops them (hints.ts walkIn). */
  jsonBytes?: number;
}

export interface CaptureResult {
  /** With freezeMaxMs: whether the last pass ran frozen (then nothing could change under it), or why not. */
  freeze: { frozen: boolean; ms: number; reason: string | null } | null;
  /** The workspace directory itself, as the last pass saw it. */
  root: { mode: number; uid: number; gid: number; mtimeNs: bigint };
  entries: CapturedEntry[];
  /** Paths that still changed in the last pass (moved, appeared or went). Empty: consistent. */
  unstable: Buffer[];
  /** Those of `unstable` another process's write lease kept shut in the last pass: not read then (captured only if an earlier pass read them). */
  leased: Buffer[];
  passes: number;
  files: number;
  bytes: number;
  objectsWritten: number;
  bytesWritten: number;
  bytesHashed: number;
  /** Files opened and read, in every pass (a file read twice counts twice): 0 when every entry was kept from the stat cache. */
  filesRead: number;
  /** The tree objects of `entries` (manifest version 2), stored with the file objects. */
  trees: CaptureTrees;
  /** The objects this capture wrote to the store (files' and trees'; one there already at commit too). */
  written: string[];
  /** The journal's paths looked at before the first pass (hints.ts; their files read are in filesRead); 0: none (no seed, no journal, nothing changed). */
  hintedPaths: number;
  /** Whether `entries` are exactly the seed's (the same objects, every one): one pass found the seed as it was, nothing read before it, no frozen pass. */
  keptSeed: boolean;
  /** The seed with what the look at the journal's paths found over it, when `entries` are exactly that (the same objects, every one: one pass found it as it was, no frozen pass); else null. What changed from the seed is then `changes()`: the stat cache and the object list are updated from the seed's, not derived whole (capture-worker.ts). */
  keptOverlay: SeedOverlay | null;
  /** The store and its removal generation once committed (LocalStoreFiles.removalGen): every object `entries` name is then in the fan listings this thread keeps of it. */
  presentIn: { storeDir: string; gen: number };
}

export type WorkerReply<T> = { ok: true; result: T } | { ok: false; code: string; message: string };
/** Sent now and then while a step runs. */
export interface WorkerProgress {
  progress: { pass: number; entries: number; bytesHashed: number };
}

/** Files up to this size are read whole into one buffer: hashed and stored from the same bytes. */
const SMALL_FILE_BYTES = 4 << 20;
const BLOCK_BYTES = 1 << 20;
/** Reads of one file before it counts as moved for this pass. */
const FILE_ATTEMPTS = 3;
const PROGRESS_EVERY_MS = 250;
/**
 * A file another process holds a write lease on (fcntl(2) F_SETLEASE F_WRLCK): the O_NONBLOCK
 * open fails with EWOULDBLOCK and starts the lease break; it is tried again (every
 * LEASE_RETRY_MS) while the pass's lease budget lasts: LEASE_PASS_BUDGET_MS in all per pass,
 * shared by its leased files (once spent, each further one is tried once), so leases cost a
 * checkpoint at most passes x LEASE_PASS_BUDGET_MS. One not opened counts as moved for that pass.
 */
const LEASE_PASS_BUDGET_MS = 100;
const LEASE_RETRY_MS = 5;
/** What Capture.entry returns for a file it could not open because of a lease. */
export const LEASED = 'leased';
const OPEN_FILE = constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK | constants.O_NOCTTY;
/** OPEN_FILE's flags beyond what readWholeAt always sets (O_RDONLY|O_CLOEXEC|O_NOFOLLOW). */
const OPEN_FILE_EXTRA = constants.O_NONBLOCK | constants.O_NOCTTY;
/** A small file's one-call read that moved (smallFileAt): file() takes it again. */
const MOVED = Symbol('moved');

const small = Buffer.allocUnsafe(SMALL_FILE_BYTES + 1);
const block = Buffer.allocUnsafe(BLOCK_BYTES);
const sleeper = new Int32Array(new SharedArrayBuffer(4));

/** Whether an open failed because another process holds a lease on the file (EWOULDBLOCK is EAGAIN on Linux). */
function leaseBlocked(err: unknown): boolean {
  const c = errnoCode(err);
  return c === 'EAGAIN' || c === 'EWOULDBLOCK';
}

/** SHA-256 (hex) and length of fd's bytes from offset 0, read in BLOCK_BYTES blocks; beforeBlock (a deadline check) runs before each read. */
function hashFd(fd: number, beforeBlock: () => void = () => {}): { sha256: string; bytes: number } {
  const hash = createHash('sha256');
  let pos = 0;
  for (;;) {
    beforeBlock();
    const r = readSync(fd, block, 0, BLOCK_BYTES, pos);
    if (r === 0) break;
    hash.update(block.subarray(0, r));
    pos += r;
  }
  return { sha256: hash.digest('hex'), bytes: pos };
}

function sigOf(
  type: string,
  st: { size: bigint; mode: number | bigint; uid: number | bigint; gid: number | bigint; mtimeNs: bigint; ctimeNs: bigint; ino: bigint; rdev: bigint },
): string {
  return `${type}:${st.size}:${st.mode}:${st.uid}:${st.gid}:${st.mtimeNs}:${st.ctimeNs}:${st.ino}:${st.rdev}`;
}

/** The stat fields a captured entry keeps to be compared (sameAsCaptured). */
function statFields(st: StatFacts): Pick<CapturedEntry, 'stMode' | 'stSize' | 'ino' | 'stRdev' | 'stDev'> {
  return { stMode: Number(st.mode), stSize: Number(st.size), ino: st.ino, stRdev: Number(st.rdev), stDev: Number(st.dev) };
}

/** Whether the walked entry e is as c was captured: type, mode, owner, size, mtime, ctime, inode, rdev, device, and a link's target (git's index compares the same, but the device). */
export function sameAsCaptured(c: CapturedEntry, e: WalkEntry): boolean {
  return (
    c.ctimeNs === e.ctimeNs &&
    c.mtimeNs === e.mtimeNs &&
    c.ino === e.ino &&
    c.stSize === Number(e.size) &&
    c.stMode === e.mode &&
    c.type === e.type &&
    c.uid === e.uid &&
    c.gid === e.gid &&
    c.stRdev === Number(e.rdev) &&
    c.stDev === Number(e.dev) &&
    (c.type !== 'symlink' || (e.linkTarget ?? EMPTY).equals(c.target ?? EMPTY))
  );
}

const EMPTY = Buffer.alloc(0);

/**
 * sameAsCaptured of c and the entry a listed row would be (walk.ts listedEntry), read from the
 * listing in place: numbers from its 32-bit words, a BigInt made only for the inode and the two
 * times (c's are BigInts), and those only once the rest matched. A link is never the same here
 * (its target is compared as bytes: the entry does that), nor a time past int64 nanoseconds.
 */
export function sameAsListed(c: CapturedEntry, row: ListedRow): boolean {
  const w = row.words;
  const at = row.at;
  return (
    c.type === row.type &&
    c.type !== 'symlink' &&
    c.stMode === row.mode &&
    c.stSize === int64Number(w, at + SD.size) &&
    c.uid === small32(w, at + SD.uid) >>> 0 &&
    c.gid === small32(w, at + SD.gid) >>> 0 &&
    c.stRdev === int64Number(w, at + SD.rdev) &&
    c.stDev === int64Number(w, at + SD.dev) &&
    c.ino === row.stats[at + SD.ino] &&
    c.mtimeNs === row.stats[at + SD.mtimeNs] &&
    c.mtimeNs !== TIME_OUT_OF_RANGE &&
    c.ctimeNs === row.stats[at + SD.ctimeNs] &&
    c.ctimeNs !== TIME_OUT_OF_RANGE
  );
}

/** A captured entry's path, bytes. */
export function pathOf(c: CapturedEntry): Buffer {
  return Buffer.from(c.key, 'latin1');
}

/** The stat fields a file's capture is compared by (a walk entry, or BigIntStats). */
type StatFacts = {
  size: bigint;
  mode: number | bigint;
  uid: number | bigint;
  gid: number | bigint;
  mtimeNs: bigint;
  ctimeNs: bigint;
  ino: bigint;
  rdev: bigint;
  dev: bigint;
};

class Capture {
  objectsWritten = 0;
  bytesWritten = 0;
  bytesHashed = 0;
  filesRead = 0;
  private lastProgress = Date.now();
  /** What is left of this pass's lease budget (ms). */
  private leaseLeftMs = LEASE_PASS_BUDGET_MS;

  constructor(
    private readonly store: LocalStoreFiles,
    private readonly progress: (p: WorkerProgress['progress']) => void,
    private deadline: { hrNs: bigint | null; ms?: number },
  ) {}

  /** A new pass: its lease budget whole again. */
  newPass(): void {
    this.leaseLeftMs = LEASE_PASS_BUDGET_MS;
  }

  /** Another deadline for what follows (the frozen pass has its own). */
  bound(hrNs: bigint | null, ms?: number): void {
    this.deadline = { hrNs, ms };
  }

  /** ScanError scan_timeout once the checkpoint's deadline has passed (checked per block read, so one big file is bounded too). */
  checkDeadline(): void {
    if (this.deadline.hrNs !== null && process.hrtime.bigint() >= this.deadline.hrNs) {
      throw new ScanError(
        'scan_timeout',
        `scan_timeout: the checkpoint passed its ${this.deadline.ms} ms deadline (checkpoint.deadlineMs) while reading a file`,
      );
    }
  }

  /** Writes through the store, an errno failure named as the store's (ENOSPC, EMFILE...), not the scan's. */
  private storing<T>(fn: () => T): T {
    try {
      return fn();
    } catch (err) {
      // Only an errno error is the store's (a TypeError building trees is not, and is not
      // named one: capture-worker.ts drops the stat cache's seed for it).
      if (err instanceof StoreError || err instanceof ScanError || errnoCode(err) === undefined) throw err;
      const e = systemError(err);
      throw new StoreError('io', `${e.code ?? 'error'}: writing to the checkpoint store ${this.store.dir} failed: ${e.message}`);
    }
  }

  tick(pass: number, entries: number): void {
    const now = Date.now();
    if (now - this.lastProgress < PROGRESS_EVERY_MS) return;
    this.lastProgress = now;
    this.progress({ pass, entries, bytesHashed: this.bytesHashed });
  }

  /** Whether the file e still hashes to sha256 (read only, nothing stored); false when it cannot be read as a file now. */
  sameContent(e: WalkEntry, sha256: string): boolean {
    let fd: number;
    try {
      fd = openSync(pathAt(e.dirFd, e.name), OPEN_FILE);
    } catch {
      return false;
    }
    try {
      if (!fstatSync(fd, { bigint: true }).isFile()) return false; // swapped since the lstat
      this.filesRead++;
      const got = hashFd(fd, () => this.checkDeadline());
      this.bytesHashed += got.bytes;
      return got.sha256 === sha256;
    } finally {
      closeSync(fd);
    }
  }

  /** The entry captured now; null when it went (or changed type) since the walk saw it; LEASED: a lease kept it from being opened. */
  entry(e: WalkEntry): CapturedEntry | null | typeof LEASED {
    const type = e.type === 'unknown' ? null : e.type;
    if (type === null) return null;
    const base = {
      key: e.path.toString('latin1'),
      type,
      mode: e.mode & 0o7777,
      uid: e.uid,
      gid: e.gid,
      mtimeNs: e.mtimeNs,
      ctimeNs: e.ctimeNs,
      ...statFields(e),
    };
    if (type === 'symlink') {
      const target = e.linkTarget ?? Buffer.alloc(0);
      return { ...base, size: target.length, target };
    }
    if (type === 'char' || type === 'block') return { ...base, size: 0, rdev: Number(e.rdev) };
    if (type !== 'file') return { ...base, size: 0, ...(e.mountPoint ? { mount: true as const } : {}) };
    return this.file(e);
  }

  /**
   * open() (an open of a file to read) through leased(): LEASED when a lease kept it shut past
   * the pass's budget, null when it went or is now a link or a fifo (the next pass sees it as it is).
   */
  private openOrGone<T>(open: () => T): T | null | typeof LEASED {
    try {
      return this.leased(open) ?? LEASED;
    } catch (err) {
      const c = errnoCode(err);
      if (c === 'ENOENT' || c === 'ELOOP' || c === 'ENXIO') return null;
      throw err;
    }
  }

  /** open() (an open of a file to read), tried again while a lease blocks it (EWOULDBLOCK) and the pass's lease budget lasts, then null. */
  private leased<T>(open: () => T): T | null {
    const t0 = performance.now();
    try {
      for (;;) {
        try {
          return open();
        } catch (err) {
          if (!leaseBlocked(err)) throw err;
          if (performance.now() - t0 >= this.leaseLeftMs) return null;
          this.checkDeadline();
          Atomics.wait(sleeper, 0, 0, LEASE_RETRY_MS);
        }
      }
    } finally {
      this.leaseLeftMs = Math.max(0, this.leaseLeftMs - (performance.now() - t0));
    }
  }

  /**
   * Files captured in this capture whose ctime was within its racy margin of their read (a
   * write later in the same timestamp granule would leave their stat as it is), with when that
   * margin ends (wall clock, ns): a later pass checks their content, not only their stat, once
   * the margin has passed (runCapture).
   */
  readonly racy = new Map<CapturedEntry, bigint>();

  private file(e: WalkEntry): CapturedEntry | null | typeof LEASED {
    // Before every file read (the walk reads the clock only every 64th entry): a deadline is never passed by more than one file.
    this.checkDeadline();
    const readAtNs = BigInt(Date.now()) * 1_000_000n;
    if (e.size <= BigInt(SMALL_FILE_BYTES)) {
      const got = this.smallFileAt(e, readAtNs);
      if (got !== MOVED) return got;
    }
    const fd = this.openOrGone(() => openSync(pathAt(e.dirFd, e.name), OPEN_FILE));
    if (fd === null || fd === LEASED) return fd;
    this.filesRead++;
    try {
      // Swapped for a directory, a fifo or a device since the lstat (opened all the same: a
      // read would fail, block or never end): the next pass sees it as it is.
      if (!fstatSync(fd, { bigint: true }).isFile()) return null;
      let last: CapturedEntry | null = null;
      // The first read is checked against the walk's lstat (the fd opened after it: a file
      // replaced in between has another inode), a retry against an fstat of its own.
      let before: StatFacts = e;
      for (let attempt = 1; attempt <= FILE_ATTEMPTS; attempt++) {
        if (attempt > 1) {
          const st = fstatSync(fd, { bigint: true });
          if (!st.isFile()) return null;
          before = st;
        }
        const got = before.size <= BigInt(SMALL_FILE_BYTES) ? this.smallFile(fd) : this.largeFile(fd, e);
        const after = fstatSync(fd, { bigint: true });
        if (!after.isFile()) return null;
        const moved = !got.consistent || !sameStat(before, after) || BigInt(got.size) !== before.size;
        last = this.captured(e, before, got, moved, readAtNs);
        if (!moved) return last;
      }
      return last;
    } finally {
      closeSync(fd);
    }
  }

  /** A file's entry as read (stat: the one its read is checked against); one that did not move and was read within its racy margin is noted (racy). */
  private captured(e: WalkEntry, before: StatFacts, got: { sha256: string; size: number }, moved: boolean, readAtNs: bigint): CapturedEntry {
    const entry: CapturedEntry = {
      key: e.path.toString('latin1'),
      type: 'file',
      mode: Number(before.mode) & 0o7777,
      uid: Number(before.uid),
      gid: Number(before.gid),
      mtimeNs: before.mtimeNs,
      ctimeNs: before.ctimeNs,
      size: got.size,
      sha256: got.sha256,
      stMode: Number(before.mode),
      stSize: Number(before.size),
      ino: before.ino,
      stRdev: Number(before.rdev),
      stDev: Number(before.dev),
      ...(moved ? { moved: true } : {}),
    };
    if (!moved) {
      const readyAtNs = before.ctimeNs + racyMarginNs(before.ctimeNs);
      if (readyAtNs >= readAtNs) this.racy.set(entry, readyAtNs);
    }
    return entry;
  }

  /**
   * A file the walk listed at most SMALL_FILE_BYTES long, read in one native call (file-at.ts
   * readWholeAt: open, fstat, read, fstat, close) and checked as file()'s first attempt checks
   * it: against the walk's lstat. One that moved meanwhile is MOVED, nothing stored or counted:
   * file() takes it again, attempt by attempt.
   */
  private smallFileAt(e: WalkEntry, readAtNs: bigint): CapturedEntry | null | typeof LEASED | typeof MOVED {
    const n = this.openOrGone(() => readWholeAt(e.dirFd, e.name, OPEN_FILE_EXTRA, small));
    if (n === null || n === LEASED) return n;
    // Swapped for a directory, a fifo or a device since the lstat (opened, never read), or since
    // the read: the next pass sees it as it is. (The stat after is read only for a regular file.)
    const after = isRegular(statBefore()) ? statAfter() : null;
    if (after === null || !isRegular(after)) {
      this.filesRead++;
      return null;
    }
    if (n > SMALL_FILE_BYTES || BigInt(n) !== e.size || !sameStat(e, after)) return MOVED;
    this.filesRead++;
    const bytes = small.subarray(0, n);
    const sha256 = createHash('sha256').update(bytes).digest('hex');
    this.bytesHashed += n;
    if (this.storing(() => this.store.createObject(sha256, bytes))) this.wrote(n);
    return this.captured(e, e, { sha256, size: n }, false, readAtNs);
  }

  /** Reads the whole file into one buffer, hashes it, stores those bytes when the object is absent. */
  private smallFile(fd: number): { sha256: string; size: number; consistent: boolean } {
    let n = 0;
    while (n < small.length) {
      const r = readSync(fd, small, n, small.length - n, n);
      if (r === 0) break;
      n += r;
    }
    const bytes = small.subarray(0, Math.min(n, SMALL_FILE_BYTES));
    const sha256 = createHash('sha256').update(bytes).digest('hex');
    this.bytesHashed += bytes.length;
    if (this.storing(() => this.store.createObject(sha256, bytes))) this.wrote(bytes.length);
    return { sha256, size: bytes.length, consistent: n <= SMALL_FILE_BYTES };
  }

  /**
   * A file too big for one buffer: hashed in blocks; when its object is absent, copied into
   * the store hashing what is written (the object's name is the copy's digest, so the stored
   * bytes always match their name); a copy whose digest differs from the first read moved.
   */
  private largeFile(fd: number, e: WalkEntry): { sha256: string; size: number; consistent: boolean } {
    // Counted at its size before it is read (a sparse file is stored whole): one that cannot
    // fit is refused now, not after minutes of hashing holes. The open file's size, not the
    // listing's: it may have grown since.
    const st = fstatSync(fd, { bigint: true });
    const counted = Number(st.size);
    const onDisk = Number(st.blocks) * 512;
    this.storing(() =>
      this.store.needRoom(counted, `${showPath(e.path)} (${counted} bytes${onDisk < counted ? `, ${onDisk} on disk: a sparse file is stored whole` : ''})`),
    );
    const { sha256: first, bytes: pos } = hashFd(fd, () => this.checkDeadline());
    this.bytesHashed += pos;
    if (this.store.hasObject(first)) return { sha256: first, size: pos, consistent: true };
    let copied = 0;
    const made = this.storing(() =>
      this.store.createObjectHashed((out) => {
        const h = createHash('sha256');
        for (;;) {
          this.checkDeadline();
          const r = readSync(fd, block, 0, BLOCK_BYTES, copied);
          if (r === 0) break;
          // Grown past what was counted: each block more is counted before it is written.
          if (copied + r > counted) this.store.needRoom(r, `${showPath(e.path)} (grown past the ${counted} bytes counted, ${copied + r} copied)`);
          h.update(block.subarray(0, r));
          writeAll(out, block.subarray(0, r));
          copied += r;
        }
        return h.digest('hex');
      }, pos),
    )!;
    this.bytesHashed += copied;
    if (made.stored) this.wrote(copied);
    return { sha256: made.sha256, size: copied, consistent: made.sha256 === first };
  }

  /** The tree objects of the captured entries (trees.ts storeTrees), stored beside the files' objects; a failure named as the store's. */
  trees(entries: readonly CapturedEntry[], last: CaptureSeed['trees']): CaptureTrees {
    return this.storing(() => storeTrees(entries, this.store, last));
  }

  /** The objects this capture wrote (files' and trees'): the read-back re-hashes each. */
  readonly written: string[] = [];

  /** Every object written made durable and moved into place (the store's commitObjects), failures named as the store's. */
  commit(): void {
    // One at a time: push(...list) puts every item on the stack (RangeError past ~120,000: a first checkpoint of 1,000,000 files).
    for (const sha256 of this.store.pendingObjects()) this.written.push(sha256);
    this.storing(() => this.store.commitObjects());
  }

  private wrote(bytes: number): void {
    this.objectsWritten++;
    this.bytesWritten += bytes;
    // A crash point after each object written (the crash tests name one: checkpoint:object@N).
    faultPoint('checkpoint:object');
  }
}

/**
 * One last pass with the workspace's file system frozen (FIFREEZE: writes to it wait until
 * FITHAW), so nothing can change under it: if it completes still frozen, the capture is
 * consistent. The store's `frozen` record names the workspace meanwhile (the store is on
 * another file system), so a supervisor killed while it is frozen thaws it at its next start;
 * onFrozen tells the supervisor's thread, which thaws it itself if this thread dies or
 * overruns (capture.ts). Thawed in every case, at the latest when the pass passes freezeMaxMs
 * (scan_timeout: the passes before stand). A pass the file system was thawed under before it
 * ended (FITHAW here says EINVAL) was an ordinary pass. See fs/ioctl.c, fsfreeze(8).
 */
function frozenPass(req: CaptureRequest, store: LocalStoreFiles, onFrozen: (frozen: boolean) => void, run: () => void): NonNullable<CaptureResult['freeze']> {
  const state = req.freezeState ?? new Int32Array(new SharedArrayBuffer(4));
  if (Atomics.compareExchange(state, 0, FREEZE_IDLE, FREEZE_HELD) !== FREEZE_IDLE) return { frozen: false, ms: 0, reason: 'the supervisor is stopping' };
  let fd: number;
  try {
    fd = openSync(req.root, constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW);
  } catch (err) {
    Atomics.compareExchange(state, 0, FREEZE_HELD, FREEZE_IDLE);
    return { frozen: false, ms: 0, reason: `cannot open the workspace to freeze it: ${(err as Error).message}` };
  }
  try {
    if (req.expectFs) checkFsIdentity(fd, req.root, req.expectFs); // never freeze what is mounted over it
  } catch (err) {
    closeSync(fd);
    Atomics.compareExchange(state, 0, FREEZE_HELD, FREEZE_IDLE);
    throw err;
  }
  const t0 = performance.now();
  const ms = () => Math.round(performance.now() - t0);
  try {
    let refused: string | null = null;
    try {
      store.markFrozen(req.root);
      try {
        native().freeze(fd);
      } catch (err) {
        store.clearFrozen();
        refused = `FIFREEZE failed: ${(err as Error).message}`;
      }
    } catch (err) {
      Atomics.compareExchange(state, 0, FREEZE_HELD, FREEZE_IDLE);
      throw err;
    }
    if (refused !== null) {
      Atomics.compareExchange(state, 0, FREEZE_HELD, FREEZE_IDLE);
      return { frozen: false, ms: 0, reason: refused };
    }
    onFrozen(true);
    let outcome: NonNullable<CaptureResult['freeze']> = { frozen: false, ms: 0, reason: 'the supervisor is stopping' };
    let failure: unknown = null;
    try {
      // The supervisor began to stop between the claim and the freeze: thawed at once.
      if (Atomics.load(state, 0) !== FREEZE_REFUSED) {
        faultPoint('checkpoint:frozen');
        faultPoint('checkpoint:frozen-thread-exit', () => process.exit(70));
        faultPoint('checkpoint:frozen-thread-oom', () => {
          const heap: string[][] = []; // until the thread's heap cap ends it (ERR_WORKER_OUT_OF_MEMORY)
          for (;;) heap.push(Array.from({ length: 1 << 16 }, (_, i) => `${i}`));
        });
        faultPoint('checkpoint:frozen-hold', () => {
          // Said from here, past the refusal above (a line on the supervisor's stderr, written now), so a
          // test that stops the supervisor after this line knows the pass holds, not that it may still see the refusal.
          writeSync(2, `${JSON.stringify({ level: 20, time: Date.now(), msg: 'checkpoint:frozen-hold: the frozen pass holds' })}\n`);
          Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, testHooks.frozenHoldMs);
        });
        run();
        outcome = { frozen: true, ms: ms(), reason: null };
      }
    } catch (err) {
      if (err instanceof ScanError && err.code === 'scan_timeout') {
        outcome = {
          frozen: false,
          ms: ms(),
          reason: `the frozen pass took longer than checkpoint.freezeMaxMs (${req.freezeMaxMs} ms): thawed; the passes before it stand`,
        };
      } else failure = err;
    }
    let thawedHere = true;
    try {
      native().thaw(fd);
    } catch (err) {
      if (errnoCode(err) !== 'EINVAL') throw err;
      thawedHere = false; // not frozen any more: thawed by the supervisor (or someone) meanwhile
    }
    store.clearFrozen();
    Atomics.compareExchange(state, 0, FREEZE_HELD, FREEZE_IDLE);
    onFrozen(false);
    if (failure !== null) throw failure;
    if (!thawedHere && outcome.frozen) {
      outcome = {
        frozen: false,
        ms: outcome.ms,
        reason:
          'the file system was thawed before the frozen pass ended (by the supervisor past checkpoint.freezeMaxMs, or by someone else): it counts as an ordinary pass',
      };
    }
    return outcome;
  } finally {
    closeSync(fd);
  }
}

/** The test hook checkpointTouch (core/test-hooks.ts): a file that changes between passes exactly, instead of hoping a writer's timing lands there. */
function testTouch(root: string, pass: number): void {
  const spec = testHooks.checkpointTouch;
  if (!spec) return;
  const at = spec.lastIndexOf('@');
  const name = at > 0 ? spec.slice(0, at) : spec;
  const times = at > 0 ? Number(spec.slice(at + 1)) : Infinity;
  if (pass - 1 <= times) appendFileSync(`${root}/${name}`, 'x');
}

/** This boot's id (random(4) boot_id), read once per thread. */
let bootId: string | undefined;

/**
 * root's file system and mount, as a stat cache records it (passes.ts runCapture drops a cache
 * recorded under another): "<st_dev>:u<unique mount id>:<boot id>" (statx STATX_MNT_ID_UNIQUE,
 * Linux 6.8: a new one at every mount, never reused until the next boot), else
 * "<st_dev>:m<mnt_id>" (/proc/self/fdinfo: reused by a later mount, so an image mounted again
 * there may get the same; fsIdSurvivesRemount says which). Null when root cannot be opened.
 */
function fsOf(root: string): string | null {
  let fd: number;
  try {
    fd = openSync(root, constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW);
  } catch {
    return null; // the walk names what is wrong with the root (ScanError)
  }
  try {
    const dev = fstatSync(fd, { bigint: true }).dev;
    const mnt = mountIdOf(fd) ?? 'm?';
    return mnt.startsWith('u') ? `${dev}:${mnt}:${(bootId ??= readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim())}` : `${dev}:${mnt}`;
  } catch {
    return null;
  } finally {
    closeSync(fd);
  }
}

/** Whether a file system id of fsOf's names its mount uniquely (this boot's, never reused): only a stat cache recorded under one is kept on disk, for a restart (stat-cache.ts). */
export function fsIdSurvivesRemount(id: string): boolean {
  return /^\d+:u\d+:/.test(id);
}

/** The bytes a string of these UTF-8 bytes takes in RFC 8785 JSON: quotes, \" \\ \b \f \n \r \t as two, other controls as \u00XX. */
function jsonTextBytes(b: Buffer): number {
  let n = b.length + 2;
  for (let i = 0; i < b.length; i++) {
    const c = b[i];
    if (c === 0x22 || c === 0x5c || c === 0x08 || c === 0x0c || c === 0x0a || c === 0x0d || c === 0x09) n += 1;
    else if (c < 0x20) n += 5;
  }
  return n;
}

/** A name field's bytes in the manifest (manifest.ts nameFields), its comma included: `,"path":"<text>"`, or `,"path_b64":"<base64>"` for bytes that are not UTF-8. */
function nameFieldBytes(key: string, b: Buffer): number {
  return isUtf8(b) ? key.length + 4 + jsonTextBytes(b) : key.length + 10 + Math.ceil(b.length / 3) * 4;
}

const digits = (n: number | bigint): number => String(n).length;

/**
 * The bytes this walk entry's manifest entry takes (manifest.ts toManifestEntry, RFC 8785),
 * its comma included: exact but for a file's size, which is its size when read.
 */
export function entryJsonBytes(e: WalkEntry): number {
  const type = e.type === 'unknown' ? 'file' : e.type;
  // {"gid":G,"mode":M,"mtime_ns":"T",<path>,"size":S,"type":"<type>","uid":U}
  let n =
    1 +
    6 +
    digits(e.gid) +
    8 +
    digits(e.mode & 0o7777) +
    13 +
    digits(e.mtimeNs) +
    1 +
    nameFieldBytes('path', e.path) +
    8 +
    9 +
    type.length +
    8 +
    digits(e.uid) +
    1 +
    1;
  if (type === 'file')
    n += digits(e.size) + 11 + 64 + 1; // ,"sha256":"<hex>"
  else if (type === 'symlink') n += digits(e.linkTarget?.length ?? 0) + nameFieldBytes('target', e.linkTarget ?? Buffer.alloc(0));
  else if (type === 'char' || type === 'block') n += 1 + 8 + digits(e.rdev);
  else n += 1 + (e.mountPoint ? 13 : 0);
  return n;
}

/**
 * Waits until the racy margin of every file read within it has passed (Capture.racy: at most
 * 2.01 s, on whole-second timestamps), so the next pass's content check of each covers an
 * instant when a write would have moved its ctime; never past the capture's deadline.
 */
function waitOutRacy(cap: Capture, deadlineHrNs: bigint | null): void {
  let readyAtNs = 0n;
  for (const at of cap.racy.values()) if (at > readyAtNs) readyAtNs = at;
  for (;;) {
    const leftMs = Number(readyAtNs - BigInt(Date.now()) * 1_000_000n) / 1e6;
    if (leftMs <= 0) return;
    cap.checkDeadline();
    const toDeadlineMs = deadlineHrNs === null ? Infinity : Number(deadlineHrNs - process.hrtime.bigint()) / 1e6;
    Atomics.wait(sleeper, 0, 0, Math.max(1, Math.min(leftMs + 1, toDeadlineMs, 100)));
  }
}

/** A seed of at least this many entries trusts its objects by the fan directories' stats (LocalStoreFiles.namesKeptSince): past ~8 files per fan, a lookup per entry lists nearly every fan anyway. */
const SEED_TRUST_MIN_ENTRIES = 2048;

/**
 * Runs a capture in this thread (blocking). Throws ScanError (manifest_too_large, scan_timeout,
 * errno codes) / StoreError / errno errors. seed: the stat cache of the workspace's last
 * read-back checkpoint (stat-cache.ts): its first pass keeps an entry whose stat signature is
 * unchanged (a file whose object is still in the store) without reading it, and when nothing at
 * all differs from the seed, that pass is the last (see below). hints: paths (bytes, relative to
 * the root) the workspace journal says had events since the seed's checkpoint: looked at and
 * read before the first pass (hints.ts), so that pass can be the last when nothing else moved.
 */
export function runCapture(
  req: CaptureRequest,
  progress: (p: WorkerProgress['progress']) => void = () => {},
  onFrozen: (frozen: boolean) => void = () => {},
  seed?: CaptureSeed,
  hints?: readonly Buffer[],
): CaptureResult & { rootSig: string; rootFs: string; startedAtNs: bigint; vetted: ReadonlySet<CapturedEntry> } {
  const store = LocalStoreFiles.open(req.storeDir, { create: true, viaFd: req.storeFd });
  store.reserveBytes = req.reserveBytes;
  try {
    const deadlineHrNs = req.deadlineMs === undefined ? null : req.startHrNs + BigInt(Math.round(req.deadlineMs * 1e6));
    const cap = new Capture(store, progress, { hrNs: deadlineHrNs, ms: req.deadlineMs });
    // Pass 1 compares with the seed: what it has (stat unchanged, object there) is not read.
    // Another file system mounted at the root since: inode numbers mean other files.
    const rootFs = fsOf(req.root);
    if (seed && (rootFs === null || seed.rootFs !== rootFs)) seed = undefined;
    // Before any entry is looked at: what the stat cache may keep of this capture (stat-cache.ts offer).
    const startedAtNs = BigInt(Date.now()) * 1_000_000n;
    let prev: ReadonlyMap<string, CapturedEntry> | SeedOverlay | null = seed?.entries ?? new Map<string, CapturedEntry>();
    /** Pass 1: what differs from the seed (read, new, gone, the root); 0 with a seed: the tree is the seed's, still since then. */
    let seedDiffers = 0;
    let entries: CapturedEntry[] = [];
    let changed: Buffer[] = [];
    /** Files of the last walk a lease kept from being opened (in `changed` too). */
    let leased: Buffer[] = [];
    let pass = 0;
    let prevRootSig = seed?.rootSig ?? '';
    // What the journal says changed, read first: the first pass then finds it as captured.
    let vetted: ReadonlySet<CapturedEntry> = new Set();
    let hintedPaths = 0;
    let overlay: SeedOverlay | null = null;
    if (seed && hints && hints.length > 0) {
      cap.newPass();
      const pre = readHinted(req.root, hints, seed.entries, {
        entry: (e) => {
          const c = cap.entry(e);
          return c === LEASED ? null : c;
        },
        racyUntil: (c) => cap.racy.get(c),
        same: sameAsCaptured,
        checkDeadline: () => cap.checkDeadline(),
      });
      if (pre) {
        prev = overlay = pre.entries;
        prevRootSig = sigOf('dir', pre.rootSt);
        vetted = pre.vetted;
        hintedPaths = hints.length;
      }
    }
    // A big seed's objects are all still in the store when no fan directory lost a name since
    // the seed was made (its capture found or put each object in the listings it kept):
    // 256 stats instead of a lookup per entry. A small seed looks up each (fewer fans to list).
    const seedObjectsKept =
      seed?.presentIn?.storeDir === req.storeDir && seed.entries.size >= SEED_TRUST_MIN_ENTRIES && store.namesKeptSince(seed.presentIn.gen);
    let root: CaptureResult['root'] = { mode: 0, uid: 0, gid: 0, mtimeNs: 0n };
    const maxPasses = Math.max(2, req.maxPasses);
    /** Every walk is of the file system and mount the capture began on: one mounted at the root since (even the same image again) is another tree, never mixed with the passes before it. */
    const sameFs = () => {
      const now = fsOf(req.root);
      if (rootFs !== null && now !== null && now !== rootFs)
        throw new ScanError(
          'fs_changed',
          `fs_changed: ${req.root} is another file system or mount than when this checkpoint began (${now}, was ${rootFs}): something was mounted or unmounted there; checkpoint again`,
        );
    };
    /** One walk: entries whose stat (and with verifyContent, content) did not move are kept, the rest captured again. */
    const walkOnce = (frozen?: { startHrNs: bigint; ms: number }) => {
      sameFs();
      prev ??= new Map(entries.map((c) => [c.key, c]));
      const current: CapturedEntry[] = [];
      const from = prev;
      /** Entries of `from` this walk found (all found: none went; else they are looked for after it), and the paths it walked but left out of `current`. */
      let found = 0;
      const leftOut: Buffer[] = [];
      changed = [];
      leased = [];
      cap.newPass();
      const rootSt = lstatSync(req.root, { bigint: true });
      const rootSig = sigOf('dir', rootSt);
      if (pass > 1 && rootSig !== prevRootSig) changed.push(Buffer.from('.'));
      if (pass === 1 && rootSig !== prevRootSig) seedDiffers++;
      let manifestBytes = 0;
      const maxManifest = req.maxManifestBytes ?? Infinity;
      prevRootSig = rootSig;
      root = { mode: Number(rootSt.mode) & 0o7777, uid: Number(rootSt.uid), gid: Number(rootSt.gid), mtimeNs: rootSt.mtimeNs };
      const bound = frozen ? { deadlineMs: frozen.ms, startHrNs: frozen.startHrNs } : { deadlineMs: req.deadlineMs, startHrNs: req.startHrNs };
      // Looked up in the last walk's order (a map lookup per entry was a tenth of an unchanged walk).
      const order = new WalkOrder(from);
      /**
       * A listed entry that is the next of the last walk's, unchanged, is kept from its row, with
       * no object made for it: the same test as below, where anything else goes (a link, one
       * whose manifest bytes are not known yet, one read within its racy margin, with
       * verifyContent, past the manifest's bound: there it is said).
       */
      const keepListed = (row: ListedRow): boolean => {
        const old = order.next(row);
        if (old === undefined || old.moved || old.jsonBytes === undefined || !sameAsListed(old, row) || cap.racy.has(old)) return false;
        if (pass === 1 && old.type === 'file' && !seedObjectsKept && !store.hasOwnObject(old.sha256!)) return false;
        if (manifestBytes + old.jsonBytes > maxManifest) return false;
        heapTick();
        order.advance();
        found++;
        manifestBytes += old.jsonBytes;
        current.push(old);
        return true;
      };
      const walk = { ...bound, oneFileSystem: true, expectFs: req.expectFs, keep: req.verifyContent ? undefined : keepListed };
      for (const e of walkTree(req.root, walk)) {
        heapTick();
        const old = order.find(e.path);
        if (old) found++;
        // From the seed (pass 1), a file's object must still be in the store (gc may have taken it).
        const kept =
          old !== undefined &&
          !old.moved &&
          sameAsCaptured(old, e) &&
          (pass > 1 || old.type !== 'file' || seedObjectsKept || store.hasOwnObject(old.sha256!)) &&
          (!req.verifyContent || old.type !== 'file' || cap.sameContent(e, old.sha256!)) &&
          // Read within its racy margin: its stat alone does not say it is unchanged; its
          // content, read again past the margin (or while frozen), does (then it is no more racy).
          (req.verifyContent || !cap.racy.has(old) || (cap.sameContent(e, old.sha256!) && cap.racy.delete(old)));
        // An entry's manifest bytes are counted once and kept with it: they depend only on what
        // sameAsCaptured compares and the path (a mount point's are not kept: it does not compare that).
        const jsonBytes = kept && !e.mountPoint ? (old.jsonBytes ??= entryJsonBytes(e)) : entryJsonBytes(e);
        manifestBytes += jsonBytes;
        if (manifestBytes > maxManifest) {
          throw new ScanError(
            'manifest_too_large',
            `manifest_too_large: the manifest of ${req.root} would be over checkpoint.maxManifestBytes (${maxManifest} bytes) at entry ${current.length + 1} (${showPath(e.path, 80)}, depth ${e.depth}): a manifest lists every entry with its whole path; raise the bound (and checkpoint.workerHeapMiB with it) or checkpoint a smaller tree`,
          );
        }
        if (kept) {
          current.push(old);
          continue;
        }
        if (pass === 1) seedDiffers++;
        const c = cap.entry(e);
        if (c === LEASED) {
          // Not read in this pass: what an earlier pass captured of it stands (its object holds exactly that), else it is left out.
          changed.push(e.path);
          leased.push(e.path);
          // Pass 1's `old` is the stat cache's, from before the file changed: never stands in.
          if (old && pass > 1) current.push(old);
          else leftOut.push(e.path);
          continue;
        }
        if (pass > 1 || c === null || c.moved) changed.push(e.path);
        if (c && !e.mountPoint && sameAsCaptured(c, e)) c.jsonBytes = jsonBytes;
        if (c) current.push(c);
        else leftOut.push(e.path);
        cap.tick(pass, current.length);
      }
      if (found < from.size) {
        // Gone since `from`: neither kept nor walked (one walked and left out is in `changed` already).
        const seen = new Set(current.map((c) => c.key));
        for (const p of leftOut) seen.add(p.toString('latin1'));
        for (const k of from.keys()) {
          if (seen.has(k)) continue;
          if (pass > 1) changed.push(Buffer.from(k, 'latin1'));
          if (pass === 1 && seed) seedDiffers++;
        }
      }
      sameFs(); // a mount swapped during the walk: what it found is of both
      entries = current;
      prev = null; // made from `entries` only if another pass follows
    };
    let keptSeed = false;
    let keptOverlay: SeedOverlay | null = null;
    while (pass < maxPasses) {
      pass++;
      if (pass > 1) {
        waitOutRacy(cap, deadlineHrNs);
        testTouch(req.root, pass);
        faultPoint('checkpoint:pass-hold', () => {
          writeSync(2, `${JSON.stringify({ level: 20, time: Date.now(), msg: 'checkpoint:pass-hold: the next pass waits' })}\n`);
          Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, testHooks.frozenHoldMs);
        });
      }
      walkOnce();
      if (pass > 1 && changed.length === 0) break;
      // A first pass that found the seed exactly (no entry read, none new or gone, the root
      // unchanged, no lease) is still: the seed's entries were unchanged from their capture
      // to the seed's last pass, and from then to their check now (stat unchanged; ctime
      // never goes back), so every interval holds the instant before this pass.
      if (pass === 1 && seed && seedDiffers === 0 && changed.length === 0) {
        keptSeed = hintedPaths === 0;
        keptOverlay = hintedPaths === 0 ? null : overlay;
        break;
      }
    }
    let freeze: CaptureResult['freeze'] = null;
    if (req.freezeMaxMs && req.freezeMaxMs > 0) {
      freeze = frozenPass(req, store, onFrozen, () => {
        const startHrNs = process.hrtime.bigint();
        cap.bound(startHrNs + BigInt(req.freezeMaxMs!) * 1_000_000n, req.freezeMaxMs!);
        pass++;
        const before = changed;
        try {
          walkOnce({ startHrNs, ms: req.freezeMaxMs! });
        } catch (err) {
          changed = before; // the passes before stand
          pass--;
          throw err;
        }
      });
      // Captured while nothing could change: consistent, but for files a lease kept unread.
      if (freeze.frozen) changed = leased;
      keptSeed = false;
      keptOverlay = null;
      cap.bound(deadlineHrNs, req.deadlineMs);
    }
    // The trees, bottom-up, committed with the files' objects (one syncfs for all).
    const trees = cap.trees(entries, seed?.trees);
    cap.commit();
    let files = 0;
    let bytes = 0;
    for (const e of entries) {
      if (e.type !== 'file') continue;
      files++;
      bytes += e.size;
    }
    return {
      freeze,
      root,
      entries,
      unstable: changed,
      leased,
      passes: pass,
      files,
      bytes,
      objectsWritten: cap.objectsWritten,
      bytesWritten: cap.bytesWritten,
      bytesHashed: cap.bytesHashed,
      filesRead: cap.filesRead,
      trees,
      written: cap.written,
      hintedPaths,
      keptSeed,
      keptOverlay,
      presentIn: { storeDir: req.storeDir, gen: store.removalGen() },
      rootSig: prevRootSig,
      rootFs: rootFs ?? '',
      startedAtNs,
      vetted,
    };
  } finally {
    store.abandonObjects(); // nothing is left once committed; a failed capture's temp files go
    store.close();
  }
}

export interface RehashRequest {
  kind: 'rehash';
  storeDir: string;
  storeFd: number;
  /** [sha256, size] of each object to read back. */
  objects: [string, number][];
  /**
   * An object whose file's stat signature (objectSig) is one this says was re-hashed before
   * is confirmed by that stat and not read (checkpoint.readBack 'changed'); absent: every
   * object is re-hashed. onRehashed: told of each object that re-hashed as its name.
   */
  trusted?: (sha256: string, sig: string) => boolean;
  onRehashed?: (sha256: string, sig: string) => void;
  /** Of `objects`, the tree objects (manifest version 2): counted apart, in `trees`. */
  trees?: ReadonlySet<string>;
}

export interface RehashResult {
  /** Objects checked (present, a regular file, its size) but trees, and the bytes they hold. */
  objects: number;
  bytes: number;
  /** Of those, re-read and re-hashed now (the rest were confirmed by their file's stat). */
  rehashedObjects: number;
  rehashedBytes: number;
  /** The tree objects checked, and of those re-hashed now. */
  trees: { objects: number; rehashedObjects: number };
  problems: { sha256: string; problem: string }[];
}

/** Threads reading and hashing a fan directory's objects at once in the read-back (git's preload-index: up to four). */
const REHASH_THREADS = Math.max(1, Math.min(4, availableParallelism()));

/** Objects to look at in one fan directory from which it is listed whole (fewer: an lstat each, which costs about twice a listed entry; a fan holds ~400 objects at 100,000). */
const LIST_FAN_FROM = 32;

/** An open object file's stat signature (local-store.ts objectSigOf). */
export function objectSig(fd: number): string {
  return objectSigOf(fstatSync(fd, { bigint: true }));
}

/** Re-reads and re-hashes each object (blocking; with req.trusted, those it trusts by stat are only checked); what differs is a problem naming the object, never thrown. */
export function runRehash(req: RehashRequest): RehashResult {
  const store = LocalStoreFiles.open(req.storeDir, { create: false, viaFd: req.storeFd });
  const problems: RehashResult['problems'] = [];
  let bytes = 0;
  let rehashedObjects = 0;
  let rehashedBytes = 0;
  const trees = { objects: 0, rehashedObjects: 0 };
  try {
    // In name order: one fan directory after another (each listed and opened once).
    const objects = [...req.objects].sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
    const toCheck = new Map<string, number>(); // per fan: objects to look at
    for (const [sha256] of objects) toCheck.set(sha256.slice(0, 2), (toCheck.get(sha256.slice(0, 2)) ?? 0) + 1);
    // Trusted by stat: a fan with many objects to look at is listed once with their lstat (no
    // open per object: 3.2 s of an unchanged 100,000-object read-back went to open, fstat and
    // close); a few are each lstat'ed (a fan lists ~400 objects at 100,000). Only the current
    // fan's listing is kept.
    let listing: { fan: string; objects: Map<string, ListedObject> | null } | null = null;
    const listed = (sha256: string): ListedObject | undefined => {
      const fan = sha256.slice(0, 2);
      if ((toCheck.get(fan) ?? 0) < LIST_FAN_FROM) return store.statObject(sha256);
      if (listing?.fan !== fan) listing = { fan, objects: store.listObjects(sha256) };
      return listing.objects?.get(sha256);
    };
    /** What was read of an object (its digest, bytes) judged against its name and the manifest's size. */
    const judge = (sha256: string, size: number, tree: boolean, got: string, pos: number, sig: string) => {
      if (tree) trees.rehashedObjects++;
      else {
        bytes += pos;
        rehashedObjects++;
        rehashedBytes += pos;
      }
      if (got !== sha256) problems.push({ sha256, problem: `object ${sha256} reads back as ${got} (${pos} bytes): its bytes changed in the store` });
      else if (pos !== size) problems.push({ sha256, problem: `object ${sha256} holds ${pos} bytes, the manifest says ${size}` });
      else req.onRehashed?.(sha256, sig);
    };
    const failed = (sha256: string, err: unknown) =>
      problems.push({ sha256, problem: err instanceof StoreError ? err.message : `object ${sha256}: ${(err as Error).message}` });
    /** An object too big for one buffer (or one grown past it, or changed while it was read whole): opened and read in blocks, to its end. */
    const inBlocks = (sha256: string, size: number, tree: boolean) => {
      let opened: { fd: number; size: number };
      try {
        opened = store.openObject(sha256);
      } catch (err) {
        failed(sha256, err);
        return;
      }
      try {
        const sig = req.trusted || req.onRehashed ? objectSig(opened.fd) : '';
        if (req.trusted?.(sha256, sig) && opened.size === size) {
          if (!tree) bytes += size;
          return;
        }
        const { sha256: got, bytes: pos } = hashFd(opened.fd);
        judge(sha256, size, tree, got, pos, sig);
      } finally {
        closeSync(opened.fd);
      }
    };
    // One fan directory at a time: what is not trusted by its stat is read whole and hashed, a
    // fan's small objects at once on threads (each read in one call: open, fstat, read, fstat,
    // close); a big one in blocks.
    for (let i = 0; i < objects.length;) {
      const fan = objects[i]![0].slice(0, 2);
      const whole: { sha256: string; size: number; tree: boolean }[] = [];
      for (; i < objects.length && objects[i]![0].slice(0, 2) === fan; i++) {
        const [sha256, size] = objects[i]!;
        const tree = req.trees?.has(sha256) === true;
        if (tree) trees.objects++;
        if (req.trusted) {
          const l = listed(sha256);
          // A regular file of the size the manifest says, its stat the one it was re-hashed with.
          if (l?.regular && l.size === size && req.trusted(sha256, l.sig)) {
            if (!tree) bytes += size;
            continue;
          }
        }
        if (size <= SMALL_FILE_BYTES) whole.push({ sha256, size, tree });
        else inBlocks(sha256, size, tree);
      }
      if (whole.length === 0) continue;
      let got: ReturnType<LocalStoreFiles['hashObjectsWhole']>;
      try {
        // A buffer of the largest one's size and a byte: an object grown past it is read in blocks.
        got = store.hashObjectsWhole(
          whole.map((w) => w.sha256),
          whole.reduce((m, w) => Math.max(m, w.size), 0) + 1,
          REHASH_THREADS,
        );
      } catch (err) {
        for (const w of whole) failed(w.sha256, err);
        continue;
      }
      got.forEach((g, k) => {
        const { sha256, size, tree } = whole[k]!;
        if (g instanceof Error) failed(sha256, g);
        else if (g === null) inBlocks(sha256, size, tree);
        else if (req.trusted?.(sha256, g.sig) && g.size === size) {
          if (!tree) bytes += size;
        } else judge(sha256, size, tree, g.read, g.bytes, g.sig);
      });
      heapTick(whole.length);
    }
  } finally {
    store.close();
  }
  return { objects: req.objects.length - trees.objects, bytes, rehashedObjects, rehashedBytes, trees, problems };
}
