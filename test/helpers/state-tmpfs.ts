// A daemon's state dir on a tmpfs of its own, for the full-disk tests (storage, drain-break):
// mounted before the daemon starts, unmounted after it stopped. See mount(8), tmpfs(5).
import { execFileSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import type { TestDaemon } from './daemon.js';

/** Mounts a tmpfs of sizeMiB (mode 0700) at daemon.stateDir; undo with unmountState. */
export function mountState(daemon: TestDaemon, sizeMiB: number): void {
  mkdirSync(daemon.stateDir, { recursive: true });
  execFileSync('mount', ['-t', 'tmpfs', '-o', `size=${sizeMiB}m,mode=0700`, 'tmpfs', daemon.stateDir]);
}

/** SIGTERMs the daemon (its exit status, null if it was not running), unmounts its state dir if mounted, and stops it. */
export async function unmountState(daemon: TestDaemon): Promise<{ code: number | null; signal: NodeJS.Signals | null } | null> {
  const exit = await daemon.terminate();
  try {
    execFileSync('umount', [daemon.stateDir]);
  } catch {
    // not mounted
  }
  await daemon.stop();
  return exit;
}
