// What the checkpoint thread trusts across checkpoints (git's index, for checkpoints): per
// workspace, its last read-back checkpoint's entries with the stat each was captured at (an
// unchanged one is not read again: passes.ts), also kept on disk for the next thread or start
// (stat-cache-file.ts); per store, the objects the read-back re-hashed with their files' stat
// (checkpoint.readBack), in memory only.
import { closeSync, constants, openSync } from 'node:fs';
import { racyMarginNs } from '../../core/fs/granule.js';
import { loadStatCache, removeStatCache, saveStatCache, touchStatCache } from './stat-cache-file.js';
import { fsIdSurvivesRemount, type CapturedEntry } from './passes.js';
import type { DirTree } from './trees.js';
import type { SeedChanges } from './hints.js';

/** What a capture seeds its first pass with: entries by path (latin1 of the bytes), the root's stat signature, and its file system's id (passes.ts fsOf: st_dev and the mount's unique id with the boot id, a new one at every mount; any differs: the seed is not used). */
export interface CaptureSeed {
  entries: Map<string, CapturedEntry>;
  /** Each directory's tree (trees.ts): kept when its members are these same entries. */
  trees?: Map<string, DirTree>;
  /** The store those trees were checked in (its directory's and objects/'s device and inode: storeIdentity): another store, a copy put at its path say, trusts none of them. */
  storeId?: string;
  rootSig: string;
  rootFs: string;
  /** What the manifest step derived from these entries (capture-worker.ts objectsOf, objectsAfter): each object once with an entry using it, their bytes, the mount points; reused by a capture that keeps them all, updated by one that keeps them with the journal's paths over them. */
  objects?: { byId: Map<string, CapturedEntry>; bytes: number; mounts: string[] };
  /** The store and its removal generation when the capture of these entries committed (passes.ts presentIn): while no fan directory of that store lost a name since, every object they name is there. */
  presentIn?: { storeDir: string; gen: number };
  /** The boundary of the checkpoint these entries are from (manifest `boundary`): the workspace journal's paths with later events are what changed since (hints.ts). Null: it had a gap. */
  boundary: { epoch: string; seq: number } | null;
}

interface Offer {
  root: string;
  seed: CaptureSeed;
  /** Whether the disk's copy is already this seed's (the capture kept the seed's entries, read from there or written there). */
  onDisk: boolean;
  /** Its checkpoint's signing key (the disk's copy is signed with it) and the room the store must keep free. */
  signingKeyPem: string;
  reserveBytes: number;
}

/** A seed to write to disk once the read-back is answered (flush): the store's directory (its own fd, opened at confirm). */
interface PendingSave {
  storeFd: number;
  root: string;
  seed: CaptureSeed;
  signingKeyPem: string;
  reserveBytes: number;
}

/**
 * Per workspace root: the last read-back checkpoint's entries. At most one offer waits for its
 * read-back. The disk's copy (stat-cache-file.ts) follows: written after a read-back passed
 * (flush, in the thread's idle time once its answer is sent), removed when one failed, read at
 * the first capture of a root in this thread.
 */
export class StatCache {
  private readonly byRoot = new Map<string, CaptureSeed>();
  private offered: { id: string; offer: Offer } | null = null;
  /** Roots whose disk copy this thread has looked for (once each: after that, memory is newer). */
  private readonly looked = new Set<string>();
  /** The seeds on disk as this thread wrote or read them, by root. */
  private readonly onDisk = new Map<string, CaptureSeed>();
  private pending: PendingSave | null = null;

