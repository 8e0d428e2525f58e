// A daemon's state dir on a file system of its own: a tmpfs for the full-disk tests
// (storage, drain-break), an ext4 image on a loop device for the frozen-disk one (fsfreeze
// needs a file system that can freeze). Mounted before the daemon starts, unmounted after it
// stopped. See mount(8), tmpfs(5), losetup(8), fsfreeze(8).
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import type { TestDaemon } from './daemon.js';

/** Whether an ext4 image can be loop-mounted and frozen here (loop devices, mkfs.ext4, fsfreeze). */
export const HAVE_FREEZABLE_IMAGE = existsSync('/dev/loop-control') && spawnSync('sh', ['-c', 'command -v mkfs.ext4 && command -v fsfreeze']).status === 0;

/** Mounts a new ext4 image of sizeMiB (in daemon.dir, loop device released at umount) at daemon.stateDir. */
export function mountStateImage(daemon: TestDaemon, sizeMiB: number): void {
  mkdirSync(daemon.stateDir, { recursive: true });
  const img = join(daemon.dir, 'state.img');
  execFileSync('truncate', ['-s', `${sizeMiB}M`, img]);
  execFileSync('mkfs.ext4', ['-q', '-F', img]);
  execFileSync('mount', ['-o', 'loop', img, daemon.stateDir]);
  execFileSync('chmod', ['0700', daemon.stateDir]);
  rmSync(join(daemon.stateDir, 'lost+found'), { recursive: true, force: true });
}

/** Mounts a tmpfs of sizeMiB (mode 0700) at daemon.stateDir; undo with unmountState. */
export function mountState(daemon: TestDaemon, sizeMiB: number): void {
  mkdirSync(daemon.stateDir, { recursive: true });
  execFileSync('mount', ['-t', 'tmpfs', '-o', `size=${sizeMiB}m,mode=0700`, 'tmpfs', daemon.stateDir]);
}

/** SIGTERMs the daemon (its exit status, null if it was not running), thaws and unmounts its state dir if mounted, and stops it. */
export async function unmountState(daemon: TestDaemon): Promise<{ code: number | null; signal: NodeJS.Signals | null } | null> {
  spawnSync('fsfreeze', ['-u', daemon.stateDir]); // whatever a failed test left frozen
  const exit = await daemon.terminate();
  try {
    execFileSync('umount', [daemon.stateDir]);
  } catch {
    // not mounted
  }
  await daemon.stop();
  return exit;
}
