// The workspace walker: every entry under a root, reached through directory fds, so depth is bounded by the
// kernel and the fd limit (one fd per level), never by PATH_MAX; symlinks are entries (lstat, readlink),
// never followed. Owns the walk and its errors; not what a scan makes of the entries (supervisor/workspace/digest.ts), nor threads
// (supervisor/workspace/scan.ts runs it in a worker: it blocks). See openat(2), open(2) O_NOFOLLOW/O_DIRECTORY, proc(5)
// /proc/self/fd, path_resolution(7).
import { closeSync, constants, fstatSync, lstatSync, openSync, readdirSync, readFileSync, readlinkSync, statSync, type BigIntStats } from 'node:fs';
import { availableParallelism, endianness } from 'node:os';
import { nativeOrNull, timeNsAt, type NativeHelpers } from './native.js';
import { showPath } from './names.js';
import { errnoCode, errnoName, systemError } from '../../ipc/errno.js';

export type EntryType = 'file' | 'dir' | 'symlink' | 'fifo' | 'socket' | 'char' | 'block' | 'unknown';

/** The lstat fields the walk yields (what BigIntStats gives, from the listing or an lstat). */
export interface StatFacts {
  /** st_mode: type and permission bits. */
  mode: number;
  uid: number;
  gid: number;
  nlink: bigint;
  dev: bigint;
  ino: bigint;
  /** st_size in bytes (a symlink: its target's length). */
  size: bigint;
  /** st_blocks: 512-byte blocks allocated (fewer than size / 512: a sparse file). */
  blocks: bigint;
  /** st_rdev: the device a char/block special file names (0 for other types). */
  rdev: bigint;
  mtimeNs: bigint;
  ctimeNs: bigint;
}

/** One entry under the root, as lstat saw it (for a directory: fstat of the fd it was walked through). */
export interface WalkEntry extends StatFacts {
  /** Relative path, '/'-separated bytes (no leading "./"). */
  path: Buffer;
  /** The last component, bytes. */
  name: Buffer;
  /** 1 for an entry directly under the root. */
  depth: number;
  type: EntryType;
  /** A symlink's target, bytes as stored (readlink, never resolved); null for any other type. */
  linkTarget: Buffer | null;
  /** The fd of the directory that holds the entry; valid only until the walk is resumed (see pathAt). */
  dirFd: number;
  /** With oneFileSystem: a directory another file system is mounted on, yielded and not entered. */
  mountPoint?: true;
}

/** Why a walk stopped: `code` is an errno name (ENOENT, ENOTDIR, ELOOP, EACCES, EMFILE, ...), scan_timeout or scan_failed. */
export class ScanError extends Error {
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
    this.name = 'ScanError';
  }
}

/**
 * The watched file system a walk must be of (the watcher's record of its workspace at start):
 * st_dev, and for the workspace root itself its mount id (a bind mount of the same file system
 * over it has the same st_dev, and so has the same image mounted there again). `workspace`
 * names it in messages.
 */
export interface FsIdentity {
  workspace: string;
  dev: bigint;
  /** The root's mount id (mountIdOf); null: only st_dev is compared (a directory inside the workspace). */
  mntId: string | null;
}

/**
 * The id of the mount fd was opened through: "u<id>", statx(2)'s STATX_MNT_ID_UNIQUE (Linux
 * 6.8: a new one at every mount, never reused until the next boot), else "m<id>", proc(5)'s
 * /proc/self/fdinfo `mnt_id:` (reused: a mount made after one is gone may get its id, so the
 * same image unmounted and mounted again may look unchanged); null when neither says.
 */
export function mountIdOf(fd: number): string | null {
  try {
    const unique = nativeOrNull()?.mountIdUnique(fd) ?? null;
    if (unique !== null) return `u${unique}`;
  } catch {
    // an older addon: /proc's below
  }
  try {
    const m = /^mnt_id:\s*(\d+)$/m.exec(readFileSync(`/proc/self/fdinfo/${fd}`, 'latin1'));
    return m ? `m${m[1]}` : null;
  } catch {
    return null;
  }
}

