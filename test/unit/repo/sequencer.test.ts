// The files the run starts first (test/helpers/sequencer.ts) are files of the suite: one renamed
// or removed would drop out of the order silently.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { SLOWEST_FILES } from '../../helpers/sequencer.js';

describe('the slowest files the run starts first', () => {
  it('each is a test file of the suite, listed once', () => {
    const root = join(import.meta.dirname, '../../..');
    expect(SLOWEST_FILES.filter((f) => !existsSync(join(root, f)) || !f.endsWith('.test.ts'))).toEqual([]);
    expect(new Set(SLOWEST_FILES).size).toBe(SLOWEST_FILES.length);
  });
});
