/*
 * sys.c: the syscall wrappers declared in sys.h, in plain C: each returns a value >= 0 or
 * -errno and leaves nothing open or allocated on failure. No N-API here (addon.c is the glue).
 * Owns nothing long-lived: every fd made is handed to the caller.
 * See sys.h for the list of exports and the man pages each leans on.
 */
#define _GNU_SOURCE
#include "sys.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <spawn.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <linux/sched.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

int sys_set_child_subreaper(void) {
  return prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0 ? 0 : -errno;
}

int sys_is_child_subreaper(void) {
  int flag = 0;
  if (prctl(PR_GET_CHILD_SUBREAPER, (unsigned long)&flag, 0, 0, 0) != 0) return -errno;
  return flag != 0;
}

int sys_reap_pid(pid_t pid, struct sys_exit *out) {
  int status = 0;
  pid_t r;
  do r = waitpid(pid, &status, WNOHANG); while (r < 0 && errno == EINTR);
  if (r < 0) return -errno;
  if (r == 0) return 0;
  out->pid = r;
  out->code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  out->signal = WIFEXITED(status) ? -1 : WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  return 1;
}

int sys_peek_exit(pid_t pid, struct sys_exit *out) {
  siginfo_t si;
  memset(&si, 0, sizeof si);
  int r;
  do r = waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT); while (r < 0 && errno == EINTR);
  if (r < 0) return -errno;
  if (si.si_pid == 0) return 0; /* WNOHANG: still running */
  out->pid = si.si_pid;
  out->code = si.si_code == CLD_EXITED ? si.si_status : -1;
  out->signal = si.si_code == CLD_EXITED ? -1 : si.si_status;
  return 1;
}

int sys_continue_stopped(pid_t pid, struct sys_exit *out) {
  siginfo_t si;
  memset(&si, 0, sizeof si);
  int r;
  do r = waitid(P_PID, (id_t)pid, &si, WSTOPPED | WNOHANG); while (r < 0 && errno == EINTR);
  if (r < 0) return -errno;
  if (si.si_pid == 0 || si.si_code != CLD_STOPPED) return 0;
  if (kill(pid, SIGCONT) != 0) return -errno;
  out->pid = si.si_pid;
  out->code = -1;
  out->signal = si.si_status;
  return 1;
}

int sys_make_pipe(int fds[2]) {
  return pipe2(fds, O_CLOEXEC) == 0 ? 0 : -errno;
}

int sys_dup_cloexec(int fd) {
  int r = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  return r < 0 ? -errno : r;
}

int sys_set_pipe_size(int fd, int bytes) {
  int r = fcntl(fd, F_SETPIPE_SZ, bytes);
  return r < 0 ? -errno : r;
}

int sys_try_lock_exclusive(int fd) {
  int r;
  do r = flock(fd, LOCK_EX | LOCK_NB); while (r < 0 && errno == EINTR);
  if (r == 0) return 1;
  return errno == EWOULDBLOCK ? 0 : -errno;
}

int sys_peer_cred(int fd, struct sys_cred *out) {
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return -errno;
  out->pid = cred.pid;
  out->uid = cred.uid;
  out->gid = cred.gid;
  return 0;
}

/* The error path of a multi-step wrapper: closes fd (if >= 0), names the call, returns -err. */
static int fail_at(const char **failed, const char *call, int fd, int err) {
  if (fd >= 0) close(fd);
  *failed = call;
  return -err;
}

int sys_open_pty(int cols, int rows, struct sys_pty *out, const char **failed) {
  int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0) return fail_at(failed, "posix_openpt", -1, errno);
  if (grantpt(master) != 0) return fail_at(failed, "grantpt", master, errno);
  if (unlockpt(master) != 0) return fail_at(failed, "unlockpt", master, errno);
  int err = ptsname_r(master, out->path, sizeof out->path);
  if (err != 0) return fail_at(failed, "ptsname_r", master, err);
  /* Non-blocking: the supervisor reads and writes it from its event loop (libuv). */
  int flags = fcntl(master, F_GETFL);
  if (flags < 0 || fcntl(master, F_SETFL, flags | O_NONBLOCK) != 0) return fail_at(failed, "fcntl", master, errno);
  int slave = open(out->path, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (slave < 0) return fail_at(failed, "open", master, errno);
  int r = sys_set_window_size(master, cols, rows);
  if (r < 0) {
    close(slave);
    return fail_at(failed, "ioctl", master, -r);
  }
  out->master = master;
  out->slave = slave;
  return 0;
}

