// The state dir's layout (docs/STATE.md), shared by the supervisor that writes it and by
// `sbx verify`, which re-reads it with the supervisor stopped: every file and dir name, the
// schema every record is parsed with (a torn or foreign file is an Error naming why, never a
// cast), chunk file names and index records, and the one chunk reader that the hashing
// threads, replay and verify all read stored bytes with. Reads only; writing is the
// supervisor's (supervisor/store/). See open(2) O_NOFOLLOW, pread(2).
import { createHash } from 'node:crypto';
import { closeSync, constants, existsSync, lstatSync, openSync, readFileSync, readSync } from 'node:fs';
import { join } from 'node:path';
import { z } from 'zod';
import type { ChunkDigest, CloseReceipt, Receipt, StreamName, StreamOutput } from './protocol.js';

// --- Names.

/** Files and dirs directly in the state dir. */
export const STATE = {
  identity: 'supervisor.json',
  lock: 'supervisor.lock',
  receiptKey: 'receipt-key',
  receiptKeyPub: 'receipt-key.pub',
  seal: 'seal.json',
  closeReceipt: 'close-receipt.json',
  keysDir: 'keys',
  sessionsDir: 'sessions',
  retiredDir: 'retired',
} as const;

/** In a session dir: the admission record, written once and fsync'ed before the spawn. */
export const ADMISSION_FILE = 'admission.json';
/** In a session dir: the receipt, written once (link(2) from its reservation). */
export const RECEIPT_FILE = 'receipt.json';
/** In a session dir: space reserved at admission for the receipt, so a full disk cannot lose it. */
export const RECEIPT_RESERVATION_FILE = 'receipt.reserved';
/** In a session dir: {started_at, pid}, written once the exec is reported (positive evidence that it ran). */
export const STARTED_FILE = 'started.json';
/** In a session dir: the retention policy removed its output (chunk files and index). */
export const OUTPUT_REMOVED_FILE = 'output-removed.json';
/** In a stream dir: one record per read (INDEX_RECORD_BYTES each). */
export const INDEX_FILE = 'index.bin';

/** The key record's file name in keys/: the key's SHA-256, never the key itself (a key is never a path). */
export function keyRecordName(invocationKey: string): string {
  return `${createHash('sha256').update(invocationKey).digest('hex')}.json`;
}

/** A tombstone's file name in retired/. */
export function tombstoneName(sessionId: string): string {
  return `${sessionId}.json`;
}

/** File name of the chunk that starts at cursor: 16 hex digits. */
export function chunkFileName(startCursor: number): string {
  return `${startCursor.toString(16).padStart(16, '0')}.chunk`;
}

// --- Records: every one is parsed with its schema.

const sessionId = z.string().regex(/^s-[0-9a-z]+-[0-9a-f]+$/);

const AdmissionSchema = z.object({
  session_id: sessionId,
  invocation_key: z.string().min(1),
  command_digest: z.string(),
  argv: z.array(z.string()).min(1),
  cwd: z.string(),
  env: z.record(z.string(), z.string()),
  timeout_ms: z.number().int().min(0),
  grace_ms: z.number().int().min(0),
  linger: z.enum(['kill', 'wait']),
  chunk_bytes: z.number().int().positive(),
  user: z.string().nullable().optional(),
  pty: z.object({ cols: z.number().int(), rows: z.number().int() }).nullable().optional(),
  stdin: z.enum(['null', 'stream']).optional(),
  cgroup: z.string().nullable(),
  mode: z.enum(['cgroup', 'subreaper']),
  boot_id: z.string(),
  generation: z.number().int(),
  instance: z.string(),
  admitted_at: z.string(),
});
/** The durable admission record, written before spawn (admission.json). */
export type AdmissionRecord = z.infer<typeof AdmissionSchema>;

const StreamOutputSchema = z.looseObject({
  final_cursor: z.number().int().min(0),
  sha256: z.string(),
  complete: z.boolean(),
  dropped_bytes: z.number().int().min(0),
  chunks: z.array(z.looseObject({ start_cursor: z.number().int().min(0), length: z.number().int().min(0) })).optional(),
});

/** What every receipt read back must have (more fields may follow: SPEC "Receipt"). */
const ReceiptSchema = z.looseObject({
  version: z.literal(1),
  session_id: z.string(),
  invocation_key: z.string(),
  command_digest: z.string(),
  argv: z.array(z.string()),
  admitted_at: z.string(),
  started_at: z.string().nullable(),
  leader_exited_at: z.string().nullable(),
  ended_at: z.string(),
  exit: z.object({ code: z.number().int().nullable(), signal: z.string().nullable() }),
  outcome: z.enum(['exited', 'signaled', 'timed_out', 'cancelled', 'spawn_failed', 'owner_lost']),
  death: z.looseObject({ evidence: z.string(), observed_at: z.string() }),
  output: z.partialRecord(z.enum(['stdout', 'stderr', 'pty']), StreamOutputSchema),
  usage: z.looseObject({}),
  signature: z.object({ alg: z.literal('ed25519'), key_id: z.string(), value: z.string() }).optional(),
});

