// System errors as node reports them (node:fs, net, child_process and the native helper, whose
// errors are named like node:fs's): the one place an unknown caught value is read as one, so
// callers compare errno names (errno(3): ENOENT, EEXIST, ...) without casting, and an errno
// number is named. Lowest layer: imports nothing of the project, usable from ipc/, core/, the
// supervisor, sbx and the worker threads.
import { constants as osConstants } from 'node:os';

const ERRNO_NAMES = new Map(Object.entries(osConstants.errno).map(([name, num]) => [num, name]));

/** An errno number's name ('ENOENT' for 2, os.constants.errno), or undefined for one this system does not name. */
export function errnoName(errno: number): string | undefined {
  return ERRNO_NAMES.get(errno);
}

/** The error's string `code` (an errno name such as 'ENOENT' for a system error), or undefined when it has none. */
export function errnoCode(err: unknown): string | undefined {
  const code = typeof err === 'object' && err !== null ? (err as { code?: unknown }).code : undefined;
  return typeof code === 'string' ? code : undefined;
}

/** err typed as a system error (errno, code, syscall, path may be absent: read them as optional). */
export function systemError(err: unknown): NodeJS.ErrnoException {
  return err as NodeJS.ErrnoException;
}
