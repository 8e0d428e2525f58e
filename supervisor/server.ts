// The Unix socket: accepts connections, decodes frames, requires the versioned hello first,
// dispatches each request to its handler, and streams output subscriptions from the chunk
// files with socket backpressure (a slow reader is paused, never buffered without bound,
// and never slows the drain). Owns connections; not sessions.
import { chmodSync, chownSync, lstatSync, mkdirSync, readFileSync, unlinkSync } from 'node:fs';
import { connect as netConnect, createServer, type Server, type Socket } from 'node:net';
import { dirname } from 'node:path';
import type { Logger } from 'pino';
import { SupervisorError, isSupervisorError } from '../ipc/errors.js';
import { encodeFrame, encodeOutputFrame, FrameDecoder } from '../ipc/framing.js';
import { PROTOCOL_VERSIONS, type StreamName } from '../ipc/protocol.js';
import { readStoredInto } from '../ipc/state-layout.js';
import { native } from './native.js';
import { signalName, signalNumber } from './spawn.js';
import type { Session } from './session.js';
import type { Supervisor } from './supervisor.js';
import { lookupGroup } from './users.js';
import { Schemas, validate } from './validate.js';
import { VERSION } from '../ipc/version.js';

/** Largest output event payload, in bytes. */
const OUTPUT_EVENT_BYTES = 1024 * 1024;
/** Room for an output frame's length prefix and msgpack head (70 bytes for "stdout"; 31-byte stream names at most). */
const OUTPUT_FRAME_HEAD_BYTES = 128;
/** Output frame buffers kept per connection for reuse (OUTBOUND_HIGH_WATER_BYTES / 1 MiB). */
const FRAME_POOL_SIZE = 4;

type Handler = (conn: Connection, id: number, params: unknown) => unknown;

/** Longest setTimeout delay (a longer one fires at once); longer waits re-arm. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** Bytes queued towards a client above which we stop reading its requests. */
const OUTBOUND_HIGH_WATER_BYTES = 4 * 1024 * 1024;

/** Bytes of incomplete frames held by all connections together, and their bound (0: none). */
interface PendingFrames {
  heldBytes: number;
  readonly maxBytes: number;
}

/** What bounds one connection's incoming frames; onFrameTimeout refuses it (its frame took over timeoutMs). */
interface FrameLimits {
  maxFrameBytes: number;
  /** 0: no bound. */
  frameTimeoutMs: number;
  pending: PendingFrames;
  onFrameTimeout: (conn: Connection, err: SupervisorError) => void;
}

/** One client connection: its decoder, its peer, what it has in flight, and backpressure. */
class Connection {
  private readonly decoder: FrameDecoder;
  helloDone = false;
  closed = false;
  /** Requests received and not yet finished (subscriptions until their end event). */
  inFlight = 0;
  private readonly drainWaiters: (() => void)[] = [];
  /** Bytes this connection adds to limits.pending.heldBytes (its decoder's incomplete frame). */
  private countedBytes = 0;
  private frameTimer: NodeJS.Timeout | null = null;
  /** The incomplete frame the clock runs for (its frameStartedAt), and the ms we did not read it. */
  private frameClock = { startedAt: null as number | null, notReadMs: 0 };
  /** performance.now() when backpressure stopped our reading; null while we read. */
  private readPausedAt: number | null = null;

