/*
 * sbx_native: thin N-API glue over sys.c. Checks arguments, calls the plain C wrapper, and
 * turns its -errno into a thrown Error like node:fs does (`code` the errno name from
 * uv_err_name_r, `errno` negative, `syscall`, message "CODE: description, syscall").
 * Exports (typed in core/fs/native.ts): setChildSubreaper, isChildSubreaper, reapPid, peekExit, continueStopped,
 * makePipe, setPipeSize, tryLockExclusive, peerCred, openPty, setWindowSize, sdNotify,
 * userByName, userById, groupByName, waitWritable; and over watch.c: watchInit, watchMark,
 * watchMarkWrites, watchPoll, watchRead, watchHandlePath; over statdir.c: statDir, statDirs; over fileio.c:
 * readFileAt, hashFilesAt, writeFileNewAt. Owns no state but the writability waits
 * it hands out (uv_poll_t, see there); spawning and reaping others' children is libuv's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <node_api.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "fileio.h"
#include "statdir.h"
#include "sys.h"
#include "watch.h"

#define CHECK(call)                                                   \
  do {                                                                \
    if ((call) != napi_ok) {                                          \
      napi_throw_error(env, "EINVAL", "N-API call failed: " #call);   \
      return NULL;                                                    \
    }                                                                 \
  } while (0)

/*
 * Throws an Error for neg (-errno) from syscall, as node:fs does. The name and text are
 * libuv's (uv_err_name_r, uv_strerror_r), as in Node's own errors; an errno libuv does not
 * map (ECHILD, say) is named and described by glibc (strerrorname_np, 2.32+) when it can.
 */
static napi_value throw_errno(napi_env env, int neg, const char *syscall) {
  char name[64], text[128], msg[256];
  uv_err_name_r(neg, name, sizeof name);
  uv_strerror_r(neg, text, sizeof text);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
  if (strncmp(name, "Unknown", 7) == 0 && strerrorname_np(-neg)) {
    snprintf(name, sizeof name, "%s", strerrorname_np(-neg));
    snprintf(text, sizeof text, "%s", strerrordesc_np(-neg));
  }
#endif
  snprintf(msg, sizeof msg, "%s: %s, %s", name, text, syscall);
  napi_value code, message, error, num, sc;
  if (napi_create_string_utf8(env, name, NAPI_AUTO_LENGTH, &code) != napi_ok ||
      napi_create_string_utf8(env, msg, NAPI_AUTO_LENGTH, &message) != napi_ok ||
      napi_create_error(env, code, message, &error) != napi_ok ||
      napi_create_int32(env, neg, &num) != napi_ok ||
      napi_set_named_property(env, error, "errno", num) != napi_ok ||
      napi_create_string_utf8(env, syscall, NAPI_AUTO_LENGTH, &sc) != napi_ok ||
      napi_set_named_property(env, error, "syscall", sc) != napi_ok) {
    napi_throw_error(env, name, msg);
    return NULL;
  }
  napi_throw(env, error);
  return NULL;
}

/* Up to max arguments into argv; their count. */
static size_t get_args(napi_env env, napi_callback_info info, napi_value *argv, size_t max) {
  size_t argc = max;
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok) return 0;
  return argc < max ? argc : max;
}

/* argv[index] as an int32 when it is a number holding one; 0, else -1. */
static int int_arg(napi_env env, napi_value *argv, size_t argc, size_t index, int32_t *out) {
  napi_valuetype t;
  double d;
  if (index >= argc || napi_typeof(env, argv[index], &t) != napi_ok || t != napi_number) return -1;
  if (napi_get_value_double(env, argv[index], &d) != napi_ok || !(d >= INT32_MIN && d <= INT32_MAX) || d != (double)(int32_t)d) return -1;
  *out = (int32_t)d;
  return 0;
}

/* The one argument of a call taking an fd: 0, or -1 with a TypeError EINVAL (usage) thrown. */
static int fd_only_arg(napi_env env, napi_callback_info info, const char *usage, int32_t *fd) {
  napi_value argv[1];
  size_t argc = get_args(env, info, argv, 1);
  if (int_arg(env, argv, argc, 0, fd) == 0) return 0;
  napi_throw_type_error(env, "EINVAL", usage);
  return -1;
}

/* argv[index] as a malloc'ed NUL-terminated UTF-8 string with no NUL inside; NULL if not. */
static char *string_arg(napi_env env, napi_value *argv, size_t argc, size_t index, size_t max_bytes) {
  napi_valuetype t;
  size_t len = 0, copied = 0;
  if (index >= argc || napi_typeof(env, argv[index], &t) != napi_ok || t != napi_string) return NULL;
  if (napi_get_value_string_utf8(env, argv[index], NULL, 0, &len) != napi_ok || len > max_bytes) return NULL;
  char *s = malloc(len + 1);
  if (!s) return NULL;
  if (napi_get_value_string_utf8(env, argv[index], s, len + 1, &copied) != napi_ok || copied != len || strlen(s) != len) {
    free(s);
    return NULL;
  }
  return s;
}

static napi_value make_int(napi_env env, int32_t v) {
  napi_value r;
  return napi_create_int32(env, v, &r) == napi_ok ? r : NULL;
}

static napi_value make_uint(napi_env env, uint32_t v) {
  napi_value r;
  return napi_create_uint32(env, v, &r) == napi_ok ? r : NULL;
}

static napi_value make_bool(napi_env env, int v) {
  napi_value r;
  return napi_get_boolean(env, v != 0, &r) == napi_ok ? r : NULL;
}

static napi_value make_string(napi_env env, const char *s) {
  napi_value r;
  return napi_create_string_utf8(env, s, NAPI_AUTO_LENGTH, &r) == napi_ok ? r : NULL;
}

static napi_value make_null(napi_env env) {
  napi_value r;
  return napi_get_null(env, &r) == napi_ok ? r : NULL;
}

/* obj[key] = value; fails (napi_generic_failure) when value is NULL. */
static napi_status set(napi_env env, napi_value obj, const char *key, napi_value value) {
  return value ? napi_set_named_property(env, obj, key, value) : napi_generic_failure;
}

/* setChildSubreaper(): void. */
static napi_value set_child_subreaper(napi_env env, napi_callback_info info) {
  (void)info;
  int r = sys_set_child_subreaper();
  return r < 0 ? throw_errno(env, r, "prctl") : NULL;
}

/* setThreadName(name): prctl(PR_SET_NAME) of the calling thread (15 bytes at most), as
 * /proc/<pid>/task/<tid>/comm shows it: the benchmarks tell the hashing threads apart by it. */
static napi_value set_thread_name(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  size_t argc = get_args(env, info, argv, 1);
  char *name = string_arg(env, argv, argc, 0, 15);
  if (!name) {
    napi_throw_type_error(env, "EINVAL", "setThreadName(name): a string of at most 15 bytes expected");
    return NULL;
  }
  int r = sys_set_thread_name(name);
  free(name);
  return r < 0 ? throw_errno(env, r, "prctl") : NULL;
}

