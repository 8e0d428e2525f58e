// The read before the walk (in the checkpoint thread): the paths the workspace journal says had
// events since the seed's checkpoint are looked at (and their files read into the store) before
// the first walk, so that walk finds them as captured and is the only one (passes.ts). Owns
// that look; a hint that cannot be followed safely is dropped, never trusted: the walk decides.
import { closeSync, constants, fstatSync, lstatSync, openSync, readlinkSync, type BigIntStats } from 'node:fs';
import { openDirAt, pathAt, ScanError, statFacts, typeOf, walkTree, type WalkEntry } from '../../core/fs/walk.js';
import { errnoCode } from '../../ipc/errno.js';
import type { CapturedEntry } from './passes.js';

/*
 * Why one walk then proves a still instant: every entry the walk keeps was unchanged from its
 * capture to the walk's look at it. A seed entry was captured before this capture began, an
 * entry looked at here before the walk began, so every such interval holds the instant between
 * this look and the walk. A file read here counts only if its ctime was a racy margin before
 * the read began (core/fs/granule.ts): a write after the read then moves its ctime, which the
 * walk sees. Directories are not read here (the walk lists each one): their stat is enough.
 */

/** The entries a walk compares with, by key (passes.ts): a Map, or the seed with what this look found over it (SeedOverlay). */
export interface EntryLookup {
  get(key: string): CapturedEntry | undefined;
  readonly size: number;
  keys(): IterableIterator<string>;
}

/** What a SeedOverlay changes in its seed: the seed's keys hidden (replaced by set() or delete()d), and the entries set, by key (some new to the seed). */
export interface SeedChanges {
  hidden: string[];
  set: ReadonlyMap<string, CapturedEntry>;
}

/**
 * The seed with changes over it, never copied (a copy of 100,000 entries cost ~70 ms of a
 * checkpoint after 10 changes): an entry set() hides the seed's under its key, one delete()d is
 * gone. The seed itself is never written.
 */
export class SeedOverlay implements EntryLookup {
  private readonly over = new Map<string, CapturedEntry>();
  private readonly removed = new Set<string>();
  /** Keys set here that the seed does not have. */
  private added = 0;

  constructor(readonly base: ReadonlyMap<string, CapturedEntry>) {}

  get(key: string): CapturedEntry | undefined {
    const v = this.over.get(key);
    if (v !== undefined) return v;
    return this.removed.has(key) ? undefined : this.base.get(key);
  }

  set(key: string, value: CapturedEntry): void {
    if (!this.removed.delete(key) && !this.over.has(key) && !this.base.has(key)) this.added++;
    this.over.set(key, value);
  }

  delete(key: string): void {
    const wasOver = this.over.delete(key);
    if (this.base.has(key)) this.removed.add(key);
    else if (wasOver) this.added--;
  }

  get size(): number {
    return this.base.size - this.removed.size + this.added;
  }

  /** What differs from the seed (made on each call). */
  changes(): SeedChanges {
    const hidden = [...this.removed];
    for (const k of this.over.keys()) if (this.base.has(k)) hidden.push(k);
    return { hidden, set: this.over };
  }

  /** Every key and its entry: the seed's in the seed's order (one set here in its place, one deleted left out), then those new to the seed. */
  forEachInOrder(visit: (key: string, entry: CapturedEntry) => void): void {
    const over = this.over;
    const removed = this.removed;
    const base = this.base;
    for (const [k, e] of base) {
      if (over.size > 0) {
        const v = over.get(k);
        if (v !== undefined) {
          visit(k, v);
          continue;
        }
      }
      if (removed.size === 0 || !removed.has(k)) visit(k, e);
    }
    if (this.added > 0) for (const [k, v] of over) if (!base.has(k)) visit(k, v);
  }

  *keys(): IterableIterator<string> {
    // Collected first: a caller may delete() while it iterates.
    const over = [...this.over.keys()];
    yield* over;
    for (const k of this.base.keys()) if (!this.over.has(k) && !this.removed.has(k)) yield k;
  }
}

