// Runs once around the whole suite: the compiled dist/ must exist (npm test builds it), and
// afterwards no test cgroup may be left under the cgroup2 mount.
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';

export async function setup(): Promise<() => Promise<void>> {
  // Before the helpers are loaded: their cgroup prefix names this run (cgroup-cleanup.ts).
  process.env.SBX_TEST_RUN_ID ??= randomBytes(3).toString('hex');
  const { leftoverTestCgroups, removeCgroupTree } = await import('./cgroup-cleanup.js');
  if (!existsSync('dist/supervisor/main.js') || !existsSync('dist/cli/sbx.js')) {
    throw new Error('dist/ is missing: run the tests with npm test (it builds first)');
  }
  return async () => {
    const left = leftoverTestCgroups();
    for (const dir of left) await removeCgroupTree(dir);
    if (left.length) throw new Error(`tests left cgroups behind (now removed): ${left.join(', ')}`);
  };
}
