// Where checkpoints are kept: the store interface every backend implements (local directory,
// S3), its one error class, and how `checkpoint.store` names one. Owns the contract only; the
// files are local-store.ts and s3-store.ts (loaded only for an s3:// URL: the AWS SDK costs
// nothing otherwise). Objects reach the local store first; a remote one is given each from it.
import { MAX_TREE_BYTES } from './tree.js';
import { createHash } from 'node:crypto';

/** Why a store call failed: `missing` (no such object/manifest), `conflict` (a precondition failed: a wrong ETag), `refused` (a planted link, not a regular file), `io` (anything else: the message says). */
export type StoreErrorCode = 'missing' | 'conflict' | 'refused' | 'io';

export class StoreError extends Error {
  constructor(
    readonly code: StoreErrorCode,
    message: string,
    readonly key?: string,
  ) {
    super(message);
    this.name = 'StoreError';
  }
}

/** What a manifest write returned, to read that exact version back (S3: the ETag and version id; local: null). */
export interface WrittenVersion {
  etag: string | null;
  versionId: string | null;
}

/**
 * A checkpoint store. Keys: objects by lowercase hex SHA-256 of their content; manifests and
 * published records by the checkpoint id (hex SHA-256 of the manifest's canonical bytes).
 * Every write is create-once: what is there already is never replaced (and is verified by the
 * caller's read-back, never trusted). Every read returns the bytes as stored; the caller hashes.
 */
export interface CheckpointStore {
  /** For people and records: an absolute directory, or s3://bucket/prefix. */
  readonly location: string;
  /** Stores the object sha256 from a local file holding exactly its bytes (size bytes); stored: false when it was there already. */
  putObject(sha256: string, file: string, size: number): Promise<{ stored: boolean }>;
  /** The object's bytes, streamed in order; StoreError missing/refused/io. */
  readObject(sha256: string): AsyncIterable<Uint8Array>;
  /** Creates the manifest (its canonical bytes); StoreError conflict if a different one has that id. */
  putManifest(id: string, bytes: Buffer): Promise<WrittenVersion>;
  /** The manifest's bytes; with `version` (what putManifest returned) exactly that version (S3: If-Match on the ETag), else StoreError conflict. */
  readManifest(id: string, version?: WrittenVersion): Promise<Buffer>;
  /** Creates the published record of id (written only after the read-back); present already: no-op. */
  putPublished(id: string, bytes: Buffer): Promise<void>;
  /** The published record's bytes, or null when the checkpoint was never published. */
  readPublished(id: string): Promise<Buffer | null>;
  /** Ids of the manifests held (published or not), any order. */
  listManifests(): Promise<string[]>;
  /** A remote store: uploads the object again over bytes that failed a read-back, from a local file that hashes to its name. */
  replaceObject?(sha256: string, file: string, size: number): Promise<void>;
  /** A remote store: removes a manifest never published (its read-back failed). */
  deleteManifest?(id: string): Promise<void>;
}

/** `checkpoint.store` parsed: a local directory (absolute) or an S3 bucket and key prefix ('' or ending in '/'). */
export type StoreUrl = { kind: 'local'; dir: string } | { kind: 's3'; bucket: string; prefix: string };

/** Parses `checkpoint.store`: '' → the local store under the state dir; an absolute path; s3://bucket[/prefix]. Throws Error naming what is wrong. */
export function parseStoreUrl(value: string, defaultDir: string): StoreUrl {
  if (value === '') return { kind: 'local', dir: defaultDir };
  if (value.startsWith('/')) return { kind: 'local', dir: value };
  const m = /^s3:\/\/([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:\/(.*))?$/.exec(value);
  if (!m)
    throw new Error(
      `checkpoint store ${JSON.stringify(value)}: expected an absolute directory or s3://bucket/prefix (a bucket name of 3-63 lowercase letters, digits, dots, hyphens)`,
    );
  let prefix = m[2] ?? '';
  if (prefix !== '' && !prefix.endsWith('/')) prefix += '/';
  return { kind: 's3', bucket: m[1], prefix };
}

/** Re-reads one object from a store and hashes it: its digest and size, or why it could not be read (never thrown). */
export async function rehashObject(store: CheckpointStore, sha256: string): Promise<{ sha256: string; bytes: number; error?: string; missing?: boolean }> {
  const hash = createHash('sha256');
  let bytes = 0;
  try {
    for await (const chunk of store.readObject(sha256)) {
      hash.update(chunk);
      bytes += chunk.length;
    }
  } catch (err) {
    return { sha256: '', bytes, error: (err as Error).message, missing: err instanceof StoreError && err.code === 'missing' };
  }
  return { sha256: hash.digest('hex'), bytes };
}

/** A tree object's bytes from store (manifest.ts checkManifestAsync's readTree): null when missing; StoreError refused/io, or io past MAX_TREE_BYTES. */
export function treeReader(store: CheckpointStore): (sha256: string) => Promise<Buffer | null> {
  return async (sha256) => {
    const parts: Buffer[] = [];
    let bytes = 0;
    try {
      for await (const chunk of store.readObject(sha256)) {
        bytes += chunk.length;
        if (bytes > MAX_TREE_BYTES) throw new StoreError('io', `object ${sha256} in ${store.location} is over ${MAX_TREE_BYTES} bytes: not a tree`);
        parts.push(Buffer.from(chunk));
      }
    } catch (err) {
      if (err instanceof StoreError && err.code === 'missing') return null;
      throw err;
    }
    return Buffer.concat(parts);
  };
}

/** True for a lowercase hex SHA-256 (a loop: called per file of a checkpoint, where the regular expression cost ~0.4 µs). */
export function isSha256Hex(s: string): boolean {
  if (typeof s !== 'string' || s.length !== 64) return false;
  for (let i = 0; i < 64; i++) {
    const c = s.charCodeAt(i);
    if (!((c >= 0x30 && c <= 0x39) || (c >= 0x61 && c <= 0x66))) return false;
  }
  return true;
}