/** What the first walk compares with, and what this look did. */
export interface HintedSeed {
  /** The seed with each hinted path as it is now (gone ones, and all under them, removed). */
  entries: SeedOverlay;
  /** The root's fstat, taken after the hinted paths. */
  rootSt: BigIntStats;
  /** The entries of files read here past their racy margin (these very captures: one read again later is another): the stat cache may keep them. */
  vetted: Set<CapturedEntry>;
}

/** The longest wait for a just-written file's racy margin to pass before it is read again; past it, the walk reads it (and a second walk follows). */
const RACY_WAIT_MAX_MS = 250;
const OPEN_ROOT = constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW | constants.O_NONBLOCK;
const SLASH = 0x2f;
/** Deeper hinted paths are left to the walk (each costs an open per directory on its way). */
const MAX_HINT_DEPTH = 256;
const sleeper = new Int32Array(new SharedArrayBuffer(4));

/** What the look needs of the capture (passes.ts Capture). */
export interface HintCapture {
  /** The entry captured now (a file read into the store); null: could not, or it went (left to the walk). */
  entry(e: WalkEntry): CapturedEntry | null;
  /** When the racy margin of a file it read ends (wall clock, ns), if it was read within it (Capture.racy). */
  racyUntil(c: CapturedEntry): bigint | undefined;
  /** Whether walked entry e is as c was captured (passes.ts sameAsCaptured). */
  same(c: CapturedEntry, e: WalkEntry): boolean;
  /** Throws ScanError scan_timeout past the capture's deadline. */
  checkDeadline(): void;
}

/**
 * Looks at each hinted path (bytes, relative to root) through directory fds, never through a
 * link or onto another file system, and captures it (cap.entry). Null when the root cannot be
 * opened (the walk says why). Throws what the capture throws (the store's errors, the deadline).
 */