int sys_set_window_size(int fd, int cols, int rows) {
  struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
  return ioctl(fd, TIOCSWINSZ, &ws) == 0 ? 0 : -errno;
}

int sys_sd_notify(const char *msg, size_t len, const char **failed) {
  const char *path = getenv("NOTIFY_SOCKET");
  if (!path || !*path) return 0;
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  size_t plen = strlen(path);
  if (plen >= sizeof addr.sun_path) return fail_at(failed, "sd_notify", -1, EINVAL);
  memcpy(addr.sun_path, path, plen);
  if (addr.sun_path[0] == '@') addr.sun_path[0] = 0;
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail_at(failed, "socket", -1, errno);
  ssize_t n = sendto(fd, msg, len, MSG_NOSIGNAL, (struct sockaddr *)&addr, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + plen));
  if (n < 0) return fail_at(failed, "sendto", fd, errno);
  close(fd);
  return 1;
}

/* Initial buffer for the *_r lookups, doubled on ERANGE up to MAX_LOOKUP_BYTES. */
static size_t lookup_bytes(int name) {
  long n = sysconf(name);
  return n > 0 && n < 1 << 20 ? (size_t)n : 1024;
}
enum { MAX_LOOKUP_BYTES = 1 << 20 };

/* getpwnam_r (name) or getpwuid_r (name NULL): the shared ERANGE loop. */
static int lookup_passwd(const char *name, uint32_t uid, struct sys_user *out) {
  struct passwd pw, *result = NULL;
  for (size_t size = lookup_bytes(_SC_GETPW_R_SIZE_MAX);; size *= 2) {
    char *buf = malloc(size);
    if (!buf) return -ENOMEM;
    int err;
    do err = name ? getpwnam_r(name, &pw, buf, size, &result) : getpwuid_r((uid_t)uid, &pw, buf, size, &result);
    while (err == EINTR);
    if (err == 0 && result) {
      out->uid = pw.pw_uid;
      out->gid = pw.pw_gid;
      out->name = pw.pw_name;
      out->home = pw.pw_dir ? pw.pw_dir : "";
      out->buf = buf;
      return 0;
    }
    free(buf);
    if (err == ERANGE && size < MAX_LOOKUP_BYTES) continue;
    return err == 0 ? -ENOENT : -err;
  }
}

int sys_getpwnam(const char *name, struct sys_user *out) {
  return lookup_passwd(name, 0, out);
}

int sys_getpwuid(uint32_t uid, struct sys_user *out) {
  return lookup_passwd(NULL, uid, out);
}

void sys_user_free(struct sys_user *user) {
  free(user->buf);
  user->buf = NULL;
}

int sys_getgrnam(const char *name, uint32_t *gid) {
  struct group gr, *result = NULL;
  for (size_t size = lookup_bytes(_SC_GETGR_R_SIZE_MAX);; size *= 2) {
    char *buf = malloc(size);
    if (!buf) return -ENOMEM;
    int err;
    do err = getgrnam_r(name, &gr, buf, size, &result); while (err == EINTR);
    if (err == 0 && result) *gid = gr.gr_gid;
    free(buf);
    if (err == 0) return result ? 0 : -ENOENT;
    if (err == ERANGE && size < MAX_LOOKUP_BYTES) continue;
    return -err;
  }
}

int sys_mknodat(int dirfd, const char *name, uint32_t mode, uint64_t dev) {
  if (strchr(name, '/') || name[0] == '\0') return -EINVAL;
  return mknodat(dirfd, name, (mode_t)mode, (dev_t)dev) == 0 ? 0 : -errno;
}

