// The Prometheus endpoint: a node:http server on a TCP address or a Unix socket (address.ts) that answers GET
// and HEAD /metrics with the text exposition, 404 for any other path, 405 for any other method, 413 for a
// request with a body; bounded (connections, header size and time, request time, idle keep-alive) so a slow
// or hostile client holds little. Owns the listener and its socket file; not the metrics (registry.ts). See
// node:http (server.headersTimeout, requestTimeout) and unix(7).
import { chmodSync, lstatSync, statSync, unlinkSync } from 'node:fs';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { connect, type AddressInfo, type Socket } from 'node:net';
import { dirname } from 'node:path';
import type { Logger } from 'pino';
import { ConfigError } from '../config.js';
import { isLoopback, type MetricsAddress } from './address.js';
import { errnoCode } from '../../ipc/errno.js';

/**
 * Connections the endpoint holds at once. A new one past it closes the oldest connection
 * not in a request (one still sending its headers, or idle between requests), so a client
 * that holds connections open cannot keep a scraper out; only when every one is being
 * answered is the new one closed.
 */
export const METRICS_MAX_CONNECTIONS = 64;
/** A request's headers must be whole within this (slowloris); a scraper sends them at once. */
export const HEADERS_TIMEOUT_MS = 2_000;
/** A whole request, headers and all, within this. */
export const REQUEST_TIMEOUT_MS = 10_000;
/** An idle keep-alive connection is closed after this. */
export const KEEP_ALIVE_TIMEOUT_MS = 5_000;
/** Any connection without activity this long is closed. */
export const IDLE_TIMEOUT_MS = 15_000;
/** Request headers larger than this get 431. */
export const MAX_HEADER_BYTES = 8 * 1024;
/** Bytes of an unwanted request body read (and dropped) before the connection is cut. */
const MAX_DISCARD_BYTES = 64 * 1024;

export interface MetricsListener {
  /** Where it listens: `HOST:PORT` with the port bound (for port 0), or the socket path. */
  readonly address: string;
  /** Stops listening, closes every connection, removes its socket file. */
  close(): Promise<void>;
}

/** The body of a scrape and its content type. */
export type RenderMetrics = () => Promise<{ contentType: string; body: string }>;

/**
 * Listens at addr and serves render() at /metrics. ConfigError (exit 2 at start-up) when
 * the address cannot be had: in use, not this machine's, no permission, a socket path in use
 * or taken by another kind of file.
 */
export async function listenMetrics(addr: MetricsAddress, render: RenderMetrics, log: Logger, source = 'metrics.listen'): Promise<MetricsListener> {
  // node checks headersTimeout and requestTimeout every connectionsCheckingInterval (30 s by default).
  const server = createServer(
    {
      maxHeaderSize: MAX_HEADER_BYTES,
      headersTimeout: HEADERS_TIMEOUT_MS,
      requestTimeout: REQUEST_TIMEOUT_MS,
      keepAliveTimeout: KEEP_ALIVE_TIMEOUT_MS,
      connectionsCheckingInterval: 1000,
    },
    (req, res) => {
      void answer(req, res, render, log);
    },
  );
  // Connections not in a request, oldest first: the ones a new connection may push out.
  const waiting = new Set<Socket>();
  const open = new Set<Socket>();
  server.on('connection', (socket: Socket) => {
    if (open.size >= METRICS_MAX_CONNECTIONS) {
      const oldest = waiting.values().next().value;
      if (oldest === undefined) return void socket.destroy();
      waiting.delete(oldest);
      open.delete(oldest);
      oldest.destroy();
    }
    open.add(socket);
    waiting.add(socket);
    socket.once('close', () => {
      open.delete(socket);
      waiting.delete(socket);
    });
  });
  server.on('request', (req: IncomingMessage, res: ServerResponse) => {
    const socket = req.socket;
    waiting.delete(socket);
    res.once('close', () => {
      // Waiting for its next request (keep-alive): the newest of those that may be pushed out.
      if (!socket.destroyed && open.has(socket)) waiting.add(socket);
    });
  });
  server.setTimeout(IDLE_TIMEOUT_MS, (socket) => socket.destroy());
  const fail = (why: string) => new ConfigError(`${source} ${addr.text}: ${why}`);

  if (addr.kind === 'unix') {
    // bind(2) says EACCES (as libuv maps it) for a directory that is not there: look first.
    checkDirectory(dirname(addr.path), fail);
    await clearStaleSocket(addr.path, fail);
  }
  await new Promise<void>((resolve, reject) => {
    server.once('error', (err: NodeJS.ErrnoException) => {
      const why: Record<string, string> = {
        EADDRINUSE: 'the address is in use (EADDRINUSE)',
        EADDRNOTAVAIL: 'not an address of this machine (EADDRNOTAVAIL)',
        EACCES: 'permission denied (EACCES)',
        ENOENT: 'its directory does not exist (ENOENT)',
        ENOTDIR: 'a component of the path is not a directory (ENOTDIR)',
      };
      reject(fail(why[err.code ?? ''] ?? `cannot listen: ${err.message}`));
    });
    if (addr.kind === 'unix') server.listen(addr.path, resolve);
    else server.listen({ host: addr.host, port: addr.port, exclusive: true }, resolve);
  });
  server.removeAllListeners('error');
  server.on('error', (err) => log.error({ err }, 'metrics endpoint error'));

  let address: string;
  let socketIno = -1;
  if (addr.kind === 'unix') {
    try {
      socketIno = lstatSync(addr.path).ino;
      chmodSync(addr.path, 0o660);
    } catch (err) {
      // Not the socket we bound (gone, or moved): close and leave nothing of ours behind.
      server.close();
      try {
        if (socketIno !== -1 && lstatSync(addr.path).ino === socketIno) unlinkSync(addr.path);
      } catch {
        // already gone
      }
      throw fail(`the socket bound cannot be set to mode 0660: ${errnoCode(err) ?? (err as Error).message}`);
    }
    address = addr.path;
  } else {
    const bound = server.address() as AddressInfo;
    address = bound.family === 'IPv6' ? `[${bound.address}]:${bound.port}` : `${bound.address}:${bound.port}`;
    if (!isLoopback(addr.host))
      log.warn({ metrics: address }, 'the metrics endpoint listens beyond the loopback: whoever can reach it reads the metrics (as configured)');
  }
  log.info({ metrics: address }, 'metrics listening');

  return {
    address,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
        if (addr.kind !== 'unix') return;
        try {
          // Only our own socket file: never one a later listener made at the same path.
          if (lstatSync(addr.path).ino === socketIno) unlinkSync(addr.path);
        } catch {
          // already gone
        }
      }),
  };
}

