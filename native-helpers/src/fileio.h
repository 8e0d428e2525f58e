/*
 * fileio: a small file read whole, or a new file written, at a directory fd in one call
 * (openat(2), fstat(2), pread(2) or write(2), close(2)): what the checkpoint's capture and
 * read-back asked of node:fs five calls and a /proc/self/fd path lookup at a time, per file.
 * Plain C; the N-API glue is in addon.c. Each returns >= 0 on success, -errno on failure.
 */
#ifndef SBX_FILEIO_H
#define SBX_FILEIO_H
#include <stddef.h>
#include <stdint.h>

/* One fstat, as FILEIO_FIELDS int64s in this order. */
/* FIO_MTIME_NS, FIO_CTIME_NS: sec x 10^9 + nsec; INT64_MIN when past int64 (before 1677, after 2262): then FIO_*_SEC/NSEC. */
enum {
  FIO_SIZE,
  FIO_MODE,
  FIO_UID,
  FIO_GID,
  FIO_MTIME_NS,
  FIO_CTIME_NS,
  FIO_INO,
  FIO_RDEV,
  FIO_DEV,
  FIO_BLOCKS,
  FIO_MTIME_SEC,
  FIO_MTIME_NSEC,
  FIO_CTIME_SEC,
  FIO_CTIME_NSEC,
  FILEIO_FIELDS
};

/*
 * Opens name in dirfd (O_RDONLY|O_CLOEXEC|O_NOFOLLOW|extra_flags), fstats it into before; a
 * file that is not regular is closed unread (returns 0: the caller sees its type in
 * before[FIO_MODE]). Else reads from offset 0 until end of file, cap bytes, or the size the
 * first fstat gave (when not 0: no read is spent to find the end; a file grown meanwhile has
 * another size, or times, in after), fstats it into after and closes it; returns the bytes
 * read (cap: it may hold more). *syscall names the call that failed.
 */
long fileio_read_at(int dirfd, const char *name, int extra_flags, unsigned char *buf, size_t cap, int64_t *before, int64_t *after,
                    const char **syscall);

/*
 * fileio_read_at of each of names[0..n) in dirfd, on up to `threads` threads (the calling one
 * among them, which waits for the rest), each with a buffer of cap bytes of its own: rc[i] the
 * bytes read | -errno (ENOMEM: no buffer), stats[i * 2 * FILEIO_FIELDS...] its fstats before
 * and after, and digests[i * 32...] the SHA-256 of the bytes read when they are the whole
 * file (a regular file, fewer than cap bytes; else left as they are). For the read-back of a
 * checkpoint's objects, git's preload-index way: what a thread reads, it hashes. The SHA-256
 * is OpenSSL's EVP_Digest (evp(7)), the one node itself exports to addons. Opened O_NONBLOCK
 * whatever extra_flags says: a fifo under a name never blocks the batch.
 */
void fileio_hash_many(int dirfd, const char *const *names, size_t n, int extra_flags, size_t cap, long *rc, int64_t *stats, unsigned char *digests,
                      unsigned threads);

/*
 * Creates name in dirfd (O_CREAT|O_EXCL|O_WRONLY|O_CLOEXEC|O_NOFOLLOW, mode), writes len
 * bytes and closes it (not fsync'ed). On a failure after the create the file is removed.
 */
int fileio_write_new_at(int dirfd, const char *name, int mode, const unsigned char *bytes, size_t len, const char **syscall);

#endif
