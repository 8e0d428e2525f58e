// Signatures, zod-free (the checkpoint thread loads it): RFC 8785 (JCS) canonical JSON, the
// bytes a receipt's (or manifest's) signature covers, digests of signed records, key ids and
// Ed25519 verification (docs/reference/contract.md "Receipt": over the JCS of all but `signature`). core/receipts/verify.ts
// re-exports these beside the checks that read the state dir.
import { createHash, createPublicKey, verify as verifySig, type KeyObject } from 'node:crypto';
import type { Receipt } from '../../ipc/protocol.js';

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/**
 * The JCS text of v, or undefined where JSON.stringify has none (undefined, a function, a
 * symbol: dropped from objects, null in arrays, as JSON.stringify does). Objects are written
 * member by member in UTF-16 code-unit order of their keys: JSON.stringify of a re-keyed object
 * would put integer-like keys ("0", "9", "10") first in numeric order, as JavaScript enumerates
 * them, which is not JCS's order.
 */
function writeJcs(v: unknown, seen: Set<object>): string | undefined {
  if (typeof v === 'number') {
    if (!Number.isFinite(v)) throw new Error(`${v} is not allowed`);
    return JSON.stringify(v);
  }
  if (typeof v === 'string') {
    if (LONE_SURROGATE.test(v)) throw new Error('Lone surrogate is not allowed');
    return JSON.stringify(v);
  }
  if (v === null || typeof v !== 'object') return JSON.stringify(v);
  if (seen.has(v)) throw new Error('Circular reference detected');
  seen.add(v);
  let out: string | undefined;
  if (typeof (v as { toJSON?: unknown }).toJSON === 'function') out = writeJcs((v as { toJSON(): unknown }).toJSON(), seen);
  else if (Array.isArray(v)) out = `[${v.map((x) => writeJcs(x, seen) ?? 'null').join(',')}]`;
  else {
    const members: string[] = [];
    for (const key of Object.keys(v).sort()) {
      const x = writeJcs((v as Record<string, unknown>)[key], seen);
      if (x === undefined) continue;
      if (LONE_SURROGATE.test(key)) throw new Error('Lone surrogate is not allowed');
      members.push(`${JSON.stringify(key)}:${x}`);
    }
    out = `{${members.join(',')}}`;
  }
  seen.delete(v);
  return out;
}

/**
 * RFC 8785 (JCS) canonical JSON of v: ES2015 JSON.stringify's number and string forms (they
 * are JCS's), every object's members in UTF-16 code-unit order of their keys; NaN, Infinity, a
 * lone surrogate and cycles throw. The same text as the `canonicalize` package (the property
 * test in test/unit/core/receipts/signature.test.ts checks it against it), several times faster: a manifest of
 * 4,000 entries is canonicalized several times per checkpoint.
 */
export function jcs(v: unknown): string {
  const out = writeJcs(v, new Set());
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

/** "sha256:" + hex SHA-256 of the raw 32-byte Ed25519 public key. */
export function keyIdOf(publicKey: KeyObject | string): string {
  const key = typeof publicKey === 'string' ? createPublicKey(publicKey) : publicKey;
  const raw = Buffer.from(key.export({ format: 'jwk' }).x as string, 'base64url');
  return `sha256:${createHash('sha256').update(raw).digest('hex')}`;
}

/** Problems with the signature of receipt under publicKeyPem (SPKI PEM); [] when it verifies. */
export function verifySignature(receipt: Receipt, publicKeyPem: string): string[] {
  return verifySignatureOver(receipt.signature, () => signedBytes(receipt), publicKeyPem);
}

/** Problems with signature over the bytes it covers (given lazily: the caller may have them already); [] when it verifies. */
export function verifySignatureOver(signature: Receipt['signature'], covered: () => Buffer, publicKeyPem: string): string[] {
  const sig = signature;
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
  if (sig.key_id !== keyId) problems.push(`signed by key ${sig.key_id}, but the key checked against is ${keyId}`);
  else if (!verifySig(null, covered(), key, Buffer.from(sig.value, 'base64'))) {
    problems.push('the signature does not match the receipt: a field was changed after signing');
  }
  return problems;
}