/* A JS array of strings as a NULL-terminated, malloc'ed vector (free with free_strings); NULL if it is not one. */
static char **string_array(napi_env env, napi_value value, size_t max_bytes) {
  bool is_array = false;
  uint32_t n = 0;
  if (napi_is_array(env, value, &is_array) != napi_ok || !is_array || napi_get_array_length(env, value, &n) != napi_ok) return NULL;
  char **out = calloc((size_t)n + 1, sizeof *out);
  if (!out) return NULL;
  for (uint32_t i = 0; i < n; i++) {
    napi_value item;
    if (napi_get_element(env, value, i, &item) != napi_ok || !(out[i] = string_arg(env, &item, 1, 0, max_bytes))) {
      for (uint32_t j = 0; j < i; j++) free(out[j]);
      free(out);
      return NULL;
    }
  }
  return out;
}

static void free_strings(char **v) {
  if (!v) return;
  for (char **p = v; *p; p++) free(*p);
  free(v);
}

/*
 * spawnDetached(path, argv, env, fds[, cgroupFd]): pid (sys_spawn: posix_spawn, setsid, cwd
 * "/", fds[i] as fd i, -1 for /dev/null; with cgroupFd >= 0, sys_spawn_in_cgroup: born there).
 */
static napi_value spawn_detached(napi_env env, napi_callback_info info) {
  napi_value argv[5];
  size_t argc = get_args(env, info, argv, 5);
  const char *usage = "spawnDetached(path, argv, env, fds[, cgroupFd]): a path, two arrays of strings, an array of at most 16 fds and an fd expected";
  int32_t cgroup_fd = -1;
  if (argc > 4 && int_arg(env, argv, argc, 4, &cgroup_fd) != 0) {
    napi_throw_type_error(env, "EINVAL", usage);
    return NULL;
  }
  char *path = string_arg(env, argv, argc, 0, 4096);
  char **args = argc > 1 ? string_array(env, argv[1], 1 << 20) : NULL;
  char **envp = argc > 2 ? string_array(env, argv[2], 1 << 20) : NULL;
  int fds[SYS_SPAWN_MAX_FDS];
  uint32_t nfds = 0;
  bool is_array = false;
  int ok = path && args && envp && argc > 3 && napi_is_array(env, argv[3], &is_array) == napi_ok && is_array &&
           napi_get_array_length(env, argv[3], &nfds) == napi_ok && nfds <= SYS_SPAWN_MAX_FDS;
  for (uint32_t i = 0; ok && i < nfds; i++) {
    napi_value item;
    int32_t fd;
    ok = napi_get_element(env, argv[3], i, &item) == napi_ok && int_arg(env, &item, 1, 0, &fd) == 0;
    if (ok) fds[i] = fd;
  }
  napi_value result = NULL;
  if (!ok) {
    napi_throw_type_error(env, "EINVAL", usage);
  } else {
    pid_t pid = -1;
    int exec_failed = 0;
    int r = cgroup_fd >= 0 ? sys_spawn_in_cgroup(path, args, envp, fds, (int)nfds, cgroup_fd, &pid, &exec_failed) : sys_spawn(path, args, envp, fds, (int)nfds, &pid);
    result = r < 0 ? throw_errno(env, r, exec_failed ? "execve" : cgroup_fd >= 0 ? "clone3" : "posix_spawn") : make_int(env, pid);
  }
  free(path);
  free_strings(args);
  free_strings(envp);
  return result;
}

/* isChildSubreaper(): boolean. */
static napi_value is_child_subreaper(napi_env env, napi_callback_info info) {
  (void)info;
  int r = sys_is_child_subreaper();
  return r < 0 ? throw_errno(env, r, "prctl") : make_bool(env, r);
}

/* The shared body of reapPid and peekExit: a pid argument, one wait call, its result as
 * null while the child runs, else { pid, code: int|null, signal: int|null }. */
static napi_value child_exit(napi_env env, napi_callback_info info, const char *name, int (*wait_fn)(pid_t, struct sys_exit *), const char *syscall) {
  napi_value argv[1], result;
  size_t argc = get_args(env, info, argv, 1);
  int32_t pid;
  if (int_arg(env, argv, argc, 0, &pid) != 0 || pid <= 0) {
    char message[96];
    snprintf(message, sizeof message, "%s(pid): pid must be a positive integer", name);
    napi_throw_type_error(env, "EINVAL", message);
    return NULL;
  }
  struct sys_exit ex;
  int r = wait_fn(pid, &ex);
  if (r < 0) return throw_errno(env, r, syscall);
  if (r == 0) return make_null(env);
  CHECK(napi_create_object(env, &result));
  CHECK(set(env, result, "pid", make_int(env, ex.pid)));
  CHECK(set(env, result, "code", ex.code >= 0 ? make_int(env, ex.code) : make_null(env)));
  CHECK(set(env, result, "signal", ex.signal >= 0 ? make_int(env, ex.signal) : make_null(env)));
  return result;
}

/* reapPid(pid): null while it runs, else { pid, code: int|null, signal: int|null } (reaped). */
static napi_value reap_pid(napi_env env, napi_callback_info info) {
  return child_exit(env, info, "reapPid", sys_reap_pid, "waitpid");
}

/* peekExit(pid): the same, the child left a zombie (waitid WNOWAIT). */
static napi_value peek_exit(napi_env env, napi_callback_info info) {
  return child_exit(env, info, "peekExit", sys_peek_exit, "waitid");
}

/* continueStopped(pid): null unless that child was stopped; then SIGCONT was sent and the
 * answer is { pid, code: null, signal: the stop signal }. */
static napi_value continue_stopped(napi_env env, napi_callback_info info) {
  return child_exit(env, info, "continueStopped", sys_continue_stopped, "waitid");
}

/* makePipe(): [readFd, writeFd]. */
static napi_value make_pipe(napi_env env, napi_callback_info info) {
  (void)info;
  int fds[2];
  int r = sys_make_pipe(fds);
  if (r < 0) return throw_errno(env, r, "pipe2");
  napi_value arr;
  CHECK(napi_create_array_with_length(env, 2, &arr));
  CHECK(napi_set_element(env, arr, 0, make_int(env, fds[0])));
  CHECK(napi_set_element(env, arr, 1, make_int(env, fds[1])));
  return arr;
}

/* setPipeSize(fd, bytes): the capacity granted, in bytes. */
static napi_value set_pipe_size(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  size_t argc = get_args(env, info, argv, 2);
  int32_t fd, bytes;
  if (int_arg(env, argv, argc, 0, &fd) != 0 || int_arg(env, argv, argc, 1, &bytes) != 0) {
    napi_throw_type_error(env, "EINVAL", "setPipeSize(fd, bytes): integers expected");
    return NULL;
  }
  int r = sys_set_pipe_size(fd, bytes);
  return r < 0 ? throw_errno(env, r, "fcntl") : make_int(env, r);
}

