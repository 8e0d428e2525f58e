// A small file read whole at a directory fd in one native call (native-helpers/src/fileio.c):
// the checkpoint's capture and read-back read each file so, where node:fs took five calls and a
// /proc/self/fd path each. Owns the stat slots a read fills (one set per thread). The write's
// half of fileio.c is core/fs/durable.ts's (writeTempBytesAt). hashWholeAt reads and hashes a
// batch of such files on threads (the read-back's).
import { errnoName } from '../../ipc/errno.js';
import { native, timeNsAt } from './native.js';

/** fileio.h's fields of one fstat(2), their index in a stat's slots. */
const FIO = { size: 0, mode: 1, uid: 2, gid: 3, mtimeNs: 4, ctimeNs: 5, ino: 6, rdev: 7, dev: 8, blocks: 9, mtimeSec: 10, ctimeSec: 12, fields: 14 } as const;

/** The last readWholeAt's fstats: before the read at [0, FIO.fields), after it at [FIO.fields, 2 x FIO.fields). */
const slots = new BigInt64Array(2 * FIO.fields);

/** One fstat as readWholeAt saw it (node:fs BigIntStats' names; all bigint). */
export interface FileStat {
  size: bigint;
  mode: bigint;
  uid: bigint;
  gid: bigint;
  mtimeNs: bigint;
  ctimeNs: bigint;
  ino: bigint;
  rdev: bigint;
  dev: bigint;
  blocks: bigint;
}

/**
 * Opens name in dirFd (O_RDONLY|O_CLOEXEC|O_NOFOLLOW|extraFlags), and when it is a regular file
 * reads it from offset 0 into buf until end of file or buf is full (buf.length returned: it may
 * hold more), with an fstat before and after the read (statBefore, statAfter). Returns the bytes
 * read; 0, unread, when it is not a regular file (statBefore's mode says what it is). Throws
 * the failing call's errno as node:fs does (`code`, `syscall`: open ENOENT, ELOOP, EWOULDBLOCK
 * for a lease with O_NONBLOCK...). See open(2), fstat(2), pread(2).
 */
export function readWholeAt(dirFd: number, name: Buffer, extraFlags: number, buf: Buffer): number {
  return native().readFileAt(dirFd, name, extraFlags, buf, slots);
}

/** The last readWholeAt's fstat before its read. */
export function statBefore(): FileStat {
  return statAt(0);
}

/** The last readWholeAt's fstat after its read (not set when the file was not regular). */
export function statAfter(): FileStat {
  return statAt(FIO.fields);
}

function statAt(o: number, from: BigInt64Array = slots): FileStat {
  return {
    size: from[o + FIO.size],
    mode: from[o + FIO.mode],
    uid: from[o + FIO.uid],
    gid: from[o + FIO.gid],
    mtimeNs: timeNsAt(from, o + FIO.mtimeNs, o + FIO.mtimeSec),
    ctimeNs: timeNsAt(from, o + FIO.ctimeNs, o + FIO.ctimeSec),
    ino: from[o + FIO.ino],
    rdev: from[o + FIO.rdev],
    dev: from[o + FIO.dev],
    blocks: from[o + FIO.blocks],
  };
}

/** One file of hashWholeAt: its read failed (`code`, as readWholeAt would throw it), or what was read. */
export type WholeHashed =
  | { code: string; errno: number }
  /**
   * bytes read; before: the fstat before the read; sha256: hex of the bytes, null when not a
   * regular file, cap bytes were read (it may hold more), or the fstat after the read differs
   * (sameStat: it changed meanwhile, maybe past the size it was read to).
   */
  | { bytes: number; before: FileStat; sha256: string | null };

/**
 * readWholeAt of each name in dirFd, read and hashed (SHA-256) on up to `threads` threads, each
 * with a buffer of `cap` bytes (native hashFilesAt, fileio.h fileio_hash_many: git's
 * preload-index way, for the read-back of many small objects). In the order of names. Blocks
 * the calling thread.
 */
export function hashWholeAt(dirFd: number, names: Buffer[], extraFlags: number, cap: number, threads: number): WholeHashed[] {
  const n = names.length;
  const rc = new Float64Array(n);
  const stats = new BigInt64Array(n * 2 * FIO.fields);
  const digests = Buffer.alloc(n * 32);
  const packed = Buffer.concat(names.flatMap((name) => [name, Buffer.alloc(1)]));
  native().hashFilesAt(dirFd, packed, extraFlags, cap, threads, rc, stats, digests);
  return names.map((_, i) => {
    if (rc[i]! < 0) return { code: errnoName(-rc[i]!) ?? `errno ${-rc[i]!}`, errno: rc[i]! };
    const before = statAt(i * 2 * FIO.fields, stats);
    const whole = isRegular(before) && rc[i]! < cap && sameStat(before, statAt(i * 2 * FIO.fields + FIO.fields, stats));
    return { bytes: rc[i]!, before, sha256: whole ? digests.toString('hex', i * 32, i * 32 + 32) : null };
  });
}

/** The stat facts two looks at one file compare (a walk's lstat, an fstat). */
type Compared = { size: bigint; mtimeNs: bigint; ctimeNs: bigint; ino: bigint; mode: number | bigint };

/** Whether two stats of one file say it did not change between them: size, mtime, ctime, inode and mode. */
export function sameStat(a: Compared, b: Compared): boolean {
  return a.size === b.size && a.mtimeNs === b.mtimeNs && a.ctimeNs === b.ctimeNs && a.ino === b.ino && Number(a.mode) === Number(b.mode);
}

/** Whether a stat's mode is a regular file's (S_ISREG). */
export function isRegular(st: FileStat): boolean {
  return (Number(st.mode) & 0o170000) === 0o100000;
}
