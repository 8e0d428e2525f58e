// The file tool a write_file or read_file session runs (docs/FILES.md): pure Node, no imports
// from the supervisor. `write PATH --mode 0644 --size N`: exactly N bytes from stdin into a
// temp file beside PATH, fsync, fchmod, rename over PATH, fsync the directory. `read PATH`: the
// file's bytes to stdout. Never through a symlink: every parent is opened O_DIRECTORY|O_NOFOLLOW
// relative to the last (via /proc/self/fd/N/NAME), and a symlink as the final name is refused.
// A failure: one JSON line {code, message, ...} on stderr and exit 1 (codes: ipc/errors.ts).
import { randomBytes } from 'node:crypto';
import { closeSync, constants, fchmodSync, fstatSync, fsyncSync, lstatSync, openSync, read, readSync, renameSync, unlinkSync, writeSync } from 'node:fs';

const { O_RDONLY, O_WRONLY, O_CREAT, O_EXCL, O_DIRECTORY, O_NOFOLLOW } = constants;
const O_CLOEXEC = 0o2000000; // Linux; not in fs.constants

/** Waits 1 ms (a non-blocking stdin or stdout that is not ready: never a busy loop). */
const pause = () => Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1);

class ToolError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly details: Record<string, unknown> = {},
  ) {
    super(message);
  }
}

/** The path of NAME inside the directory open at fd: resolving it never follows a link above NAME. */
const at = (dirFd: number, name: string) => `/proc/self/fd/${dirFd}/${name}`;

/** Maps an errno of an open/rename of `what` to a tool error code. */
function fromErrno(err: NodeJS.ErrnoException, what: string): ToolError {
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
function isLink(dirFd: number, name: string): boolean {
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
function openParent(path: string): { dirFd: number; name: string } {
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
      const e = err as NodeJS.ErrnoException;
      // O_DIRECTORY|O_NOFOLLOW on a link is ENOTDIR or ELOOP: say which it was.
      const linked = (e.code === 'ENOTDIR' || e.code === 'ELOOP') && isLink(dirFd, part);
      closeSync(dirFd);
      if (linked) throw new ToolError('SYMLINK_REFUSED', `${walked} is a symbolic link (refused: files are never written or read through a link)`, { path: walked });
      if (e.code === 'ENOTDIR') throw new ToolError('NOT_A_DIRECTORY', `${walked} is not a directory`, { path: walked });
      throw fromErrno(e, walked);
    }
    closeSync(dirFd);
    dirFd = next;
  }
  return { dirFd, name };
}

/** Reads stdin (fd 0) to its end into fd, at most `size + 1` bytes counted; returns the count. Asynchronous (the thread pool's read), so a SIGTERM handler runs meanwhile. */
async function copyStdin(fd: number, size: number): Promise<number> {
  const buf = Buffer.allocUnsafe(1024 * 1024);
  let total = 0;
  for (;;) {
    let n: number;
    try {
      n = await new Promise<number>((resolve, reject) => read(0, buf, 0, buf.length, null, (err, bytes) => (err ? reject(err) : resolve(bytes))));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'EAGAIN') {
        pause();
        continue;
      }
      throw err;
    }
    if (n === 0) return total;
    if (total + n > size) return total + n; // more than asked: a mismatch, nothing more is needed
    let off = 0;
    while (off < n) off += writeSync(fd, buf, off, n - off);
    total += n;
  }
}

/** The temp file to remove if a signal ends the tool before its rename (a session's cancel or deadline: SIGTERM first). */
let unfinished: string | null = null;
for (const sig of ['SIGTERM', 'SIGINT', 'SIGHUP'] as const) {
  process.on(sig, () => {
    if (unfinished) {
      try {
        unlinkSync(unfinished);
      } catch {
        // gone already
      }
    }
    process.stderr.write(`${JSON.stringify({ code: 'FILE_ERROR', message: `ended by ${sig} before the rename; no file was written`, signal: sig })}\n`);
    // Ended by the signal itself (process.exit would wait for the thread blocked in read(2)).
    process.removeAllListeners(sig);
    process.kill(process.pid, sig);
  });
}

