import { describe, expect, it } from 'vitest';
import { planRetention, type RetentionCandidate } from '../../../../supervisor/store/retention.js';

const MiB = 1 << 20;
const c = (sessionId: string, endedAtMs: number, outputBytes = MiB, ended = true): RetentionCandidate => ({
  sessionId,
  ended,
  endedAtMs,
  outputBytes,
  outputRemoved: false,
});

describe('planRetention', () => {
  const policy = { outputMaxAgeMs: 1000, outputMaxTotalBytes: 2.5 * MiB, receiptMaxAgeMs: 0 };

  it('removes the oldest ended output first until under the total, counting running output but never touching it', () => {
    const plan = planRetention([c('running', 0, MiB, false), c('s3', 300), c('s1', 100), c('s2', 200)], policy, 500);
    expect(plan).toEqual({ removeOutput: ['s1', 's2'], retire: [] });
  });

  it('removes output past its age, and whole sessions past the receipt age', () => {
    expect(planRetention([c('old', 0, 10), c('new', 1500, 10)], policy, 2000)).toEqual({ removeOutput: ['old'], retire: [] });
    expect(planRetention([c('old', 0, 10), c('new', 1500, 10), c('live', 0, 10, false)], { ...policy, receiptMaxAgeMs: 1800 }, 2000)).toEqual({
      removeOutput: [],
      retire: ['old'],
    });
  });

  it('reads 0 as no limit', () => {
    const none = { outputMaxAgeMs: 0, outputMaxTotalBytes: 0, receiptMaxAgeMs: 0 };
    expect(planRetention([c('a', 0, 10 * MiB), c('b', 1, 10 * MiB)], none, 1e12)).toEqual({ removeOutput: [], retire: [] });
  });

  it('does nothing under the limits, and skips output already removed', () => {
    expect(planRetention([c('a', 900), c('b', 950)], policy, 1000)).toEqual({ removeOutput: [], retire: [] });
    expect(planRetention([{ ...c('a', 0), outputRemoved: true }], policy, 5000)).toEqual({ removeOutput: [], retire: [] });
  });

  it('keep-free: removes the oldest ended output until free space reaches the target, never running output, never receipts', () => {
    const none = { outputMaxAgeMs: 0, outputMaxTotalBytes: 0, receiptMaxAgeMs: 0 };
    const sessions = [c('running', 0, 50 * MiB, false), c('s2', 200, 4 * MiB), c('s1', 100, 3 * MiB), c('s3', 300, 5 * MiB)];
    // 1 MiB free, 6 MiB wanted: s1 (3) is not enough, s1 + s2 (7) is.
    expect(planRetention(sessions, none, 1000, { freeBytes: MiB, keepFreeBytes: 6 * MiB })).toEqual({ removeOutput: ['s1', 's2'], retire: [] });
    // At or above the target: nothing.
    expect(planRetention(sessions, none, 1000, { freeBytes: 6 * MiB, keepFreeBytes: 6 * MiB })).toEqual({ removeOutput: [], retire: [] });
    // Not enough ended output to reach it: all of it goes, the running session's stays.
    expect(planRetention(sessions, none, 1000, { freeBytes: 0, keepFreeBytes: 100 * MiB })).toEqual({ removeOutput: ['s1', 's2', 's3'], retire: [] });
  });

  it('keep-free counts the output of sessions it retires whole as freed', () => {
    const p = { outputMaxAgeMs: 0, outputMaxTotalBytes: 0, receiptMaxAgeMs: 500 };
    expect(planRetention([c('old', 0, 4 * MiB), c('new', 900, 4 * MiB)], p, 1000, { freeBytes: MiB, keepFreeBytes: 4 * MiB })).toEqual({
      removeOutput: [],
      retire: ['old'],
    });
  });
});
