// The last walk's order (supervisor/checkpoint/walk-order.ts): whatever order the next walk takes,
// find(path) answers exactly what the lookup by key does, and an unchanged walk is answered by
// the order alone.
import { describe, expect, it } from 'vitest';
import { SeedOverlay } from '../../../../supervisor/checkpoint/hints.js';
import type { CapturedEntry } from '../../../../supervisor/checkpoint/passes.js';
import { WalkOrder } from '../../../../supervisor/checkpoint/walk-order.js';
import { seededRandom } from '../../../helpers/random.js';

const entry = (key: string) => ({ key, type: 'file' }) as unknown as CapturedEntry;
/** A path of 1-3 names of bytes 1-255 but '/' (latin1 keys of any byte). */
function randomPath(next: () => number): Buffer {
  const names = 1 + Math.floor(next() * 3);
  const bytes: number[] = [];
  for (let n = 0; n < names; n++) {
    if (n > 0) bytes.push(0x2f);
    const len = 1 + Math.floor(next() * 6);
    for (let i = 0; i < len; i++) {
      const b = next() < 0.7 ? 0x61 + Math.floor(next() * 4) : 1 + Math.floor(next() * 255);
      bytes.push(b === 0x2f ? 0x2e : b);
    }
  }
  return Buffer.from(bytes);
}

describe('WalkOrder', () => {
  it('finds what the lookup by key finds, through walks with entries gone, new, moved and looked up twice, over a Map and a SeedOverlay', () => {
    const seed = Number(process.env.WALK_ORDER_SEED ?? Date.now() % 1_000_000);
    console.log(`walk order property seed ${seed} (WALK_ORDER_SEED=${seed} to repeat)`);
    const next = seededRandom(seed);
    for (let round = 0; round < 200; round++) {
      const base = new Map<string, CapturedEntry>();
      const size = Math.floor(next() * 60);
      for (let i = 0; i < size; i++) {
        const k = randomPath(next).toString('latin1');
        base.set(k, entry(k));
      }
      let from: Map<string, CapturedEntry> | SeedOverlay = base;
      if (next() < 0.3) {
        const overlay = new SeedOverlay(base);
        for (const k of [...base.keys()]) if (next() < 0.2) overlay.delete(k);
        for (let i = 0; i < 5; i++) {
          const k = randomPath(next).toString('latin1');
          overlay.set(k, entry(k));
        }
        from = overlay;
      }
      // The next walk: the last one's keys, some gone, some new, a few out of place, some twice.
      const walk: Buffer[] = [];
      for (const k of [...from.keys()]) {
        const r = next();
        if (r < 0.1) continue;
        if (r < 0.2) walk.push(randomPath(next));
        walk.push(Buffer.from(k, 'latin1'));
        if (r > 0.97 && walk.length > 1) walk.push(walk[Math.floor(next() * walk.length)]!);
      }
      for (let i = 0; i < walk.length; i++) {
        if (next() < 0.05) {
          const j = Math.floor(next() * walk.length);
          [walk[i], walk[j]] = [walk[j]!, walk[i]!];
        }
      }
      const order = new WalkOrder(from);
      for (const path of walk) expect(order.find(path)).toBe(from.get(path.toString('latin1')));
    }
  });

  it('answers an unchanged walk from the order alone, and one with entries gone or new from it again after each', () => {
    const base = new Map<string, CapturedEntry>();
    for (let i = 0; i < 1000; i++) base.set(`d${i >> 4}/f${i}`, entry(`d${i >> 4}/f${i}`));
    const same = new WalkOrder(base);
    for (const k of base.keys()) expect(same.find(Buffer.from(k))).toBe(base.get(k));
    expect(same.inOrder).toBe(1000);
    // Every 10th entry gone, a new one after every 100th: each costs one lookup by key.
    const changed = new WalkOrder(base);
    let walked = 0;
    for (const [i, k] of [...base.keys()].entries()) {
      if (i % 10 === 5) continue;
      expect(changed.find(Buffer.from(k))).toBe(base.get(k));
      walked++;
      if (i % 100 === 0) expect(changed.find(Buffer.from(`${k}-new`))).toBeUndefined();
    }
    expect(walked).toBe(900);
    expect(changed.inOrder).toBe(900 - 100);
  });
});
