/*
 * sys: the few syscalls the supervisor needs and Node does not expose, as plain C. Each
 * returns a value >= 0 on success and -errno on failure; none touches N-API (addon.c does).
 * Exports: sys_set_child_subreaper, sys_is_child_subreaper, sys_reap_pid, sys_peek_exit, sys_continue_stopped, sys_make_pipe,
 * sys_dup_cloexec, sys_set_pipe_size, sys_try_lock_exclusive, sys_peer_cred, sys_open_pty,
 * sys_set_window_size, sys_sd_notify, sys_getpwnam, sys_getpwuid, sys_user_free,
 * sys_getgrnam. See prctl(2), waitpid(2), waitid(2), pipe(2), fcntl(2), flock(2), unix(7),
 * posix_openpt(3), tty_ioctl(4), sd_notify(3), getpwnam_r(3), getgrnam_r(3).
 */
#ifndef SBX_SYS_H
#define SBX_SYS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* How a reaped child ended: exit code, or the signal that killed it (the other is -1). */
struct sys_exit {
  pid_t pid;
  int code;
  int signal;
};

/* A Unix socket peer's credentials (SO_PEERCRED). */
struct sys_cred {
  pid_t pid;
  uint32_t uid;
  uint32_t gid;
};

/* A new pseudo-terminal: both fds O_CLOEXEC, the master O_NONBLOCK, the slave O_NOCTTY. */
struct sys_pty {
  int master;
  int slave;
  char path[128];
};

/* A passwd(5) entry; name and home point into buf (free with sys_user_free). */
struct sys_user {
  uint32_t uid;
  uint32_t gid;
  const char *name;
  const char *home;
  char *buf;
};

/* prctl(PR_SET_CHILD_SUBREAPER, 1): 0 | -errno. */
int sys_set_child_subreaper(void);

/* prctl(PR_GET_CHILD_SUBREAPER): 1 set, 0 not | -errno. */
int sys_is_child_subreaper(void);

/* waitpid(pid, WNOHANG) for that pid only (never -1): 1 reaped (*out filled), 0 still
 * running | -errno (-ECHILD: not our child). */
int sys_reap_pid(pid_t pid, struct sys_exit *out);

/* waitid(P_PID, pid, WEXITED | WNOHANG | WNOWAIT): how that child ended, leaving it a zombie
 * (its pid, /proc/<pid> and a pidfd made for it still answer, cgroup included, until
 * sys_reap_pid). 1 exited (*out filled), 0 still running | -errno (-ECHILD: not our child). */
int sys_peek_exit(pid_t pid, struct sys_exit *out);

/* waitid(P_PID, pid, WSTOPPED | WNOHANG) for that child, then kill(pid, SIGCONT) when it
 * reported a stop: 1 it was stopped and is continued (out->signal the stop signal, out->code
 * -1), 0 not stopped | -errno (-ECHILD: not our child). The stop report is consumed. */
int sys_continue_stopped(pid_t pid, struct sys_exit *out);

/* pipe2(O_CLOEXEC): 0, fds[0] the read end, fds[1] the write end | -errno. */
int sys_make_pipe(int fds[2]);

/* fcntl(F_DUPFD_CLOEXEC): a new fd (>= 3) on the same open file description | -errno. */
int sys_dup_cloexec(int fd);

/* fcntl(F_SETPIPE_SZ): the capacity granted, in bytes | -errno. */
int sys_set_pipe_size(int fd, int bytes);

/* flock(LOCK_EX | LOCK_NB): 1 taken, 0 held by another open file description | -errno. */
int sys_try_lock_exclusive(int fd);

/* getsockopt(SO_PEERCRED) on a connected Unix socket: 0 | -errno. */
int sys_peer_cred(int fd, struct sys_cred *out);

/* posix_openpt, grantpt, unlockpt, ptsname_r, open of the slave, TIOCSWINSZ: 0 | -errno,
 * with *failed naming the call that failed (nothing is left open then). */
int sys_open_pty(int cols, int rows, struct sys_pty *out, const char **failed);

/* ioctl(TIOCSWINSZ): 0 | -errno. */
int sys_set_window_size(int fd, int cols, int rows);

/* One datagram to $NOTIFY_SOCKET ('@' = abstract): 1 sent, 0 NOTIFY_SOCKET unset | -errno,
 * with *failed naming the call that failed. */
