// SHA-256 of a stream's stored bytes, computed off the drain thread: a pool of two workers
// (hash-worker.ts) reads the chunk files back as the cursor advances. Should the worker be
// unavailable or fail, the digest is computed here from the files, synchronously: slower,
// never wrong. The digest is of the stored bytes, which is what the receipt commits to.
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import { availableParallelism } from 'node:os';
import { closeStream, hashUpTo, openStream } from './hash-worker.js';

/** Bytes of progress sent to the worker at once (fewer messages on a fast stream). */
const ADVANCE_BATCH_BYTES = 4 << 20;

/** Hashing threads: two, so that two busy streams hash on both cores of a small machine. */
const POOL_SIZE = Math.min(2, availableParallelism());
const pool: (Worker | null)[] = [];
let poolBroken = false;
let nextId = 1;
const waiting = new Map<number, (r: { sha256?: string; error?: string }) => void>();

/** The compiled worker beside this module (dist/supervisor/), also when run from sources. */
function workerPath(): string | null {
  const here = dirname(fileURLToPath(import.meta.url));
  for (const p of [join(here, 'hash-worker.js'), join(here, '../dist/supervisor/hash-worker.js')]) if (existsSync(p)) return p;
  return null;
}

/** Worker for stream id (round robin), started on first use; null once any has failed. */
function workerFor(id: number): Worker | null {
  if (poolBroken) return null;
  const slot = id % POOL_SIZE;
  const existing = pool[slot];
  if (existing) return existing;
  const path = workerPath();
  if (!path) {
    poolBroken = true;
    return null;
  }
  const worker = new Worker(path);
  worker.unref();
  worker.on('message', (m: { id: number; sha256?: string; error?: string }) => {
    waiting.get(m.id)?.(m);
    waiting.delete(m.id);
  });
  // Any failure: every digest still owed is computed in the caller's thread instead.
  const broken = (err: unknown) => {
    poolBroken = true;
    for (const resolve of waiting.values()) resolve({ error: `hash worker: ${String(err)}` });
    waiting.clear();
  };
  worker.on('error', broken);
  worker.on('exit', (code) => broken(`exited ${code}`));
  pool[slot] = worker;
  return worker;
}

/** The running digest of one stream's stored bytes; feed it every cursor advance. */
export class StreamHasher {
  private readonly id = nextId++;
  private posted = 0;
  private readonly worker: Worker | null;

  constructor(private readonly dir: string, private readonly chunkBytes: number) {
    this.worker = workerFor(this.id);
    this.worker?.postMessage({ op: 'open', id: this.id, dir, chunkBytes });
  }

  /** The stream now holds `cursor` bytes on disk. */
  advance(cursor: number): void {
    if (this.worker && cursor - this.posted >= ADVANCE_BATCH_BYTES) {
      this.posted = cursor;
      this.worker.postMessage({ op: 'advance', id: this.id, cursor });
    }
  }

  /** SHA-256 (hex) of the stored bytes [0, finalCursor); throws when they cannot be read. */
  async digest(finalCursor: number): Promise<string> {
    const w = this.worker && !poolBroken ? this.worker : null;
    if (w) {
      const r = await new Promise<{ sha256?: string; error?: string }>((resolve) => {
        waiting.set(this.id, resolve);
        w.postMessage({ op: 'digest', id: this.id, cursor: finalCursor });
      });
      if (r.sha256) return r.sha256;
    }
    // No worker, or it failed: the same computation here.
    const s = openStream(this.dir, this.chunkBytes);
    try {
      hashUpTo(s, finalCursor);
      return s.hash.digest('hex');
    } finally {
      closeStream(s);
    }
  }
}