int sys_renameat_noreplace(int olddirfd, const char *oldname, int newdirfd, const char *newname) {
  if (strchr(oldname, '/') || oldname[0] == '\0' || strchr(newname, '/') || newname[0] == '\0') return -EINVAL;
  return syscall(SYS_renameat2, olddirfd, oldname, newdirfd, newname, RENAME_NOREPLACE) == 0 ? 0 : -errno;
}

int sys_freeze(int fd) {
  return ioctl(fd, FIFREEZE, 0) == 0 ? 0 : -errno;
}

int sys_thaw(int fd) {
  return ioctl(fd, FITHAW, 0) == 0 ? 0 : -errno;
}

int sys_set_times_at(int dirfd, const char *name, int64_t sec, long nsec) {
  struct timespec ts[2] = {{.tv_sec = (time_t)sec, .tv_nsec = nsec}, {.tv_sec = (time_t)sec, .tv_nsec = nsec}};
  if (nsec < 0 || nsec > 999999999) return -EINVAL;
  int r = name ? utimensat(dirfd, name, ts, AT_SYMLINK_NOFOLLOW) : futimens(dirfd, ts);
  return r == 0 ? 0 : -errno;
}

int sys_syncfs(int fd) {
  return syncfs(fd) == 0 ? 0 : -errno;
}

/* Not in Debian 12's headers (include/uapi/linux/stat.h): the mask bit, and stx_mnt_id's offset in struct statx. */
#define SYS_STATX_MNT_ID_UNIQUE 0x00004000U
#define SYS_STATX_MNT_ID_OFFSET 144

int sys_mount_id_unique(int fd, uint64_t *id) {
  /* The kernel's struct statx is 256 bytes; glibc's has no stx_mnt_id, so it is read at its offset. */
  union {
    unsigned char bytes[256];
    uint64_t align;
  } stx;
  memset(&stx, 0, sizeof stx);
  if (syscall(SYS_statx, fd, "", AT_EMPTY_PATH, SYS_STATX_MNT_ID_UNIQUE, stx.bytes) != 0) return -errno;
  uint32_t mask;
  memcpy(&mask, stx.bytes, sizeof mask);
  if (!(mask & SYS_STATX_MNT_ID_UNIQUE)) return 0;
  memcpy(id, stx.bytes + SYS_STATX_MNT_ID_OFFSET, sizeof *id);
  return 1;
}

/* Copies of fds above every target fd (-1: /dev/null): 0 | -errno, none left open on failure. */
static int spawn_sources(const int *fds, int nfds, int *src) {
  for (int made = 0; made < nfds; made++) {
    int fd = fds[made] >= 0 ? fcntl(fds[made], F_DUPFD_CLOEXEC, SYS_SPAWN_MAX_FDS) : -1;
    if (fds[made] < 0) {
      int null = open("/dev/null", O_RDWR | O_CLOEXEC);
      if (null >= 0) {
        fd = fcntl(null, F_DUPFD_CLOEXEC, SYS_SPAWN_MAX_FDS);
        int e = errno;
        close(null);
        errno = e;
      }
    }
    if (fd < 0) {
      int e = -errno;
      for (int i = 0; i < made; i++) close(src[i]);
      return e;
    }
    src[made] = fd;
  }
  return 0;
}

