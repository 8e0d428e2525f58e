// The checkpoint thread's heap bound (supervisor/checkpoint/heap-bound.ts), in a worker thread of
// its own as the checkpoint thread is (the compiled module from dist/, which npm test builds): a
// live set with garbage made beside it stays within the bound's growth of it, and no context,
// the thread's own or one made after, is left with a `gc`.
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { Worker } from 'node:worker_threads';
import { describe, expect, it } from 'vitest';
import { heapBoundState, heapTick, settleHeap } from '../../../../supervisor/checkpoint/heap-bound.js';
import { ROOT } from '../../../helpers/daemon.js';

const MODULE = pathToFileURL(join(ROOT, 'dist/supervisor/checkpoint/heap-bound.js')).href;

/** Runs the allocation loop in a worker (the heap cap of a big checkpoint's thread: 3 GiB, where V8's own growth factor is 4); its report. */
function run(bound: boolean): Promise<{ collections: number; liveMiB: number; maxUsedMiB: number; gcSeen: string[] }> {
  const code = `
    const { parentPort, workerData } = require('node:worker_threads');
    const { getHeapStatistics } = require('node:v8');
    const { runInNewContext } = require('node:vm');
    import(workerData.module).then(({ boundThisHeap, heapTick, heapBoundState }) => {
      if (workerData.bound) boundThisHeap();
      // About 100 MiB kept, and 800 MiB of garbage made beside it that lives long enough to be
      // promoted (a ring of the last 16,384 arrays): what a capture's walk leaves in the old
      // generation. Arrays of 127 small integers, 1,040 bytes each (strings would be shared).
      const live = [];
      const ring = new Array(16384);
      let maxUsed = 0;
      for (let i = 0; i < 800_000; i++) {
        ring[i & 16383] = new Array(127).fill(i);
        if (i % 4 === 0 && live.length < 96 * 1024) live.push(new Array(127).fill(i));
        heapTick();
        if (i % 1024 === 0) maxUsed = Math.max(maxUsed, getHeapStatistics().used_heap_size);
      }
      const gcSeen = [];
      if (typeof globalThis.gc !== 'undefined') gcSeen.push('the thread');
      if (runInNewContext('typeof gc') !== 'undefined') gcSeen.push('a context made after');
      parentPort.postMessage({ ...heapBoundState(), liveMiB: (live.length * 1040) / 1048576, maxUsedMiB: maxUsed / 1048576, gcSeen });
    });
  `;
  return new Promise((resolve, reject) => {
    const w = new Worker(code, { eval: true, workerData: { module: MODULE, bound }, resourceLimits: { maxOldGenerationSizeMb: 3072 } });
    w.once('message', (m) => {
      resolve(m);
      void w.terminate();
    });
    w.once('error', reject);
  });
}

describe('the checkpoint thread’s heap bound', () => {
  it('keeps the heap within 25% of what it holds (V8 alone lets it grow past twice that), and leaves no gc behind', async () => {
    const bounded = await run(true);
    expect(bounded.collections).toBeGreaterThan(0);
    expect(bounded.gcSeen).toEqual([]);
    // What it holds (the kept arrays and the ring's 16.25 MiB) and 25% over it, and 32 MiB for
    // what a look every 1,024 ticks and the young generation add; V8 alone went to ~500 MiB here.
    expect(bounded.maxUsedMiB).toBeLessThan((bounded.liveMiB + 16.25) * 1.25 + 32);
    const unbounded = await run(false);
    console.log(`heap bound: bounded ${JSON.stringify(bounded)}; V8 alone ${JSON.stringify(unbounded)}`);
    expect(unbounded.collections).toBe(0);
    expect(typeof (globalThis as { gc?: unknown }).gc).toBe('undefined');
  }, 60_000);

  it("settles in idle time: collects a big step's garbage once (over 64 MiB used and 50% over what the last collection left), not again until it grew so again", async () => {
    const code = `
      const { parentPort, workerData } = require('node:worker_threads');
      const { getHeapStatistics } = require('node:v8');
      import(workerData.module).then(({ boundThisHeap, settleHeap, heapBoundState }) => {
        boundThisHeap();
        const small = settleHeap(); // under 64 MiB used: nothing
        const live = [];
        for (let i = 0; i < 40_000; i++) live.push(new Array(127).fill(i)); // ~40 MiB kept
        let garbage = [];
        for (let i = 0; i < 80_000; i++) garbage.push(new Array(127).fill(i)); // ~80 MiB, then dropped
        garbage = null;
        const before = getHeapStatistics().used_heap_size;
        const first = settleHeap();
        const after = getHeapStatistics().used_heap_size;
        const again = settleHeap();
        parentPort.postMessage({ small, first, again, beforeMiB: before / 1048576, afterMiB: after / 1048576, kept: live.length, ...heapBoundState() });
      });
    `;
    const r = await new Promise<Record<string, number | boolean>>((resolve, reject) => {
      const w = new Worker(code, { eval: true, workerData: { module: MODULE } });
      w.once('message', (m) => {
        resolve(m);
        void w.terminate();
      });
      w.once('error', reject);
    });
    expect(r).toMatchObject({ small: false, first: true, again: false, collections: 1 });
    expect(r.afterMiB as number).toBeLessThan((r.beforeMiB as number) / 2);
    expect(settleHeap()).toBe(false); // not in a thread that did not ask for it
  }, 60_000);

  it('does nothing in a thread that did not ask for it (a test, sbx, the main thread importing the capture)', () => {
    for (let i = 0; i < 8; i++) heapTick(1 << 20);
    expect(heapBoundState().collections).toBe(0);
    expect(typeof (globalThis as { gc?: unknown }).gc).toBe('undefined');
  });
});
