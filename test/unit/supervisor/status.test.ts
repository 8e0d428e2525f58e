// What sbx status measures in the supervisor (supervisor/status.ts): the CPU load sample (a
// percentage of all CPUs from /proc/stat's counters, the last value again within MIN_SAMPLE_MS,
// never a shell) and the state dir's size (walked with async calls: the event loop turns meanwhile).
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { CpuLoad, walkBytes } from '../../../supervisor/status.js';

/** Keeps this thread on a CPU for ms (the monotonic clock). */
function spin(ms: number): void {
  const end = performance.now() + ms;
  while (performance.now() < end);
}

describe('CpuLoad', () => {
  it('counts a busy CPU among all of them, and gives the last value again within MIN_SAMPLE_MS', () => {
    const load = new CpuLoad();
    spin(CpuLoad.MIN_SAMPLE_MS + 200);
    const busy = load.sample();
    // This thread alone kept one of the CPUs busy for the whole sample (others' load only adds).
    expect(busy).toBeGreaterThanOrEqual(Math.floor(80 / availableParallelism()));
    expect(busy).toBeLessThanOrEqual(100);
    expect(load.sample()).toBe(busy);
  });
});

describe("the state dir's size", () => {
  const dir = mkdtempSync(join(tmpdir(), 'sbx-status-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('is the bytes of its regular files, links not followed, and the event loop turns while it is walked', async () => {
    // 20 directories of 100 files of 0..99 bytes, a symlink to a big file outside, an empty directory.
    let expected = 0;
    for (let d = 0; d < 20; d++) {
      mkdirSync(join(dir, 'state', `d${d}`), { recursive: true });
      for (let f = 0; f < 100; f++) {
        writeFileSync(join(dir, 'state', `d${d}`, `f${f}`), Buffer.alloc(f));
        expected += f;
      }
    }
    writeFileSync(join(dir, 'outside'), Buffer.alloc(1 << 20));
    symlinkSync(join(dir, 'outside'), join(dir, 'state', 'link'));
    mkdirSync(join(dir, 'state', 'empty'));
    let turns = 0;
    let walking = true;
    const turn = () => {
      turns++;
      if (walking) setImmediate(turn);
    };
    setImmediate(turn);
    const bytes = await walkBytes(join(dir, 'state'));
    walking = false;
    expect(bytes).toBe(expected);
    // One turn at least per directory listed and per batch of lstats: readdirSync and lstatSync gave none.
    expect(turns).toBeGreaterThan(20);
    expect(await walkBytes(join(dir, 'gone'))).toBe(0);
  });
});