const KeyRecordSchema = z.object({ invocation_key: z.string().min(1), session_id: sessionId, command_digest: z.string(), admitted_at: z.string() });
/** keys/<sha256(key)>.json: the key belongs to that session, for ever. */
export type KeyRecord = z.infer<typeof KeyRecordSchema>;

const TombstoneSchema = z.object({
  session_id: sessionId,
  invocation_key: z.string().min(1),
  command_digest: z.string(),
  outcome: z.string(),
  ended_at: z.string(),
  receipt_sha256: z.string(),
  retired_at: z.string(),
});
/** retired/<session_id>.json: a session the retention policy removed whole; its key still answers. */
export type TombstoneRecord = z.infer<typeof TombstoneSchema>;

const SealSchema = z.object({ generation: z.number().int().min(0), sealed_at: z.string() });
/** seal.json: admission sealed for good, at that generation. */
export type SealRecord = z.infer<typeof SealSchema>;

const IdentitySchema = z.object({ instance: z.string().min(1), generation: z.number().int().min(0) });
/** supervisor.json: this state dir's supervisor instance and its last generation. */
export type IdentityRecord = z.infer<typeof IdentitySchema>;

const StartedSchema = z.object({ started_at: z.string().refine((s) => Number.isFinite(Date.parse(s)), 'an ISO-8601 time'), pid: z.number().int() });
/** started.json: the exec was reported then (not fsync'ed: its presence is the evidence). */
export type StartedRecord = z.infer<typeof StartedSchema>;

const OutputRemovedSchema = z.object({ removed_at: z.string(), bytes: z.number().int().min(0).nullable() });
/** output-removed.json: retention removed the session's chunk files and index then. */
export type OutputRemovedRecord = z.infer<typeof OutputRemovedSchema>;

/** What a close receipt read back must have (close-receipt.json; more fields may follow). */
const CloseReceiptSchema = z.looseObject({
  version: z.literal(1),
  kind: z.literal('close'),
  sessions: z.array(z.looseObject({ session_id: z.string(), receipt_sha256: z.string().nullable() })),
  workspaces: z.array(z.looseObject({ path: z.string() })),
});

const RECORDS = {
  admission: AdmissionSchema,
  receipt: ReceiptSchema,
  key: KeyRecordSchema,
  tombstone: TombstoneSchema,
  seal: SealSchema,
  identity: IdentitySchema,
  started: StartedSchema,
  outputRemoved: OutputRemovedSchema,
  closeReceipt: CloseReceiptSchema,
};
type RecordKinds = {
  admission: AdmissionRecord;
  receipt: Receipt;
  key: KeyRecord;
  tombstone: TombstoneRecord;
  seal: SealRecord;
  identity: IdentityRecord;
  started: StartedRecord;
  outputRemoved: OutputRemovedRecord;
  closeReceipt: CloseReceipt;
};
export type RecordKind = keyof RecordKinds;

/**
 * One record from its file's text, checked against its schema; throws an Error naming the
 * first problem ("not JSON: …", "not a key record: session_id: …"). Trailing whitespace and
 * NUL bytes (a receipt written into its reservation, not yet truncated) are ignored.
 */
export function parseRecord<K extends RecordKind>(kind: K, text: string): RecordKinds[K] {
  let raw: unknown;
  try {
    raw = JSON.parse(text.replace(/\0+$/, ''));
  } catch (err) {
    throw new Error(`not JSON: ${(err as Error).message}`);
  }
  const parsed = RECORDS[kind].safeParse(raw);
  if (!parsed.success) throw new Error(`not a ${kind} record: ${parsed.error.issues[0].path.join('.') || '(root)'}: ${parsed.error.issues[0].message}`);
  return parsed.data as unknown as RecordKinds[K];
}

/** A record read from path and parsed (parseRecord); throws with the reason, or ENOENT when absent. */
export function readRecord<K extends RecordKind>(kind: K, path: string): RecordKinds[K] {
  return parseRecord(kind, readFileSync(path, 'utf8'));
}

// --- Streams: chunk files and the index.

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
 * The one reader of a stream's stored bytes by cursor: cursor c is chunk c - c % chunkBytes
 * at offset c % chunkBytes. Keeps the chunk it last read open (sequential readers, the
 * hashing threads and replay, open each chunk once); O_NOFOLLOW: a planted link is refused.
 * close() when done.
 */
export class ChunkReader {
  private fd = -1;
  private fdStart = -1;

  constructor(readonly streamDir: string, readonly chunkBytes: number) {}

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
    for (let cursor = from; cursor < to; ) {
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
export function storedStream(sessionDir: string, stream: StreamName, chunkBytes: number): Pick<StreamOutput, 'final_cursor' | 'sha256' | 'index_sha256' | 'chunks'> {
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
    }
  } finally {
    reader.close();
  }
  return { final_cursor, sha256: hash.digest('hex'), index_sha256: indexDigest(sessionDir, stream), chunks };
}
