// Space on the file system that holds the state dir (statfs(2), f_bavail * f_bsize): chunk
// writes stop while less than reserveBytes is free, so index records and receipts can still
// be written; launches are refused (ADMISSION_DENIED, retryable) while less than
// minFreeBytes is free. Checked at most every CHECK_BYTES written or CHECK_MS elapsed.
import { statfsSync } from 'node:fs';

const CHECK_BYTES = 1 << 20;
const CHECK_MS = 100;

export class StorageGuard {
  private free = Infinity;
  private checkedAt = 0;
  private writtenSinceCheck = 0;

  constructor(
    readonly dir: string,
    readonly reserveBytes: number,
    readonly minFreeBytes: number,
    private readonly statfs: (dir: string) => { bavail: number; bsize: number } = statfsSync,
  ) {}

  /** Bytes available to the supervisor now (refreshed). */
  freeBytes(): number {
    const s = this.statfs(this.dir);
    this.free = s.bavail * s.bsize;
    this.checkedAt = Date.now();
    this.writtenSinceCheck = 0;
    return this.free;
  }

  /** Whether `bytes` more may be stored and still leave the reserve. */
  mayWrite(bytes: number): boolean {
    this.writtenSinceCheck += bytes;
    if (this.writtenSinceCheck >= CHECK_BYTES || Date.now() - this.checkedAt >= CHECK_MS) this.freeBytes();
    return this.free - this.writtenSinceCheck >= this.reserveBytes;
  }

  /** Whether a new session may be admitted (free space at or above minFreeBytes). */
  admits(): boolean {
    return this.freeBytes() >= this.minFreeBytes;
  }
}