int sys_spawn(const char *path, char *const argv[], char *const envp[], const int *fds, int nfds, pid_t *pid) {
  if (nfds < 0 || nfds > SYS_SPAWN_MAX_FDS) return -EINVAL;
  /* Copies of the sources above every target, so no dup2 overwrites a source still to come. */
  int src[SYS_SPAWN_MAX_FDS];
  int r = spawn_sources(fds, nfds, src);
  if (r < 0) return r;
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  int actions_ok = 0, attr_ok = 0;
  if (r == 0 && (r = -posix_spawn_file_actions_init(&actions)) == 0) actions_ok = 1;
  if (r == 0 && (r = -posix_spawnattr_init(&attr)) == 0) attr_ok = 1;
  for (int i = 0; r == 0 && i < nfds; i++) r = -posix_spawn_file_actions_adddup2(&actions, src[i], i);
  if (r == 0) r = -posix_spawn_file_actions_addchdir_np(&actions, "/");
  sigset_t none, defaults;
  sigemptyset(&none);
  /* Every signal back to SIG_DFL, the two glibc reserves (32, 33) too: left out of the set,
   * its posix_spawn sets them to SIG_IGN in the child, which the exec keeps; and its
   * sigaddset and sigfillset refuse them, so the bits are set directly. */
  memset(&defaults, 0xff, sizeof defaults);
  sigdelset(&defaults, SIGKILL);
  sigdelset(&defaults, SIGSTOP);
  if (r == 0) r = -posix_spawnattr_setsigmask(&attr, &none);
  if (r == 0) r = -posix_spawnattr_setsigdefault(&attr, &defaults);
  if (r == 0) r = -posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  if (r == 0) r = -posix_spawn(pid, path, &actions, &attr, argv, envp);
  if (actions_ok) posix_spawn_file_actions_destroy(&actions);
  if (attr_ok) posix_spawnattr_destroy(&attr);
  for (int i = 0; i < nfds; i++) close(src[i]);
  return r;
}

/* What the spawned child needs: all prepared by the parent (the child allocates nothing). */
struct spawn_child {
  const char *path;
  char *const *argv;
  char *const *envp;
  const int *src;
  int nfds;
  int report_w;
};

/*
 * The child of sys_spawn_in_cgroup, which shares the parent's memory (CLONE_VM) while the
 * parent's thread waits (CLONE_VFORK): async-signal-safe calls only, nothing allocated, no
 * global written; it execs or reports its errno on report_w and _exits.
 */
static int spawn_child_main(void *p) {
  const struct spawn_child *c = p;
  int e = 0;
  for (int i = 0; i < c->nfds && !e; i++)
    if (dup2(c->src[i], i) < 0) e = errno;
  if (!e && setsid() < 0) e = errno;
  if (!e && chdir("/") != 0) e = errno;
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  for (int n = 1; n < 32 && !e; n++)
    if (n != SIGKILL && n != SIGSTOP) sigaction(n, &dfl, NULL);
  sigset_t none;
  sigemptyset(&none);
  if (!e) sigprocmask(SIG_SETMASK, &none, NULL);
  if (!e) execve(c->path, c->argv, c->envp);
  if (!e) e = errno;
  ssize_t w = write(c->report_w, &e, sizeof e);
  (void)w;
  _exit(127);
}

#if defined(__x86_64__)
#define SPAWN_CHILD_STACK_BYTES (64 * 1024)
/*
 * clone3(2) with args->stack set: the child starts on that stack, where no C frame of ours
 * exists, so it must not return from the syscall into C. It calls fn(arg) and exits with its
 * value, as glibc's clone3.S does; the parent gets the pid, or -errno. Registers survive the
 * syscall in the child but rax (0) and rsp; rcx and r11 are the syscall's.
 */
static long clone3_vm(struct clone_args *args, int (*fn)(void *), void *arg) {
  long ret;
  register long r12 __asm__("r12") = (long)fn;
  register long r13 __asm__("r13") = (long)arg;
  __asm__ volatile(
      "syscall\n\t"
      "test %%rax, %%rax\n\t"
      "jnz 1f\n\t"
      "xor %%ebp, %%ebp\n\t"
      "mov %%r13, %%rdi\n\t"
      "call *%%r12\n\t"
      "mov %%eax, %%edi\n\t"
      "mov $60, %%eax\n\t" /* SYS_exit */
      "syscall\n\t"
      "hlt\n\t"
      "1:\n\t"
      : "=a"(ret)
      : "a"((long)SYS_clone3), "D"(args), "S"(sizeof *args), "r"(r12), "r"(r13)
      : "rcx", "r11", "memory");
  return ret;
}
#endif

