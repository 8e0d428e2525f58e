// The on-disk log of one stream (docs/STATE.md): append-only chunk files named by their
// start cursor, rolled every chunkBytes, holding the bytes exactly as read; and an index of
// every read (stream, cursor, length, arrival time). Owns writing and reading by cursor;
// not the pipe (drain.ts). Once a write fails (ENOSPC, EIO) the stream stores nothing more,
// so a stored log never has a gap; what could not be stored is counted, never invented.
import { closeSync, constants, fsyncSync, mkdirSync, openSync, readSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { createHash, type Hash } from 'node:crypto';
import type { StreamName } from '../ipc/protocol.js';
import { fsyncDir } from './durable.js';

export const STREAM_IDS: Record<StreamName, number> = { stdout: 0, stderr: 1, pty: 2 };
/** Bytes per index record: u8 stream, 3 reserved, u32 length, u64 cursor, u64 arrival µs (LE). */
export const INDEX_RECORD_BYTES = 24;

/** File name of the chunk that starts at cursor: 16 hex digits. */
export function chunkFileName(startCursor: number): string {
  return `${startCursor.toString(16).padStart(16, '0')}.chunk`;
}

/** Encodes one index record. */
export function encodeIndexRecord(out: Buffer, offset: number, stream: StreamName, cursor: number, length: number, arrivalUs: number): void {
  out.writeUInt8(STREAM_IDS[stream], offset);
  out.writeUIntLE(0, offset + 1, 3);
  out.writeUInt32LE(length, offset + 4);
  out.writeUInt32LE(cursor % 2 ** 32, offset + 8);
  out.writeUInt32LE(Math.floor(cursor / 2 ** 32), offset + 12);
  out.writeUInt32LE(arrivalUs % 2 ** 32, offset + 16);
  out.writeUInt32LE(Math.floor(arrivalUs / 2 ** 32), offset + 20);
}

export interface IndexRecord {
  stream: number;
  length: number;
  cursor: number;
  arrivalUs: number;
}

/** Decodes every whole record in an index file's bytes. */
export function decodeIndex(buf: Buffer): IndexRecord[] {
  const out: IndexRecord[] = [];
  for (let off = 0; off + INDEX_RECORD_BYTES <= buf.length; off += INDEX_RECORD_BYTES) {
    out.push({
      stream: buf.readUInt8(off),
      length: buf.readUInt32LE(off + 4),
      cursor: buf.readUInt32LE(off + 8) + buf.readUInt32LE(off + 12) * 2 ** 32,
      arrivalUs: buf.readUInt32LE(off + 16) + buf.readUInt32LE(off + 20) * 2 ** 32,
    });
  }
  return out;
}

const O_APPEND_NEW = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_APPEND | constants.O_NOFOLLOW;

/** Writer for one stream's chunk files and index, with the running SHA-256 of both. */
export class StreamLog {
  /** Bytes stored: the stream's cursor. */
  cursor = 0;
  /** Bytes read from the pipe but not stored (after a failed write). */
  droppedBytes = 0;
  /** Why storing stopped, if it did. */
  failure: 'disk_full' | null = null;
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
        off += n;
        this.cursor += n;
      }
    } catch {
      this.failure = 'disk_full';
      this.droppedBytes += data.length - off;
    }
    if (off > 0) {
      this.hash.update(off === data.length ? data : data.subarray(0, off));
      this.index(start, off, arrivalUs);
    }
  }

  /** Flushes the index, fsyncs chunk and index files and the directory; returns the digests. */
  finalize(): { sha256: string; indexSha256: string } {
    this.flushIndex();
    if (this.chunkFd >= 0) {
      fsyncSync(this.chunkFd);
      closeSync(this.chunkFd);
      this.chunkFd = -1;
    }
    fsyncSync(this.indexFd);
    closeSync(this.indexFd);
    fsyncDir(this.dir);
    return { sha256: this.hash.digest('hex'), indexSha256: this.indexHash.digest('hex') };
  }

  private roll(): void {
    if (this.chunkFd >= 0) {
      fsyncSync(this.chunkFd);
      closeSync(this.chunkFd);
    }
    this.chunkStart = this.cursor;
    this.chunkFd = openSync(join(this.dir, chunkFileName(this.chunkStart)), O_APPEND_NEW, 0o600);
  }

  private index(cursor: number, length: number, arrivalUs: number): void {
    if (this.indexUsed + INDEX_RECORD_BYTES > this.indexBuf.length) this.flushIndex();
    encodeIndexRecord(this.indexBuf, this.indexUsed, this.stream, cursor, length, arrivalUs);
    this.indexUsed += INDEX_RECORD_BYTES;
  }

  private flushIndex(): void {
    if (this.indexUsed === 0 || this.failure) {
      this.indexUsed = 0;
      return;
    }
    const records = this.indexBuf.subarray(0, this.indexUsed);
    try {
      let off = 0;
      while (off < records.length) off += writeSync(this.indexFd, records, off, records.length - off);
      this.indexHash.update(records);
    } catch {
      this.failure = 'disk_full';
    }
    this.indexUsed = 0;
  }
}

/**
 * Reads up to maxBytes of a stream's stored bytes from cursor `from` (never past `end`,
 * the stored cursor, nor past one chunk). Returns an empty Buffer at the end.
 */
export function readStored(streamDir: string, chunkBytes: number, from: number, end: number, maxBytes: number): Buffer {
  if (from >= end) return Buffer.alloc(0);
  const chunkStart = from - (from % chunkBytes);
  const length = Math.min(maxBytes, end - from, chunkStart + chunkBytes - from);
  const fd = openSync(join(streamDir, chunkFileName(chunkStart)), constants.O_RDONLY | constants.O_NOFOLLOW);
  try {
    const buf = Buffer.allocUnsafe(length);
    let got = 0;
    while (got < length) {
      const n = readSync(fd, buf, got, length - got, from - chunkStart + got);
      if (n === 0) break;
      got += n;
    }
    return buf.subarray(0, got);
  } finally {
    closeSync(fd);
  }
}