/* tryLockExclusive(fd): true when taken, false when another open file description holds it. */
static napi_value try_lock_exclusive(napi_env env, napi_callback_info info) {
  int32_t fd;
  if (fd_only_arg(env, info, "tryLockExclusive(fd): an integer expected", &fd) != 0) return NULL;
  int r = sys_try_lock_exclusive(fd);
  return r < 0 ? throw_errno(env, r, "flock") : make_bool(env, r);
}

/* peerCred(fd): { pid, uid, gid }. */
static napi_value peer_cred(napi_env env, napi_callback_info info) {
  napi_value result;
  int32_t fd;
  if (fd_only_arg(env, info, "peerCred(fd): an integer fd expected", &fd) != 0) return NULL;
  struct sys_cred cred;
  int r = sys_peer_cred(fd, &cred);
  if (r < 0) return throw_errno(env, r, "getsockopt");
  CHECK(napi_create_object(env, &result));
  CHECK(set(env, result, "pid", make_int(env, cred.pid)));
  CHECK(set(env, result, "uid", make_uint(env, cred.uid)));
  CHECK(set(env, result, "gid", make_uint(env, cred.gid)));
  return result;
}

/* Whether cols and rows fit a struct winsize (1..65535). */
static int size_ok(int32_t cols, int32_t rows) {
  return cols > 0 && rows > 0 && cols <= 65535 && rows <= 65535;
}

/* openPty(cols, rows): { master, slave, path }. */
static napi_value open_pty(napi_env env, napi_callback_info info) {
  napi_value argv[2], result;
  size_t argc = get_args(env, info, argv, 2);
  int32_t cols, rows;
  if (int_arg(env, argv, argc, 0, &cols) != 0 || int_arg(env, argv, argc, 1, &rows) != 0 || !size_ok(cols, rows)) {
    napi_throw_type_error(env, "EINVAL", "openPty(cols, rows): positive integers up to 65535 expected");
    return NULL;
  }
  struct sys_pty pty;
  const char *failed = "posix_openpt";
  int r = sys_open_pty(cols, rows, &pty, &failed);
  if (r < 0) return throw_errno(env, r, failed);
  if (napi_create_object(env, &result) != napi_ok || set(env, result, "master", make_int(env, pty.master)) != napi_ok ||
      set(env, result, "slave", make_int(env, pty.slave)) != napi_ok || set(env, result, "path", make_string(env, pty.path)) != napi_ok) {
    close(pty.master);
    close(pty.slave);
    napi_throw_error(env, "EINVAL", "N-API call failed: openPty result");
    return NULL;
  }
  return result;
}

/* setWindowSize(fd, cols, rows): void. */
static napi_value set_window_size(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  size_t argc = get_args(env, info, argv, 3);
  int32_t fd, cols, rows;
  if (int_arg(env, argv, argc, 0, &fd) != 0 || int_arg(env, argv, argc, 1, &cols) != 0 || int_arg(env, argv, argc, 2, &rows) != 0 ||
      !size_ok(cols, rows)) {
    napi_throw_type_error(env, "EINVAL", "setWindowSize(fd, cols, rows): integers expected");
    return NULL;
  }
  int r = sys_set_window_size(fd, cols, rows);
  return r < 0 ? throw_errno(env, r, "ioctl") : NULL;
}

/* sdNotify(message): false when $NOTIFY_SOCKET is unset, true when sent. */
static napi_value sd_notify_fn(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  size_t argc = get_args(env, info, argv, 1);
  char *msg = string_arg(env, argv, argc, 0, 4096);
  if (!msg) {
    napi_throw_type_error(env, "EINVAL", "sdNotify(message): a string of at most 4096 bytes expected");
    return NULL;
  }
  const char *failed = "sd_notify";
  int r = sys_sd_notify(msg, strlen(msg), &failed);
  free(msg);
  return r < 0 ? throw_errno(env, r, failed) : make_bool(env, r);
}

/* { uid, gid, name, home } of a passwd entry (then freed), or NULL with an exception pending. */
static napi_value user_result(napi_env env, int r, struct sys_user *user, const char *syscall) {
  if (r < 0) return throw_errno(env, r, syscall);
  napi_value result;
  napi_status s = napi_create_object(env, &result);
  if (s == napi_ok) s = set(env, result, "uid", make_uint(env, user->uid));
  if (s == napi_ok) s = set(env, result, "gid", make_uint(env, user->gid));
  if (s == napi_ok) s = set(env, result, "name", make_string(env, user->name));
  if (s == napi_ok) s = set(env, result, "home", make_string(env, user->home));
  sys_user_free(user);
  if (s != napi_ok) {
    napi_throw_error(env, "EINVAL", "N-API call failed: user result");
    return NULL;
  }
  return result;
}

/* userByName(name): { uid, gid, name, home }; ENOENT when there is no such user. */
static napi_value user_by_name(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  size_t argc = get_args(env, info, argv, 1);
  char *name = string_arg(env, argv, argc, 0, 4096);
  if (!name) {
    napi_throw_type_error(env, "EINVAL", "userByName(name): a string without NUL of at most 4096 bytes expected");
    return NULL;
  }
  struct sys_user user;
  int r = sys_getpwnam(name, &user);
  free(name);
  return user_result(env, r, &user, "getpwnam_r");
}

/* userById(uid): { uid, gid, name, home }; ENOENT when no entry has that uid. */
static napi_value user_by_id(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  size_t argc = get_args(env, info, argv, 1);
  napi_valuetype t;
  double uid;
  if (argc < 1 || napi_typeof(env, argv[0], &t) != napi_ok || t != napi_number || napi_get_value_double(env, argv[0], &uid) != napi_ok ||
      !(uid >= 0 && uid <= 4294967294.0) || uid != (double)(uint32_t)uid) {
    napi_throw_type_error(env, "EINVAL", "userById(uid): an integer from 0 to 4294967294 expected");
    return NULL;
  }
  struct sys_user user;
  int r = sys_getpwuid((uint32_t)uid, &user);
  return user_result(env, r, &user, "getpwuid_r");
}

/* groupByName(name): gid; ENOENT when there is no such group. */
static napi_value group_by_name(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  size_t argc = get_args(env, info, argv, 1);
  char *name = string_arg(env, argv, argc, 0, 4096);
  if (!name) {
    napi_throw_type_error(env, "EINVAL", "groupByName(name): a string without NUL of at most 4096 bytes expected");
    return NULL;
  }
  uint32_t gid = 0;
  int r = sys_getgrnam(name, &gid);
  free(name);
  return r < 0 ? throw_errno(env, r, "getgrnam_r") : make_uint(env, gid);
}

/*
 * A wait for a fd to become writable. libuv watches a fd once per loop, and the pty master is
 * already watched by the tty handle that reads it, so this watches a dup of it: epoll(7)
 * tells the two apart, and the dup is removed from epoll (uv_close) before it is closed.
 * Freed when both the poll handle is closed and the cancel function is collected.
 */
struct writable_wait {
  uv_poll_t poll;
  napi_env env;
  napi_ref callback;
  napi_async_context async;
  int fd;
  int active;
  int refs;
};

static void wait_release(struct writable_wait *w) {
  if (--w->refs == 0) free(w);
}

