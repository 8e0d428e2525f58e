// A fan directory's names kept compact (core/checkpoint/object-names.ts) answer as a Set of the
// names would, and an object file's stat signature (local-store.ts objectSigOf) tells apart
// every field it covers, past the 64-bit range too.
import { createHash, randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { ObjectNames } from '../../../../core/checkpoint/object-names.js';
import { objectSigOf } from '../../../../core/checkpoint/local-store.js';
import { seededRandom } from '../../../helpers/random.js';

const sha = (n: number | string) => createHash('sha256').update(String(n)).digest('hex');

describe('ObjectNames', () => {
  it('agrees with a Set over listed names (with repeats and names that are no digest), lookups, adds and iteration', () => {
    const seed = randomBytes(4).readUInt32BE(0);
    console.log(`object-names seed ${seed}`);
    const random = seededRandom(seed);
    const listed: string[] = [];
    for (let i = 0; i < 3000; i++) listed.push(random() < 0.1 && i > 0 ? listed[Math.floor(random() * i)]! : sha(i));
    const odd = ['tmp.x', sha('upper').toUpperCase(), `${sha('short').slice(0, 63)}`, `${sha('long')}0`, ''];
    listed.push(...odd);
    const names = new ObjectNames(listed);
    const plain = new Set(listed);
    expect(names.size).toBe(plain.size);
    for (let i = 0; i < 6000; i++) {
      const n = sha(i);
      expect([n, names.has(n), names.hasDigest(n)]).toEqual([n, plain.has(n), plain.has(n)]);
    }
    for (const n of odd) expect(names.has(n)).toBe(true);
    // An uppercase name is not its lowercase digest's (nor the other way).
    expect(names.has(sha('upper'))).toBe(false);
    names.add(sha(7000)).add(sha(1)).add('another');
    plain.add(sha(7000)).add(sha(1)).add('another');
    expect([names.size, names.has(sha(7000)), names.hasDigest(sha(7000)), names.has('another')]).toEqual([plain.size, true, true, true]);
    expect([...names].sort()).toEqual([...plain].sort());
  });

  it('finds digests that share their first four bytes, and is empty when nothing is listed', () => {
    const a = `abcdef01${'0'.repeat(56)}`;
    const b = `abcdef01${'f'.repeat(56)}`;
    const c = `abcdef01${'0'.repeat(55)}1`;
    const names = new ObjectNames([b, a]);
    expect([names.has(a), names.has(b), names.has(c), names.hasDigest(c)]).toEqual([true, true, false, false]);
    const none = new ObjectNames();
    expect([none.size, none.has(a), [...none]]).toEqual([0, false, []]);
  });
});

describe('objectSigOf', () => {
  const base = { dev: 65024n, ino: 17850123n, size: 14n, mtimeNs: 1733558160123456789n, ctimeNs: 1733558160223456789n };

  it('is one short flat string that changes with each field', () => {
    const s = objectSigOf(base);
    expect([s.length, s.charCodeAt(0)]).toEqual([41, 1]);
    expect(objectSigOf({ ...base })).toBe(s);
    for (const k of Object.keys(base) as (keyof typeof base)[]) expect(objectSigOf({ ...base, [k]: base[k] + 1n })).not.toBe(s);
    // A 64-bit inode and size, and a time before 1970.
    expect(objectSigOf({ ...base, ino: (1n << 64n) - 1n })).not.toBe(objectSigOf({ ...base, ino: (1n << 64n) - 2n }));
    expect(objectSigOf({ ...base, mtimeNs: -1n })).not.toBe(objectSigOf({ ...base, mtimeNs: -2n }));
    // stat gives dev, ino and size signed: an inode number of 2^63 or more (overlayfs xino) is negative, and is its own 64 bits.
    const high = -(2n ** 63n) + 1_526_877n;
    expect(objectSigOf({ ...base, ino: high })).toBe(objectSigOf({ ...base, ino: BigInt.asUintN(64, high) }));
    expect(objectSigOf({ ...base, ino: high })).not.toBe(objectSigOf({ ...base, ino: high + 1n }));
    expect(objectSigOf({ ...base, ino: high }).length).toBe(41);
  });

  it('gives times past the 64-bit range exactly, in decimal, never equal to an in-range signature', () => {
    const far = 6000n * 365n * 86_400n * 1_000_000_000n;
    const s = objectSigOf({ ...base, mtimeNs: far });
    expect(s).toBe(`:65024:17850123:14:${far}:1733558160223456789`);
    expect(objectSigOf({ ...base, mtimeNs: far + 1n })).not.toBe(s);
    expect(objectSigOf({ ...base, ctimeNs: -far })).toBe(`:65024:17850123:14:1733558160123456789:${-far}`);
  });
});
