// The on-disk log of one stream (docs/reference/state-dir.md): append-only chunk files named by their start
// cursor, rolled every chunkBytes, holding the bytes exactly as read; and an index of every read (stream,
// cursor, length, arrival time). Owns writing them; not reading them back (core/state/stream-files.ts), nor
// the pipe (session/drain.ts). Once a write fails (ENOSPC, EIO) the stream stores nothing more, so a stored
// log never has a gap; what could not be stored is counted, never invented.
import { close, closeSync, constants, fsync, fsyncSync, mkdirSync, openSync, write, writeSync } from 'node:fs';
import { join } from 'node:path';
import { createHash, type Hash } from 'node:crypto';
import type { ChunkDigest, StreamName } from '../../ipc/protocol.js';
import type { HashPool, StreamHasher } from './hasher.js';
import type { StorageGuard } from './storage.js';
import { encodeIndexRecord, INDEX_RECORD_BYTES } from '../../core/state/stream-files.js';
import { chunkFileName, INDEX_FILE } from '../../core/state/names.js';
import { writeAll } from '../../core/fs/durable.js';
import { STREAM_WRITE_BUFFERS, WRITE_BUFFER_BYTES, writeBuffers } from './write-buffers.js';
import { native } from '../../core/fs/native.js';
import { systemError } from '../../ipc/errno.js';

/** fsync(2) of fd on the threadpool. */
function fsyncAsync(fd: number): Promise<void> {
  return new Promise((resolve, reject) => fsync(fd, (err) => (err ? reject(err) : resolve())));
}

/**
 * The arrival clock of index records: microseconds since the Unix epoch, from the monotonic
 * clock (performance.timeOrigin + now(), so never backwards within one supervisor). Records of
 * one stream are stamped in read order with it; a later call is never earlier than a record
 * already taken.
 */
export function arrivalNowUs(): number {
  return Math.round((performance.timeOrigin + performance.now()) * 1000);
}

/** Rolled chunk files of one stream waiting for their fsync on the threadpool, at most. */
const MAX_BACKGROUND_FSYNCS = 4;

/** Longest time an index record waits in memory before it is written (once its bytes are). */
const INDEX_FLUSH_MS = 100;

/** Index records written at once when reads come fast (4 KiB of records). */
const INDEX_BATCH_RECORDS = 170;

/**
 * Reads one stream takes while earlier bytes wait for their write, at most: a record is held
 * in memory until its bytes are written, and 4 MiB of 1-byte reads would be 4 million of them
 * (about 80 bytes of heap each); 4096 of them are about 330 KiB.
 */
const MAX_WAITING_RECORDS = 4096;
/** A write of fewer bytes than this waits for the rest of the event loop's turn (see StreamLog.pump). */
const COALESCE_BYTES = 256 * 1024;

const O_APPEND_NEW = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_APPEND | constants.O_NOFOLLOW;

/** A write buffer of this stream: bytes [written, used) still to be written. */
interface Held {
  buf: Buffer;
  used: number;
  written: number;
  /** From the pool (shared memory, given back once written and hashed); false: a private copy of one read. */
  pooled: boolean;
  /** Written ranges of it the hashing thread still reads. */
  hashing: number;
  /** No more is written from it (all written, or storing stopped): given back once not hashing. */
  done: boolean;
}

/** One read, indexed: stream cursor, length, arrival time (µs since the epoch). */
export interface ReadRecord {
  cursor: number;
  length: number;
  arrivalUs: number;
}

/**
 * Writer for one stream's chunk files and index, with the running SHA-256 of both: the
 * index's here, the stream's by the hashing thread (hasher.ts) reading the chunks back.
 * A read's bytes are copied into a write buffer (write-buffers.ts) and written by libuv's
 * threadpool, one write at a time per stream, in order, so the event loop never waits for the
 * page cache; the cursor moves when a write returns.
 */