static void wait_closed(uv_handle_t *handle) {
  struct writable_wait *w = handle->data;
  close(w->fd);
  wait_release(w);
}

/* Stops the wait once: the poll handle closes (then the dup); callback and context are let go. */
static void wait_stop(struct writable_wait *w) {
  if (!w->active) return;
  w->active = 0;
  uv_close((uv_handle_t *)&w->poll, wait_closed);
  if (w->callback) napi_delete_reference(w->env, w->callback);
  if (w->async) napi_async_destroy(w->env, w->async);
  w->callback = NULL;
  w->async = NULL;
}

/* The poll fired (writable, POLLHUP or POLLERR alike): stop, then call back once. */
static void wait_fired(uv_poll_t *poll, int status, int events) {
  (void)status;
  (void)events;
  struct writable_wait *w = poll->data;
  napi_env env = w->env;
  napi_handle_scope scope;
  if (napi_open_handle_scope(env, &scope) != napi_ok) return wait_stop(w);
  napi_value callback = NULL, recv, ignored;
  napi_async_context async = w->async;
  /* napi_make_callback: microtasks run after it, as after any libuv callback of Node's. */
  int ok = napi_get_reference_value(env, w->callback, &callback) == napi_ok && callback && napi_get_global(env, &recv) == napi_ok;
  w->async = NULL; /* kept for the call below */
  wait_stop(w);
  bool pending = false;
  if (ok && napi_make_callback(env, async, recv, callback, 0, NULL, &ignored) != napi_ok && napi_is_exception_pending(env, &pending) == napi_ok && pending) {
    napi_value err;
    if (napi_get_and_clear_last_exception(env, &err) == napi_ok) napi_fatal_exception(env, err); /* 'uncaughtException' */
  }
  napi_async_destroy(env, async);
  napi_close_handle_scope(env, scope);
}

static napi_value wait_cancel(napi_env env, napi_callback_info info) {
  void *data = NULL;
  if (napi_get_cb_info(env, info, NULL, NULL, NULL, &data) == napi_ok && data) wait_stop(data);
  return NULL;
}

static void wait_finalize(napi_env env, void *data, void *hint) {
  (void)env;
  (void)hint;
  wait_release(data);
}

/* waitWritable(fd, callback): cancel(); callback() once fd is writable, hung up or in error. */
static napi_value wait_writable(napi_env env, napi_callback_info info) {
  napi_value argv[2], cancel, name;
  size_t argc = get_args(env, info, argv, 2);
  int32_t fd;
  napi_valuetype t;
  if (int_arg(env, argv, argc, 0, &fd) != 0 || argc < 2 || napi_typeof(env, argv[1], &t) != napi_ok || t != napi_function) {
    napi_throw_type_error(env, "EINVAL", "waitWritable(fd, callback): an integer fd and a function expected");
    return NULL;
  }
  uv_loop_t *loop;
  CHECK(napi_get_uv_event_loop(env, &loop));
  int dupfd = sys_dup_cloexec(fd);
  if (dupfd < 0) return throw_errno(env, dupfd, "fcntl");
  struct writable_wait *w = calloc(1, sizeof *w);
  if (!w) {
    close(dupfd);
    return throw_errno(env, -ENOMEM, "waitWritable");
  }
  w->env = env;
  w->fd = dupfd;
  int r = uv_poll_init(loop, &w->poll, dupfd);
  if (r < 0) {
    close(dupfd);
    free(w);
    return throw_errno(env, r, "uv_poll_init");
  }
  w->poll.data = w;
  w->active = 1;
  w->refs = 1; /* the poll handle's, released once it is closed */
  if (napi_create_reference(env, argv[1], 1, &w->callback) != napi_ok ||
      napi_create_string_utf8(env, "sbx:waitWritable", NAPI_AUTO_LENGTH, &name) != napi_ok ||
      napi_async_init(env, NULL, name, &w->async) != napi_ok ||
      napi_create_function(env, "cancel", NAPI_AUTO_LENGTH, wait_cancel, w, &cancel) != napi_ok) {
    wait_stop(w);
    napi_throw_error(env, "EINVAL", "N-API call failed: waitWritable");
    return NULL;
  }
  r = uv_poll_start(&w->poll, UV_WRITABLE, wait_fired);
  if (r < 0) {
    wait_stop(w);
    return throw_errno(env, r, "uv_poll_start");
  }
  /* The cancel function's reference, released once it is collected (if the finalizer cannot
   * be added, w is never freed: a few bytes, rather than a cancel() on freed memory). */
  w->refs++;
  napi_add_finalizer(env, cancel, w, wait_finalize, NULL, NULL);
  return cancel;
}

/* ---- the workspace watcher (watch.c) ---- */

/* watchInit(unlimitedQueue): the fanotify group's fd. */
static napi_value watch_init_fn(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  size_t argc = get_args(env, info, argv, 1);
  bool unlimited = false;
  if (argc < 1 || napi_get_value_bool(env, argv[0], &unlimited) != napi_ok) {
    napi_throw_type_error(env, "EINVAL", "watchInit(unlimitedQueue): a boolean expected");
    return NULL;
  }
  int r = watch_init(unlimited);
  return r < 0 ? throw_errno(env, r, "fanotify_init") : make_int(env, r);
}

/* watchMark(fd, path, reportModify): a filesystem mark on the file system holding path. */
static napi_value watch_mark_fn(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  size_t argc = get_args(env, info, argv, 3);
  int32_t fd;
  bool modify = false;
  char *path = string_arg(env, argv, argc, 1, 4096);
  if (int_arg(env, argv, argc, 0, &fd) != 0 || !path || argc < 3 || napi_get_value_bool(env, argv[2], &modify) != napi_ok) {
    free(path);
    napi_throw_type_error(env, "EINVAL", "watchMark(fd, path, reportModify): an fd, a path and a boolean expected");
    return NULL;
  }
  int r = watch_mark(fd, path, modify);
  free(path);
  return r < 0 ? throw_errno(env, r, "fanotify_mark") : NULL;
}

/* watchMarkWrites(fd, path): a filesystem mark reporting every write (FAN_MODIFY) on path's file system. */
static napi_value watch_mark_writes_fn(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  size_t argc = get_args(env, info, argv, 2);
  int32_t fd;
  char *path = string_arg(env, argv, argc, 1, 4096);
  if (int_arg(env, argv, argc, 0, &fd) != 0 || !path) {
    free(path);
    napi_throw_type_error(env, "EINVAL", "watchMarkWrites(fd, path): an fd and a path expected");
    return NULL;
  }
  int r = watch_mark_writes(fd, path);
  free(path);
  return r < 0 ? throw_errno(env, r, "fanotify_mark") : NULL;
}

/* watchPoll(fd, timeoutMs): true when events are queued. Blocks: call it from a worker. */
static napi_value watch_poll_fn(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  size_t argc = get_args(env, info, argv, 2);
  int32_t fd, timeout;
  if (int_arg(env, argv, argc, 0, &fd) != 0 || int_arg(env, argv, argc, 1, &timeout) != 0) {
    napi_throw_type_error(env, "EINVAL", "watchPoll(fd, timeoutMs): integers expected");
    return NULL;
  }
  int r = watch_poll(fd, timeout);
  return r < 0 ? throw_errno(env, r, "poll") : make_bool(env, r);
}

