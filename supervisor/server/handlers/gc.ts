// gc: apply the retention policy now (Supervisor.gc).
import type { Handler } from '../handler.js';

export const gc: Handler<'gc'> = ({ supervisor }) => supervisor.gc();
