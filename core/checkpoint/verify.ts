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
  entriesBound,
  EntriesCheck,
  EntriesSummary,
  entryPathBytes,
  manifestBytes,
  mountsSkipped,
  notCaptured,
  showEntryPath,
  type Manifest,
  type ManifestEntry,
} from './manifest.js';
import { DigestSet } from './digest-set.js';
import { rehashObject, treeReader, type CheckpointStore } from './store.js';
import { TREE_CACHE_BYTES, TreeCache, walkTreeAsync, type WalkStep } from './tree.js';

/** The most objects verify sizes its digest table for at once (2^23 slots, 128 MiB); past that it grows as needed. */
const PRESIZE_MAX = 4_000_000;

export interface CheckpointVerdict {
  /** Hex SHA-256 of the bytes given (the checkpoint id when they are the stored manifest). */
  id: string;
  /** Its head (a version 2 manifest's `entries` stay empty: they are walked from its trees, never held); null when it cannot be read. */
  manifest: Manifest | null;
  problems: string[];
  /** Objects re-hashed from the store, and their bytes. */
  objects: number;
  bytes: number;
  /** Its unstable paths it holds no entry for (manifest.ts notCaptured); [] when its entries were not read (a version 2 manifest without a store). */
  notCaptured: string[];
  /** Its mount points, recorded and not entered (manifest.ts mountsSkipped); [] when its entries were not read. */
  mountsSkipped: string[];
}

/** One manifest entry's objects (its file's and its chunks', as manifest.ts manifestObjects), with their sizes. */
function entryObjects(e: ManifestEntry): [string, number][] {
  if (e.type !== 'file') return [];
  const out: [string, number][] = e.sha256 !== undefined ? [[e.sha256, e.size]] : [];
  for (const c of e.chunks ?? []) out.push([c.sha256, c.size]);
  return out;
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
 * (from its file name or the command line). A version 2 manifest's entries are walked from its
 * trees twice (tree.ts walkTree: counted and checked, then each object re-hashed once), never
 * held: memory grows with the depth and the widest directory, and 23-46 bytes per object (a
 * 16-byte slot each at a load of 35-70%: DigestSet, sized for the entries at once), not with what
 * the entries hold.
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
  const { manifest, problems } = head;
  const readTree = store ? treeReader(store) : null;
  let id = createHash('sha256').update(bytes).digest('hex');
  // A file may hold it pretty-printed: the id is that of the canonical bytes.
  if (manifest) id = manifestBytes(manifest).id;
  const verdict: CheckpointVerdict = { id, manifest, problems, objects: 0, bytes: 0, notCaptured: [], mountsSkipped: [] };
  if (!manifest) return verdict;
  if (manifest.version !== 2) {
    verdict.notCaptured = notCaptured(manifest);
    verdict.mountsSkipped = mountsSkipped(manifest);
  }
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
        for (const d of diffEntries(original, edited.manifest)) problems.push(`${d} (the stored checkpoint ${other} says otherwise)`);
      else if (!edited.manifest) for (const p of edited.problems) problems.push(`its trees: ${p}`);
      break;
    }
    return verdict;
  }
  // Each step of its entries (and, version 2, its trees as they are checked), in the manifest's order.
  type Step = Exclude<WalkStep, { read: string }>;
  const walk = async (visit: (step: Step) => void | Promise<void>): Promise<string | null> => {
    if (manifest.version !== 2) {
      for (const entry of manifest.entries) await visit({ entry });
      return null;
    }
    try {
      return await walkTreeAsync(manifest.tree!, readTree, entriesBound(manifest), visit, new TreeCache(TREE_CACHE_BYTES));
    } catch (err) {
      return `its trees cannot be read from ${store.location}: ${(err as Error).message}`;
    }
  };
  // First walk: its entries checked (version 1's were, with its head) and counted, and the objects to re-hash.
  const check = manifest.version === 2 ? new EntriesCheck() : null;
  const summary = check ? new EntriesSummary(manifest.unstable ?? []) : null;
  // Sized at once for the objects its entries name (a file's object, a tree per directory and the
  // root: entries + 1, up to PRESIZE_MAX; a chunked file's chunks grow it past that), then
  // claimed in the second walk, not copied.
  const toHash = new DigestSet(Math.min(entriesBound(manifest) + 1, PRESIZE_MAX));
  let totalObjects = 0;
  let totalBytes = 0;
  const counted = (sha: string, size: number) => {
    if (!toHash.add(sha)) return;
    totalObjects++;
    totalBytes += size;
  };
  const walked = await walk((step) => {
    if ('tree' in step) return counted(step.tree, step.size);
    const e = step.entry;
    check?.add(e);
    summary?.add(e);
    for (const [sha, size] of entryObjects(e)) counted(sha, size);
  });
  if (walked !== null) {
    // A tree missing or not holding: nothing of its entries is known.
    problems.push(walked);
    verdict.manifest = null;
    return verdict;
  }
  if (check) {
    for (const p of check.problems) problems.push(p);
    if (manifest.scan?.entries !== check.count) problems.push(`the manifest says ${manifest.scan?.entries} entries and its trees hold ${check.count}`);
    verdict.notCaptured = summary!.notCaptured;
    verdict.mountsSkipped = summary!.mountsSkipped;
  }
  const published = await store.readPublished(id).catch(() => null);
  if (!published) problems.push(`checkpoint ${id} was never published in ${store.location}: its read-back did not complete (it claims nothing)`);
  else for (const p of checkPublished(published, id, publicKeyPem)) problems.push(`its published record in ${store.location}: ${p}`);
  // Second walk: each object re-hashed once, named by the first paths using it (at most 3) when it does not hold.
  const failed = new Map<string, { paths: string[]; problem: (named: string) => string }>();
  onProgress?.({ objects: 0, totalObjects, bytes: 0, totalBytes });
  let claimed = 0;
  const progress = () => onProgress?.({ objects: ++claimed, totalObjects, bytes: verdict.bytes, totalBytes });
  const again = await walk(async (step) => {
    if ('tree' in step) {
      // The walk read it from the store and checked its bytes hash to its id (tree.ts checkTree).
      if (!toHash.claim(step.tree)) return;
      verdict.objects++;
      verdict.bytes += step.size;
      return progress();
    }
    for (const [sha, size] of entryObjects(step.entry)) {
      if (!toHash.claim(sha)) {
        const f = failed.get(sha);
        if (f && f.paths.length < 3) f.paths.push(showEntryPath(step.entry));
        continue;
      }
      const got = await rehashObject(store, sha);
      const fails = (problem: (named: string) => string) => failed.set(sha, { paths: [showEntryPath(step.entry)], problem });
      // Missing: said once, with the store (the store's own message names the object again).
      if (got.error !== undefined) fails((named) => (got.missing ? `${named}: missing from ${store.location}` : `${named}: ${got.error}`));
      else {
        verdict.objects++;
        verdict.bytes += got.bytes;
        if (got.sha256 !== sha) fails((named) => `${named}: its bytes hash to ${got.sha256}: changed in the store`);
        else if (got.bytes !== size) fails((named) => `${named}: ${got.bytes} bytes, the manifest says ${size}`);
      }
      progress();
    }
  });
  for (const [sha, f] of failed) problems.push(f.problem(`object ${sha} (${f.paths.join(', ')})`));
  if (again !== null) problems.push(again);
  return verdict;
}
