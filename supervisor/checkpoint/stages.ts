// What every stage of a checkpoint shares (docs/guide/checkpoints.md "Checkpoints"):
// the one error each stage throws, CHECKPOINT_FAILED with its stage (scan, store, read_back) and
// details, and how requests to a remote store are spread (REMOTE_CONCURRENCY at once).
import { SupervisorError } from '../../ipc/errors.js';

/** Requests to a remote store at once (uploads, read-back): one at a time, radosgw took ~45 ms an object. */
export const REMOTE_CONCURRENCY = 8;

/** CHECKPOINT_FAILED of a stage, with details (code, object, paths, key...). */
export function checkpointFailed(stage: 'scan' | 'store' | 'read_back', message: string, details: Record<string, unknown> = {}): SupervisorError {
  return new SupervisorError('CHECKPOINT_FAILED', message, { stage, ...details });
}

/** Runs fn over items, at most `limit` at once; rejects with the first failure (after the running ones settle). */
export async function inParallel<T>(items: T[], limit: number, fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  let failure: unknown = null;
  const lane = async () => {
    while (failure === null && next < items.length) {
      const item = items[next++];
      try {
        await fn(item);
      } catch (err) {
        failure ??= err;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, lane));
  if (failure !== null) throw failure;
}
