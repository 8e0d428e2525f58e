/*
 * sbx-exec-shim: what runs between the supervisor's fork and the command's exec.
 *
 *   sbx-exec-shim [--parent-pid PID] [--cgroup-procs PATH] [--uid N --gid N [--user NAME]]
 *                 [--cwd DIR] [--report-fd N] [--setctty]
 *                 [--subreaper --control-fd N [--hold] [--no-forward]]
 *                 (--argv-fd N | -- CMD [ARG...])
 *
 * Exports nothing: a standalone executable (main), spawned by supervisor/session/spawn.ts.
 *
 * --argv-fd N: the command's argv comes on fd N, not in the shim's own arguments, so an argv
 * the kernel refuses (E2BIG: over ARG_MAX, or a string over MAX_ARG_STRLEN, execve(2)) fails
 * at the command's exec, where it is reported, not at the shim's. On the fd: a 16-byte header,
 * the string count then the byte count of what follows (each an unsigned 64-bit little-endian
 * integer), then exactly that many bytes holding exactly that many NUL-terminated strings,
 * then EOF. It is read and checked whole before anything else (still under PR_SET_PDEATHSIG):
 * EOF before the end is "error argv 5" (EIO); a count of 0, over 1 GiB of bytes, another number
 * of strings, no NUL at the end or bytes after it is "error argv 71" (EPROTO); exit 125,
 * nothing run. The environment stays in the shim's own environ.
 *
 * --setctty: fd 0 is a pty slave; make it the controlling terminal (the shim is already a
 * session leader: the supervisor spawns it detached, setsid(2)), see tty_ioctl(4) TIOCSCTTY.
 *
 * --hold (with --subreaper, for ptys): after "done", stay until the control fd reaches EOF,
 * so the tty's session and its leader outlast the drain: the supervisor lets go once it has
 * read the master to EIO. (A pty's session leader exiting does not hang the tty up, only
 * another tty's would: disassociate_ctty() in drivers/tty/tty_jobctrl.c sends SIGHUP to the
 * foreground group, empty at "done"; what loses bytes in flight is the last slave fd closing
 * before the master is read, which the supervisor's own slave fd prevents, docs/design/facts.md 16.)
 * --no-forward: signals sent to the shim are absorbed, not forwarded (the supervisor signals
 * every pid of the cgroup).
 *
 * --uid/--gid: after joining the cgroup (an unprivileged process cannot write cgroup.procs),
 * drop to that user: supplementary groups from initgroups(3) for --user NAME (else none),
 * then setgid, then setuid; a drop that fails, or that could be undone, is a stage error.
 *
 * --parent-pid: until the cgroup is joined, the shim dies with its parent
 * (PR_SET_PDEATHSIG), so a supervisor killed mid-spawn never leaves a command running
 * outside the cgroup it was admitted to; once inside, the command outlives the supervisor.
 *
 * Exec mode (no --subreaper: the supervisor has a cgroup and no pty): join the session's
 * cgroup (write "0" to cgroup.procs, so the command is inside before its first instruction),
 * chdir, reset every signal disposition and the mask (Node ignores SIGPIPE), close every fd
 * above 2, execvp.
 * An exec failure is reported on the CLOEXEC report fd as "error exec <errno>\n" and
 * the shim exits 127 (not found) or 126 (anything else: not executable, E2BIG), as sh and
 * bash do; EOF with nothing read means the exec succeeded. A failure before exec is
 * "error <stage> <errno>", exit 125.
 *
 * Subreaper mode (--subreaper: no cgroup, or a pty whose session the shim holds): stay as
 * the session's own subreaper, tini-style: join the cgroup if given, fork the command, reap
 * every descendant, and report on the report fd, one line each:
 *   "started <pid>"            the command exec'ed (else its "error exec <errno>" line)
 *   "leader exit <code>" | "leader signal <n>"   the leader was reaped
 *   "signaled <sig> <pids>"    a signal read from the control fd was delivered to every
 *                              live descendant (one line per byte, in order)
 *   "forwarded <sig> <pids>"   a signal sent to the shim itself was (never taken for the
 *                              answer to a control byte)
 *   "done <reaped>"            leader reaped and no descendant is left (waitpid: ECHILD);
 *                              in the same write as "leader ..." when the pass that reaped
 *                              the leader found no child left
 * Each byte read from the control fd is a signal number to deliver to every descendant
 * (walking /proc/<pid>/task/<tid>/children); signals sent to the shim itself are
 * forwarded the same way, but a SIGCONT from its parent (the supervisor undoing a stop of
 * the shim the command made, supervisor/reaper.ts). See prctl(2) PR_SET_CHILD_SUBREAPER, execve(2), close_range(2),
 * signalfd(2), proc(5) /proc/[pid]/task/[tid]/children, cgroups(7) cgroup.procs.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <grp.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

struct options {
  pid_t parent_pid;
  long uid, gid;
  const char *user;
  const char *cgroup_procs;
  const char *cwd;
  int report_fd;
  int subreaper;
  int setctty;
  int hold;
  int no_forward;
  int control_fd;
  int argv_fd;
  char **argv;
};

/* The report pipe's reader (the supervisor) is gone: EPIPE once, then nothing more is written. */
static int report_lost;