int sys_spawn_in_cgroup(const char *path, char *const argv[], char *const envp[], const int *fds, int nfds, int cgroup_fd, pid_t *pid, int *exec_failed) {
  *exec_failed = 0;
  if (nfds < 0 || nfds > SYS_SPAWN_MAX_FDS) return -EINVAL;
  int src[SYS_SPAWN_MAX_FDS];
  int r = spawn_sources(fds, nfds, src);
  if (r < 0) return r;
  /* The exec report pipe, above every target fd too (a dup2 in the child must not hit it). */
  int report[2] = {-1, -1}, pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) == 0) {
    for (int k = 0; k < 2; k++) {
      report[k] = fcntl(pipe_fds[k], F_DUPFD_CLOEXEC, SYS_SPAWN_MAX_FDS);
      if (report[k] < 0) r = -errno;
      close(pipe_fds[k]);
    }
  } else {
    r = -errno;
  }
  if (r < 0) {
    for (int k = 0; k < 2; k++)
      if (report[k] >= 0) close(report[k]);
    for (int i = 0; i < nfds; i++) close(src[i]);
    return r;
  }
  struct spawn_child c = {path, argv, envp, src, nfds, report[1]};
  struct clone_args args;
  memset(&args, 0, sizeof args);
  args.flags = CLONE_VFORK | CLONE_INTO_CGROUP;
  args.exit_signal = SIGCHLD;
  args.cgroup = (uint64_t)cgroup_fd;
#if defined(__x86_64__)
  /* CLONE_VM on a stack of its own, as glibc's posix_spawn: the page tables are not copied
   * (a fork of this process copies ~150 MiB of mappings' tables: ~1.5 ms a launch here). */
  /* One guard page below it: an overflow faults in the child, never writes over our memory. */
  long page = sysconf(_SC_PAGESIZE);
  size_t mapped = SPAWN_CHILD_STACK_BYTES + (size_t)page;
  void *stack = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (stack != MAP_FAILED && mprotect(stack, (size_t)page, PROT_NONE) != 0) {
    munmap(stack, mapped);
    stack = MAP_FAILED;
  }
  if (stack != MAP_FAILED) {
    args.flags |= CLONE_VM;
    args.stack = (uint64_t)(uintptr_t)((char *)stack + page);
    args.stack_size = SPAWN_CHILD_STACK_BYTES;
  }
#endif
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  long child;
#if defined(__x86_64__)
  if (args.flags & CLONE_VM)
    child = clone3_vm(&args, spawn_child_main, &c);
  else
#endif
  {
    child = syscall(SYS_clone3, &args, sizeof args);
    if (child == 0) spawn_child_main(&c);
    if (child < 0) child = -errno;
  }
  int clone_errno = child < 0 ? -(int)child : 0;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
#if defined(__x86_64__)
  /* CLONE_VFORK: the child has exec'ed or exited, its stack is free. */
  if (args.flags & CLONE_VM) munmap(stack, mapped);
#endif
  close(report[1]);
  for (int i = 0; i < nfds; i++) close(src[i]);
  if (child < 0) {
    close(report[0]);
    return -clone_errno;
  }
  /* CLONE_VFORK: the child has exec'ed (the pipe closed, nothing in it) or failed and said why. */
  int exec_errno = 0;
  ssize_t n;
  do n = read(report[0], &exec_errno, sizeof exec_errno); while (n < 0 && errno == EINTR);
  close(report[0]);
  if (n == (ssize_t)sizeof exec_errno) {
    int status;
    while (waitpid((pid_t)child, &status, 0) < 0 && errno == EINTR) {
    }
    *exec_failed = 1;
    return -exec_errno;
  }
  *pid = (pid_t)child;
  return 0;
}

int sys_set_thread_name(const char *name) {
  return prctl(PR_SET_NAME, (unsigned long)name, 0, 0, 0) == 0 ? 0 : -errno;
}

int sys_start_writeback(int fd) {
  return sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE) == 0 ? 0 : -errno;
}
