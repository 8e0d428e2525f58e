import { afterEach, describe, expect, it, vi } from 'vitest';
import { isDuration, MAX_DURATION_MS, parseDurationMs, parseDurationUs } from '../../../ipc/duration.js';
import { MAX_TIMER_STEP_MS, setDeadline } from '../../../supervisor/timers.js';

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
  it("takes Go's compounds (issue 31: one syntax for --timeout, --grace, --since)", () => {
    expect(parseDurationMs('1m30s')).toBe(90_000);
    expect(parseDurationMs('1h2m3.5s')).toBe(3_723_500);
    expect(parseDurationMs('2h45m')).toBe(9_900_000);
    expect(parseDurationMs('1d12h')).toBe(129_600_000);
    expect(parseDurationMs('1s500ms')).toBe(1500);
    expect(parseDurationUs('250us')).toBe(250);
    expect(parseDurationUs('250µs')).toBe(250);
    expect(parseDurationUs('1ms250us')).toBe(1250);
    expect(parseDurationUs('1500ns')).toBe(2); // to the nearest µs
    expect(parseDurationUs('1ns')).toBe(1); // positive stays positive
    expect(parseDurationMs('250us')).toBe(1); // rounded up to whole ms
    expect(parseDurationUs('1m30s')).toBe(90_000_000);
    expect(parseDurationUs('0s')).toBe(0);
    expect(parseDurationUs('1.5')).toBe(1_500_000); // bare: seconds
    // Over 30 days unless the caller lifts the bound (an age for --since).
    expect(() => parseDurationUs('721h')).toThrow('duration "721h" is over the limit of 30 days');
    expect(parseDurationUs('1000h', Infinity)).toBe(3600e9);
  });
  it('refuses what is not one, naming it', () => {
    expect(() => parseDurationMs('1x')).toThrow('not a duration: "1x" (use e.g. 500ms, 30s, 1m30s, 1h2m3.5s; a bare number is seconds)');
    expect(() => parseDurationMs('-1s')).toThrow('not a duration: "-1s" (');
    expect(() => parseDurationMs('')).toThrow('not a duration: "" (');
    expect(() => parseDurationMs('1m30')).toThrow('not a duration: "1m30"; the last number needs a unit (');
    // The hint only where a unit is what is missing: not for hex or exponents.
    expect(() => parseDurationMs('0x10')).toThrow('not a duration: "0x10" (');
    expect(() => parseDurationMs('1e3')).toThrow('not a duration: "1e3" (');
    // As Go's time.ParseDuration: no spaces around it either.
    expect(() => parseDurationMs(' 90s ')).toThrow('not a duration: " 90s "; no spaces (');
    expect(() => parseDurationMs('90s\n')).toThrow('not a duration: "90s\\n"; no spaces (');
    expect(() => parseDurationMs('1 s')).toThrow('not a duration: "1 s"; no spaces (');
    // A long bad input is refused in linear time (a regex anchored at the end was quadratic).
    expect(() => parseDurationMs(`1s${'1'.repeat(200_000)}x`)).toThrow(/^not a duration: /);
    for (const bad of ['1h 30m', 's', '.5s', '1.s', '1m-30s', '1e3s', 'Infinity', '1S', '30 s'])
      expect(() => parseDurationMs(bad), bad).toThrow(/^not a duration: /);
    expect([isDuration('1m30s'), isDuration('10'), isDuration('1m30'), isDuration('2026-12-01')]).toEqual([true, true, false, false]);
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
