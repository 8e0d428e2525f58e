// The file tool a write_file, read_file or upload session runs (docs/guide/files.md): pure Node, no imports
// from the supervisor but core/fs/durable.ts (its temp and rename). Verbs: write PATH, read PATH, upload DIR
// (main). Never through a symlink: every parent is opened O_DIRECTORY|O_NOFOLLOW relative to the last (via
// /proc/self/fd/N/NAME), and a symlink as the final name is refused. A failure: one JSON line {code, message,
// ...} on stderr and exit 1 (codes: ipc/errors.ts).
import { randomBytes } from 'node:crypto';
import { closeSync, constants, fchmodSync, fstatSync, fsyncSync, lstatSync, openSync, read, readSync, unlinkSync, writeSync } from 'node:fs';
import { openTempAt, replaceAt } from '../../core/fs/durable.js';
import { onSignal, uploadDir } from './upload.js';
import { at, fromErrno, isLink, O_CLOEXEC, openParent, ToolError } from './walk.js';
import { errnoCode, systemError } from '../../ipc/errno.js';

const { O_RDONLY, O_NOFOLLOW, O_NONBLOCK } = constants;

/** Waits 1 ms (a non-blocking stdin or stdout that is not ready: never a busy loop). */
const pause = () => Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1);

/** Reads stdin (fd 0) to its end into fd, at most `size + 1` bytes counted; returns the count. Asynchronous (the thread pool's read), so a SIGTERM handler runs meanwhile. */
async function copyStdin(fd: number, size: number): Promise<number> {
  const buf = Buffer.allocUnsafe(1024 * 1024);
  let total = 0;
  for (;;) {
    let n: number;
    try {
      n = await new Promise<number>((resolve, reject) => read(0, buf, 0, buf.length, null, (err, bytes) => (err ? reject(err) : resolve(bytes))));
    } catch (err) {
      if (errnoCode(err) === 'EAGAIN') {
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
    if (onSignal(sig)) return; // an upload: it cleans its staging dir, then ends by the signal
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

/** NOT_A_REGULAR_FILE when NAME inside dirFd is a FIFO, device or socket (lstat: never opened). */
function refuseSpecial(dirFd: number, name: string, path: string): void {
  let st;
  try {
    st = lstatSync(at(dirFd, name));
  } catch {
    return; // absent: it is made
  }
  if (!st.isFile() && !st.isDirectory() && !st.isSymbolicLink())
    throw new ToolError('NOT_A_REGULAR_FILE', `${path} is a FIFO, device or socket (refused: a write replaces a regular file only)`, { path });
}

/** `write PATH --mode 0644 --size N`: exactly N bytes from stdin into a temp file beside PATH, fsync, fchmod, rename over PATH, fsync the directory. */
async function writeFile(path: string, mode: number, size: number): Promise<void> {
  const { dirFd, name } = openParent(path);
  try {
    if (isLink(dirFd, name))
      throw new ToolError('SYMLINK_REFUSED', `${path} is a symbolic link (refused: a write replaces a file, never follows a link)`, { path });
    refuseSpecial(dirFd, name, path);
    const tmp = `.${name.slice(0, 200)}.sbx-${randomBytes(6).toString('hex')}.tmp`;
    let fd: number;
    try {
      fd = openTempAt(dirFd, tmp, 0o600);
    } catch (err) {
      throw fromErrno(systemError(err), `${path} (its temp file)`);
    }
    let renamed = false;
    unfinished = at(dirFd, tmp);
    try {
      const got = await copyStdin(fd, size);
      if (got !== size)
        throw new ToolError('SIZE_MISMATCH', `${path}: stdin had ${got > size ? `more than ${size}` : got} bytes, size_bytes is ${size}; no file was written`, {
          expected: size,
          received: got,
        });
      fchmodSync(fd, mode);
      fsyncSync(fd);
      closeSync(fd);
      fd = -1;
      // The last check before the rename: a link planted at the name since is refused (rename
      // itself would replace the link, never write through it).
      if (isLink(dirFd, name)) throw new ToolError('SYMLINK_REFUSED', `${path} is a symbolic link (refused)`, { path });
      refuseSpecial(dirFd, name, path);
      try {
        replaceAt(dirFd, tmp, name);
      } catch (err) {
        throw fromErrno(systemError(err), path);
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

/** `read PATH`: the file's bytes to stdout. */
function readFile(path: string): void {
  const { dirFd, name } = openParent(path);
  let fd: number;
  try {
    try {
      // O_NONBLOCK: an open of a FIFO returns at once (it would block for a writer, with no
      // signal handler able to run); fstat then refuses it. A regular file's reads ignore it.
      fd = openSync(at(dirFd, name), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    } catch (err) {
      const e = systemError(err);
      if (e.code === 'ELOOP' || isLink(dirFd, name))
        throw new ToolError('SYMLINK_REFUSED', `${path} is a symbolic link (refused: files are never read through a link)`, { path });
      throw fromErrno(e, path);
    }
  } finally {
    closeSync(dirFd);
  }
  try {
    const st = fstatSync(fd);
    if (st.isDirectory()) throw new ToolError('IS_A_DIRECTORY', `${path} is a directory`, { path });
    if (!st.isFile()) throw new ToolError('NOT_A_REGULAR_FILE', `${path} is not a regular file (a FIFO, device or socket: refused)`, { path });
    const buf = Buffer.allocUnsafe(1024 * 1024);
    for (;;) {
      const n = readSync(fd, buf, 0, buf.length, null);
      if (n === 0) break;
      let off = 0;
      while (off < n) {
        try {
          off += writeSync(1, buf, off, n - off);
        } catch (err) {
          if (errnoCode(err) !== 'EAGAIN') throw err;
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
    if (!Number.isSafeInteger(size) || size < 0 || !(mode >= 0 && mode <= 0o7777))
      throw new ToolError('INVALID_ARGUMENT', 'usage: write PATH --mode OCTAL --size BYTES');
    await writeFile(path, mode, size);
  } else if (verb === 'read' && path) {
    readFile(path);
  } else if (verb === 'upload' && path) {
    // `upload DIR`: tar -x into a fresh private staging dir inside DIR, then merged into DIR by renames, never through a link (upload.ts).
    await uploadDir(path);
  } else {
    throw new ToolError('INVALID_ARGUMENT', 'usage: file-tool write PATH --mode OCTAL --size BYTES | read PATH | upload DIR');
  }
}

main(process.argv.slice(2)).catch((err: unknown) => {
  const e = err instanceof ToolError ? err : fromErrno(systemError(err), 'file tool');
  process.stderr.write(`${JSON.stringify({ code: e.code, message: e.message, ...e.details })}\n`);
  process.exitCode = 1;
});