/** ScanError fs_changed unless the directory fd (root, by path) is on the file system (and mount) expect names: something mounted over it since. */
export function checkFsIdentity(fd: number, root: string, expect: FsIdentity): void {
  const dev = fstatSync(fd, { bigint: true }).dev;
  const isRoot = root === expect.workspace;
  const what = isRoot ? `the workspace ${root}` : `${root} (in workspace ${expect.workspace})`;
  if (dev !== expect.dev) {
    throw new ScanError(
      'fs_changed',
      `fs_changed: ${what} is now another file system: something is mounted over it (st_dev ${dev}, the watched one's ${expect.dev}); only the watched file system is captured`,
    );
  }
  if (expect.mntId === null) return;
  const mnt = mountIdOf(fd);
  if (mnt !== null && mnt !== expect.mntId) {
    throw new ScanError(
      'fs_changed',
      `fs_changed: ${what} is now another mount: something is mounted over it (mount id ${mnt}, the watched one's ${expect.mntId}); only the watched tree is captured`,
    );
  }
}

export interface WalkOptions {
  /** The root must be of this file system (and mount): ScanError fs_changed if it is not (something mounted over it). */
  expectFs?: FsIdentity;
  /** The walk fails with scan_timeout once this many ms have passed since startHrNs. */
  deadlineMs?: number;
  /** process.hrtime.bigint() when the deadline started (default: now); the same clock in every thread. */
  startHrNs?: bigint;
  /** Do not descend into another file system (find -xdev, tar --one-file-system): a mount point is yielded as the directory it is, never entered. */
  oneFileSystem?: boolean;
  /**
   * Asked first of each entry taken from a directory's native listing (anything but a directory,
   * and a link still one when read), before any object is made for it: true, and the entry is
   * not yielded (the caller has it as it is). The row is the walk's own, valid only during the call.
   */
  keep?: (row: ListedRow) => boolean;
}

/**
 * An entry of a directory's native listing as it is held there (WalkOptions.keep): one object
 * per walk, moved to each entry in turn. Its path is dirRel, '/' (dirRel not empty) and
 * names[nameStart, nameEnd); its lstat fields are stats[at + SD.*], those of 32 bits also
 * small32(words, at + SD.*), the others int64Number(words, at + SD.*) as numbers.
 */
export interface ListedRow {
  dirRel: Buffer;
  names: Buffer;
  nameStart: number;
  nameEnd: number;
  stats: BigInt64Array;
  words: Int32Array;
  at: number;
  mode: number;
  type: EntryType;
  /** A link's target length (its bytes follow the name in names); -1 none. */
  targetLen: number;
  depth: number;
  dirFd: number;
}

// Node has no openat/fstatat. Every call names `/proc/self/fd/<dirfd>/<name>`: the kernel
// jumps through the magic link to the directory the fd pins (renamed or not), then looks up
// <name> in it, one component; the path stays short at any depth. The magic link is not the
// last component, so it is followed; <name> is the last component, so lstat and readlink act
// on the entry itself, and open(O_DIRECTORY|O_NOFOLLOW) of a symlink fails (ENOTDIR, not the
// ELOOP open(2) names: with O_NOFOLLOW the lookup stops at the link, and the O_DIRECTORY check
// comes first), also for one planted after the lstat: a symlink to / or a loop is never walked;
// a fifo or device fails the same way, never opened. Chosen over openat in the C addon: the
// same syscalls per entry, bigint ns stats and Buffer names from node:fs, no async-work glue
// in C; the cost is a /proc lookup per entry and needing /proc (checked at the start of walkTree).
const OPEN_DIR = constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW | constants.O_NONBLOCK;
const SLASH = Buffer.from('/');
/** The walk reads the clock for its deadline at every DEADLINE_EVERY-th entry (a power of two), the first included. */
const DEADLINE_EVERY = 64;

/**
 * The path of `name` inside the directory dirFd is open on, as node:fs takes it (node has no
 * openat/renameat): /proc/self/fd/<dirFd>/<name>, the magic link the kernel resolves to the
 * directory opened (proc(5)). A Buffer name (bytes that need not be UTF-8) gives a Buffer.
 */
export function pathAt(dirFd: number, name: string): string;
export function pathAt(dirFd: number, name: Buffer): Buffer;
export function pathAt(dirFd: number, name: string | Buffer): string | Buffer;
export function pathAt(dirFd: number, name: string | Buffer): string | Buffer {
  return typeof name === 'string' ? `/proc/self/fd/${dirFd}/${name}` : Buffer.concat([Buffer.from(`/proc/self/fd/${dirFd}/`), name]);
}

