// Durable files in the state dir (docs/design/facts.md 9, 10): written to a temp file created with
// O_EXCL|O_NOFOLLOW, fsync'ed, then renamed over the target (records that change) or linked
// to it (records written once: receipts, admissions, keys, which must never be replaced),
// and the directory fsync'ed, so a reader sees the old file or the whole new one, and a
// crash after return loses nothing. See open(2), fsync(2), rename(2), link(2).
import { closeSync, constants, fsyncSync, linkSync, openSync, renameSync, unlinkSync, writeSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { tempFileName } from '../../ipc/state-layout.js';
import { faultPoint } from '../fault.js';

/** fsync a directory so a rename or create in it is durable. */
export function fsyncDir(dir: string): void {
  const fd = openSync(dir, constants.O_RDONLY | constants.O_DIRECTORY);
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

/** Atomically and durably replaces path with data (mode 0600 by default); `faults` names crash points after the temp write and after the rename (fault.ts). */
export function writeFileDurable(path: string, data: string | Uint8Array, mode = 0o600, faults?: { afterTemp: string; afterRename: string }): void {
  const tmp = writeTemp(path, data, mode);
  if (faults) faultPoint(faults.afterTemp);
  renameSync(tmp, path);
  fsyncDir(dirname(path));
  if (faults) faultPoint(faults.afterRename);
}

/**
 * Atomically and durably creates path with data; it must not exist. Anything already there
 * (a file, a planted symlink or hardlink) makes it fail with EEXIST, never written through
 * or replaced: link(2) does not follow or replace an existing name.
 */
export function createFileDurable(path: string, data: string | Uint8Array, mode = 0o600): void {
  const tmp = writeTemp(path, data, mode);
  faultPoint(`durable:${basename(path)}:before-link`);
  try {
    linkSync(tmp, path);
  } finally {
    unlinkSync(tmp);
  }
  fsyncDir(dirname(path));
}

/** A fsync'ed temp file beside path, created O_EXCL|O_NOFOLLOW; returns its path. */
function writeTemp(path: string, data: string | Uint8Array, mode: number): string {
  const dir = dirname(path);
  const tmp = join(dir, tempFileName(basename(path), randomBytes(6).toString('hex')));
  const fd = openSync(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, mode);
  try {
    writeAll(fd, typeof data === 'string' ? Buffer.from(data) : data);
    fsyncSync(fd);
  } catch (err) {
    closeSync(fd);
    unlinkSync(tmp);
    throw err;
  }
  closeSync(fd);
  return tmp;
}
