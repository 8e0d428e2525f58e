// What every request handler gets and returns: the method's validated params (schemas.ts)
// and its result type (ipc/methods.ts). One handler per verb lives in handlers/; the
// dispatch (dispatch.ts) validates, counts the request in flight, and sends what it returns.
import type { z } from 'zod';
import type { MethodName, ResultOf } from '../../ipc/methods.js';
import type { ParamsSchemas } from '../../ipc/schemas.js';
import type { Supervisor } from '../supervisor.js';
import type { Connection } from './connection.js';

/** One request: the supervisor, the connection it came on, its id, and the socket's path. */
export interface RequestContext {
  supervisor: Supervisor;
  conn: Connection;
  id: number;
  socketPath: string;
}

/** Params as the schema parsed them. */
export type ParsedParams<M extends MethodName> = z.output<(typeof ParamsSchemas)[M]>;

/**
 * Handles one request; its result is sent as `{id, result}`. A handler that answers by
 * itself (subscribe: a result, events, an end) returns undefined. Throws SupervisorError for
 * a stable error code; anything else is INTERNAL.
 */
export type Handler<M extends MethodName> = (ctx: RequestContext, params: ParsedParams<M>) => ResultOf<M> | Promise<ResultOf<M>> | Promise<undefined>;
