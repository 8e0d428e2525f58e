// The checkpoint thread's owner: one worker_thread per supervisor (capture-worker.ts), started
// on first use and kept, running the blocking steps one at a time and answering each by id. A
// thread that dies fails the step it ran and is replaced; what its frozen pass froze is thawed
// from here (FITHAW) when it dies, is stopped, overruns, or this process exits.
import { closeSync, constants, existsSync, openSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import { native } from '../../core/fs/native.js';
import type { CheckpointRequest, CheckpointStepResult, ReadBackRequest, ReadBackResult, WorkerProgress, WorkerReply } from './capture-worker.js';
import { FREEZE_HELD, FREEZE_IDLE, FREEZE_REFUSED } from './passes.js';
import { errnoCode } from '../../ipc/errno.js';

type Reply = WorkerReply<unknown>;

/** How long past checkpoint.freezeMaxMs a frozen pass may go before this thread thaws it (the thread thaws it itself at freezeMaxMs, between entries). */
export const FREEZE_WATCHDOG_MARGIN_MS = 2_000;

/** FITHAW of the file system whose root is path: true when it thawed it, false when it was not frozen (EINVAL). Throws other errors. */
export function thawPath(path: string): boolean {
  const fd = openSync(path, constants.O_RDONLY | constants.O_DIRECTORY);
  try {
    native().thaw(fd);
    return true;
  } catch (err) {
    if (errnoCode(err) === 'EINVAL') return false;
    throw err;
  } finally {
    closeSync(fd);
  }
}

/** Called when this thread thawed a workspace itself (thawed: false when it was not frozen any more), or could not (err). */
export type ThawReport = (workspace: string, why: string, thawed: boolean, err?: Error) => void;

/** Every thread that may hold a file system frozen, thawed at this process's 'exit' (an uncaught exception included). */
const threads = new Set<CheckpointThread>();

/**
 * The thread's V8 young generation, MiB. Kept small: at 32 MiB an unchanged 100,000-file
 * checkpoint ran 15-20% faster in the thread (fewer scavenges) but its process peaked 130 MiB
 * higher (529 against 399 MiB VmHWM, measured in a worker with the same limits).
 */
const YOUNG_GENERATION_MIB = 4;
let exitHook = false;
/** At stop, how long an idle thread may take to finish writing a stat cache (about 150 ms per 100,000 entries here). */
const STOP_FLUSH_WAIT_MS = 5_000;

function workerPath(): string | null {
  const here = dirname(fileURLToPath(import.meta.url));
  for (const p of [join(here, 'capture-worker.js'), join(here, '../../dist/supervisor/checkpoint/capture-worker.js')]) if (existsSync(p)) return p;
  return null;
}

/**
 * One kept thread, not one per step: each new thread's heap and malloc arena stayed behind
 * (measured: +20 MiB RSS per step, never returned). Loaded from dist/ as scan.ts loads its
 * worker; progress messages go to the caller as they come; never runs a step on the caller's thread.
 */
export class CheckpointThread {
  private worker: Worker | null = null;
  private nextId = 1;
  private readonly waiting = new Map<number, { resolve: (r: Reply) => void; onProgress: (p: WorkerProgress['progress']) => void }>();
  /** Shared with the thread (passes.ts FREEZE_*): whether a frozen pass holds a file system frozen. */
  private readonly freezeState = new Int32Array(new SharedArrayBuffer(4));
  /** The workspace of the checkpoint running with a freeze allowed, and its bound. */
  private freezing: { root: string; freezeMaxMs: number } | null = null;
  private watchdog: NodeJS.Timeout | null = null;

  constructor(
    private readonly onThaw: ThawReport = () => {},
    private readonly onFrozen: (workspace: string, frozen: boolean) => void = () => {},
    /** The thread's V8 old-generation heap cap, MiB (checkpoint.workerHeapMiB): reaching it ends the thread (ERR_WORKER_OUT_OF_MEMORY), never the supervisor. */
    private readonly heapMiB = 1024,
  ) {
    threads.add(this);
    if (!exitHook) {
      exitHook = true;
      process.on('exit', () => {
        for (const t of threads) t.thawNow('the supervisor is exiting');
      });
    }
  }

  /**
   * Thaws (FITHAW, from this thread) what the running checkpoint may hold frozen; synchronous
   * (it runs at 'exit' too). EINVAL (not frozen) is no error. A frozen pass thawed under it
   * counts as an ordinary pass (passes.ts).
   */
  thawNow(why: string): void {
    if (this.watchdog) clearTimeout(this.watchdog);
    this.watchdog = null;
    const f = this.freezing;
    if (!f || Atomics.load(this.freezeState, 0) === FREEZE_IDLE) return;
    try {
      this.onThaw(f.root, why, thawPath(f.root));
    } catch (err) {
      this.onThaw(f.root, why, false, err as Error);
    }
  }

  /** At shutdown, before anything waits: no freeze starts any more, and one held is thawed now. */
  refuseFreezing(): void {
    Atomics.store(this.freezeState, 0, FREEZE_REFUSED);
    this.thawNow('the supervisor is stopping');
  }

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
    const freezing = req.kind === 'checkpoint' && (req.freezeMaxMs ?? 0) > 0 ? { root: req.root, freezeMaxMs: req.freezeMaxMs! } : null;
    if (freezing) this.freezing = freezing;
    return new Promise<Reply>((resolve) => {
      this.waiting.set(id, { resolve, onProgress });
      worker.ref();
      worker.postMessage({ id, req: req.kind === 'checkpoint' ? { ...req, freezeState: this.freezeState } : req });
    }).finally(() => {
      if (freezing && this.freezing === freezing) {
        if (this.watchdog) clearTimeout(this.watchdog);
        this.watchdog = null;
        this.freezing = null;
      }
    });
  }

  /**
   * Resolves once every step posted before it is done and the thread's idle write of a confirmed
   * stat cache (stat-cache.ts flush) is made, or after STOP_FLUSH_WAIT_MS: the sandbox close
   * waits for it, so nothing is written in the state dir once its close receipt is.
   */
  async settled(): Promise<void> {
    if (this.worker) await this.idle(this.worker, STOP_FLUSH_WAIT_MS);
  }

  /** Ends the thread (a step it runs fails), what it froze thawed first and after; the next run starts another (and never freezes). */
  async stop(): Promise<void> {
    this.refuseFreezing();
    const w = this.worker;
    this.worker = null;
    // An idle thread may still be writing the stat cache a read-back confirmed (stat-cache.ts
    // flush): let it finish, so a restart right after a checkpoint starts from that one.
    if (w && this.waiting.size === 0) await this.idle(w, STOP_FLUSH_WAIT_MS);
    if (w) await w.terminate();
    this.thawNow('the supervisor is stopping'); // one frozen between the refusal and the end
  }

  /** Resolves once the thread answers a message posted now (so everything before it is done), or after ms, or when it exits. */
  private idle(w: Worker, ms: number): Promise<void> {
    const id = this.nextId++;
    return new Promise<void>((resolve) => {
      const timer = setTimeout(() => {
        this.waiting.delete(id);
        resolve();
      }, ms);
      this.waiting.set(id, {
        resolve: () => {
          clearTimeout(timer);
          resolve();
        },
        onProgress: () => {},
      });
      w.postMessage({ id, req: { kind: 'flush' } });
    });
  }

  /** A frozen pass began (the thread says so once FIFREEZE returned) or ended: the watchdog past freezeMaxMs. */
  private frozenChanged(frozen: boolean): void {
    if (this.watchdog) clearTimeout(this.watchdog);
    this.watchdog = null;
    const f = this.freezing;
    if (!f) return;
    this.onFrozen(f.root, frozen);
    if (!frozen) return;
    this.watchdog = setTimeout(
      () => this.thawNow(`the frozen pass ran past checkpoint.freezeMaxMs (${f.freezeMaxMs} ms) + ${FREEZE_WATCHDOG_MARGIN_MS} ms without thawing`),
      f.freezeMaxMs + FREEZE_WATCHDOG_MARGIN_MS,
    );
    this.watchdog.unref();
  }

  private thread(): Worker {
    if (this.worker) return this.worker;
    const path = workerPath();
    if (!path) throw new Error('the checkpoint worker (dist/supervisor/checkpoint/capture-worker.js) is missing; build with tsc');
    const w = new Worker(path, {
      workerData: { checkpointWorker: true },
      resourceLimits: { maxYoungGenerationSizeMb: YOUNG_GENERATION_MIB, maxOldGenerationSizeMb: this.heapMiB },
    });
    const failAll = (message: string) => {
      if (this.worker === w) this.worker = null;
      this.thawNow(message); // before its step fails: a thread that died frozen (out of memory, say) never thaws
      if (Atomics.load(this.freezeState, 0) === FREEZE_HELD) Atomics.store(this.freezeState, 0, FREEZE_IDLE);
      for (const [id, waiter] of this.waiting) {
        this.waiting.delete(id);
        waiter.resolve({ ok: false, code: 'checkpoint_failed', message });
      }
    };
    w.on('message', (m: { id: number; progress?: WorkerProgress['progress']; frozen?: boolean; reply?: Reply }) => {
      const waiter = this.waiting.get(m.id);
      if (!waiter) return;
      if (m.progress) waiter.onProgress(m.progress);
      if (m.frozen !== undefined) this.frozenChanged(m.frozen);
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
