// write: stdin bytes at an offset in the writer's stream (exactly once: bytes before that
// stream's cursor were delivered already; tokenless writes share one stream, each writer
// token has its own), and eof; answers once they are handed to the pipe or pty.
import type { Handler } from '../handler.js';

export const write: Handler<'write'> = async ({ supervisor }, params) => {
  const session = supervisor.find(params);
  const cursor = await session.write(Buffer.from(params.data), params.offset, params.eof ?? false, params.writer);
  return { session_id: session.id, cursor };
};
