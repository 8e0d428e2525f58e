// sbx verify of a checkpoint manifest (works with the supervisor stopped): its signature, id,
// canonical form, digest and counts (manifest.ts), and with a store, that it was published and
// that every object it names is there and re-hashes to its name and size. An edited copy is
// matched to the stored original by its signature, so the edited entries are named. Owns
// those checks; returns what differs ([] = it all holds), never throws for a mismatch.
import { createHash } from 'node:crypto';
import {
  checkManifestAsync,
  checkManifestHead,
  checkPublished,
  entryPathBytes,
  manifestBytes,
  manifestObjects,
  showEntryPath,
  type Manifest,
} from './manifest.js';
import { rehashObject, treeReader, type CheckpointStore } from './store.js';

export interface CheckpointVerdict {
  /** Hex SHA-256 of the bytes given (the checkpoint id when they are the stored manifest). */
  id: string;
  manifest: Manifest | null;
  problems: string[];
  /** Objects re-hashed from the store, and their bytes. */
  objects: number;
  bytes: number;
}

/** Entries of edited that differ from original, by path (at most 20 lines). */
function diffEntries(original: Manifest, edited: Manifest): string[] {
  const key = (e: Manifest['entries'][number]) => entryPathBytes(e).toString('latin1');
  const before = new Map(original.entries.map((e) => [key(e), e]));
  const out: string[] = [];
  for (const e of edited.entries) {
    const o = before.get(key(e));
    before.delete(key(e));
    if (!o) out.push(`${showEntryPath(e)}: added to the manifest after signing`);
    else if (JSON.stringify(o) !== JSON.stringify(e)) {
      const fields = [...new Set([...Object.keys(o), ...Object.keys(e)])].filter((f) => JSON.stringify((o as never)[f]) !== JSON.stringify((e as never)[f]));
      out.push(`${showEntryPath(e)}: ${fields.join(', ')} edited after signing`);
    }
  }
  for (const o of before.values()) out.push(`${showEntryPath(o)}: removed from the manifest after signing`);
  return out.slice(0, 20);
}

/**
 * Verifies manifest bytes (as a file holds them: canonical or pretty-printed JSON) under
 * publicKeyPem; with a store, publication and every object. expectId: the id it should have
 * (from its file name or the command line).
 */
export async function verifyCheckpoint(
  bytes: Buffer,
  publicKeyPem: string,
  store?: CheckpointStore,
  expectId?: string,
  onProgress?: (p: { objects: number; totalObjects: number; bytes: number; totalBytes: number }) => void,
): Promise<CheckpointVerdict> {
  // Its own bytes and signature first: a version 2 manifest's trees are read from the store only
  // once it verifies (an unsigned one's trees could be anything), and without a store not at all.
  const head = checkManifestHead(bytes, { publicKeyPem });
  let { manifest, problems } = head;
  const readTree = store ? treeReader(store) : null;
  if (manifest?.version === 2 && readTree && head.signed) {
    ({ manifest, problems } = await checkManifestAsync(bytes, { publicKeyPem, readTree }).catch((err: Error) => ({
      manifest: null,
      problems: [`its trees cannot be read from ${store!.location}: ${err.message}`],
    })));
  }
  let id = createHash('sha256').update(bytes).digest('hex');
  if (manifest) {
    // A file may hold it pretty-printed: the id is that of the canonical bytes.
    id = manifestBytes(manifest).id;
  }
  const verdict: CheckpointVerdict = { id, manifest, problems, objects: 0, bytes: 0 };
  if (!manifest) return verdict;
  if (expectId && id !== expectId) problems.push(`the manifest's canonical SHA-256 is ${id}, not ${expectId}: it was edited`);
  if (!store || !readTree) return verdict;
  if (!head.signed) {
    // Edited after signing: name what, from the stored original with the same signature (that
    // one verifies; the edited one's trees are read no further than a little past its size).
    for (const other of await store.listManifests().catch(() => [])) {
      const stored = await store.readManifest(other).catch(() => null);
      if (!stored) continue;
      const originalHead = checkManifestHead(stored, { publicKeyPem });
      if (!originalHead.signed || originalHead.manifest?.signature?.value !== manifest.signature?.value) continue;
      const original = (await checkManifestAsync(stored, { publicKeyPem, readTree }).catch(() => null))?.manifest;
      const edited =
        manifest.version === 2
          ? await checkManifestAsync(bytes, { readTree, maxEntries: 2 * (original?.scan.entries ?? 0) + 1024 }).catch((err: Error) => ({
              manifest: null,
              problems: [err.message],
            }))
          : { manifest, problems: [] };
      if (original && edited.manifest)
        problems.push(...diffEntries(original, edited.manifest).map((d) => `${d} (the stored checkpoint ${other} says otherwise)`));
      else if (!edited.manifest) problems.push(...edited.problems.map((p) => `its trees: ${p}`));
      break;
    }
    return verdict;
  }
  const published = await store.readPublished(id).catch(() => null);
  if (!published) problems.push(`checkpoint ${id} was never published in ${store.location}: its read-back did not complete (it claims nothing)`);
  else for (const p of checkPublished(published, id, publicKeyPem)) problems.push(`its published record in ${store.location}: ${p}`);
  const users = new Map<string, string[]>();
  for (const e of manifest.entries) {
    for (const sha of e.chunks ? e.chunks.map((c) => c.sha256) : e.sha256 ? [e.sha256] : []) {
      const list = users.get(sha) ?? [];
      if (list.length < 3) list.push(showEntryPath(e));
      users.set(sha, list);
    }
  }
  // Objects re-hashed so far, for a progress line (sbx verify on a terminal).
  const objects = [...manifestObjects(manifest)];
  const totalBytes = objects.reduce((sum, [, size]) => sum + size, 0);
  let checked = 0;
  let checkedBytes = 0;
  onProgress?.({ objects: 0, totalObjects: objects.length, bytes: 0, totalBytes });
  for (const [sha, size] of objects) {
    const named = `object ${sha} (${users.get(sha)?.join(', ') ?? 'a tree'})`;
    const got = await rehashObject(store, sha);
    checked++;
    checkedBytes += size;
    onProgress?.({ objects: checked, totalObjects: objects.length, bytes: checkedBytes, totalBytes });
    if (got.error !== undefined) {
      // Missing: said once, with the store (the store's own message names the object again).
      problems.push(got.missing ? `${named}: missing from ${store.location}` : `${named}: ${got.error}`);
      continue;
    }
    verdict.objects++;
    verdict.bytes += got.bytes;
    if (got.sha256 !== sha) problems.push(`${named}: its bytes hash to ${got.sha256}: changed in the store`);
    else if (got.bytes !== size) problems.push(`${named}: ${got.bytes} bytes, the manifest says ${size}`);
  }
  return verdict;
}
