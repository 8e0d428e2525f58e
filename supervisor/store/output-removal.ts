// Removing an ended session's output for retention (docs/guide/close-and-retention.md): each stream
// dir renamed `.removed-<stream>` first (durably: that rename is the decision and needs no free
// block, so it works on a full disk), then its files, then the marker (output-removed.json), then
// the empty dirs. A restart finishes what a crash interrupted (session/recovered.ts).
import { existsSync, readdirSync, renameSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { ALL_STREAMS, OUTPUT_REMOVED_FILE, removedStreamDirName } from '../../core/state/names.js';
import { createFileDurable, fsyncDir } from '../../core/fs/durable.js';
import { faultPoint } from '../../core/fault.js';

/**
 * The decision to remove the output of the session in sessionDir (its receipt and admission
 * record stay): each stream dir renamed `.removed-<stream>`, the dir fsync'ed. From here on the
 * output is gone to readers; finishOutputRemoval frees it.
 */
export function beginOutputRemoval(sessionDir: string): void {
  for (const stream of ALL_STREAMS) {
    const dir = join(sessionDir, stream);
    if (existsSync(dir)) renameSync(dir, join(sessionDir, removedStreamDirName(stream)));
  }
  fsyncDir(sessionDir);
}

/** Whether a removal had begun in sessionDir (a `.removed-<stream>` is left). */
export function outputRemovalBegun(sessionDir: string): boolean {
  return ALL_STREAMS.some((stream) => existsSync(join(sessionDir, removedStreamDirName(stream))));
}

/**
 * Empties the renamed stream dirs (the space comes back), writes the marker (if it is not there
 * yet; bytes: null when a restart finishes it), and only then removes the empty dirs: until the
 * marker is durable, an empty `.removed-<stream>` stays as the trace a restart finishes from.
 */
export function finishOutputRemoval(sessionDir: string, bytes: number | null): void {
  const renamed = ALL_STREAMS.map((stream) => join(sessionDir, removedStreamDirName(stream))).filter((dir) => existsSync(dir));
  for (const dir of renamed) for (const name of readdirSync(dir)) rmSync(join(dir, name), { force: true });
  if (!existsSync(join(sessionDir, OUTPUT_REMOVED_FILE))) {
    faultPoint('retention:before-marker');
    createFileDurable(join(sessionDir, OUTPUT_REMOVED_FILE), JSON.stringify({ removed_at: new Date().toISOString(), bytes }) + '\n');
  }
  for (const dir of renamed) rmSync(dir, { recursive: true, force: true });
  fsyncDir(sessionDir);
}
