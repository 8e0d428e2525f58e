// The local checkpoint store's gc (sbx gc; docs/guide/checkpoints.md "Checkpoints"):
// manifests never published and manifests past checkpoint.maxAgeMs go (published record first),
// then every object no kept manifest names, then temp files and what quarantine/ held. A
// manifest that cannot be read keeps every object. Run behind the checkpoint queue (checkpoint.ts).
import type { Logger } from 'pino';
import type { GcResult } from '../../ipc/methods.js';
import type { LocalStore } from '../../core/checkpoint/local-store.js';
import { checkManifest, manifestObjects, type Manifest } from '../../core/checkpoint/manifest.js';

export interface GcOptions {
  /** checkpoint.maxAgeMs: manifests made longer ago go; 0: kept forever. */
  maxAgeMs: number;
  /** Checkpoints never removed by age (what complete task receipts name); null: cannot tell, none is removed by age. */
  pinned: Set<string> | null;
  log: Logger;
  nowMs: number;
  /** The supervisor's public key: a version 2 manifest's trees are read only once its signature verifies (one that does not, a planted one, is unreadable: it keeps every object). */
  publicKeyPem: string;
}

/** One gc of the local store; what it removed and kept. */
export async function collectGarbage(local: LocalStore, o: GcOptions): Promise<NonNullable<GcResult['checkpoints']>> {
  const removed: string[] = [];
  for (const id of local.unpublishedIds()) {
    local.removeManifest(id);
    removed.push(id);
  }
  const referenced = new Set<string>();
  let unreadable = false;
  let kept = 0;
  for (const id of await local.listManifests()) {
    let manifest: Manifest | null = null;
    try {
      const bytes = local.manifestBytes(id);
      manifest = bytes ? checkManifest(bytes, { readTree: (sha) => local.readObjectBytes(sha), publicKeyPem: o.publicKeyPem }).manifest : null;
    } catch {
      // a directory or a link where a manifest should be: unreadable
    }
    if (!manifest) {
      unreadable = true;
      o.log.error({ manifest: id }, 'gc: a checkpoint manifest cannot be read; no object is removed');
      continue;
    }
    if (o.maxAgeMs > 0 && o.nowMs - Date.parse(manifest.created_at) > o.maxAgeMs && o.pinned !== null && !o.pinned.has(id)) {
      local.removePublished(id);
      local.removeManifest(id);
      removed.push(id);
      continue;
    }
    kept++;
    for (const sha of manifestObjects(manifest).keys()) referenced.add(sha);
  }
  const objects = unreadable ? { removed: 0, freedBytes: 0 } : local.removeObjectsExcept(referenced);
  local.clearTemp();
  // What failed a read-back was kept for a look (the log names each); gc lets it go.
  let quarantined = { removed: 0, freedBytes: 0 };
  try {
    quarantined = local.clearQuarantine();
  } catch (err) {
    // quarantine/ a link or a file: refused, never followed (what it points at is not the store's).
    o.log.error({ err }, 'gc: quarantine/ of the checkpoint store is not a directory; left as it is');
  }
  const freed = objects.freedBytes + quarantined.freedBytes;
  if (removed.length || objects.removed || quarantined.removed)
    o.log.info(
      { removed_manifests: removed.length, removed_objects: objects.removed, removed_quarantined: quarantined.removed, freed_bytes: freed },
      'checkpoint gc',
    );
  return { removed_manifests: removed, removed_objects: objects.removed, removed_quarantined: quarantined.removed, freed_bytes: freed, kept_manifests: kept };
}