export function readHinted(root: string, hints: readonly Buffer[], seed: ReadonlyMap<string, CapturedEntry>, cap: HintCapture): HintedSeed | null {
  let rootFd: number;
  try {
    rootFd = openSync(root, OPEN_ROOT);
  } catch {
    return null;
  }
  const entries = new SeedOverlay(seed);
  const vetted = new Set<CapturedEntry>();
  let rootDev: bigint;
  try {
    rootDev = fstatSync(rootFd, { bigint: true }).dev;
  } catch {
    closeSync(rootFd);
    return null;
  }
  /** Directories on the way already captured (each once, however many hints pass through it). */
  const seenDirs = new Set<string>();
  /** Files read within their racy margin from walkIn (read again with the hinted ones). */
  const later: { rel: Buffer; readyAtNs: bigint }[] = [];
  /** Entries captured by record() (keys). */
  const recorded = new Set<string>();
  /** Directories found gone: everything under each is removed once, at the end (one pass over the entries, however many). */
  const goneDirs = new Set<string>();
  const removeTree = (key: string) => {
    const was = entries.get(key);
    entries.delete(key);
    if (was?.type === 'dir') goneDirs.add(key);
  };
  const removeUnderGone = () => {
    if (goneDirs.size === 0) return;
    for (const k of entries.keys()) {
      for (let i = k.indexOf('/'); i >= 0; i = k.indexOf('/', i + 1)) {
        if (goneDirs.has(k.slice(0, i))) {
          entries.delete(k);
          break;
        }
      }
    }
  };
  /** One hinted path; the racy file it read (to be read again once past its margin), else null. */
  const look = (rel: Buffer, again = false): { rel: Buffer; readyAtNs: bigint } | null => {
    const names = split(rel);
    if (names === null || names.length > MAX_HINT_DEPTH) return null;
    // Looked at already (under a directory walked in, or named twice): once is enough, but after a racy read.
    if (!again && recorded.has(rel.toString('latin1'))) return null;
    // Each directory on the way opened from its parent's fd (never a link, never another file
    // system), closed once this path is done: fds never pile up, however deep or many.
    const opened: number[] = [];
    try {
      let dirFd = rootFd;
      let end = 0; // where names[i] ends in rel
      for (let i = 0; i < names.length - 1; i++) {
        end += (i > 0 ? 1 : 0) + names[i].length;
        const path = rel.subarray(0, end);
        const key = path.toString('latin1');
        let fd: number;
        let st: BigIntStats;
        try {
          fd = openDirAt(dirFd, names[i]);
          opened.push(fd);
          st = fstatSync(fd, { bigint: true });
        } catch (err) {
          if (!ordinary(err)) throw err;
          return null;
        }
        if (st.dev !== rootDev) return null;
        if (!seenDirs.has(key)) {
          seenDirs.add(key);
          const c = cap.entry(walkEntry(path, names[i], i + 1, st, null, dirFd));
          if (c) entries.set(key, c);
        }
        dirFd = fd;
      }
      return lookAt(rel, names, dirFd);
    } finally {
      for (const fd of opened) closeSync(fd);
    }
  };
  /** The hinted entry itself, in its directory dirFd. */
  const lookAt = (rel: Buffer, names: Buffer[], dirFd: number): { rel: Buffer; readyAtNs: bigint } | null => {
    const name = names[names.length - 1];
    const key = rel.toString('latin1');
    let st: BigIntStats;
    try {
      st = lstatSync(pathAt(dirFd, name), { bigint: true });
    } catch (err) {
      if (errnoCode(err) === 'ENOENT') removeTree(key);
      else if (!ordinary(err)) throw err;
      return null;
    }
    const type = typeOf(st);
    if (type === 'dir') {
      if (seenDirs.has(key)) return null; // looked at on the way to another path
      seenDirs.add(key);
      let fd: number;
      try {
        fd = openDirAt(dirFd, name);
      } catch (err) {
        if (!ordinary(err)) throw err;
        return null;
      }
      try {
        st = fstatSync(fd, { bigint: true });
        if (st.dev !== rootDev) return null; // a mount point: the walk's
        const c = cap.entry(walkEntry(rel, name, names.length, st, null, dirFd));
        if (c) entries.set(key, c);
        // Not the directory the seed had here (made, moved or renamed here): what is in it had
        // no events of its own, so it is walked now too.
        const old = seed.get(key);
        if (old?.type !== 'dir' || old.ino !== st.ino) walkIn(rel, names.length, fd);
      } finally {
        closeSync(fd);
      }
      return null;
    }
    return record(walkEntry(rel, name, names.length, st, null, dirFd), key);
  };
  /** Files of the seed by inode (made when a directory is walked in): one moved with its directory is the same file, not read again. */
  let byIno: Map<bigint, CapturedEntry> | null = null;
  /** Everything under a directory not the seed's (fd: it, opened), captured; a file the seed has under another path with the same stat is kept as it was captured. */
  const walkIn = (rel: Buffer, depth: number, fd: number): void => {
    if (!byIno) {
      byIno = new Map();
      for (const c of seed.values()) if (c.type === 'file' && !c.moved) byIno.set(c.ino, c);
    }
    const prefix = Buffer.concat([rel, Buffer.from('/')]);
    try {
      // Through the directory's fd (the magic link is not the last component: "." is, so
      // O_NOFOLLOW holds), one file system, every fd closed when the walk ends.
      for (const e of walkTree(`/proc/self/fd/${fd}/.`, { oneFileSystem: true })) {
        const path = Buffer.concat([prefix, e.path]);
        const key = path.toString('latin1');
        cap.checkDeadline();
        const sub: WalkEntry = { ...e, path, depth: e.depth + depth };
        if (sub.type === 'dir') seenDirs.add(key);
        const old = sub.type === 'file' ? byIno.get(sub.ino) : undefined;
        if (old && cap.same(old, sub)) {
          // Kept as captured, under its new path: its manifest bytes (passes.ts jsonBytes) were its old path's.
          const { jsonBytes: _oldPathBytes, ...captured } = old;
          entries.set(key, { ...captured, key });
          continue;
        }
        const racy = record(sub, key);
        if (racy) later.push(racy);
      }
    } catch (err) {
      if (!(err instanceof ScanError) || !ordinary(err)) throw err;
      // Left to the walk, which meets the same entry.
    }
  };
  /** Captures one entry e (keyed key; a file read); the racy file it read, else null. */
  const record = (e: WalkEntry, key: string): { rel: Buffer; readyAtNs: bigint } | null => {
    recorded.add(key);
    let entry = e;
    if (e.type === 'symlink' && e.linkTarget === null) {
      try {
        entry = { ...e, linkTarget: readlinkSync(pathAt(e.dirFd, e.name), { encoding: 'buffer' }) };
      } catch (err) {
        if (!ordinary(err)) throw err;
        return null;
      }
    }
    const c = cap.entry(entry);
    if (!c || c.moved) return null;
    if (c.type === 'file') {
      const readyAtNs = cap.racyUntil(c);
      if (readyAtNs !== undefined) return { rel: e.path, readyAtNs };
      vetted.add(c);
    }
    entries.set(key, c);
    return null;
  };
  try {
    const racy: { rel: Buffer; readyAtNs: bigint }[] = [];
    for (const rel of hints) {
      cap.checkDeadline();
      const r = look(rel);
      if (r) racy.push(r);
    }
    for (const r of later) racy.push(r);
    // Written just now: read again once a later write would move the ctime (a short wait, where a walk costs more).
    if (racy.length > 0) {
      const readyAtNs = racy.reduce((m, r) => (r.readyAtNs > m ? r.readyAtNs : m), 0n);
      const waitMs = Number(readyAtNs - BigInt(Date.now()) * 1_000_000n) / 1e6 + 1;
      if (waitMs <= RACY_WAIT_MAX_MS) {
        if (waitMs > 0) Atomics.wait(sleeper, 0, 0, waitMs);
        for (const r of racy) look(r.rel, true); // still racy: left to the walk
      }
    }
    removeUnderGone();
    return { entries, rootSt: fstatSync(rootFd, { bigint: true }), vetted };
  } finally {
    closeSync(rootFd);
  }
}

