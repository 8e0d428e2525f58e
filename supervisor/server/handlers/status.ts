// status: the supervisor's health (Supervisor.status).
import type { Handler } from '../handler.js';

export const status: Handler<'status'> = ({ supervisor, socketPath }) => supervisor.status(socketPath);
