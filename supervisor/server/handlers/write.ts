// write: stdin bytes at an offset (exactly once: bytes before the session's stdin cursor were
// delivered already; with a writer token, only if that writer delivered them), and eof;
// answers once they are handed to the pipe or pty.
import type { Handler } from '../handler.js';

export const write: Handler<'write'> = async ({ supervisor }, params) => {
  const session = supervisor.find(params);
  const cursor = await session.write(Buffer.from(params.data), params.offset, params.eof ?? false, params.writer);
  return { session_id: session.id, cursor };
};
