/*
 * sbx_native: the few syscalls Node does not expose, as a tiny N-API addon.
 * Owns: prctl(PR_SET_CHILD_SUBREAPER), waitpid() of one pid, pipe2(), F_SETPIPE_SZ, SO_PEERCRED.
 * Does not own: spawning (libuv does that) or any reaping of pids it is not handed.
 * Errors are thrown like Node's fs: an Error whose `code` is the errno name.
 * See prctl(2), waitpid(2), pipe(2), fcntl(2), unix(7).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <node_api.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/ioctl.h>
#include <stdlib.h>
#include <termios.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(call)                                                   \
  do {                                                                \
    if ((call) != napi_ok) {                                          \
      napi_throw_error(env, "EINVAL", "N-API call failed: " #call);   \
      return NULL;                                                    \
    }                                                                 \
  } while (0)

static const char *errno_name(int err) {
  switch (err) {
    case EPERM: return "EPERM";
    case ENOENT: return "ENOENT";
    case ESRCH: return "ESRCH";
    case EINTR: return "EINTR";
    case EBADF: return "EBADF";
    case ECHILD: return "ECHILD";
    case EAGAIN: return "EAGAIN";
    case ENOMEM: return "ENOMEM";
    case EACCES: return "EACCES";
    case EBUSY: return "EBUSY";
    case EINVAL: return "EINVAL";
    case EMFILE: return "EMFILE";
    case ENFILE: return "ENFILE";
    case ENOSYS: return "ENOSYS";
    case ENOTSOCK: return "ENOTSOCK";
    case ENOTCONN: return "ENOTCONN";
    case ENOTTY: return "ENOTTY";
    case EIO: return "EIO";
    case ECONNREFUSED: return "ECONNREFUSED";
    default: return "EUNKNOWN";
  }
}

/* Throws an Error with `code` = errno name and `errno` = -err, as node:fs does. */
static napi_value throw_errno(napi_env env, int err, const char *syscall) {
  char msg[160];
  snprintf(msg, sizeof msg, "%s, %s", errno_name(err), syscall);
  napi_value code, message, error, num;
  napi_create_string_utf8(env, errno_name(err), NAPI_AUTO_LENGTH, &code);
  napi_create_string_utf8(env, msg, NAPI_AUTO_LENGTH, &message);
  napi_create_error(env, code, message, &error);
  napi_create_int32(env, -err, &num);
  napi_set_named_property(env, error, "errno", num);
  napi_value sc;
  napi_create_string_utf8(env, syscall, NAPI_AUTO_LENGTH, &sc);
  napi_set_named_property(env, error, "syscall", sc);
  napi_throw(env, error);
  return NULL;
}

static int get_int_arg(napi_env env, napi_callback_info info, size_t index, int32_t *out) {
  size_t argc = 4;
  napi_value argv[4];
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc <= index) return -1;
  napi_valuetype t;
  if (napi_typeof(env, argv[index], &t) != napi_ok || t != napi_number) return -1;
  return napi_get_value_int32(env, argv[index], out) == napi_ok ? 0 : -1;
}

/* setChildSubreaper(): mark this process a child subreaper (prctl(2) PR_SET_CHILD_SUBREAPER). */
static napi_value set_child_subreaper(napi_env env, napi_callback_info info) {
  (void)info;
  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) return throw_errno(env, errno, "prctl");
  return NULL;
}

/* isChildSubreaper(): boolean (prctl(2) PR_GET_CHILD_SUBREAPER). */
static napi_value is_child_subreaper(napi_env env, napi_callback_info info) {
  (void)info;
  int flag = 0;
  if (prctl(PR_GET_CHILD_SUBREAPER, (unsigned long)&flag, 0, 0, 0) != 0)
    return throw_errno(env, errno, "prctl");
  napi_value result;
  CHECK(napi_get_boolean(env, flag != 0, &result));
  return result;
}

/*
 * reapPid(pid): waitpid(pid, WNOHANG) for exactly that pid, never -1, so libuv's and
 * node-pty's children are never stolen. Returns null while the pid still runs, else
 * { pid, code: int|null, signal: int|null }. Throws ECHILD if pid is not our child.
 */
