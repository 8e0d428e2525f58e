// The file tool's `upload DIR` (docs/guide/files.md): the archive on stdin goes to `tar -x -p` (a child of
// the tool) into a fresh private staging dir inside DIR, then is merged into DIR by renames, never following
// a link planted in DIR (merge). The staging dir is removed on every exit path (SIGTERM, SIGINT, SIGHUP too:
// onSignal).
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import {
  closeSync,
  constants,
  fchmodSync,
  fchownSync,
  fstatSync,
  futimesSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  renameSync,
  rmdirSync,
  unlinkSync,
  type Stats,
} from 'node:fs';
import { at, fromErrno, isLink, O_CLOEXEC, openParent, ToolError } from './walk.js';
import { errnoCode, systemError } from '../../ipc/errno.js';

const { O_RDONLY, O_DIRECTORY, O_NOFOLLOW } = constants;
const DIR_FLAGS = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
const isRoot = () => process.geteuid?.() === 0;

/** The upload under way: its tar child and the removal of its staging dir (for a signal). */
let active: { child: ChildProcess | null; cleanup: () => void } | null = null;

/**
 * A signal while an upload runs: kills its tar, removes the staging dir, writes the tool's
 * FILE_ERROR line and ends the tool by that signal. False when no upload runs (the caller's handler decides).
 */
export function onSignal(sig: NodeJS.Signals): boolean {
  if (!active) return false;
  const a = active;
  active = null;
  const finish = () => {
    a.cleanup();
    process.stderr.write(
      `${JSON.stringify({ code: 'FILE_ERROR', message: `upload ended by ${sig}; the staging dir was removed and nothing more merged`, signal: sig })}\n`,
    );
    process.removeAllListeners(sig);
    process.kill(process.pid, sig);
  };
  const child = a.child;
  if (child && child.exitCode === null && child.signalCode === null) {
    child.once('exit', finish);
    child.kill('SIGKILL');
  } else finish();
  return true;
}

/** Opens the directory at an absolute path, every component (the last too) without following a link. */
function openDir(path: string): number {
  const { dirFd, name } = openParent(path);
  try {
    return openSync(at(dirFd, name), DIR_FLAGS);
  } catch (err) {
    const e = systemError(err);
    if ((e.code === 'ELOOP' || e.code === 'ENOTDIR') && isLink(dirFd, name))
      throw new ToolError('SYMLINK_REFUSED', `${path} is a symbolic link (refused)`, { path });
    if (e.code === 'ENOTDIR') throw new ToolError('NOT_A_DIRECTORY', `${path} is not a directory`, { path });
    throw fromErrno(e, path);
  } finally {
    closeSync(dirFd);
  }
}

/** Removes everything inside the directory open at fd, by fds (never through a link); best effort. */
function emptyTree(fd: number): void {
  try {
    fchmodSync(fd, 0o700); // a read-only directory of the archive (a non-root user) would keep its entries
  } catch {
    // not ours: the unlinks say
  }
  let names: string[];
  try {
    names = readdirSync(`/proc/self/fd/${fd}`);
  } catch {
    return;
  }
  for (const name of names) {
    try {
      if (lstatSync(at(fd, name)).isDirectory()) {
        const sub = openSync(at(fd, name), DIR_FLAGS);
        try {
          emptyTree(sub);
        } finally {
          closeSync(sub);
        }
        rmdirSync(at(fd, name));
      } else unlinkSync(at(fd, name));
    } catch {
      // best effort: the rest is still removed
    }
  }
}

/** Opens NAME in the destination directory dst as a directory, never through a link. */
function openDest(dst: number, name: string, path: string): number {
  try {
    return openSync(at(dst, name), DIR_FLAGS);
  } catch (err) {
    const e = systemError(err);
    if ((e.code === 'ELOOP' || e.code === 'ENOTDIR') && isLink(dst, name)) throw symlinkRefused(path);
    throw fromErrno(e, path);
  }
}

const symlinkRefused = (path: string) =>
  new ToolError('SYMLINK_REFUSED', `upload: ${path} is a symbolic link where the archive has a directory (refused: nothing is written through a link)`, {
    path,
  });

/** Applies a directory of the archive's owner (as root), mode and mtime to the directory open at fd. */
function applyDir(fd: number, st: Stats): void {
  const root = isRoot();
  try {
    if (root) fchownSync(fd, st.uid, st.gid);
    fchmodSync(fd, st.mode & 0o7777); // after chown (it clears setgid)
    futimesSync(fd, st.atime, st.mtime);
  } catch (err) {
    if (root) throw err; // a user's directory it does not own keeps its mode, as tar's would
  }
}