/** Opens the directory <name> in dirFd, never through a symlink; throws ENOTDIR (a symlink, fifo, file...), ENOENT, EACCES... */
export function openDirAt(dirFd: number, name: Buffer): number {
  return openSync(pathAt(dirFd, name), OPEN_DIR);
}

/** An lstat's entry type (node:fs BigIntStats). */
export function typeOf(st: BigIntStats): EntryType {
  if (st.isFile()) return 'file';
  if (st.isDirectory()) return 'dir';
  if (st.isSymbolicLink()) return 'symlink';
  if (st.isFIFO()) return 'fifo';
  if (st.isSocket()) return 'socket';
  if (st.isCharacterDevice()) return 'char';
  if (st.isBlockDevice()) return 'block';
  return 'unknown';
}

/** The error a failed call becomes, naming the entry (relative) and what to do about EMFILE. */
function scanError(err: unknown, what: string, rel: Buffer, depth: number, root: string): ScanError {
  if (err instanceof ScanError) return err;
  const e = systemError(err);
  const code = e.code ?? 'scan_failed';
  const where = rel.length === 0 ? `the workspace root ${root}` : `${showPath(rel)} (depth ${depth}) in ${root}`;
  let text = `${code}: ${what} ${where} failed`;
  if (code === 'EMFILE' || code === 'ENFILE') text += ': the walk holds one fd per directory level; raise the open-files limit (LimitNOFILE, ulimit -n)';
  else if (!e.code) text += `: ${e.message}`;
  return new ScanError(code, text);
}

const LITTLE_ENDIAN = endianness() === 'LE';

/** The native listing, or null where the addon cannot be loaded (then readdir and an lstat per entry). */
let statDir: ((fd: number) => ReturnType<NativeHelpers['statDir']>) | null | undefined;
function nativeStatDir(): typeof statDir {
  if (statDir === undefined) {
    const n = nativeOrNull();
    statDir = n && typeof n.statDir === 'function' ? (fd) => n.statDir(fd) : null;
  }
  return statDir;
}

/** Field offsets in statDirRaw's stats (native-helpers/src/statdir.h SD_*). */
export const SD = {
  errno: 0,
  mode: 1,
  uid: 2,
  gid: 3,
  nlink: 4,
  dev: 5,
  ino: 6,
  size: 7,
  blocks: 8,
  rdev: 9,
  mtimeNs: 10,
  ctimeNs: 11,
  targetLen: 12,
  mtimeSec: 13,
  mtimeNsec: 14,
  ctimeSec: 15,
  ctimeNsec: 16,
} as const;

/**
 * The native listing of dirFd as it comes, for callers that want no object per entry: entry
 * i's name is names[nameStart[i] .. nameEnd[i]) and its lstat fields are stats[i * fields +
 * SD.*] (SD.errno not 0: that entry's lstat failed). null without the native helper.
 */
export function statDirRaw(
  dirFd: number,
): { count: number; fields: number; stats: BigInt64Array; names: Buffer; nameStart: Uint32Array; nameEnd: Uint32Array; words: Int32Array } | null {
  const sd = nativeStatDir();
  if (!sd) return null;
  return rawListing(sd(dirFd));
}

/** A native listing with each entry's name located (statDirRaw). */
function rawListing(r: ReturnType<NativeHelpers['statDir']>): NonNullable<ReturnType<typeof statDirRaw>> {
  const nameStart = new Uint32Array(r.count);
  const nameEnd = new Uint32Array(r.count);
  // The stats as 32-bit words too: a field that fits in 32 bits (errno, mode, uid, gid, a
  // link's target length) is read as a number (small32), with no BigInt made for it.
  const words = new Int32Array(r.stats.buffer, r.stats.byteOffset, r.stats.length * 2);
  let pos = 0;
  for (let i = 0; i < r.count; i++) {
    const len = LITTLE_ENDIAN ? r.names.readUInt16LE(pos) : r.names.readUInt16BE(pos); // host order (statdir.c)
    nameStart[i] = pos + 2;
    nameEnd[i] = pos + 2 + len;
    const tlen = small32(words, i * r.fields + SD.targetLen);
    pos += 2 + len + (tlen > 0 ? tlen : 0);
  }
  return { count: r.count, fields: r.fields, stats: r.stats, names: r.names, nameStart, nameEnd, words };
}

