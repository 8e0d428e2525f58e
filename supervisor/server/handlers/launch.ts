// launch: admit and start a session, or answer with the existing one for its invocation key
// (Supervisor.launch decides). Binds the session to this connection for on_disconnect cancel
// (a new session only: a retry never changes how an existing one ends), and tells a
// reattaching client where its stdin resumes (stdin_cursor).
import type { Handler } from '../handler.js';

export const launch: Handler<'launch'> = ({ supervisor, conn }, params) => {
  const { result, session } = supervisor.launch(params);
  if (!session) return result; // retired: no session object any more
  if (params.on_disconnect === 'cancel' && !result.existing) {
    conn.socket.once('close', () => void session.terminate('cancel'));
  }
  return session.req.stdin === 'stream' ? { ...result, stdin_cursor: session.stdinCursor } : result;
};
