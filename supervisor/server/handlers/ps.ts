// ps: the sessions not ended (all: every one), each as its summary (SessionSummary, ipc/protocol.ts;
// docs/reference/protocol.md "Methods" and the `ps` summaries after the table).
import type { Handler } from '../handler.js';

export const ps: Handler<'ps'> = ({ supervisor }, params) => ({ sessions: supervisor.list(params.all ?? false).map((s) => s.summary()) });
