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
enum { FIO_SIZE, FIO_MODE, FIO_UID, FIO_GID, FIO_MTIME_NS, FIO_CTIME_NS, FIO_INO, FIO_RDEV, FIO_DEV, FIO_BLOCKS, FILEIO_FIELDS };

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
 * Creates name in dirfd (O_CREAT|O_EXCL|O_WRONLY|O_CLOEXEC|O_NOFOLLOW, mode), writes len
 * bytes and closes it (not fsync'ed). On a failure after the create the file is removed.
 */
int fileio_write_new_at(int dirfd, const char *name, int mode, const unsigned char *bytes, size_t len, const char **syscall);

#endif