export class StreamLog {
  /** Bytes in chunk files: the stream's cursor (readers read up to it). */
  cursor = 0;
  /** Bytes taken to be stored: the cursor plus those waiting in write buffers. */
  private accepted = 0;
  /** Bytes read from the pipe but not stored (past the quota, or after a failed write). */
  droppedBytes = 0;
  /**
   * Why storing stopped, if it did: the stream's quota; no space (ENOSPC, EDQUOT, EIO, or the
   * state dir's reserve reached); or another refusal. The drain goes on reading either way.
   */
  failure: 'quota' | 'disk_full' | 'io_error' | null = null;
  /** Called with the new cursor after each write that moved it. */
  onAdvance: ((cursor: number) => void) | null = null;
  /** Called once there is room again after append() said there was none. */
  onRoom: (() => void) | null = null;
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
  /** Write buffers holding bytes not yet written, in stream order; the last one fills. */
  private readonly held: Held[] = [];
  /** A write of held[0] is on the threadpool. */
  private writing = false;
  /** A write, fsync or open failed (fail()): nothing more is written; waiting bytes are dropped. */
  private writeStopped = false;
  private wantsRoom = false;
  /** A pump waits for this event-loop turn's reads (see pump). */
  private pumpDeferred = false;
  /** A check that the buffer still filling got no bytes this turn is scheduled (releaseWhenQuiet). */
  private releaseScheduled = false;
  /** Pool buffers this stream holds (filling, waiting, written but still hashed): STREAM_WRITE_BUFFERS at most. */
  private pooledOut = 0;
  private idleWaiters: (() => void)[] = [];
  /** Index records not yet in the file: written once the chunks hold their bytes. */
  private records: ReadRecord[] = [];
  private readonly hasher: StreamHasher;
  private readonly indexHash: Hash = createHash('sha256');
  readonly dir: string;

  /**
   * quotaBytes: the most this stream stores (docs/reference/contract.md "Cursors"); guard: the state dir's free
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
   * Takes one read's bytes to store (split across chunk files as needed) and indexes the
   * read. What cannot be stored (quota, reserve, a failed write) is counted in droppedBytes,
   * and from then on nothing more is stored: a stored log never has a gap. Returns false when
   * the next read should wait (this stream's write buffers are full: the disk is behind);
   * onRoom is called when it may go on.
   */
  append(data: Buffer, arrivalUs: number): boolean {
    if (this.failure) {
      this.droppedBytes += data.length;
      return true;
    }
    let storable = Math.min(data.length, this.quotaBytes - this.accepted);
    if (storable > 0 && this.guard && !this.guard.mayWrite(storable)) {
      this.failure = 'disk_full';
      this.failureError = `free space in the state dir is below the reserve (${this.guard.reserveBytes} bytes)`;
      storable = 0;
    }
    if (storable > 0) {
      this.index(this.accepted, storable, arrivalUs);
      this.accepted += storable;
      this.place(data, storable);
    }
    if (storable < data.length) {
      if (!this.failure) {
        this.failure = 'quota';
        this.failureError = `the stream reached its quota of ${this.quotaBytes} bytes`;
      }
      this.droppedBytes += data.length - storable;
    }
    if (this.hasRoom()) return true;
    this.wantsRoom = true;
    return false;
  }

  /**
   * Index records still in memory (not yet in index.bin) whose bytes are all in the chunk
   * files, from the one ending past cursor `from`, at most limit; they follow index.bin's
   * records directly (the file gets a prefix of them). With `unstoredAtUs`: the arrival of the
   * first record whose bytes are not all stored yet (null: none), so a reader knows which reads
   * it has not been told of. Synchronous: read with the file in one turn, the two agree.
   */
  pendingRecords(from: number, limit: number): { records: ReadRecord[]; unstoredAtUs: number | null } {
    const records: ReadRecord[] = [];
    let unstoredAtUs: number | null = null;
    for (const r of this.records) {
      if (r.cursor + r.length > this.cursor) {
        unstoredAtUs = r.arrivalUs;
        break;
      }
      if (r.cursor + r.length > from && records.length < limit) records.push(r);
    }
    return { records, unstoredAtUs };
  }

  /** Resolves once every byte taken is written to a chunk file, or dropped. */
  idle(): Promise<void> {
    if (this.accepted === this.cursor) return Promise.resolve();
    const idle = new Promise<void>((resolve) => this.idleWaiters.push(resolve));
    this.pump(true); // what waits for more reads goes now
    return idle;
  }

