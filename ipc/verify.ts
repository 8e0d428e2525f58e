// Receipt verification, usable with the supervisor stopped (sbx verify, harnesses):
// the Ed25519 signature over the RFC 8785 (JCS) encoding of the receipt without
// `signature`, the key id, and, given the state dir, every stored byte against the
// receipt's cursors and digests. Returns what differs; an empty list means it all matches.
import { createHash, createPublicKey, verify as verifySig, type KeyObject } from 'node:crypto';
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import type { Receipt, StreamName } from './protocol.js';
import { ADMISSION_FILE, isUnreadableReceiptName, OUTPUT_REMOVED_FILE, RECEIPT_FILE, readRecord, STARTED_FILE, STATE } from './state-layout.js';
import { chunkFileName, INDEX_FILE, storedStream } from './stream-files.js';

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** v with every object's keys in JCS order (UTF-16 code units), checked as JCS requires; JSON.stringify of it is the JCS text. */
function sortedForJcs(v: unknown, seen: Set<object>): unknown {
  if (typeof v === 'number') {
    if (!Number.isFinite(v)) throw new Error(`${v} is not allowed`);
    return v;
  }
  if (typeof v === 'string') {
    if (LONE_SURROGATE.test(v)) throw new Error('Lone surrogate is not allowed');
    return v;
  }
  if (v === null || typeof v !== 'object') return v;
  if (seen.has(v)) throw new Error('Circular reference detected');
  seen.add(v);
  let out: unknown;
  if (typeof (v as { toJSON?: unknown }).toJSON === 'function') out = sortedForJcs((v as { toJSON(): unknown }).toJSON(), seen);
  else if (Array.isArray(v)) out = v.map((x) => (x === undefined || typeof x === 'symbol' ? null : sortedForJcs(x, seen)));
  else {
    const o: Record<string, unknown> = {};
    for (const key of Object.keys(v).sort()) {
      const x = (v as Record<string, unknown>)[key];
      if (x === undefined || typeof x === 'symbol') continue;
      if (LONE_SURROGATE.test(key)) throw new Error('Lone surrogate is not allowed');
      o[key] = sortedForJcs(x, seen);
    }
    out = o;
  }
  seen.delete(v);
  return out;
}

/**
 * RFC 8785 (JCS) canonical JSON of v: ES2015 JSON.stringify (its number and string forms are
 * JCS's) of v with every object's keys sorted by UTF-16 code units; NaN, Infinity, a lone
 * surrogate and cycles throw. The same text as the `canonicalize` package (the property test in
 * test/unit/jcs.test.ts checks it against it), about ten times faster: a manifest of 4,000
 * entries is canonicalized several times per checkpoint.
 */
export function jcs(v: unknown): string {
  const out = JSON.stringify(sortedForJcs(v, new Set()));
  if (out === undefined) throw new TypeError('value cannot be canonicalized');
  return out;
}

/** The bytes a receipt's signature covers: JCS of every field but `signature`. */
export function signedBytes(receipt: Receipt): Buffer {
  const { signature: _omitted, ...rest } = receipt;
  return Buffer.from(jcs(rest));
}

/** "sha256:" of the JCS encoding of a whole signed receipt: what a close receipt lists. */
export function receiptDigest(receipt: unknown): string {
  return `sha256:${createHash('sha256').update(jcs(receipt)).digest('hex')}`;
}

/**
 * Problems with a close receipt's sessions in stateDir: each listed receipt must be there,
 * hash to the digest listed, carry a valid signature under publicKeyPem, and its stored
 * output must match it (verifyStoredOutput).
 */
