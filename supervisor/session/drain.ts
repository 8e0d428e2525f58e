// Drains one output pipe into its StreamLog, continuously, whether or not anyone reads, so
// the producer never blocks on us (docs/design/facts.md 7). The pipe's read end is wrapped in a
// net.Socket: libuv reads it without blocking the event loop. Owns the read side and how
// the drain ended (eof, eio, timeout); not the bytes' layout on disk (chunks.ts).
import { EventEmitter } from 'node:events';
import { closeSync, constants, openSync, readSync, writeSync } from 'node:fs';
import { Socket } from 'node:net';
import { ReadStream } from 'node:tty';
import type { StreamName, StreamOutput } from '../../ipc/protocol.js';
import { native } from '../../core/fs/native.js';
import { arrivalNowUs, StreamLog } from '../store/chunks.js';
import type { StorageGuard } from '../store/storage.js';
import type { HashPool } from '../store/hasher.js';
import { errnoCode } from '../../ipc/errno.js';

/** handoff: handed on to a service with the processes holding the pipe (handOff). */
export type DrainEnd = 'eof' | 'eio' | 'timeout' | 'handoff';

/** How a stream is stored: chunk size, quota (bytes), the state dir's guard, the hashing threads. */
export interface StorePolicy {
  chunkBytes: number;
  quotaBytes: number;
  guard: StorageGuard | null;
  hashPool: HashPool;
}

/**
 * One read buffer for every pipe drained on this thread: libuv reads up to 1 MiB at once into
 * it (the pipe holds up to drain.pipeBytes), and each read is copied into the stream's write
 * buffers (or written) before the next one, so sharing it is safe and costs 1 MiB per supervisor, not per stream.
 */
const READ_BUFFER = Buffer.allocUnsafe(1 << 20);

/** More than a pty can hold between its writer and its reader: n_tty's 4 KiB read buffer and the port's 8 KiB flip buffer (pty.c tty_buffer_set_limit), with room. */
const PTY_HELD_BYTES = 1 << 20;

/** Emits 'advance' (cursor) after each write to the chunk files and 'end' (DrainEnd) once, after the last. */
export class StreamDrain extends EventEmitter {
  readonly log: StreamLog;
  readonly socket: Socket;
  private endedHow: DrainEnd | null = null;
  /** endedHow, once every byte read is in the chunk files: readers may take the cursor as final. */
  private storedHow: DrainEnd | null = null;
  readonly done: Promise<DrainEnd>;

  /**
   * readFd is a pipe's read end, or a pty master (pty: true), which is also written to
   * (the session's stdin) through `socket` (ptySocket: net.Socket refuses TTY fds); its end
   * is EIO once every slave is closed.
   */
  constructor(
    sessionDir: string,
    readonly stream: StreamName,
    private readonly readFd: number,
    policy: StorePolicy,
    private readonly pty = false,
  ) {
    super();
    this.log = new StreamLog(sessionDir, stream, policy.chunkBytes, policy.hashPool, policy.quotaBytes, policy.guard);
    // false: this stream's write buffers are full (the disk is behind): the next read waits
    // until the log has room (onRoom); the pipe holds what comes meanwhile.
    const store = (this.store = (data: Buffer): boolean => {
      if (this.boundLeftMs !== null) this.readInBoundBytes += data.length;
      if (this.log.append(data, arrivalNowUs())) return true;
      this.holdBound();
      return false;
    });
    this.log.onAdvance = (cursor) => this.emit('advance', cursor);
    this.log.onRoom = () => {
      if (this.endedHow) return;
      this.socket.resume();
      this.armBound();
    };
    this.socket = pty
      ? ptySocket(readFd)
      : new Socket({
          fd: readFd,
          readable: true,
          writable: false,
          allowHalfOpen: true,
          onread: { buffer: READ_BUFFER, callback: (n: number, buf: Uint8Array) => store(Buffer.from(buf.buffer, buf.byteOffset, n)) },
        } as ConstructorParameters<typeof Socket>[0]);
    this.done = new Promise((resolve) => {
      const finish = (how: DrainEnd) => {
        if (this.endedHow) return;
        this.endedHow = how;
        this.clearBound();
        this.socket.destroy();
        // Ended once every byte read is in the chunk files (or dropped).
        void this.log.idle().then(() => {
          this.storedHow = how;
          resolve(how);
          this.emit('end', how);
        });
      };
      if (pty) this.socket.on('data', (data: Buffer) => void (store(data) || this.socket.pause()));
      this.socket.on('end', () => finish(pty ? this.ptyEnd() : 'eof'));
      this.socket.on('error', () => finish('eio')); // EIO from a pty master, or any read error
      this.socket.on('close', () => finish('eof'));
      this.finish = finish;
      this.cut = () => finish('timeout');
      this.endHandedOff = () => finish('handoff');
    });
  }

  private endHandedOff: () => void = () => {};
  private finish: (how: DrainEnd) => void = () => {};
  private readonly store: (data: Buffer) => boolean;

