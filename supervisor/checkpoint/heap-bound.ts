// The checkpoint thread's heap kept near what it holds (in that thread only): V8 lets an old
// generation grow to 1.1-4x what its last full GC left before it collects again (4 once the heap
// cap is 2 GiB or more, as 1,000,000 files need), so a big checkpoint's peak was twice what the
// thread held and more (docs/design/performance.md, "The heaps' growth"). Here the thread
// collects itself once its heap grew by HEAP_GROWTH_PERCENT over what its last collection left.
import { getHeapStatistics, setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

/** Growth over the live heap after a collection that makes the thread collect again, percent (V8's --heap-growing-percent, for this thread alone). */
const HEAP_GROWTH_PERCENT = 25;
/** Below this much used heap the thread leaves collection to V8 (a small checkpoint pays nothing), bytes. */
const HEAP_BOUND_FLOOR_BYTES = 64 << 20;
/** Past this share of the heap's cap the bound leaves collection to V8 (a checkpoint about to fail on its cap burned twice the CPU otherwise). */
const NEAR_CAP = 0.75;
/** Work between two looks at the heap's size (an entry walked counts 1; v8.getHeapStatistics costs ~1 µs). */
const TICKS_PER_LOOK = 1024;

/** Whether this thread bounds its heap (boundThisHeap: the checkpoint thread; a test or sbx loading these modules does not). */
let enabled = false;
let ticks = 0;
/** Used heap past which the next collection runs (bytes). */
let limitBytes = HEAP_BOUND_FLOOR_BYTES;
let collect: (() => void) | null = null;
/** Collections run by the bound since this thread started (for tests and profiles). */
let collections = 0;
/** Used heap its last collection left (bytes; 0 before the first). */
let liveBytes = 0;
/** Growth over that which settleHeap collects in idle time, percent: a first checkpoint's garbage, not a steady one's. */
const SETTLE_GROWTH_PERCENT = 50;

/**
 * A full, blocking collection of this thread's heap. V8 gives it to a context made while
 * --expose-gc is on (node's `v8.setFlagsFromString`, then `vm.runInNewContext('gc')`), and the
 * flag is turned off again at once. V8's flags are the process's: a context another thread makes
 * in that instant (a worker starting) gets a `gc` too, harmless since all of it is ours; it is
 * taken once per checkpoint thread, at its start (boundThisHeap).
 */
function collector(): () => void {
  if (collect) return collect;
  setFlagsFromString('--expose-gc');
  try {
    collect = runInNewContext('gc') as () => void;
  } finally {
    setFlagsFromString('--no-expose-gc');
  }
  return collect;
}

/**
 * Counts `work` units (entries walked, objects read back); every TICKS_PER_LOOK of them looks at
 * the used heap and, past the limit, collects it whole and sets the next limit to what is left
 * live plus HEAP_GROWTH_PERCENT (never under HEAP_BOUND_FLOOR_BYTES). Only in the checkpoint
 * thread, whose steps block by design: a collection pauses nothing else.
 */
export function heapTick(work = 1): void {
  if (!enabled) return;
  ticks += work;
  if (ticks < TICKS_PER_LOOK) return;
  ticks = 0;
  const heap = getHeapStatistics();
  // Near its cap V8 collects on its own, often: a collection more would only cost CPU.
  if (heap.used_heap_size <= limitBytes || heap.used_heap_size > heap.heap_size_limit * NEAR_CAP) return;
  collectNow();
}

function collectNow(): void {
  collector()();
  collections++;
  liveBytes = getHeapStatistics().used_heap_size;
  limitBytes = Math.max(HEAP_BOUND_FLOOR_BYTES, Math.round(liveBytes * (1 + HEAP_GROWTH_PERCENT / 100)));
}

/**
 * In the thread's idle time (capture-worker.ts, after a step's answer): collects the heap whole
 * when it holds more than HEAP_BOUND_FLOOR_BYTES and grew by SETTLE_GROWTH_PERCENT over what the
 * last collection left, so that a big step's garbage (a first checkpoint's) is not collected in
 * the middle of the next one. Returns whether it collected.
 */
export function settleHeap(): boolean {
  if (!enabled) return false;
  const used = getHeapStatistics().used_heap_size;
  if (used <= HEAP_BOUND_FLOOR_BYTES || used <= liveBytes * (1 + SETTLE_GROWTH_PERCENT / 100)) return false;
  collectNow();
  return true;
}

/** Makes heapTick bound this thread's heap: the checkpoint thread's start (capture-worker.ts), nowhere else. */
export function boundThisHeap(): void {
  enabled = true;
  collector();
}

/** The collections the bound ran in this thread, and its limit now (bytes). */
export function heapBoundState(): { collections: number; limitBytes: number } {
  return { collections, limitBytes };
}
