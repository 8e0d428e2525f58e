// The status's CPU load sample (supervisor/status.ts CpuLoad): a percentage of all CPUs from
// os.cpus()'s counters, the last value again within MIN_SAMPLE_MS, never a shell.
import { availableParallelism } from 'node:os';
import { describe, expect, it } from 'vitest';
import { CpuLoad } from '../../../supervisor/status.js';

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
