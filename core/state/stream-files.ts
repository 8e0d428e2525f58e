// A stream's files in its stream dir (docs/reference/state-dir.md "Chunk files", "index.bin"): the
// 24-byte index record, and the one chunk reader that the hashing threads, replay
// and verify all read stored bytes with. No schemas (no zod): the hashing threads load this
// and nothing heavier. Reads only; writing is supervisor/store/chunks.ts. See open(2)
// O_NOFOLLOW, pread(2).
import { createHash } from 'node:crypto';
import { closeSync, constants, existsSync, fstatSync, lstatSync, openSync, readFileSync, readSync } from 'node:fs';
import { join } from 'node:path';
import type { ChunkDigest, StreamName, StreamOutput } from '../../ipc/protocol.js';
import { chunkFileName, INDEX_FILE } from './names.js';
import { errnoCode } from '../../ipc/errno.js';

// --- Index records.

export const STREAM_IDS: Record<StreamName, number> = { stdout: 0, stderr: 1, pty: 2 };
/** Bytes per index record: u8 stream, 3 reserved, u32 length, u64 cursor, u64 arrival µs (LE). */
export const INDEX_RECORD_BYTES = 24;

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

/**
 * Up to `limit` whole records of a stream's index.bin from the one holding cursor `from`
 * (the first whose bytes end past it), in cursor order, read where they lie: records tile the
 * stream, so the first is found by binary search (pread(2) of 24-byte records). A missing
 * index is empty; a torn last record (a crash mid-write) is not read. O_NOFOLLOW.
 */
export function readIndexFrom(streamDir: string, from: number, limit: number): IndexRecord[] {
  let fd: number;
  try {
    fd = openSync(join(streamDir, INDEX_FILE), constants.O_RDONLY | constants.O_NOFOLLOW);
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return [];
    throw err;
  }
  try {
    const count = Math.floor(fstatSync(fd).size / INDEX_RECORD_BYTES);
    const one = Buffer.alloc(INDEX_RECORD_BYTES);
    const at = (i: number): IndexRecord => {
      readFully(fd, one, i * INDEX_RECORD_BYTES);
      return decodeIndex(one)[0]!;
    };
    let lo = 0;
    let hi = count; // the first record ending past `from` is in [lo, hi]
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      const r = at(mid);
      if (r.cursor + r.length > from) hi = mid;
      else lo = mid + 1;
    }
    const n = Math.min(limit, count - lo);
    if (n <= 0) return [];
    const buf = Buffer.alloc(n * INDEX_RECORD_BYTES);
    readFully(fd, buf, lo * INDEX_RECORD_BYTES);
    return decodeIndex(buf);
  } finally {
    closeSync(fd);
  }
}

/** pread(2) until buf is full; throws when the file ends first. */
function readFully(fd: number, buf: Buffer, position: number): void {
  for (let got = 0; got < buf.length;) {
    const n = readSync(fd, buf, got, buf.length - got, position + got);
    if (n === 0) throw new Error(`index ends at ${position + got}, before ${position + buf.length}`);
    got += n;
  }
}

/**
 * The one reader of a stream's stored bytes by cursor: cursor c is chunk c - c % chunkBytes
 * at offset c % chunkBytes. Keeps the chunk it last read open (sequential readers, the
 * hashing threads and replay, open each chunk once); O_NOFOLLOW: a planted link is refused.
 * close() when done.
 */
export class ChunkReader {
  private fd = -1;
  private fdStart = -1;

  constructor(
    readonly streamDir: string,
    readonly chunkBytes: number,
  ) {}

  /**
   * Reads bytes from cursor `from` into buf at offset: at most maxBytes, never past `end` nor
   * past the end of from's chunk; returns how many (0 at `end`). Throws when the chunk is
   * missing (ENOENT) or shorter than what is asked of it.
   */
  readInto(from: number, end: number, buf: Buffer, offset: number, maxBytes: number): number {
    if (from >= end) return 0;
    const start = from - (from % this.chunkBytes);
    const length = Math.min(maxBytes, end - from, start + this.chunkBytes - from);
    if (this.fd < 0 || this.fdStart !== start) {
      this.close();
      this.fd = openSync(join(this.streamDir, chunkFileName(start)), constants.O_RDONLY | constants.O_NOFOLLOW);
      this.fdStart = start;
    }
    let got = 0;
    while (got < length) {
      const n = readSync(this.fd, buf, offset + got, length - got, from - start + got);
      if (n === 0) throw new Error(`chunk ${chunkFileName(start)} ends at ${from + got}, before ${from + length}`);
      got += n;
    }
    return got;
  }