/** Renames NAME of src over NAME of dst (both directories open by fd); a directory lacking owner write gets it for the move (a rename to a new parent writes its "..") . */
function move(src: number, dst: number, name: string, st: Stats, path: string): void {
  let fd = -1;
  try {
    if (st.isDirectory() && !isRoot() && !(st.mode & 0o200)) {
      fd = openSync(at(src, name), DIR_FLAGS);
      fchmodSync(fd, (st.mode & 0o7777) | 0o200);
    }
    renameSync(at(src, name), at(dst, name));
    if (fd >= 0) fchmodSync(fd, st.mode & 0o7777);
  } catch (err) {
    throw err instanceof ToolError ? err : fromErrno(systemError(err), `upload: ${path}`);
  } finally {
    if (fd >= 0) closeSync(fd);
  }
}

/**
 * Merges the staging tree open at src into the destination directory open at dst (path: for
 * messages). Both directories: recurse, then the archive dir's owner, mode and mtime; else a
 * rename over the name (a planted link is replaced, never followed). Throws at the first entry
 * that cannot be merged (what was merged before stays). Each rename is relative to a destination
 * directory opened O_DIRECTORY|O_NOFOLLOW; a directory of the archive where DIR has a link is
 * SYMLINK_REFUSED.
 */
function merge(src: number, dst: number, path: string): void {
  for (const name of readdirSync(`/proc/self/fd/${src}`)) {
    const where = `${path}/${name}`;
    const st = lstatSync(at(src, name));
    let dest: Stats | null = null;
    try {
      dest = lstatSync(at(dst, name));
    } catch (err) {
      if (errnoCode(err) !== 'ENOENT') throw fromErrno(systemError(err), `upload: ${where}`);
    }
    if (st.isDirectory() && dest !== null) {
      if (dest.isSymbolicLink()) throw symlinkRefused(where);
      if (!dest.isDirectory()) {
        // A file where the archive has a directory: replaced, as tar -x does.
        try {
          unlinkSync(at(dst, name));
        } catch (err) {
          throw fromErrno(systemError(err), `upload: ${where}`);
        }
        move(src, dst, name, st, where);
        continue;
      }
      const s = openSync(at(src, name), DIR_FLAGS);
      try {
        const d = openDest(dst, name, where);
        try {
          fchmodSync(s, 0o700); // its entries can be moved out (a read-only directory of the archive)
          merge(s, d, where);
          applyDir(d, st);
        } finally {
          closeSync(d);
        }
      } finally {
        closeSync(s);
      }
      continue;
    }
    if (!st.isDirectory() && dest?.isDirectory())
      throw new ToolError('IS_A_DIRECTORY', `upload: ${where} is a directory; the archive has a non-directory there`, { path: where });
    move(src, dst, name, st, where);
  }
}

/** Waits for tar; FILE_ERROR with its exit and the tail of its stderr unless it exits 0. */
function tarExit(child: ChildProcess, stderrTail: () => string): Promise<void> {
  return new Promise((resolve, reject) => {
    child.once('error', (err) => reject(new ToolError('FILE_ERROR', `upload: tar: ${err.message}`)));
    child.once('close', (code, signal) => {
      if (code === 0) resolve();
      else reject(new ToolError('FILE_ERROR', `upload: tar -x exited ${code ?? signal}; nothing was merged: ${stderrTail().trim()}`, { exit: code, signal }));
    });
  });
}

/**
 * `upload DIR`: stdin (a tar) extracted into the staging dir, then merged into DIR. The staging dir is
 * `DIR/.sbx-upload-<12 hex>` (mode 0700, made by mkdir: EEXIST if anything is at the name).
 */
export async function uploadDir(dir: string): Promise<void> {
  const dirFd = openDir(dir);
  const name = `.sbx-upload-${randomBytes(6).toString('hex')}`;
  try {
    try {
      mkdirSync(at(dirFd, name), 0o700);
    } catch (err) {
      throw fromErrno(systemError(err), `${dir} (its staging dir)`);
    }
    const staging = openSync(at(dirFd, name), DIR_FLAGS);
    const cleanup = () => {
      emptyTree(staging);
      closeSync(staging);
      try {
        rmdirSync(at(dirFd, name));
      } catch {
        // gone already
      }
    };
    active = { child: null, cleanup };
    try {
      const st = fstatSync(staging);
      if (!st.isDirectory() || st.uid !== process.geteuid?.())
        throw new ToolError('FILE_ERROR', `${dir}/${name}: the staging dir is not the one made (refused)`);
      fchmodSync(staging, 0o700);
      // tar reads the session's stdin itself and extracts into the staging dir, given as its fd 3.
      const child = spawn('tar', ['-x', '-p', '-f', '-', '-C', '/proc/self/fd/3'], { stdio: [0, 'inherit', 'pipe', staging] });
      active.child = child;
      let tail = '';
      child.stderr!.on('data', (d: Buffer) => {
        process.stderr.write(d);
        tail = (tail + d.toString('utf8')).slice(-4096);
      });
      await tarExit(child, () => tail);
      if (!active) return; // a signal came meanwhile: its handler cleans up and ends the tool
      merge(staging, dirFd, dir.replace(/\/+$/, ''));
    } finally {
      if (active) {
        active = null;
        cleanup();
      }
    }
  } finally {
    closeSync(dirFd);
  }
}
