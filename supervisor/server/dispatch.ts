// Serving one accepted connection, whatever carries it (the Unix socket: server.ts; a
// WebSocket: remote.ts): the hello deadline, decoding its frames (a bad one refuses the
// connection, counted), the versioned hello first, and each request dispatched: its params
// validated against the method's schema (ipc/schemas.ts), counted in flight
// (ipc.maxInFlight), then its handler (handlers/, one per verb). Not who may connect.
import type { Logger } from 'pino';
import type { z } from 'zod';
import { SupervisorError, isSupervisorError } from '../../ipc/errors.js';
import { encodeFrame } from '../../ipc/framing.js';
import type { MethodName } from '../../ipc/methods.js';
import { PROTOCOL_VERSIONS } from '../../ipc/protocol.js';
import { ParamsSchemas, validate } from '../../ipc/schemas.js';
import { VERSION } from '../../ipc/version.js';
import type { Supervisor } from '../supervisor.js';
import { Connection, MAX_TIMER_MS, type Peer } from './connection.js';
import type { Handler } from './handler.js';
import { HANDLERS } from './handlers/index.js';

/** What serving a connection needs: the supervisor, the log, and the Unix socket's path (status names it). */
export interface ServeContext {
  supervisor: Supervisor;
  log: Logger;
  socketPath: string;
}

/** The log fields naming a peer: uid and pid, and the remote address for a WebSocket peer. */
export function peerFields(peer: Peer): Record<string, unknown> {
  return peer.remote === undefined ? { uid: peer.uid, pid: peer.pid } : { uid: peer.uid, pid: peer.pid, remote: peer.remote };
}

/** Refuses conn after a bad frame (err), counted by its limit (frame_bytes for FRAME_TOO_LARGE) and logged. */
export function refuseFrame(ctx: ServeContext, conn: Connection, err: SupervisorError): void {
  const wire = err.toWire();
  const limit = err.code === 'FRAME_TOO_LARGE' ? 'frame_bytes' : err.code === 'LIMIT_EXCEEDED' ? err.details?.limit : undefined;
  if (typeof limit === 'string') ctx.supervisor.metrics?.ipcRefused(limit);
  ctx.log.warn({ code: wire.code, limit: err.details?.limit, ...peerFields(conn.peer) }, 'closing connection after a bad frame');
  conn.refuse({ id: 0, error: wire });
}

/**
 * Serves an accepted conn until it closes: in `connections` meanwhile (the caller's bound),
 * refused with INVALID_ARGUMENT without a hello within ipc.handshakeTimeoutMs, its 'data'
 * decoded into requests and dispatched.
 */
export function serveConnection(ctx: ServeContext, conn: Connection, connections: Set<Connection>): void {
  const ipc = ctx.supervisor.config.ipc;
  connections.add(conn);
  const handshake = setTimeout(
    () => {
      if (!conn.helloDone) conn.refuse({ id: 0, error: new SupervisorError('INVALID_ARGUMENT', `no hello within ${ipc.handshakeTimeoutMs} ms`).toWire() });
    },
    Math.min(ipc.handshakeTimeoutMs, MAX_TIMER_MS),
  ); // a longer setTimeout fires at once; past 24.8 days it is as good as none
  conn.socket.on('close', () => {
    clearTimeout(handshake);
    connections.delete(conn);
  });
  // The frames of what was read, dispatched in order, in slices of at most DISPATCH_SLICE_MS of
  // synchronous work: between slices the answers so far go out (a handler answers in a
  // continuation, after the frames dispatched with it) and other connections are served, while
  // this one's reading waits. A burst of launches on one connection (~40 ms each on a loaded
  // disk) had held every answer, pings included, past the client's silence deadline.
  const queued: unknown[] = [];
  let refusal: SupervisorError | null = null;
  let draining = false;
  const drain = async (): Promise<void> => {
    draining = true;
    try {
      let sliceStartedAt = performance.now();
      for (let at = 0; at < queued.length && !conn.closed && !conn.refused;) {
        void dispatch(ctx, conn, queued[at++]);
        if (at < queued.length && performance.now() - sliceStartedAt >= DISPATCH_SLICE_MS) {
          conn.holdReading();
          await new Promise((resolve) => setImmediate(resolve));
          sliceStartedAt = performance.now();
        }
      }
    } finally {
      queued.length = 0;
      draining = false;
      // A frame that could not be decoded is refused after the whole ones before it (the refusal
      // reads on and drops what the peer still sends: reading resumes either way); not twice,
      // nor once the connection is gone.
      if (refusal && !conn.refused && !conn.closed) refuseFrame(ctx, conn, refusal);
      conn.releaseReading();
    }
  };
  conn.socket.on('data', (data: Buffer) => {
    if (refusal) return;
    try {
      conn.decode(data, (frame) => void queued.push(frame));
    } catch (err) {
      refusal = isSupervisorError(err) ? err : new SupervisorError('INVALID_ARGUMENT', String(err));
      // Its bytes and clock go now (the shared pending-bytes bound), the refusal after the frames before it.
      conn.stopDecoding();
      conn.holdReading();
    }
    if (!draining) void drain();
  });
}