/* Writes one report line; a lost reader is not our concern: after EPIPE the shim stops writing
 * (each write would raise SIGPIPE again, which the subreaper loop reads from its signalfd). */
static void report(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void report(int fd, const char *fmt, ...) {
  if (fd < 0 || report_lost) return;
  char line[128];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (n <= 0) return;
  if ((size_t)n >= sizeof line) n = sizeof line - 1;
  ssize_t w;
  do w = write(fd, line, (size_t)n); while (w < 0 && errno == EINTR);
  if (w < 0 && errno == EPIPE) report_lost = 1;
}

static int parse_fd(const char *s) {
  char *end;
  long v = strtol(s, &end, 10);
  return (*s && !*end && v >= 0 && v < 1 << 20) ? (int)v : -1;
}

static int parse_args(int argc, char **argv, struct options *o) {
  memset(o, 0, sizeof *o);
  o->report_fd = -1;
  o->control_fd = -1;
  o->argv_fd = -1;
  o->uid = -1;
  o->gid = -1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--")) {
      if (i + 1 >= argc || o->argv_fd >= 0) return -1;
      o->argv = &argv[i + 1];
      return 0;
    }
    if (!strcmp(a, "--subreaper")) { o->subreaper = 1; continue; }
    if (!strcmp(a, "--setctty")) { o->setctty = 1; continue; }
    if (!strcmp(a, "--hold")) { o->hold = 1; continue; }
    if (!strcmp(a, "--no-forward")) { o->no_forward = 1; continue; }
    if (i + 1 >= argc) return -1;
    const char *v = argv[++i];
    if (!strcmp(a, "--cgroup-procs")) o->cgroup_procs = v;
    else if (!strcmp(a, "--parent-pid")) { if ((o->parent_pid = parse_fd(v)) <= 0) return -1; }
    else if (!strcmp(a, "--uid")) { char *e; o->uid = strtol(v, &e, 10); if (*e || o->uid < 0) return -1; }
    else if (!strcmp(a, "--gid")) { char *e; o->gid = strtol(v, &e, 10); if (*e || o->gid < 0) return -1; }
    else if (!strcmp(a, "--user")) o->user = v;
    else if (!strcmp(a, "--cwd")) o->cwd = v;
    else if (!strcmp(a, "--report-fd")) { if ((o->report_fd = parse_fd(v)) < 3) return -1; }
    else if (!strcmp(a, "--control-fd")) { if ((o->control_fd = parse_fd(v)) < 3) return -1; }
    else if (!strcmp(a, "--argv-fd")) { if ((o->argv_fd = parse_fd(v)) < 3) return -1; }
    else return -1;
  }
  return o->argv_fd >= 0 ? 0 : -1;
}

/* Reads exactly len bytes; 0, or -1 with errno (EIO for EOF before the end). */
static int read_full(int fd, void *buf, size_t len) {
  size_t got = 0;
  while (got < len) {
    ssize_t n = read(fd, (char *)buf + got, len - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) { errno = EIO; return -1; }
    got += (size_t)n;
  }
  return 0;
}

static uint64_t le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* The command's argv from fd (the protocol in the header comment), NULL-terminated;
   NULL with errno: EIO short, EPROTO garbled, ENOMEM, or read(2)'s. Closes fd. */
