/* The workspace watcher's syscalls (watch.h). Plain C: no N-API here. */
#define _GNU_SOURCE
#include "watch.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/fanotify.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

/* pidfs (kernel 6.13+): PIDFD_GET_INFO, from include/uapi/linux/pidfd.h (not in Debian 12's
 * headers). The ioctl is extensible by size; this is PIDFD_INFO_SIZE_VER0 (64 bytes). With
 * PIDFD_INFO_EXIT (6.15+) asked too. What it gives a writer gone by the read is not a cgroup
 * here: fanotify makes no pidfd for a task already reaped (FAN_NOPIDFD), and a red-team run on
 * 6.18 never had an exited writer's cgroup resolved (escape.ts: such a write is unattributable). */
struct sbx_pidfd_info {
  uint64_t mask;
  uint64_t cgroupid;
  uint32_t pid, tgid, ppid, ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid;
  int32_t exit_code;
};
#define SBX_PIDFD_INFO_CGROUPID (1UL << 2)
#define SBX_PIDFD_INFO_EXIT (1UL << 3)
#define SBX_PIDFD_GET_INFO _IOWR(0xFF, 11, struct sbx_pidfd_info)


#ifndef FAN_REPORT_TARGET_FID
#define FAN_REPORT_TARGET_FID 0x00001000
#endif

int watch_init(int unlimited_queue) {
  unsigned int flags = FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK | FAN_REPORT_DFID_NAME | FAN_REPORT_PIDFD;
  if (unlimited_queue) flags |= FAN_UNLIMITED_QUEUE;
  int fd = fanotify_init(flags | FAN_REPORT_FID | FAN_REPORT_TARGET_FID, O_RDONLY | O_CLOEXEC);
  if (fd < 0 && errno == EINVAL) fd = fanotify_init(flags, O_RDONLY | O_CLOEXEC);
  return fd < 0 ? -errno : fd;
}

int watch_mark(int fd, const char *path, int report_modify) {
  uint64_t mask = FAN_CREATE | FAN_CLOSE_WRITE | FAN_ATTRIB | FAN_DELETE | FAN_MOVED_FROM | FAN_MOVED_TO | FAN_DELETE_SELF |
                  FAN_MOVE_SELF | FAN_ONDIR;
  if (report_modify) mask |= FAN_MODIFY;
  return fanotify_mark(fd, FAN_MARK_ADD | FAN_MARK_FILESYSTEM, mask, AT_FDCWD, path) < 0 ? -errno : 0;
}

int watch_mark_writes(int fd, const char *path) {
  return fanotify_mark(fd, FAN_MARK_ADD | FAN_MARK_FILESYSTEM, FAN_MODIFY, AT_FDCWD, path) < 0 ? -errno : 0;
}

int watch_poll(int fd, int timeout_ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  int r = poll(&p, 1, timeout_ms);
  if (r < 0) return errno == EINTR ? 0 : -errno;
  return r > 0 ? 1 : 0;
}

/* The cgroup id of the process a pidfd names: PIDFD_GET_INFO, else the inode of its cgroup
 * v2 directory read through /proc while the pidfd pins the pid (no reuse meanwhile). 0: none. */
static uint64_t cgroup_of(int pidfd, pid_t pid, const char *cgroup_mount) {
  struct sbx_pidfd_info info;
  memset(&info, 0, sizeof info);
  info.mask = SBX_PIDFD_INFO_CGROUPID | SBX_PIDFD_INFO_EXIT;
  if (ioctl(pidfd, SBX_PIDFD_GET_INFO, &info) == 0 && (info.mask & SBX_PIDFD_INFO_CGROUPID)) return info.cgroupid;
  if (errno == ESRCH || pid <= 0 || !cgroup_mount || !cgroup_mount[0]) return 0;
  char path[64], line[4096];
  snprintf(path, sizeof path, "/proc/%d/cgroup", (int)pid);
  FILE *f = fopen(path, "re");
  if (!f) return 0;
  uint64_t id = 0;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "0::", 3) != 0) continue;
    line[strcspn(line, "\n")] = 0;
    /* The cgroup id is the inode of its directory under the cgroup2 mount. */
    char dir[PATH_MAX + 4096];
    snprintf(dir, sizeof dir, "%s%s", cgroup_mount, line + 3);
    struct stat st;
    if (stat(dir, &st) == 0) id = st.st_ino;
    break;
  }
  fclose(f);
  /* Still the same process? A pidfd that polls readable has exited: its /proc may be another's. */
  struct pollfd p = {.fd = pidfd, .events = POLLIN};
  if (poll(&p, 1, 0) > 0) return 0;
  return id;
}

