// The on-disk log of one stream (docs/STATE.md): append-only chunk files named by their
// start cursor, rolled every chunkBytes, holding the bytes exactly as read; and an index of
// every read (stream, cursor, length, arrival time). Owns writing them; not reading
// them back (ipc/stream-files.ts), nor the pipe (session/drain.ts). Once a write fails (ENOSPC, EIO) the stream stores nothing more,
// so a stored log never has a gap; what could not be stored is counted, never invented.
import { close, closeSync, constants, fsync, fsyncSync, mkdirSync, openSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { createHash, type Hash } from 'node:crypto';
import type { ChunkDigest, StreamName } from '../../ipc/protocol.js';
import type { HashPool, StreamHasher } from './hasher.js';
import type { StorageGuard } from './storage.js';
import { chunkFileName, encodeIndexRecord, INDEX_FILE, INDEX_RECORD_BYTES } from '../../ipc/stream-files.js';
import { fsyncDir, writeAll } from './durable.js';

/** Rolled chunk files of one stream waiting for their fsync on the threadpool, at most. */
const MAX_BACKGROUND_FSYNCS = 4;

/** Longest time an index record waits in memory before it is written. */
const INDEX_FLUSH_MS = 100;

const O_APPEND_NEW = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_APPEND | constants.O_NOFOLLOW;

/**
 * Writer for one stream's chunk files and index, with the running SHA-256 of both: the
 * index's here, the stream's by the hashing thread (hasher.ts) reading the chunks back.
 */
export class StreamLog {
  /** Bytes stored: the stream's cursor. */
  cursor = 0;
  /** Bytes read from the pipe but not stored (past the quota, or after a failed write). */
  droppedBytes = 0;
  /**
   * Why storing stopped, if it did: the stream's quota; no space (ENOSPC, EDQUOT, EIO, or the
   * state dir's reserve reached); or another refusal. The drain goes on reading either way.
   */
  failure: 'quota' | 'disk_full' | 'io_error' | null = null;
  /** The index could not be written: no more records are attempted. */
  private indexFailed = false;
  /** Every chunk file closed so far (start cursor and length). */
  private readonly chunks: ChunkDigest[] = [];
  /** fsyncs of rolled chunk files, running on the libuv threadpool while the drain goes on. */
  private readonly syncing: Promise<void>[] = [];
  private fsyncsInFlight = 0;
  private chunkFd = -1;
  private chunkStart = 0;
  private readonly indexFd: number;
  /** Index records waiting to be written (4 KiB: 170 records); released by finalize(). */
  private indexBuf = Buffer.alloc(4096);
  private indexUsed = 0;
  private readonly hasher: StreamHasher;
  private readonly indexHash: Hash = createHash('sha256');
  readonly dir: string;

  /**
   * quotaBytes: the most this stream stores (SPEC "Cursors"); guard: the state dir's free
   * space (storage.ts), null to rely on ENOSPC alone.
   */
  constructor(
    sessionDir: string,
    readonly stream: StreamName,
    readonly chunkBytes: number,
    hashPool: HashPool,
    readonly quotaBytes = Number.MAX_SAFE_INTEGER,
    private readonly guard: StorageGuard | null = null,
  ) {
    this.dir = join(sessionDir, stream);
    mkdirSync(this.dir, { mode: 0o700 });
    this.indexFd = openSync(join(this.dir, INDEX_FILE), O_APPEND_NEW, 0o600);
    this.hasher = hashPool.stream(this.dir, chunkBytes);
  }

  /**
   * Stores one read's bytes (split across chunk files as needed) and indexes the read. What
   * cannot be stored (quota, reserve, a failed write) is counted in droppedBytes, and from
   * then on nothing more is stored: a stored log never has a gap.
   */
  append(data: Buffer, arrivalUs: number): void {
    if (this.failure) {
      this.droppedBytes += data.length;
      return;
    }
    let storable = Math.min(data.length, this.quotaBytes - this.cursor);
    if (storable > 0 && this.guard && !this.guard.mayWrite(storable)) {
      this.failure = 'disk_full';
      this.failureError = `free space in the state dir is below the reserve (${this.guard.reserveBytes} bytes)`;
      storable = 0;
    }
    const start = this.cursor;
    let off = 0;
    try {
      while (off < storable) {
        if (this.chunkFd < 0 || this.cursor - this.chunkStart >= this.chunkBytes) this.roll();
        const room = this.chunkBytes - (this.cursor - this.chunkStart);
        const n = writeSync(this.chunkFd, data, off, Math.min(room, storable - off));
        off += n;
        this.cursor += n;
      }
    } catch (err) {
      this.fail(err as NodeJS.ErrnoException);
    }
    if (off > 0) {
      this.index(start, off, arrivalUs);
      this.hasher.advance(this.cursor);
    }
    if (off < data.length) {
      if (!this.failure) {
        this.failure = 'quota';
        this.failureError = `the stream reached its quota of ${this.quotaBytes} bytes`;
      }
      this.droppedBytes += data.length - off;
    }
  }

  /** Flushes the index, fsyncs chunk and index files and the directory; returns the digests. */
  async finalize(): Promise<{ sha256: string; indexSha256: string; chunks: ChunkDigest[] }> {
    this.finalized = true;
    if (this.indexTimer) clearTimeout(this.indexTimer);
    this.flushIndex();
    this.closeChunk(true);
    await Promise.all(this.syncing);
    fsyncSync(this.indexFd);
    closeSync(this.indexFd);
    fsyncDir(this.dir);
    this.indexBuf = Buffer.alloc(0); // an ended session stays listed; its buffers need not
    return { sha256: await this.hasher.digest(this.cursor), indexSha256: this.indexHash.digest('hex'), chunks: this.chunks };
  }

  /** Storing stops for good; the reason says whether space ran out. */
  private fail(err: NodeJS.ErrnoException): void {
    this.failure = err.code === 'ENOSPC' || err.code === 'EDQUOT' || err.code === 'EIO' ? 'disk_full' : 'io_error';
    this.failureError = `${err.code ?? 'error'}: ${err.message}`;
  }

  /** What made storing stop, for the log. */
  failureError: string | null = null;

  /**
   * Closes the chunk being written. A rolled chunk is fsynced in the background (an fsync of
   * 2 GiB takes about 0.9 s here: done at the end it would add that to every large receipt);
   * the last one (final) here and now. A failed fsync stops storing, like a failed write.
   */
  private closeChunk(final = false): void {
    if (this.chunkFd < 0) return;
    const fd = this.chunkFd;
    this.chunkFd = -1;
    this.chunks.push({ start_cursor: this.chunkStart, length: this.cursor - this.chunkStart });
    // At most MAX_BACKGROUND_FSYNCS chunk fds wait for the threadpool; past that (small
    // chunkBytes, a fast stream) the fsync happens here, so fds never pile up.
    if (final || this.fsyncsInFlight >= MAX_BACKGROUND_FSYNCS) {
      fsyncSync(fd);
      closeSync(fd);
      return;
    }
    this.fsyncsInFlight++;
    this.syncing.push(
      new Promise((resolve) => {
        fsync(fd, (err) => {
          if (err && !this.failure) this.fail(err);
          close(fd, () => {
            this.fsyncsInFlight--;
            resolve();
          });
        });
      }),
    );
  }

  /** Opens the next chunk file; O_EXCL|O_NOFOLLOW: a planted file or link there is refused. */
  private roll(): void {
    this.closeChunk();
    this.chunkStart = this.cursor;
    this.chunkFd = openSync(join(this.dir, chunkFileName(this.chunkStart)), O_APPEND_NEW, 0o600);
  }

  private index(cursor: number, length: number, arrivalUs: number): void {
    if (this.indexUsed + INDEX_RECORD_BYTES > this.indexBuf.length) this.flushIndex();
    encodeIndexRecord(this.indexBuf, this.indexUsed, this.stream, cursor, length, arrivalUs);
    this.indexUsed += INDEX_RECORD_BYTES;
    // Records reach the file within INDEX_FLUSH_MS, so after a crash the index lags the
    // chunks by at most that much (it covers a prefix of the stream, never more).
    this.indexTimer ??= setTimeout(() => {
      this.indexTimer = null;
      if (!this.finalized) this.flushIndex();
    }, INDEX_FLUSH_MS).unref();
  }

  private indexTimer: NodeJS.Timeout | null = null;
  private finalized = false;

  private flushIndex(): void {
    if (this.indexUsed === 0 || this.indexFailed) {
      this.indexUsed = 0;
      return;
    }
    const records = this.indexBuf.subarray(0, this.indexUsed);
    try {
      writeAll(this.indexFd, records);
      this.indexHash.update(records);
    } catch (err) {
      this.indexFailed = true;
      if (!this.failure) this.fail(err as NodeJS.ErrnoException);
    }
    this.indexUsed = 0;
  }
}