static char **read_argv(int fd) {
  enum { MAX_BYTES = 1 << 30 };
  char **argv = NULL;
  char *buf = NULL;
  unsigned char head[16];
  int err = 0;
  if (read_full(fd, head, sizeof head) != 0) { err = errno; goto out; }
  uint64_t count = le64(head), bytes = le64(head + 8);
  if (count == 0 || bytes < count || bytes > MAX_BYTES) { err = EPROTO; goto out; }
  buf = malloc((size_t)bytes);
  argv = calloc((size_t)count + 1, sizeof *argv);
  if (!buf || !argv) { err = ENOMEM; goto out; }
  if (read_full(fd, buf, (size_t)bytes) != 0) { err = errno; goto out; }
  char extra;
  ssize_t n;
  do n = read(fd, &extra, 1); while (n < 0 && errno == EINTR);
  if (n != 0) { err = n < 0 ? errno : EPROTO; goto out; }
  if (buf[bytes - 1] != 0) { err = EPROTO; goto out; }
  uint64_t k = 0;
  for (char *p = buf, *end = buf + bytes; p < end; p += strlen(p) + 1) {
    if (k == count) { err = EPROTO; goto out; }
    argv[k++] = p;
  }
  if (k != count) err = EPROTO;
out:
  close(fd);
  if (err) {
    free(buf);
    free(argv);
    errno = err;
    return NULL;
  }
  return argv;
}

/* Drops to uid/gid with the user's groups; 0, or -1 with errno set. */
static int drop_privileges(const struct options *o) {
  if (o->uid < 0) return 0;
  gid_t gid = (gid_t)(o->gid >= 0 ? o->gid : o->uid);
  if (o->user ? initgroups(o->user, gid) != 0 : setgroups(0, NULL) != 0) return -1;
  if (setgid(gid) != 0 || setuid((uid_t)o->uid) != 0) return -1;
  if (o->uid != 0 && (setuid(0) == 0 || seteuid(0) == 0)) {
    errno = EPERM; /* could regain root: refuse to run the command */
    return -1;
  }
  return 0;
}

/* Every catchable signal back to SIG_DFL and an empty mask, as a fresh exec expects. */
static void reset_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = SIG_DFL;
  sigemptyset(&sa.sa_mask);
  for (int sig = 1; sig < NSIG; sig++) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    sigaction(sig, &sa, NULL); /* EINVAL for glibc-reserved RT signals is fine */
  }
  sigset_t empty;
  sigemptyset(&empty);
  sigprocmask(SIG_SETMASK, &empty, NULL);
}

/* Close every fd above 2 except keep (which is made CLOEXEC). close_range(2), else a loop. */
static void close_fds_above_2(int keep) {
  if (keep >= 0) fcntl(keep, F_SETFD, FD_CLOEXEC);
  unsigned int first = 3;
  if (keep >= 3) {
    if (keep > 3 && syscall(SYS_close_range, 3u, (unsigned)keep - 1, 0u) != 0) goto fallback;
    first = (unsigned)keep + 1;
  }
  if (syscall(SYS_close_range, first, ~0u, 0u) == 0) return;
fallback:;
  long max = sysconf(_SC_OPEN_MAX);
  for (long fd = 3; fd < (max > 0 ? max : 65536); fd++)
    if (fd != keep) close((int)fd);
}

/* chdir, reset signals, close fds, execvp; on failure report and _exit(126/127). */
static void __attribute__((noreturn)) exec_command(const struct options *o, int report_fd) {
  if (o->cwd && chdir(o->cwd) != 0) {
    report(report_fd, "error chdir %d\n", errno);
    _exit(125);
  }
  reset_signals();
  close_fds_above_2(report_fd);
  execvp(o->argv[0], o->argv);
  int err = errno;
  report(report_fd, "error exec %d\n", err);
  _exit(err == ENOENT || err == ENOTDIR ? 127 : 126);
}

/* Join a cgroup v2 leaf by writing "0" (this process) to its cgroup.procs. */
static int join_cgroup(const char *procs_path) {
  int fd = open(procs_path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t w;
  do w = write(fd, "0", 1); while (w < 0 && errno == EINTR);
  int err = errno;
  close(fd);
  if (w != 1) { errno = err; return -1; }
  return 0;
}

/* Children of pid across all its threads (proc(5) /proc/pid/task/tid/children). */
static int read_children(pid_t pid, pid_t *out, int max) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *d = opendir(path);
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) && n < max) {
    if (e->d_name[0] == '.') continue;
    char cpath[320];
    snprintf(cpath, sizeof cpath, "/proc/%d/task/%s/children", (int)pid, e->d_name);
    FILE *f = fopen(cpath, "re");
    if (!f) continue;
    int c;
    while (n < max && fscanf(f, "%d", &c) == 1) out[n++] = c;
    fclose(f);
  }
  closedir(d);
  return n;
}