export function verifyCloseSessions(close: { sessions: { session_id: string; receipt_sha256: string | null }[] }, stateDir: string, publicKeyPem: string): string[] {
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

/** "sha256:" + hex SHA-256 of the raw 32-byte Ed25519 public key. */
export function keyIdOf(publicKey: KeyObject | string): string {
  const key = typeof publicKey === 'string' ? createPublicKey(publicKey) : publicKey;
  const raw = Buffer.from(key.export({ format: 'jwk' }).x as string, 'base64url');
  return `sha256:${createHash('sha256').update(raw).digest('hex')}`;
}

/** Problems with the signature of receipt under publicKeyPem (SPKI PEM); [] when it verifies. */
export function verifySignature(receipt: Receipt, publicKeyPem: string): string[] {
  const sig = receipt.signature;
  if (!sig) return ['the receipt has no signature'];
  if (sig.alg !== 'ed25519') return [`unsupported signature algorithm ${JSON.stringify(sig.alg)}`];
  let key: KeyObject;
  try {
    key = createPublicKey(publicKeyPem);
  } catch (err) {
    return [`the public key cannot be read: ${(err as Error).message}`];
  }
  const problems: string[] = [];
  const keyId = keyIdOf(key);
  if (sig.key_id !== keyId) problems.push(`signed by key ${sig.key_id}, but the key given is ${keyId}`);
  else if (!verifySig(null, signedBytes(receipt), key, Buffer.from(sig.value, 'base64'))) {
    problems.push('the signature does not match the receipt: a field was changed after signing');
  }
  return problems;
}

/**
 * Problems with the stored output of receipt in stateDir: each stream's chunk files are
 * re-read and compared with final_cursor, sha256, every chunk's digest and index_sha256.
 */
export function verifyStoredOutput(receipt: Receipt, stateDir: string): string[] {
  const dir = join(stateDir, STATE.sessionsDir, receipt.session_id);
  if (!existsSync(dir)) return [`no session directory ${dir}`];
  let chunkBytes: number;
  try {
    chunkBytes = readRecord('admission', join(dir, ADMISSION_FILE)).chunk_bytes;
  } catch (err) {
    return [`admission record unreadable: ${(err as Error).message}`];
  }
  if (existsSync(join(dir, OUTPUT_REMOVED_FILE))) {
    const removed = readRecord('outputRemoved', join(dir, OUTPUT_REMOVED_FILE));
    return [`the stored output was removed by the retention policy at ${removed.removed_at}: only the signature can be checked`];
  }
  const problems: string[] = [];
  // Nothing may have been added: only the records, the receipt and the listed streams.
  const streams = Object.keys(receipt.output);
  for (const entry of readdirSync(dir)) {
    if ([ADMISSION_FILE, RECEIPT_FILE, STARTED_FILE].includes(entry) || streams.includes(entry) || isUnreadableReceiptName(entry)) continue;
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
    const disk = storedStream(dir, name, chunkBytes);
    if (disk.final_cursor !== expected.final_cursor) problems.push(`${name}: ${disk.final_cursor} bytes on disk, the receipt says ${expected.final_cursor}`);
    if (disk.sha256 !== expected.sha256) problems.push(`${name}: sha256 on disk ${disk.sha256}, the receipt says ${expected.sha256}`);
    if (disk.index_sha256 !== expected.index_sha256) problems.push(`${name}: index sha256 on disk ${disk.index_sha256}, the receipt says ${expected.index_sha256}`);
    const chunks = expected.chunks ?? [];
    if (chunks.length !== disk.chunks.length) problems.push(`${name}: ${disk.chunks.length} chunk files on disk, the receipt lists ${chunks.length}`);
    chunks.forEach((c, i) => {
      const d = disk.chunks[i];
      if (d && (d.start_cursor !== c.start_cursor || d.length !== c.length || (c.sha256 !== undefined && d.sha256 !== c.sha256))) {
        problems.push(`${name}: chunk at ${c.start_cursor} differs (disk: ${d.length} bytes, ${d.sha256}; receipt: ${c.length} bytes, ${c.sha256 ?? 'no chunk digest'})`);
      }
    });
  }
  return problems;
}
