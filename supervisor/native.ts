// Loads the native helper (native-helpers/, built by node-gyp at npm install) and finds the
// exec shim beside it. Says every place it looked when it cannot find them.
import { accessSync, constants } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The addon's surface (native-helpers/src/addon.c); errors carry `code` = errno name. */
export interface NativeHelpers {
  /** prctl(PR_SET_CHILD_SUBREAPER, 1). */
  setChildSubreaper(): void;
  /** prctl(PR_GET_CHILD_SUBREAPER). */
  isChildSubreaper(): boolean;
  /** waitpid(pid, WNOHANG) for that pid only: null while it runs; ECHILD if not our child. */
  reapPid(pid: number): { pid: number; code: number | null; signal: number | null } | null;
  /** pipe2(O_CLOEXEC): [readFd, writeFd]. */
  makePipe(): [number, number];
  /** fcntl(F_SETPIPE_SZ): the capacity granted, in bytes. */
  setPipeSize(fd: number, bytes: number): number;
  /** getsockopt(SO_PEERCRED) on a connected Unix socket fd. */
  peerCred(fd: number): { pid: number; uid: number; gid: number };
  /** posix_openpt + grantpt + unlockpt; both fds O_CLOEXEC, the slave O_NOCTTY. */
  openPty(cols: number, rows: number): { master: number; slave: number; path: string };
  /** sd_notify(3): false when $NOTIFY_SOCKET is unset. */
  sdNotify(message: string): boolean;
  /** ioctl(TIOCSWINSZ). */
  setWindowSize(fd: number, cols: number, rows: number): void;
  /** flock(LOCK_EX|LOCK_NB): true when taken, false when held elsewhere; held while fd is open. */
  tryLockExclusive(fd: number): boolean;
}

const here = dirname(fileURLToPath(import.meta.url));
// Source (supervisor/) and compiled (dist/supervisor/) layouts.
const buildDirs = [resolve(here, '../native-helpers/build/Release'), resolve(here, '../../native-helpers/build/Release')];

let cached: NativeHelpers | null = null;

/** The addon, loaded once; throws naming every path tried. */
export function native(): NativeHelpers {
  if (cached) return cached;
  const require = createRequire(import.meta.url);
  const errors: string[] = [];
  for (const dir of buildDirs) {
    try {
      cached = require(resolve(dir, 'sbx_native.node')) as NativeHelpers;
      return cached;
    } catch (err) {
      errors.push(`${dir}/sbx_native.node: ${(err as Error).message.split('\n')[0]}`);
    }
  }
  throw new Error(`native helper not found (run npm ci, which builds it with node-gyp); looked in:\n  ${errors.join('\n  ')}`);
}

/** Absolute path of the sbx-exec-shim executable; throws naming every path tried. */
export function execShimPath(): string {
  const tried: string[] = [];
  for (const dir of buildDirs) {
    const path = resolve(dir, 'sbx-exec-shim');
    try {
      accessSync(path, constants.X_OK);
      return path;
    } catch {
      tried.push(path);
    }
  }
  throw new Error(`exec shim not found (run npm ci); looked in: ${tried.join(', ')}`);
}
