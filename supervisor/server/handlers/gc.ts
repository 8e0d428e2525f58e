// gc: apply the retention policy now (Supervisor.gc; the plan is store/retention.ts), answered with what was
// removed and freed (docs/reference/protocol.md "Methods").
import type { Handler } from '../handler.js';

export const gc: Handler<'gc'> = ({ supervisor }) => supervisor.gc();
