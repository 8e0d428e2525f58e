// A small file read whole at a directory fd in one native call (native-helpers/src/fileio.c):
// the checkpoint's capture and read-back read each file so, where node:fs took five calls and a
// /proc/self/fd path each. Owns the stat slots a read fills (one set per thread). The write's
// half of fileio.c is core/fs/durable.ts's (writeTempBytesAt).
import { native } from './native.js';

/** fileio.h's fields of one fstat(2), their index in a stat's slots. */
const FIO = { size: 0, mode: 1, uid: 2, gid: 3, mtimeNs: 4, ctimeNs: 5, ino: 6, rdev: 7, dev: 8, blocks: 9, fields: 10 } as const;

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

function statAt(o: number): FileStat {
  return {
    size: slots[o + FIO.size],
    mode: slots[o + FIO.mode],
    uid: slots[o + FIO.uid],
    gid: slots[o + FIO.gid],
    mtimeNs: slots[o + FIO.mtimeNs],
    ctimeNs: slots[o + FIO.ctimeNs],
    ino: slots[o + FIO.ino],
    rdev: slots[o + FIO.rdev],
    dev: slots[o + FIO.dev],
    blocks: slots[o + FIO.blocks],
  };
}

/** Whether a stat's mode is a regular file's (S_ISREG). */
export function isRegular(st: FileStat): boolean {
  return (Number(st.mode) & 0o170000) === 0o100000;
}
