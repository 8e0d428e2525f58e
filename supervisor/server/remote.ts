// The WebSocket listener (config remote.*, `serve --listen HOST:PORT`; docs/guide/remote.md): an HTTP(S)
// server whose upgrades, once their bearer token checks (remote-auth.ts), become Connections served like the
// Unix socket's (dispatch.ts), through ws-socket.ts. A plain HTTP request gets 426; a failed handshake is
// logged, counted and answered later each time per address.
import { readFileSync } from 'node:fs';
import { createServer as createHttpServer, STATUS_CODES, type IncomingMessage, type Server } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import type { AddressInfo, Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { WebSocketServer, type WebSocket } from 'ws';
import { SupervisorError, type ErrorCode } from '../../ipc/errors.js';
import { ConfigError } from '../config.js';
import { parseMetricsAddress } from '../metrics/address.js';
import { Connection, type PendingFrames } from './connection.js';
import { peerFields, refuseFrame, serveConnection, type ServeContext } from './dispatch.js';
import { FailureThrottle, RemoteToken, type HandshakeFailure } from './remote-auth.js';
import { WsSocket } from './ws-socket.js';

/** Failed handshakes held waiting for their delayed answer at once; past it they are closed at once. */
const MAX_DELAYED_ANSWERS = 1024;
/** Request headers larger than this get 431 with the JSON body (a bearer token fits many times over). */
const MAX_HEADER_BYTES = 16 * 1024;

/**
 * Bounds: the upgrade deadline, remote.maxConnections (apart from the socket's), ipc.maxFrameBytes per
 * message (ws maxPayload: close 1009), ipc.maxInFlight and the 4 MiB send high water (connection.ts), the
 * hello deadline; keepalive pings with a deadline.
 */
export class RemoteListener {
  private readonly connections = new Set<Connection>();
  /** TCP (or TLS) connections not yet upgraded, with their deadline. */
  private readonly waiting = new Map<Duplex, NodeJS.Timeout>();
  private readonly throttle = new FailureThrottle();
  private delayed = 0;
  private readonly wss: WebSocketServer;
  private readonly scheme: 'ws' | 'wss';
  /** `HOST:PORT` with the port bound (for port 0). */
  address = '';

  private constructor(
    private readonly ctx: ServeContext,
    private readonly pending: PendingFrames,
    private readonly server: Server,
    readonly token: RemoteToken,
    tls: boolean,
  ) {
    this.scheme = tls ? 'wss' : 'ws';
    const { ipc } = ctx.supervisor.config;
    this.wss = new WebSocketServer({ noServer: true, maxPayload: ipc.maxFrameBytes, perMessageDeflate: false, clientTracking: false });
    this.wss.on('wsClientError', (err: Error, socket: Duplex, req: IncomingMessage) =>
      this.fail(socket, req, 400, 'bad_upgrade', 'INVALID_ARGUMENT', `not a WebSocket upgrade: ${err.message}`),
    );
    server.on(tls ? 'secureConnection' : 'connection', (socket: Socket) => this.connected(socket));
    server.on('request', (req, res) => {
      this.upgraded(req.socket);
      this.count('not_websocket');
      this.ctx.log.warn({ remote: remoteOf(req), method: req.method, url: req.url }, 'a plain HTTP request on the WebSocket listener (426)');
      const body = JSON.stringify({
        error: new SupervisorError(
          'INVALID_ARGUMENT',
          'this is the sandbox-supervisor WebSocket endpoint: send a WebSocket upgrade (Upgrade: websocket) with Authorization: Bearer TOKEN (docs/guide/remote.md)',
        ).toWire(),
      });
      res.writeHead(426, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body), Upgrade: 'websocket', Connection: 'close' });
      res.end(body);
    });
    server.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) => this.upgrade(req, socket, head));
    server.on('clientError', (err: NodeJS.ErrnoException, socket: Duplex) => {
      // Not HTTP at all, or headers over 16 KiB (431, with the JSON body); a peer that reset
      // is no failed handshake.
      this.upgraded(socket);
      const remote = `${(socket as Socket).remoteAddress}:${(socket as Socket).remotePort}`;
      if (err.code === 'ECONNRESET') return void socket.destroy();
      this.count('bad_upgrade');
      if (err.code === 'HPE_HEADER_OVERFLOW' && socket.writable) {
        socket.on('error', () => {});
        this.ctx.log.warn({ remote, max_header_bytes: MAX_HEADER_BYTES }, 'request headers over 16 KiB on the WebSocket listener (431)');
        return this.answer(
          socket,
          431,
          'INVALID_ARGUMENT',
          `the request headers are over ${MAX_HEADER_BYTES} bytes`,
          {},
          { limit: 'header_bytes', max: MAX_HEADER_BYTES },
        );
      }
      this.ctx.log.warn({ remote, code: err.code }, 'a malformed HTTP request on the WebSocket listener; closed');
      socket.destroy();
    });
  }

  /**
   * Listens at `listen` (HOST:PORT) with the token source and TLS of config remote.*.
   * ConfigError (exit 2) for no token, an unreadable certificate or an address that cannot be had.
   */
  static async start(ctx: ServeContext, pending: PendingFrames, listen: string, env: NodeJS.ProcessEnv = process.env): Promise<RemoteListener> {
    const { remote, stateDir } = ctx.supervisor.config;
    const addr = parseMetricsAddress(listen);
    if (addr.kind !== 'tcp') throw new ConfigError(`remote.listen ${listen}: HOST:PORT only`);
    let token: RemoteToken;
    try {
      token = RemoteToken.open({ env, token: remote.token, tokenFile: remote.tokenFile, stateDir, insecure: remote.insecure });
    } catch (err) {
      throw new ConfigError(`the WebSocket listener has no token, so it does not start: ${(err as Error).message}`);
    }
    let server: Server;
    const tls = remote.tlsCertFile !== undefined && remote.tlsKeyFile !== undefined;
    const options = {
      maxHeaderSize: MAX_HEADER_BYTES,
      requestTimeout: remote.upgradeTimeoutMs,
      headersTimeout: remote.upgradeTimeoutMs,
      keepAliveTimeout: 1000,
    };
    if (tls) {
      let cert: Buffer, key: Buffer;
      try {
        cert = readFileSync(remote.tlsCertFile!);
        key = readFileSync(remote.tlsKeyFile!);
      } catch (err) {
        throw new ConfigError(`remote.tlsCertFile/tlsKeyFile: ${(err as Error).message}`);
      }
      try {
        server = createHttpsServer({ ...options, cert, key, handshakeTimeout: remote.upgradeTimeoutMs }) as unknown as Server;
      } catch (err) {
        throw new ConfigError(`remote TLS: ${(err as Error).message}`);
      }
    } else {
      server = createHttpServer(options);
    }
    const listener = new RemoteListener(ctx, pending, server, token, tls);
    await new Promise<void>((resolve, reject) => {
      server.once('error', (err) => reject(new ConfigError(`remote.listen ${listen}: ${(err as Error).message}`)));
      server.listen({ host: addr.host, port: addr.port }, () => resolve());
    });
    const bound = server.address() as AddressInfo;
    listener.address = bound.family === 'IPv6' ? `[${bound.address}]:${bound.port}` : `${bound.address}:${bound.port}`;
    return listener;
  }

  /** ws://HOST:PORT/ or wss://HOST:PORT/. */
  get url(): string {
    return `${this.scheme}://${this.address}/`;
  }

  /** WebSocket connections served now. */
  get connectionCount(): number {
    return this.connections.size;
  }

  private get maxConnections(): number {
    const { remote, ipc } = this.ctx.supervisor.config;
    return remote.maxConnections ?? ipc.maxConnections;
  }

  private count(reason: HandshakeFailure): void {
    this.ctx.supervisor.metrics?.remoteHandshakeFailed(reason);
  }

  /** A new TCP (TLS) connection: it must finish its upgrade within remote.upgradeTimeoutMs. */
  private connected(socket: Socket): void {
    if (this.waiting.size >= this.maxConnections) {
      // As many connections may wait for their upgrade as may be open; past it the one that
      // waited longest goes (as the metrics endpoint does), so idle connections held open
      // cannot keep a client with a token out.
      const [oldest, timer] = this.waiting.entries().next().value!;
      clearTimeout(timer);
      this.waiting.delete(oldest);
      this.count('connections');
      this.ctx.log.warn(
        { remote: `${(oldest as Socket).remoteAddress}:${(oldest as Socket).remotePort}`, max: this.maxConnections },
        'too many connections waiting for their upgrade; closed the oldest',
      );
      oldest.destroy();
    }
    const timeoutMs = this.ctx.supervisor.config.remote.upgradeTimeoutMs;
    const timer = setTimeout(() => {
      this.waiting.delete(socket);
      this.count('upgrade_timeout');
      this.ctx.log.warn({ remote: `${socket.remoteAddress}:${socket.remotePort}`, timeout_ms: timeoutMs }, 'no WebSocket upgrade in time; closed');
      socket.destroy();
    }, timeoutMs);
    this.waiting.set(socket, timer);
    socket.once('close', () => this.upgraded(socket));
  }

  /** The socket's upgrade deadline no longer applies (upgraded, answered or closed). */
  private upgraded(socket: Duplex): void {
    const timer = this.waiting.get(socket);
    if (timer === undefined) return;
    clearTimeout(timer);
    this.waiting.delete(socket);
  }

  private upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void {
    this.upgraded(socket);
    socket.on('error', () => {});
    const auth = this.token.check(req.headers.authorization);
    if (auth === 'token_file_invalid') {
      this.ctx.log.error(
        { remote: remoteOf(req), token_file: this.token.file, why: this.token.invalid },
        'the remote token file fails its checks: every WebSocket handshake is refused until a good one is there',
      );
      return this.fail(socket, req, 401, auth, 'UNAUTHORIZED', 'the supervisor has no valid token now (its token file fails its checks; see its log)', {
        'WWW-Authenticate': 'Bearer',
      });
    }
    if (auth !== 'ok') {
      const message = auth === 'no_token' ? 'no bearer token: send Authorization: Bearer TOKEN' : "the bearer token is not the supervisor's";
      return this.fail(socket, req, 401, auth, 'UNAUTHORIZED', message, { 'WWW-Authenticate': 'Bearer' });
    }
    this.throttle.succeeded(req.socket.remoteAddress ?? '');
    const max = this.maxConnections;
    if (this.connections.size >= max) {
      this.count('connections');
      this.ctx.supervisor.metrics?.connection('limit_exceeded');
      this.ctx.supervisor.metrics?.ipcRefused('connections');
      this.ctx.log.warn({ remote: remoteOf(req), max }, 'remote connection limit reached');
      return this.answer(
        socket,
        503,
        'LIMIT_EXCEEDED',
        `${max} WebSocket connections are open`,
        { 'Retry-After': '1' },
        { limit: 'connections', max, retry_after_ms: 500 },
      );
    }
    this.wss.handleUpgrade(req, socket, head, (ws) => this.accept(ws, socket, req));
  }

  /**
   * A failed handshake: counted, logged (the address, never the token), answered with status
   * after the address's delay (100 ms doubling to 2 s; only failures wait).
   */
  private fail(
    socket: Duplex,
    req: IncomingMessage,
    status: number,
    reason: HandshakeFailure,
    code: ErrorCode,
    message: string,
    headers: Record<string, string> = {},
  ): void {
    this.upgraded(socket);
    this.count(reason);
    const host = req.socket.remoteAddress ?? '';
    const delayMs = this.throttle.failed(host);
    this.ctx.log.warn({ remote: remoteOf(req), reason, status, delay_ms: delayMs }, 'failed WebSocket handshake');
    if (this.delayed >= MAX_DELAYED_ANSWERS) return void socket.destroy();
    this.delayed++;
    setTimeout(() => {
      this.delayed--;
      this.answer(socket, status, code, message, headers);
    }, delayMs);
  }

  /** Writes a whole HTTP response with a JSON body `{ error: WireError }` and closes. */
  private answer(
    socket: Duplex,
    status: number,
    code: ErrorCode,
    message: string,
    headers: Record<string, string> = {},
    details?: Record<string, unknown>,
  ): void {
    if (socket.destroyed) return;
    const body = JSON.stringify({ error: new SupervisorError(code, message, details).toWire() });
    const lines = [
      `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? ''}`,
      'Connection: close',
      'Content-Type: application/json',
      `Content-Length: ${Buffer.byteLength(body)}`,
    ];
    for (const [k, v] of Object.entries(headers)) lines.push(`${k}: ${v}`);
    socket.end(`${lines.join('\r\n')}\r\n\r\n${body}`);
    setTimeout(() => socket.destroy(), 1000).unref();
  }

  /** An upgraded WebSocket: a Connection (peer: pid 0, our uid/gid, the remote address), keepalive, served. */
  private accept(ws: WebSocket, raw: Duplex, req: IncomingMessage): void {
    const { supervisor, log } = this.ctx;
    const { ipc, remote } = supervisor.config;
    const peer = { pid: 0, uid: process.getuid?.() ?? 0, gid: process.getgid?.() ?? 0, remote: `${this.scheme} ${remoteOf(req)}` };
    const sock = new WsSocket(ws, raw);
    const conn = new Connection(
      sock,
      {
        maxFrameBytes: ipc.maxFrameBytes,
        frameTimeoutMs: ipc.frameTimeoutMs,
        pending: this.pending,
        onFrameTimeout: (c, err) => refuseFrame(this.ctx, c, err),
      },
      peer,
    );
    sock.on('text', (bytes: number) => {
      sock.endCode = 1003; // unsupported data
      refuseFrame(this.ctx, conn, new SupervisorError('INVALID_ARGUMENT', `a text message (${bytes} bytes): frames are binary messages, one msgpack map each`));
    });
    ws.on('error', (err: Error & { code?: string }) => {
      if (err.code === 'WS_ERR_UNSUPPORTED_MESSAGE_LENGTH') {
        supervisor.metrics?.ipcRefused('frame_bytes');
        log.warn({ ...peerFields(peer), max_frame_bytes: ipc.maxFrameBytes }, 'a WebSocket message over ipc.maxFrameBytes; closed 1009');
      } else {
        log.warn({ ...peerFields(peer), err: err.message, code: err.code }, 'WebSocket protocol error; closed');
      }
    });
    this.keepalive(ws, raw, peer.remote, remote.pingIntervalMs, remote.pingTimeoutMs);
    supervisor.metrics?.connection('accepted');
    log.info(peerFields(peer), 'WebSocket connection accepted');
    serveConnection(this.ctx, conn, this.connections);
    sock.on('close', () => log.debug(peerFields(peer), 'WebSocket connection closed'));
  }

  /**
   * Pings every intervalMs; a peer that within timeoutMs neither answers (a pong or any
   * message) nor takes any byte of what waits for it (a slow reader whose pong queues behind
   * output: the socket drained) is terminated.
   */
  private keepalive(ws: WebSocket, raw: Duplex, who: string, intervalMs: number, timeoutMs: number): void {
    let answered = true;
    let drains = 0;
    let deadline: NodeJS.Timeout | null = null;
    const alive = () => void (answered = true);
    ws.on('pong', alive);
    ws.on('message', alive);
    raw.on('drain', () => void drains++);
    const tick = setInterval(() => {
      if (ws.readyState !== ws.OPEN) return;
      answered = false;
      const drainsAtPing = drains;
      ws.ping();
      if (deadline) clearTimeout(deadline);
      deadline = setTimeout(() => {
        deadline = null;
        if (answered || ws.readyState !== ws.OPEN) return;
        if (drains > drainsAtPing && ws.bufferedAmount > 0) return; // reading, slowly
        this.ctx.log.warn({ remote: who, ping_timeout_ms: timeoutMs }, 'a WebSocket peer did not answer a ping in time; terminated');
        ws.terminate();
      }, timeoutMs);
    }, intervalMs);
    ws.once('close', () => {
      clearInterval(tick);
      if (deadline) clearTimeout(deadline);
    });
  }

  /**
   * Stops accepting; lets requests in flight finish for up to drainMs (as SupervisorServer.close),
   * then terminates every WebSocket and closes what waits for an upgrade.
   */
  async close(drainMs = 5000): Promise<void> {
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    for (const [socket, timer] of this.waiting) {
      clearTimeout(timer);
      socket.destroy();
    }
    this.waiting.clear();
    const giveUpAt = performance.now() + drainMs;
    while ([...this.connections].some((c) => c.inFlight > 0 && !c.closed) && performance.now() < giveUpAt) {
      await new Promise((r) => setTimeout(r, 20));
    }
    for (const c of this.connections) c.socket.destroy();
    this.server.closeAllConnections();
    await closed;
  }
}

/** HOST:PORT of the peer of req ([v6]:port). */
function remoteOf(req: IncomingMessage): string {
  const { remoteAddress: a, remotePort: p } = req.socket;
  return a?.includes(':') ? `[${a}]:${p}` : `${a}:${p}`;
}
