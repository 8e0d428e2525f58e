// The object list of a checkpoint (in the checkpoint thread): each object its entries name,
// once, with an entry naming it (the path a read-back problem or an upload shows), their bytes,
// and the mount points skipped. Derived from every entry, or, after a few changes, the seed's
// list updated for what changed (the stat cache keeps it with the seed: stat-cache.ts).
import { fsDecode, nameText } from '../../core/fs/names.js';
import type { SeedChanges } from './hints.js';
import { pathOf, type CapturedEntry } from './passes.js';
import type { CaptureSeed } from './stat-cache.js';

/** The entries' objects, each once with the first entry using it, their bytes, and the mount points (paths as text, in the entries' order). */
export function objectsOf(entries: readonly CapturedEntry[]): NonNullable<CaptureSeed['objects']> {
  const byId = new Map<string, CapturedEntry>();
  const mounts: string[] = [];
  let bytes = 0;
  for (const e of entries) {
    if (e.type === 'file' && e.sha256 !== undefined && !byId.has(e.sha256)) {
      byId.set(e.sha256, e);
      bytes += e.size;
    }
    if (e.mount) mounts.push(nameText(fsDecode(pathOf(e))));
  }
  return { byId, bytes, mounts };
}

/**
 * The seed's object list updated in place for what changed over the seed's entries (`base`;
 * hints.ts SeedOverlay changes()), so
 * that a checkpoint after a few changes does not derive it from every entry (~60 ms at 100,000):
 * each object hidden with the entry naming it is named by another entry using it, or is gone.
 * Undefined, with nothing touched, when a mount point is among the changes (the mount list
 * keeps the walk's order) or there is no seed list. entries: the capture's, exactly
 * seed + overlay.
 */
export function objectsAfter(
  listing: CaptureSeed['objects'],
  base: ReadonlyMap<string, CapturedEntry>,
  { hidden, set }: SeedChanges,
  entries: readonly CapturedEntry[],
): CaptureSeed['objects'] {
  if (!listing) return undefined;
  for (const k of hidden) if (base.get(k)!.mount) return undefined;
  for (const e of set.values()) if (e.mount) return undefined;
  const { byId } = listing;
  let bytes = listing.bytes;
  /** Objects whose naming entry was hidden: named again below by an entry using them, or gone. */
  const unnamed = new Set<string>();
  for (const k of hidden) {
    const old = base.get(k)!;
    if (old.type !== 'file' || old.sha256 === undefined || byId.get(old.sha256) !== old) continue;
    byId.delete(old.sha256);
    bytes -= old.size;
    unnamed.add(old.sha256);
  }
  const name = (e: CapturedEntry) => {
    if (e.type !== 'file' || e.sha256 === undefined || byId.has(e.sha256)) return;
    byId.set(e.sha256, e);
    bytes += e.size;
    unnamed.delete(e.sha256);
  };
  for (const e of set.values()) name(e);
  // Another entry with the same content (one pass, only when an object lost its name).
  if (unnamed.size > 0) for (const e of entries) if (e.type === 'file' && e.sha256 !== undefined && unnamed.has(e.sha256)) name(e);
  listing.bytes = bytes;
  return listing;
}
