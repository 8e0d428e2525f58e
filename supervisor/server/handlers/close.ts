// close: seal, settle every session, scan the workspaces, and answer with the signed close
// receipt (the same one on every later call).
import type { Handler } from '../handler.js';

/** How long sessions may end by themselves before close terminates them, when not given. */
const DEFAULT_CLOSE_TIMEOUT_MS = 60_000;

export const close: Handler<'close'> = ({ supervisor }, params) => supervisor.close(params.timeout_ms ?? DEFAULT_CLOSE_TIMEOUT_MS, params.workspaces ?? []);