/** A connection's frames are dispatched in slices of at most this much synchronous work (serveConnection). */
const DISPATCH_SLICE_MS = 20;

/** One decoded frame of conn: hello first, then any method; every failure is answered `{id, error}`. */
export async function dispatch(ctx: ServeContext, conn: Connection, raw: unknown): Promise<void> {
  const { supervisor } = ctx;
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
      const version = hello.versions.filter((v) => (PROTOCOL_VERSIONS as readonly number[]).includes(v)).reduce((m, v) => Math.max(m, v), -Infinity);
      if (!Number.isFinite(version)) {
        const err = new SupervisorError('UNSUPPORTED_VERSION', `protocol versions ${hello.versions.join(', ')} unsupported`, {
          supported: [...PROTOCOL_VERSIONS],
        });
        conn.socket.end(encodeFrame({ id, error: err.toWire() }));
        return;
      }
      conn.helloDone = true;
      const { instance, generation } = supervisor.ctx.identity;
      await conn.send({
        id,
        result: { version, server: `sandbox-supervisor/${VERSION}`, instance, generation, max_frame_bytes: supervisor.config.ipc.maxFrameBytes },
      });
      return;
    }
    if (frame.method === 'hello') throw new SupervisorError('INVALID_ARGUMENT', 'hello was already exchanged on this connection');
    const method = frame.method as Exclude<MethodName, 'hello'>;
    const handler = Object.hasOwn(HANDLERS, method) ? (HANDLERS[method] as Handler<typeof method>) : undefined;
    if (!handler) throw new SupervisorError('INVALID_ARGUMENT', `unknown method ${JSON.stringify(frame.method)}`);
    const max = supervisor.config.ipc.maxInFlight;
    if (conn.inFlight >= max) {
      const err = new SupervisorError('LIMIT_EXCEEDED', `${max} requests of this connection are in flight`, { limit: 'in_flight', max, retry_after_ms: 100 });
      // Refused before Supervisor.launch counts it: a launch refused here is a refused launch too.
      supervisor.metrics?.ipcRefused('in_flight');
      if (method === 'launch') supervisor.metrics?.launchRefused(err);
      throw err;
    }
    conn.inFlight++;
    try {
      const params = validate(ParamsSchemas[method] as z.ZodType<unknown>, frame.params, method);
      const result = await handler({ supervisor, conn, id, socketPath: ctx.socketPath }, params as never);
      if (result !== undefined) await conn.send({ id, result });
    } finally {
      conn.inFlight--;
    }
  } catch (err) {
    if (!isSupervisorError(err)) ctx.log.error({ err, method: frame?.method }, 'request failed');
    const wire = isSupervisorError(err) ? err.toWire() : new SupervisorError('INTERNAL', (err as Error).message).toWire();
    await conn.send({ id, error: wire });
  }
}