static napi_value reap_pid(napi_env env, napi_callback_info info) {
  int32_t pid;
  if (get_int_arg(env, info, 0, &pid) != 0 || pid <= 0) {
    napi_throw_type_error(env, "EINVAL", "reapPid(pid): pid must be a positive integer");
    return NULL;
  }
  int status = 0;
  pid_t r;
  do r = waitpid(pid, &status, WNOHANG); while (r < 0 && errno == EINTR);
  if (r < 0) return throw_errno(env, errno, "waitpid");
  napi_value result;
  if (r == 0) {
    CHECK(napi_get_null(env, &result));
    return result;
  }
  napi_value vpid, code, sig;
  CHECK(napi_create_object(env, &result));
  CHECK(napi_create_int32(env, r, &vpid));
  if (WIFEXITED(status)) {
    CHECK(napi_create_int32(env, WEXITSTATUS(status), &code));
    CHECK(napi_get_null(env, &sig));
  } else {
    CHECK(napi_get_null(env, &code));
    CHECK(napi_create_int32(env, WIFSIGNALED(status) ? WTERMSIG(status) : 0, &sig));
  }
  CHECK(napi_set_named_property(env, result, "pid", vpid));
  CHECK(napi_set_named_property(env, result, "code", code));
  CHECK(napi_set_named_property(env, result, "signal", sig));
  return result;
}

/* makePipe(): [readFd, writeFd], both O_CLOEXEC (pipe2(2)): a real pipe, not a socketpair. */
static napi_value make_pipe(napi_env env, napi_callback_info info) {
  (void)info;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return throw_errno(env, errno, "pipe2");
  napi_value arr, r, w;
  CHECK(napi_create_array_with_length(env, 2, &arr));
  CHECK(napi_create_int32(env, fds[0], &r));
  CHECK(napi_create_int32(env, fds[1], &w));
  CHECK(napi_set_element(env, arr, 0, r));
  CHECK(napi_set_element(env, arr, 1, w));
  return arr;
}

/* setPipeSize(fd, bytes): the pipe's new capacity in bytes (fcntl(2) F_SETPIPE_SZ). */
static napi_value set_pipe_size(napi_env env, napi_callback_info info) {
  int32_t fd, bytes;
  if (get_int_arg(env, info, 0, &fd) != 0 || get_int_arg(env, info, 1, &bytes) != 0) {
    napi_throw_type_error(env, "EINVAL", "setPipeSize(fd, bytes): integers expected");
    return NULL;
  }
  int r = fcntl(fd, F_SETPIPE_SZ, bytes);
  if (r < 0) return throw_errno(env, errno, "fcntl");
  napi_value result;
  CHECK(napi_create_int32(env, r, &result));
  return result;
}

/* tryLockExclusive(fd): flock(2) LOCK_EX|LOCK_NB; true when taken, false when another open
 * file description holds it (EWOULDBLOCK); throws on any other error. The lock lasts as long
 * as the fd stays open in this process. */
static napi_value try_lock_exclusive(napi_env env, napi_callback_info info) {
  int32_t fd;
  if (get_int_arg(env, info, 0, &fd) != 0) {
    napi_throw_type_error(env, "EINVAL", "tryLockExclusive(fd): an integer expected");
    return NULL;
  }
  int r;
  do r = flock(fd, LOCK_EX | LOCK_NB); while (r < 0 && errno == EINTR);
  if (r < 0 && errno != EWOULDBLOCK) return throw_errno(env, errno, "flock");
  napi_value result;
  CHECK(napi_get_boolean(env, r == 0, &result));
  return result;
}

/* peerCred(fd): { pid, uid, gid } of a connected Unix socket's peer (socket(7) SO_PEERCRED). */
static napi_value peer_cred(napi_env env, napi_callback_info info) {
  int32_t fd;
  if (get_int_arg(env, info, 0, &fd) != 0) {
    napi_throw_type_error(env, "EINVAL", "peerCred(fd): an integer fd expected");
    return NULL;
  }
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return throw_errno(env, errno, "getsockopt");
  napi_value result, pid, uid, gid;
  CHECK(napi_create_object(env, &result));
  CHECK(napi_create_int32(env, cred.pid, &pid));
  CHECK(napi_create_uint32(env, cred.uid, &uid));
  CHECK(napi_create_uint32(env, cred.gid, &gid));
  CHECK(napi_set_named_property(env, result, "pid", pid));
  CHECK(napi_set_named_property(env, result, "uid", uid));
  CHECK(napi_set_named_property(env, result, "gid", gid));
  return result;
}

/*
 * openPty(cols, rows): { master, slave, path }: a new pseudo-terminal (posix_openpt(3),
 * grantpt, unlockpt, ptsname_r), both fds O_CLOEXEC, the slave O_NOCTTY so it never becomes
 * our controlling terminal, sized with TIOCSWINSZ. The supervisor keeps the slave open until
 * the session is dead, so the master reads every byte before EIO (DESIGN.md 16).
 */