  /**
   * Hands the pipe on (linger handoff), once every process that can write it is frozen: reads
   * what the pipe holds now into this stream, synchronously (nothing runs in between, and
   * nothing frozen can write more), ends this stream (drain_end handoff, complete) and returns
   * a new read end of the same pipe for the service's drain (/proc/self/fd reopens a pipe:
   * proc(5)), or null when the stream has ended already (no writer held it). Pipes only.
   */
  handOff(): number | null {
    if (this.endedHow || this.pty) return null;
    const next = openSync(`/proc/self/fd/${this.readFd}`, constants.O_RDONLY | constants.O_NONBLOCK);
    this.socket.pause();
    let eof = false;
    try {
      for (;;) {
        const n = readSync(next, READ_BUFFER, 0, READ_BUFFER.length, null);
        if (n === 0) {
          eof = true;
          break;
        }
        this.log.append(Buffer.from(READ_BUFFER.subarray(0, n)), arrivalNowUs());
      }
    } catch (err) {
      if (errnoCode(err) !== 'EAGAIN') {
        closeSync(next);
        throw err;
      }
    }
    this.endHandedOff();
    if (!eof) return next;
    closeSync(next);
    return null;
  }

  /** Stops draining now (post-death bound ran out): the stream is marked incomplete. */
  cut: () => void = () => {};

  /** Time left of the post-death bound (ms), once started; null before. */
  private boundLeftMs: number | null = null;
  private boundTimer: NodeJS.Timeout | null = null;
  private boundArmedAt = 0;
  /** Bytes read since the bound started, and how many of them the pipe can have held at the writers' death. */
  private readInBoundBytes = 0;
  private heldAtDeathBytes = 0;
  private waitingOnDisk = false;
  /** The pty was hung up while the session ran (sawHangup). */
  private hungUp = false;

  /**
   * Cuts the drain once it has waited boundMs for the pipe's end (every writer in the
   * session is dead; an fd passed outside may hold it). Time the drain is paused on its own
   * write buffers (append() said to wait: the disk is behind) does not count while what it
   * reads could still be what the pipe held when the writers died (pipeBytes: its capacity,
   * F_SETPIPE_SZ rounds up to a power of two pages, fcntl(2)): those bytes wait in the pipe
   * because of us, and the EOF behind them cannot be read before them. Past that, a writer
   * outside is feeding the pipe, and every millisecond counts.
   */
  startBound(boundMs: number, pipeBytes: number): void {
    if (this.boundLeftMs !== null || this.endedHow) return;
    this.boundLeftMs = boundMs;
    this.readInBoundBytes = 0;
    this.heldAtDeathBytes = 2 ** Math.ceil(Math.log2(Math.max(pipeBytes, 65536)));
    if (!this.waitingOnDisk) this.armBound();
  }

  private clearBound(): void {
    if (this.boundTimer) clearTimeout(this.boundTimer);
    this.boundTimer = null;
  }

  private armBound(): void {
    this.waitingOnDisk = false;
    if (this.boundLeftMs === null || this.boundTimer) return;
    this.boundArmedAt = performance.now();
    this.boundTimer = setTimeout(() => this.boundRanOut(), this.boundLeftMs);
  }

  /**
   * The bound's timer fired. After a stall of the event loop (a GC, a sync write, a loaded
   * machine) it runs before the loop's poll phase has read what came meanwhile, so the pipe is
   * read here first, non-blocking (its fd is O_NONBLOCK, as libuv set it): its end (EOF; EIO
   * for a pty master) ends the drain as it would have; EAGAIN (empty, a writer still holds it)
   * cuts it; more than the pipe could hold at the writers' death, still flowing, cuts it too (a
   * writer outside feeds it). See pipe(7), read(2).
   */
  private boundRanOut(): void {
    this.boundTimer = null;
    if (this.endedHow) return;
    const end = this.readNow(this.heldAtDeathBytes);
    if (end === 'eof' || (end === 'eio' && this.pty)) return this.finish(end);
    this.cut();
  }

  /**
   * Reads the fd now, synchronously and non-blocking (O_NONBLOCK, as libuv set it), storing
   * what comes, until its end or past limitBytes: 'eof' (a read gave 0), 'eio', 'empty'
   * (EAGAIN: a writer still holds it), 'more' (past limitBytes, still flowing) or 'error' (any
   * other read error). See read(2).
   */
  private readNow(limitBytes: number): 'eof' | 'eio' | 'empty' | 'more' | 'error' {
    let readBytes = 0;
    try {
      while (readBytes <= limitBytes) {
        const n = readSync(this.readFd, READ_BUFFER, 0, READ_BUFFER.length, null);
        if (n === 0) return 'eof';
        readBytes += n;
        this.store(READ_BUFFER.subarray(0, n));
      }
    } catch (err) {
      const code = errnoCode(err);
      return code === 'EIO' ? 'eio' : code === 'EAGAIN' ? 'empty' : 'error';
    }
    return 'more';
  }