int watch_read(int fd, struct watch_event *out, int max, pid_t self_pid, const char *keep_name, const char *cgroup_mount, int *own_dropped) {
  *own_dropped = 0;
  /* Aligned for struct fanotify_event_metadata. */
  static __thread char buf[WATCH_READ_BYTES] __attribute__((aligned(8)));
  ssize_t len = read(fd, buf, sizeof buf);
  if (len < 0) return errno == EAGAIN ? 0 : -errno;
  int n = 0;
  struct fanotify_event_metadata *m = (struct fanotify_event_metadata *)buf;
  for (; FAN_EVENT_OK(m, len); m = FAN_EVENT_NEXT(m, len)) {
    if (m->vers != FANOTIFY_METADATA_VERSION) return -EPROTO;
    struct watch_event *e = n < max ? &out[n] : NULL;
    int pidfd = -1;
    const struct fanotify_event_info_fid *fid = NULL, *target = NULL;
    const char *name = "";
    char *end = (char *)m + m->event_len;
    char *p = (char *)m + m->metadata_len;
    while (p + sizeof(struct fanotify_event_info_header) <= end) {
      struct fanotify_event_info_header *h = (struct fanotify_event_info_header *)p;
      if (h->len == 0 || p + h->len > end) break;
      if (h->info_type == FAN_EVENT_INFO_TYPE_DFID_NAME || h->info_type == FAN_EVENT_INFO_TYPE_DFID) {
        fid = (const struct fanotify_event_info_fid *)p;
        if (h->info_type == FAN_EVENT_INFO_TYPE_DFID_NAME) {
          const struct file_handle *fh = (const struct file_handle *)fid->handle;
          name = (const char *)fh->f_handle + fh->handle_bytes;
        }
      } else if (h->info_type == FAN_EVENT_INFO_TYPE_FID) {
        target = (const struct fanotify_event_info_fid *)p;
      } else if (h->info_type == FAN_EVENT_INFO_TYPE_PIDFD) {
        pidfd = ((const struct fanotify_event_info_pidfd *)p)->pidfd;
      }
      p += h->len;
    }
    int keep = !(self_pid > 0 && m->pid == self_pid && (!keep_name || strncmp(name, keep_name, strlen(keep_name)) != 0));
    if (!keep) (*own_dropped)++;
    /* No directory record: an inode's own event (a file's DELETE_SELF, its link count's ATTRIB),
     * reported only with FAN_REPORT_FID; its directory entry's event is the same change (and the
     * overflow event, which has no record at all, is kept). */
    if (!fid && target && !(m->mask & FAN_Q_OVERFLOW)) keep = 0;
    if (e && keep) {
      memset(e, 0, sizeof *e);
      e->mask = m->mask;
      e->pid = m->pid;
      e->pidfd_state = pidfd >= 0 ? 1 : pidfd == FAN_NOPIDFD ? 0 : -1;
      e->cgroup_id = pidfd >= 0 && m->pid != self_pid ? cgroup_of(pidfd, m->pid, cgroup_mount) : 0;
      if (fid) {
        const struct file_handle *fh = (const struct file_handle *)fid->handle;
        memcpy(e->fsid, &fid->fsid, sizeof e->fsid);
        e->handle_type = fh->handle_type;
        e->handle_len = fh->handle_bytes <= WATCH_HANDLE_MAX ? fh->handle_bytes : 0;
        memcpy(e->handle, fh->f_handle, e->handle_len);
      }
      if (target) {
        const struct file_handle *th = (const struct file_handle *)target->handle;
        e->target_type = th->handle_type;
        e->target_len = th->handle_bytes <= WATCH_HANDLE_MAX ? th->handle_bytes : 0;
        memcpy(e->target, th->f_handle, e->target_len);
      }
      snprintf(e->name, sizeof e->name, "%s", name);
      n++;
    }
    if (pidfd >= 0) close(pidfd);
  }
  return n;
}

int watch_handle_path(int mount_fd, int32_t handle_type, const unsigned char *handle, uint32_t handle_len, char *out, size_t out_len) {
  if (handle_len > WATCH_HANDLE_MAX || out_len < 2) return -EINVAL;
  char space[sizeof(struct file_handle) + WATCH_HANDLE_MAX] __attribute__((aligned(8)));
  struct file_handle *fh = (struct file_handle *)space;
  fh->handle_bytes = handle_len;
  fh->handle_type = handle_type;
  memcpy(fh->f_handle, handle, handle_len);
  int fd = open_by_handle_at(mount_fd, fh, O_PATH | O_CLOEXEC);
  if (fd < 0) return -errno;
  char link[64];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, out, out_len - 1);
  int err = errno;
  close(fd);
  if (n < 0) return -err;
  if ((size_t)n >= out_len - 1) return -ENAMETOOLONG;
  out[n] = 0;
  return (int)n;
}
