// The on-disk log of one stream (docs/STATE.md): append-only chunk files named by their
// start cursor, rolled every chunkBytes, holding the bytes exactly as read; and an index of
// every read (stream, cursor, length, arrival time). Owns writing and reading by cursor;
// not the pipe (drain.ts). Once a write fails (ENOSPC, EIO) the stream stores nothing more,
// so a stored log never has a gap; what could not be stored is counted, never invented.
import { closeSync, constants, fsyncSync, mkdirSync, openSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { createHash, type Hash } from 'node:crypto';
import type { ChunkDigest, StreamName } from '../ipc/protocol.js';
import { chunkFileName, encodeIndexRecord, INDEX_RECORD_BYTES } from '../ipc/state-layout.js';
import { fsyncDir, writeAll } from './durable.js';

/** Longest time an index record waits in memory before it is written. */
const INDEX_FLUSH_MS = 100;

const O_APPEND_NEW = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_APPEND | constants.O_NOFOLLOW;

/** Writer for one stream's chunk files and index, with the running SHA-256 of both. */
export class StreamLog {
  /** Bytes stored: the stream's cursor. */
  cursor = 0;
  /** Bytes read from the pipe but not stored (after a failed write). */
  droppedBytes = 0;
  /** Why storing stopped, if it did: no space (ENOSPC, EDQUOT, EIO), or another refusal. */
  failure: 'disk_full' | 'io_error' | null = null;
  /** Digest of every chunk file closed so far, and of the one being written. */
  private readonly chunks: ChunkDigest[] = [];
  private chunkHash: Hash | null = null;
  private chunkFd = -1;
  private chunkStart = 0;
  private readonly indexFd: number;
  private readonly indexBuf = Buffer.alloc(64 * 1024);
  private indexUsed = 0;
  private readonly hash: Hash = createHash('sha256');
  private readonly indexHash: Hash = createHash('sha256');
  readonly dir: string;

  constructor(sessionDir: string, readonly stream: StreamName, readonly chunkBytes: number) {
    this.dir = join(sessionDir, stream);
    mkdirSync(this.dir, { mode: 0o700 });
    this.indexFd = openSync(join(this.dir, 'index.bin'), O_APPEND_NEW, 0o600);
  }

  /** Stores one read's bytes (split across chunk files as needed) and indexes the read. */
  append(data: Buffer, arrivalUs: number): void {
    if (this.failure) {
      this.droppedBytes += data.length;
      return;
    }
    const start = this.cursor;
    let off = 0;
    try {
      while (off < data.length) {
        if (this.chunkFd < 0 || this.cursor - this.chunkStart >= this.chunkBytes) this.roll();
        const room = this.chunkBytes - (this.cursor - this.chunkStart);
        const n = writeSync(this.chunkFd, data, off, Math.min(room, data.length - off));
        this.chunkHash!.update(data.subarray(off, off + n));
        off += n;
        this.cursor += n;
      }
    } catch (err) {
      this.fail(err as NodeJS.ErrnoException);
      this.droppedBytes += data.length - off;
    }
    if (off > 0) {
      this.hash.update(off === data.length ? data : data.subarray(0, off));
      this.index(start, off, arrivalUs);
    }
  }

  /** Flushes the index, fsyncs chunk and index files and the directory; returns the digests. */
  finalize(): { sha256: string; indexSha256: string; chunks: ChunkDigest[] } {
    this.finalized = true;
    if (this.indexTimer) clearTimeout(this.indexTimer);
    this.flushIndex();
    this.closeChunk();
    fsyncSync(this.indexFd);
    closeSync(this.indexFd);
    fsyncDir(this.dir);
    return { sha256: this.hash.digest('hex'), indexSha256: this.indexHash.digest('hex'), chunks: this.chunks };
  }

  /** Storing stops for good; the reason says whether space ran out. */
  private fail(err: NodeJS.ErrnoException): void {
    this.failure = err.code === 'ENOSPC' || err.code === 'EDQUOT' || err.code === 'EIO' ? 'disk_full' : 'io_error';
    this.failureError = `${err.code ?? 'error'}: ${err.message}`;
  }

  /** What made storing stop, for the log. */
  failureError: string | null = null;

  private closeChunk(): void {
    if (this.chunkFd < 0) return;
    fsyncSync(this.chunkFd);
    closeSync(this.chunkFd);
    this.chunkFd = -1;
    this.chunks.push({ start_cursor: this.chunkStart, length: this.cursor - this.chunkStart, sha256: this.chunkHash!.digest('hex') });
    this.chunkHash = null;
  }

  /** Opens the next chunk file; O_EXCL|O_NOFOLLOW: a planted file or link there is refused. */
  private roll(): void {
    this.closeChunk();
    this.chunkStart = this.cursor;
    this.chunkFd = openSync(join(this.dir, chunkFileName(this.chunkStart)), O_APPEND_NEW, 0o600);
    this.chunkHash = createHash('sha256');
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
    if (this.indexUsed === 0 || this.failure) {
      this.indexUsed = 0;
      return;
    }
    const records = this.indexBuf.subarray(0, this.indexUsed);
    try {
      writeAll(this.indexFd, records);
      this.indexHash.update(records);
    } catch (err) {
      this.fail(err as NodeJS.ErrnoException);
    }
    this.indexUsed = 0;
  }
}

