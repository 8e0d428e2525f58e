// Manifests for the tests: a valid v1 manifest of given entries (its scan digest computed), task
// and times settable (the checkpoint format's unit tests, sbx diff's); and a stored manifest
// read back whatever its version (a version 2 manifest's entries from the store's trees).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { checkManifest, scanDigest, type Manifest, type ManifestEntry } from '../../core/checkpoint/manifest.js';

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
