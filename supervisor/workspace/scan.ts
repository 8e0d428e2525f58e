// A workspace scan off the event loop: starts one scanning thread (scan-worker.ts, loaded from
// dist/ as hasher.ts loads its worker) per scan and resolves with its one reply. Owns the
// thread's life and the outer deadline; not the walk (core/fs/walk.ts) or the digest (digest.ts).
// Never runs a walk on the caller's thread: without the compiled worker it fails (scan_failed).
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import type { ScanKind, ScanReply, ScanRequest } from './scan-worker.js';
import type { FsIdentity } from '../../core/fs/walk.js';

export type { ScanKind, ScanReply } from './scan-worker.js';

/** How long past its deadline a silent worker (a file system call that does not return) is given. */
const WORKER_GRACE_MS = 1000;

/** The compiled worker beside this module (dist/supervisor/workspace/), also when run from sources. */
function workerPath(): string | null {
  const here = dirname(fileURLToPath(import.meta.url));
  for (const p of [join(here, 'scan-worker.js'), join(here, '../../dist/supervisor/workspace/scan-worker.js')]) if (existsSync(p)) return p;
  return null;
}

/**
 * Scans root in a worker thread with the named kind; never rejects. A failure is
 * {ok: false, code, message}: an errno name from the walk, scan_timeout past deadlineMs
 * (counted from this call), or scan_failed (no worker, the worker died). A worker that stays
 * silent past the deadline is left to end by itself (it checks the deadline between entries
 * and closes its fds); the caller gets scan_timeout WORKER_GRACE_MS after the deadline.
 */
export function scanInWorker<T>(root: string, kind: ScanKind, options: { deadlineMs?: number; expectFs?: FsIdentity } = {}): Promise<ScanReply<T>> {
  const req: ScanRequest & { scanWorker: true } = {
    scanWorker: true,
    root,
    kind,
    deadlineMs: options.deadlineMs,
    startHrNs: process.hrtime.bigint(),
    ...(options.expectFs ? { expectFs: options.expectFs } : {}),
  };
  const path = workerPath();
  if (!path)
    return Promise.resolve({
      ok: false,
      code: 'scan_failed',
      message: 'scan_failed: the scan worker (dist/supervisor/workspace/scan-worker.js) is missing; build with tsc',
    });
  return new Promise((resolve) => {
    let done = false;
    let timer: NodeJS.Timeout | undefined;
    const finish = (reply: ScanReply<T>) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      resolve(reply);
    };
    let worker: Worker;
    try {
      worker = new Worker(path, { workerData: req });
    } catch (err) {
      finish({ ok: false, code: 'scan_failed', message: `scan_failed: cannot start the scan worker: ${(err as Error).message}` });
      return;
    }
    worker.on('message', (reply: ScanReply<T>) => finish(reply));
    worker.on('error', (err) => finish({ ok: false, code: 'scan_failed', message: `scan_failed: the scan worker failed: ${err.message}` }));
    worker.on('exit', (code) => finish({ ok: false, code: 'scan_failed', message: `scan_failed: the scan worker exited (${code}) without a result` }));
    if (options.deadlineMs !== undefined) {
      timer = setTimeout(() => {
        worker.unref(); // left to end by itself; it must not hold the process up
        finish({
          ok: false,
          code: 'scan_timeout',
          message: `scan_timeout: the scan passed its ${options.deadlineMs} ms deadline (a file system call did not return)`,
        });
      }, options.deadlineMs + WORKER_GRACE_MS);
    }
  });
}
