// Seeded randomness for tests: a run logs its seed, and the same seed replays the same plan.
// Owns the generator only; each test names its own seed variable.

/** mulberry32: a small seeded generator of floats in [0, 1) (period 2^32). */
export function seededRandom(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
