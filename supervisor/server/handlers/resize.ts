// resize: a pty session's size (TIOCSWINSZ; its foreground process group gets SIGWINCH: LiveSession.resize),
// answered with the size set (docs/reference/protocol.md "Methods").
import type { Handler } from '../handler.js';

export const resize: Handler<'resize'> = ({ supervisor }, params) => {
  const session = supervisor.find(params);
  session.resize(params.cols, params.rows);
  return { session_id: session.id, cols: params.cols, rows: params.rows };
};