  /**
   * libuv's end of a pty master is not the kernel's. After a read shorter than its buffer, a
   * POLLHUP (every slave closed, or a hangup: n_tty_poll) makes libuv report EOF without
   * reading again (uv__stream_io), as if that read had emptied the fd. A tty hands its input
   * over in pieces: n_tty's 4 KiB read buffer, refilled from the port's flip buffer
   * (tty_buffer.c), so bytes can still wait behind a short read. Reads the master here,
   * non-blocking, to its real end: EIO once every slave is closed (n_tty_read flushes the
   * flip buffer first), 0 if the master's file was hung up (eof, never complete). A hangup of
   * the slave side shows nothing here: LiveSession.releaseStdio sees it (sawHangup). Bounded
   * like boundRanOut: past what a pty can hold, a writer still feeds it.
   */
  private ptyEnd(): DrainEnd {
    const end = this.readNow(PTY_HELD_BYTES);
    return end === 'eio' ? 'eio' : end === 'more' ? 'timeout' : 'eof';
  }

  private holdBound(): void {
    this.waitingOnDisk = true;
    if (!this.boundTimer || this.readInBoundBytes > this.heldAtDeathBytes) return;
    clearTimeout(this.boundTimer);
    this.boundTimer = null;
    this.boundLeftMs = Math.max(0, this.boundLeftMs! - (performance.now() - this.boundArmedAt));
  }

  get cursor(): number {
    return this.log.cursor;
  }

  /**
   * The pty was hung up while the session ran (its slave fd answers EIO: LiveSession.releaseStdio).
   * A hangup flushes what was in flight to the master, and the master still reads on to EIO, so
   * its end cannot tell: the stream is not complete (pty_hangup), whatever end it reaches.
   */
  sawHangup(): void {
    this.hungUp = true;
  }

  /** How the drain ended, once its last bytes are stored (the cursor is final); null before. */
  get ended(): DrainEnd | null {
    return this.storedHow;
  }

  /** Once ended: fsyncs everything and returns the stream's part of the receipt. */
  async finalize(): Promise<StreamOutput> {
    const how = this.endedHow ?? 'timeout';
    const { sha256, indexSha256, chunks } = await this.log.finalize();
    // A pty master that reads EOF (the tty was hung up) rather than EIO (every slave closed),
    // or whose tty was hung up on the way (sawHangup), may have lost bytes in flight: never complete.
    const reason = this.log.failure ?? (how === 'timeout' ? 'drain_timeout' : this.pty && (how === 'eof' || this.hungUp) ? 'pty_hangup' : null);
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

/**
 * A pty master fd (O_NONBLOCK, from openPty) as a net.Socket, readable and writable. Reads are
 * libuv's, through a tty handle (tty.ReadStream, as node-pty reads its master): every byte,
 * then EIO once every slave is closed, or EOF if the tty was hung up. Writes (the session's
 * stdin) are not: libuv cannot reopen a master, so its tty handle writes one synchronously,
 * looping on EAGAIN (uv_tty_init: UV_HANDLE_BLOCKING_WRITES), which would stall the event
 * loop while the slave's input queue is full. Here each write is one non-blocking write(2);
 * what the kernel does not take yet waits for the fd to be writable (native waitWritable,
 * epoll), and the write's callback, so 'drain', waits with it: backpressure, never blocking.
 */
class PtyMaster extends ReadStream {
  private cancelWait: (() => void) | null = null;

  constructor(private readonly masterFd: number) {
    super(masterFd, { allowHalfOpen: true });
  }

  override _write(chunk: Buffer | string, encoding: BufferEncoding, callback: (err?: Error | null) => void): void {
    this.writeFrom(typeof chunk === 'string' ? Buffer.from(chunk, encoding) : chunk, callback);
  }

  override _writev(chunks: { chunk: Buffer | string; encoding: BufferEncoding }[], callback: (err?: Error | null) => void): void {
    this.writeFrom(Buffer.concat(chunks.map((c) => (typeof c.chunk === 'string' ? Buffer.from(c.chunk, c.encoding) : c.chunk))), callback);
  }

  /** A master has no half-close: the session's end of input is ^D (Session.write). */
  override _final(callback: (err?: Error | null) => void): void {
    callback();
  }

  override _destroy(err: Error | null, callback: (err?: Error | null) => void): void {
    this.cancelWait?.();
    this.cancelWait = null;
    super._destroy(err, callback);
  }

  private writeFrom(data: Buffer, callback: (err?: Error | null) => void): void {
    let written = 0;
    try {
      written = writeSync(this.masterFd, data);
    } catch (err) {
      if (errnoCode(err) !== 'EAGAIN') {
        // EIO: no slave is open any more. The read side ends by itself once it has read
        // every byte (EIO too); failing the write now would close the master before that.
        this.once('close', () => callback(err as Error));
        return;
      }
    }
    if (written === data.length) return callback();
    const rest = data.subarray(written);
    this.cancelWait = native().waitWritable(this.masterFd, () => {
      this.cancelWait = null;
      if (!this.destroyed) this.writeFrom(rest, callback);
    });
  }
}

/** The pty master's socket (see PtyMaster). */
function ptySocket(fd: number): Socket {
  return new PtyMaster(fd);
}
