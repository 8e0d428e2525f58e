// Test-side cgroup hygiene: where test daemons put their subtrees, and how to remove one
// (cgroup.kill every leaf, wait for populated 0, rmdir bottom-up) even after a failure.
import { existsSync, readdirSync, readFileSync, rmdirSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseCgroup2Mount } from '../../supervisor/cgroup.js';

/**
 * Prefix of every cgroup subtree a test daemon of this `npm test` run owns (under the
 * cgroup2 mount). The run id (set once by global-setup.ts, inherited by the test workers)
 * keeps two runs on one machine out of each other's sweep.
 */
export const TEST_CGROUP_PREFIX = `sbx-test-${process.env.SBX_TEST_RUN_ID ?? 'norun'}-`;

export function cgroupMount(): string | null {
  return parseCgroup2Mount(readFileSync('/proc/self/mountinfo', 'utf8'))?.mountPoint ?? null;
}

/** The name=systemd v1 hierarchy of a hybrid host, where systemd-nspawn mirrors a container's cgroup (test/helpers/nspawn.ts). */
export const SYSTEMD_V1_MOUNT = '/sys/fs/cgroup/systemd';

/** Test subtrees left under the cgroup2 mount, and under the name=systemd v1 tree of a hybrid host. */
export function leftoverTestCgroups(): string[] {
  const left: string[] = [];
  for (const mount of [cgroupMount(), SYSTEMD_V1_MOUNT]) {
    if (!mount || !existsSync(mount) || (mount === SYSTEMD_V1_MOUNT && cgroupMount() === SYSTEMD_V1_MOUNT)) continue;
    for (const n of readdirSync(mount)) if (n.startsWith(TEST_CGROUP_PREFIX)) left.push(join(mount, n));
  }
  return left;
}

function populated(dir: string): boolean {
  try {
    return /^populated 1$/m.test(readFileSync(join(dir, 'cgroup.events'), 'utf8'));
  } catch {
    return false;
  }
}

/** Kills everything in a cgroup subtree and removes it, deepest first; polls with a deadline. */
export async function removeCgroupTree(dir: string, deadlineMs = 10_000): Promise<void> {
  if (!existsSync(dir)) return;
  const until = performance.now() + deadlineMs;
  if (populated(dir)) writeFileSync(join(dir, 'cgroup.kill'), '1');
  while (populated(dir)) {
    if (performance.now() > until) throw new Error(`cgroup ${dir} still populated after cgroup.kill`);
    await new Promise((r) => setTimeout(r, 20));
  }
  for (const name of readdirSync(dir)) {
    const child = join(dir, name);
    if (statSync(child).isDirectory()) await removeCgroupTree(child, Math.max(1000, until - performance.now()));
  }
  for (;;) {
    try {
      rmdirSync(dir);
      return;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
      if (performance.now() > until) throw err;
      await new Promise((r) => setTimeout(r, 20));
    }
  }
}
