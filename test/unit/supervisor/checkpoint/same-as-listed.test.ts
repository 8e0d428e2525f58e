// An unchanged walk keeps a listed entry from its row (supervisor/checkpoint/passes.ts
// sameAsListed: numbers from the listing's 32-bit words, BigInts only for the inode and times).
// It must say "the same" exactly when the walk's own entry of that row (core/fs/walk.ts
// listedEntry) compares the same (sameAsCaptured), but for links and times past int64
// nanoseconds, which it leaves to the entry; never "the same" where the entry is not.
import { describe, expect, it } from 'vitest';
import { TIME_OUT_OF_RANGE } from '../../../../core/fs/native.js';
import { listedEntry, SD, typeOfMode, type ListedRow } from '../../../../core/fs/walk.js';
import { sameAsCaptured, sameAsListed, type CapturedEntry } from '../../../../supervisor/checkpoint/passes.js';
import { seededRandom } from '../../../helpers/random.js';

const FIELDS = 17;
const MODES = [0o100644, 0o100755, 0o040755, 0o120777, 0o020644, 0o060600, 0o010644, 0o140755, 0o100000 | 0o7777];
const EDGES = [
  0n,
  1n,
  2n ** 31n - 1n,
  2n ** 31n,
  2n ** 32n - 1n,
  2n ** 32n,
  2n ** 32n + 1n,
  2n ** 53n - 1n,
  2n ** 53n,
  2n ** 53n + 1n,
  2n ** 62n + 3n,
  -1n,
  -(2n ** 40n),
];

describe('sameAsListed', () => {
  it('agrees with sameAsCaptured of the walk’s own entry for the row, over ids past 2^31, sizes, devices and inodes past 2^32 and 2^53, times out of int64 range, links', () => {
    const seed = Number(process.env.LISTED_SEED ?? Date.now() % 1_000_000);
    console.log(`sameAsListed property seed ${seed} (LISTED_SEED=${seed} to repeat)`);
    const next = seededRandom(seed);
    const pick = <T>(a: readonly T[]): T => a[Math.floor(next() * a.length)]!;
    const big = (): bigint => (next() < 0.5 ? pick(EDGES) : BigInt(Math.floor(next() * 2 ** 40)));
    const id = (): bigint => pick([0n, 1000n, 2n ** 31n - 1n, 2n ** 31n, 4294967294n]);
    const time = (): { ns: bigint; sec: bigint; nsec: bigint } => {
      // Past int64 nanoseconds: the listing says so (TIME_OUT_OF_RANGE) and gives seconds and
      // nanoseconds; also for -2^63 ns itself, where the sentinel is the time.
      if (next() < 0.05) return { ns: TIME_OUT_OF_RANGE, sec: -9223372037n, nsec: 145224192n };
      if (next() < 0.15) return { ns: TIME_OUT_OF_RANGE, sec: pick([2n ** 40n, -(2n ** 40n)]), nsec: BigInt(Math.floor(next() * 1e9)) };
      const sec = BigInt(Math.floor(next() * 2 ** 31)) - (next() < 0.1 ? 2n ** 31n : 0n);
      const nsec = BigInt(Math.floor(next() * 1e9));
      return { ns: sec * 1_000_000_000n + nsec, sec, nsec };
    };
    /** A listing of one entry with random fields (its link target after the name). */
    const makeRow = (): ListedRow => {
      const stats = new BigInt64Array(FIELDS);
      const mode = pick(MODES);
      stats[SD.mode] = BigInt(mode);
      stats[SD.uid] = id();
      stats[SD.gid] = id();
      for (const f of [SD.nlink, SD.dev, SD.ino, SD.size, SD.blocks, SD.rdev]) stats[f] = big();
      const m = time();
      const c = time();
      [stats[SD.mtimeNs], stats[SD.mtimeSec], stats[SD.mtimeNsec]] = [m.ns, m.sec, m.nsec];
      [stats[SD.ctimeNs], stats[SD.ctimeSec], stats[SD.ctimeNsec]] = [c.ns, c.sec, c.nsec];
      const link = (mode & 0o170000) === 0o120000;
      const target = Buffer.from(link ? pick(['a', 'b', '../x']) : '');
      stats[SD.targetLen] = link ? BigInt(target.length) : -1n;
      const names = Buffer.concat([Buffer.from('f'), target]);
      return {
        dirRel: Buffer.from('d'),
        names,
        nameStart: 0,
        nameEnd: 1,
        stats,
        words: new Int32Array(stats.buffer),
        at: 0,
        mode,
        type: typeOfMode(mode),
        targetLen: link ? target.length : -1,
        depth: 2,
        dirFd: -1,
      };
    };
    /** What a capture keeps of an entry (passes.ts: stMode, stSize, stRdev, stDev as numbers). */
    const captured = (row: ListedRow): CapturedEntry => {
      const e = listedEntry(row, Buffer.from('d/f'), Buffer.from('f'));
      return {
        ...e,
        key: 'd/f',
        size: Number(e.size),
        stMode: e.mode,
        stSize: Number(e.size),
        stRdev: Number(e.rdev),
        stDev: Number(e.dev),
        target: e.linkTarget ?? undefined,
      } as unknown as CapturedEntry;
    };
    let same = 0;
    for (let n = 0; n < 20_000; n++) {
      const row = makeRow();
      let c: CapturedEntry;
      if (next() < 0.3) {
        c = captured(makeRow());
      } else {
        // The row's own entry, often with one field moved a little (or its type, or a link's target).
        const from = makeRow();
        from.stats.set(row.stats);
        from.mode = row.mode;
        from.type = row.type;
        from.targetLen = row.targetLen;
        from.names = Buffer.from(row.names);
        if (next() < 0.6) {
          const f = pick([SD.mode, SD.uid, SD.gid, SD.dev, SD.ino, SD.size, SD.rdev, SD.mtimeNs, SD.ctimeNs, SD.nlink, SD.blocks]);
          from.stats[f] = from.stats[f]! + pick([1n, -1n, 2n ** 32n, 2n ** 53n]);
          if (f === SD.mode) from.type = typeOfMode((from.mode = Number(BigInt.asIntN(32, from.stats[f]!))));
        }
        if (row.targetLen > 0 && next() < 0.3) from.names[1] = 0x7a;
        c = captured(from);
      }
      const entrySame = sameAsCaptured(c, listedEntry(row, Buffer.from('d/f'), Buffer.from('f')));
      const outOfRange = row.stats[SD.mtimeNs] === TIME_OUT_OF_RANGE || row.stats[SD.ctimeNs] === TIME_OUT_OF_RANGE;
      expect(sameAsListed(c, row)).toBe(entrySame && row.type !== 'symlink' && !outOfRange);
      if (sameAsListed(c, row)) same++;
    }
    // Both answers were given many times (the test is not one-sided).
    expect(same).toBeGreaterThan(2_000);
  });
});
