// The test run: every file under test/, in forks, two at a time on this 2-core machine (vitest's
// default is cores - 1: one), slowest first (test/helpers/sequencer.ts);
// then, alone, the files whose exact assertions other files' processes can disturb (ISOLATED).
import { configDefaults, defineConfig } from 'vitest/config';
import { SlowestFirst } from './test/helpers/sequencer.js';

/**
 * Files that must run with no other test file beside them. escape.test.ts asserts a root
 * session's exact escapes, and probes.test.ts that every probe's death evidence is
 * cgroup_empty: a write to any cgroup.procs on the host whose writer is gone before the
 * supervisor reads the event (other files' shims, exiting at once) is unattributable and
 * charged to every root session as escape_possible (escape.ts), by design.
 * transport-faults.test.ts asserts that no call outlives the deadlines its client was given
 * (a 3 s connect among them): beside other files on 2 cores, a launch no fault had hit took
 * 14 s against its 10 s (CI of stop 65); alone, its slowest call here is a third of its deadline.
 */
const ISOLATED = ['test/e2e/escape.test.ts', 'test/e2e/probes.test.ts', 'test/e2e/transport-faults.test.ts'];

/**
 * Files that replace a module or the clock for their own tests (vi.mock, vi.useFakeTimers): each
 * runs in a fork of its own (test/unit/repo/sequencer.test.ts finds them all). The
 * others share their fork with the next file (isolate: false): a test file's own module runs
 * anew, what it imports is loaded once per fork, and no fork is started per file.
 */
export const MOCKING = ['test/unit/ipc/duration.test.ts', 'test/unit/supervisor/store/chunks.test.ts'];

// Every node the run starts (the test files' forks, each supervisor, each sbx) would parse the CA
// bundle NODE_EXTRA_CA_CERTS names first: this machine's sets one (~50 ms a start, measured with
// `node -e 0`: 0.15 s with it, 0.09 s without), and no test talks TLS to anything but itself.
// The whole run took 886 s with it and 846 s without (one run each, 2026-12-07).
delete process.env.NODE_EXTRA_CA_CERTS;

export default defineConfig({
  test: {
    globalSetup: ['test/helpers/global-setup.ts'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: 'forks',
    maxWorkers: 2,
    sequence: { sequencer: SlowestFirst },
    projects: [
      {
        extends: true,
        test: { name: 'parallel', include: ['test/**/*.test.ts'], exclude: [...configDefaults.exclude, ...ISOLATED, ...MOCKING], isolate: false },
      },
      { extends: true, test: { name: 'mocking', include: MOCKING } },
      // maxWorkers 1 at groupOrder 0: vitest runs these in a group of their own, after the others.
      { extends: true, test: { name: 'isolated', include: ISOLATED, maxWorkers: 1 } },
    ],
  },
});
