// The no-symlink walk of the file tool (docs/guide/files.md): every component opened
// O_DIRECTORY|O_NOFOLLOW relative to the last (via /proc/self/fd/N/NAME, the openat(2) of Node),
// and the tool's errors by code (ipc/errors.ts). Pure Node: nothing of the supervisor.
import { closeSync, constants, lstatSync, openSync } from 'node:fs';
import { pathAt } from '../../core/fs/walk.js';
import { systemError } from '../../ipc/errno.js';

const { O_RDONLY, O_DIRECTORY, O_NOFOLLOW } = constants;
export const O_CLOEXEC = 0o2000000; // Linux; not in fs.constants

export class ToolError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly details: Record<string, unknown> = {},
  ) {
    super(message);
  }
}

/** The path of NAME inside the directory open at fd: resolving it never follows a link above NAME. */
export const at = (dirFd: number, name: string): string => pathAt(dirFd, name);

/** Maps an errno of an open/rename of `what` to a tool error code. */
export function fromErrno(err: NodeJS.ErrnoException, what: string): ToolError {
  const errno = err.code ?? 'EIO';
  switch (errno) {
    case 'ENOENT':
      return new ToolError('NOT_FOUND', `${what} does not exist`, { errno });
    case 'ENOTDIR':
      return new ToolError('NOT_A_DIRECTORY', `${what}: a parent is not a directory`, { errno });
    case 'ELOOP':
      return new ToolError('SYMLINK_REFUSED', `${what} is a symbolic link (refused)`, { errno });
    case 'EISDIR':
      return new ToolError('IS_A_DIRECTORY', `${what} is a directory`, { errno });
    case 'EACCES':
    case 'EPERM':
    case 'EROFS':
      return new ToolError('PERMISSION_DENIED', `${what}: ${errno}`, { errno });
    default:
      return new ToolError('FILE_ERROR', `${what}: ${err.message}`, { errno });
  }
}

/** True when NAME inside dirFd is itself a symbolic link (lstat never follows the last name). */
export function isLink(dirFd: number, name: string): boolean {
  try {
    return lstatSync(at(dirFd, name)).isSymbolicLink();
  } catch {
    return false;
  }
}

/**
 * Opens the parent directory of an absolute path without following any link, and returns its
 * fd and the final name. INVALID_ARGUMENT for a relative path, `..`, or the root itself.
 */
export function openParent(path: string): { dirFd: number; name: string } {
  if (!path.startsWith('/')) throw new ToolError('INVALID_ARGUMENT', `not an absolute path: ${path}`);
  const parts = path.split('/').filter((p) => p !== '' && p !== '.');
  if (parts.includes('..')) throw new ToolError('INVALID_ARGUMENT', `a path with "..": ${path}`);
  const name = parts.pop();
  if (name === undefined) throw new ToolError('INVALID_ARGUMENT', `no file name in ${path}`);
  let dirFd = openSync('/', O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  let walked = '';
  for (const part of parts) {
    walked += `/${part}`;
    let next: number;
    try {
      next = openSync(at(dirFd, part), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    } catch (err) {
      const e = systemError(err);
      // O_DIRECTORY|O_NOFOLLOW on a link is ENOTDIR or ELOOP: say which it was.
      const linked = (e.code === 'ENOTDIR' || e.code === 'ELOOP') && isLink(dirFd, part);
      closeSync(dirFd);
      if (linked)
        throw new ToolError('SYMLINK_REFUSED', `${walked} is a symbolic link (refused: files are never written or read through a link)`, { path: walked });
      if (e.code === 'ENOTDIR') throw new ToolError('NOT_A_DIRECTORY', `${walked} is not a directory`, { path: walked });
      throw fromErrno(e, walked);
    }
    closeSync(dirFd);
    dirFd = next;
  }
  return { dirFd, name };
}