/* watchRead(fd, selfPid, keepName, cgroupMount): [{mask, pid, pidfd, cgroup, handle, target, name}]. */
static napi_value watch_read_fn(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  size_t argc = get_args(env, info, argv, 4);
  int32_t fd, self;
  char *keep = string_arg(env, argv, argc, 2, 255);
  char *mount = string_arg(env, argv, argc, 3, 4096);
  if (int_arg(env, argv, argc, 0, &fd) != 0 || int_arg(env, argv, argc, 1, &self) != 0 || !keep || !mount) {
    free(keep);
    free(mount);
    napi_throw_type_error(env, "EINVAL", "watchRead(fd, selfPid, keepName, cgroupMount) expected");
    return NULL;
  }
  struct watch_event *events = malloc(sizeof(struct watch_event) * WATCH_MAX_EVENTS);
  if (!events) {
    free(keep);
    free(mount);
    return throw_errno(env, -ENOMEM, "malloc");
  }
  int own = 0;
  int n = watch_read(fd, events, WATCH_MAX_EVENTS, self, keep, mount, &own);
  free(keep);
  free(mount);
  if (n < 0) {
    free(events);
    return throw_errno(env, n, "read");
  }
  napi_value list;
  napi_status st = napi_create_array_with_length(env, (size_t)n, &list);
  /* The array's `own`: selfPid's events read and dropped here. */
  if (st == napi_ok) st = set(env, list, "own", make_int(env, own));
  for (int i = 0; i < n && st == napi_ok; i++) {
    struct watch_event *e = &events[i];
    napi_value obj, mask, cgroup, handle, target, name;
    void *data;
    st = napi_create_object(env, &obj);
    if (st == napi_ok) st = napi_create_double(env, (double)e->mask, &mask);
    if (st == napi_ok) st = set(env, obj, "mask", mask);
    if (st == napi_ok) st = set(env, obj, "pid", make_int(env, e->pid));
    if (st == napi_ok) st = set(env, obj, "pidfd", make_int(env, e->pidfd_state));
    if (st == napi_ok) st = napi_create_bigint_uint64(env, e->cgroup_id, &cgroup);
    if (st == napi_ok) st = set(env, obj, "cgroup", cgroup);
    /* The handle as one key: fsid (8 bytes), handle type (int32, host order), the handle's bytes. */
    if (st == napi_ok) st = napi_create_buffer(env, 12 + e->handle_len, &data, &handle);
    if (st == napi_ok) {
      memcpy(data, e->fsid, 8);
      memcpy((char *)data + 8, &e->handle_type, 4);
      memcpy((char *)data + 12, e->handle, e->handle_len);
      st = set(env, obj, "handle", handle);
    }
    /* The entry's own handle, in the same form (fsid of the directory's: one file system), or null. */
    if (st == napi_ok && e->target_len > 0) {
      st = napi_create_buffer(env, 12 + e->target_len, &data, &target);
      if (st == napi_ok) {
        memcpy(data, e->fsid, 8);
        memcpy((char *)data + 8, &e->target_type, 4);
        memcpy((char *)data + 12, e->target, e->target_len);
      }
    } else if (st == napi_ok) {
      st = napi_get_null(env, &target);
    }
    if (st == napi_ok) st = set(env, obj, "target", target);
    if (st == napi_ok) st = napi_create_buffer_copy(env, strlen(e->name), e->name, NULL, &name);
    if (st == napi_ok) st = set(env, obj, "name", name);
    if (st == napi_ok) st = napi_set_element(env, list, (uint32_t)i, obj);
  }
  free(events);
  if (st != napi_ok) {
    napi_throw_error(env, "EINVAL", "N-API call failed: watchRead result");
    return NULL;
  }
  return list;
}

/* watchHandlePath(mountFd, handle): the directory's path (Buffer); ESTALE when it is gone. */
static napi_value watch_handle_path_fn(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  size_t argc = get_args(env, info, argv, 2);
  int32_t mount_fd;
  bool is_buffer = false;
  void *data = NULL;
  size_t len = 0;
  if (int_arg(env, argv, argc, 0, &mount_fd) != 0 || argc < 2 || napi_is_buffer(env, argv[1], &is_buffer) != napi_ok || !is_buffer ||
      napi_get_buffer_info(env, argv[1], &data, &len) != napi_ok || len < 12 || len > 12 + WATCH_HANDLE_MAX) {
    napi_throw_type_error(env, "EINVAL", "watchHandlePath(mountFd, handle): an fd and a handle from watchRead expected");
    return NULL;
  }
  int32_t type;
  memcpy(&type, (char *)data + 8, 4);
  char path[4096];
  int r = watch_handle_path(mount_fd, type, (const unsigned char *)data + 12, (uint32_t)(len - 12), path, sizeof path);
  if (r < 0) return throw_errno(env, r, "open_by_handle_at");
  napi_value out;
  CHECK(napi_create_buffer_copy(env, (size_t)r, path, NULL, &out));
  return out;
}

/* mknodAt(dirFd, name: Buffer, mode, rdev): a fifo, socket or device node named name in dirFd. */
static napi_value mknod_at_fn(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  size_t argc = get_args(env, info, argv, 4);
  int32_t dirfd, mode;
  bool is_buffer = false;
  void *data = NULL;
  size_t len = 0;
  double dev = 0;
  if (int_arg(env, argv, argc, 0, &dirfd) != 0 || argc < 4 || napi_is_buffer(env, argv[1], &is_buffer) != napi_ok || !is_buffer ||
      napi_get_buffer_info(env, argv[1], &data, &len) != napi_ok || len == 0 || len > 255 || memchr(data, 0, len) || memchr(data, '/', len) ||
      int_arg(env, argv, argc, 2, &mode) != 0 || napi_get_value_double(env, argv[3], &dev) != napi_ok || dev < 0) {
    napi_throw_type_error(env, "EINVAL", "mknodAt(dirFd, name, mode, rdev): an fd, a name of 1-255 bytes without '/' or NUL, a mode and a device number expected");
    return NULL;
  }
  char name[256];
  memcpy(name, data, len);
  name[len] = '\0';
  int r = sys_mknodat(dirfd, name, (uint32_t)mode, (uint64_t)dev);
  if (r < 0) return throw_errno(env, r, "mknodat");
  return make_null(env);
}

/* argv[index] as a one-component name (a Buffer of 1-255 bytes, no '/' or NUL) copied into out (256 bytes, NUL-terminated): 0, else -1. */
static int name_arg(napi_env env, napi_value *argv, size_t argc, size_t index, char *out) {
  bool is_buffer = false;
  void *data = NULL;
  size_t len = 0;
  if (index >= argc || napi_is_buffer(env, argv[index], &is_buffer) != napi_ok || !is_buffer || napi_get_buffer_info(env, argv[index], &data, &len) != napi_ok ||
      len == 0 || len > 255 || memchr(data, 0, len) || memchr(data, '/', len))
    return -1;
  memcpy(out, data, len);
  out[len] = '\0';
  return 0;
}

