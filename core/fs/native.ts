// Loads the native helper (native-helpers/, built by node-gyp at npm install) and finds the
// exec shim beside it. Says every place it looked when it cannot find them.
import { accessSync, constants } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * The addon's surface (native-helpers/src/addon.c over sys.c). A failed call throws an Error
 * like node:fs does: `code` the errno name, `errno` negative, `syscall`; bad arguments throw
 * a TypeError with code EINVAL. Fds it returns are O_CLOEXEC.
 */
export interface NativeHelpers {
  /** prctl(PR_SET_CHILD_SUBREAPER, 1): this process adopts its orphaned descendants. */
  setChildSubreaper(): void;
  /** prctl(PR_GET_CHILD_SUBREAPER). */
  isChildSubreaper(): boolean;
  /** waitpid(pid, WNOHANG) for that pid only: null while it runs, else how it ended; ECHILD if not our child. */
  reapPid(pid: number): { pid: number; code: number | null; signal: number | null } | null;
  /** waitid(P_PID, pid, WEXITED|WNOHANG|WNOWAIT): how that child ended, leaving it a zombie until reapPid; null while it runs; ECHILD if not our child. */
  peekExit(pid: number): { pid: number; code: number | null; signal: number | null } | null;
  /**
   * waitid(P_PID, pid, WSTOPPED|WNOHANG), then kill(pid, SIGCONT) if that child reported a stop
   * (the report is consumed): null when it was not stopped, else the stop signal in `signal`;
   * ECHILD if not our child. See waitid(2), signal(7) SIGCONT.
   */
  continueStopped(pid: number): { pid: number; code: number | null; signal: number | null } | null;
  /** pipe2(O_CLOEXEC): [readFd, writeFd] of a real pipe. */
  makePipe(): [number, number];
  /** fcntl(F_SETPIPE_SZ): the capacity granted, in bytes; EBADF on a fd that is not a pipe, EPERM above pipe-max-size. */
  setPipeSize(fd: number, bytes: number): number;
  /** flock(LOCK_EX|LOCK_NB): true when taken, false when held elsewhere; held while fd is open. */
  tryLockExclusive(fd: number): boolean;
  /** getsockopt(SO_PEERCRED) on a connected Unix socket fd; ENOTSOCK on anything else. */
  peerCred(fd: number): { pid: number; uid: number; gid: number };
  /** posix_openpt + grantpt + unlockpt + TIOCSWINSZ (cols, rows 1..65535): the master O_NONBLOCK, the slave O_NOCTTY; syscall names the step that failed. */
  openPty(cols: number, rows: number): { master: number; slave: number; path: string };
  /** ioctl(TIOCSWINSZ): the foreground process group gets SIGWINCH; ENOTTY on a non-tty. */
  setWindowSize(fd: number, cols: number, rows: number): void;
  /** sd_notify(3): false when $NOTIFY_SOCKET is unset, true when the datagram was sent (message: at most 4096 bytes). */
  sdNotify(message: string): boolean;
  /** getpwnam_r(3) through NSS: the passwd entry; ENOENT when there is no such user. */
  userByName(name: string): { uid: number; gid: number; name: string; home: string };
  /** getpwuid_r(3) through NSS (uid 0..4294967294): the passwd entry; ENOENT when no entry has that uid. */
  userById(uid: number): { uid: number; gid: number; name: string; home: string };
  /** mknodat(2): a fifo, socket or device node (mode: type and permission bits; rdev: st_rdev) named name (bytes, no '/') in dirFd; EEXIST when the name is taken (never replaced, never followed). */
  mknodAt(dirFd: number, name: Buffer, mode: number, rdev: number): void;
  /** renameat2(2) RENAME_NOREPLACE of oldName in oldDirFd to newName in newDirFd (one component each): true when moved, false when newName exists (nothing moved); EINVAL where the file system cannot. */
  renameAtNoReplace(oldDirFd: number, oldName: Buffer, newDirFd: number, newName: Buffer): boolean;
  /** fileio_read_at (fileio.c; file-at.ts readWholeAt): bytes read into buf; stats the fstats before and after (2 x 10 slots). */
  readFileAt(dirFd: number, name: Buffer, extraFlags: number, buf: Buffer, stats: BigInt64Array): number;
  /**
   * fileio_hash_many (fileio.h): readFileAt of each NUL-ended name in `names` (n of them, each
   * 1-255 bytes without '/') on up to `threads` threads, each with a cap-byte buffer of its own;
   * rc[i] the bytes read or -errno, stats[i x 20...] the fstats before and after, digests[i x
   * 32...] the SHA-256 of the bytes read when they are the whole regular file (rc < cap; else
   * untouched). Blocks the calling thread; throws EINVAL on bad arguments.
   */
  hashFilesAt(dirFd: number, names: Buffer, extraFlags: number, cap: number, threads: number, rc: Float64Array, stats: BigInt64Array, digests: Buffer): void;
  /** fileio_write_new_at (fileio.c; durable.ts writeTempBytesAt): name created O_EXCL with mode, bytes written, closed. */
  writeFileNewAt(dirFd: number, name: Buffer, mode: number, bytes: Buffer): void;
  /** utimensat(2) with AT_SYMLINK_NOFOLLOW of name in dirFd (null: futimens(2) of dirFd): atime and mtime set to sec + nsec, exactly. */
  setTimesAt(dirFd: number, name: Buffer | null, sec: number, nsec: number): void;
  /** syncfs(2) of the file system fd is on (blocking: call it off the event loop); writeback errors are reported (Linux 5.8+). */
  syncfsFd(fd: number): void;
  /** statx(2) STATX_MNT_ID_UNIQUE of fd: the unique id of its mount (Linux 6.8+; never reused until the next boot, where /proc's mnt_id is reused by the next mount), or null when the kernel gives none. Throws errno errors. */
  mountIdUnique(fd: number): bigint | null;
  /**
   * sync_file_range(2) of the whole file with SYNC_FILE_RANGE_WRITE: starts the writeback of
   * its dirty pages and returns (it may wait for the device queue, never for the data):
   * nothing is durable until fsync(2), which then has less left to do.
   */
  startWriteback(fd: number): void;
  /**
   * posix_spawn(3) of path, as child_process.spawn with detached: true and cwd "/" starts
   * one, without copying this process's page tables (glibc: CLONE_VM|CLONE_VFORK): fds[i]
   * becomes the child's fd i (-1: /dev/null; 16 at most), every other fd is closed on exec,
   * a new session, no signal blocked, every signal at its default. Returns the pid; throws
   * with the exec's errno (ENOENT, EACCES, E2BIG) or the clone's (EAGAIN, ENOMEM). The child
   * is not libuv's: it is reaped by the Reaper (adopt()). cgroupFd (a cgroup v2 directory,
   * open): the child is born in it, clone3(2) CLONE_INTO_CGROUP (Linux 5.7), never migrated
   * (syscall "clone3"; ENOSYS or EINVAL where the kernel lacks it, EBUSY, EOPNOTSUPP or
   * EACCES from the cgroup).
   */
  spawnDetached(path: string, argv: string[], env: string[], fds: number[], cgroupFd?: number): number;
  /** prctl(PR_SET_NAME) of the calling thread (at most 15 bytes): its name in /proc/<pid>/task/<tid>/comm. */
  setThreadName(name: string): void;
  /** ioctl(FIFREEZE) of the file system whose mount root fd is open on (ioctl_fifreeze, fs/ioctl.c): writes to it block until thaw; EOPNOTSUPP where unsupported, EBUSY if frozen. */
  freeze(fd: number): void;
  /** ioctl(FITHAW): undoes freeze; EINVAL when it was not frozen. */
  thaw(fd: number): void;
  /** getgrnam_r(3) through NSS: the gid; ENOENT when there is no such group. */
  groupByName(name: string): number;
  /** Calls callback once, from the event loop, when fd is writable, hung up or in error (the next write says which); returns cancel(), idempotent. Watches a dup of fd. */
  waitWritable(fd: number, callback: () => void): () => void;
  /**
   * fanotify_init(FAN_CLASS_NOTIF|FAN_CLOEXEC|FAN_NONBLOCK|FAN_REPORT_DFID_NAME|FAN_REPORT_PIDFD
   * [|FAN_UNLIMITED_QUEUE]): the group's fd; EPERM without CAP_SYS_ADMIN (fanotify_init(2)).
   */
  watchInit(unlimitedQueue: boolean): number;
  /** fanotify_mark(FAN_MARK_ADD|FAN_MARK_FILESYSTEM) on path's file system (FAN_MODIFY only with reportModify: close-write stands for writes otherwise); ENOTSUP/EXDEV where it has no usable fids (fanotify_mark(2)). */
  watchMark(fd: number, path: string, reportModify: boolean): void;
  /** fanotify_mark(FAN_MARK_ADD|FAN_MARK_FILESYSTEM, FAN_MODIFY) on path's file system: every write(2) that wrote, with its writer (the cgroup escape watch, on cgroup2). */
  watchMarkWrites(fd: number, path: string): void;
  /** poll(2) the group up to timeoutMs: true when events are queued. Blocks: for a worker thread. */
  watchPoll(fd: number, timeoutMs: number): boolean;
  /**
   * One read(2) of queued events (none: []). Events by selfPid are dropped unless their
   * name starts with keepName. Each pidfd becomes the writer's cgroup id (PIDFD_GET_INFO, else cgroupMount's
   * /proc lookup; 0n: the writer was reaped first, pidfd 0) and is closed. handle: fsid, type,
   * bytes of the directory's file handle; target: the entry's own handle in the same form
   * (FAN_REPORT_TARGET_FID: a create's, delete's or move's child; null when not reported); name:
   * the entry's name bytes ("." the directory itself).
   */
  watchRead(
    fd: number,
    selfPid: number,
    keepName: string,
    cgroupMount: string,
  ): { mask: number; pid: number; pidfd: number; cgroup: bigint; handle: Buffer; target: Buffer | null; name: Buffer }[] & {
    /** selfPid's events read and dropped (not in the array). */
    own: number;
  };
  /**
   * One directory's entries sorted by name bytes, each with its lstat (fstatat(2)
   * AT_SYMLINK_NOFOLLOW relative to dirFd, readlinkat(2) for a link): `stats` holds `fields`
   * int64s per entry in native-helpers/src/statdir.h's order (errno, mode, uid, gid, nlink,
   * dev, ino, size, blocks, rdev, mtime ns, ctime ns, target length); `names` per entry a u16
   * length (host order), the name, then a link's target. Throws the listing's errno.
   */
  statDir(dirFd: number): { count: number; fields: number; stats: BigInt64Array; names: Buffer };
  /**
   * statDir of each of dirFds on up to `threads` threads at once (the calling thread waits:
   * git's preload-index, for a walk's listings): element i is dirFds[i]'s listing, or
   * `{ errno }` when that listing failed. Throws EINVAL on bad arguments. Every fd must stay
   * open for the call: a closed fd's number can be taken by any thread's open meanwhile
   * (this call's own openat(2) of "." included), and that directory would be listed.
   */
  statDirs(dirFds: Int32Array, threads: number): ({ count: number; fields: number; stats: BigInt64Array; names: Buffer } | { errno: number })[];
  /** open_by_handle_at(2) + readlink: the directory a watchRead handle names; ESTALE when it is gone. */
  watchHandlePath(mountFd: number, handle: Buffer): Buffer;
}

