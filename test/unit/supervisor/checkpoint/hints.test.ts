// The seed overlay the look before the walk makes (supervisor/checkpoint/hints.ts SeedOverlay):
// the seed with changes over it, never copied, must answer as a copy of the seed changed the
// same way would (get, size, keys, forEachInOrder), and never write the seed.
import { describe, expect, it } from 'vitest';
import { SeedOverlay } from '../../../../supervisor/checkpoint/hints.js';
import type { CapturedEntry } from '../../../../supervisor/checkpoint/passes.js';
import { seededRandom } from '../../../helpers/random.js';

const entry = (key: string, n: number) => ({ key, type: 'file', size: n }) as unknown as CapturedEntry;

describe('SeedOverlay', () => {
  it('answers get, size and keys as a changed copy of the seed does, through random sets and deletes (also while iterating); the seed untouched', () => {
    const seed = Number(process.env.OVERLAY_SEED ?? Date.now() % 1_000_000);
    console.log(`seed overlay property seed ${seed} (OVERLAY_SEED=${seed} to repeat)`);
    const next = seededRandom(seed);
    for (let round = 0; round < 50; round++) {
      const base = new Map<string, CapturedEntry>();
      for (let i = 0; i < 40; i++) if (next() < 0.6) base.set(`k${i}`, entry(`k${i}`, i));
      const baseCopy = new Map(base);
      const copy = new Map(base);
      const overlay = new SeedOverlay(base);
      for (let op = 0; op < 60; op++) {
        const key = `k${Math.floor(next() * 50)}`;
        const r = next();
        if (r < 0.45) {
          const e = entry(key, 1000 + op);
          copy.set(key, e);
          overlay.set(key, e);
        } else if (r < 0.9) {
          copy.delete(key);
          overlay.delete(key);
        } else {
          // Delete every key under a prefix while iterating (as removeUnderGone does).
          const prefix = key.slice(0, 2);
          for (const k of overlay.keys()) if (k.startsWith(prefix)) overlay.delete(k);
          for (const k of [...copy.keys()]) if (k.startsWith(prefix)) copy.delete(k);
        }
        expect(overlay.size).toBe(copy.size);
      }
      for (let i = 0; i < 50; i++) expect(overlay.get(`k${i}`)).toBe(copy.get(`k${i}`));
      expect([...overlay.keys()].sort()).toEqual([...copy.keys()].sort());
      expect(new Set(overlay.keys()).size).toBe(overlay.size); // each key once
      // forEachInOrder: the same keys and entries, the seed's kept in the seed's order.
      const visited: [string, CapturedEntry][] = [];
      overlay.forEachInOrder((k, e) => visited.push([k, e]));
      expect(new Map(visited)).toEqual(copy);
      expect(visited.length).toBe(copy.size);
      const seedOrder = [...base.keys()].filter((k) => copy.has(k));
      expect(visited.map(([k]) => k).filter((k) => base.has(k))).toEqual(seedOrder);
      expect(base).toEqual(baseCopy);
    }
  });
});
