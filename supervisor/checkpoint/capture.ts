// The checkpoint thread: one worker_thread per supervisor (capture-worker.ts, loaded from dist/
// as scan.ts loads its worker), started on first use and kept, that runs the blocking steps
// (the checkpoint up to its manifest, the read-back) one at a time and answers each by id; progress messages go to the caller
// as they come. One kept thread, not one per step: each new thread's heap and malloc arena
// stayed behind (measured: +20 MiB RSS per step, never returned). A thread that dies fails the
// step it ran (checkpoint_failed) and is replaced at the next one. Owns the thread's life; not
// the steps. Never runs a step on the caller's thread.
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import type { CheckpointRequest, CheckpointStepResult, ReadBackRequest, ReadBackResult, WorkerProgress, WorkerReply } from './capture-worker.js';

type Reply = WorkerReply<unknown>;

function workerPath(): string | null {
  const here = dirname(fileURLToPath(import.meta.url));
  for (const p of [join(here, 'capture-worker.js'), join(here, '../../dist/supervisor/checkpoint/capture-worker.js')]) if (existsSync(p)) return p;
  return null;
}

export class CheckpointThread {
  private worker: Worker | null = null;
  private nextId = 1;
  private readonly waiting = new Map<number, { resolve: (r: Reply) => void; onProgress: (p: WorkerProgress['progress']) => void }>();

  /** Runs req in the thread; never rejects: a failure is {ok: false, code, message} (an errno name, scan_timeout, store_*, checkpoint_failed). */
  run(req: CheckpointRequest, onProgress?: (p: WorkerProgress['progress']) => void): Promise<WorkerReply<CheckpointStepResult>>;
  run(req: ReadBackRequest, onProgress?: (p: WorkerProgress['progress']) => void): Promise<WorkerReply<ReadBackResult>>;
  run(req: CheckpointRequest | ReadBackRequest, onProgress: (p: WorkerProgress['progress']) => void = () => {}): Promise<Reply> {
    let worker: Worker;
    try {
      worker = this.thread();
    } catch (err) {
      return Promise.resolve({ ok: false, code: 'checkpoint_failed', message: `checkpoint_failed: ${(err as Error).message}` });
    }
    const id = this.nextId++;
    return new Promise((resolve) => {
      this.waiting.set(id, { resolve, onProgress });
      worker.ref();
      worker.postMessage({ id, req });
    });
  }

  /** Ends the thread (a step it runs fails); the next run starts another. */
  async stop(): Promise<void> {
    const w = this.worker;
    this.worker = null;
    if (w) await w.terminate();
  }

  private thread(): Worker {
    if (this.worker) return this.worker;
    const path = workerPath();
    if (!path) throw new Error('the checkpoint worker (dist/supervisor/checkpoint/capture-worker.js) is missing; build with tsc');
    const w = new Worker(path, { workerData: { checkpointWorker: true }, resourceLimits: { maxYoungGenerationSizeMb: Number(process.env.CKY ?? 4), maxOldGenerationSizeMb: Number(process.env.CKO ?? 1024) } });
    const failAll = (message: string) => {
      if (this.worker === w) this.worker = null;
      for (const [id, waiter] of this.waiting) {
        this.waiting.delete(id);
        waiter.resolve({ ok: false, code: 'checkpoint_failed', message });
      }
    };
    w.on('message', (m: { id: number; progress?: WorkerProgress['progress']; reply?: Reply }) => {
      const waiter = this.waiting.get(m.id);
      if (!waiter) return;
      if (m.progress) waiter.onProgress(m.progress);
      if (m.reply) {
        this.waiting.delete(m.id);
        if (this.waiting.size === 0) w.unref(); // idle: it must not hold the process up
        waiter.resolve(m.reply);
      }
    });
    w.on('error', (err) => failAll(`checkpoint_failed: the checkpoint thread failed: ${err.message}`));
    w.on('exit', (code) => failAll(`checkpoint_failed: the checkpoint thread exited (${code})`));
    w.unref();
    this.worker = w;
    return w;
  }
}
