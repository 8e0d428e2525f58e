// File timestamps' granule, as a timestamp shows it: how long after a look a change may still
// leave a file's or a directory's times as they were (git's "racily clean" entries,
// Documentation/technical/racy-git.txt). Owns that margin; the stat cache and the object
// store's listing cache use it.

/**
 * How long before a look (a capture's start, a directory's listing) a file's ctime must be
 * for what was seen then to be trusted later: a write later in the same timestamp granule as
 * the look would leave its stat unchanged (git's "racily clean" entries, Documentation/technical/racy-git.txt). The
 * granule is the file system's (1 s on ext4 with 128-byte inodes and ext2/3, 2 s on vfat,
 * 10 ms on exfat, the kernel's tick of at most 10 ms elsewhere) and no call tells it, but
 * the timestamp shows it: nanoseconds that are a whole second may be a 2 s granule, whole
 * milliseconds one under a second, anything else a tick. Each margin adds a tick (the
 * coarse clock lags the wall clock by up to one).
 */
export function racyMarginNs(ctimeNs: bigint): bigint {
  const subSecondNs = ctimeNs % 1_000_000_000n;
  if (subSecondNs === 0n) return 2_010_000_000n;
  if (subSecondNs % 1_000_000n === 0n) return 1_010_000_000n;
  return 100_000_000n;
}
