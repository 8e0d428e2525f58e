// Durable files (docs/design/facts.md 9, 10): the one temp-and-place implementation. A temp file
// created O_EXCL|O_NOFOLLOW beside (or for the store, in tmp/), written, fsync'ed, then renamed
// over the target (files that change) or placed without replacing (files written once:
// receipts, admissions, keys, objects, manifests), and the directory fsync'ed: a reader sees
// the old file or the whole new one, and a crash after return loses nothing.
import { closeSync, constants, fsyncSync, linkSync, openSync, renameSync, unlinkSync, writeSync } from 'node:fs';
import { basename, dirname } from 'node:path';
import { randomBytes } from 'node:crypto';
import { tempFileName } from '../state/names.js';
import { faultPoint } from '../fault.js';
import { nativeOrNull } from './native.js';
import { pathAt } from './walk.js';
import { errnoCode } from '../../ipc/errno.js';

const OPEN_DIR = constants.O_RDONLY | constants.O_DIRECTORY;
const CREATE = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW;

/** fsync a directory so a rename or create in it is durable (fsync(2)). */
export function fsyncDir(dir: string): void {
  const fd = openSync(dir, OPEN_DIR);
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/** Writes all of data to fd (writeSync may write less than asked). */
export function writeAll(fd: number, data: Uint8Array): void {
  let off = 0;
  while (off < data.length) off += writeSync(fd, data, off, data.length - off);
}

/**
 * Creates the temp file `tempName` in dirFd: O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW (libuv adds
 * O_CLOEXEC), so a name already there, a planted link included, fails EEXIST and is never
 * written through. Returns its fd; the caller writes, fsyncs and closes it.
 */
export function openTempAt(dirFd: number, tempName: string | Buffer, mode: number): number {
  return openSync(pathAt(dirFd, tempName), CREATE, mode);
}

/**
 * A temp file `tempName` in dirFd holding what `write` wrote to its fd, fsync'ed unless `sync`
 * is false (a caller that syncs the file system once for many, syncfs(2)). On any failure
 * the temp is closed, removed, and the error thrown.
 */
export function writeTempAt(dirFd: number, tempName: string | Buffer, mode: number, write: (fd: number) => void, sync = true): void {
  const fd = openTempAt(dirFd, tempName, mode);
  try {
    write(fd);
    if (sync) fsyncSync(fd);
  } catch (err) {
    closeSync(fd);
    unlinkAt(dirFd, tempName);
    throw err;
  }
  closeSync(fd);
}

/**
 * A temp file `tempName` in dirFd holding bytes, in one native call where the helper is built (fileio.c: open with
 * O_CREAT|O_EXCL|O_WRONLY|O_CLOEXEC|O_NOFOLLOW and mode, write, close), not fsync'ed: for a
 * caller that syncs the file system once for many (syncfs(2)). A name there, a planted link
 * included, fails EEXIST and is never written through; on a failure after the create (ENOSPC)
 * the temp is removed and the errno thrown (`code`, `syscall`).
 */
export function writeTempBytesAt(dirFd: number, tempName: Buffer, mode: number, bytes: Buffer): void {
  const n = nativeOrNull();
  if (n && typeof n.writeFileNewAt === 'function') n.writeFileNewAt(dirFd, tempName, mode, bytes);
  else writeTempAt(dirFd, tempName, mode, (fd) => writeAll(fd, bytes), false);
}

/** Removes `name` from dirFd (unlink(2)); throws its errno. */
function unlinkAt(dirFd: number, name: string | Buffer): void {
  unlinkSync(pathAt(dirFd, name));
}

/** How a directory's temps are placed without replacing: renameat2(RENAME_NOREPLACE) until a file system answers EINVAL, then link(2) + unlink(2). One per store or per call. */
export interface NoReplace {
  renameWorks: boolean;
}

/**
 * Moves the temp `tmp` in fromDirFd to `name` in toDirFd, never replacing anything there:
 * renameat2(2) RENAME_NOREPLACE (one call), or where the file system has none (EINVAL, and
 * `how.renameWorks` is then false for the caller's next ones) link(2) then unlink(2) of the
 * temp. True when placed, false when `name` exists (nothing replaced). The temp is gone
 * either way; any other errno is thrown after the temp is removed. Not durable until the
 * caller fsyncs toDirFd.
 */
export function placeNoReplaceAt(
  fromDirFd: number,
  tmp: string | Buffer,
  toDirFd: number,
  name: string | Buffer,
  how: NoReplace = { renameWorks: true },
): boolean {
  const from = Buffer.isBuffer(tmp) ? tmp : Buffer.from(tmp);
  const to = Buffer.isBuffer(name) ? name : Buffer.from(name);
  const n = how.renameWorks ? nativeOrNull() : null;
  if (n && typeof n.renameAtNoReplace === 'function') {
    try {
      if (n.renameAtNoReplace(fromDirFd, from, toDirFd, to)) return true;
      unlinkAt(fromDirFd, from);
      return false;
    } catch (err) {
      if (errnoCode(err) !== 'EINVAL') {
        unlinkAt(fromDirFd, from);
        throw err;
      }
      how.renameWorks = false;
    }
  }
  try {
    linkSync(pathAt(fromDirFd, from), pathAt(toDirFd, to));
    return true;
  } catch (err) {
    if (errnoCode(err) === 'EEXIST') return false;
    throw err;
  } finally {
    unlinkAt(fromDirFd, from);
  }
}

/** Renames the temp `tmp` in dirFd over `name` (rename(2): whatever was there, a link included, is replaced, never written through). Not durable until the caller fsyncs dirFd. */
export function replaceAt(dirFd: number, tmp: string, name: string): void {
  renameSync(pathAt(dirFd, tmp), pathAt(dirFd, name));
}

/** Runs fn with the parent directory of path open (O_DIRECTORY), then fsyncs (unless told not to) and closes it. */
function inParent<T>(path: string, fn: (dirFd: number) => T, sync = true): T {
  const dirFd = openSync(dirname(path), OPEN_DIR);
  try {
    const out = fn(dirFd);
    if (sync) fsyncSync(dirFd);
    return out;
  } finally {
    closeSync(dirFd);
  }
}

/** A temp name beside path's last component (tempFileName: `.<name>.<12 hex>.tmp`, which a restart sweeps). */
function tempBeside(path: string): string {
  return tempFileName(basename(path), randomBytes(6).toString('hex'));
}

/** Atomically replaces path with data (mode 0600 by default), nothing fsync'ed: after a crash it may be the old file, or empty. For a record a durable one rebuilds. */
export function writeFileUnsynced(path: string, data: string | Uint8Array, mode = 0o600): void {
  replaceFile(path, data, mode, false);
}

/** Atomically and durably replaces path with data (mode 0600 by default); `faults` names crash points after the temp write and after the rename (fault.ts). */
export function writeFileDurable(path: string, data: string | Uint8Array, mode = 0o600, faults?: { afterTemp: string; afterRename: string }): void {
  replaceFile(path, data, mode, true, faults);
  if (faults) faultPoint(faults.afterRename);
}

/** A temp beside path, written (fsync'ed when `sync`), renamed over path, the directory fsync'ed when `sync`. */
function replaceFile(path: string, data: string | Uint8Array, mode: number, sync: boolean, faults?: { afterTemp: string }): void {
  const bytes = typeof data === 'string' ? Buffer.from(data) : data;
  inParent(
    path,
    (dirFd) => {
      const tmp = tempBeside(path);
      writeTempAt(dirFd, tmp, mode, (fd) => writeAll(fd, bytes), sync);
      if (faults) faultPoint(faults.afterTemp);
      replaceAt(dirFd, tmp, basename(path));
    },
    sync,
  );
}

/**
 * Atomically and durably creates path with data; it must not exist. Anything already there
 * (a file, a planted symlink or hardlink) makes it fail with EEXIST, never written through
 * or replaced (placeNoReplaceAt).
 */
export function createFileDurable(path: string, data: string | Uint8Array, mode = 0o600): void {
  createFile(path, data, mode, true);
}

/**
 * As createFileDurable (whole or absent, never written through), but nothing is fsync'ed:
 * after a crash the name may be gone, or name an empty file. For a record another durable one
 * can rebuild (a key record from its admission record).
 */
export function createFileUnsynced(path: string, data: string | Uint8Array, mode = 0o600): void {
  createFile(path, data, mode, false);
}

function createFile(path: string, data: string | Uint8Array, mode: number, sync: boolean): void {
  const bytes = typeof data === 'string' ? Buffer.from(data) : data;
  inParent(
    path,
    (dirFd) => {
      const tmp = tempBeside(path);
      writeTempAt(dirFd, tmp, mode, (fd) => writeAll(fd, bytes), sync);
      faultPoint(`durable:${basename(path)}:before-link`);
      if (!placeNoReplaceAt(dirFd, tmp, dirFd, basename(path)))
        throw Object.assign(new Error(`EEXIST: file already exists, link '${path}'`), { code: 'EEXIST', errno: -17, syscall: 'link', path });
    },
    sync,
  );
}
