// The on-disk layout of a session's streams (docs/STATE.md), shared by the supervisor that
// writes it and by `sbx verify`, which re-reads it with the supervisor stopped: chunk file
// names, index records, and what a stream durably holds. No writing here.
import { createHash } from 'node:crypto';
import { closeSync, constants, existsSync, lstatSync, openSync, readFileSync, readSync, statSync } from 'node:fs';
import { join } from 'node:path';
import type { ChunkDigest, StreamName, StreamOutput } from './protocol.js';

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

/**
 * Reads up to maxBytes of a stream's stored bytes from cursor `from` (never past `end`,
 * the stored cursor, nor past one chunk). Returns an empty Buffer at the end.
 */
export function readStored(streamDir: string, chunkBytes: number, from: number, end: number, maxBytes: number): Buffer {
  const buf = Buffer.allocUnsafe(Math.max(0, Math.min(maxBytes, end - from)));
  return buf.subarray(0, readStoredInto(streamDir, chunkBytes, from, end, buf, 0, buf.length));
}

/** readStored() into buf at offset (at most maxBytes, never past a chunk's end); returns the count. */
export function readStoredInto(streamDir: string, chunkBytes: number, from: number, end: number, buf: Buffer, offset: number, maxBytes: number): number {
  if (from >= end) return 0;
  const chunkStart = from - (from % chunkBytes);
  const length = Math.min(maxBytes, end - from, chunkStart + chunkBytes - from);
  const fd = openSync(join(streamDir, chunkFileName(chunkStart)), constants.O_RDONLY | constants.O_NOFOLLOW);
  try {
    let got = 0;
    while (got < length) {
      const n = readSync(fd, buf, offset + got, length - got, from - chunkStart + got);
      if (n === 0) break;
      got += n;
    }
    return got;
  } finally {
    closeSync(fd);
  }
}

/** In a session dir: the retention policy removed its output (chunk files and index). */
export const OUTPUT_REMOVED_FILE = 'output-removed.json';
/** In a session dir: the admission record, written once and fsync'ed before the spawn. */
export const ADMISSION_FILE = 'admission.json';
/** In a session dir: the receipt, written once (link(2) from its reservation). */
export const RECEIPT_FILE = 'receipt.json';
/** In a session dir: space reserved at admission for the receipt, so a full disk cannot lose it. */
export const RECEIPT_RESERVATION_FILE = 'receipt.reserved';
/** In a session dir: {started_at, pid}, written right after the spawn (positive evidence that it ran). */
export const STARTED_FILE = 'started.json';

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
    hash.update(readFileSync(join(sessionDir, stream, 'index.bin')));
  } catch {
    // no index: the digest of nothing
  }
  return hash.digest('hex');
}

/**
 * What a stream durably holds: its chunk files read from cursor 0 while contiguous (each
 * full chunk exactly chunkBytes, the last one shorter), their SHA-256, and the index's.
 * A missing stream dir is an empty stream.
 */
export function storedStream(sessionDir: string, stream: StreamName, chunkBytes: number): Pick<StreamOutput, 'final_cursor' | 'sha256' | 'index_sha256' | 'chunks'> {
  const dir = join(sessionDir, stream);
  const hash = createHash('sha256');
  const indexHash = createHash('sha256');
  const chunks: ChunkDigest[] = [];
  let cursor = 0;
  if (existsSync(dir)) {
    const buf = Buffer.allocUnsafe(1024 * 1024);
    for (;;) {
      const path = join(dir, chunkFileName(cursor));
      if (!existsSync(path)) break;
      const size = statSync(path).size;
      const fd = openSync(path, constants.O_RDONLY | constants.O_NOFOLLOW);
      const chunkHash = createHash('sha256');
      try {
        let off = 0;
        while (off < size) {
          const n = readSync(fd, buf, 0, Math.min(buf.length, size - off), off);
          if (n === 0) break;
          hash.update(buf.subarray(0, n));
          chunkHash.update(buf.subarray(0, n));
          off += n;
        }
        chunks.push({ start_cursor: cursor, length: off, sha256: chunkHash.digest('hex') });
        cursor += off;
        if (off < chunkBytes) break;
      } finally {
        closeSync(fd);
      }
    }
    const index = join(dir, 'index.bin');
    if (existsSync(index)) indexHash.update(readFileSync(index));
  }
  return { final_cursor: cursor, sha256: hash.digest('hex'), index_sha256: indexHash.digest('hex'), chunks };
}