static napi_value open_pty(napi_env env, napi_callback_info info) {
  int32_t cols, rows;
  if (get_int_arg(env, info, 0, &cols) != 0 || get_int_arg(env, info, 1, &rows) != 0 || cols <= 0 || rows <= 0 || cols > 65535 || rows > 65535) {
    napi_throw_type_error(env, "EINVAL", "openPty(cols, rows): positive integers up to 65535 expected");
    return NULL;
  }
  int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0) return throw_errno(env, errno, "posix_openpt");
  char path[128];
  if (grantpt(master) != 0 || unlockpt(master) != 0 || ptsname_r(master, path, sizeof path) != 0) {
    int err = errno;
    close(master);
    return throw_errno(env, err, "unlockpt");
  }
  int slave = open(path, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (slave < 0) {
    int err = errno;
    close(master);
    return throw_errno(env, err, "open");
  }
  struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
  ioctl(master, TIOCSWINSZ, &ws);
  napi_value result, m, sl, p;
  CHECK(napi_create_object(env, &result));
  CHECK(napi_create_int32(env, master, &m));
  CHECK(napi_create_int32(env, slave, &sl));
  CHECK(napi_create_string_utf8(env, path, NAPI_AUTO_LENGTH, &p));
  CHECK(napi_set_named_property(env, result, "master", m));
  CHECK(napi_set_named_property(env, result, "slave", sl));
  CHECK(napi_set_named_property(env, result, "path", p));
  return result;
}

/* setWindowSize(fd, cols, rows): TIOCSWINSZ on a pty (the foreground group gets SIGWINCH). */
static napi_value set_window_size(napi_env env, napi_callback_info info) {
  int32_t fd, cols, rows;
  if (get_int_arg(env, info, 0, &fd) != 0 || get_int_arg(env, info, 1, &cols) != 0 || get_int_arg(env, info, 2, &rows) != 0 ||
      cols <= 0 || rows <= 0 || cols > 65535 || rows > 65535) {
    napi_throw_type_error(env, "EINVAL", "setWindowSize(fd, cols, rows): integers expected");
    return NULL;
  }
  struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
  if (ioctl(fd, TIOCSWINSZ, &ws) != 0) return throw_errno(env, errno, "ioctl");
  return NULL;
}

/*
 * sdNotify(message): sends message to $NOTIFY_SOCKET (sd_notify(3) protocol: one datagram on
 * an AF_UNIX socket; a leading '@' is the abstract namespace). Returns false when
 * NOTIFY_SOCKET is unset (not under systemd), true when sent; throws on a send error.
 */
static napi_value sd_notify_fn(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  char msg[512];
  size_t len = 0;
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < 1 ||
      napi_get_value_string_utf8(env, argv[0], msg, sizeof msg, &len) != napi_ok) {
    napi_throw_type_error(env, "EINVAL", "sdNotify(message): a string expected");
    return NULL;
  }
  napi_value result;
  const char *path = getenv("NOTIFY_SOCKET");
  if (!path || !*path) {
    CHECK(napi_get_boolean(env, false, &result));
    return result;
  }
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  size_t plen = strlen(path);
  if (plen >= sizeof addr.sun_path) return throw_errno(env, EINVAL, "sd_notify");
  memcpy(addr.sun_path, path, plen);
  if (addr.sun_path[0] == '@') addr.sun_path[0] = 0;
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return throw_errno(env, errno, "socket");
  ssize_t n = sendto(fd, msg, len, MSG_NOSIGNAL, (struct sockaddr *)&addr, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + plen));
  int err = errno;
  close(fd);
  if (n < 0) return throw_errno(env, err, "sendto");
  CHECK(napi_get_boolean(env, true, &result));
  return result;
}

static napi_value init(napi_env env, napi_value exports) {
  napi_property_descriptor props[] = {
    {"setChildSubreaper", NULL, set_child_subreaper, NULL, NULL, NULL, napi_default, NULL},
    {"isChildSubreaper", NULL, is_child_subreaper, NULL, NULL, NULL, napi_default, NULL},
    {"reapPid", NULL, reap_pid, NULL, NULL, NULL, napi_default, NULL},
    {"makePipe", NULL, make_pipe, NULL, NULL, NULL, napi_default, NULL},
    {"setPipeSize", NULL, set_pipe_size, NULL, NULL, NULL, napi_default, NULL},
    {"peerCred", NULL, peer_cred, NULL, NULL, NULL, napi_default, NULL},
    {"openPty", NULL, open_pty, NULL, NULL, NULL, napi_default, NULL},
    {"sdNotify", NULL, sd_notify_fn, NULL, NULL, NULL, napi_default, NULL},
    {"setWindowSize", NULL, set_window_size, NULL, NULL, NULL, napi_default, NULL},
    {"tryLockExclusive", NULL, try_lock_exclusive, NULL, NULL, NULL, napi_default, NULL},
  };
  if (napi_define_properties(env, exports, sizeof props / sizeof props[0], props) != napi_ok) return NULL;
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, init)
