// Manifests for the tests: a valid v1 manifest of given entries (its scan digest computed), task
// and times settable (the checkpoint format's unit tests, sbx diff's); and a stored manifest
// read back whatever its version (a version 2 manifest's entries from the store's trees).
import type { KeyObject } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { checkManifest, scanDigest, type Manifest, type ManifestEntry } from '../../core/checkpoint/manifest.js';
import { keyIdOf } from '../../core/receipts/signature.js';
import type { CheckpointRequest } from '../../supervisor/checkpoint/capture-worker.js';

/** A checkpoint manifest of entries for workspace /w; task null and created_at = started_at unless given. */
export function manifestOf(entries: ManifestEntry[], o: { task?: string | null; createdAt?: string } = {}): Manifest {
  return {
    version: 1,
    kind: 'checkpoint',
    workspace: '/w',
    task: o.task ?? null,
    started_at: '2026-12-01T00:00:00.000Z',
    created_at: o.createdAt ?? '2026-12-01T00:00:00.000Z',
    boundary: { epoch: null, seq: null, gap: 'not_watched' },
    scan: { digest: scanDigest(entries), entries: entries.length, files: 0, bytes: 0, passes: 2 },
    consistent: true,
    unstable: [],
    supervisor: { instance: 'i', generation: 1, boot_id: 'b', mode: 'cgroup' },
    root: { mode: 0o755, uid: 0, gid: 0, mtime_ns: '1' },
    entries,
  };
}

/** A stored manifest as the tests read it: entries as parsed JSON (each test picks the fields it asserts). */
export type StoredManifest = Omit<Manifest, 'entries'> & { entries: any[] };

/**
 * The stored manifest id of the local store storeDir, checked (checkManifest: id, canonical
 * form, and with a key the signature) with a version 2 manifest's entries read from the
 * store's tree objects; throws naming what does not hold. The tests read manifests this way,
 * whatever their version.
 */
export function storedManifest(storeDir: string, id: string, publicKeyPem?: string): StoredManifest {
  const bytes = readFileSync(join(storeDir, 'manifests', `${id}.json`));
  const readTree = (sha: string): Buffer | null => {
    try {
      return readFileSync(join(storeDir, 'objects', sha.slice(0, 2), sha));
    } catch {
      return null;
    }
  };
  const { manifest, problems } = checkManifest(bytes, { expectId: id, readTree, ...(publicKeyPem ? { publicKeyPem } : {}) });
  if (!manifest || problems.length) throw new Error(`manifest ${id} in ${storeDir}: ${problems.join('; ')}`);
  return manifest;
}

/** An empty regular file's entry fields (mode 0644, root's, mtime 1 ns), but its path. */
export const EMPTY_FILE_FIELDS = {
  type: 'file' as const,
  mode: 0o644,
  uid: 0,
  gid: 0,
  size: 0,
  mtime_ns: '1',
  sha256: 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855',
};

/** A checkpoint thread's request (capture-worker.ts runCheckpoint) for the tree at root into the local store storeDir (its fd open), signed with privateKey; no watcher (gap not_watched). */
export function threadRequest(o: {
  root: string;
  storeDir: string;
  storeFd: number;
  privateKey: KeyObject;
  publicKey: KeyObject;
  task?: string | null;
}): CheckpointRequest {
  return {
    kind: 'checkpoint',
    root: o.root,
    storeDir: o.storeDir,
    storeFd: o.storeFd,
    reserveBytes: 0,
    startHrNs: process.hrtime.bigint(),
    maxPasses: 4,
    header: {
      workspace: o.root,
      task: o.task ?? null,
      started_at: new Date().toISOString(),
      boundary: { epoch: null, seq: null, gap: 'not_watched' },
      supervisor: { instance: 'i', generation: 1, boot_id: 'b', mode: 'test' },
    },
    signingKeyPem: o.privateKey.export({ type: 'pkcs8', format: 'pem' }) as string,
    keyId: keyIdOf(o.publicKey),
    forRemote: true,
  };
}
