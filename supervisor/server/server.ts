// The Unix socket: listens (or takes systemd's socket), accepts connections and checks the
// peer (SO_PEERCRED against the allow-list, the connection bound), then serves it
// (dispatch.ts: the hello deadline, hello first, each request to its handler). Owns the
// listening socket; a connection's frames are connection.ts's; the WebSocket listener is remote.ts.
import { chmodSync, chownSync, lstatSync, mkdirSync, unlinkSync } from 'node:fs';
import { connect as netConnect, createServer, type Server, type Socket } from 'node:net';
import { dirname } from 'node:path';
import type { Logger } from 'pino';
import { SupervisorError } from '../../ipc/errors.js';
import { native } from '../../core/fs/native.js';
import type { Supervisor } from '../supervisor.js';
import { lookupGroup } from '../users.js';
import { Connection, type PendingFrames } from './connection.js';
import { refuseFrame, serveConnection, type ServeContext } from './dispatch.js';

export class SupervisorServer {
  private readonly server: Server;
  private readonly connections = new Set<Connection>();
  /** Incomplete frames of every connection, against ipc.maxPendingFrameBytes. */
  private readonly pendingFrames: PendingFrames;

  constructor(
    private readonly supervisor: Supervisor,
    private readonly log: Logger,
    readonly socketPath: string,
  ) {
    this.server = createServer((socket) => this.accept(socket));
    this.pendingFrames = { heldBytes: 0, maxBytes: supervisor.config.ipc.maxPendingFrameBytes };
    this.serveContext = { supervisor, log, socketPath };
  }

  /** What the dispatch of this server's connections (and the WebSocket listener's, remote.ts) gets. */
  readonly serveContext: ServeContext;

  /** Incomplete frames held by every connection (the WebSocket listener's count against the same bound). */
  get pendingFrameAccount(): PendingFrames {
    return this.pendingFrames;
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
      if (await answers(this.socketPath))
        throw new Error(`the socket ${this.socketPath} is in use by a running supervisor; stop it first, or give this one its own socketPath`);
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
    const ctx = this.serveContext;
    const conn = new Connection(
      socket,
      {
        maxFrameBytes: ipc.maxFrameBytes,
        frameTimeoutMs: ipc.frameTimeoutMs,
        pending: this.pendingFrames,
        onFrameTimeout: (c, err) => refuseFrame(ctx, c, err),
      },
      peer,
    );
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
      conn.refuse({
        id: 0,
        error: new SupervisorError('LIMIT_EXCEEDED', `${ipc.maxConnections} connections are open`, {
          limit: 'connections',
          max: ipc.maxConnections,
          retry_after_ms: 500,
        }).toWire(),
      });
      return;
    }
    this.supervisor.metrics?.connection('accepted');
    serveConnection(ctx, conn, this.connections);
  }

  /** root, the supervisor's own uid, and the configured uids and gids. */
  private allowed(peer: { uid: number; gid: number }): boolean {
    const ipc = this.supervisor.config.ipc;
    return peer.uid === 0 || peer.uid === process.getuid?.() || ipc.allowUids.includes(peer.uid) || ipc.allowGids.includes(peer.gid);
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
