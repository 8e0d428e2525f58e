// status: the supervisor's health (Supervisor.status), answered as StatusResult (ipc/protocol.ts; its fields:
// docs/reference/protocol.md "Methods").
import type { Handler } from '../handler.js';

export const status: Handler<'status'> = ({ supervisor, socketPath }) => supervisor.status(socketPath);
