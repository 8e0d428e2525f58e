// The compact set of SHA-256 digests a walk of a checkpoint's trees keeps (core/checkpoint/digest-set.ts):
// it answers as a Set of the hex digests would, through its growth, for the all-zero key too; a
// table sized at once holds as many without growing; claim says true once per digest, added or not.
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

  it('claims each digest once, added or not, sized at once or grown: as a second Set of hex digests would', () => {
    const seed = randomBytes(4).readUInt32BE(0);
    console.log(`digest-set claim seed ${seed}`);
    const random = seededRandom(seed);
    const sha = (n: number) => createHash('sha256').update(String(n)).digest('hex');
    for (const expected of [0, 20_000]) {
      const set = new DigestSet(expected);
      const added = new Set<string>();
      for (let i = 0; i < 20_000; i++) {
        const d = sha(Math.floor(random() * 15_000));
        set.add(d);
        added.add(d);
      }
      const zero = '0'.repeat(32) + 'cd'.repeat(16);
      set.add(zero);
      added.add(zero);
      expect(set.size).toBe(added.size);
      const claimed = new Set<string>();
      // Every added digest and 2,000 never added, each claimed about twice, in random order.
      const asks = [...added, ...added, ...Array.from({ length: 2_000 }, (_, i) => sha(100_000 + (i % 1_000))), '0'.repeat(64)];
      for (let i = asks.length - 1; i > 0; i--) {
        const j = Math.floor(random() * (i + 1));
        [asks[i], asks[j]] = [asks[j]!, asks[i]!];
      }
      // Two digests equal in their first 128 bits are one (as add counts them): the zero ones here.
      for (const d of asks) {
        expect(set.claim(d), `${d} (expected ${expected})`).toBe(!claimed.has(d.slice(0, 32)));
        claimed.add(d.slice(0, 32));
      }
      expect(() => set.add(sha(1))).toThrow('add after claim');
    }
  });

  it('a table sized for its digests is made once: it holds that many with no growth (its bytes do not move)', () => {
    const set = new DigestSet(100_000);
    const table = () => (set as unknown as { table: Buffer }).table;
    const before = table();
    for (let i = 0; i < 100_000; i++) set.add(createHash('sha256').update(String(i)).digest('hex'));
    expect(set.size).toBe(100_000);
    expect(table()).toBe(before);
    expect(before.length).toBe(262_144 * 16); // the power of two holding 100,000 at 70% at most
  });
});
