// The client's frame transports (issue 30): the supervisor's Unix socket, a WebSocket (one
// binary message = one frame body) and a spawned command whose stdin/stdout carry the
// length-prefixed stream (`ssh HOST sbx bridge`, `docker exec -i BOX sbx bridge`), and which
// endpoint a client uses (options, else $SBX_URL, else the socket). Owns bytes and frames
// only: requests, keepalive and reconnects are ipc/client.ts's.
import { readFileSync, statSync } from 'node:fs';
import { connect as netConnect, type Socket } from 'node:net';
import { spawn, type ChildProcess } from 'node:child_process';
import type { IncomingMessage } from 'node:http';
import type WebSocketType from 'ws';
import { ERROR_CODES, SupervisorError, type ErrorCode } from './errors.js';
import { decodeBody, DEFAULT_MAX_FRAME_BYTES, FrameDecoder } from './framing.js';
import { defaultSocketPath } from './paths.js';
import { errnoCode } from './errno.js';

/** Where a supervisor is: its Unix socket, a ws:// or wss:// URL, or a command to spawn. */
export type Endpoint =
  | { kind: 'socket'; socketPath: string }
  | { kind: 'url'; url: string; token: string | null; tokenFile: string | null; caFile: string | null }
  | { kind: 'command'; command: string[]; stderr: 'inherit' | 'capture' };

/** The endpoint options of ConnectOptions (at most one of socketPath, url, command). */
export interface EndpointOptions {
  /** The supervisor's Unix socket (default: $SBX_SOCKET or the default path). */
  socketPath?: string;
  /** ws://HOST:PORT or wss://HOST:PORT of a supervisor's remote listener (default: $SBX_URL). */
  url?: string;
  /** The bearer token for url (else tokenFile, else $SBX_TOKEN, else $SBX_TOKEN_FILE). */
  token?: string;
  /** A file holding the token (read at every connect: a rotated file is picked up). */
  tokenFile?: string;
  /** PEM CA certificate(s) to trust for wss:// (default: $SBX_CA_FILE, else the system's). */
  caFile?: string;
  /** A command whose stdin/stdout are the stream (`["ssh", "host", "sbx", "bridge"]`), spawned again per connect. */
  command?: string[];
  /** The command's stderr: inherited (default), or captured (its last 4 KiB) for the error message when it ends. */
  commandStderr?: 'inherit' | 'capture';
}

/** A transport-level failure (not an answer): an errno-like `code` (ETIMEDOUT, ECONNRESET, ...). */
export function transportError(code: string, message: string, extra: Record<string, unknown> = {}): NodeJS.ErrnoException {
  return Object.assign(new Error(message), { code, ...extra });
}

/**
 * The endpoint: explicit options first (more than one of socketPath, url, command:
 * INVALID_ARGUMENT), else $SBX_URL (with $SBX_TOKEN / $SBX_TOKEN_FILE), else the socket
 * ($SBX_SOCKET or the default path). A url must be ws:// or wss://; a command not empty.
 */
export function resolveEndpoint(o: EndpointOptions = {}, env: NodeJS.ProcessEnv = process.env): Endpoint {
  const given = [o.socketPath !== undefined && 'socketPath', o.url !== undefined && 'url', o.command !== undefined && 'command'].filter(Boolean);
  if (given.length > 1) throw new SupervisorError('INVALID_ARGUMENT', `give one endpoint: ${given.join(' and ')} both name a supervisor`);
  if (o.command !== undefined) {
    if (!Array.isArray(o.command) || o.command.length === 0 || o.command.some((a) => typeof a !== 'string')) {
      throw new SupervisorError('INVALID_ARGUMENT', 'command is a non-empty array of strings (the program, then its arguments)');
    }
    return { kind: 'command', command: [...o.command], stderr: o.commandStderr ?? 'inherit' };
  }
  const url = o.url ?? (o.socketPath === undefined ? env.SBX_URL || undefined : undefined);
  if (url !== undefined) {
    if (!/^wss?:\/\/[^/]/i.test(url))
      throw new SupervisorError('INVALID_ARGUMENT', `a supervisor URL is ws://HOST:PORT or wss://HOST:PORT, got ${JSON.stringify(url)}`);
    const token = o.token ?? null;
    const tokenFile = token !== null ? null : (o.tokenFile ?? (env.SBX_TOKEN ? null : env.SBX_TOKEN_FILE || null));
    return { kind: 'url', url, token: token ?? (tokenFile === null ? env.SBX_TOKEN || null : null), tokenFile, caFile: o.caFile ?? (env.SBX_CA_FILE || null) };
  }
  return { kind: 'socket', socketPath: o.socketPath ?? defaultSocketPath(env) };
}