const here = dirname(fileURLToPath(import.meta.url));
// Source (core/fs/) and compiled (dist/core/fs/) layouts.
const buildDirs = [resolve(here, '../../native-helpers/build/Release'), resolve(here, '../../../native-helpers/build/Release')];

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

/** The addon, or null where it cannot be loaded (callers with a node:fs way instead: the walk's listing, the store's moves). */
export function nativeOrNull(): NativeHelpers | null {
  try {
    return native();
  } catch {
    return null;
  }
}

/** Absolute path of the sbx-exec-shim executable; throws (code ENOENT) naming every path tried. */
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
  // ENOENT, so a session that cannot start for it says so in its receipt (spawn_error), not EUNKNOWN.
  throw Object.assign(new Error(`exec shim not found (run npm ci); looked in: ${tried.join(', ')}`), { code: 'ENOENT', errno: -2 });
}

/** What the addon's stats give for a time past int64 nanoseconds (before 1677, after 2262: native-helpers/src/timens.h): INT64_MIN, which no time in range is. */
export const TIME_OUT_OF_RANGE = -(2n ** 63n);

/** A time the addon's stats gave at v[at] in nanoseconds, or, when that did not fit (TIME_OUT_OF_RANGE), from its seconds and nanoseconds at v[secAt] and v[secAt + 1]: exact either way. */
export function timeNsAt(v: BigInt64Array, at: number, secAt: number): bigint {
  const ns = v[at];
  return ns !== TIME_OUT_OF_RANGE ? ns : v[secAt] * 1_000_000_000n + v[secAt + 1];
}
