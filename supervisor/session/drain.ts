// Drains one output pipe into its StreamLog, continuously, whether or not anyone reads, so
// the producer never blocks on us (DESIGN.md 7). The pipe's read end is wrapped in a
// net.Socket: libuv reads it without blocking the event loop. Owns the read side and how
// the drain ended (eof, eio, timeout); not the bytes' layout on disk (chunks.ts).
import { EventEmitter } from 'node:events';
import { Socket } from 'node:net';
import type { StreamName, StreamOutput } from '../../ipc/protocol.js';
import { StreamLog } from '../store/chunks.js';
import type { StorageGuard } from '../store/storage.js';
import type { HashPool } from '../store/hasher.js';

export type DrainEnd = 'eof' | 'eio' | 'timeout';

/** How a stream is stored: chunk size, quota (bytes), the state dir's guard, the hashing threads. */
export interface StorePolicy {
  chunkBytes: number;
  quotaBytes: number;
  guard: StorageGuard | null;
  hashPool: HashPool;
}

/**
 * One read buffer for every pipe drained on this thread: libuv reads up to 1 MiB at once into
 * it (the pipe holds up to drain.pipeBytes), and each read is stored before the next one, so
 * sharing it is safe and costs 1 MiB per supervisor, not per stream.
 */
const READ_BUFFER = Buffer.allocUnsafe(1 << 20);

/** Emits 'advance' (cursor) after each stored read and 'end' (DrainEnd) once. */
export class StreamDrain extends EventEmitter {
  readonly log: StreamLog;
  readonly socket: Socket;
  private endedHow: DrainEnd | null = null;
  readonly done: Promise<DrainEnd>;

  /**
   * readFd is a pipe's read end, or a pty master (pty: true), which is also written to
   * (the session's stdin) through `socket`. A pty master is wrapped in a libuv pipe handle,
   * as node-pty does (net.Socket refuses TTY fds); its end is EIO once every slave is closed.
   */
  constructor(sessionDir: string, readonly stream: StreamName, readFd: number, policy: StorePolicy, private readonly pty = false) {
    super();
    this.log = new StreamLog(sessionDir, stream, policy.chunkBytes, policy.hashPool, policy.quotaBytes, policy.guard);
    const store = (data: Buffer) => {
      this.log.append(data, Math.round((performance.timeOrigin + performance.now()) * 1000));
      this.emit('advance', this.log.cursor);
    };
    this.socket = pty
      ? ptySocket(readFd)
      : new Socket({ fd: readFd, readable: true, writable: false, allowHalfOpen: true, onread: { buffer: READ_BUFFER, callback: (n: number, buf: Uint8Array) => void store(Buffer.from(buf.buffer, buf.byteOffset, n)) } } as ConstructorParameters<typeof Socket>[0]);
    this.done = new Promise((resolve) => {
      const finish = (how: DrainEnd) => {
        if (this.endedHow) return;
        this.endedHow = how;
        this.socket.destroy();
        resolve(how);
        this.emit('end', how);
      };
      if (pty) this.socket.on('data', store);
      this.socket.on('end', () => finish('eof'));
      this.socket.on('error', () => finish('eio')); // EIO from a pty master, or any read error
      this.socket.on('close', () => finish('eof'));
      this.cut = () => finish('timeout');
    });
  }

  /** Stops draining now (post-death bound ran out): the stream is marked incomplete. */
  cut: () => void = () => {};

  get cursor(): number {
    return this.log.cursor;
  }

  get ended(): DrainEnd | null {
    return this.endedHow;
  }

  /** Once ended: fsyncs everything and returns the stream's part of the receipt. */
  async finalize(): Promise<StreamOutput> {
    const how = this.endedHow ?? 'timeout';
    const { sha256, indexSha256, chunks } = await this.log.finalize();
    // A pty master that reads EOF (the tty was hung up) rather than EIO (every slave closed)
    // may have dropped bytes still in flight: never claim it complete (issue 7, open).
    const reason = this.log.failure ?? (how === 'timeout' ? 'drain_timeout' : this.pty && how === 'eof' ? 'pty_hangup' : null);
    return {
      final_cursor: this.log.cursor,
      sha256,
      complete: reason === null,
      reason,
      dropped_bytes: this.log.droppedBytes,
      drain_end: how,
      index_sha256: indexSha256,
      chunks,
    };
  }
}

/** A net.Socket over a pty master fd, readable and writable (libuv pipe handle). */
function ptySocket(fd: number): Socket {
  const pipeWrap = (process as unknown as { binding(name: string): { Pipe: new (type: number) => { open(fd: number): number }; constants: { SOCKET: number } } }).binding('pipe_wrap');
  const handle = new pipeWrap.Pipe(pipeWrap.constants.SOCKET);
  const err = handle.open(fd);
  if (err) throw Object.assign(new Error(`cannot open the pty master (${err})`), { code: 'EBADF' });
  return new Socket({ handle, readable: true, writable: true, allowHalfOpen: true } as unknown as ConstructorParameters<typeof Socket>[0]);
}