  /** Feeds the bytes [from, to) to onBytes, in pieces of at most buf's size. */
  each(from: number, to: number, buf: Buffer, onBytes: (bytes: Buffer) => void): void {
    for (let cursor = from; cursor < to;) {
      const n = this.readInto(cursor, to, buf, 0, buf.length);
      onBytes(buf.subarray(0, n));
      cursor += n;
    }
  }

  close(): void {
    if (this.fd >= 0) closeSync(this.fd);
    this.fd = -1;
    this.fdStart = -1;
  }
}

/** Up to maxBytes of a stream's stored bytes from cursor `from` (never past `end` nor one chunk), as a new Buffer. */
export function readStored(streamDir: string, chunkBytes: number, from: number, end: number, maxBytes: number): Buffer {
  const buf = Buffer.allocUnsafe(Math.max(0, Math.min(maxBytes, end - from)));
  const reader = new ChunkReader(streamDir, chunkBytes);
  try {
    return buf.subarray(0, reader.readInto(from, end, buf, 0, buf.length));
  } finally {
    reader.close();
  }
}

/**
 * The chunk files a stream holds from cursor 0 while contiguous (each full chunk exactly
 * chunkBytes, the last one shorter), from their sizes alone: no byte is read. A missing
 * stream dir is an empty stream.
 */
export function storedChunks(sessionDir: string, stream: StreamName, chunkBytes: number): { final_cursor: number; chunks: ChunkDigest[] } {
  const dir = join(sessionDir, stream);
  const chunks: ChunkDigest[] = [];
  let cursor = 0;
  for (;;) {
    let size: number;
    try {
      size = lstatSync(join(dir, chunkFileName(cursor))).size;
    } catch {
      break;
    }
    chunks.push({ start_cursor: cursor, length: size });
    cursor += size;
    if (size < chunkBytes) break;
  }
  return { final_cursor: cursor, chunks };
}

/** SHA-256 (hex) of a stream's index.bin as it is on disk (empty when absent). */
export function indexDigest(sessionDir: string, stream: StreamName): string {
  const hash = createHash('sha256');
  try {
    hash.update(readFileSync(join(sessionDir, stream, INDEX_FILE)));
  } catch {
    // no index: the digest of nothing
  }
  return hash.digest('hex');
}

/**
 * What a stream durably holds: its chunk files from cursor 0 while contiguous (storedChunks),
 * read back through the chunk reader: the SHA-256 of all of them and of each, and the index's.
 * A missing stream dir is an empty stream.
 */
export function storedStream(
  sessionDir: string,
  stream: StreamName,
  chunkBytes: number,
  onChunk?: (bytes: number) => void,
): Pick<StreamOutput, 'final_cursor' | 'sha256' | 'index_sha256' | 'chunks'> {
  const dir = join(sessionDir, stream);
  const hash = createHash('sha256');
  const { final_cursor, chunks } = existsSync(dir) ? storedChunks(sessionDir, stream, chunkBytes) : { final_cursor: 0, chunks: [] };
  const reader = new ChunkReader(dir, chunkBytes);
  const buf = Buffer.allocUnsafe(1024 * 1024);
  try {
    for (const chunk of chunks) {
      const chunkHash = createHash('sha256');
      reader.each(chunk.start_cursor, chunk.start_cursor + chunk.length, buf, (bytes) => {
        hash.update(bytes);
        chunkHash.update(bytes);
      });
      chunk.sha256 = chunkHash.digest('hex');
      onChunk?.(chunk.length);
    }
  } finally {
    reader.close();
  }
  return { final_cursor, sha256: hash.digest('hex'), index_sha256: indexDigest(sessionDir, stream), chunks };
}
