// The compact set of SHA-256 digests a walk of a checkpoint's trees keeps (core/checkpoint/digest-set.ts):
// it answers as a Set of the hex digests would, through its growth, for the all-zero key too.
import { createHash, randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { DigestSet } from '../../../../core/checkpoint/digest-set.js';
import { seededRandom } from '../../../helpers/random.js';

describe('DigestSet', () => {
  it('agrees with a Set of hex digests over 50,000 adds with repeats, through every growth', () => {
    const seed = randomBytes(4).readUInt32BE(0);
    console.log(`digest-set seed ${seed}`);
    const random = seededRandom(seed);
    const set = new DigestSet();
    const plain = new Set<string>();
    for (let i = 0; i < 50_000; i++) {
      // About one add in three repeats an earlier digest.
      const n = random() < 0.33 && i > 0 ? Math.floor(random() * i) : i;
      const sha = createHash('sha256').update(String(n)).digest('hex');
      expect(set.add(sha)).toBe(!plain.has(sha));
      plain.add(sha);
    }
    expect(set.size).toBe(plain.size);
  });

  it('keeps a digest whose first 16 bytes are zero (the empty slot) apart, and refuses what is not a digest', () => {
    const set = new DigestSet();
    const zero = '0'.repeat(32) + 'ab'.repeat(16);
    expect([set.add(zero), set.add(zero), set.add('0'.repeat(64)), set.size]).toEqual([true, false, false, 1]);
    expect(() => set.add('xyz')).toThrow(RangeError);
  });
});
