// subscribe: one stream's stored bytes from a cursor as `output` events, read through the
// chunk reader straight into pooled frames (the replay hot path), then an `end` event: at the
// stored end without follow, at the final cursor with follow. Socket backpressure paces it:
// a slow reader is paused, never buffered without bound, and never slows the drain.
import { encodeOutputFrame } from '../../../ipc/framing.js';
import type { StreamName } from '../../../ipc/protocol.js';
import { ChunkReader } from '../../../core/state/stream-files.js';
import type { Session } from '../../session/session.js';
import type { Connection } from '../connection.js';
import type { Handler } from '../handler.js';
import { streamToRead } from './stream-access.js';

/** Largest output event payload, in bytes. */
const OUTPUT_EVENT_BYTES = 1024 * 1024;
/** Room for an output frame's length prefix and msgpack head (70 bytes for "stdout"; 31-byte stream names at most). */
const OUTPUT_FRAME_HEAD_BYTES = 128;

export const subscribe: Handler<'subscribe'> = async ({ supervisor, conn, id }, p) => {
  const { session, stream, from } = streamToRead(supervisor, p);
  const follow = p.follow ?? false;
  await conn.send({ id, result: { session_id: session.id, stream, from, cursor: session.cursor(stream) } });
  // One reader for the whole subscription: each chunk file is opened once, not per event.
  const reader = new ChunkReader(session.streamDir(stream), session.req.chunkBytes);
  try {
    await streamFrom(conn, id, session, stream, from, follow, reader);
  } finally {
    reader.close();
  }
  return undefined;
};

/** Sends [cursor, ...) as output events, then the end event (see the header). */
async function streamFrom(
  conn: Connection,
  id: number,
  session: Session,
  stream: StreamName,
  cursor: number,
  follow: boolean,
  reader: ChunkReader,
): Promise<void> {
  for (;;) {
    const end = session.cursor(stream);
    while (cursor < end && !conn.closed) {
      const from = cursor;
      let n = 0;
      const bytes = Math.min(OUTPUT_EVENT_BYTES, end - from);
      const into = conn.frameBuffer(bytes + OUTPUT_FRAME_HEAD_BYTES);
      const frame = encodeOutputFrame(id, stream, from, bytes, (buf, offset, max) => (n = reader.readInto(from, end, buf, offset, max)), into);
      if (!frame) break;
      await conn.sendEncoded(frame);
      cursor += n;
    }
    if (conn.closed) return;
    // Re-read after the sends: the drain may have ended while a send waited on a slow
    // reader. Final is read before the cursor, with no await between them.
    const finalNow = session.streamFinal(stream);
    if (!follow || (finalNow && cursor >= session.cursor(stream))) {
      // At most the stored end: a follow from past the end of a stream that then ended shorter ends where the stream did.
      await conn.send({ id, event: 'end', stream, cursor: Math.min(cursor, session.cursor(stream)), final: finalNow });
      return;
    }
    if (cursor < session.cursor(stream)) continue;
    await new Promise<void>((resolve) => {
      const onOutput = (s: StreamName) => {
        if (s !== stream) return;
        session.off('output', onOutput);
        conn.socket.off('close', onClose);
        resolve();
      };
      const onClose = () => {
        session.off('output', onOutput);
        resolve();
      };
      session.on('output', onOutput);
      conn.socket.once('close', onClose);
    });
  }
}