  /**
   * Flushes the index, fsyncs chunk and index files and the directory, all at once on the
   * threadpool (ext4 serves concurrent fsyncs with one journal commit), asks the stream's digest
   * meanwhile, and returns the digests; rejects with the first fsync's error.
   */
  async finalize(): Promise<{ sha256: string; indexSha256: string; chunks: ChunkDigest[] }> {
    this.finalized = true;
    await this.idle();
    this.releaseFilling();
    if (this.indexTimer) clearTimeout(this.indexTimer);
    this.flushIndex();
    const last = this.chunkFd;
    if (last >= 0) {
      this.chunkFd = -1;
      this.chunks.push({ start_cursor: this.chunkStart, length: this.cursor - this.chunkStart });
    }
    // The hashing thread's answer while the fsyncs run (every byte is written already: a
    // replacement thread reads the chunk files back). Awaited after them.
    const digest = this.hasher.digest(this.cursor);
    digest.catch(() => {});
    const dirFd = openSync(this.dir, constants.O_RDONLY | constants.O_DIRECTORY);
    const synced = await Promise.allSettled([...this.syncing, ...[last, this.indexFd, dirFd].filter((fd) => fd >= 0).map(fsyncAsync)]);
    for (const fd of [last, this.indexFd, dirFd]) if (fd >= 0) closeSync(fd);
    const failed = synced.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
    this.records = []; // an ended session stays listed; its buffers need not
    return { sha256: await digest, indexSha256: this.indexHash.digest('hex'), chunks: this.chunks };
  }

  /**
   * Copies data[0, n) into this stream's write buffers and starts a write. Without a buffer
   * (the pool or this stream's share used up): written here and now if nothing of this
   * stream waits (the order is kept); else one private copy, and append() says to wait.
   */
  private place(data: Buffer, n: number): void {
    let off = 0;
    while (off < n) {
      let h = this.held[this.held.length - 1];
      if (!h || h.used === h.buf.length) {
        const buf = this.pooledOut < STREAM_WRITE_BUFFERS ? writeBuffers.take() : null;
        if (buf) {
          this.pooledOut++;
          h = { buf, used: 0, written: 0, pooled: true, hashing: 0, done: false };
        } else if (this.held.length === 0) return this.storeNow(data.subarray(off, n));
        else h = { buf: Buffer.allocUnsafeSlow(n - off), used: 0, written: 0, pooled: false, hashing: 0, done: false };
        this.held.push(h);
      }
      const k = Math.min(n - off, h.buf.length - h.used);
      data.copy(h.buf, h.used, off, off + k);
      h.used += k;
      off += k;
    }
    this.pump();
  }

  /**
   * Whether a read of up to WRITE_BUFFER_BYTES fits in this stream's write buffers now, and
   * its record with the others waiting. Nothing waiting to be written: always (what the
   * buffers cannot take then is one private copy, written next).
   */
  private hasRoom(): boolean {
    if (this.accepted === this.cursor || this.failure) return true;
    if (this.records.length >= MAX_WAITING_RECORDS) return false;
    const last = this.held[this.held.length - 1]!;
    if (last.pooled && last.buf.length - last.used >= WRITE_BUFFER_BYTES) return true;
    return this.pooledOut < STREAM_WRITE_BUFFERS && writeBuffers.available();
  }

  /** Writes bytes with writeSync, here and now (nothing of this stream waits to be written). */
  private storeNow(bytes: Buffer): void {
    let off = 0;
    try {
      while (off < bytes.length) {
        if (this.chunkFd < 0 || this.cursor - this.chunkStart >= this.chunkBytes) this.roll();
        const room = this.chunkBytes - (this.cursor - this.chunkStart);
        const n = writeSync(this.chunkFd, bytes, off, Math.min(room, bytes.length - off));
        off += n;
        this.cursor += n;
      }
    } catch (err) {
      this.fail(systemError(err));
    }
    this.guard?.settled(off);
    if (off > 0) {
      this.hasher.advance(this.cursor); // read back by the hashing thread
      this.advanced();
    }
    this.pump(); // after a failure: what is left of this read is dropped
  }

