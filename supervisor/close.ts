// Close as a join (issue 11): the workspace scan and the close receipt. The scan walks each
// directory through directory fds in a worker thread (workspace/: symlinks are entries, never
// followed; any depth) and digests every entry's relative path, type, size and mtime, after
// the last session died, so "nothing changed after close" is checkable. The close receipt lists
// every session's receipt digest and is signed like a receipt (Ed25519 over JCS without
// `signature`, SPEC "Receipt").
import type { WorkspaceScan } from '../ipc/protocol.js';
import type { CloseDigest } from './workspace/digest.js';
import { scanInWorker } from './workspace/scan.js';

export type { CloseReceipt } from '../ipc/protocol.js';

/** Scans one directory tree off the event loop; never rejects: a failure is `error` + `digest: null`. */
export async function scanWorkspace(root: string, options: { deadlineMs?: number } = {}): Promise<WorkspaceScan> {
  const reply = await scanInWorker<CloseDigest>(root, 'close', options);
  if (reply.ok) return { path: root, ...reply.result };
  return { path: root, files: 0, total_bytes: 0, newest_mtime: null, digest: null, error: reply.code, error_message: reply.message };
}

/** Scans the workspaces one after another (one walk, one worker at a time), in the order given. */
export async function scanWorkspaces(roots: string[], options: { deadlineMs?: number } = {}): Promise<WorkspaceScan[]> {
  const scans: WorkspaceScan[] = [];
  for (const root of roots) scans.push(await scanWorkspace(root, options));
  return scans;
}
