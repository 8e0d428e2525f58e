// The files the run starts first (test/helpers/sequencer.ts) are files of the suite: one renamed
// or removed would drop out of the order silently. And every file that mocks a module or the clock runs in a
// fork of its own (vitest.config.ts MOCKING): the others share theirs with the next file.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { SLOWEST_FILES } from '../../helpers/sequencer.js';
import { MOCKING } from '../../../vitest.config.js';

describe("the test run's order and forks", () => {
  it('each of the slowest files the run starts first is a test file of the suite, listed once', () => {
    const root = join(import.meta.dirname, '../../..');
    expect(SLOWEST_FILES.filter((f) => !existsSync(join(root, f)) || !f.endsWith('.test.ts'))).toEqual([]);
    expect(new Set(SLOWEST_FILES).size).toBe(SLOWEST_FILES.length);
  });

  it('every test file that mocks a module or the clock (vi.mock, vi.useFakeTimers) is one the config gives a fork of its own', () => {
    const root = join(import.meta.dirname, '../../..');
    const mocking = (readdirSync(join(root, 'test'), { recursive: true }) as string[])
      .filter((f) => f.endsWith('.test.ts') && /\bvi\.(mock|useFakeTimers)\(/.test(readFileSync(join(root, 'test', f), 'utf8')))
      .map((f) => `test/${f}`)
      .sort();
    expect(mocking).toEqual([...MOCKING].sort());
  });
});
