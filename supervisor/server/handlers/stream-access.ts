// What subscribe and read_index both check before reading a stream: the session (by id or
// key), its output not removed by retention, the stream its own, and a starting cursor not
// past the stored end unless the reader follows a stream not yet final (docs/reference/contract.md "Cursors":
// CURSOR_OUT_OF_RANGE without --follow or once final, a wait with it).
import { SupervisorError } from '../../../ipc/errors.js';
import type { SessionSelector, StreamName } from '../../../ipc/protocol.js';
import type { Session } from '../../session/session.js';
import type { Supervisor } from '../../supervisor.js';

/**
 * The session and stream to read from cursor `from` (default 0). Throws SESSION_NOT_FOUND,
 * OUTPUT_REMOVED, INVALID_ARGUMENT (no such stream in the session) or CURSOR_OUT_OF_RANGE
 * (details.cursor: the stored end) when not following, or when the stream is final.
 */
export function streamToRead(
  supervisor: Supervisor,
  p: SessionSelector & { stream: StreamName; from?: number; follow?: boolean },
): { session: Session; stream: StreamName; from: number } {
  const session = supervisor.find(p);
  const stream = p.stream;
  if (session.outputRemoved) {
    throw new SupervisorError('OUTPUT_REMOVED', `session ${session.id}: its output was removed by the retention policy; the receipt stays (sbx receipt)`);
  }
  if (!session.hasStream(stream)) throw new SupervisorError('INVALID_ARGUMENT', `session ${session.id} has no ${stream} stream`);
  const from = p.from ?? 0;
  const stored = session.cursor(stream);
  const final = session.streamFinal(stream);
  // Following waits for bytes to come, unless the stream is final: then none will.
  if (from > stored && (!p.follow || final)) {
    throw new SupervisorError('CURSOR_OUT_OF_RANGE', `cursor ${from} is past the end of ${stream} (${stored}${final ? ', its final length' : ''})`, {
      cursor: stored,
    });
  }
  return { session, stream, from };
}
