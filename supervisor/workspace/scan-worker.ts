// The scanning thread (worker_threads), one per scan: walks one root (core/fs/walk.ts) and reduces its
// entries with the named scan kind (digest.ts), so the blocking syscalls of a walk never run on
// the supervisor's event loop. Input workerData {root, kind, deadlineMs?, startHrNs}; one
// message back, {ok: true, result} | {ok: false, code, message}; then the thread ends.
import { parentPort, workerData } from 'node:worker_threads';
import { closeDigest, mutationDigest } from './digest.js';
import { ScanError, walkTree, type FsIdentity, type WalkEntry } from '../../core/fs/walk.js';

/** The scans a worker can run, by name; each consumes the walk and returns structured-cloneable data. */
export const SCAN_KINDS = {
  close: (entries: Iterable<WalkEntry>) => closeDigest(entries),
  mutation: (entries: Iterable<WalkEntry>) => mutationDigest(entries),
} as const;

export type ScanKind = keyof typeof SCAN_KINDS;

export interface ScanRequest {
  root: string;
  kind: ScanKind;
  deadlineMs?: number;
  startHrNs: bigint;
  /** The watched file system root must be of (core/fs/walk.ts checkFsIdentity). */
  expectFs?: FsIdentity;
}

export type ScanReply<T = unknown> = { ok: true; result: T } | { ok: false; code: string; message: string };

/** Runs one scan in this thread (the worker's body; also usable where blocking is fine, e.g. tests). */
export function runScanHere(req: ScanRequest): ScanReply {
  try {
    const kind = SCAN_KINDS[req.kind];
    if (!kind) return { ok: false, code: 'scan_failed', message: `scan_failed: unknown scan kind ${JSON.stringify(req.kind)}` };
    return { ok: true, result: kind(walkTree(req.root, { deadlineMs: req.deadlineMs, startHrNs: req.startHrNs, expectFs: req.expectFs })) };
  } catch (err) {
    if (err instanceof ScanError) return { ok: false, code: err.code, message: err.message };
    return { ok: false, code: 'scan_failed', message: `scan_failed: ${(err as Error).message}` };
  }
}

if (parentPort && workerData && (workerData as { scanWorker?: boolean }).scanWorker) {
  parentPort.postMessage(runScanHere(workerData as ScanRequest));
}