/* renameAtNoReplace(oldDirFd, oldName, newDirFd, newName): renameat2(2) RENAME_NOREPLACE; true when moved, false when newName exists (EEXIST: nothing moved). */
static napi_value rename_at_noreplace_fn(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  size_t argc = get_args(env, info, argv, 4);
  int32_t olddir, newdir;
  char oldname[256], newname[256];
  if (int_arg(env, argv, argc, 0, &olddir) != 0 || name_arg(env, argv, argc, 1, oldname) != 0 || int_arg(env, argv, argc, 2, &newdir) != 0 || name_arg(env, argv, argc, 3, newname) != 0) {
    napi_throw_type_error(env, "EINVAL", "renameAtNoReplace(oldDirFd, oldName, newDirFd, newName): fds and names of 1-255 bytes without '/' or NUL expected");
    return NULL;
  }
  int r = sys_renameat_noreplace(olddir, oldname, newdir, newname);
  if (r == -EEXIST) {
    napi_value f;
    napi_get_boolean(env, false, &f);
    return f;
  }
  if (r < 0) return throw_errno(env, r, "renameat2");
  napi_value t;
  napi_get_boolean(env, true, &t);
  return t;
}

/* setTimesAt(dirFd, name: Buffer | null, sec, nsec): atime and mtime of name in dirFd (or of dirFd itself), to the ns, never through a link. */
static napi_value set_times_at_fn(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  size_t argc = get_args(env, info, argv, 4);
  int32_t dirfd;
  bool is_buffer = false;
  void *data = NULL;
  size_t len = 0;
  double sec = 0, nsec = 0;
  napi_valuetype t = napi_undefined;
  if (int_arg(env, argv, argc, 0, &dirfd) != 0 || argc < 4 || napi_typeof(env, argv[1], &t) != napi_ok ||
      (t != napi_null && (napi_is_buffer(env, argv[1], &is_buffer) != napi_ok || !is_buffer || napi_get_buffer_info(env, argv[1], &data, &len) != napi_ok ||
                          len == 0 || len > 255 || memchr(data, 0, len) || memchr(data, '/', len))) ||
      napi_get_value_double(env, argv[2], &sec) != napi_ok || napi_get_value_double(env, argv[3], &nsec) != napi_ok) {
    napi_throw_type_error(env, "EINVAL", "setTimesAt(dirFd, name | null, sec, nsec): an fd, a name of 1-255 bytes without '/' or NUL (or null), seconds and nanoseconds expected");
    return NULL;
  }
  char name[256];
  if (t != napi_null) {
    memcpy(name, data, len);
    name[len] = '\0';
  }
  int r = sys_set_times_at(dirfd, t == napi_null ? NULL : name, (int64_t)sec, (long)nsec);
  if (r < 0) return throw_errno(env, r, t == napi_null ? "futimens" : "utimensat");
  return make_null(env);
}

/* One fd in, nothing out: fn(fd) returns 0 or -errno, thrown as syscall's error (usage names the call). */
static napi_value fd_call(napi_env env, napi_callback_info info, int (*fn)(int), const char *usage, const char *syscall) {
  int32_t fd;
  if (fd_only_arg(env, info, usage, &fd) != 0) return NULL;
  int r = fn(fd);
  if (r < 0) return throw_errno(env, r, syscall);
  return make_null(env);
}

/* syncfsFd(fd): syncfs(2) of the file system fd is on. */
static napi_value syncfs_fn(napi_env env, napi_callback_info info) {
  return fd_call(env, info, sys_syncfs, "syncfsFd(fd): an fd expected", "syncfs");
}

/* mountIdUnique(fd): the unique id of the mount fd is on (a BigInt), or null when the kernel gives none (before Linux 6.8). */
static napi_value mount_id_unique_fn(napi_env env, napi_callback_info info) {
  int32_t fd;
  if (fd_only_arg(env, info, "mountIdUnique(fd): an fd expected", &fd) != 0) return NULL;
  uint64_t id = 0;
  int r = sys_mount_id_unique(fd, &id);
  if (r < 0) return throw_errno(env, r, "statx");
  if (r == 0) return make_null(env);
  napi_value v;
  if (napi_create_bigint_uint64(env, id, &v) != napi_ok) return NULL;
  return v;
}

/* startWriteback(fd): sync_file_range(2) SYNC_FILE_RANGE_WRITE of the whole file. */
static napi_value start_writeback_fn(napi_env env, napi_callback_info info) {
  return fd_call(env, info, sys_start_writeback, "startWriteback(fd): an fd expected", "sync_file_range");
}

/* freeze(fd) / thaw(fd): FIFREEZE / FITHAW of the file system fd is on (fd: its mount root). */
static napi_value freeze_fn(napi_env env, napi_callback_info info) {
  return fd_call(env, info, sys_freeze, "freeze(fd): an fd expected", "ioctl(FIFREEZE)");
}

static napi_value thaw_fn(napi_env env, napi_callback_info info) {
  return fd_call(env, info, sys_thaw, "thaw(fd): an fd expected", "ioctl(FITHAW)");
}

/* A statdir result as { count, fields, stats, names } (freed here); NULL with a JS error pending when N-API fails. */
static napi_value statdir_value(napi_env env, struct statdir_result *r) {
  napi_value out, count, ab, stats, names, fields;
  void *data;
  size_t bytes = r->count * STATDIR_FIELDS * sizeof(int64_t);
  napi_status st = napi_create_object(env, &out);
  if (st == napi_ok) st = napi_create_double(env, (double)r->count, &count);
  if (st == napi_ok) st = napi_set_named_property(env, out, "count", count);
  if (st == napi_ok) st = napi_create_int32(env, STATDIR_FIELDS, &fields);
  if (st == napi_ok) st = napi_set_named_property(env, out, "fields", fields);
  if (st == napi_ok) st = napi_create_arraybuffer(env, bytes, &data, &ab);
  if (st == napi_ok) {
    if (bytes) memcpy(data, r->stats, bytes);
    st = napi_create_typedarray(env, napi_bigint64_array, r->count * STATDIR_FIELDS, ab, 0, &stats);
  }
  if (st == napi_ok) st = napi_set_named_property(env, out, "stats", stats);
  if (st == napi_ok) st = napi_create_buffer_copy(env, r->names_len, r->names_len ? (void *)r->names : (void *)"", NULL, &names);
  if (st == napi_ok) st = napi_set_named_property(env, out, "names", names);
  statdir_free(r);
  if (st != napi_ok) {
    napi_throw_error(env, "EINVAL", "N-API call failed: statDir result");
    return NULL;
  }
  return out;
}

/*
 * statDir(dirFd): the directory's entries, sorted by name bytes, each with its lstat
 * (statdir.c): { count, stats: BigInt64Array (count x STATDIR_FIELDS, statdir.h's order),
 * names: Buffer (per entry a u16 length, the name, then a symlink's target) }. Throws the
 * listing's errno; an entry's own fstatat/readlinkat errno is in its SD_ERRNO.
 */