int sys_sd_notify(const char *msg, size_t len, const char **failed);

/* getpwnam_r / getpwuid_r through NSS: 0 (*out filled) | -ENOENT no entry | -errno. */
int sys_getpwnam(const char *name, struct sys_user *out);
int sys_getpwuid(uint32_t uid, struct sys_user *out);
void sys_user_free(struct sys_user *user);

/* getgrnam_r through NSS: 0 (*gid filled) | -ENOENT no entry | -errno. */
int sys_getgrnam(const char *name, uint32_t *gid);

/* mknodat(2) of one name (no '/') in dirfd: a fifo, socket or device node; 0 | -errno. */
int sys_mknodat(int dirfd, const char *name, uint32_t mode, uint64_t dev);
/* renameat2(2) with RENAME_NOREPLACE (one component each): 0 | -errno (EEXIST: the new name is taken, nothing moved; EINVAL: the file system cannot). */
int sys_renameat_noreplace(int olddirfd, const char *oldname, int newdirfd, const char *newname);

/* utimensat(2) / futimens(2): atime and mtime set to sec.nsec, exactly; name NULL: dirfd itself; never follows a link. 0 | -errno. */
int sys_set_times_at(int dirfd, const char *name, int64_t sec, long nsec);

/* syncfs(2) of the file system fd is on: 0 | -errno (writeback errors are reported since Linux 5.8). */
int sys_syncfs(int fd);

/* The unique id of the mount fd is on: statx(2) STATX_MNT_ID_UNIQUE (Linux 6.8; never reused
   until the next boot, where /proc's mnt_id is reused by the next mount): 1 and *id; 0 when the
   kernel gives none; -errno. */
int sys_mount_id_unique(int fd, uint64_t *id);

/* sync_file_range(2) of all of fd with SYNC_FILE_RANGE_WRITE: starts writeback of its dirty
 * pages, waits for none (not durable: fsync(2) is): 0 | -errno. */
int sys_start_writeback(int fd);

/* Most fds sys_spawn hands to a child. */
#define SYS_SPAWN_MAX_FDS 16

/*
 * posix_spawn(3) of path (argv, envp NULL-terminated) the way libuv's uv_spawn starts a
 * detached child, without copying this process's page tables (glibc spawns with
 * CLONE_VM|CLONE_VFORK): child fd i is fds[i] (i < nfds; -1: /dev/null), every other fd is
 * closed on exec (all of ours are O_CLOEXEC), cwd "/", a new session (setsid), no signal
 * blocked, every signal at its default action. 0 and *pid | -errno (the exec's own
 * error too: ENOENT, E2BIG, EACCES; EAGAIN, ENOMEM from the clone).
 */
int sys_spawn(const char *path, char *const argv[], char *const envp[], const int *fds, int nfds, pid_t *pid);

/*
 * The same, born in the cgroup v2 directory cgroup_fd is open on: clone3(2) with
 * CLONE_INTO_CGROUP|CLONE_VFORK (Linux 5.7), so it never migrates there. Moving a process
 * with cgroup.procs takes the cgroup threadgroup rwsem for writing, which waits for an RCU
 * grace period: 2-20 ms measured here on every launch. On x86_64 also CLONE_VM, on a 64 KiB
 * stack of its own (as glibc's posix_spawn): a fork copies the supervisor's page tables (the
 * shim's start, pipes included, took 3.9 ms at the mean here with it, 1.25 ms without); the
 * child allocates nothing and writes no global, and the
 * parent thread waits until its exec. Signals are blocked in this thread across the clone
 * (the child resets every handler before unblocking). -errno: ENOSYS or
 * EINVAL where clone3 or CLONE_INTO_CGROUP is missing, EBUSY/EOPNOTSUPP/EACCES from the
 * cgroup, EAGAIN, ENOMEM; or the exec's own error, with *exec_failed set.
 */
int sys_spawn_in_cgroup(const char *path, char *const argv[], char *const envp[], const int *fds, int nfds, int cgroup_fd, pid_t *pid, int *exec_failed);

/* prctl(PR_SET_NAME) of the calling thread: 0 | -errno. */
int sys_set_thread_name(const char *name);

/* ioctl FIFREEZE / FITHAW on an fd of the file system's mount root (ioctl_fifreeze? see fs/ioctl.c): 0 | -errno. */
int sys_freeze(int fd);
int sys_thaw(int fd);

#endif
