// close: seal, settle every session, scan the workspaces, and answer with the signed close
// receipt (the same one on every later call). With a task: that task's close (task/close.ts),
// answered with its task receipt.
import { DEFAULT_TASK_CLOSE_TIMEOUT_MS } from '../../task/close.js';
import type { Handler } from '../handler.js';

/** How long sessions may end by themselves before close terminates them, when not given. */
const DEFAULT_CLOSE_TIMEOUT_MS = 60_000;

export const close: Handler<'close'> = ({ supervisor }, params) =>
  params.task !== undefined
    ? supervisor.closeTask(params.task, params.timeout_ms ?? DEFAULT_TASK_CLOSE_TIMEOUT_MS, params.workspaces)
    : supervisor.close(params.timeout_ms ?? DEFAULT_CLOSE_TIMEOUT_MS, params.workspaces ?? []);
