// One client connection of the supervisor's socket (a Unix socket, server.ts, or a WebSocket seen through
// ws-socket.ts): its frame decoder and the bounds on incoming frames (time to arrive, bytes held across
// connections), its peer (SO_PEERCRED), its requests in flight, and backpressure both ways. Owns one socket's
// frames; not what a request does (handlers/) nor dispatch (dispatch.ts).
import type { EventEmitter } from 'node:events';
import { SupervisorError } from '../../ipc/errors.js';
import { encodeFrame, FrameDecoder } from '../../ipc/framing.js';

/** Output frame slabs kept per connection for reuse (OUTBOUND_HIGH_WATER_BYTES / 1 MiB). */
const FRAME_POOL_SIZE = 4;

/** Bytes of one output frame slab: a full output event (1 MiB) and its head, with room for a few short ones. */
const FRAME_SLAB_BYTES = (1 << 20) + 4096;

/** A buffer output frames are encoded into one after another, reused once the socket has written every one. */
interface FrameSlab {
  buf: Buffer;
  /** Bytes of it handed out to frames. */
  used: number;
  /** Its frames the socket has not written yet. */
  unwritten: number;
}

/** Longest setTimeout delay (a longer one fires at once); longer waits re-arm. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/** Bytes queued towards a client above which we stop reading its requests. */
const OUTBOUND_HIGH_WATER_BYTES = 4 * 1024 * 1024;

/**
 * What a Connection uses of its socket (a net.Socket has it; ws-socket.ts gives a WebSocket
 * it): 'data' (frame bytes), 'drain', 'close', 'error' events; write gets whole frames.
 */
export interface ConnectionSocket extends EventEmitter {
  write(data: Buffer, cb?: (err?: Error | null) => void): boolean;
  end(data: Buffer): unknown;
  destroy(): unknown;
  pause(): unknown;
  resume(): unknown;
  readonly writableLength: number;
}

/**
 * Who is on the other end: SO_PEERCRED on the Unix socket (a bridge is a local peer too); a
 * WebSocket peer has none: pid 0, the supervisor's own uid and gid (the token is its
 * credential), and `remote` naming the transport and address ("ws 10.0.0.7:51234").
 */
export interface Peer {
  pid: number;
  uid: number;
  gid: number;
  remote?: string;
}

/** Bytes of incomplete frames held by all connections together, and their bound (0: none). */
export interface PendingFrames {
  heldBytes: number;
  readonly maxBytes: number;
}

/** What bounds one connection's incoming frames; onFrameTimeout refuses it (its frame took over timeoutMs). */
export interface FrameLimits {
  maxFrameBytes: number;
  /** 0: no bound. */
  frameTimeoutMs: number;
  pending: PendingFrames;
  onFrameTimeout: (conn: Connection, err: SupervisorError) => void;
}

/**
 * One client connection: its decoder, its peer, what it has in flight, and backpressure (a client that does
 * not read stops being read; output frames are pipelined up to a high water mark and reuse pooled buffers).
 */
export class Connection {
  private readonly decoder: FrameDecoder;
  helloDone = false;
  closed = false;
  /** Requests received and not yet finished (subscriptions until their end event). */
  inFlight = 0;
  private readonly drainWaiters: (() => void)[] = [];
  /** Called once when the socket closes (see onClose): one socket listener for all of them. */
  private readonly closeWaiters = new Set<() => void>();
  /** Bytes this connection adds to limits.pending.heldBytes (its decoder's incomplete frame). */
  private countedBytes = 0;
  private frameTimer: NodeJS.Timeout | null = null;
  /** The incomplete frame the clock runs for (its frameStartedAt), and the ms we did not read it. */
  private frameClock = { startedAt: null as number | null, notReadMs: 0 };
  /** performance.now() when backpressure stopped our reading; null while we read. */
  private readPausedAt: number | null = null;
  /** Frames decoded and not yet dispatched (dispatch.ts serveConnection's slices): reading waits for them, since heldAt. */
  private dispatchHeld = false;
  private heldAt: number | null = null;
  /** refuse() was called: nothing more of this connection is dispatched. */
  refused = false;

  constructor(
    readonly socket: ConnectionSocket,
    private readonly limits: FrameLimits,
    readonly peer: Peer,
  ) {
    this.decoder = new FrameDecoder(limits.maxFrameBytes);
    socket.on('drain', () => this.wake());
    socket.on('close', () => {
      this.closed = true;
      this.dropFrame();
      this.wake();
      for (const fn of [...this.closeWaiters]) fn();
      this.closeWaiters.clear();
    });
    socket.on('error', () => {});
  }