/** An endpoint as messages name it: the socket path, the URL, or the command line. */
export function describeEndpoint(e: Endpoint): string {
  if (e.kind === 'socket') return e.socketPath;
  if (e.kind === 'url') return e.url;
  return e.command.map((a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : `'${a.replace(/'/g, `'\\''`)}'`)).join(' ');
}

/**
 * One connection's frames. send() takes a frame as encodeFrame made it ([u32 BE length][body]);
 * received frames go to the start() callback, in order. onClose listeners are called once,
 * with why (an Error with an errno-like code, or a SupervisorError for a bad frame).
 */
export interface FrameTransport {
  /** For messages: the socket path, URL or command. */
  readonly endpoint: string;
  /** Grows with each piece of bytes (or WebSocket ping/pong) that arrived: keepalive compares it. */
  readonly receivedChunks: number;
  /** Whether pause() holds reading now. */
  readonly paused: boolean;
  /** The spawned command's pid (command transport only). */
  readonly pid?: number;
  /** Starts delivering frames (call once, right after the transport opened). */
  start(onFrame: (value: unknown) => void): void;
  send(frame: Buffer): void;
  /** Stops reading (backpressure towards the supervisor) / resumes. */
  pause(): void;
  resume(): void;
  /** Ends the transport (a command: its stdin ended, then SIGTERM to its process group, SIGKILL after 2 s; reaped). */
  close(): void;
  /** Ends it at once; err is what onClose reports (default: closed). */
  destroy(err?: Error): void;
  onClose(listener: (err: Error) => void): void;
}

/** What every transport shares: the decoder for byte streams, close listeners, the received count. */
abstract class BaseTransport implements FrameTransport {
  receivedChunks = 0;
  paused = false;
  protected onFrame: ((value: unknown) => void) | null = null;
  protected closedError: Error | null = null;
  private readonly closeListeners: ((err: Error) => void)[] = [];

  constructor(readonly endpoint: string) {}

  abstract start(onFrame: (value: unknown) => void): void;
  abstract send(frame: Buffer): void;
  abstract pause(): void;
  abstract resume(): void;
  abstract close(): void;
  abstract destroy(err?: Error): void;

  onClose(listener: (err: Error) => void): void {
    if (this.closedError) listener(this.closedError);
    else this.closeListeners.push(listener);
  }

  protected closed(err: Error): void {
    if (this.closedError) return;
    this.closedError = err;
    for (const l of this.closeListeners.splice(0)) l(err);
  }
}

/** Length-prefixed frames on a byte stream (a socket, or a child's stdout). */
function decodeInto(t: { receivedChunks: number }, decoder: FrameDecoder, data: Buffer, onFrame: (value: unknown) => void): void {
  t.receivedChunks++;
  decoder.push(data, onFrame);
}

// --- The Unix socket.

/**
 * connect(2) to a path that is there but no socket (a regular file, a directory) fails
 * ECONNREFUSED, as for a socket nobody listens on, which a client would wait for: it is
 * ENOTSOCK here (never retried), naming what is there. null when the path is a socket, or gone.
 */
function notASocket(err: NodeJS.ErrnoException, socketPath: string): NodeJS.ErrnoException | null {
  if (err.code !== 'ECONNREFUSED') return null;
  let kind: string;
  try {
    const st = statSync(socketPath);
    if (st.isSocket()) return null;
    kind = st.isDirectory() ? 'a directory' : st.isFile() ? 'a regular file' : 'something else';
  } catch {
    return null;
  }
  return Object.assign(new Error(`connect ENOTSOCK ${socketPath}: ${kind}, not a socket`), {
    code: 'ENOTSOCK',
    errno: -88,
    syscall: 'connect',
    address: socketPath,
    found: kind,
  });
}

class SocketTransport extends BaseTransport {
  private readonly decoder: FrameDecoder;

  constructor(
    private readonly socket: Socket,
    endpoint: string,
    maxFrameBytes: number,
  ) {
    super(endpoint);
    this.decoder = new FrameDecoder(maxFrameBytes);
    socket.on('error', (err) => this.closed(err));
    socket.on('close', () => this.closed(transportError('ECONNRESET', 'connection to the supervisor closed')));
  }

  start(onFrame: (value: unknown) => void): void {
    this.socket.on('data', (data: Buffer) => {
      try {
        decodeInto(this, this.decoder, data, onFrame);
      } catch (err) {
        this.destroy(err as Error);
      }
    });
  }

  send(frame: Buffer): void {
    this.socket.write(frame);
  }

  pause(): void {
    this.paused = true;
    this.socket.pause();
  }

  resume(): void {
    this.paused = false;
    this.socket.resume();
  }

  close(): void {
    this.socket.end();
    this.socket.destroy();
  }

  destroy(err?: Error): void {
    if (err) this.closed(err);
    this.socket.destroy();
  }
}

function openSocket(socketPath: string, maxFrameBytes: number, signal?: AbortSignal): Promise<FrameTransport> {
  return new Promise<FrameTransport>((resolve, reject) => {
    const s = netConnect(socketPath);
    const abort = () => {
      s.destroy();
      reject(signal!.reason);
    };
    signal?.addEventListener('abort', abort, { once: true });
    s.once('connect', () => {
      signal?.removeEventListener('abort', abort);
      s.off('error', reject);
      resolve(new SocketTransport(s, socketPath, maxFrameBytes));
    });
    s.once('error', (err: NodeJS.ErrnoException) => {
      signal?.removeEventListener('abort', abort);
      reject(notASocket(err, socketPath) ?? err);
    });
  });
}

// --- A spawned command (stdin: frames to the supervisor, stdout: frames from it).

/** Bytes of a command's stderr kept for its error message. */
const STDERR_TAIL_BYTES = 4096;
/** After SIGTERM on close, how long a command has before SIGKILL. */
const COMMAND_KILL_GRACE_MS = 2000;
/** How long after the command exited its stdout may stay open (a child of it holding it) before the transport is closed anyway. */
const STDOUT_AFTER_EXIT_MS = 1000;

class CommandTransport extends BaseTransport {
  private readonly decoder: FrameDecoder;
  private stderrTail = Buffer.alloc(0);
  private exit: { code: number | null; signal: NodeJS.Signals | null } | null = null;
  private stdoutClosed = false;
  private killTimer: NodeJS.Timeout | null = null;

  constructor(
    private readonly child: ChildProcess,
    endpoint: string,
    maxFrameBytes: number,
  ) {
    super(endpoint);
    this.decoder = new FrameDecoder(maxFrameBytes);
    child.stdin!.on('error', () => {}); // EPIPE once it is gone: its exit says why
    child.stderr?.on('data', (d: Buffer) => {
      const all = Buffer.concat([this.stderrTail, d]);
      this.stderrTail = all.subarray(Math.max(0, all.length - STDERR_TAIL_BYTES));
    });
    child.stdout!.on('close', () => {
      this.stdoutClosed = true;
      if (this.exit) this.ended();
    });
    child.on('exit', (code, signal) => {
      this.exit = { code, signal };
      this.groupGone();
      if (this.stdoutClosed) this.ended();
      else setTimeout(() => this.ended(), STDOUT_AFTER_EXIT_MS).unref();
    });
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  private ended(): void {
    const how = !this.exit ? 'closed its stdout' : this.exit.signal ? `was killed by ${this.exit.signal}` : `exited with status ${this.exit.code}`;
    const stderr = this.stderrTail.toString('utf8').trim();
    this.closed(
      transportError('ECONNRESET', `connection to the supervisor closed: the transport command (${this.endpoint}) ${how}${stderr ? `: ${stderr}` : ''}`, {
        exit: this.exit,
      }),
    );
  }

  start(onFrame: (value: unknown) => void): void {
    this.child.stdout!.on('data', (data: Buffer) => {
      try {
        decodeInto(this, this.decoder, data, onFrame);
      } catch (err) {
        this.destroy(err as Error);
      }
    });
  }

  send(frame: Buffer): void {
    if (!this.closedError) this.child.stdin!.write(frame);
  }

  pause(): void {
    this.paused = true;
    this.child.stdout!.pause();
  }

  resume(): void {
    this.paused = false;
    this.child.stdout!.resume();
  }

  close(): void {
    this.destroy();
  }

  /**
   * Ends its stdin, then signals its process group (the command runs in its own, so what it
   * started goes too: `sh -c 'bridge; sleep 30'`) by number: SIGTERM (and SIGCONT, for one
   * stopped), SIGKILL after the grace unless the group is empty by then; Node reaps the child.
   */
  destroy(err?: Error): void {
    if (err) this.closed(err);
    this.child.stdin!.end();
    this.child.stdout!.destroy();
    if (this.killTimer || this.child.pid === undefined) return;
    const pgid = this.child.pid;
    signalGroup(pgid, 'SIGTERM');
    signalGroup(pgid, 'SIGCONT');
    this.killTimer = setTimeout(() => signalGroup(pgid, 'SIGKILL'), COMMAND_KILL_GRACE_MS);
    this.closed(transportError('ECONNRESET', 'connection to the supervisor closed'));
  }

  /** Once the child exited: the group's SIGKILL is still due unless nothing of it is left. */
  private groupGone(): void {
    if (this.killTimer && !signalGroup(this.child.pid!, 0)) clearTimeout(this.killTimer);
  }
}

/** kill(-pgid, signal); false when no process of the group is left (ESRCH). */
function signalGroup(pgid: number, signal: NodeJS.Signals | 0): boolean {
  try {
    process.kill(-pgid, signal);
    return true;
  } catch {
    return false;
  }
}

async function openCommand(e: Extract<Endpoint, { kind: 'command' }>, maxFrameBytes: number, signal?: AbortSignal): Promise<FrameTransport> {
  const endpoint = describeEndpoint(e);
  return new Promise<FrameTransport>((resolve, reject) => {
    // detached: its own process group (and session), so close() can signal all it started;
    // still our child, reaped (never unref'd). No controlling terminal: ssh needs keys/BatchMode.
    const child = spawn(e.command[0]!, e.command.slice(1), { stdio: ['pipe', 'pipe', e.stderr === 'capture' ? 'pipe' : 'inherit'], detached: true });
    // Made at once (its listeners see an early exit); handed out once the process started.
    const transport = new CommandTransport(child, endpoint, maxFrameBytes);
    const abort = () => {
      transport.destroy();
      reject(signal!.reason);
    };
    signal?.addEventListener('abort', abort, { once: true });
    child.once('spawn', () => {
      signal?.removeEventListener('abort', abort);
      resolve(transport);
    });
    child.once('error', (err: NodeJS.ErrnoException) => {
      signal?.removeEventListener('abort', abort);
      reject(
        transportError(err.code ?? 'ENOENT', `cannot start the transport command (${endpoint}): ${err.message}`, { syscall: 'spawn', path: e.command[0] }),
      );
    });
  });
}

// --- WebSocket (one binary message = one frame body, without the length prefix).

class WebSocketTransport extends BaseTransport {
  constructor(
    private readonly ws: WebSocketType,
    endpoint: string,
  ) {
    super(endpoint);
    const alive = () => void this.receivedChunks++;
    ws.on('ping', alive);
    ws.on('pong', alive);
    ws.on('error', (err) => this.closed(err));
    ws.on('close', (code: number, reason: Buffer) => {
      const why =
        code === 1009
          ? ' (1009: a message was over the size limit)'
          : code && code !== 1000 && code !== 1005
            ? ` (${code}${reason.length ? `: ${reason.toString('utf8')}` : ''})`
            : '';
      this.closed(transportError('ECONNRESET', `connection to the supervisor at ${endpoint} closed${why}`, { closeCode: code }));
    });
  }

  start(onFrame: (value: unknown) => void): void {
    this.ws.on('message', (data: Buffer, isBinary: boolean) => {
      this.receivedChunks++;
      try {
        if (!isBinary) throw new SupervisorError('INVALID_ARGUMENT', 'the supervisor sent a text message; frames are binary messages');
        onFrame(decodeBody(data));
      } catch (err) {
        this.destroy(err as Error);
      }
    });
  }

  send(frame: Buffer): void {
    if (this.ws.readyState === this.ws.OPEN) this.ws.send(frame.subarray(4), { binary: true });
  }

  pause(): void {
    this.paused = true;
    this.ws.pause();
  }

  resume(): void {
    this.paused = false;
    this.ws.resume();
  }

  close(): void {
    this.ws.close(1000);
    // The supervisor answers the close at once; one that does not is cut off.
    setTimeout(() => this.ws.terminate(), 1000).unref();
  }

  destroy(err?: Error): void {
    if (err) this.closed(err);
    this.ws.terminate();
  }
}

/** The token to send: given, else read from its file now (whitespace at the ends dropped); null: none. */
function tokenOf(e: Extract<Endpoint, { kind: 'url' }>): string | null {
  if (e.token !== null) return e.token;
  if (e.tokenFile === null) return null;
  try {
    return readFileSync(e.tokenFile, 'utf8').trim();
  } catch (err) {
    throw new SupervisorError('INVALID_ARGUMENT', `cannot read the token file ${e.tokenFile}: ${errnoCode(err) ?? (err as Error).message}`);
  }
}

/**
 * An HTTP answer instead of the upgrade, as an error: 401/403 is UNAUTHORIZED; a body
 * `{ error: { code, message } }` with a known code is that SupervisorError (503 LIMIT_EXCEEDED
 * is retried, as on the socket); another 5xx (a proxy with no supervisor behind) is
 * ECONNREFUSED (retried); anything else INVALID_ARGUMENT. The message quotes the body's.
 */
function refusal(endpoint: string, res: IncomingMessage, body: string): Error {
  let message = body.trim().slice(0, 500);
  let wire: { code?: unknown; details?: unknown } | null = null;
  try {
    const j = JSON.parse(body) as { error?: { code?: string; message?: string; details?: unknown } | string; message?: string };
    if (typeof j.error === 'object' && j.error !== null) wire = j.error;
    const m = typeof j.error === 'object' ? j.error?.message : typeof j.error === 'string' ? j.error : j.message;
    if (typeof m === 'string') message = m;
  } catch {
    // plain text
  }
  const status = res.statusCode ?? 0;
  const what = `the supervisor at ${endpoint} answered HTTP ${status}${res.statusMessage ? ` ${res.statusMessage}` : ''}${message ? `: ${message}` : ''}`;
  const details = { http_status: status, ...(wire?.details && typeof wire.details === 'object' ? wire.details : {}) };
  if (status === 401 || status === 403)
    return new SupervisorError('UNAUTHORIZED', `${what} (check the token: --token-file, SBX_TOKEN or SBX_TOKEN_FILE)`, details);
  const hint = status === 426 ? ' (the WebSocket upgrade did not reach it: a proxy in between?)' : '';
  if (typeof wire?.code === 'string' && Object.hasOwn(ERROR_CODES, wire.code)) return new SupervisorError(wire.code as ErrorCode, `${what}${hint}`, details);
  if (status >= 500) return transportError('ECONNREFUSED', what, { httpStatus: status });
  return new SupervisorError('INVALID_ARGUMENT', `${what}${hint}`, details);
}

async function openWebSocket(e: Extract<Endpoint, { kind: 'url' }>, maxFrameBytes: number, signal?: AbortSignal): Promise<FrameTransport> {
  const token = tokenOf(e);
  let ca: Buffer | undefined;
  if (e.caFile !== null) {
    try {
      ca = readFileSync(e.caFile);
    } catch (err) {
      throw new SupervisorError('INVALID_ARGUMENT', `cannot read the CA file ${e.caFile}: ${errnoCode(err) ?? (err as Error).message}`);
    }
  }
  // Loaded on first use: a client of the Unix socket never pays for it.
  const { default: WebSocket } = await import('ws');
  return new Promise<FrameTransport>((resolve, reject) => {
    const ws = new WebSocket(e.url, {
      headers: token !== null ? { Authorization: `Bearer ${token}` } : {},
      maxPayload: maxFrameBytes,
      perMessageDeflate: false,
      ...(ca ? { ca } : {}),
    });
    let settled = false;
    const settle = (err: Error | null) => {
      if (settled) return;
      settled = true;
      signal?.removeEventListener('abort', abort);
      if (err) {
        ws.removeAllListeners('open');
        ws.on('error', () => {});
        ws.terminate();
        reject(err);
      } else resolve(new WebSocketTransport(ws, e.url));
    };
    const abort = () => settle(signal!.reason as Error);
    signal?.addEventListener('abort', abort, { once: true });
    ws.once('open', () => settle(null));
    ws.once('error', (err: Error) => settle(err));
    ws.once('unexpected-response', (req, res) => {
      const parts: Buffer[] = [];
      let bytes = 0;
      res.on('data', (d: Buffer) => {
        if (bytes < 4096) parts.push(d);
        bytes += d.length;
      });
      const done = () => {
        settle(refusal(e.url, res, Buffer.concat(parts).toString('utf8')));
        req.destroy();
      };
      res.once('end', done);
      res.once('error', done);
      res.once('close', done);
    });
  });
}

/**
 * Opens a transport to the endpoint; rejects with the connect error (ENOENT, ECONNREFUSED,
 * ENOTSOCK, a spawn error, UNAUTHORIZED for a 401, ...) or signal's reason once aborted.
 */
export function openTransport(e: Endpoint, options: { maxFrameBytes?: number; signal?: AbortSignal } = {}): Promise<FrameTransport> {
  const max = options.maxFrameBytes ?? DEFAULT_MAX_FRAME_BYTES;
  if (e.kind === 'socket') return openSocket(e.socketPath, max, options.signal);
  if (e.kind === 'command') return openCommand(e, max, options.signal);
  return openWebSocket(e, max, options.signal);
}
