import { afterEach, describe, expect, it, vi } from 'vitest';
import { MAX_DURATION_MS, parseDurationMs } from '../../ipc/duration.js';
import { MAX_TIMER_STEP_MS, setDeadline } from '../../supervisor/timers.js';

describe('durations', () => {
  it('parses the documented forms', () => {
    expect(parseDurationMs('500ms')).toBe(500);
    expect(parseDurationMs('30s')).toBe(30_000);
    expect(parseDurationMs('5m')).toBe(300_000);
    expect(parseDurationMs('1h')).toBe(3_600_000);
    expect(parseDurationMs('1.5s')).toBe(1500);
    expect(parseDurationMs('0')).toBe(0);
    expect(parseDurationMs('10')).toBe(10_000); // seconds, as timeout(1)
    expect(parseDurationMs('0.4ms')).toBe(1); // never rounds down to "no deadline"
    expect(parseDurationMs('2d')).toBe(2 * 86_400_000);
  });
  it('refuses negative, non-numeric and absurd values', () => {
    for (const bad of ['-1s', 'soon', '1x', '', '31d', '1e9h']) expect(() => parseDurationMs(bad)).toThrow(RangeError);
    expect(parseDurationMs('30d')).toBe(MAX_DURATION_MS);
  });
});

describe('setDeadline', () => {
  afterEach(() => vi.useRealTimers());
  it('fires once at the deadline, also past the 2^31-1 ms timer limit', () => {
    vi.useFakeTimers();
    let now = 0;
    const clock = () => now;
    const fired: number[] = [];
    const delay = MAX_TIMER_STEP_MS * 2 + 5;
    setDeadline(() => fired.push(now), delay, clock);
    for (const step of [MAX_TIMER_STEP_MS, MAX_TIMER_STEP_MS]) {
      now += step;
      vi.advanceTimersByTime(step);
      expect(fired).toEqual([]);
    }
    now += 5;
    vi.advanceTimersByTime(5);
    expect(fired).toEqual([delay]);
  });
  it('can be cancelled', () => {
    vi.useFakeTimers();
    let called = false;
    const cancel = setDeadline(() => (called = true), 1000);
    cancel();
    vi.advanceTimersByTime(2000);
    expect(called).toBe(false);
  });
});
