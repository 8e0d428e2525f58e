// The state dir's records (docs/STATE.md): admission records, the invocation-key index
// (one file per key, named by the key's SHA-256, never removed: a key runs at most once,
// ever), receipts, and what a stream durably holds on disk. Owns reading and writing them;
// torn or corrupt files are reported as errors for the caller to mark the session unknown.
import { createHash } from 'node:crypto';
import { closeSync, constants, existsSync, fstatSync, fsyncSync, ftruncateSync, linkSync, lstatSync, mkdirSync, openSync, readdirSync, readFileSync, renameSync, rmSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';
import { z } from 'zod';
import type { ChunkDigest, Receipt } from '../../ipc/protocol.js';
import { ADMISSION_FILE, RECEIPT_FILE, RECEIPT_RESERVATION_FILE, STARTED_FILE } from '../../ipc/state-layout.js';
import { createFileDurable, fsyncDir, writeAll } from './durable.js';
import { faultPoint } from '../fault.js';

const AdmissionSchema = z.object({
  session_id: z.string().regex(/^s-[0-9a-z]+-[0-9a-f]+$/),
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

/** The durable admission record, written before spawn. */
export type AdmissionRecord = z.infer<typeof AdmissionSchema>;

/** Reads and validates <sessionDir>/admission.json; throws with the reason when torn or corrupt. */
export function readAdmission(sessionDir: string): AdmissionRecord {
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(join(sessionDir, ADMISSION_FILE), 'utf8'));
  } catch (err) {
    throw new Error(`admission record is unreadable: ${(err as Error).message}`);
  }
  const parsed = AdmissionSchema.safeParse(raw);
  if (!parsed.success) throw new Error(`admission record is not valid: ${parsed.error.issues[0].path.join('.')}: ${parsed.error.issues[0].message}`);
  return parsed.data;
}

export function writeAdmission(sessionDir: string, record: AdmissionRecord): void {
  createFileDurable(join(sessionDir, ADMISSION_FILE), JSON.stringify(record) + '\n');
}

const StreamOutputSchema = z.looseObject({
  final_cursor: z.number().int().min(0),
  sha256: z.string(),
  complete: z.boolean(),
  dropped_bytes: z.number().int().min(0),
  chunks: z.array(z.looseObject({ start_cursor: z.number().int().min(0), length: z.number().int().min(0) })).optional(),
});

/** What every receipt the supervisor reads back must have (more fields may follow: SPEC "Receipt"). */
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

/**
 * The receipt if one was written (atomically: it is whole or absent), checked against the
 * receipt's shape and this session's id; throws with the reason when it is torn, not a
 * receipt, or another session's.
 */
export function readReceipt(sessionDir: string, sessionId: string): Receipt | null {
  const path = join(sessionDir, RECEIPT_FILE);
  if (!existsSync(path)) return null;
  const parsed = ReceiptSchema.safeParse(JSON.parse(readFileSync(path, 'utf8')));
  if (!parsed.success) throw new Error(`not a receipt: ${parsed.error.issues[0].path.join('.')}: ${parsed.error.issues[0].message}`);
  if (parsed.data.session_id !== sessionId) throw new Error(`it is the receipt of session ${parsed.data.session_id}`);
  return parsed.data as unknown as Receipt;
}

/** Chunk entries a reservation makes room for at most (64 bytes each); past them the facts record stands in. */
const RESERVED_CHUNK_ENTRIES = 4096;

/**
 * Bytes reserved for a receipt (compact JSON): 16 KiB for its fixed fields, twice the
 * admission record (argv and cwd come back in it), and 64 bytes for each chunk file its
 * streams may list (at most RESERVED_CHUNK_ENTRIES), rounded up to 4 KiB.
 */
export function receiptReservationBytes(admissionBytes: number, chunkEntries: number): number {
  return Math.ceil((16 * 1024 + 2 * admissionBytes + 64 * Math.min(chunkEntries, RESERVED_CHUNK_ENTRIES)) / 4096) * 4096;
}

/**
 * Reserves space for the session's receipt (<session>/receipt.reserved, zeros, created
 * O_EXCL|O_NOFOLLOW): the blocks are taken now, while there is room, so the receipt can be
 * written later into them even when the file system is full (ENOSPC then never loses a known
 * exit status). Not fsync'ed: after a crash a reservation may be gone, and is made again.
 */
export function reserveReceiptSpace(sessionDir: string, bytes: number): void {
  const fd = openSync(join(sessionDir, RECEIPT_RESERVATION_FILE), constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
  try {
    writeAll(fd, Buffer.alloc(bytes));
  } finally {
    closeSync(fd);
  }
}

/**
 * Writes the receipt once, durably: into its reservation (pwrite at 0, ftruncate, fsync), then
 * link(2) to receipt.json, which fails with EEXIST if anything is there (never replaced, never
 * written through), then the reservation's name goes and the directory is fsync'ed. Without a
 * reservation it is a fresh temp file (createFileDurable). A receipt larger than its
 * reservation on a full disk throws ENOSPC: the caller keeps the facts and tries again.
 */
export function writeReceiptFile(sessionDir: string, data: string): void {
  const reserved = join(sessionDir, RECEIPT_RESERVATION_FILE);
  const final = join(sessionDir, RECEIPT_FILE);
  let fd: number;
  try {
    fd = openSync(reserved, constants.O_WRONLY | constants.O_NOFOLLOW);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    createFileDurable(final, data);
    return;
  }
  const bytes = Buffer.from(data);
  if (bytes.length > fstatSync(fd).size) {
    // Larger than its reservation: a temp file of its own, so the reservation (and a facts
    // record in it) stays whole until the receipt is in place.
    closeSync(fd);
    createFileDurable(final, bytes);
    unlinkSync(reserved);
    fsyncDir(sessionDir);
    return;
  }
  try {
    writeAll(fd, bytes);
    faultPoint('receipt:written-in-place'); // the reservation's zeros still follow it
    ftruncateSync(fd, bytes.length);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  faultPoint(`durable:${RECEIPT_FILE}:before-link`);
  linkSync(reserved, final);
  unlinkSync(reserved);
  fsyncDir(sessionDir);
}

/**
 * Writes a receipt's facts record (a signed receipt without its argv and chunk lists, which
 * the admission record and the chunk files give back: see receiptFromFacts) into the
 * reservation, in place: the rest is padded with spaces (JSON allows them), so no block is
 * allocated and it works on a full disk; fsync'ed. Throws ENOSPC if it does not fit.
 */
export function writeReservedFacts(sessionDir: string, data: string): void {
  const fd = openSync(join(sessionDir, RECEIPT_RESERVATION_FILE), constants.O_WRONLY | constants.O_NOFOLLOW);
  try {
    const size = fstatSync(fd).size;
    const bytes = Buffer.from(data);
    if (bytes.length > size) throw Object.assign(new Error(`the facts record (${bytes.length} bytes) does not fit the reservation (${size})`), { code: 'ENOSPC' });
    const padded = Buffer.alloc(size, 0x20);
    bytes.copy(padded);
    writeAll(fd, padded);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/** What a reservation holds after a crash: a whole receipt not yet linked, a facts record, or nothing usable. */
export type ReservedRecord = { kind: 'receipt'; receipt: Receipt } | { kind: 'facts'; facts: Receipt };

/**
 * The receipt or facts record a crash left in the reservation (whole, parseable, signed, for
 * this session); null when it holds zeros or a torn write. The caller checks the signature.
 */
export function readReserved(sessionDir: string, sessionId: string): ReservedRecord | null {
  let text: string;
  try {
    text = readFileSync(join(sessionDir, RECEIPT_RESERVATION_FILE), 'utf8');
  } catch {
    return null;
  }
  try {
    // A receipt written in place and not yet truncated is followed by the reservation's zeros.
    const r = JSON.parse(text.replace(/\0+$/, '')) as Receipt & { facts_only?: boolean };
    if (!r || typeof r !== 'object' || r.session_id !== sessionId || !r.signature) return null;
    return r.facts_only === true ? { kind: 'facts', facts: r } : { kind: 'receipt', receipt: r };
  } catch {
    return null;
  }
}

/** The facts record of a receipt (written into the reservation when the whole receipt has no room): unsigned. */
export function factsOf(receipt: Receipt): Receipt & { facts_only: true } {
  const { signature: _signature, ...rest } = receipt;
  const output: Receipt['output'] = {};
  for (const [stream, o] of Object.entries(receipt.output)) output[stream as keyof Receipt['output']] = { ...o!, chunks: [] };
  return { ...rest, argv: [], output, facts_only: true };
}

/**
 * The receipt a facts record stands for: argv from the admission record, each stream's chunk
 * list from its chunk files (their sizes must add up to the recorded cursor); unsigned (the
 * caller signs it: Ed25519 is deterministic, so the bytes and signature are the original's).
 * Null when the files no longer match the facts.
 */
export function receiptFromFacts(facts: Receipt, admission: AdmissionRecord, chunksOf: (stream: string) => { final_cursor: number; chunks: ChunkDigest[] }): Receipt | null {
  const { signature: _signature, facts_only: _marker, ...rest } = facts as Receipt & { facts_only?: boolean };
  const output: Receipt['output'] = {};
  for (const [stream, o] of Object.entries(facts.output)) {
    const disk = chunksOf(stream);
    if (disk.final_cursor !== o!.final_cursor) return null;
    output[stream as keyof Receipt['output']] = { ...o!, chunks: disk.chunks };
  }
  return { ...rest, argv: admission.argv, output };
}

/** Links a receipt found in the reservation into place (restore); throws as link(2) does. */
export function promoteReservedReceipt(sessionDir: string): void {
  linkSync(join(sessionDir, RECEIPT_RESERVATION_FILE), join(sessionDir, RECEIPT_FILE));
  unlinkSync(join(sessionDir, RECEIPT_RESERVATION_FILE));
  fsyncDir(sessionDir);
}

/**
 * Removes what a receipt written into place no longer needs: a reservation name left by a
 * crash between link and unlink (a second name of the receipt's inode), temp files. Never
 * the receipt.
 */
export function tidyEndedSessionDir(sessionDir: string): void {
  for (const name of readdirSync(sessionDir)) {
    if (name === RECEIPT_RESERVATION_FILE || (name.startsWith('.') && name.endsWith('.tmp'))) unlinkSync(join(sessionDir, name));
  }
}

/** What a session dir holds when its admission was never committed: nothing, or only temp files. */
export function onlyUncommittedAdmission(sessionDir: string): boolean {
  return readdirSync(sessionDir).every((name) => name.startsWith(`.${ADMISSION_FILE}.`) && name.endsWith('.tmp'));
}

/** The record that the spawn happened: {started_at, pid} (not fsync'ed: its presence is the evidence). */
export interface StartedRecord {
  started_at: string;
  pid: number;
}

/** Writes <session>/started.json right after the spawn (O_EXCL|O_NOFOLLOW). */
export function writeStarted(sessionDir: string, record: StartedRecord): void {
  const fd = openSync(join(sessionDir, STARTED_FILE), constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
  try {
    writeAll(fd, Buffer.from(JSON.stringify(record) + '\n'));
  } finally {
    closeSync(fd);
  }
}

/** The started record if one is there and whole; null otherwise (torn, absent). */
export function readStarted(sessionDir: string): StartedRecord | null {
  try {
    const r = JSON.parse(readFileSync(join(sessionDir, STARTED_FILE), 'utf8')) as StartedRecord;
    return typeof r.started_at === 'string' && Number.isFinite(Date.parse(r.started_at)) && Number.isSafeInteger(r.pid) ? r : null;
  } catch {
    return null;
  }
}

/** Whether a path exists without following a link (lstat). */
export function existsNoFollow(path: string): boolean {
  try {
    lstatSync(path);
    return true;
  } catch {
    return false;
  }
}

export interface KeyRecord {
  invocation_key: string;
  session_id: string;
  command_digest: string;
  admitted_at: string;
}

/** The key index: <state>/keys/<sha256(key)>.json; the key itself is never a path. */
export class KeyIndex {
  readonly dir: string;

  constructor(stateDir: string) {
    this.dir = join(stateDir, 'keys');
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
  }

  private path(key: string): string {
    return join(this.dir, `${createHash('sha256').update(key).digest('hex')}.json`);
  }

  /** Durably records that key belongs to a session (before its spawn). */
  write(record: KeyRecord): void {
    createFileDurable(this.path(record.invocation_key), JSON.stringify(record) + '\n');
  }

  has(key: string): boolean {
    return existsSync(this.path(key));
  }

  /** Every readable key record; unreadable ones are returned as errors with their file. */
  load(): { records: KeyRecord[]; errors: { file: string; reason: string }[] } {
    const records: KeyRecord[] = [];
    const errors: { file: string; reason: string }[] = [];
    for (const name of readdirSync(this.dir)) {
      if (!name.endsWith('.json') || name.startsWith('.')) continue;
      try {
        const r = JSON.parse(readFileSync(join(this.dir, name), 'utf8')) as KeyRecord;
        if (typeof r.invocation_key !== 'string' || typeof r.session_id !== 'string') throw new Error('missing fields');
        records.push(r);
      } catch (err) {
        errors.push({ file: name, reason: (err as Error).message });
      }
    }
    return { records, errors };
  }
}

/** Session directory names under <state>/sessions. */
export function sessionDirs(sessionsDir: string): string[] {
  return readdirSync(sessionsDir, { withFileTypes: true })
    .filter((d) => d.isDirectory() && !d.name.startsWith('.'))
    .map((d) => d.name);
}

/** Tombstone of a session the retention policy removed whole (<state>/retired/<id>.json). */
export interface RetiredRecord {
  session_id: string;
  invocation_key: string;
  command_digest: string;
  outcome: string;
  ended_at: string;
  receipt_sha256: string;
  retired_at: string;
}

const RetiredSchema = z.object({
  session_id: z.string().regex(/^s-[0-9a-z]+-[0-9a-f]+$/),
  invocation_key: z.string().min(1),
  command_digest: z.string(),
  outcome: z.string(),
  ended_at: z.string(),
  receipt_sha256: z.string(),
  retired_at: z.string(),
});

/**
 * The tombstones in dir, each checked against its shape and its file name; one that fails is
 * returned as an error (its key record still blocks the key: the session shows as unknown).
 */
export function readRetired(dir: string): { records: RetiredRecord[]; errors: { file: string; reason: string }[] } {
  const records: RetiredRecord[] = [];
  const errors: { file: string; reason: string }[] = [];
  if (!existsSync(dir)) return { records, errors };
  for (const name of readdirSync(dir)) {
    if (!name.endsWith('.json') || name.startsWith('.')) continue;
    try {
      const parsed = RetiredSchema.safeParse(JSON.parse(readFileSync(join(dir, name), 'utf8')));
      if (!parsed.success) throw new Error(`not a tombstone: ${parsed.error.issues[0].path.join('.')}: ${parsed.error.issues[0].message}`);
      if (`${parsed.data.session_id}.json` !== name) throw new Error(`names session ${parsed.data.session_id}`);
      records.push(parsed.data);
    } catch (err) {
      errors.push({ file: name, reason: (err as Error).message });
    }
  }
  return { records, errors };
}

/** Writes a tombstone once (durably; one left by a crash is kept). */
export function writeRetired(dir: string, record: RetiredRecord): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const path = join(dir, `${record.session_id}.json`);
  if (!existsSync(path)) createFileDurable(path, JSON.stringify(record) + '\n');
}

/** Takes a session dir out of sessions/ in one rename (durable), then removes its files. */
export function removeSessionDir(sessionsDir: string, sessionId: string): void {
  const trash = join(sessionsDir, `.retiring-${sessionId}`);
  renameSync(join(sessionsDir, sessionId), trash);
  fsyncDir(sessionsDir);
  rmSync(trash, { recursive: true, force: true });
}
