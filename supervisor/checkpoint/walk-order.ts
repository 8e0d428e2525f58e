// The last walk's entries in the order it found them, for the next walk of the same tree: an
// unchanged tree is walked in the same order (the walk lists each directory's names sorted by
// their bytes), so the entry after the last one found is tried first, its key compared with the
// path's bytes in place; the lookup by key (a new latin1 string hashed per entry) only when not.
import type { ListedRow } from '../../core/fs/walk.js';
import { SeedOverlay } from './hints.js';
import type { CapturedEntry } from './passes.js';

/** Entries past the expected one looked through for the one a lookup found (entries gone in between), before the order is given up until the next match. */
const RESYNC_AHEAD = 16;

/**
 * What `from` holds, found by path in walk order. `find(path)` answers exactly what
 * `from.get(path.toString('latin1'))` answers, in the order-following case without making the
 * string. `from` must not change while it is used (taken whole at construction: two arrays of
 * its size, 16 bytes an entry).
 */
export class WalkOrder {
  private readonly keys: string[] = [];
  private readonly entries: CapturedEntry[] = [];
  private cursor = 0;
  /** Lookups answered by the order (for tests and profiles); the rest went through `from`. */
  inOrder = 0;

  constructor(private readonly from: ReadonlyMap<string, CapturedEntry> | SeedOverlay) {
    const take = (k: string, e: CapturedEntry) => {
      this.keys.push(k);
      this.entries.push(e);
    };
    if (from instanceof SeedOverlay) from.forEachInOrder(take);
    else from.forEach((e, k) => take(k, e));
  }

  /** The entry next in the last walk's order when its key is the listed row's path (its bytes compared in place, no path made), else undefined; the order stays where it is until advance(). */
  next(row: ListedRow): CapturedEntry | undefined {
    const at = this.cursor;
    return at < this.keys.length && keyIsListed(this.keys[at]!, row) ? this.entries[at] : undefined;
  }

  /** Past the entry next() gave (taken as it is: find is not asked for it). */
  advance(): void {
    this.cursor++;
    this.inOrder++;
  }

  /** The entry keyed by path's bytes (latin1: a char per byte), or undefined. */
  find(path: Buffer): CapturedEntry | undefined {
    const at = this.cursor;
    if (at < this.keys.length && keyIs(this.keys[at]!, path)) {
      this.cursor = at + 1;
      this.inOrder++;
      return this.entries[at];
    }
    const key = path.toString('latin1');
    const found = this.from.get(key);
    if (found === undefined) return undefined;
    // Entries of the last walk gone since: the order goes on after the one found.
    const end = Math.min(this.keys.length, at + RESYNC_AHEAD);
    for (let j = at; j < end; j++) {
      if (this.keys[j] === key) {
        this.cursor = j + 1;
        break;
      }
    }
    return found;
  }
}

/** Whether key (latin1: a char per byte) is path's bytes; compared from the end, where siblings differ. */
function keyIs(key: string, path: Buffer): boolean {
  let i = path.length;
  if (key.length !== i) return false;
  while (i-- > 0) if (key.charCodeAt(i) !== path[i]) return false;
  return true;
}

/** Whether key is the listed row's path: its directory's path, '/', its name (ListedRow). */
function keyIsListed(key: string, row: ListedRow): boolean {
  const dir = row.dirRel;
  const names = row.names;
  const start = row.nameStart;
  const nameLen = row.nameEnd - start;
  const at = dir.length === 0 ? 0 : dir.length + 1;
  if (key.length !== at + nameLen) return false;
  for (let i = nameLen - 1; i >= 0; i--) if (key.charCodeAt(at + i) !== names[start + i]) return false;
  if (at === 0) return true;
  if (key.charCodeAt(at - 1) !== 0x2f) return false;
  for (let i = dir.length - 1; i >= 0; i--) if (key.charCodeAt(i) !== dir[i]) return false;
  return true;
}