/** The low 32-bit word of int64 field k of a native listing's stats (statDirRaw words): exact, signed, for a field whose value fits in 32 bits (errno, mode, a link's target length; uid and gid read `>>> 0`). */
export function small32(words: Int32Array, k: number): number {
  return words[2 * k + LOW_WORD]!;
}
const LOW_WORD = LITTLE_ENDIAN ? 0 : 1;

/** Int64 field k of a native listing's stats as a number, with no BigInt made: what Number() of the BigInt gives (exact up to 2^53, else the same nearest double). */
export function int64Number(words: Int32Array, k: number): number {
  return words[2 * k + 1 - LOW_WORD]! * 4294967296 + (words[2 * k + LOW_WORD]! >>> 0);
}

/** The entry a listed row is (ListedRow), at path rel, its name a view of rel's end. */
export function listedEntry(row: ListedRow, rel: Buffer, name: Buffer): WalkEntry {
  const v = row.stats;
  const b = row.at;
  // Every field named (one shape, no spread): the walk's commonest entry.
  return {
    path: rel,
    name,
    depth: row.depth,
    type: row.type,
    mode: row.mode,
    uid: small32(row.words, b + SD.uid) >>> 0,
    gid: small32(row.words, b + SD.gid) >>> 0,
    nlink: v[b + SD.nlink],
    dev: v[b + SD.dev],
    ino: v[b + SD.ino],
    size: v[b + SD.size],
    blocks: v[b + SD.blocks],
    rdev: v[b + SD.rdev],
    mtimeNs: timeNsAt(v, b + SD.mtimeNs, b + SD.mtimeSec),
    ctimeNs: timeNsAt(v, b + SD.ctimeNs, b + SD.ctimeSec),
    linkTarget: row.targetLen >= 0 ? Buffer.from(row.names.subarray(row.nameEnd, row.nameEnd + row.targetLen)) : null,
    dirFd: row.dirFd,
  };
}

/** The type of an lstat st_mode (its S_IFMT bits). */
export function typeOfMode(mode: number): EntryType {
  return TYPE_OF_MODE[mode & S_IFMT] ?? 'unknown';
}

/** The native listing of several directories at once (NativeHelpers statDirs), or null without it. */
let statDirs: NativeHelpers['statDirs'] | null | undefined;
function nativeStatDirs(): typeof statDirs {
  if (statDirs === undefined) {
    const n = nativeOrNull();
    statDirs = n && typeof n.statDirs === 'function' ? (fds, threads) => n.statDirs(fds, threads) : null;
  }
  return statDirs;
}

/** Threads listing a batch of directories at once (the walk's read-ahead: git's preload-index). */
const AHEAD_THREADS = Math.max(1, Math.min(4, availableParallelism()));
/** Sibling directories opened and listed ahead at a time, and at most this many fds held ahead in the whole walk. */
const AHEAD_BATCH = 32;
const AHEAD_MAX_FDS = 64;

/** A directory opened and listed ahead of the walk reaching it: its fd, its fstat once opened, its listing. */
interface Ahead {
  fd: number;
  st: BigIntStats;
  listing: Listing;
}

/** A directory's listing as the walk keeps it: the native one as it comes (no object per entry until one is reached), else the names alone. */
interface Listing {
  raw: NonNullable<ReturnType<typeof statDirRaw>> | null;
  /** Without the native helper: the names, each lstat'ed when it is reached. */
  names: Buffer[];
  count: number;
}

/** A directory on the walk's stack before it is listed (its fd is on the stack, so it is closed if the listing fails). */
const UNLISTED: Listing = { raw: null, names: [], count: 0 };

/**
 * The names in the directory dirFd, sorted bytewise ("." and ".." left out), and with the
 * native helper each one's lstat as listed (one call per directory: fstatat relative to the
 * fd, no /proc path per entry).
 */
function listDir(dirFd: number): Listing {
  const raw = statDirRaw(dirFd);
  if (raw) return { raw, names: [], count: raw.count };
  const names = readdirSync(`/proc/self/fd/${dirFd}`, { encoding: 'buffer' }).sort(Buffer.compare);
  return { raw: null, names, count: names.length };
}

/** The walk's stat fields of an lstat/fstat (node:fs BigIntStats). */
export function statFacts(st: BigIntStats): StatFacts {
  return {
    mode: Number(st.mode),
    uid: Number(st.uid),
    gid: Number(st.gid),
    nlink: st.nlink,
    dev: st.dev,
    ino: st.ino,
    size: st.size,
    blocks: st.blocks,
    rdev: st.rdev,
    mtimeNs: st.mtimeNs,
    ctimeNs: st.ctimeNs,
  };
}

