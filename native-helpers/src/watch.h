/*
 * watch: the workspace watcher's syscalls, as plain C (addon.c is the N-API glue). One
 * fanotify group reporting the directory's file handle and the entry's name
 * (FAN_REPORT_DFID_NAME) and a pidfd for the writer (FAN_REPORT_PIDFD); a filesystem mark
 * per workspace; reads that parse events and turn each pidfd into the writer's cgroup id at
 * once (PIDFD_GET_INFO, else /proc/<pid>/cgroup read while the pidfd is held) and close it.
 * Each call returns >= 0 on success, -errno on failure. See fanotify(7), fanotify_init(2),
 * fanotify_mark(2), open_by_handle_at(2), pidfd_open(2), Documentation/filesystems/pidfs.
 */
#ifndef SBX_WATCH_H
#define SBX_WATCH_H

#include <stdint.h>
#include <sys/types.h>

/* The longest file handle we keep (MAX_HANDLE_SZ is 128) and name (NAME_MAX + 1). */
#define WATCH_HANDLE_MAX 128
#define WATCH_NAME_MAX 256

/* One event as read: mask (FAN_*), the writer's pid (0 if none), its cgroup id (0 when it
 * could not be found: the writer was already reaped, no pidfd), the directory's file handle
 * (type, bytes), the entry's name ("." for the directory itself; "" when none), and the
 * entry's own file handle where the kernel reports it (FAN_REPORT_TARGET_FID: the child of a
 * create, delete or move; target_len 0 when none): how a directory deleted before its events
 * were read is still placed (its delete names it in its parent). */
struct watch_event {
  uint64_t mask;
  int32_t pid;
  int32_t pidfd_state; /* 1 pidfd, 0 FAN_NOPIDFD (reaped), -1 FAN_EPIDFD / none */
  uint64_t cgroup_id;
  int32_t handle_type;
  uint32_t handle_len;
  unsigned char fsid[8];
  unsigned char handle[WATCH_HANDLE_MAX];
  int32_t target_type;
  uint32_t target_len;
  unsigned char target[WATCH_HANDLE_MAX];
  char name[WATCH_NAME_MAX];
};

/* fanotify_init(FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK | FAN_REPORT_DFID_NAME_TARGET |
 * FAN_REPORT_PIDFD [| FAN_UNLIMITED_QUEUE], O_RDONLY | O_CLOEXEC), else without the target
 * fid (FAN_REPORT_FID | FAN_REPORT_TARGET_FID, Linux 5.17): the group's fd | -errno (EPERM
 * without CAP_SYS_ADMIN, EINVAL where the kernel lacks a flag). */
int watch_init(int unlimited_queue);

/* fanotify_mark(FAN_MARK_ADD | FAN_MARK_FILESYSTEM, create, close-write, attrib, delete,
 * moves, self-delete/move, FAN_ONDIR, and modify when report_modify) on the file system
 * holding path: 0 | -errno (EOPNOTSUPP: an overlayfs without nfs_export, EXDEV: a file
 * system without fids). Without modify, a write is seen at the writer's close (explicit, or
 * at its exit: before its cgroup empties), one event per file instead of one per write(2). */
int watch_mark(int fd, const char *path, int report_modify);

/* fanotify_mark(FAN_MARK_ADD | FAN_MARK_FILESYSTEM, FAN_MODIFY) on the file system holding
 * path: one event per write(2) that wrote something, by the writer (the cgroup escape watch
 * marks cgroup2 so: every write to any cgroup.procs). 0 | -errno. */
int watch_mark_writes(int fd, const char *path);

/* poll(POLLIN) up to timeout_ms: 1 readable, 0 not | -errno. */
int watch_poll(int fd, int timeout_ms);

/* One read(2) takes at most this many bytes (whole events), so at most WATCH_MAX_EVENTS
 * (the smallest event, a queue overflow, is a bare 24-byte metadata). */
#define WATCH_READ_BYTES (64 * 1024)
#define WATCH_MAX_EVENTS (WATCH_READ_BYTES / 24 + 1)

/* Reads what is queued (one read) into out (room for max >= WATCH_MAX_EVENTS events).
 * Events with no directory record (an inode's own delete or link count: its entry's event in
 * the directory is the same change) are dropped. Events written by self_pid are dropped unless their name starts with keep_name ("#": the
 * barriers, an O_TMPFILE inode's event names it #<inode>).
 * Without PIDFD_GET_INFO the cgroup is found under cgroup_mount (the cgroup2 mount; "" for
 * none). Every pidfd is closed. *own_dropped: how many of self_pid's were dropped. Returns the
 * count (0: nothing queued) | -errno. */
int watch_read(int fd, struct watch_event *out, int max, pid_t self_pid, const char *keep_name, const char *cgroup_mount, int *own_dropped);

/* The path of the directory a file handle names (open_by_handle_at(mount_fd, O_PATH) then
 * readlink of /proc/self/fd/N), into out (NUL-terminated): its length | -errno (ESTALE: the
 * directory is gone, ENAMETOOLONG: past out_len). */
int watch_handle_path(int mount_fd, int32_t handle_type, const unsigned char *handle, uint32_t handle_len, char *out, size_t out_len);

#endif
