// The order test files start in: vitest's own (its cached durations, slowest first; with no
// cache, as in a fresh clone, the largest files first), except that the files known to run
// longest here start first in any case, so none of them is left to run alone at the end.
import { BaseSequencer, type TestSpecification } from 'vitest/node';

/**
 * Files of 15 s or more, slowest first (the parallel project's files in the idle run of stop
 * 70, `npm test` with the JSON reporter). A small file with a long run (field-cases.test.ts,
 * 1.4 kB, 25 s) was otherwise started among the last and ran alone for its last 25 s.
 */
export const SLOWEST_FILES = [
  'test/e2e/checkpoint-scale.test.ts',
  'test/e2e/checkpoint.test.ts',
  'test/e2e/checkpoint-break.test.ts',
  'test/e2e/task-faults.test.ts',
  'test/e2e/fault-injection.test.ts',
  'test/e2e/task-recheck.test.ts',
  'test/e2e/subreaper-mode.test.ts',
  'test/e2e/field-cases.test.ts',
  'test/e2e/recovery.test.ts',
  'test/e2e/ipc-limits.test.ts',
  'test/e2e/drain-break.test.ts',
  'test/e2e/task.test.ts',
  'test/e2e/task-break.test.ts',
  'test/e2e/remote-listener.test.ts',
  'test/e2e/storage.test.ts',
  'test/e2e/termination.test.ts',
  'test/e2e/close.test.ts',
];

export class SlowestFirst extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const sorted = await super.sort(files);
    const root = this.ctx.config.root;
    const rank = (f: TestSpecification) => {
      const i = SLOWEST_FILES.indexOf(f.moduleId.slice(root.length + 1));
      return i < 0 ? SLOWEST_FILES.length : i;
    };
    // Stable: vitest's order (its projects and groups first) is kept apart from the listed files' rank within a project.
    return sorted
      .map((f, i) => ({ f, i }))
      .sort((a, b) => (a.f.project.name === b.f.project.name ? rank(a.f) - rank(b.f) || a.i - b.i : a.i - b.i))
      .map(({ f }) => f);
  }
}
