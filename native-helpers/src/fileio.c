/* fileio: a small file read whole, or a new file written, at a directory fd (fileio.h). */
#define _GNU_SOURCE
#include "fileio.h"
#include "threads.h"
#include "timens.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static void put_stat(const struct stat *st, int64_t *out) {
  out[FIO_SIZE] = st->st_size;
  out[FIO_MODE] = st->st_mode;
  out[FIO_UID] = st->st_uid;
  out[FIO_GID] = st->st_gid;
  out[FIO_MTIME_NS] = time_ns(&st->st_mtim);
  out[FIO_CTIME_NS] = time_ns(&st->st_ctim);
  out[FIO_INO] = (int64_t)st->st_ino;
  out[FIO_RDEV] = (int64_t)st->st_rdev;
  out[FIO_DEV] = (int64_t)st->st_dev;
  out[FIO_BLOCKS] = st->st_blocks;
  out[FIO_MTIME_SEC] = (int64_t)st->st_mtim.tv_sec;
  out[FIO_MTIME_NSEC] = st->st_mtim.tv_nsec;
  out[FIO_CTIME_SEC] = (int64_t)st->st_ctim.tv_sec;
  out[FIO_CTIME_NSEC] = st->st_ctim.tv_nsec;
}

static int close_keeping_errno(int fd, int err) {
  close(fd);
  return err;
}

long fileio_read_at(int dirfd, const char *name, int extra_flags, unsigned char *buf, size_t cap, int64_t *before, int64_t *after,
                    const char **syscall) {
  *syscall = "open";
  int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | extra_flags);
  if (fd < 0) return -errno;
  struct stat st;
  *syscall = "fstat";
  if (fstat(fd, &st) < 0) return close_keeping_errno(fd, -errno);
  put_stat(&st, before);
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return 0;
  }
  size_t n = 0;
  /* Read to the size fstat gave, not to a read of 0 (one system call less per file): a file
   * grown since shows it in the fstat after (its size, its times), as one changed does. */
  size_t expect = st.st_size > 0 ? (size_t)st.st_size : 0;
  *syscall = "read";
  while (n < cap) {
    ssize_t r = pread(fd, buf + n, cap - n, (off_t)n);
    if (r < 0) {
      if (errno == EINTR) continue;
      return close_keeping_errno(fd, -errno);
    }
    if (r == 0) break;
    n += (size_t)r;
    if (expect > 0 && n == expect) break;
  }
  *syscall = "fstat";
  if (fstat(fd, &st) < 0) return close_keeping_errno(fd, -errno);
  put_stat(&st, after);
  close(fd);
  return (long)n;
}

int fileio_write_new_at(int dirfd, const char *name, int mode, const unsigned char *bytes, size_t len, const char **syscall) {
  *syscall = "open";
  int fd = openat(dirfd, name, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, (mode_t)mode);
  if (fd < 0) return -errno;
  size_t n = 0;
  *syscall = "write";
  while (n < len) {
    ssize_t w = write(fd, bytes + n, len - n);
    if (w < 0) {
      if (errno == EINTR) continue;
      int err = -errno;
      close(fd);
      unlinkat(dirfd, name, 0);
      return err;
    }
    n += (size_t)w;
  }
  *syscall = "close";
  if (close(fd) < 0) {
    int err = -errno;
    unlinkat(dirfd, name, 0);
    return err;
  }
  return 0;
}

struct hash_batch {
  int dirfd;
  const char *const *names;
  size_t n;
  int extra_flags;
  size_t cap;
  long *rc;
  int64_t *stats;
  unsigned char *digests;
  size_t next; /* the next index to take (atomic) */
};

static void *hash_batch_run(void *arg) {
  struct hash_batch *b = arg;
  unsigned char *buf = malloc(b->cap ? b->cap : 1);
  for (;;) {
    size_t i = __atomic_fetch_add(&b->next, 1, __ATOMIC_RELAXED);
    if (i >= b->n) break;
    if (!buf) {
      b->rc[i] = -ENOMEM;
      continue;
    }
    int64_t *before = b->stats + i * 2 * FILEIO_FIELDS, *after = before + FILEIO_FIELDS;
    const char *syscall;
    /* O_NONBLOCK always: a fifo planted under a name opens at once (and is not read). */
    long r = fileio_read_at(b->dirfd, b->names[i], b->extra_flags | O_NONBLOCK, buf, b->cap, before, after, &syscall);
    b->rc[i] = r;
    if (r >= 0 && S_ISREG((mode_t)before[FIO_MODE]) && (size_t)r < b->cap) {
      unsigned int len = 0;
      if (EVP_Digest(buf, (size_t)r, b->digests + i * 32, &len, EVP_sha256(), NULL) != 1 || len != 32) b->rc[i] = -EIO;
    }
  }
  free(buf);
  return NULL;
}

void fileio_hash_many(int dirfd, const char *const *names, size_t n, int extra_flags, size_t cap, long *rc, int64_t *stats, unsigned char *digests,
                      unsigned threads) {
  struct hash_batch b = {dirfd, names, n, extra_flags, cap, rc, stats, digests, 0};
  run_on_threads(hash_batch_run, &b, n, threads);
}
