// The Unix socket: listens (or takes systemd's socket), accepts connections and checks the
// peer (SO_PEERCRED against the allow-list, the connection bound, the hello deadline),
// requires the versioned hello first, and dispatches each request: its params validated
// against the method's schema (ipc/schemas.ts), then its handler (handlers/, one per verb).
// Owns the listening socket and the dispatch; a connection's frames are connection.ts's.
import { chmodSync, chownSync, lstatSync, mkdirSync, unlinkSync } from 'node:fs';
import { connect as netConnect, createServer, type Server, type Socket } from 'node:net';
import { dirname } from 'node:path';
import type { Logger } from 'pino';
import type { z } from 'zod';
import { SupervisorError, isSupervisorError } from '../../ipc/errors.js';
import { encodeFrame } from '../../ipc/framing.js';
import type { MethodName } from '../../ipc/methods.js';
import { PROTOCOL_VERSIONS } from '../../ipc/protocol.js';
import { ParamsSchemas, validate } from '../../ipc/schemas.js';
import { VERSION } from '../../ipc/version.js';
import { native } from '../native.js';
import type { Supervisor } from '../supervisor.js';
import { lookupGroup } from '../users.js';
import { Connection, MAX_TIMER_MS, type PendingFrames } from './connection.js';
import type { Handler } from './handler.js';
import { HANDLERS } from './handlers/index.js';

export class SupervisorServer {
  private readonly server: Server;
  private readonly connections = new Set<Connection>();
  /** Incomplete frames of every connection, against ipc.maxPendingFrameBytes. */
  private readonly pendingFrames: PendingFrames;

  constructor(private readonly supervisor: Supervisor, private readonly log: Logger, readonly socketPath: string) {
    this.server = createServer((socket) => this.accept(socket));
    this.pendingFrames = { heldBytes: 0, maxBytes: supervisor.config.ipc.maxPendingFrameBytes };
  }

  /** Connections open now (served ones; refused ones are closed at once). */
  get connectionCount(): number {
    return this.connections.size;
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
    const giveUpAt = performance.now() + drainMs;
    while ([...this.connections].some((c) => c.inFlight > 0 && !c.closed) && performance.now() < giveUpAt) {
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
      const limit = err.code === 'FRAME_TOO_LARGE' ? 'frame_bytes' : err.code === 'LIMIT_EXCEEDED' ? err.details?.limit : undefined;
      if (typeof limit === 'string') this.supervisor.metrics?.ipcRefused(limit);
      this.log.warn({ code: wire.code, limit: err.details?.limit, uid: peer.uid, pid: peer.pid }, 'closing connection after a bad frame');
      c.refuse({ id: 0, error: wire });
    };
    const conn = new Connection(socket, { maxFrameBytes: ipc.maxFrameBytes, frameTimeoutMs: ipc.frameTimeoutMs, pending: this.pendingFrames, onFrameTimeout: refuseFrame }, peer);
    if (!this.allowed(peer)) {
      this.log.warn({ uid: peer.uid, gid: peer.gid, pid: peer.pid }, 'refused a peer outside the allow-list');
      this.supervisor.metrics?.connection('unauthorized');
      conn.refuse({ id: 0, error: new SupervisorError('UNAUTHORIZED', `uid ${peer.uid} / gid ${peer.gid} may not use this supervisor`).toWire() });
      return;
    }
    if (this.connections.size >= ipc.maxConnections) {
      this.log.warn({ uid: peer.uid, pid: peer.pid, max: ipc.maxConnections }, 'connection limit reached');
      this.supervisor.metrics?.connection('limit_exceeded');
      this.supervisor.metrics?.ipcRefused('connections');
      conn.refuse({ id: 0, error: new SupervisorError('LIMIT_EXCEEDED', `${ipc.maxConnections} connections are open`, { limit: 'connections', max: ipc.maxConnections, retry_after_ms: 500 }).toWire() });
      return;
    }
    this.connections.add(conn);
    this.supervisor.metrics?.connection('accepted');
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
        const hello = validate(ParamsSchemas.hello, frame.params, 'hello');
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
      const method = frame.method as Exclude<MethodName, 'hello'>;
      const handler = Object.hasOwn(HANDLERS, method) ? (HANDLERS[method] as Handler<typeof method>) : undefined;
      if (!handler) throw new SupervisorError('INVALID_ARGUMENT', `unknown method ${JSON.stringify(frame.method)}`);
      const max = this.supervisor.config.ipc.maxInFlight;
      if (conn.inFlight >= max) {
        const err = new SupervisorError('LIMIT_EXCEEDED', `${max} requests of this connection are in flight`, { limit: 'in_flight', max, retry_after_ms: 100 });
        // Refused before Supervisor.launch counts it: a launch refused here is a refused launch too.
        this.supervisor.metrics?.ipcRefused('in_flight');
        if (method === 'launch') this.supervisor.metrics?.launchRefused(err);
        throw err;
      }
      conn.inFlight++;
      try {
        const params = validate(ParamsSchemas[method] as z.ZodType<unknown>, frame.params, method);
        const result = await handler({ supervisor: this.supervisor, conn, id, socketPath: this.socketPath }, params as never);
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
