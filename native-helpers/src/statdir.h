/*
 * statdir: one directory's entries and their lstat in one call (getdents64 via readdir(3),
 * fstatat(2) AT_SYMLINK_NOFOLLOW, readlinkat(2) for links), names sorted bytewise: what the
 * workspace walk (supervisor/workspace/walk.ts) asked of node:fs one syscall and one
 * /proc/self/fd path lookup at a time. Plain C; the N-API glue is in addon.c.
 */
#ifndef SBX_STATDIR_H
#define SBX_STATDIR_H
#include <stddef.h>
#include <stdint.h>

/* Per entry, in statdir_result.stats: STATDIR_FIELDS int64s. */
enum {
  SD_ERRNO, /* 0, or the errno of its fstatat/readlinkat (ENOENT: removed since listed) */
  SD_MODE,
  SD_UID,
  SD_GID,
  SD_NLINK,
  SD_DEV,
  SD_INO,
  SD_SIZE,
  SD_BLOCKS,
  SD_RDEV,
  SD_MTIME_NS, /* sec x 10^9 + nsec; INT64_MIN when that is past int64 (before 1677, after 2262): then SD_MTIME_SEC/NSEC */
  SD_CTIME_NS,
  SD_TARGET_LEN, /* a symlink: its target's length (bytes in names after the name); -1 none; -2 not a link any more (EINVAL) */
  SD_MTIME_SEC,
  SD_MTIME_NSEC,
  SD_CTIME_SEC,
  SD_CTIME_NSEC,
  STATDIR_FIELDS
};

struct statdir_result {
  size_t count;
  int64_t *stats;  /* count x STATDIR_FIELDS */
  uint8_t *names;  /* per entry: u16 length (host order), the name, then its link target if any */
  size_t names_len;
};

/* Lists dirfd (not moved: a dup is read) and lstats each entry relative to it. 0, or -errno (the listing failed). Free with statdir_free. */
int statdir(int dirfd, struct statdir_result *out);
void statdir_free(struct statdir_result *r);

/*
 * statdir of each of fds[0..n) into out[i], rc[i] its return (0 or -errno), on up to `threads`
 * threads (the caller's one of them; fewer when a pthread_create fails): git's preload-index,
 * for a walk's listings. Each fd is read by one thread only.
 */
void statdir_many(const int *fds, size_t n, struct statdir_result *out, int *rc, unsigned threads);

#endif