static napi_value stat_dir_fn(napi_env env, napi_callback_info info) {
  int32_t fd;
  if (fd_only_arg(env, info, "statDir(dirFd): an fd expected", &fd) != 0) return NULL;
  struct statdir_result r;
  int rc = statdir(fd, &r);
  if (rc < 0) return throw_errno(env, rc, "statdir");
  return statdir_value(env, &r);
}

/*
 * statDirs(dirFds: Int32Array, threads): statDir of each fd, listed on up to `threads` threads
 * at once (statdir.c statdir_many; the event loop's thread waits, as for statDir): an array,
 * element i statDir's result for dirFds[i], or { errno } when that listing failed.
 */
static napi_value stat_dirs_fn(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  size_t argc = get_args(env, info, argv, 2);
  napi_typedarray_type type;
  size_t n = 0;
  void *data = NULL;
  int32_t threads;
  bool is_typed = false;
  if (argc < 2 || napi_is_typedarray(env, argv[0], &is_typed) != napi_ok || !is_typed ||
      napi_get_typedarray_info(env, argv[0], &type, &n, &data, NULL, NULL) != napi_ok || type != napi_int32_array ||
      int_arg(env, argv, argc, 1, &threads) != 0 || threads < 1) {
    napi_throw_type_error(env, "EINVAL", "statDirs(dirFds, threads): an Int32Array of fds and a thread count >= 1 expected");
    return NULL;
  }
  struct statdir_result *res = calloc(n ? n : 1, sizeof *res);
  int *rc = calloc(n ? n : 1, sizeof *rc);
  if (!res || !rc) {
    free(res);
    free(rc);
    return throw_errno(env, -ENOMEM, "statDirs");
  }
  statdir_many((const int *)data, n, res, rc, (unsigned)threads);
  napi_value out;
  napi_status st = napi_create_array_with_length(env, n, &out);
  size_t i = 0;
  for (; i < n && st == napi_ok; i++) {
    napi_value v = NULL, e;
    if (rc[i] < 0) {
      st = napi_create_object(env, &v);
      if (st == napi_ok) st = napi_create_int32(env, -rc[i], &e);
      if (st == napi_ok) st = napi_set_named_property(env, v, "errno", e);
    } else {
      v = statdir_value(env, &res[i]);
      if (!v) st = napi_generic_failure;
    }
    if (st == napi_ok) st = napi_set_element(env, out, (uint32_t)i, v);
  }
  for (; i < n; i++)
    if (rc[i] == 0) statdir_free(&res[i]);
  free(res);
  free(rc);
  if (st != napi_ok) {
    bool pending = false;
    napi_is_exception_pending(env, &pending);
    if (!pending) napi_throw_error(env, "EINVAL", "N-API call failed: statDirs result");
    return NULL;
  }
  return out;
}

/* argv[index] as a Buffer: its bytes and length; 0, else -1. */
static int buffer_arg(napi_env env, napi_value *argv, size_t argc, size_t index, unsigned char **data, size_t *len) {
  bool is_buffer = false;
  if (index >= argc || napi_is_buffer(env, argv[index], &is_buffer) != napi_ok || !is_buffer ||
      napi_get_buffer_info(env, argv[index], (void **)data, len) != napi_ok)
    return -1;
  return 0;
}

/*
 * readFileAt(dirFd, name: Buffer, extraFlags, buf: Buffer, stats: BigInt64Array(2 x FILEIO_FIELDS)):
 * fileio_read_at into buf; stats [0, FILEIO_FIELDS) the fstat before the read, the rest the one
 * after (fileio.h's order). Returns the bytes read (0 and unread when not a regular file: see
 * the first mode). Throws the failing call's errno (open: ENOENT, ELOOP, EWOULDBLOCK...).
 */
static napi_value read_file_at_fn(napi_env env, napi_callback_info info) {
  napi_value argv[5];
  size_t argc = get_args(env, info, argv, 5);
  int32_t dirfd, flags;
  char name[256];
  unsigned char *buf;
  size_t cap, stats_len = 0;
  napi_typedarray_type type;
  void *stats = NULL;
  if (int_arg(env, argv, argc, 0, &dirfd) != 0 || name_arg(env, argv, argc, 1, name) != 0 || int_arg(env, argv, argc, 2, &flags) != 0 ||
      buffer_arg(env, argv, argc, 3, &buf, &cap) != 0 || argc < 5 ||
      napi_get_typedarray_info(env, argv[4], &type, &stats_len, &stats, NULL, NULL) != napi_ok || type != napi_bigint64_array ||
      stats_len < 2 * FILEIO_FIELDS) {
    napi_throw_type_error(env, "EINVAL", "readFileAt(dirFd, name, extraFlags, buf, stats): an fd, a name of 1-255 bytes, flags, a Buffer and a BigInt64Array(20) expected");
    return NULL;
  }
  const char *syscall = "open";
  long n = fileio_read_at(dirfd, name, flags, buf, cap, (int64_t *)stats, (int64_t *)stats + FILEIO_FIELDS, &syscall);
  if (n < 0) return throw_errno(env, (int)n, syscall);
  napi_value out;
  napi_create_double(env, (double)n, &out);
  return out;
}

/*
 * hashFilesAt(dirFd, names: Buffer, extraFlags, cap, threads, rc: Float64Array, stats:
 * BigInt64Array, digests: Buffer): fileio_hash_many of the names (each 1-255 bytes, no '/',
 * each ended by a NUL) into rc (n), stats (n x 2 x FILEIO_FIELDS) and digests (n x 32).
 * Blocks the calling thread; EINVAL (thrown) on bad arguments.
 */