/* Pids signalled by one signal_descendants call: an open-addressing set (0: empty slot). */
enum { SIGNALLED_SLOTS = 1 << 17 };
static pid_t signalled[SIGNALLED_SLOTS];

/* Adds pid to the set; 0 when it was there already (or the set is full: then it is signalled again). */
static int signalled_add(pid_t pid) {
  unsigned h = ((unsigned)pid * 2654435761u) & (SIGNALLED_SLOTS - 1);
  for (unsigned i = 0; i < SIGNALLED_SLOTS; i++, h = (h + 1) & (SIGNALLED_SLOTS - 1)) {
    if (signalled[h] == pid) return 0;
    if (signalled[h] == 0) {
      signalled[h] = pid;
      return 1;
    }
  }
  return 1;
}

/*
 * Deliver sig to every descendant of this process, breadth first; returns pids reached (each
 * counted once). A process's children are read before it is signalled: one that dies of the
 * signal has its children reparented to us (the subreaper), out of the list already read, so a
 * walk that signalled first missed them. Those reparented meanwhile, or forked between the
 * read and the kill, are found by walking again from our own children, until a walk reaches
 * no pid it had not (at most WALKS times: a fork loop is left to the supervisor's KILLs).
 */
static int signal_descendants(int sig) {
  enum { MAX = 65536, WALKS = 16 };
  static pid_t queue[MAX];
  memset(signalled, 0, sizeof signalled);
  int reached = 0;
  for (int walk = 0; walk < WALKS; walk++) {
    int head = 0, tail = read_children(getpid(), queue, MAX), fresh = 0;
    while (head < tail) {
      pid_t p = queue[head++];
      tail += read_children(p, queue + tail, MAX - tail);
      if (!signalled_add(p)) continue;
      fresh++;
      if (kill(p, sig) == 0) reached++;
    }
    if (fresh == 0) break;
  }
  return reached;
}