  constructor(readonly socket: Socket, private readonly limits: FrameLimits, readonly peer: { pid: number; uid: number; gid: number }) {
    this.decoder = new FrameDecoder(limits.maxFrameBytes);
    socket.on('drain', () => this.wake());
    socket.on('close', () => {
      this.closed = true;
      this.dropFrame();
      this.wake();
    });
    socket.on('error', () => {});
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
   * frameTimeoutMs plus the time backpressure kept us from reading (that wait is ours, not
   * the peer's). Between frames nothing runs: an idle connection is not bounded here.
   */
  private armFrameTimer(): void {
    const timeoutMs = this.limits.frameTimeoutMs;
    const startedAt = this.decoder.frameStartedAt;
    if (timeoutMs === 0 || startedAt === null || this.frameTimer || this.readPausedAt !== null || this.closed) return;
    if (this.frameClock.startedAt !== startedAt) this.frameClock = { startedAt, notReadMs: 0 };
    const leftMs = startedAt + this.frameClock.notReadMs + timeoutMs - performance.now();
    if (leftMs > 0) {
      this.frameTimer = setTimeout(() => {
        this.frameTimer = null;
        this.armFrameTimer();
      }, Math.min(Math.ceil(leftMs), MAX_TIMER_MS));
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
   * Buffers for output frames, reused once the socket has written them: replay allocated a
   * 1 MiB frame per event before, and the garbage halved its rate in a large supervisor.
   */
  private readonly framePool: Buffer[] = [];

  /** An output frame buffer of at least `bytes`, from the pool when it has one. */
  frameBuffer(bytes: number): Buffer {
    const b = this.framePool.pop();
    return b && b.length >= bytes ? b : Buffer.allocUnsafe(bytes);
  }

  /** send() of a frame already encoded (encodeOutputFrame); `pooled` goes back to the pool once written. */
  async sendEncoded(frame: Buffer, pooled?: Buffer): Promise<void> {
    if (this.closed) return;
    this.socket.write(frame, pooled ? () => void (this.framePool.length < FRAME_POOL_SIZE && this.framePool.push(pooled)) : undefined);
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
    this.dropFrame();
    this.socket.removeAllListeners('data');
    this.socket.on('data', () => {});
    this.socket.end(encodeFrame(frame));
    setTimeout(() => this.socket.destroy(), 1000).unref();
  }

  private wake(): void {
    if (!this.closed) this.socket.resume();
    const pausedAt = this.readPausedAt;
    const startedAt = this.decoder.frameStartedAt;
    if (pausedAt !== null) {
      if (startedAt !== null) {
        // Credit the frame with the time we did not read it (from its start, if that came later).
        if (this.frameClock.startedAt !== startedAt) this.frameClock = { startedAt, notReadMs: 0 };
        this.frameClock.notReadMs += performance.now() - Math.max(pausedAt, startedAt);
      }
      this.readPausedAt = null;
      this.armFrameTimer();
    }
    for (const w of this.drainWaiters.splice(0)) w();
  }
}

export class SupervisorServer {
  private readonly server: Server;
  private readonly connections = new Set<Connection>();
  private readonly handlers: Record<string, Handler>;
  /** Incomplete frames of every connection, against ipc.maxPendingFrameBytes. */
  private readonly pendingFrames: PendingFrames;

  constructor(private readonly supervisor: Supervisor, private readonly log: Logger, readonly socketPath: string) {
    this.server = createServer((socket) => this.accept(socket));
    this.pendingFrames = { heldBytes: 0, maxBytes: supervisor.config.ipc.maxPendingFrameBytes };
    const sup = supervisor;
    this.handlers = {
      launch: (c, _id, p) => {
        const params = validate(Schemas.launch, p, 'launch');
        const result = sup.launch(params);
        if ((result.state as string) === 'retired') return result; // no session object any more
        const session = sup.find({ session_id: result.session_id });
        if (params.on_disconnect === 'cancel' && !result.existing) {
          // The client that launched it asked to own the session's life: its disconnect
          // cancels it. A retry never changes how an existing session ends (README).
          c.socket.once('close', () => void session.terminate('cancel'));
        }
        // Where a reattaching terminal resumes typing (sbx run --stdin on a TTY).
        return session.req.stdin === 'stream' ? { ...result, stdin_cursor: session.stdinCursor } : result;
      },
      cancel: async (_c, _id, p) => {
        const params = validate(Schemas.cancel, p, 'cancel');
        const session = sup.find(params);
        if (session.state === 'unknown') {
          // Recovered after a restart and being ended: the KILL comes after the given grace (default: now).
          if (!session.cancelRecovered(params.grace_ms ?? 0)) {
            throw new SupervisorError('INVALID_ARGUMENT', `session ${session.id} is unknown and nothing of it is being ended: ${session.unknownReason ?? 'no evidence of its end'} (sbx kill reaches its cgroup; sbx resolve records an operator's word)`);
          }
          return { session_id: session.id, state: session.state };
        }
        void session.terminate('cancel', params.grace_ms);
        return { session_id: session.id, state: session.state };
      },
      kill: async (_c, _id, p) => {
        const params = validate(Schemas.kill, p, 'kill');
        const session = sup.find(params);
        let name: string;
        try {
          name = signalName(typeof params.signal === 'number' ? params.signal : signalNumber(params.signal));
          signalNumber(name); // a number without a name (e.g. 32) is not deliverable by name
        } catch {
          throw new SupervisorError('INVALID_ARGUMENT', `kill: unknown signal ${JSON.stringify(params.signal)}`, { field: 'signal' });
        }
        return { session_id: session.id, signal: name, pids: await session.signal(name as NodeJS.Signals) };
      },
      wait: async (_c, _id, p) => {
        const session = sup.find(validate(Schemas.selector, p, 'wait'));
        const receipt = await session.ended;
        if (!receipt) throw new SupervisorError('INTERNAL', `session ${session.id} is ${session.state}: no receipt without death evidence`);
        return receipt;
      },
      receipt: (_c, _id, p) => {
        const session = sup.find(validate(Schemas.selector, p, 'receipt'));
        return { state: session.state, receipt: session.receipt };
      },
      ps: (_c, _id, p) => ({ sessions: sup.list(validate(Schemas.ps, p, 'ps').all ?? false).map((s) => s.summary()) }),
      gc: (_c, _id, p) => {
        validate(Schemas.gc, p, 'gc');
        return sup.gc();
      },
      seal: (_c, _id, p) => {
        validate(Schemas.empty, p, 'seal');
        return sup.seal();
      },
      close: async (_c, _id, p) => {
        const params = validate(Schemas.close, p, 'close');
        return sup.close(params.timeout_ms ?? 60_000, params.workspaces ?? []);
      },
      status: (_c, _id, p) => {
        validate(Schemas.empty, p, 'status');
        return sup.status(this.socketPath);
      },
      subscribe: (c, id, p) => this.subscribe(c, id, validate(Schemas.subscribe, p, 'subscribe')),
      write: async (_c, _id, p) => {
        const params = validate(Schemas.write, p, 'write');
        const session = sup.find(params);
        const cursor = await session.write(Buffer.from(params.data), params.offset, params.eof ?? false);
        return { session_id: session.id, cursor };
      },
      resize: (_c, _id, p) => {
        const params = validate(Schemas.resize, p, 'resize');
        const session = sup.find(params);
        session.resize(params.cols, params.rows);
        return { session_id: session.id, cols: params.cols, rows: params.rows };
      },
      resolve: async (c, _id, p) => {
        const params = validate(Schemas.resolve, p, 'resolve');
        // Who attests is read from the socket (SO_PEERCRED), never taken from the request.
        return sup.resolve(params, { uid: c.peer.uid, pid: c.peer.pid, reason: params.reason });
      },
    };
  }

  /** Whether the socket came from systemd (then its file and modes are the .socket unit's). */
  private activated = false;
  /** Inode of the socket file this server made (close() removes only that one). */
  private socketIno = -1;

  /**
   * Listens on a socket systemd passed (listenFd), else binds socketPath itself (0660 in a
   * 0750 dir; a stale socket file is replaced).
   */
  async listen(listenFd: number | null = null): Promise<void> {
    if (listenFd !== null) {
      this.activated = true;
      await new Promise<void>((resolve, reject) => {
        this.server.once('error', reject);
        this.server.listen({ fd: listenFd }, () => {
          this.server.off('error', reject);
          resolve();
        });
      });
      return;
    }
    const dir = dirname(this.socketPath);
    // Only a directory we create is ours to chown/chmod (never /tmp or /run themselves).
    const createdDir = mkdirSync(dir, { recursive: true, mode: 0o750 }) !== undefined;
    let stale = false;
    try {
      stale = lstatSync(this.socketPath).isSocket();
    } catch {
      // nothing there
    }
    if (stale) {
      // A socket file left by a supervisor that died is replaced; one that answers is not:
      // two supervisors on one socket would unlink each other's.
      if (await answers(this.socketPath)) throw new Error(`the socket ${this.socketPath} is in use by a running supervisor; stop it first, or give this one its own socketPath`);
      unlinkSync(this.socketPath);
    }
    await new Promise<void>((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(this.socketPath, () => {
        this.server.off('error', reject);
        resolve();
      });
    });
    this.socketIno = lstatSync(this.socketPath).ino;
    chmodSync(this.socketPath, 0o660);
    const group = this.supervisor.config.ipc.socketGroup;
    if (group !== undefined) {
      const gid = lookupGroup(group, 'ipc.socketGroup');
      chownSync(this.socketPath, process.getuid?.() ?? 0, gid);
      if (createdDir) {
        chownSync(dir, process.getuid?.() ?? 0, gid);
        chmodSync(dir, 0o750);
      }
    }
  }

  /**
   * Stops accepting; lets requests in flight finish (followers get the end of their streams,
   * waits get their receipts) for up to drainMs; then closes every connection and removes
   * the socket file.
   */
  async close(drainMs = 5000): Promise<void> {
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    const giveUpAt = Date.now() + drainMs;
    while ([...this.connections].some((c) => c.inFlight > 0 && !c.closed) && Date.now() < giveUpAt) {
      await new Promise((r) => setTimeout(r, 20));
    }
    for (const c of this.connections) c.socket.destroy();
    await closed;
    if (this.activated) return; // systemd's socket stays, so clients wait while we restart
    try {
      // Only our own socket file: never one a later supervisor made at the same path.
      if (lstatSync(this.socketPath).ino === this.socketIno) unlinkSync(this.socketPath);
    } catch {
      // already gone
    }
  }

  /**
   * A new connection: its peer is read from the socket (SO_PEERCRED, unix(7)) and checked
   * against the allow-list; the connection bound, then the hello deadline, apply; each
   * frame must arrive whole within ipc.frameTimeoutMs and fit in ipc.maxPendingFrameBytes.
   */
  private accept(socket: Socket): void {
    const ipc = this.supervisor.config.ipc;
    let peer = { pid: 0, uid: -1, gid: -1 };
    try {
      peer = native().peerCred((socket as unknown as { _handle: { fd: number } })._handle.fd);
    } catch (err) {
      this.log.error({ err }, 'cannot read the peer credentials; refusing the connection');
    }
    const refuseFrame = (c: Connection, err: SupervisorError) => {
      const wire = err.toWire();
      this.log.warn({ code: wire.code, limit: err.details?.limit, uid: peer.uid, pid: peer.pid }, 'closing connection after a bad frame');
      c.refuse({ id: 0, error: wire });
    };
    const conn = new Connection(socket, { maxFrameBytes: ipc.maxFrameBytes, frameTimeoutMs: ipc.frameTimeoutMs, pending: this.pendingFrames, onFrameTimeout: refuseFrame }, peer);
    if (!this.allowed(peer)) {
      this.log.warn({ uid: peer.uid, gid: peer.gid, pid: peer.pid }, 'refused a peer outside the allow-list');
      conn.refuse({ id: 0, error: new SupervisorError('UNAUTHORIZED', `uid ${peer.uid} / gid ${peer.gid} may not use this supervisor`).toWire() });
      return;
    }
    if (this.connections.size >= ipc.maxConnections) {
      this.log.warn({ uid: peer.uid, pid: peer.pid, max: ipc.maxConnections }, 'connection limit reached');
      conn.refuse({ id: 0, error: new SupervisorError('LIMIT_EXCEEDED', `${ipc.maxConnections} connections are open`, { limit: 'connections', max: ipc.maxConnections, retry_after_ms: 500 }).toWire() });
      return;
    }
    this.connections.add(conn);
    const handshake = setTimeout(() => {
      if (!conn.helloDone) conn.refuse({ id: 0, error: new SupervisorError('INVALID_ARGUMENT', `no hello within ${ipc.handshakeTimeoutMs} ms`).toWire() });
    }, Math.min(ipc.handshakeTimeoutMs, MAX_TIMER_MS)); // a longer setTimeout fires at once; past 24.8 days it is as good as none
    socket.on('close', () => {
      clearTimeout(handshake);
      this.connections.delete(conn);
    });
    socket.on('data', (data: Buffer) => {
      try {
        conn.decode(data, (frame) => void this.dispatch(conn, frame));
      } catch (err) {
        refuseFrame(conn, isSupervisorError(err) ? err : new SupervisorError('INVALID_ARGUMENT', String(err)));
      }
    });
  }

  /** root, the supervisor's own uid, and the configured uids and gids. */
  private allowed(peer: { uid: number; gid: number }): boolean {
    const ipc = this.supervisor.config.ipc;
    return peer.uid === 0 || peer.uid === process.getuid?.() || ipc.allowUids.includes(peer.uid) || ipc.allowGids.includes(peer.gid);
  }

  private async dispatch(conn: Connection, raw: unknown): Promise<void> {
    const frame = raw as { id?: unknown; method?: unknown; params?: unknown };
    const idOk = typeof frame?.id === 'number' && Number.isSafeInteger(frame.id) && frame.id >= 0;
    const id = idOk ? (frame.id as number) : 0;
    try {
      if (typeof frame !== 'object' || frame === null || !idOk || typeof frame.method !== 'string') {
        // Nothing runs without an id the client can match the answer to.
        throw new SupervisorError('INVALID_ARGUMENT', 'a request is { id: non-negative int, method: string, params?: map }');
      }
      if (!conn.helloDone) {
        if (frame.method !== 'hello') throw new SupervisorError('INVALID_ARGUMENT', 'the first request must be hello');
        const hello = validate(Schemas.hello, frame.params, 'hello');
        const version = Math.max(...hello.versions.filter((v) => (PROTOCOL_VERSIONS as readonly number[]).includes(v)));
        if (!Number.isFinite(version)) {
          const err = new SupervisorError('UNSUPPORTED_VERSION', `protocol versions ${hello.versions.join(', ')} unsupported`, {
            supported: [...PROTOCOL_VERSIONS],
          });
          conn.socket.end(encodeFrame({ id, error: err.toWire() }));
          return;
        }
        conn.helloDone = true;
        const { instance, generation } = this.supervisor.ctx.identity;
        await conn.send({ id, result: { version, server: `sandbox-supervisor/${VERSION}`, instance, generation } });
        return;
      }
      if (frame.method === 'hello') throw new SupervisorError('INVALID_ARGUMENT', 'hello was already exchanged on this connection');
      const handler = Object.hasOwn(this.handlers, frame.method) ? this.handlers[frame.method] : undefined;
      if (!handler) throw new SupervisorError('INVALID_ARGUMENT', `unknown method ${JSON.stringify(frame.method)}`);
      const max = this.supervisor.config.ipc.maxInFlight;
      if (conn.inFlight >= max) {
        throw new SupervisorError('LIMIT_EXCEEDED', `${max} requests of this connection are in flight`, { limit: 'in_flight', max, retry_after_ms: 100 });
      }
      conn.inFlight++;
      try {
        const result = await handler(conn, id, frame.params);
        if (result !== undefined) await conn.send({ id, result });
      } finally {
        conn.inFlight--;
      }
    } catch (err) {
      if (!isSupervisorError(err)) this.log.error({ err, method: frame?.method }, 'request failed');
      const wire = isSupervisorError(err) ? err.toWire() : new SupervisorError('INTERNAL', (err as Error).message).toWire();
      await conn.send({ id, error: wire });
    }
  }

  /**
   * Streams [from, ...) of one stream as `output` events, reading the chunk files, then an
   * `end` event: at the stored end without follow, at the final cursor with follow.
   */
  private async subscribe(conn: Connection, id: number, p: { session_id?: string; invocation_key?: string; stream: StreamName; from?: number; follow?: boolean }): Promise<undefined> {
    const session: Session = this.supervisor.find(p);
    const stream = p.stream;
    if (session.outputRemoved) {
      throw new SupervisorError('OUTPUT_REMOVED', `session ${session.id}: its output was removed by the retention policy; the receipt stays (sbx receipt)`);
    }
    if (!session.hasStream(stream)) throw new SupervisorError('INVALID_ARGUMENT', `session ${session.id} has no ${stream} stream`);
    let cursor = p.from ?? 0;
    const follow = p.follow ?? false;
    if (!follow && cursor > session.cursor(stream)) {
      throw new SupervisorError('CURSOR_OUT_OF_RANGE', `cursor ${cursor} is past the end of ${stream} (${session.cursor(stream)})`, {
        cursor: session.cursor(stream),
      });
    }
    await conn.send({ id, result: { session_id: session.id, stream, from: cursor, cursor: session.cursor(stream) } });
    const streamDir = session.streamDir(stream);
    const chunkBytes = session.req.chunkBytes;
    for (;;) {
      const end = session.cursor(stream);
      while (cursor < end && !conn.closed) {
        const from = cursor;
        let n = 0;
        const into = conn.frameBuffer(OUTPUT_EVENT_BYTES + OUTPUT_FRAME_HEAD_BYTES);
        const frame = encodeOutputFrame(id, stream, from, Math.min(OUTPUT_EVENT_BYTES, end - from), (buf, offset, max) => (n = readStoredInto(streamDir, chunkBytes, from, end, buf, offset, max)), into);
        if (!frame) break;
        await conn.sendEncoded(frame, frame.buffer === into.buffer ? into : undefined);
        cursor += n;
      }
      if (conn.closed) return undefined;
      // Re-read after the sends: the drain may have ended while a send waited on a slow
      // reader. Final is read before the cursor, with no await between them.
      const finalNow = session.streamFinal(stream);
      if (!follow || (finalNow && cursor >= session.cursor(stream))) {
        await conn.send({ id, event: 'end', stream, cursor, final: finalNow });
        return undefined;
      }
      if (cursor < session.cursor(stream)) continue;
      await new Promise<void>((resolve) => {
        const onOutput = (s: StreamName) => {
          if (s !== stream) return;
          session.off('output', onOutput);
          conn.socket.off('close', onClose);
          resolve();
        };
        const onClose = () => {
          session.off('output', onOutput);
          resolve();
        };
        session.on('output', onOutput);
        conn.socket.once('close', onClose);
      });
    }
  }
}


/** Whether something accepts connections on the Unix socket at path (ECONNREFUSED: stale). */
function answers(path: string): Promise<boolean> {
  return new Promise((resolve) => {
    const s = netConnect(path);
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}
