// Runs one checkpoint step (capture, rehash) in its own thread (capture-worker.ts, loaded from
// dist/ as scan.ts loads its worker) and resolves with its one reply; progress messages go to
// the caller as they come. Owns the thread's life; not the steps. Never runs a step on the
// caller's thread: without the compiled worker it fails (checkpoint_failed).
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import type { CaptureRequest, CaptureResult, RehashRequest, RehashResult, WorkerProgress, WorkerReply } from './capture-worker.js';

function workerPath(): string | null {
  const here = dirname(fileURLToPath(import.meta.url));
  for (const p of [join(here, 'capture-worker.js'), join(here, '../../dist/supervisor/checkpoint/capture-worker.js')]) if (existsSync(p)) return p;
  return null;
}

/** Runs req in a worker; never rejects: a failure is {ok: false, code, message} (an errno name, scan_timeout, store_*, checkpoint_failed). */
export function runInWorker(req: CaptureRequest, onProgress?: (p: WorkerProgress['progress']) => void): Promise<WorkerReply<CaptureResult>>;
export function runInWorker(req: RehashRequest, onProgress?: (p: WorkerProgress['progress']) => void): Promise<WorkerReply<RehashResult>>;
export function runInWorker(req: CaptureRequest | RehashRequest, onProgress: (p: WorkerProgress['progress']) => void = () => {}): Promise<WorkerReply<unknown>> {
  const path = workerPath();
  if (!path) return Promise.resolve({ ok: false, code: 'checkpoint_failed', message: 'checkpoint_failed: the checkpoint worker (dist/supervisor/checkpoint/capture-worker.js) is missing; build with tsc' });
  return new Promise((resolve) => {
    let done = false;
    const finish = (r: WorkerReply<unknown>) => {
      if (done) return;
      done = true;
      resolve(r);
    };
    let worker: Worker;
    try {
      worker = new Worker(path, { workerData: { ...req, checkpointWorker: true } });
    } catch (err) {
      finish({ ok: false, code: 'checkpoint_failed', message: `checkpoint_failed: cannot start the checkpoint worker: ${(err as Error).message}` });
      return;
    }
    worker.on('message', (m: WorkerReply<unknown> | WorkerProgress) => {
      if ('progress' in m) onProgress(m.progress);
      else finish(m);
    });
    worker.on('error', (err) => finish({ ok: false, code: 'checkpoint_failed', message: `checkpoint_failed: the checkpoint worker failed: ${err.message}` }));
    worker.on('exit', (code) => finish({ ok: false, code: 'checkpoint_failed', message: `checkpoint_failed: the checkpoint worker exited (${code}) without a result` }));
  });
}
