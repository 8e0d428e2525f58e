// A file sbx writes for its user (`sbx run --receipt FILE`) into a directory a session may write too (its
// cwd, as another user): the directory is pinned by an fd opened before the session runs (openOutputDir), the
// file written to a temp file and renamed over the final name only when that is absent or a regular file with
// one link; never written through a link (writeOutputFile). The temp and the rename are core/fs/durable.ts's.
import { randomBytes } from 'node:crypto';
import { closeSync, constants, fsyncSync, lstatSync, openSync, unlinkSync } from 'node:fs';
import { basename, dirname, resolve as resolvePath } from 'node:path';
import { openTempAt, replaceAt, writeAll } from '../core/fs/durable.js';
import { pathAt } from '../core/fs/walk.js';
import { errnoCode } from '../ipc/errno.js';

/** Mode of a new output file before the umask: what `>` in a shell gives under umask 022. */
export const OUTPUT_FILE_MODE = 0o644;

/**
 * Why an output file cannot be written; `path` is the file as the user named it (absolute);
 * `refused`: its name is a link or not a regular file (else a step failed, e.g. ENOSPC).
 */
export class OutputFileError extends Error {
  constructor(
    readonly path: string,
    readonly reason: string,
    readonly refused = false,
  ) {
    super(`${path}: ${reason}`);
    this.name = 'OutputFileError';
  }
}

/** The directory of an output file, held open from before the session ran. */
export interface OutputDir {
  /** The file's absolute path as given (for messages). */
  path: string;
  /** Its last component: the name created in the directory. */
  name: string;
  /** fd of the directory (O_RDONLY|O_DIRECTORY|O_NOFOLLOW; libuv adds O_CLOEXEC). */
  dirFd: number;
}

const ERRNO_WHY: Record<string, string> = {
  ENOENT: 'no such directory',
  ENOTDIR: 'a component of the path is not a directory',
  ELOOP: 'the directory is a symbolic link (give the real directory)',
  EACCES: 'permission denied',
};

/**
 * The path of `name` inside the pinned directory (resolved by the kernel through the fd). Node has no
 * openat/renameat, so names are resolved as /proc/self/fd/<dirfd>/<name>: the magic link is the
 * directory opened (proc(5), open(2), rename(2), fsync(2)).
 */
const inDir = (d: OutputDir, name: string) => pathAt(d.dirFd, name);

/**
 * Opens the directory of path (relative: against the cwd) now, O_DIRECTORY|O_NOFOLLOW;
 * throws OutputFileError naming it (missing, not a directory, a symlink, not permitted).
 */
export function openOutputDir(path: string): OutputDir {
  const abs = resolvePath(path);
  const name = basename(abs);
  if (path.endsWith('/') || name === '' || name === '.' || name === '..') throw new OutputFileError(abs, 'names a directory, not a file');
  const dir = dirname(abs);
  let dirFd: number;
  try {
    dirFd = openSync(dir, constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW);
  } catch (err) {
    const code = errnoCode(err) ?? 'EIO';
    // O_NOFOLLOW on a directory that is a symlink reads ENOTDIR (O_DIRECTORY is checked first): say which.
    let link = false;
    try {
      link = lstatSync(dir).isSymbolicLink();
    } catch {
      // gone: the errno says so
    }
    if (link)
      throw new OutputFileError(abs, `its directory ${dir} is a symbolic link, which sbx does not follow for a receipt (name the directory it points to)`);
    throw new OutputFileError(abs, `cannot open its directory ${dir}: ${ERRNO_WHY[code] ?? code} (${code})`);
  }
  return { path: abs, name, dirFd };
}

/**
 * Why the final name may not be replaced (a symbolic link, a hard-linked file, not a regular
 * file), or null when it is absent or a regular file with one link. lstat: never follows it.
 */
export function outputNameRefusal(d: OutputDir): string | null {
  let st;
  try {
    st = lstatSync(inDir(d, d.name));
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return null;
    return `cannot inspect it (${errnoCode(err)})`;
  }
  if (st.isSymbolicLink()) return 'it is a symbolic link';
  if (!st.isFile()) return `it is not a regular file (${st.isDirectory() ? 'a directory' : 'a special file'})`;
  if (st.nlink > 1) return `it is a file with ${st.nlink} hard links`;
  return null;
}

/**
 * Writes data as the final name, durably: temp file (created O_CREAT|O_EXCL|O_NOFOLLOW, mode
 * OUTPUT_FILE_MODE minus the umask), fsync, rename over the name, fsync of the directory. Throws OutputFileError when the name
 * is refused (outputNameRefusal) or a step fails; a temp file left by a failure is removed.
 * A link swapped in after the check is replaced by the rename, never written through.
 */
export function writeOutputFile(d: OutputDir, data: Uint8Array): void {
  const refusal = outputNameRefusal(d);
  if (refusal) throw new OutputFileError(d.path, refusal, true);
  let tmp = '';
  let fd = -1;
  for (let attempt = 0; fd < 0; attempt++) {
    tmp = `.${d.name.slice(0, 200)}.${randomBytes(6).toString('hex')}.tmp`;
    try {
      fd = openTempAt(d.dirFd, tmp, OUTPUT_FILE_MODE);
    } catch (err) {
      const code = errnoCode(err);
      if (code === 'EEXIST' && attempt < 5) continue; // a name taken (planted): another
      throw new OutputFileError(d.path, `cannot create a temp file in its directory (${code})`);
    }
  }
  try {
    try {
      writeAll(fd, data);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    // The check again, as late as possible: the session may have planted a link meanwhile.
    const late = outputNameRefusal(d);
    if (late) throw new OutputFileError(d.path, late, true);
    replaceAt(d.dirFd, tmp, d.name);
    tmp = '';
    fsyncSync(d.dirFd);
  } catch (err) {
    if (tmp) {
      try {
        unlinkSync(inDir(d, tmp));
      } catch {
        // already gone
      }
    }
    if (err instanceof OutputFileError) throw err;
    throw new OutputFileError(d.path, `cannot write it (${errnoCode(err) ?? (err as Error).message})`);
  }
}

/** Closes the directory fd. */
export function closeOutputDir(d: OutputDir): void {
  closeSync(d.dirFd);
}
