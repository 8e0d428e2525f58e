/*
 * statdir: one directory's entries with their lstat, sorted by name bytes (see statdir.h).
 * The directory is read through a new open of "." relative to dirfd, so dirfd's own offset
 * is never moved; every stat and readlink is relative to dirfd (fstatat(2), readlinkat(2)),
 * never a path, so any depth works. Owns nothing past the call.
 */
#define _GNU_SOURCE
#include "statdir.h"
#include "timens.h"
#include "threads.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct name_ref {
  char *name;
  size_t len;
};

static int by_bytes(const void *a, const void *b) {
  const struct name_ref *x = a, *y = b;
  size_t n = x->len < y->len ? x->len : y->len;
  int c = memcmp(x->name, y->name, n);
  if (c != 0) return c;
  return x->len < y->len ? -1 : x->len > y->len ? 1 : 0;
}

void statdir_free(struct statdir_result *r) {
  free(r->stats);
  free(r->names);
  r->stats = NULL;
  r->names = NULL;
  r->count = 0;
  r->names_len = 0;
}

int statdir(int dirfd, struct statdir_result *out) {
  memset(out, 0, sizeof *out);
  int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -errno;
  DIR *d = fdopendir(fd);
  if (!d) {
    int e = errno;
    close(fd);
    return -e;
  }
  size_t cap = 64, n = 0;
  struct name_ref *refs = malloc(cap * sizeof *refs);
  if (!refs) {
    closedir(d);
    return -ENOMEM;
  }
  int err = 0;
  for (;;) {
    errno = 0;
    struct dirent *de = readdir(d);
    if (!de) {
      if (errno) err = -errno;
      break;
    }
    if (de->d_name[0] == '.' && (de->d_name[1] == 0 || (de->d_name[1] == '.' && de->d_name[2] == 0))) continue;
    if (n == cap) {
      struct name_ref *more = realloc(refs, 2 * cap * sizeof *refs);
      if (!more) {
        err = -ENOMEM;
        break;
      }
      refs = more;
      cap *= 2;
    }
    size_t len = strlen(de->d_name);
    refs[n].name = malloc(len + 1);
    if (!refs[n].name) {
      err = -ENOMEM;
      break;
    }
    memcpy(refs[n].name, de->d_name, len + 1);
    refs[n].len = len;
    n++;
  }
  closedir(d);
  if (err == 0) qsort(refs, n, sizeof *refs, by_bytes);
  size_t names_cap = 0;
  for (size_t i = 0; i < n; i++) names_cap += 2 + refs[i].len;
  if (err == 0) {
    out->stats = calloc(n ? n : 1, sizeof(int64_t) * STATDIR_FIELDS);
    out->names = malloc(names_cap + 1);
    if (!out->stats || !out->names) err = -ENOMEM;
  }
  size_t pos = 0;
  char target[PATH_MAX];
  for (size_t i = 0; i < n && err == 0; i++) {
    int64_t *s = out->stats + i * STATDIR_FIELDS;
    struct stat st;
    s[SD_TARGET_LEN] = -1;
    ssize_t tlen = -1;
    if (fstatat(dirfd, refs[i].name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
      s[SD_ERRNO] = errno;
    } else {
      s[SD_MODE] = st.st_mode;
      s[SD_UID] = st.st_uid;
      s[SD_GID] = st.st_gid;
      s[SD_NLINK] = (int64_t)st.st_nlink;
      s[SD_DEV] = (int64_t)st.st_dev;
      s[SD_INO] = (int64_t)st.st_ino;
      s[SD_SIZE] = st.st_size;
      s[SD_BLOCKS] = st.st_blocks;
      s[SD_RDEV] = (int64_t)st.st_rdev;
      s[SD_MTIME_NS] = time_ns(&st.st_mtim);
      s[SD_CTIME_NS] = time_ns(&st.st_ctim);
      s[SD_MTIME_SEC] = (int64_t)st.st_mtim.tv_sec;
      s[SD_MTIME_NSEC] = st.st_mtim.tv_nsec;
      s[SD_CTIME_SEC] = (int64_t)st.st_ctim.tv_sec;
      s[SD_CTIME_NSEC] = st.st_ctim.tv_nsec;
      if (S_ISLNK(st.st_mode)) {
        tlen = readlinkat(dirfd, refs[i].name, target, sizeof target);
        if (tlen < 0) {
          if (errno == EINVAL) s[SD_TARGET_LEN] = -2;
          else s[SD_ERRNO] = errno;
          tlen = -1;
        } else {
          s[SD_TARGET_LEN] = tlen;
        }
      }
    }
    size_t need = 2 + refs[i].len + (tlen > 0 ? (size_t)tlen : 0);
    if (pos + need > names_cap) {
      uint8_t *more = realloc(out->names, pos + need + 1);
      if (!more) {
        err = -ENOMEM;
        break;
      }
      out->names = more;
      names_cap = pos + need;
    }
    uint16_t l16 = (uint16_t)refs[i].len;
    memcpy(out->names + pos, &l16, 2);
    memcpy(out->names + pos + 2, refs[i].name, refs[i].len);
    pos += 2 + refs[i].len;
    if (tlen > 0) {
      memcpy(out->names + pos, target, (size_t)tlen);
      pos += (size_t)tlen;
    }
  }
  for (size_t i = 0; i < n; i++) free(refs[i].name);
  free(refs);
  if (err != 0) {
    statdir_free(out);
    return err;
  }
  out->count = n;
  out->names_len = pos;
  return 0;
}

struct statdir_batch {
  const int *fds;
  size_t n;
  struct statdir_result *out;
  int *rc;
  size_t next; /* the next index to take (atomic) */
};

static void *statdir_batch_run(void *arg) {
  struct statdir_batch *b = arg;
  for (;;) {
    size_t i = __atomic_fetch_add(&b->next, 1, __ATOMIC_RELAXED);
    if (i >= b->n) return NULL;
    b->rc[i] = statdir(b->fds[i], &b->out[i]);
  }
}

void statdir_many(const int *fds, size_t n, struct statdir_result *out, int *rc, unsigned threads) {
  struct statdir_batch b = {fds, n, out, rc, 0};
  run_on_threads(statdir_batch_run, &b, n, threads);
}