  /**
   * The seed for a capture of root, if any (none yet, or dropped). With a store (its fd) and
   * the signing key: at this thread's first capture of root, the disk's copy, when it is one
   * this key signed (a new thread, or a restart, starts from it); `rejected` says why a copy
   * there is not used.
   */
  seed(root: string, disk?: { storeFd: number; signingKeyPem: string; maxBytes?: number }): { seed?: CaptureSeed; rejected?: string } {
    const seed = this.byRoot.get(root);
    if (seed || !disk || this.looked.has(root)) return { seed };
    this.looked.add(root);
    const loaded = loadStatCache(disk.storeFd, root, disk.signingKeyPem, disk.maxBytes);
    if ('rejected' in loaded) return { rejected: loaded.rejected };
    if (!('seed' in loaded)) return {};
    this.byRoot.set(root, loaded.seed);
    this.onDisk.set(root, loaded.seed);
    return { seed: loaded.seed };
  }

  /**
   * A capture's result, offered under its manifest id: it becomes root's seed only when that
   * manifest's read-back passes (confirm). Files whose ctime is not racyMarginNs before
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
      presentIn: { storeDir: string; gen: number };
      /** The seed's entries, when the capture kept exactly those (one pass, nothing differed): kept as they are. */
      kept: Map<string, CapturedEntry> | null;
      /** The seed's entries and what the journal's paths changed over them (hints.ts SeedOverlay changes()), when the capture kept exactly that: the seed's map is updated in place (the seed is given up here anyway). */
      update: { seed: Map<string, CapturedEntry>; changes: SeedChanges } | null;
      /** What the manifest step derived from `entries` (kept with them only when every entry is). */
      objects: CaptureSeed['objects'];
      /** The checkpoint's signing key and the room to keep free in the store (for the disk's copy). */
      signingKeyPem: string;
      reserveBytes: number;
    },
  ): void {
    const { rootSig, rootFs, startedAtNs, vetted, boundary, presentIn } = capture;
    // A write still waiting for root (flush runs in the thread's idle time) is of the seed this
    // capture compared with, which the update below changes in place: never written now. This
    // offer's read-back writes its own, or removes the copy.
    if (this.pending?.root === root) this.dropPending();
    // The seed's entries passed this filter at their own offer, so they pass it now (a later start).
    // Only a file's content is captured beyond its stat; a directory's, link's or node's facts
    // are all in what the walk compares (the link's target read each time): never racy.
    const keeps = (e: CapturedEntry) => !e.moved && (e.type !== 'file' || e.ctimeNs + racyMarginNs(e.ctimeNs) < startedAtNs || vetted.has(e));
    let kept = capture.kept;
    if (!kept && capture.update) {
      // The seed's map, with what changed since: a checkpoint after a few changes does not build it from every entry (~60 ms at 100,000).
      kept = capture.update.seed;
      const { hidden, set } = capture.update.changes;
      for (const k of hidden) kept.delete(k);
      for (const [k, e] of set) if (keeps(e)) kept.set(k, e);
    }
    if (!kept) {
      kept = new Map<string, CapturedEntry>();
      for (const e of entries) if (keeps(e)) kept.set(e.key, e);
    }
    // The derived listing holds for the seed only when the seed is every entry (a capture keeping the seed whole then reuses it).
    const objects = kept.size === entries.length ? capture.objects : undefined;
    // The disk's copy holds these same entries when the capture kept the seed's whole and it was
    // the one on disk (its root and trees unchanged with them: one pass found it exactly).
    const onDisk = capture.kept !== null && this.onDisk.get(root)?.entries === capture.kept;
    if (!onDisk) this.onDisk.delete(root);
    this.offered = {
      id,
      offer: {
        root,
        seed: { entries: kept, trees: trees.dirs, storeId: trees.storeId, rootSig, rootFs, boundary, objects, presentIn },
        onDisk,
        signingKeyPem: capture.signingKeyPem,
        reserveBytes: capture.reserveBytes,
      },
    };
    // Until it is confirmed, no seed: a capture that failed its read-back is never trusted.
    this.byRoot.delete(root);
  }

  /**
   * The read-back of manifest id, in the store storeFd: passed (its offer becomes the seed, and
   * is written to disk at flush) or not (dropped, and the disk's copy removed now: nothing the
   * thread had is trusted).
   */
  confirm(id: string, passed: boolean, storeFd?: number): void {
    const o = this.offered;
    if (!o || o.id !== id) return;
    this.offered = null;
    const { root, seed } = o.offer;
    if (passed) {
      this.byRoot.set(root, seed);
      // The copy there marked used (kept past MAX_STAT_CACHE_FILES); gone (removed, pushed out): written again.
      if (o.offer.onDisk && storeFd !== undefined && touchStatCache(storeFd, root)) this.onDisk.set(root, seed);
      else if (storeFd !== undefined) this.saveLater(storeFd, o.offer);
      return;
    }
    this.onDisk.delete(root);
    if (storeFd === undefined) return;
    try {
      removeStatCache(storeFd, root);
    } catch {
      // a store that cannot be changed: its copy is of the last read-back that passed, and only ever read again
    }
  }

  /**
   * Forgets root's seed and removes its copy on disk (a capture failed on it: capture-worker.ts
   * runCheckpoint); the next capture of root reads every file. Errors removing the copy are
   * ignored: a copy left is only read again, and fails the same way only if it is the cause.
   */
  drop(root: string, storeFd: number): void {
    if (this.pending?.root === root) this.dropPending();
    this.byRoot.delete(root);
    this.onDisk.delete(root);
    if (this.offered?.offer.root === root) this.offered = null;
    try {
      removeStatCache(storeFd, root);
    } catch {
      // a store that cannot be changed
    }
  }

  private saveLater(storeFd: number, offer: Offer): void {
    // Another root's write still waiting is done now; this root's was dropped at its offer.
    if (this.pending && this.pending.root !== offer.root) this.flush();
    this.dropPending();
    // Under a mount id that a later mount may reuse, a copy could be taken for another image's files: none is kept.
    if (!fsIdSurvivesRemount(offer.seed.rootFs)) return;
    try {
      // Its own fd: the supervisor's may be closed by the time the answer is sent.
      const fd = openSync(`/proc/self/fd/${storeFd}`, constants.O_RDONLY | constants.O_DIRECTORY);
      this.pending = { storeFd: fd, root: offer.root, seed: offer.seed, signingKeyPem: offer.signingKeyPem, reserveBytes: offer.reserveBytes };
    } catch {
      // no store to write in: the next start reads every file
    }
  }

  private dropPending(): void {
    if (this.pending) closeSync(this.pending.storeFd);
    this.pending = null;
  }

  /**
   * Writes the seed confirmed last to disk (called in the thread's idle time after its read-back
   * was answered, or at the stop's barrier: the write is not on any checkpoint's path). Returns
   * its bytes; 0 when there was none to write or it was not written (the store's file system
   * short of the room to keep free, or an error), and then root has no copy on disk: the next
   * thread or start reads every file of it.
   */
  flush(): number {
    const p = this.pending;
    if (!p) return 0;
    this.pending = null;
    try {
      const bytes = saveStatCache(p.storeFd, p.root, p.seed, p.signingKeyPem, p.reserveBytes);
      if (bytes > 0) this.onDisk.set(p.root, p.seed);
      return bytes;
    } catch {
      try {
        removeStatCache(p.storeFd, p.root);
      } catch {
        // nothing more to do
      }
      return 0;
    } finally {
      closeSync(p.storeFd);
    }
  }
}

/** An object file's stat signature (inode, size, mtime, ctime): what a re-hash is trusted by until it moves. */
export type ObjectSig = string;

/** Per store directory: objects whose re-hash matched, and their files' stat then. */
export class VerifiedObjects {
  private readonly byStore = new Map<string, Map<string, ObjectSig>>();
  /** Entries at most (each ~110 bytes: a map slot and a 41-byte flat signature, local-store.ts objectSig; the digest is the entry's own string); past it, the oldest half is forgotten (re-hashed next time). */
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
