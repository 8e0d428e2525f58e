// Manifests for the unit tests of the checkpoint format and of sbx diff: a valid v1 manifest
// of given entries (its scan digest computed), task and times settable.
import { scanDigest, type Manifest, type ManifestEntry } from '../../core/checkpoint/manifest.js';

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