  /**
   * Starts the write of held[0]'s next bytes on the threadpool, unless one runs. Fewer than
   * COALESCE_BYTES in the buffer still filling wait for the reads of this event-loop turn
   * (setImmediate: after libuv's poll phase), unless `now` or something waits for idle():
   * a producer writing 4 KiB at a time made one write(2) and one hashing message per 4 KiB
   * (2 GiB: 5.3 s of system time in write alone).
   */
  private pump(now = false): void {
    if (this.writing) return;
    if (this.writeStopped) {
      if (this.accepted > this.cursor) this.abandon();
      return;
    }
    const h = this.held[0];
    if (!h || h.written === h.used) return; // (the buffer filling, every byte of it written)
    if (!now && this.held.length === 1 && h.used < h.buf.length && h.used - h.written < COALESCE_BYTES && this.idleWaiters.length === 0) {
      if (!this.pumpDeferred) {
        this.pumpDeferred = true;
        setImmediate(() => {
          this.pumpDeferred = false;
          this.pump(true);
        });
      }
      return;
    }
    try {
      if (this.chunkFd < 0 || this.cursor - this.chunkStart >= this.chunkBytes) this.roll();
    } catch (err) {
      this.fail(systemError(err));
      return this.pump();
    }
    const len = Math.min(h.used - h.written, this.chunkBytes - (this.cursor - this.chunkStart));
    this.writing = true;
    write(this.chunkFd, h.buf, h.written, len, null, (err, n) => this.wrote(h, err, n));
  }

  /** A write of h returned: the cursor moves by n, or storing stops (err). */
  private wrote(h: Held, err: NodeJS.ErrnoException | null, n: number): void {
    this.writing = false;
    if (err) {
      this.fail(err);
      return this.pump();
    }
    const at = this.cursor;
    h.written += n;
    this.cursor += n;
    this.guard?.settled(n);
    if (h.written === h.used) {
      if (h.used === h.buf.length || !h.pooled) {
        this.held.shift(); // it fills no more
        h.done = true;
      } else this.releaseWhenQuiet();
    }
    if (h.pooled) {
      h.hashing++;
      this.hasher.update(at, h.buf.buffer as SharedArrayBuffer, h.buf.byteOffset + h.written - n, n, () => {
        h.hashing--;
        if (h.hashing === 0 && h.done) this.giveBack(h);
      });
    } else this.hasher.advance(this.cursor);
    // Records of the bytes just written leave memory now if many wait (hasRoom counts them).
    if (this.records.length >= INDEX_BATCH_RECORDS) this.flushIndex();
    this.advanced();
    this.pump();
    this.afterRelease();
  }

  /**
   * The buffer still filling, every byte of it written, goes on taking the next reads (a
   * turn's few KiB each, written together: see pump), unless a whole event-loop turn brings
   * none: then it goes back to the pool (a quiet stream holds no buffer). Before: each write
   * retired its buffer, so 4 KiB writes used up a stream's 4 buffers in 16 KiB and the rest
   * went through writeSync on the event loop.
   */
  private releaseWhenQuiet(): void {
    if (this.releaseScheduled) return;
    this.releaseScheduled = true;
    setImmediate(() => {
      this.releaseScheduled = false;
      const h = this.held[0];
      if (this.held.length === 1 && h && h.written === h.used && !this.writing) this.releaseFilling();
    });
  }

  /** Gives back the buffer still filling once every byte of it is written (at the end, or when quiet). */
  private releaseFilling(): void {
    const h = this.held[0];
    if (this.held.length !== 1 || !h || h.written !== h.used) return;
    this.held.shift();
    h.done = true;
    if (h.pooled && h.hashing === 0) this.giveBack(h);
  }

  /** The cursor moved: the hasher, the index timer and the listeners hear of it. */
  private advanced(): void {
    if (this.records.length) this.armIndexTimer();
    this.onAdvance?.(this.cursor);
  }

  /** A pool buffer read by no one any more goes back; the drain may go on if it waited. */
  private giveBack(h: Held, wake = true): void {
    writeBuffers.give(h.buf);
    this.pooledOut--;
    if (wake) this.afterRelease();
  }

  /** After buffers were freed: wake the drain if it waits for room, and idle() waiters. */
  private afterRelease(): void {
    if (this.wantsRoom && this.hasRoom()) {
      this.wantsRoom = false;
      this.onRoom?.();
    }
    if (this.accepted === this.cursor) for (const resolve of this.idleWaiters.splice(0)) resolve();
  }

  /**
   * Writing stopped (fail()): what waits in buffers is dropped, never claimed; the index
   * keeps only records of stored bytes. Never called while a write runs.
   */
  private abandon(): void {
    this.guard?.settled(this.accepted - this.cursor);
    this.droppedBytes += this.accepted - this.cursor;
    this.accepted = this.cursor;
    for (const h of this.held.splice(0)) {
      h.done = true;
      if (h.pooled && h.hashing === 0) this.giveBack(h, false);
    }
    // (one still read by the hashing thread is given back when it is done: see wrote())
    this.records = this.records.filter((r) => r.cursor < this.cursor).map((r) => ({ ...r, length: Math.min(r.length, this.cursor - r.cursor) }));
    this.afterRelease();
  }