  /**
   * Calls fn once when the socket closes (at once if it has); returns what unregisters it. A
   * request waiting on the close (a follow long poll) registers here, not on the socket: up
   * to ipc.maxInFlight of them at once would pass the socket's listener warning (10).
   */
  onClose(fn: () => void): () => void {
    if (this.closed) {
      fn();
      return () => {};
    }
    this.closeWaiters.add(fn);
    return () => void this.closeWaiters.delete(fn);
  }

  /** Callbacks registered with onClose and not yet called or removed (for tests). */
  get closeWaiterCount(): number {
    return this.closeWaiters.size;
  }

  /**
   * Decodes what arrived. Throws (the connection is then refused) on a bad frame, and
   * LIMIT_EXCEEDED when this connection's incomplete frame brings the bytes of incomplete
   * frames of all connections over ipc.maxPendingFrameBytes: the others keep theirs.
   */
  decode(data: Buffer, onFrame: (value: unknown) => void): void {
    try {
      this.decoder.push(data, onFrame);
    } finally {
      this.count();
    }
    const pending = this.limits.pending;
    if (pending.maxBytes > 0 && this.countedBytes > 0 && pending.heldBytes > pending.maxBytes) {
      throw new SupervisorError('LIMIT_EXCEEDED', `incomplete frames of all connections would hold more than ${pending.maxBytes} bytes`, {
        limit: 'pending_frame_bytes',
        max: pending.maxBytes,
        retry_after_ms: 500,
      });
    }
    this.armFrameTimer();
  }

  /** Keeps limits.pending.heldBytes equal to the sum of every connection's incomplete frame. */
  private count(): void {
    const bytes = this.decoder.bufferedBytes;
    this.limits.pending.heldBytes += bytes - this.countedBytes;
    this.countedBytes = bytes;
  }

  /** Drops the incomplete frame, its bytes and its clock (refused or closed: nothing more is decoded). */
  private dropFrame(): void {
    this.decoder.reset();
    this.count();
    if (this.frameTimer) clearTimeout(this.frameTimer);
    this.frameTimer = null;
  }

  /**
   * One timer per connection while a frame is incomplete, due at its first byte plus
   * frameTimeoutMs plus the time backpressure or our own dispatch kept us from reading (that
   * wait is ours, not the peer's). Between frames nothing runs: an idle connection is not bounded here.
   */
  private armFrameTimer(): void {
    const timeoutMs = this.limits.frameTimeoutMs;
    const startedAt = this.decoder.frameStartedAt;
    if (timeoutMs === 0 || startedAt === null || this.frameTimer || this.readPausedAt !== null || this.dispatchHeld || this.closed || this.refused) return;
    if (this.frameClock.startedAt !== startedAt) this.frameClock = { startedAt, notReadMs: 0 };
    const leftMs = startedAt + this.frameClock.notReadMs + timeoutMs - performance.now();
    if (leftMs > 0) {
      this.frameTimer = setTimeout(
        () => {
          this.frameTimer = null;
          this.armFrameTimer();
        },
        Math.min(Math.ceil(leftMs), MAX_TIMER_MS),
      );
      return;
    }
    this.limits.onFrameTimeout(
      this,
      new SupervisorError('LIMIT_EXCEEDED', `a frame did not arrive whole within ${timeoutMs} ms of its first byte`, { limit: 'frame_time', max: timeoutMs }),
    );
  }

  /**
   * Sends a frame; resolves when the socket can take more. While the client does not read,
   * its requests are not read either, so nothing queues without bound on either side.
   */
  async send(frame: unknown): Promise<void> {
    return this.sendEncoded(encodeFrame(frame));
  }

  /**
   * Output frames are encoded into slabs, one after another, and a slab is reused once the
   * socket has written all of its frames. A buffer per frame made garbage the size of the
   * output: replay's 1 MiB events halved its rate in a large supervisor, and a followed
   * stream's events, often a few KiB, grew the supervisor's malloc heap by 20-30 MiB for a
   * 1 GiB line before a GC freed them. Memory held: the slabs of frames the socket still
   * queues (OUTBOUND_HIGH_WATER_BYTES bounds those) and FRAME_POOL_SIZE free ones.
   */
  private slab: FrameSlab | null = null;
  private readonly slabPool: Buffer[] = [];

