// read_index: one stream's per-read index (docs/reference/state-dir.md "index.bin"; stream, cursor, length,
// arrival) from a cursor, for merging streams in arrival order and timestamping (docs/reference/contract.md
// "Cursors"). Bytes are not sent here: they come from subscribe, the index says where each read starts and
// when it arrived. With follow it is a long poll: no record past `from` yet and the stream not final, the
// answer waits for the stream to move (or the connection to go).
import type { IndexRecordWire, ReadIndexResult, StreamName } from '../../../ipc/protocol.js';
import { readIndexFrom } from '../../../core/state/stream-files.js';
import type { Session } from '../../session/session.js';
import { arrivalNowUs } from '../../store/chunks.js';
import type { Handler } from '../handler.js';
import { streamToRead } from './stream-access.js';
import type { Connection } from '../connection.js';

/** Records per answer when the request gives no limit. */
export const READ_INDEX_DEFAULT_LIMIT = 4096;

export const readIndex: Handler<'read_index'> = async ({ supervisor, conn }, p) => {
  const { session, stream, from } = streamToRead(supervisor, p);
  const limit = p.limit ?? READ_INDEX_DEFAULT_LIMIT;
  for (;;) {
    const answer = indexPage(session, stream, from, limit, (bad) => {
      const logged = damagedLogged.get(session) ?? new Set<string>();
      if (logged.has(stream)) return;
      damagedLogged.set(session, logged.add(stream));
      supervisor.log.warn(
        { session_id: session.id, stream, ...bad },
        'read_index: index.bin is damaged; the index ends before the bad record (the bytes past it are served as unindexed)',
      );
    });
    if (!p.follow || answer.records.length > 0 || answer.final || conn.closed) return answer;
    await streamMoved(session, stream, conn);
  }
};

/** The streams of each session whose damaged index.bin was logged (once each); gone with the session. */
const damagedLogged = new WeakMap<object, Set<string>>();

/** A record of index.bin that does not tile the stream: where, and how. */
export interface BadIndexRecord {
  cursor: number;
  length: number;
  expected_cursor: number;
  stored_cursor: number;
  problem: string;
}

/**
 * How many of `records` (from the one holding `from`) tile the stream: the first holds byte
 * `from` (starts at it, or before it), each starts where the one before ends, has a length,
 * and ends at or before the stored cursor. The rest, from the first that does not, are left
 * out: a damaged index.bin ends there, as a torn one does (what follows is unindexed bytes).
 */
export function tilingPrefix(
  records: readonly { cursor: number; length: number }[],
  from: number,
  stored: number,
): { count: number; bad: BadIndexRecord | null } {
  let expected = from;
  for (let i = 0; i < records.length; i++) {
    const r = records[i]!;
    const problem =
      r.length <= 0
        ? 'zero length'
        : i === 0
          ? r.cursor > from || r.cursor + r.length <= from
            ? 'does not hold the cursor asked'
            : null
          : r.cursor < expected
            ? 'overlaps the record before (or goes back)'
            : r.cursor > expected
              ? 'leaves a gap after the record before'
              : null;
    const beyond = problem === null && r.cursor + r.length > stored ? 'ends past the stored bytes' : null;
    if (problem || beyond)
      return { count: i, bad: { cursor: r.cursor, length: r.length, expected_cursor: expected, stored_cursor: stored, problem: (problem ?? beyond)! } };
    expected = r.cursor + r.length;
  }
  return { count: records.length, bad: null };
}

/**
 * The records from `from` now, with what they say about reads not in them (see ReadIndexResult). All synchronous.
 * Records come from index.bin and, for a live stream, from those still in memory whose bytes are stored (the
 * file lags the chunks by up to 100 ms): read in one turn, so they agree.
 */
function indexPage(session: Session, stream: StreamName, from: number, limit: number, onBad: (bad: BadIndexRecord) => void): ReadIndexResult {
  const final = session.streamFinal(stream); // before the records: a final stream gets no more
  const cursor = session.cursor(stream);
  const read = readIndexFrom(session.streamDir(stream), from, limit + 1);
  // index.bin is checked, not trusted: a damaged record ends the index (see tilingPrefix).
  const check = tilingPrefix(read, from, cursor);
  if (check.bad) onBad(check.bad);
  const onDisk = check.bad ? read.slice(0, check.count) : read;
  const fileEnd = onDisk.length ? onDisk[onDisk.length - 1]!.cursor + onDisk[onDisk.length - 1]!.length : from;
  // Past a damaged record no record follows (memory's would not tile with what is served).
  const pending =
    onDisk.length > limit || check.bad ? { records: [], unstoredAtUs: null } : session.pendingIndex(stream, Math.max(from, fileEnd), limit + 1 - onDisk.length);
  const all = [...onDisk, ...pending.records];
  const more = all.length > limit;
  const records: IndexRecordWire[] = all.slice(0, limit).map((r) => ({ cursor: r.cursor, length: r.length, at_us: r.arrivalUs }));
  const last = records[records.length - 1];
  const next = last ? last.cursor + last.length : from;
  let throughUs: number | null = null;
  // Past damage (a live stream) the later reads are not known: no through_us.
  if (!(check.bad && !final) && (!final || more)) {
    if (more)
      throughUs = last!.at_us - 1; // the next record may share its microsecond
    else if (pending.unstoredAtUs !== null) throughUs = pending.unstoredAtUs - 1;
    else throughUs = arrivalNowUs(); // every read so far is indexed: any later one arrives after now
  }
  return { session_id: session.id, stream, from, records, next, more, cursor, final: final && !more, through_us: throughUs };
}

/**
 * Resolves at the stream's next write or end, or when the connection closes; either way both
 * listeners are gone by then (a poll leaves nothing behind on the session or the connection).
 */
function streamMoved(session: Session, stream: StreamName, conn: Pick<Connection, 'onClose'>): Promise<void> {
  return new Promise<void>((resolve) => {
    let offClose = () => {};
    const done = () => {
      session.off('output', onOutput);
      offClose();
      resolve();
    };
    const onOutput = (s: StreamName) => {
      if (s === stream) done();
    };
    session.on('output', onOutput);
    offClose = conn.onClose(done);
  });
}
