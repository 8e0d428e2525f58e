// What the checkpoint thread trusts across checkpoints (git's index, for checkpoints): per
// workspace, its last read-back checkpoint's entries with the stat each was captured at (an
// unchanged one is not read again: passes.ts); per store, the objects the read-back re-hashed
// with their files' stat (checkpoint.readBack). In memory only: a restart reads all again.
import { racyMarginNs } from '../../core/fs/granule.js';
import type { CapturedEntry } from './passes.js';
import type { DirTree } from './trees.js';

/** What a capture seeds its first pass with: entries by path (latin1 of the bytes), the root's stat signature, and its file system's st_dev and mount id (/proc/self/fdinfo mnt_id: a new one at every mount; either differs: the seed is not used). */
export interface CaptureSeed {
  entries: Map<string, CapturedEntry>;
  /** Each directory's tree (trees.ts): kept when its members are these same entries. */
  trees?: Map<string, DirTree>;
  /** The store those trees were checked in (its directory's and objects/'s device and inode: storeIdentity): another store, a copy put at its path say, trusts none of them. */
  storeId?: string;
  rootSig: string;
  rootFs: string;
  /** What the manifest step derived from these entries (capture-worker.ts objectsOf): each object once with the first entry using it, their bytes, the mount points; reused by a capture that keeps them all. */
  objects?: { byId: Map<string, CapturedEntry>; bytes: number; mounts: string[] };
  /** The boundary of the checkpoint these entries are from (manifest `boundary`): the workspace journal's paths with later events are what changed since (hints.ts). Null: it had a gap. */
  boundary: { epoch: string; seq: number } | null;
}

interface Offer {
  root: string;
  seed: CaptureSeed;
}

/** Per workspace root: the last read-back checkpoint's entries. At most one offer waits for its read-back. */
export class StatCache {
  private readonly byRoot = new Map<string, CaptureSeed>();
  private offered: { id: string; offer: Offer } | null = null;

  /** The seed for a capture of root, or undefined (none yet, or dropped). */
  seed(root: string): CaptureSeed | undefined {
    return this.byRoot.get(root);
  }

  /**
   * A capture's result, offered under its manifest id: it becomes root's seed only when that
   * manifest's read-back passes (confirm). Entries whose ctime is not racyMarginNs before
   * startedAtNs (wall clock, ns, taken before the capture looked at any entry) are left out,
   * but the vetted ones (these very captures read past their margin, hints.ts: a later read of
   * the same path is another entry, not vetted), and entries that moved while
   * read: they are read again.
   */
  offer(
    id: string,
    root: string,
    entries: CapturedEntry[],
    trees: { dirs: Map<string, DirTree>; storeId: string },
    capture: {
      rootSig: string;
      rootFs: string;
      startedAtNs: bigint;
      vetted: ReadonlySet<CapturedEntry>;
      boundary: CaptureSeed['boundary'];
      /** The seed's entries, when the capture kept exactly those (one pass, nothing differed): kept as they are. */
      kept: Map<string, CapturedEntry> | null;
      /** What the manifest step derived from `entries` (kept with them only when every entry is). */
      objects: CaptureSeed['objects'];
    },
  ): void {
    const { rootSig, rootFs, startedAtNs, vetted, boundary } = capture;
    // The seed's entries passed this filter at their own offer, so they pass it now (a later start).
    let kept = capture.kept;
    if (!kept) {
      kept = new Map<string, CapturedEntry>();
      for (const e of entries) if ((e.ctimeNs + racyMarginNs(e.ctimeNs) < startedAtNs || vetted.has(e)) && !e.moved) kept.set(e.key, e);
    }
    // The derived listing holds for the seed only when the seed is every entry (a capture keeping the seed whole then reuses it).
    const objects = kept.size === entries.length ? capture.objects : undefined;
    this.offered = { id, offer: { root, seed: { entries: kept, trees: trees.dirs, storeId: trees.storeId, rootSig, rootFs, boundary, objects } } };
    // Until it is confirmed, no seed: a capture that failed its read-back is never trusted.
    this.byRoot.delete(root);
  }

  /** The read-back of manifest id: passed (its offer becomes the seed) or not (dropped). */
  confirm(id: string, passed: boolean): void {
    const o = this.offered;
    if (!o || o.id !== id) return;
    this.offered = null;
    if (passed) this.byRoot.set(o.offer.root, o.offer.seed);
  }
}

/** An object file's stat signature (inode, size, mtime, ctime): what a re-hash is trusted by until it moves. */
export type ObjectSig = string;

/** Per store directory: objects whose re-hash matched, and their files' stat then. */
export class VerifiedObjects {
  private readonly byStore = new Map<string, Map<string, ObjectSig>>();
  /** Entries at most (each ~150 bytes); past it, the oldest half is forgotten (re-hashed next time). */
  static readonly MAX = 2_000_000;

  has(store: string, sha256: string, sig: ObjectSig): boolean {
    return this.byStore.get(store)?.get(sha256) === sig;
  }

  add(store: string, sha256: string, sig: ObjectSig): void {
    let m = this.byStore.get(store);
    if (!m) this.byStore.set(store, (m = new Map()));
    if (m.size >= VerifiedObjects.MAX) {
      let n = m.size / 2;
      for (const k of m.keys()) {
        if (n-- <= 0) break;
        m.delete(k);
      }
    }
    m.set(sha256, sig);
  }

  forget(store: string, sha256: string): void {
    this.byStore.get(store)?.delete(sha256);
  }
}
