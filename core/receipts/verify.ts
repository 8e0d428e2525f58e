// Receipt verification, usable with the supervisor stopped (sbx verify, harnesses):
// the Ed25519 signature over the RFC 8785 (JCS) encoding of the receipt without
// `signature`, the key id, and, given the state dir, every stored byte against the
// receipt's cursors and digests. Returns what differs; an empty list means it all matches.
import { existsSync, lstatSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import type { Receipt, StreamName } from '../../ipc/protocol.js';
import { readRecord } from '../state/records.js';
import {
  ADMISSION_FILE,
  CHANGES_FILE,
  ESCAPE_ATTESTED_FILE,
  isUnreadableReceiptName,
  OUTPUT_REMOVED_FILE,
  RECEIPT_FILE,
  STARTED_FILE,
  STATE,
  TASK_FILES,
  taskDirName,
} from '../state/names.js';
import { storedStream } from '../state/stream-files.js';
import { chunkFileName, INDEX_FILE } from '../state/names.js';
import { receiptDigest, verifySignature } from './signature.js';

export { jcs, keyIdOf, receiptDigest, signedBytes, verifySignature } from './signature.js';

/**
 * Problems with a close receipt's sessions in stateDir: each listed receipt must be there,
 * hash to the digest listed, carry a valid signature under publicKeyPem, and its stored
 * output must match it (verifyStoredOutput).
 */
export function verifyCloseSessions(
  close: { sessions: { session_id: string; receipt_sha256: string | null }[] },
  stateDir: string,
  publicKeyPem: string,
): string[] {
  const problems: string[] = [];
  for (const entry of close.sessions) {
    if (entry.receipt_sha256 === null) continue;
    const path = join(stateDir, STATE.sessionsDir, entry.session_id, RECEIPT_FILE);
    let receipt: Receipt;
    try {
      receipt = readRecord('receipt', path);
    } catch (err) {
      problems.push(`${entry.session_id}: receipt unreadable: ${(err as Error).message}`);
      continue;
    }
    const digest = receiptDigest(receipt);
    if (digest !== entry.receipt_sha256) problems.push(`${entry.session_id}: receipt digest ${digest}, the close receipt says ${entry.receipt_sha256}`);
    for (const p of verifySignature(receipt, publicKeyPem)) problems.push(`${entry.session_id}: ${p}`);
    for (const p of verifyStoredOutput(receipt, stateDir)) problems.push(`${entry.session_id}: ${p}`);
  }
  return problems;
}

/**
 * Problems with a close receipt's tasks in stateDir: each task's receipt (tasks/<h>/receipt.json)
 * must be there and hash to the digest listed (a complete one is final: it never changes).
 */
export function verifyCloseTasks(close: { tasks?: { task: string; receipt_sha256: string }[] }, stateDir: string): string[] {
  const problems: string[] = [];
  for (const t of close.tasks ?? []) {
    const path = join(stateDir, STATE.tasksDir, taskDirName(t.task), TASK_FILES.receipt);
    try {
      const digest = receiptDigest(readRecord('taskReceipt', path));
      if (digest !== t.receipt_sha256)
        problems.push(`task ${JSON.stringify(t.task)}: task receipt digest ${digest}, the close receipt says ${t.receipt_sha256}`);
    } catch (err) {
      problems.push(`task ${JSON.stringify(t.task)}: task receipt unreadable: ${(err as Error).message}`);
    }
  }
  return problems;
}

/**
 * Problems with the stored output of receipt in stateDir: each stream's chunk files are
 * re-read and compared with final_cursor, sha256, every chunk's digest and index_sha256.
 * onChunk hears the bytes of each chunk file once it is hashed (for progress).
 */
export function verifyStoredOutput(receipt: Receipt, stateDir: string, onChunk?: (bytes: number) => void): string[] {
  const dir = join(stateDir, STATE.sessionsDir, receipt.session_id);
  if (!existsSync(dir)) return [`no session directory ${dir}`];
  let chunkBytes: number;
  try {
    chunkBytes = readRecord('admission', join(dir, ADMISSION_FILE)).chunk_bytes;
  } catch (err) {
    return [`admission record unreadable: ${(err as Error).message}`];
  }
  if (existsSync(join(dir, OUTPUT_REMOVED_FILE))) {
    try {
      const removed = readRecord('outputRemoved', join(dir, OUTPUT_REMOVED_FILE));
      return [`the stored output was removed by the retention policy at ${removed.removed_at}: only the signature can be checked`];
    } catch (err) {
      return [`output-removed record unreadable: ${(err as Error).message}`];
    }
  }
  const problems: string[] = [];
  // Nothing may have been added: only the records, the receipt and the listed streams (and,
  // for a cgroup_escaped receipt, the operator's word on it).
  const streams = Object.keys(receipt.output);
  const records =
    receipt.death.evidence === 'cgroup_escaped'
      ? [ADMISSION_FILE, RECEIPT_FILE, STARTED_FILE, CHANGES_FILE, ESCAPE_ATTESTED_FILE]
      : [ADMISSION_FILE, RECEIPT_FILE, STARTED_FILE, CHANGES_FILE];
  for (const entry of readdirSync(dir)) {
    if (records.includes(entry) || streams.includes(entry) || isUnreadableReceiptName(entry)) continue;
    problems.push(`unexpected entry in the session directory: ${entry}`);
  }
  for (const [name, expected] of Object.entries(receipt.output) as [StreamName, NonNullable<Receipt['output'][StreamName]>][]) {
    const listed = new Set([...(expected.chunks ?? []).map((c) => chunkFileName(c.start_cursor)), INDEX_FILE]);
    const streamDir = join(dir, name);
    for (const entry of existsSync(streamDir) ? readdirSync(streamDir) : []) {
      if (!listed.has(entry)) problems.push(`${name}: unexpected file ${entry}`);
    }
  }
  for (const [name, expected] of Object.entries(receipt.output) as [StreamName, NonNullable<Receipt['output'][StreamName]>][]) {
    // A planted link (the stream's directory, or a chunk: opened O_NOFOLLOW) is a mismatch, not a crash.
    if (lstatSync(join(dir, name), { throwIfNoEntry: false })?.isSymbolicLink()) {
      problems.push(`${name}: the stream directory is a symbolic link`);
      continue;
    }
    let disk: ReturnType<typeof storedStream>;
    try {
      disk = storedStream(dir, name, chunkBytes, onChunk);
    } catch (err) {
      problems.push(`${name}: cannot read the stored stream: ${(err as Error).message}`);
      continue;
    }
    if (disk.final_cursor !== expected.final_cursor) problems.push(`${name}: ${disk.final_cursor} bytes on disk, the receipt says ${expected.final_cursor}`);
    if (disk.sha256 !== expected.sha256) problems.push(`${name}: sha256 on disk ${disk.sha256}, the receipt says ${expected.sha256}`);
    if (disk.index_sha256 !== expected.index_sha256)
      problems.push(`${name}: index sha256 on disk ${disk.index_sha256}, the receipt says ${expected.index_sha256}`);
    const chunks = expected.chunks ?? [];
    if (chunks.length !== disk.chunks.length) problems.push(`${name}: ${disk.chunks.length} chunk files on disk, the receipt lists ${chunks.length}`);
    chunks.forEach((c, i) => {
      const d = disk.chunks[i];
      if (d && (d.start_cursor !== c.start_cursor || d.length !== c.length || (c.sha256 !== undefined && d.sha256 !== c.sha256))) {
        problems.push(
          `${name}: chunk at ${c.start_cursor} differs (disk: ${d.length} bytes, ${d.sha256}; receipt: ${c.length} bytes, ${c.sha256 ?? 'no chunk digest'})`,
        );
      }
    });
  }
  return problems;
}
