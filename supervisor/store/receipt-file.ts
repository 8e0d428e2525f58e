// Where a receipt's bytes reach disk (docs/design/facts.md 9; docs/guide/close-and-retention.md "Receipts on
// a full disk"): the space reserved for it at admission (receipt.reserved), the receipt written into it and
// linked into place once, the facts record kept in it in place when the whole receipt has no room, and what a
// crash left there, read back at start. Owns those bytes; the receipt's content is session/receipt.ts, its
// schema core/state/records.ts. See open(2), fsync(2), link(2), ftruncate(2).
import { closeSync, constants, fstatSync, fsyncSync, ftruncateSync, linkSync, lstatSync, openSync, readdirSync, readFileSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';
import type { ChunkDigest, Receipt } from '../../ipc/protocol.js';
import { parseRecord, type AdmissionRecord } from '../../core/state/records.js';
import { isTempFileName, RECEIPT_FILE, RECEIPT_RESERVATION_FILE } from '../../core/state/names.js';
import { faultPoint } from '../../core/fault.js';
import { createFileDurable, fsyncDir, writeAll } from '../../core/fs/durable.js';
import { errnoCode } from '../../ipc/errno.js';

/** Chunk entries a reservation makes room for at most (64 bytes each); past them the facts record stands in. */
const RESERVED_CHUNK_ENTRIES = 4096;

/**
 * Bytes reserved for a receipt (compact JSON): 16 KiB for its fixed fields, twice the
 * admission record (argv and cwd come back in it), and 64 bytes for each chunk file its
 * streams may list (at most RESERVED_CHUNK_ENTRIES), rounded up to 4 KiB.
 */
export function receiptReservationBytes(admissionBytes: number, chunkEntries: number, extraBytes = 0): number {
  return Math.ceil((16 * 1024 + 2 * admissionBytes + 64 * Math.min(chunkEntries, RESERVED_CHUNK_ENTRIES) + extraBytes) / 4096) * 4096;
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
    if (errnoCode(err) !== 'ENOENT') throw err;
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
    if (bytes.length > size)
      throw Object.assign(new Error(`the facts record (${bytes.length} bytes) does not fit the reservation (${size})`), { code: 'ENOSPC' });
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
  let r: Receipt & { facts_only?: boolean };
  try {
    // A receipt written in place and not yet truncated is followed by the reservation's zeros
    // (parseRecord ignores them); zeros alone or a torn write are not a record.
    r = parseRecord('receipt', text) as Receipt & { facts_only?: boolean };
  } catch {
    return null;
  }
  if (r.session_id !== sessionId || !r.signature) return null;
  return r.facts_only === true ? { kind: 'facts', facts: r } : { kind: 'receipt', receipt: r };
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
export function receiptFromFacts(
  facts: Receipt,
  admission: AdmissionRecord,
  chunksOf: (stream: string) => { final_cursor: number; chunks: ChunkDigest[] },
): Receipt | null {
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
 * At start, removes what a crash left in a session dir: temp files (a receipt's written by a
 * supervisor killed meanwhile; nothing writes them while the state is restored), and, once
 * the receipt is in place (`ended`), a reservation name left by a crash between link and
 * unlink (a second name of the receipt's inode). Never the receipt, nor the reservation of a
 * session still without one.
 */
export function tidySessionDir(sessionDir: string, ended: boolean): void {
  for (const name of readdirSync(sessionDir)) {
    if ((ended && name === RECEIPT_RESERVATION_FILE) || isTempFileName(name)) unlinkSync(join(sessionDir, name));
  }
}

/**
 * The receipt if one was written (atomically: it is whole or absent), checked against the
 * receipt's shape and this session's id; throws with the reason when it is torn, not a
 * receipt, or another session's.
 */
export function readReceipt(sessionDir: string, sessionId: string): Receipt | null {
  let text: string;
  try {
    text = readFileSync(join(sessionDir, RECEIPT_FILE), 'utf8');
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return null;
    throw err;
  }
  const receipt = parseRecord('receipt', text);
  if (receipt.session_id !== sessionId) throw new Error(`it is the receipt of session ${receipt.session_id}`);
  return receipt;
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