async function writeFile(path: string, mode: number, size: number): Promise<void> {
  const { dirFd, name } = openParent(path);
  try {
    if (isLink(dirFd, name)) throw new ToolError('SYMLINK_REFUSED', `${path} is a symbolic link (refused: a write replaces a file, never follows a link)`, { path });
    const tmp = `.${name.slice(0, 200)}.sbx-${randomBytes(6).toString('hex')}.tmp`;
    let fd: number;
    try {
      fd = openSync(at(dirFd, tmp), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600);
    } catch (err) {
      throw fromErrno(err as NodeJS.ErrnoException, `${path} (its temp file)`);
    }
    let renamed = false;
    unfinished = at(dirFd, tmp);
    try {
      const got = await copyStdin(fd, size);
      if (got !== size) throw new ToolError('SIZE_MISMATCH', `${path}: stdin had ${got > size ? `more than ${size}` : got} bytes, size_bytes is ${size}; no file was written`, { expected: size, received: got });
      fchmodSync(fd, mode);
      fsyncSync(fd);
      closeSync(fd);
      fd = -1;
      // The last check before the rename: a link planted at the name since is refused (rename
      // itself would replace the link, never write through it).
      if (isLink(dirFd, name)) throw new ToolError('SYMLINK_REFUSED', `${path} is a symbolic link (refused)`, { path });
      try {
        renameSync(at(dirFd, tmp), at(dirFd, name));
      } catch (err) {
        throw fromErrno(err as NodeJS.ErrnoException, path);
      }
      renamed = true;
      unfinished = null;
      fsyncSync(dirFd);
    } finally {
      if (fd >= 0) closeSync(fd);
      if (!renamed) {
        unfinished = null;
        try {
          unlinkSync(at(dirFd, tmp));
        } catch {
          // already gone
        }
      }
    }
  } finally {
    closeSync(dirFd);
  }
}

function readFile(path: string): void {
  const { dirFd, name } = openParent(path);
  let fd: number;
  try {
    try {
      fd = openSync(at(dirFd, name), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    } catch (err) {
      const e = err as NodeJS.ErrnoException;
      if (e.code === 'ELOOP' || isLink(dirFd, name)) throw new ToolError('SYMLINK_REFUSED', `${path} is a symbolic link (refused: files are never read through a link)`, { path });
      throw fromErrno(e, path);
    }
  } finally {
    closeSync(dirFd);
  }
  try {
    const st = fstatSync(fd);
    if (st.isDirectory()) throw new ToolError('IS_A_DIRECTORY', `${path} is a directory`, { path });
    if (!st.isFile()) throw new ToolError('IS_A_DIRECTORY', `${path} is not a regular file`, { path });
    const buf = Buffer.allocUnsafe(1024 * 1024);
    for (;;) {
      const n = readSync(fd, buf, 0, buf.length, null);
      if (n === 0) break;
      let off = 0;
      while (off < n) {
        try {
          off += writeSync(1, buf, off, n - off);
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== 'EAGAIN') throw err;
          pause();
        }
      }
    }
  } finally {
    closeSync(fd);
  }
}

async function main(argv: string[]): Promise<void> {
  const [verb, path, ...rest] = argv;
  const opt = (name: string): string | undefined => {
    const i = rest.indexOf(name);
    return i >= 0 ? rest[i + 1] : undefined;
  };
  if (verb === 'write' && path) {
    const mode = Number.parseInt(opt('--mode') ?? '0644', 8);
    const size = Number(opt('--size'));
    if (!Number.isSafeInteger(size) || size < 0 || !(mode >= 0 && mode <= 0o7777)) throw new ToolError('INVALID_ARGUMENT', 'usage: write PATH --mode OCTAL --size BYTES');
    await writeFile(path, mode, size);
  } else if (verb === 'read' && path) {
    readFile(path);
  } else {
    throw new ToolError('INVALID_ARGUMENT', 'usage: file-tool write PATH --mode OCTAL --size BYTES | read PATH');
  }
}

main(process.argv.slice(2)).catch((err: unknown) => {
  const e = err instanceof ToolError ? err : fromErrno(err as NodeJS.ErrnoException, 'file tool');
  process.stderr.write(`${JSON.stringify({ code: e.code, message: e.message, ...e.details })}\n`);
  process.exitCode = 1;
});
