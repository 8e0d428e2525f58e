// Runs once around the whole suite: the compiled dist/ must exist (npm test builds it), and
// afterwards no test cgroup may be left under the cgroup2 mount.
import { existsSync } from 'node:fs';
import { leftoverTestCgroups, removeCgroupTree } from './cgroup-cleanup.js';

export function setup(): () => Promise<void> {
  if (!existsSync('dist/supervisor/main.js') || !existsSync('dist/cli/sbx.js')) {
    throw new Error('dist/ is missing: run the tests with npm test (it builds first)');
  }
  return async () => {
    const left = leftoverTestCgroups();
    for (const dir of left) await removeCgroupTree(dir);
    if (left.length) throw new Error(`tests left cgroups behind (now removed): ${left.join(', ')}`);
  };
}