/** One request: GET or HEAD /metrics renders; everything else is refused with its status. */
async function answer(req: IncomingMessage, res: ServerResponse, render: RenderMetrics, log: Logger): Promise<void> {
  const path = (req.url ?? '').split('?')[0];
  const hasBody = (req.headers['content-length'] !== undefined && req.headers['content-length'] !== '0') || req.headers['transfer-encoding'] !== undefined;
  if (hasBody) discardBody(req);
  const refuse = (status: number, text: string, headers: Record<string, string> = {}) => {
    res.writeHead(status, { 'Content-Type': 'text/plain; charset=utf-8', ...(hasBody ? { Connection: 'close' } : {}), ...headers });
    res.end(`${text}\n`);
  };
  if (path !== '/metrics') return refuse(404, 'not found: the metrics are at /metrics');
  if (req.method !== 'GET' && req.method !== 'HEAD') return refuse(405, `method ${req.method} not allowed: GET or HEAD`, { Allow: 'GET, HEAD' });
  if (hasBody) return refuse(413, 'a request body is not accepted');
  try {
    const { contentType, body } = await render();
    res.writeHead(200, { 'Content-Type': contentType, 'Content-Length': Buffer.byteLength(body), 'Cache-Control': 'no-store' });
    res.end(body);
  } catch (err) {
    log.error({ err }, 'metrics could not be rendered');
    if (!res.headersSent) refuse(500, 'the metrics could not be rendered (see the supervisor log)');
  }
}

/** Reads and drops a body nobody wants (so the answer is not lost to a reset), cutting the connection past MAX_DISCARD_BYTES. */
function discardBody(req: IncomingMessage): void {
  let bytes = 0;
  req.on('data', (chunk: Buffer) => {
    bytes += chunk.length;
    if (bytes > MAX_DISCARD_BYTES) req.socket.destroy();
  });
}

/** The directory a socket is to be made in: it must exist and be a directory. */
function checkDirectory(dir: string, fail: (why: string) => Error): void {
  let isDir: boolean;
  try {
    isDir = statSync(dir).isDirectory();
  } catch (err) {
    const code = errnoCode(err);
    if (code === 'ENOENT') throw fail(`its directory ${dir} does not exist (create it first)`);
    if (code === 'ENOTDIR') throw fail(`a component of ${dir} is not a directory (ENOTDIR)`);
    if (code === 'EACCES') throw fail(`its directory ${dir} cannot be searched: permission denied (EACCES)`);
    throw fail(`its directory ${dir} cannot be read: ${(err as Error).message}`);
  }
  if (!isDir) throw fail(`${dir} is not a directory`);
}

/** A socket file left at path: replaced if nobody answers on it; one that answers, or any other file, is an error. */
async function clearStaleSocket(path: string, fail: (why: string) => Error): Promise<void> {
  let isSocket: boolean;
  try {
    isSocket = lstatSync(path).isSocket();
  } catch {
    return; // nothing there
  }
  if (!isSocket) throw fail('a file that is not a socket is at that path');
  const answers = await new Promise<boolean>((resolve) => {
    const s = connect(path);
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
  if (answers) throw fail('the socket is in use by a running process');
  unlinkSync(path);
}