/* Subreaper mode: fork the command and reap everything until the leader and all are gone. */
static int run_subreaper(const struct options *o) {
  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) {
    report(o->report_fd, "error prctl %d\n", errno);
    return 125;
  }
  sigset_t all;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, NULL);
  int sfd = signalfd(-1, &all, SFD_CLOEXEC | SFD_NONBLOCK);
  int exec_pipe[2];
  if (sfd < 0 || pipe2(exec_pipe, O_CLOEXEC) != 0) {
    report(o->report_fd, "error setup %d\n", errno);
    return 125;
  }
  pid_t leader = fork();
  if (leader < 0) {
    report(o->report_fd, "error fork %d\n", errno);
    return 125;
  }
  if (leader == 0) {
    close(exec_pipe[0]);
    if (o->control_fd >= 0) close(o->control_fd);
    exec_command(o, exec_pipe[1]);
  }
  close(exec_pipe[1]);
  /* The shim must not hold the session's stdout/stderr open: EOF belongs to the command. */
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0) { dup2(devnull, 0); dup2(devnull, 1); dup2(devnull, 2); close(devnull); }

  char buf[64];
  ssize_t n;
  do n = read(exec_pipe[0], buf, sizeof buf - 1); while (n < 0 && errno == EINTR);
  close(exec_pipe[0]);
  int exec_failed = n > 0;
  if (exec_failed) {
    buf[n] = 0;
    report(o->report_fd, "%s", buf);
  } else {
    report(o->report_fd, "started %d\n", (int)leader);
  }

  int leader_status = -1, leader_reaped = 0, reaped = 0, control_open = o->control_fd >= 0;
  /* The "leader" line, held until the end of the reaping pass that made it: when that pass
   * also finds no child left, "leader ..." and "done ..." go out in one write(2) (under
   * PIPE_BUF: atomic, pipe(7)), so the supervisor reads both at once and never takes the
   * moment between them for descendants still alive at the leader's exit. */
  char leader_line[64] = "";
  for (;;) {
    /* Reap every child that has exited; by pid -1 is right here: all are ours. */
    for (;;) {
      int st;
      pid_t p = waitpid(-1, &st, WNOHANG);
      if (p > 0) {
        if (p == leader) {
          leader_reaped = 1;
          leader_status = st;
          if (!exec_failed) {
            if (WIFEXITED(st)) snprintf(leader_line, sizeof leader_line, "leader exit %d\n", WEXITSTATUS(st));
            else snprintf(leader_line, sizeof leader_line, "leader signal %d\n", WTERMSIG(st));
          }
        } else {
          reaped++;
        }
        continue;
      }
      if (p < 0 && errno == EINTR) continue;
      if (p < 0 && errno == ECHILD && leader_reaped) {
        if (!exec_failed) report(o->report_fd, "%sdone %d\n", leader_line, reaped);
        leader_line[0] = 0;
        if (o->hold && control_open) {
          /* Keep the session (and so the tty) until the supervisor lets go. */
          char sink[64];
          ssize_t k;
          do k = read(o->control_fd, sink, sizeof sink); while (k > 0 || (k < 0 && errno == EINTR));
        }
        if (WIFEXITED(leader_status)) return WEXITSTATUS(leader_status);
        return 128 + WTERMSIG(leader_status);
      }
      break;
    }
    if (leader_line[0]) {
      report(o->report_fd, "%s", leader_line);
      leader_line[0] = 0;
    }
    struct pollfd pfd[2] = {{sfd, POLLIN, 0}, {control_open ? o->control_fd : -1, POLLIN, 0}};
    if (poll(pfd, 2, -1) < 0 && errno != EINTR) return 125;
    if (pfd[0].revents & POLLIN) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGCHLD || o->no_forward) continue;
        /* The SIGPIPE of the shim's own write to a report pipe nobody reads (the supervisor
         * died): the shim's, never the command's (forwarding it killed the command's writers,
         * and each forward's report raised it again: a spin). */
        if (si.ssi_signo == SIGPIPE && (pid_t)si.ssi_pid == getpid()) continue;
        /* The supervisor's SIGCONT undoes a stop of the shim alone (the command's kill -STOP
         * $PPID or kill -STOP 0): what the command stopped of its own stays stopped. */
        if (si.ssi_signo == SIGCONT && (pid_t)si.ssi_pid == getppid()) continue;
        report(o->report_fd, "forwarded %u %d\n", si.ssi_signo, signal_descendants((int)si.ssi_signo));
      }
    }
    if (pfd[1].revents & (POLLIN | POLLHUP | POLLERR)) {
      unsigned char sigs[16];
      ssize_t k;
      do k = read(o->control_fd, sigs, sizeof sigs); while (k < 0 && errno == EINTR);
      if (k <= 0) {
        control_open = 0; /* the supervisor went away: keep reaping, it may come back */
      } else {
        for (ssize_t i = 0; i < k; i++)
          report(o->report_fd, "signaled %u %d\n", sigs[i], signal_descendants(sigs[i]));
      }
    }
  }
}

int main(int argc, char **argv) {
  struct options o;
  if (parse_args(argc, argv, &o) != 0) {
    fprintf(stderr, "usage: sbx-exec-shim [--parent-pid PID] [--cgroup-procs PATH] [--cwd DIR] [--report-fd N] "
                    "[--subreaper --control-fd N] (--argv-fd N | -- CMD [ARG...])\n");
    return 125;
  }
  if (o.report_fd >= 0) fcntl(o.report_fd, F_SETFD, FD_CLOEXEC);
  if (o.control_fd >= 0) fcntl(o.control_fd, F_SETFD, FD_CLOEXEC);
  if (o.parent_pid > 0) {
    /* Die with the supervisor until we are inside the cgroup (see the header). */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 || getppid() != o.parent_pid) return 125;
  }
  if (o.argv_fd >= 0 && !(o.argv = read_argv(o.argv_fd))) {
    report(o.report_fd, "error argv %d\n", errno);
    return 125;
  }
  if (o.cgroup_procs && join_cgroup(o.cgroup_procs) != 0) {
    report(o.report_fd, "error cgroup %d\n", errno);
    return 125;
  }
  if (o.parent_pid > 0) prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0);
  if (o.setctty && ioctl(0, TIOCSCTTY, 0) != 0) {
    report(o.report_fd, "error setctty %d\n", errno);
    return 125;
  }
  if (drop_privileges(&o) != 0) {
    report(o.report_fd, "error user %d\n", errno);
    return 125;
  }
  if (o.subreaper) return run_subreaper(&o);
  exec_command(&o, o.report_fd);
}
