// The buffers a stream's bytes wait in between the pipe read (on the event loop) and their write to a chunk
// file (on libuv's threadpool, chunks.ts): one pool per supervisor, of WRITE_BUFFER_BYTES each,
// WRITE_BUFFER_LIMIT at most, so the memory the drain holds is bounded however many streams run.

/** Bytes of one write buffer: one pipe read at most (drain.ts reads up to 1 MiB at once). */
export const WRITE_BUFFER_BYTES = 1 << 20;

/** Buffers of every stream together, at most (32 MiB). */
export const WRITE_BUFFER_LIMIT = 32;

/** Buffers one stream holds at most (filling, waiting, or written and still hashed): 4 MiB. */
export const STREAM_WRITE_BUFFERS = 4;

/** A free list of WRITE_BUFFER_BYTES buffers, made on first use, never more than `limit`. */
export class WriteBufferPool {
  private readonly free: Buffer[] = [];
  private made = 0;

  constructor(readonly limit = WRITE_BUFFER_LIMIT) {}

  /**
   * A buffer, or null when all `limit` are in use: a stream that cannot get one stores synchronously
   * (chunks.ts), so no stream ever waits for another's buffers.
   */
  take(): Buffer | null {
    const buf = this.free.pop();
    if (buf) return buf;
    if (this.made >= this.limit) return null;
    this.made++;
    // Shared memory: the hashing thread reads the written bytes from it, no copy (hasher.ts).
    return Buffer.from(new SharedArrayBuffer(WRITE_BUFFER_BYTES));
  }

  /** Whether take() would return a buffer now. */
  available(): boolean {
    return this.free.length > 0 || this.made < this.limit;
  }

  /** Gives a buffer from take() back, once its bytes are written and hashed (the hashing thread reads them from the shared memory). */
  give(buf: Buffer): void {
    // Kept, never left to the garbage collector: a shared buffer's memory is freed only once
    // every thread's handle to it is collected, and the hashing threads collect rarely (left
    // to it, 8 streams of 256 MiB grew the supervisor by 100-300 MiB a run). So the pool is
    // at most `limit` buffers for the supervisor's life.
    this.free.push(buf);
  }

  /** Buffers out of the pool right now (for tests). */
  get inUse(): number {
    return this.made - this.free.length;
  }
}

/** The supervisor's pool (module-wide: one event loop, one pool). */
export const writeBuffers = new WriteBufferPool();
