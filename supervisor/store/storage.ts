// Space on the file system that holds the state dir (statfs(2): f_bavail * f_bsize free, f_blocks * f_bsize
// in all). Three thresholds (StorageThresholds): chunk writes stop while less than reserveBytes is free, so
// index records and receipts can still be written; launches are refused (ADMISSION_DENIED, retryable) while
// less than minFreeBytes is free; retention removes the oldest ended output while less than keepFreeBytes is
// free (journald's SystemKeepFree=). Unset, each scales to the file system's size (storageThresholds).
import { statfsSync } from 'node:fs';

const CHECK_BYTES = 1 << 20;
const CHECK_MS = 100;
const MiB = 1 << 20;

/** The configured thresholds (config storage.*); undefined: scaled to the file system. */
export interface StorageConfig {
  reserveBytes?: number;
  minFreeBytes?: number;
  keepFreeBytes?: number;
}

export interface StorageThresholds {
  reserveBytes: number;
  minFreeBytes: number;
  keepFreeBytes: number;
}

/**
 * Thresholds for a file system of totalBytes: what is configured, else the smaller of a
 * fixed size and a share of the file system (reserve 64 MiB or 5%, launches 256 MiB or 10%,
 * keep-free 512 MiB or 15%), so a small state dir (a 64 MiB tmpfs) is usable by default.
 */
export function storageThresholds(config: StorageConfig, totalBytes: number): StorageThresholds {
  const scaled = (fixed: number, share: number) => Math.floor(Math.min(fixed, totalBytes * share));
  return {
    reserveBytes: config.reserveBytes ?? scaled(64 * MiB, 0.05),
    minFreeBytes: config.minFreeBytes ?? scaled(256 * MiB, 0.1),
    keepFreeBytes: config.keepFreeBytes ?? scaled(512 * MiB, 0.15),
  };
}

/** What is wrong with thresholds on a file system of totalBytes (start-up warnings), if anything. */
export function thresholdWarnings(t: StorageThresholds, totalBytes: number): string[] {
  const out: string[] = [];
  if (t.minFreeBytes >= totalBytes)
    out.push(`storage.minFreeBytes (${t.minFreeBytes}) is not below the state dir's file system size (${totalBytes}): admission can never open`);
  if (t.keepFreeBytes < t.minFreeBytes)
    out.push(
      `storage.keepFreeBytes (${t.keepFreeBytes}) is below storage.minFreeBytes (${t.minFreeBytes}): a full state dir does not reopen admission by itself (sbx gc cannot free enough)`,
    );
  if (t.reserveBytes >= totalBytes)
    out.push(`storage.reserveBytes (${t.reserveBytes}) is not below the state dir's file system size (${totalBytes}): no output will ever be stored`);
  return out;
}

type Statfs = (dir: string) => { bavail: number; bsize: number; blocks: number };

export class StorageGuard implements StorageThresholds {
  private free = Infinity;
  private checkedAt = 0;
  private writtenSinceCheck = 0;
  /** Bytes mayWrite let through that are not written yet (write buffers, chunks.ts): statfs may not count them yet. */
  private pendingBytes = 0;
  readonly reserveBytes: number;
  readonly minFreeBytes: number;
  readonly keepFreeBytes: number;
  /** Size of the file system, in bytes, when the guard was made. */
  readonly totalBytes: number;

  constructor(
    readonly dir: string,
    config: StorageConfig,
    private readonly statfs: Statfs = statfsSync,
  ) {
    const s = this.statfs(dir);
    this.totalBytes = s.blocks * s.bsize;
    ({ reserveBytes: this.reserveBytes, minFreeBytes: this.minFreeBytes, keepFreeBytes: this.keepFreeBytes } = storageThresholds(config, this.totalBytes));
  }

  /** Bytes available to the supervisor now (refreshed). */
  freeBytes(): number {
    const s = this.statfs(this.dir);
    this.free = s.bavail * s.bsize;
    this.checkedAt = performance.now();
    this.writtenSinceCheck = this.pendingBytes; // taken, not yet in the file system's count
    return this.free;
  }

  /** Called when a write finds free space below keepFreeBytes (the supervisor runs retention). */
  onBelowKeepFree: (() => void) | null = null;

  /**
   * Whether `bytes` more may be stored and still leave the reserve. Free space is checked at most every
   * CHECK_BYTES written or CHECK_MS elapsed on the write path; bytes taken but still waiting in write
   * buffers (chunks.ts) count as used, statfs not having seen them yet.
   */
  mayWrite(bytes: number): boolean {
    this.writtenSinceCheck += bytes;
    if (this.writtenSinceCheck >= CHECK_BYTES || performance.now() - this.checkedAt >= CHECK_MS) {
      this.freeBytes();
      // Retention steps in while the stream still stores, before the reserve is reached.
      if (this.free < this.keepFreeBytes) this.onBelowKeepFree?.();
    }
    if (this.free - this.writtenSinceCheck < this.reserveBytes) return false;
    this.pendingBytes += bytes;
    return true;
  }

  /** bytes that mayWrite let through were written or dropped: statfs counts the written from now on. */
  settled(bytes: number): void {
    this.pendingBytes = Math.max(0, this.pendingBytes - bytes);
  }

  /** Whether a new session may be admitted (free space at or above minFreeBytes). */
  admits(): boolean {
    return this.freeBytes() >= this.minFreeBytes;
  }
}