static napi_value hash_files_at_fn(napi_env env, napi_callback_info info) {
  napi_value argv[8];
  size_t argc = get_args(env, info, argv, 8);
  int32_t dirfd, flags, cap, threads;
  unsigned char *names, *digests;
  size_t names_len, digests_len, rc_len = 0, stats_len = 0;
  napi_typedarray_type rc_type, stats_type;
  void *rc = NULL, *stats = NULL;
  const char *usage = "hashFilesAt(dirFd, names, extraFlags, cap, threads, rc, stats, digests): an fd, NUL-ended names of 1-255 bytes "
                      "without '/', flags, cap >= 1, threads >= 1, a Float64Array(n), a BigInt64Array(n x 20) and a Buffer(n x 32) expected";
  if (int_arg(env, argv, argc, 0, &dirfd) != 0 || buffer_arg(env, argv, argc, 1, &names, &names_len) != 0 || int_arg(env, argv, argc, 2, &flags) != 0 ||
      int_arg(env, argv, argc, 3, &cap) != 0 || cap < 1 || int_arg(env, argv, argc, 4, &threads) != 0 || threads < 1 || argc < 8 ||
      napi_get_typedarray_info(env, argv[5], &rc_type, &rc_len, &rc, NULL, NULL) != napi_ok || rc_type != napi_float64_array ||
      napi_get_typedarray_info(env, argv[6], &stats_type, &stats_len, &stats, NULL, NULL) != napi_ok || stats_type != napi_bigint64_array ||
      buffer_arg(env, argv, argc, 7, &digests, &digests_len) != 0) {
    napi_throw_type_error(env, "EINVAL", usage);
    return NULL;
  }
  size_t n = 0;
  for (size_t i = 0, start = 0; i < names_len; i++) {
    if (names[i] == '/' || (names[i] == 0 && (i == start || i - start > 255))) {
      napi_throw_type_error(env, "EINVAL", usage);
      return NULL;
    }
    if (names[i] == 0) {
      n++;
      start = i + 1;
    }
  }
  if ((names_len > 0 && names[names_len - 1] != 0) || rc_len < n || stats_len < n * 2 * FILEIO_FIELDS || digests_len < n * 32) {
    napi_throw_type_error(env, "EINVAL", usage);
    return NULL;
  }
  const char **list = malloc((n ? n : 1) * sizeof *list);
  long *out = malloc((n ? n : 1) * sizeof *out);
  if (!list || !out) {
    free(list);
    free(out);
    return throw_errno(env, -ENOMEM, "hashFilesAt");
  }
  for (size_t i = 0, k = 0; k < n; k++) {
    list[k] = (const char *)names + i;
    i += strlen(list[k]) + 1;
  }
  fileio_hash_many(dirfd, list, n, flags, (size_t)cap, out, (int64_t *)stats, digests, (unsigned)threads);
  for (size_t k = 0; k < n; k++) ((double *)rc)[k] = (double)out[k];
  free(list);
  free(out);
  return make_null(env);
}

/* writeFileNewAt(dirFd, name: Buffer, mode, bytes: Buffer): fileio_write_new_at; throws the failing call's errno (EEXIST, ENOSPC...). */
static napi_value write_file_new_at_fn(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  size_t argc = get_args(env, info, argv, 4);
  int32_t dirfd, mode;
  char name[256];
  unsigned char *bytes;
  size_t len;
  if (int_arg(env, argv, argc, 0, &dirfd) != 0 || name_arg(env, argv, argc, 1, name) != 0 || int_arg(env, argv, argc, 2, &mode) != 0 ||
      buffer_arg(env, argv, argc, 3, &bytes, &len) != 0) {
    napi_throw_type_error(env, "EINVAL", "writeFileNewAt(dirFd, name, mode, bytes): an fd, a name of 1-255 bytes, a mode and a Buffer expected");
    return NULL;
  }
  const char *syscall = "open";
  int r = fileio_write_new_at(dirfd, name, mode, bytes, len, &syscall);
  return r < 0 ? throw_errno(env, r, syscall) : make_null(env);
}

static napi_value init_module(napi_env env, napi_value exports) {
  napi_property_descriptor props[] = {
    {"setChildSubreaper", NULL, set_child_subreaper, NULL, NULL, NULL, napi_default, NULL},
    {"isChildSubreaper", NULL, is_child_subreaper, NULL, NULL, NULL, napi_default, NULL},
    {"setThreadName", NULL, set_thread_name, NULL, NULL, NULL, napi_default, NULL},
    {"spawnDetached", NULL, spawn_detached, NULL, NULL, NULL, napi_default, NULL},
    {"reapPid", NULL, reap_pid, NULL, NULL, NULL, napi_default, NULL},
    {"peekExit", NULL, peek_exit, NULL, NULL, NULL, napi_default, NULL},
    {"continueStopped", NULL, continue_stopped, NULL, NULL, NULL, napi_default, NULL},
    {"makePipe", NULL, make_pipe, NULL, NULL, NULL, napi_default, NULL},
    {"setPipeSize", NULL, set_pipe_size, NULL, NULL, NULL, napi_default, NULL},
    {"tryLockExclusive", NULL, try_lock_exclusive, NULL, NULL, NULL, napi_default, NULL},
    {"peerCred", NULL, peer_cred, NULL, NULL, NULL, napi_default, NULL},
    {"openPty", NULL, open_pty, NULL, NULL, NULL, napi_default, NULL},
    {"setWindowSize", NULL, set_window_size, NULL, NULL, NULL, napi_default, NULL},
    {"sdNotify", NULL, sd_notify_fn, NULL, NULL, NULL, napi_default, NULL},
    {"userByName", NULL, user_by_name, NULL, NULL, NULL, napi_default, NULL},
    {"userById", NULL, user_by_id, NULL, NULL, NULL, napi_default, NULL},
    {"groupByName", NULL, group_by_name, NULL, NULL, NULL, napi_default, NULL},
    {"waitWritable", NULL, wait_writable, NULL, NULL, NULL, napi_default, NULL},
    {"watchInit", NULL, watch_init_fn, NULL, NULL, NULL, napi_default, NULL},
    {"watchMark", NULL, watch_mark_fn, NULL, NULL, NULL, napi_default, NULL},
    {"watchMarkWrites", NULL, watch_mark_writes_fn, NULL, NULL, NULL, napi_default, NULL},
    {"watchPoll", NULL, watch_poll_fn, NULL, NULL, NULL, napi_default, NULL},
    {"watchRead", NULL, watch_read_fn, NULL, NULL, NULL, napi_default, NULL},
    {"watchHandlePath", NULL, watch_handle_path_fn, NULL, NULL, NULL, napi_default, NULL},
    {"mknodAt", NULL, mknod_at_fn, NULL, NULL, NULL, napi_default, NULL},
    {"setTimesAt", NULL, set_times_at_fn, NULL, NULL, NULL, napi_default, NULL},
    {"syncfsFd", NULL, syncfs_fn, NULL, NULL, NULL, napi_default, NULL},
    {"mountIdUnique", NULL, mount_id_unique_fn, NULL, NULL, NULL, napi_default, NULL},
    {"startWriteback", NULL, start_writeback_fn, NULL, NULL, NULL, napi_default, NULL},
    {"freeze", NULL, freeze_fn, NULL, NULL, NULL, napi_default, NULL},
    {"thaw", NULL, thaw_fn, NULL, NULL, NULL, napi_default, NULL},
    {"statDir", NULL, stat_dir_fn, NULL, NULL, NULL, napi_default, NULL},
    {"statDirs", NULL, stat_dirs_fn, NULL, NULL, NULL, napi_default, NULL},
    {"readFileAt", NULL, read_file_at_fn, NULL, NULL, NULL, napi_default, NULL},
    {"hashFilesAt", NULL, hash_files_at_fn, NULL, NULL, NULL, napi_default, NULL},
    {"writeFileNewAt", NULL, write_file_new_at_fn, NULL, NULL, NULL, napi_default, NULL},
    {"renameAtNoReplace", NULL, rename_at_noreplace_fn, NULL, NULL, NULL, napi_default, NULL},
  };
  if (napi_define_properties(env, exports, sizeof props / sizeof props[0], props) != napi_ok) return NULL;
  return exports;
}

/* Context-aware (NAPI_MODULE_INIT): it loads in worker threads too (the checkpoint thread calls syncfs); it keeps no process-wide state. */
NAPI_MODULE_INIT() {
  return init_module(env, exports);
}
