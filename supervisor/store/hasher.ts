// SHA-256 of a stream's stored bytes, computed off the event loop (a digest of gigabytes there would stall
// every deadline): a pool of two worker threads (hash-worker.ts, one HashPool per supervisor) hashes the
// write buffers as their bytes are written (update), and reads the chunk files back for bytes it was not
// shown (advance, digest). The digest is of the stored bytes, which is what the receipt commits to.
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import { availableParallelism } from 'node:os';
import { faultPoint } from '../../core/fault.js';

/** Bytes of progress sent to the worker at once (fewer messages on a fast stream). */
const ADVANCE_BATCH_BYTES = 4 << 20;
/** Hashing threads: two, so that two busy streams hash on both cores of a small machine. */
const POOL_SIZE = Math.min(2, availableParallelism());
/** Workers a digest may go through (each failure replaces the worker and hashes again from 0). */
const DIGEST_ATTEMPTS = 3;

type Answer = { sha256?: string; error?: string; workerFailed?: boolean };

/** One hashing thread and the answers it still owes. */
interface PoolWorker {
  worker: Worker;
  alive: boolean;
  waiting: Map<number, (a: Answer) => void>;
  /** Write buffers it still reads (update), by token: each released once hashed, or when it fails. */
  reading: Map<number, () => void>;
}

/** The compiled worker beside this module (dist/supervisor/store/), also when run from sources; throws if absent. */
export function hashWorkerPath(): string {
  const here = dirname(fileURLToPath(import.meta.url));
  const tried = [join(here, 'hash-worker.js'), join(here, '../../dist/supervisor/store/hash-worker.js')];
  for (const p of tried) if (existsSync(p)) return p;
  throw new Error(`hash worker not found (run npm ci, which compiles dist/); looked in: ${tried.join(', ')}`);
}

/** The hashing threads of one supervisor, started on first use; a failed one is replaced. */
export class HashPool {
  private readonly slots: (PoolWorker | null)[] = [];
  private nextId = 1;
  private nextToken = 1;

  /** onFailure hears the reason each time a thread fails and is replaced (for the log). */
  constructor(
    private readonly onFailure: (reason: string) => void = () => {},
    private readonly size = POOL_SIZE,
  ) {}

  /** The running digest of one stream's stored bytes in dir (its chunk files). */
  stream(dir: string, chunkBytes: number): StreamHasher {
    return new StreamHasher(this, this.nextId++, dir, chunkBytes);
  }

  /** Starts every thread now (they otherwise start on first use); returns this. */
  warm(): this {
    for (let slot = 0; slot < this.size; slot++) this.workerFor(slot);
    return this;
  }

  /** Stops every thread (digests still owed fail); the pool starts new ones if used again. For tests and embedders. */
  async close(): Promise<void> {
    const workers = this.slots.splice(0).filter((pw): pw is PoolWorker => pw !== null);
    await Promise.all(workers.map((pw) => pw.worker.terminate()));
  }

  /** The live worker for a stream id (round robin), started (again) when there is none. */
  workerFor(id: number): PoolWorker {
    const slot = id % this.size;
    const existing = this.slots[slot];
    if (existing?.alive) return existing;
    const pw: PoolWorker = { worker: new Worker(hashWorkerPath()), alive: true, waiting: new Map(), reading: new Map() };
    pw.worker.unref();
    pw.worker.on('message', (m: { id: number; sha256?: string; error?: string; hashed?: number }) => {
      if (m.hashed !== undefined) {
        pw.reading.get(m.hashed)?.();
        pw.reading.delete(m.hashed);
        return;
      }
      pw.waiting.get(m.id)?.(m);
      pw.waiting.delete(m.id);
    });
    // Any failure: the slot gets a fresh worker on next use; every digest it owed is retried there.
    const failed = (reason: string) => {
      if (!pw.alive) return;
      pw.alive = false;
      if (this.slots[slot] === pw) this.slots[slot] = null;
      for (const resolve of pw.waiting.values()) resolve({ workerFailed: true, error: reason });
      pw.waiting.clear();
      for (const release of pw.reading.values()) release();
      pw.reading.clear();
      this.onFailure(reason);
    };
    pw.worker.on('error', (err) => failed(`hash worker error: ${err.message}`));
    pw.worker.on('exit', (code) => failed(`hash worker exited with ${code}`));
    this.slots[slot] = pw;
    return pw;
  }

  /** A token for a write buffer pw reads; release() is called once (hashed, or pw failed). */
  token(pw: PoolWorker, release: () => void): number {
    const t = this.nextToken++;
    pw.reading.set(t, release);
    return t;
  }
}

/** The running digest of one stream's stored bytes; feed it every cursor advance. */
export class StreamHasher {
  private posted = 0;
  /** The worker holding this stream's running hash (null once it failed). */
  private bound: PoolWorker | null;

  constructor(
    private readonly pool: HashPool,
    private readonly id: number,
    private readonly dir: string,
    private readonly chunkBytes: number,
  ) {
    this.bound = this.open();
  }

  /** Opens the stream (from cursor 0) on its slot's live worker. */
  private open(): PoolWorker {
    const pw = this.pool.workerFor(this.id);
    pw.worker.postMessage({ op: 'open', id: this.id, dir: this.dir, chunkBytes: this.chunkBytes });
    return pw;
  }

  /** The stream now holds `cursor` bytes on disk. */
  advance(cursor: number): void {
    if (this.bound?.alive && cursor - this.posted >= ADVANCE_BATCH_BYTES) {
      this.posted = cursor;
      this.bound.worker.postMessage({ op: 'advance', id: this.id, cursor });
    }
  }

  /**
   * Stored bytes [at, at + len) are sab[off, off + len): hashed from there, and release() is
   * called once they were read (at once if this stream's thread failed: its digest reads the
   * chunk files back instead). Every byte before `at` must be stored already.
   */
  update(at: number, sab: SharedArrayBuffer, off: number, len: number, release: () => void): void {
    const pw = this.bound;
    if (!pw?.alive) return release();
    pw.worker.postMessage({ op: 'update', id: this.id, at, sab, off, len, token: this.pool.token(pw, release) });
    this.posted = at + len;
  }

  /**
   * SHA-256 (hex) of the stored bytes [0, finalCursor); rejects when they cannot be read. A worker that fails
   * (error, exit) is replaced; a stream whose running hash died with it is hashed again from cursor 0 by the
   * replacement (the chunk files are the source of truth), DIGEST_ATTEMPTS times at most.
   */
  async digest(finalCursor: number): Promise<string> {
    let lastFailure = '';
    for (let attempt = 0; attempt < DIGEST_ATTEMPTS; attempt++) {
      const pw = this.bound?.alive ? this.bound : this.open();
      this.bound = pw;
      const answer = await new Promise<Answer>((resolve) => {
        pw.waiting.set(this.id, resolve);
        pw.worker.postMessage({ op: 'digest', id: this.id, cursor: finalCursor });
        faultPoint('hasher:terminate-worker', () => void pw.worker.terminate());
      });
      if (answer.sha256) return answer.sha256;
      if (!answer.workerFailed) throw new Error(`cannot hash the stored stream: ${answer.error}`);
      lastFailure = answer.error ?? 'hash worker failed';
      this.bound = null;
    }
    throw new Error(`cannot hash the stored stream: ${DIGEST_ATTEMPTS} hash workers failed (${lastFailure})`);
  }
}