/** A path's names; null when one is empty, "." or ".." (no hint names such a path). */
function split(rel: Buffer): Buffer[] | null {
  const names: Buffer[] = [];
  let start = 0;
  for (let i = 0; i <= rel.length; i++) {
    if (i < rel.length && rel[i] !== SLASH) continue;
    const name = rel.subarray(start, i);
    if (name.length === 0 || (name.length === 1 && name[0] === 0x2e) || (name.length === 2 && name[0] === 0x2e && name[1] === 0x2e)) return null;
    names.push(name);
    start = i + 1;
  }
  return names;
}

function walkEntry(path: Buffer, name: Buffer, depth: number, st: BigIntStats, linkTarget: Buffer | null, dirFd: number): WalkEntry {
  return { path, name, depth, type: typeOf(st), ...statFacts(st), linkTarget, dirFd };
}

/** An error that only means this hint is not followed (the walk meets the same entry and decides): gone, swapped (EINVAL: readlink of what is no longer a link), unreadable, out of fds. */
function ordinary(err: unknown): boolean {
  const code = errnoCode(err);
  return (
    code === 'ENOENT' ||
    code === 'ENOTDIR' ||
    code === 'ELOOP' ||
    code === 'EACCES' ||
    code === 'EPERM' ||
    code === 'ENAMETOOLONG' ||
    code === 'EINVAL' ||
    code === 'EMFILE' ||
    code === 'ENFILE'
  );
}