  /** Storing stops for good; the reason says whether space ran out. */
  private fail(err: NodeJS.ErrnoException): void {
    this.writeStopped = true;
    this.failure = err.code === 'ENOSPC' || err.code === 'EDQUOT' || err.code === 'EIO' ? 'disk_full' : 'io_error';
    this.failureError = `${err.code ?? 'error'}: ${err.message}`;
  }

  /** What made storing stop, for the log. */
  failureError: string | null = null;

  /**
   * Closes a rolled chunk: fsynced in the background (an fsync of 2 GiB takes about 0.9 s
   * here: done at the end it would add that to every large receipt); the last one is
   * finalize()'s. A failed fsync stops storing, like a failed write.
   */
  private closeChunk(): void {
    if (this.chunkFd < 0) return;
    const fd = this.chunkFd;
    this.chunkFd = -1;
    this.chunks.push({ start_cursor: this.chunkStart, length: this.cursor - this.chunkStart });
    // At most MAX_BACKGROUND_FSYNCS chunk fds wait for the threadpool; past that (small
    // chunkBytes, a fast stream) the fsync happens here, so fds never pile up.
    if (this.fsyncsInFlight >= MAX_BACKGROUND_FSYNCS) {
      fsyncSync(fd);
      closeSync(fd);
      return;
    }
    // Writeback started here, then the fsync on the threadpool. Measured (8 streams of 256 MiB,
    // 64 MiB chunks, a C reader doing the same, median of 5): fsync alone 1.8 s, with the
    // writeback started first 1.0 s, cat > f without any fsync 0.69 s. Starting it more
    // often (every 8 MiB) made the supervisor slower (3.5 s against 2.0 s for one 2 GiB stream).
    this.startWriteback(fd);
    this.fsyncsInFlight++;
    this.syncing.push(
      new Promise((resolve) => {
        fsync(fd, (err) => {
          if (err && !this.failure) {
            this.fail(err);
            this.pump();
          }
          close(fd, () => {
            this.fsyncsInFlight--;
            resolve();
          });
        });
      }),
    );
  }

  /** Starts the writeback of fd's dirty pages; a failure is the fsync's to report. */
  private startWriteback(fd: number): void {
    try {
      native().startWriteback(fd);
    } catch (err) {
      // EIO and the like come back from the fsync that follows, which stops storing
      if (typeof systemError(err).errno !== 'number') throw err;
    }
  }

  /** Opens the next chunk file; O_EXCL|O_NOFOLLOW: a planted file or link there is refused. */
  private roll(): void {
    this.closeChunk();
    this.chunkStart = this.cursor;
    this.chunkFd = openSync(join(this.dir, chunkFileName(this.chunkStart)), O_APPEND_NEW, 0o600);
  }

  private index(cursor: number, length: number, arrivalUs: number): void {
    this.records.push({ cursor, length, arrivalUs });
    if (this.records.length >= INDEX_BATCH_RECORDS) this.flushIndex();
    this.armIndexTimer();
  }

  /**
   * Records reach the file within INDEX_FLUSH_MS of their bytes' write, so after a crash the
   * index lags the chunks by at most that much (it covers a prefix of the stream, never more).
   */
  private armIndexTimer(): void {
    this.indexTimer ??= setTimeout(() => {
      this.indexTimer = null;
      if (!this.finalized) this.flushIndex();
    }, INDEX_FLUSH_MS).unref();
  }

  private indexTimer: NodeJS.Timeout | null = null;
  private finalized = false;

  /** Writes the records whose bytes are in the chunk files (a prefix of them). */
  private flushIndex(): void {
    let k = 0;
    while (k < this.records.length && this.records[k]!.cursor + this.records[k]!.length <= this.cursor) k++;
    if (k === 0) return;
    const flushed = this.records.splice(0, k);
    if (this.indexFailed) return;
    const buf = Buffer.allocUnsafe(k * INDEX_RECORD_BYTES);
    flushed.forEach((r, i) => encodeIndexRecord(buf, i * INDEX_RECORD_BYTES, this.stream, r.cursor, r.length, r.arrivalUs));
    try {
      writeAll(this.indexFd, buf);
      this.indexHash.update(buf);
    } catch (err) {
      this.indexFailed = true;
      if (!this.failure) this.fail(systemError(err));
    }
  }
}
