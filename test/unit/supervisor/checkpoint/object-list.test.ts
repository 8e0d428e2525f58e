// The object list updated for what changed (supervisor/checkpoint/object-list.ts objectsAfter):
// after any changes over the seed, the same objects and bytes as the list derived from every
// entry (objectsOf), each named by an entry that uses it; a mount point among the changes: no
// update, the seed's list untouched.
import { describe, expect, it } from 'vitest';
import { SeedOverlay } from '../../../../supervisor/checkpoint/hints.js';
import { objectsAfter, objectsOf } from '../../../../supervisor/checkpoint/object-list.js';
import type { CapturedEntry } from '../../../../supervisor/checkpoint/passes.js';
import { seededRandom } from '../../../helpers/random.js';

/** A file of content c (its digest and size follow from c, so equal contents share an object), or a directory. */
const file = (key: string, c: number) => ({ key, type: 'file', sha256: `${c}`.padStart(64, '0'), size: 100 + c }) as unknown as CapturedEntry;
const dir = (key: string, mount = false) => ({ key, type: 'dir', size: 0, ...(mount ? { mount: true } : {}) }) as unknown as CapturedEntry;

describe('objectsAfter', () => {
  it('after random sets and deletes over the seed (contents shared by several files), lists what objectsOf lists, each object named by an entry using it', () => {
    const seed = Number(process.env.OBJECT_LIST_SEED ?? Date.now() % 1_000_000);
    console.log(`object list property seed ${seed} (OBJECT_LIST_SEED=${seed} to repeat)`);
    const next = seededRandom(seed);
    const pick = (n: number) => Math.floor(next() * n);
    for (let round = 0; round < 200; round++) {
      const base = new Map<string, CapturedEntry>();
      for (let i = 0; i < 30; i++) if (next() < 0.7) base.set(`k${i}`, next() < 0.2 ? dir(`k${i}`) : file(`k${i}`, pick(12)));
      const seedEntries = [...base.values()];
      const listing = objectsOf(seedEntries);
      const overlay = new SeedOverlay(base);
      const ops = pick(8);
      for (let op = 0; op < ops; op++) {
        const key = `k${pick(36)}`;
        if (next() < 0.5) overlay.set(key, next() < 0.15 ? dir(key) : file(key, pick(12)));
        else overlay.delete(key);
      }
      // The capture's entries: the overlay's, in some order.
      const entries = [...overlay.keys()].map((k) => overlay.get(k)!).sort(() => next() - 0.5);
      const want = objectsOf(entries);
      const got = objectsAfter(listing, base, overlay.changes(), entries);
      expect(got).toBe(listing); // updated in place
      expect([...got!.byId.keys()].sort()).toEqual([...want.byId.keys()].sort());
      expect(got!.bytes).toBe(want.bytes);
      for (const [sha, e] of got!.byId) {
        expect(entries).toContain(e);
        expect(e.sha256).toBe(sha);
      }
    }
  });

  it('a mount point among the changes, or no seed list: undefined, the seed list untouched', () => {
    const base = new Map<string, CapturedEntry>([
      ['a', file('a', 1)],
      ['m', dir('m', true)],
    ]);
    const listing = objectsOf([...base.values()]);
    expect(listing.mounts).toEqual(['m']);
    const gone = new SeedOverlay(base);
    gone.delete('m');
    gone.delete('a');
    expect(objectsAfter(listing, base, gone.changes(), [])).toBeUndefined();
    const added = new SeedOverlay(base);
    added.set('n', dir('n', true));
    added.delete('a');
    expect(objectsAfter(listing, base, added.changes(), [base.get('m')!, added.get('n')!])).toBeUndefined();
    expect([...listing.byId.keys()]).toEqual([file('a', 1).sha256]);
    expect(listing.bytes).toBe(101);
    expect(objectsAfter(undefined, base, gone.changes(), [])).toBeUndefined();
  });
});