  /**
   * A buffer of at least `bytes` to encode an output frame into (encodeOutputFrame): the free
   * end of this connection's current slab, or a new slab's. The frame encoded at its start
   * goes to sendEncoded, which takes its bytes from the slab.
   */
  frameBuffer(bytes: number): Buffer {
    let slab = this.slab;
    if (!slab || slab.buf.length - slab.used < bytes) {
      const pooled = this.slabPool.pop();
      const buf = pooled && pooled.length >= bytes ? pooled : Buffer.allocUnsafe(Math.max(bytes, FRAME_SLAB_BYTES));
      this.slab = { buf, used: 0, unwritten: 0 };
      if (slab) this.recycle(slab);
      slab = this.slab;
    }
    return slab.buf.subarray(slab.used);
  }

  /** Puts a slab that is no longer the current one back in the pool once the socket has written all of its frames. */
  private recycle(slab: FrameSlab): void {
    if (slab !== this.slab && slab.unwritten === 0 && this.slabPool.length < FRAME_POOL_SIZE) this.slabPool.push(slab.buf);
  }

  /** send() of a frame already encoded (encodeOutputFrame), into frameBuffer()'s buffer or its own. */
  async sendEncoded(frame: Buffer): Promise<void> {
    if (this.closed) return;
    const slab = this.slab;
    if (slab && frame.buffer === slab.buf.buffer && frame.byteOffset === slab.buf.byteOffset + slab.used) {
      slab.used += frame.length;
      slab.unwritten++;
      this.socket.write(frame, () => {
        slab.unwritten--;
        this.recycle(slab);
      });
    } else this.socket.write(frame);
    // Up to OUTBOUND_HIGH_WATER_BYTES may wait in user space, so output events are pipelined
    // (waiting for 'drain' after each one halved replay speed); past it, this connection's
    // requests stop being read and the sender waits until the peer has read everything.
    if (this.socket.writableLength > OUTBOUND_HIGH_WATER_BYTES) {
      this.socket.pause();
      this.readPausedAt ??= performance.now();
      await new Promise<void>((resolve) => this.drainWaiters.push(resolve));
    }
  }

  /**
   * Sends a last frame and half-closes. What the peer still sends is read and dropped, so
   * closing with unread bytes does not reset the connection (and discard the frame on its
   * side); the socket is destroyed once the peer closes too, or after a second.
   */
  refuse(frame: unknown): void {
    this.refused = true;
    this.dropFrame();
    this.socket.removeAllListeners('data');
    this.socket.on('data', () => {});
    this.socket.end(encodeFrame(frame));
    setTimeout(() => this.socket.destroy(), 1000).unref();
  }

  /** Stops reading while decoded frames wait to be dispatched (releaseReading goes on). */
  holdReading(): void {
    this.dispatchHeld = true;
    this.heldAt ??= performance.now();
    this.socket.pause();
  }

  /**
   * Reads again once the decoded frames are dispatched, unless backpressure still holds reading
   * (wake() then resumes). The time held is ours, not the peer's: credited to an incomplete
   * frame's clock (frameTimeoutMs), as backpressure's is.
   */
  releaseReading(): void {
    this.dispatchHeld = false;
    const heldAt = this.heldAt;
    this.heldAt = null;
    if (heldAt !== null) this.creditNotRead(heldAt);
    if (this.closed) return;
    if (this.readPausedAt === null) this.socket.resume();
    this.armFrameTimer();
  }

  /** Drops the incomplete frame (a frame that could not be decoded: the connection is refused once what came before it is dispatched). */
  stopDecoding(): void {
    this.dropFrame();
  }

  /** Credits the incomplete frame, if any, with the time we did not read it since `since` (from its start, if that came later). */
  private creditNotRead(since: number): void {
    const startedAt = this.decoder.frameStartedAt;
    if (startedAt === null) return;
    if (this.frameClock.startedAt !== startedAt) this.frameClock = { startedAt, notReadMs: 0 };
    this.frameClock.notReadMs += performance.now() - Math.max(since, startedAt);
  }

  private wake(): void {
    if (!this.closed && !this.dispatchHeld) this.socket.resume();
    const pausedAt = this.readPausedAt;
    if (pausedAt !== null) {
      this.creditNotRead(pausedAt);
      this.readPausedAt = null;
      this.armFrameTimer();
    }
    for (const w of this.drainWaiters.splice(0)) w();
  }
}
