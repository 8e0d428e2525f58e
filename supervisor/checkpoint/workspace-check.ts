// Which directory a checkpoint takes (docs/guide/checkpoints.md "Checkpoints"): the workspace as
// walked (its real path, a directory, holding neither the state dir nor the store), and whether
// its last pass may run frozen (checkpoint.freeze: only a workspace that is its own mount).
import { realpathSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { SupervisorError } from '../../ipc/errors.js';
import { errnoCode } from '../../ipc/errno.js';

/** The workspace as a checkpoint names it (its real path, realpath(3)), or null when it cannot be resolved. */
export function realWorkspace(path: string): string | null {
  try {
    return realpathSync(path);
  } catch {
    return null;
  }
}

/** The workspace as walked: its real path, a directory, holding neither the state dir nor the store (storeDir). SupervisorError INVALID_ARGUMENT. */
export function checkWorkspace(path: string, stateDir: string, storeDir: string): string {
  let real: string;
  try {
    real = realpathSync(path);
    if (!statSync(real).isDirectory()) throw Object.assign(new Error(`${path} is not a directory`), { code: 'ENOTDIR' });
  } catch (err) {
    throw new SupervisorError('INVALID_ARGUMENT', `checkpoint: workspace ${path}: ${errnoCode(err) === 'ENOENT' ? 'does not exist' : (err as Error).message}`, {
      field: 'workspace',
    });
  }
  const inside = (a: string, b: string) => a === b || a.startsWith(b.endsWith('/') ? b : b + '/');
  for (const [what, dir] of [
    ['state dir', stateDir],
    ['checkpoint store', storeDir],
  ]) {
    let d = dir;
    try {
      d = realpathSync(dir);
    } catch {
      // not made yet
    }
    if (inside(d, real))
      throw new SupervisorError('INVALID_ARGUMENT', `checkpoint: the directory ${path} holds the ${what} ${dir}: a checkpoint would hold itself`, {
        field: 'workspace',
      });
    if (inside(real, d)) throw new SupervisorError('INVALID_ARGUMENT', `checkpoint: workspace ${path} is inside the ${what} ${dir}`, { field: 'workspace' });
  }
  return real;
}

/**
 * Whether the last pass may run frozen (checkpoint.freeze, `asked`): only a workspace that is
 * its own mount, on a file system holding neither the state dir nor the store (their writes
 * would wait for the thaw). refused: why not (null: it may).
 */
export function freezePlan(workspace: string, freeze: boolean, stateDir: string, storeDir: string): { asked: boolean; refused: string | null } {
  if (!freeze) return { asked: false, refused: 'off' };
  try {
    const dev = statSync(workspace).dev;
    if (workspace !== '/' && statSync(join(workspace, '..')).dev === dev)
      return { asked: true, refused: 'the workspace is not its own mount: freezing would stop every writer of the file system it is on' };
    if (statSync(stateDir).dev === dev) return { asked: true, refused: "the state dir is on the workspace's file system" };
    if (statSync(storeDir).dev === dev) return { asked: true, refused: "the checkpoint store is on the workspace's file system" };
  } catch (err) {
    return { asked: true, refused: `cannot tell: ${(err as Error).message}` };
  }
  return { asked: true, refused: null };
}
