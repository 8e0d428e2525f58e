// A monotonic one-shot timer for deadlines of any length up to 30 days. Node's setTimeout
// overflows above 2^31-1 ms (and then fires at once), so long delays are chained.

export const MAX_TIMER_STEP_MS = 2 ** 31 - 1;

/** Calls fn once, delayMs after now on the monotonic clock; returns a cancel function. */
export function setDeadline(fn: () => void, delayMs: number, now: () => number = () => performance.now()): () => void {
  const deadlineAt = now() + delayMs;
  let timer: NodeJS.Timeout | undefined;
  const arm = () => {
    const remainingMs = deadlineAt - now();
    if (remainingMs <= 0) return fn();
    timer = setTimeout(arm, Math.min(remainingMs, MAX_TIMER_STEP_MS));
    timer.unref?.();
  };
  arm();
  return () => clearTimeout(timer);
}