const S_IFMT = 0o170000;
const TYPE_OF_MODE: Record<number, EntryType> = {
  0o100000: 'file',
  0o040000: 'dir',
  0o120000: 'symlink',
  0o010000: 'fifo',
  0o140000: 'socket',
  0o020000: 'char',
  0o060000: 'block',
};

/**
 * Every entry under root, depth first, pre-order, names sorted bytewise; never the root itself.
 * Synchronous and blocking (run it in a worker). Throws ScanError: the root missing (ENOENT),
 * not a directory (ENOTDIR), a symlink (ELOOP), unreadable (EACCES), EMFILE, scan_timeout.
 * An entry removed while the walk runs is left out; a directory swapped for a symlink after its
 * lstat is recorded as the symlink. Every fd is closed when the walk ends, fails or is abandoned.
 */
export function* walkTree(root: string, options: WalkOptions = {}): Generator<WalkEntry, void, undefined> {
  const startHrNs = options.startHrNs ?? process.hrtime.bigint();
  const deadlineHrNs = options.deadlineMs === undefined ? null : startHrNs + BigInt(Math.round(options.deadlineMs * 1e6));
  const none = Buffer.alloc(0);
  let rootFd: number;
  try {
    rootFd = openSync(root, OPEN_DIR);
  } catch (err) {
    if (errnoCode(err) === 'ELOOP' || errnoCode(err) === 'ENOTDIR') {
      let link = false;
      try {
        link = lstatSync(root).isSymbolicLink();
      } catch {
        // gone meanwhile: not a directory either way
      }
      if (link) throw new ScanError('ELOOP', `ELOOP: the workspace root ${root} is a symlink; a workspace is walked, never followed`);
      throw new ScanError('ENOTDIR', `ENOTDIR: the workspace root ${root} is not a directory`);
    }
    throw scanError(err, 'opening', none, 0, root);
  }
  const stack: { fd: number; rel: Buffer; depth: number; listing: Listing; next: number; ahead: Map<number, Ahead> | null; aheadTo: number }[] = [
    { fd: rootFd, rel: none, depth: 1, listing: UNLISTED, next: 0, ahead: null, aheadTo: 0 },
  ];
  /** Fds held by read-ahead listings not reached yet (at most AHEAD_MAX_FDS). */
  let aheadFds = 0;
  const listMany = nativeStatDirs();
  /**
   * Opens and lists, all at once on AHEAD_THREADS threads, up to AHEAD_BATCH of the
   * directories listed in `dir` from entry `from` on (as its listing typed them), each as the
   * walk would when it reaches it (opened O_DIRECTORY|O_NOFOLLOW through dir's fd, fstat'ed,
   * listed); a mount point, and one that fails to open or list, is left to the walk, which
   * then does it itself and says why. Taken in the walk, so every look is still inside it.
   */
  const readAhead = (dir: (typeof stack)[number], from: number): void => {
    const raw = dir.listing.raw!;
    const taken: { i: number; fd: number; st: BigIntStats }[] = [];
    let j = from;
    for (; j < raw.count && taken.length < AHEAD_BATCH && aheadFds + taken.length < AHEAD_MAX_FDS; j++) {
      const b = j * raw.fields;
      if (small32(raw.words, b + SD.errno) !== 0 || (small32(raw.words, b + SD.mode) & S_IFMT) !== 0o040000) continue;
      let fd = -1;
      try {
        fd = openDirAt(dir.fd, Buffer.from(raw.names.subarray(raw.nameStart[j], raw.nameEnd[j])));
        const st = fstatSync(fd, { bigint: true });
        if (options.oneFileSystem && st.dev !== rootDev) {
          closeSync(fd);
          continue;
        }
        taken.push({ i: j, fd, st });
      } catch {
        if (fd >= 0) closeSync(fd);
      }
    }
    dir.aheadTo = j; // each entry tried once
    if (taken.length === 0) return;
    let listed: ReturnType<NativeHelpers['statDirs']>;
    try {
      listed = listMany!(
        Int32Array.from(taken, (t) => t.fd),
        AHEAD_THREADS,
      );
    } catch (err) {
      for (const t of taken) closeSync(t.fd);
      throw err;
    }
    dir.ahead ??= new Map();
    for (let k = 0; k < taken.length; k++) {
      const r = listed[k]!;
      const t = taken[k]!;
      if ('errno' in r) {
        closeSync(t.fd);
        continue;
      }
      dir.ahead.set(t.i, { fd: t.fd, st: t.st, listing: { raw: rawListing(r), names: [], count: r.count } });
      aheadFds++;
    }
  };
  const dropAhead = (dir: (typeof stack)[number]): void => {
    if (!dir.ahead) return;
    for (const a of dir.ahead.values()) closeSync(a.fd);
    aheadFds -= dir.ahead.size;
    dir.ahead = null;
  };
  const keep = options.keep;
  /** The listed entry at hand (ListedRow), one object for the whole walk. */
  const row: ListedRow = {
    dirRel: none,
    names: none,
    nameStart: 0,
    nameEnd: 0,
    stats: new BigInt64Array(0),
    words: new Int32Array(0),
    at: 0,
    mode: 0,
    type: 'unknown',
    targetLen: -1,
    depth: 0,
    dirFd: -1,
  };
  let pendingFd = -1; // a directory opened but not yet on the stack
  let rootDev = 0n;
  let entries = 0;
  try {
    // The walk depends on /proc/self/fd naming our fds: check that it names this one.
    let viaProc: BigIntStats | null = null;
    try {
      viaProc = statSync(`/proc/self/fd/${rootFd}`, { bigint: true });
    } catch {
      // checked below
    }
    const direct = fstatSync(rootFd, { bigint: true });
    rootDev = direct.dev;
    if (options.expectFs) checkFsIdentity(rootFd, root, options.expectFs);
    if (!viaProc || viaProc.ino !== direct.ino || viaProc.dev !== direct.dev) {
      throw new ScanError(
        'scan_failed',
        "scan_failed: /proc/self/fd does not name this process's fds (is /proc mounted?); the walk reaches entries through it",
      );
    }
    try {
      stack[0].listing = listDir(rootFd);
    } catch (err) {
      throw scanError(err, 'reading', none, 0, root);
    }
    while (stack.length > 0) {
      const dir = stack[stack.length - 1];
      if (dir.next >= dir.listing.count) {
        stack.pop();
        dropAhead(dir);
        closeSync(dir.fd);
        continue;
      }
      const i = dir.next++;
      const raw = dir.listing.raw;
      // The clock read every DEADLINE_EVERY entries (each is µs of work; a clock read and its BigInt per entry cost ~5% of an unchanged walk).
      if (deadlineHrNs !== null && (entries & (DEADLINE_EVERY - 1)) === 0 && process.hrtime.bigint() >= deadlineHrNs) {
        throw new ScanError('scan_timeout', `scan_timeout: the scan passed its ${options.deadlineMs} ms deadline after ${entries} entries`);
      }
      // As listed (statDir): anything but a directory (opened below, as it is now) and a link
      // that was none any more when read (looked at again below) is taken from the listing, its
      // fields read from the listing's arrays, for this entry alone: offered to keep first, as
      // the row, then made an entry with its path as one buffer (its name a view of its end).
      let rel: Buffer;
      let name: Buffer;
      if (raw) {
        const b = i * raw.fields;
        const errno = small32(raw.words, b + SD.errno);
        const mode = small32(raw.words, b + SD.mode);
        /** A link's target length; -1 none; -2 no link any more when read (statdir.h SD_TARGET_LEN). */
        const targetLen = small32(raw.words, b + SD.targetLen);
        const listed = errno === 0 && (mode & S_IFMT) !== 0o040000 && targetLen !== -2;
        if (listed) {
          row.dirRel = dir.rel;
          row.names = raw.names;
          row.nameStart = raw.nameStart[i]!;
          row.nameEnd = raw.nameEnd[i]!;
          row.stats = raw.stats;
          row.words = raw.words;
          row.at = b;
          row.mode = mode;
          row.type = typeOfMode(mode);
          row.targetLen = targetLen;
          row.depth = dir.depth;
          row.dirFd = dir.fd;
          if (keep?.(row)) {
            entries++;
            continue;
          }
        }
        const at = dir.rel.length === 0 ? 0 : dir.rel.length + 1;
        rel = Buffer.allocUnsafe(at + raw.nameEnd[i]! - raw.nameStart[i]!);
        if (at > 0) {
          dir.rel.copy(rel, 0);
          rel[at - 1] = 0x2f;
        }
        raw.names.copy(rel, at, raw.nameStart[i], raw.nameEnd[i]);
        name = at === 0 ? rel : rel.subarray(at);
        if (errno !== 0) {
          const code = errnoName(errno) ?? `errno ${errno}`;
          if (code === 'ENOENT') continue; // removed while the walk ran
          throw scanError(Object.assign(new Error(code), { code }), 'lstat of', rel, dir.depth, root);
        }
        if (listed) {
          entries++;
          yield listedEntry(row, rel, name);
          continue;
        }
      } else {
        name = dir.listing.names[i]!;
        rel = dir.rel.length === 0 ? name : Buffer.concat([dir.rel, SLASH, name]);
      }
      // A directory: opened and listed ahead with its next siblings (readAhead), else as below.
      if (raw && listMany && (small32(raw.words, i * raw.fields + SD.mode) & S_IFMT) === 0o040000) {
        if (i >= dir.aheadTo) readAhead(dir, i);
        const ahead = dir.ahead?.get(i);
        if (ahead) {
          dir.ahead!.delete(i);
          aheadFds--;
          entries++;
          // On the stack before the yield: closed with it if the consumer stops here.
          stack.push({ fd: ahead.fd, rel, depth: dir.depth + 1, listing: ahead.listing, next: 0, ahead: null, aheadTo: 0 });
          yield { path: rel, name, depth: dir.depth, type: 'dir', ...statFacts(ahead.st), linkTarget: null, dirFd: dir.fd };
          continue;
        }
      }
      const path = pathAt(dir.fd, name);
      let st: BigIntStats;
      let what = 'lstat of';
      try {
        st = lstatSync(path, { bigint: true });
        if (st.isDirectory()) {
          what = 'opening';
          try {
            pendingFd = openSync(path, OPEN_DIR);
            st = fstatSync(pendingFd, { bigint: true });
          } catch (err) {
            // Swapped since the lstat: a symlink (ENOTDIR, see above) or another type is recorded as it is now.
            if (errnoCode(err) !== 'ELOOP' && errnoCode(err) !== 'ENOTDIR') throw err;
            st = lstatSync(path, { bigint: true });
            // A directory again (swapped twice): changing under the walk, left out as one removed
            // while it ran (a capture's next pass sees it as it settles).
            if (st.isDirectory()) continue;
          }
        }
      } catch (err) {
        if (errnoCode(err) === 'ENOENT') continue; // removed while the walk ran
        throw scanError(err, what, rel, dir.depth, root);
      }
      const type = typeOf(st);
      let linkTarget: Buffer | null = null;
      let entryType = type;
      if (type === 'symlink') {
        try {
          linkTarget = readlinkSync(path, { encoding: 'buffer' });
        } catch (err) {
          if (errnoCode(err) === 'ENOENT') continue;
          if (errnoCode(err) !== 'EINVAL') throw scanError(err, 'readlink of', rel, dir.depth, root);
          // EINVAL: no longer a link (replaced since the lstat): recorded as what it is now.
          try {
            st = lstatSync(path, { bigint: true });
          } catch (e) {
            if (errnoCode(e) === 'ENOENT') continue;
            throw scanError(e, 'lstat of', rel, dir.depth, root);
          }
          entryType = typeOf(st);
          if (entryType === 'symlink' || entryType === 'dir') continue; // swapped again: the next walk sees it as it settles
        }
      }
      let mountPoint = false;
      if (pendingFd >= 0 && options.oneFileSystem && st.dev !== rootDev) {
        // A mount point: the directory itself, not what is mounted there.
        closeSync(pendingFd);
        pendingFd = -1;
        mountPoint = true;
      }
      entries++;
      yield {
        path: rel,
        name,
        depth: dir.depth,
        type: entryType,
        ...statFacts(st),
        linkTarget,
        dirFd: dir.fd,
        ...(mountPoint ? { mountPoint: true as const } : {}),
      };
      if (pendingFd >= 0) {
        const child = { fd: pendingFd, rel, depth: dir.depth + 1, listing: UNLISTED, next: 0, ahead: null, aheadTo: 0 };
        stack.push(child);
        pendingFd = -1;
        try {
          child.listing = listDir(child.fd);
        } catch (err) {
          throw scanError(err, 'reading', rel, dir.depth, root);
        }
      }
    }
  } finally {
    if (pendingFd >= 0) closeSync(pendingFd);
    for (const d of stack) {
      dropAhead(d);
      closeSync(d.fd);
    }
  }
}
