// sbx logs with the per-read index (issue 21): streams merged in arrival order (--stream
// all), lines timestamped by the arrival of the read carrying their first byte
// (--timestamps), records as JSON lines (--json), each stream to its own fd (SplitSink, the
// default without --stream), selections by time (--since/--until) and by
// lines (--tail), live or not (--follow). Owns the merge and the output formats; not the
// bytes (subscribe, through readOutput) nor the index (read_index), which it only reads.
// Imports ipc/ only. Formats: RFC 3339 with microseconds, UTC (docker logs -t).
import { readOutput, ReconnectingClient, type EndpointOptions, type SupervisorClient } from '../ipc/client.js';
import { isDuration, parseDurationUs } from '../ipc/duration.js';
import { SupervisorError } from '../ipc/errors.js';
import type { IndexRecordWire, ReadIndexResult, SessionSelector, StreamName } from '../ipc/protocol.js';

// --- Pure parts: times, lines.

/** µs since the Unix epoch as RFC 3339 UTC with six fraction digits: 2026-12-01T10:00:00.123456Z. */
export function formatArrivalUs(atUs: number): string {
  const ms = Math.floor(atUs / 1000);
  const iso = new Date(ms).toISOString(); // ...T10:00:00.123Z
  return `${iso.slice(0, -1)}${String(atUs - ms * 1000).padStart(3, '0')}Z`;
}

/** A local time without a zone, as docker takes it: a date, with hours and minutes, seconds, and a fraction (T, t or a space between). */
const LOCAL_TIME = /^(\d{4})-(\d{2})-(\d{2})(?:[Tt ](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,6}))?)?)?$/;
const BARE_NUMBER = /^\d+(?:\.\d+)?$/;
const RFC3339 = /^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?([Zz]|[+-]\d{2}:\d{2})$/;

/**
 * A --since/--until value as µs since the epoch, as docker logs takes them: RFC 3339 (Z or
 * an offset up to ±23:59; fractions to the µs: more than 6 digits are refused, any year
 * 0000-9999 as written), a local time without a zone in this process's zone (TZ):
 * `2026-12-03T10:00:00[.123456]`, `2026-12-03 10:00`, `2026-12-03` (midnight), a Unix time
 * in seconds (`1764583200.5`), or a duration ago with its unit (ipc/duration.ts: `10m`,
 * `1h30m`, `500ms`). Throws RangeError naming the input.
 */
export function parseTimeUs(text: string, nowUs: number, flag: string): number {
  const t = text.trim();
  // A duration with its unit (ipc/duration.ts, the CLI's one syntax): that long ago. A bare number is a Unix time.
  if (!BARE_NUMBER.test(t) && isDuration(t)) {
    try {
      return nowUs - parseDurationUs(t, Infinity);
    } catch (err) {
      throw new RangeError(`${flag}: ${(err as Error).message}`);
    }
  }
  if (/^\d+(?:\.\d{7,})$/.test(t) || /^\d{4}-.*\.\d{7,}/.test(t)) {
    throw new RangeError(`${flag}: ${JSON.stringify(text)} has more than 6 fraction digits: times are to the microsecond (the index's unit), give at most 6`);
  }
  if (/^\d+(?:\.\d{1,6})?$/.test(t)) {
    const [s, frac = ''] = t.split('.');
    return Number(s) * 1e6 + Number(frac.padEnd(6, '0').slice(0, 6));
  }
  const m = RFC3339.exec(t);
  if (m) {
    const [, y, mo, d, h, mi, s, frac = '', zone] = m;
    // setUTCFullYear, not Date.UTC: that reads years 0-99 as 1900-1999.
    const check = new Date(0);
    check.setUTCFullYear(Number(y), Number(mo) - 1, Number(d));
    check.setUTCHours(Number(h), Number(mi), Number(s), 0);
    const ms = check.getTime();
    const offsetOk = zone!.length === 1 || (Number(zone!.slice(1, 3)) < 24 && Number(zone!.slice(4, 6)) < 60);
    if (check.getUTCFullYear() === Number(y) && check.getUTCDate() === Number(d) && check.getUTCMonth() === Number(mo) - 1 && Number(h) < 24 && Number(mi) < 60 && Number(s) < 60 && offsetOk) {
      const offsetMin = zone!.toUpperCase() === 'Z' ? 0 : (zone![0] === '-' ? -1 : 1) * (Number(zone!.slice(1, 3)) * 60 + Number(zone!.slice(4, 6)));
      return (ms - offsetMin * 60_000) * 1000 + Number(frac.padEnd(6, '0').slice(0, 6));
    }
  }
  const local = LOCAL_TIME.exec(t);
  if (local) {
    const [, y, mo, d, h = '0', mi = '0', s = '0', frac = ''] = local;
    // The calendar checked in UTC (no zone moves a day), then read in the local zone (TZ).
    const check = new Date(0);
    check.setUTCFullYear(Number(y), Number(mo) - 1, Number(d));
    if (check.getUTCFullYear() === Number(y) && check.getUTCMonth() === Number(mo) - 1 && check.getUTCDate() === Number(d) && Number(h) < 24 && Number(mi) < 60 && Number(s) < 60) {
      // setFullYear, not the Date constructor: that reads years 0-99 as 1900-1999. A wall time
      // a DST change skips is moved forward by the change, one it repeats is its first time.
      const at = new Date(0);
      at.setFullYear(Number(y), Number(mo) - 1, Number(d));
      at.setHours(Number(h), Number(mi), Number(s), 0);
      return at.getTime() * 1000 + Number(frac.padEnd(6, '0').slice(0, 6));
    }
  }
  throw new RangeError(`${flag}: not a time: ${JSON.stringify(text)} (use RFC 3339 like 2026-12-01T10:00:00Z, a local time like 2026-12-01T10:00:00, 2026-12-01 10:00 or 2026-12-01, a Unix time in seconds, or a duration ago like 10m, 1h30m)`);
}

/** One piece of output: bytes [cursor, cursor + data.length) of a stream, from a read that arrived at atUs; indexed false: bytes past the index's end (atUs a lower bound). */
export interface Piece {
  stream: StreamName;
  cursor: number;
  atUs: number;
  indexed: boolean;
  data: Buffer;
}

/** Where output goes: pieces in merged order; idle() when everything stored so far was given (the --follow point); end() at the end. */
export interface PieceSink {
  write(piece: Piece): Promise<void>;
  idle(): Promise<void>;
  end(): Promise<void>;
}

/**
 * Keeps the last `lines` lines of the pieces given (lines of the merged bytes, split on \n;
 * an unterminated last line counts, as tail(1) counts it) and hands them to `out` at the
 * first idle() or end(), then passes everything through. The first piece given on is cut at
 * its line's start (its cursor moves with it). Memory: the pieces holding those lines.
 */
export class TailSink implements PieceSink {
  private held: Piece[] = [];
  /** Newlines in held[1..] (the front piece's own are not counted). */
  private newlinesAfterFront = 0;
  private flushed = false;

  constructor(private readonly lines: number, private readonly out: PieceSink) {}

  async write(piece: Piece): Promise<void> {
    if (this.flushed) return this.out.write(piece);
    if (this.lines === 0) return;
    if (this.held.length > 0) this.newlinesAfterFront += countNewlines(piece.data);
    this.held.push(piece);
    // The front piece can go once the rest alone holds lines + 1 newlines: the tail starts after it.
    while (this.held.length > 1 && this.newlinesAfterFront >= this.lines + 1) {
      this.held.shift();
      this.newlinesAfterFront -= countNewlines(this.held[0]!.data);
    }
  }

  async idle(): Promise<void> {
    await this.flush();
    await this.out.idle();
  }

  async end(): Promise<void> {
    await this.flush();
    await this.out.end();
  }

  private async flush(): Promise<void> {
    if (this.flushed) return;
    this.flushed = true;
    const held = this.held;
    this.held = [];
    if (this.lines === 0 || held.length === 0) return;
    // From the end: skip a final \n, then the start is after the lines-th newline before it.
    let want = this.lines;
    let i = held.length - 1;
    let pos = held[i]!.data.length - 1;
    if (pos >= 0 && held[i]!.data[pos] === 0x0a) pos--;
    let start: { i: number; at: number } = { i: 0, at: 0 };
    outer: for (; i >= 0; i--, pos = i >= 0 ? held[i]!.data.length - 1 : 0) {
      const data = held[i]!.data;
      for (; pos >= 0; pos--) {
        if (data[pos] === 0x0a && --want === 0) {
          start = pos + 1 < data.length ? { i, at: pos + 1 } : { i: i + 1, at: 0 };
          break outer;
        }
      }
    }
    for (let k = start.i; k < held.length; k++) {
      const p = held[k]!;
      const at = k === start.i ? start.at : 0;
      await this.out.write(at === 0 ? p : { ...p, cursor: p.cursor + at, data: p.data.subarray(at) });
    }
  }
}

function countNewlines(data: Buffer): number {
  let n = 0;
  for (let i = data.indexOf(0x0a); i >= 0; i = data.indexOf(0x0a, i + 1)) n++;
  return n;
}

/** Writes to a Node stream, waiting for it to drain (backpressure). */
async function put(out: NodeJS.WritableStream, bytes: Buffer | string): Promise<void> {
  if (!out.write(bytes)) await new Promise((r) => out.once('drain', r));
}

/** The bytes as they are, piece after piece: nothing added, nothing decoded. */
export class RawSink implements PieceSink {
  constructor(private readonly out: NodeJS.WritableStream) {}
  write(piece: Piece): Promise<void> {
    return put(this.out, piece.data);
  }
  async idle(): Promise<void> {}
  async end(): Promise<void> {}
}

/**
 * The bytes with `<RFC 3339 µs> ` before each line: the arrival of the read carrying the
 * line's first byte. A line of one stream cut by a read of the other (a partial line: no \n
 * yet) is left as it came, as docker keeps partial messages: the other stream's read follows
 * it directly, and the rest of the line, when it comes, gets a prefix of its own (its read's
 * arrival).
 */
export class TimestampSink implements PieceSink {
  private last: StreamName | null = null;
  private midLine = false;
  constructor(private readonly out: NodeJS.WritableStream) {}

  async write(piece: Piece): Promise<void> {
    const prefix = Buffer.from(`${formatArrivalUs(piece.atUs)} `);
    const parts: Buffer[] = [];
    let from = 0;
    if (this.last !== piece.stream || !this.midLine) parts.push(prefix);
    for (let nl = piece.data.indexOf(0x0a); nl >= 0; nl = piece.data.indexOf(0x0a, from)) {
      parts.push(piece.data.subarray(from, nl + 1));
      from = nl + 1;
      if (from < piece.data.length) parts.push(prefix);
    }
    if (from < piece.data.length) parts.push(piece.data.subarray(from));
    this.last = piece.stream;
    this.midLine = piece.data.length > 0 && piece.data[piece.data.length - 1] !== 0x0a;
    await put(this.out, Buffer.concat(parts));
  }
  async idle(): Promise<void> {}
  async end(): Promise<void> {}
}

/** One JSON object per piece and line: {stream, cursor, at, data (base64)}, and indexed: false for bytes past the index. */
export class JsonSink implements PieceSink {
  constructor(private readonly out: NodeJS.WritableStream) {}
  write(piece: Piece): Promise<void> {
    const record = { stream: piece.stream, cursor: piece.cursor, at: formatArrivalUs(piece.atUs), data: piece.data.toString('base64'), ...(piece.indexed ? {} : { indexed: false }) };
    return put(this.out, `${JSON.stringify(record)}\n`);
  }
  async idle(): Promise<void> {}
  async end(): Promise<void> {}
}

/**
 * Each stream's pieces to its own sink (sbx logs without --stream: stdout's to fd 1, stderr's
 * to fd 2, as docker logs), in the merge's order; idle() and end() go to both.
 */
export class SplitSink implements PieceSink {
  constructor(private readonly byStream: Partial<Record<StreamName, PieceSink>>, private readonly other: PieceSink) {}
  write(piece: Piece): Promise<void> {
    return (this.byStream[piece.stream] ?? this.other).write(piece);
  }
  async idle(): Promise<void> {
    for (const sink of new Set([...Object.values(this.byStream), this.other])) await sink.idle();
  }
  async end(): Promise<void> {
    for (const sink of new Set([...Object.values(this.byStream), this.other])) await sink.end();
  }
}

// --- The merge.

/** The endpoint fields of the options (where the supervisor is). */
function endpoint(o: LogsOptions): EndpointOptions {
  return { socketPath: o.socketPath, url: o.url, token: o.token, tokenFile: o.tokenFile, caFile: o.caFile, command: o.command, commandStderr: o.commandStderr };
}

/** Merge order of streams at the same arrival microsecond. */
const STREAM_RANK: Record<StreamName, number> = { stdout: 0, stderr: 1, pty: 2 };

export interface LogsOptions extends EndpointOptions {
  selector: SessionSelector;
  /** One stream, or stdout and stderr merged. */
  streams: StreamName[];
  /** First byte cursor (one stream only). */
  from?: number;
  follow: boolean;
  sinceUs?: number;
  untilUs?: number;
  /** Time for bytes of a stream that has no index record at all (the session's admission), µs. */
  noRecordAtUs: number;
  /** Told the errno of each failed reconnect, after the supervisor went away (sbx prints one line). */
  onReconnecting?: (code: string) => void;
  /** Ends the merge early (a client's reader that stopped iterating): the connection is dropped and writeLogs returns. */
  signal?: AbortSignal;
}

/** One item of a stream's queue: a read (from the index), or the bytes past the index's end. */
interface Item {
  cursor: number;
  length: number;
  atUs: number;
  /** Merge position: the arrival, or Infinity for bytes past the index (after every indexed read). */
  orderUs: number;
  indexed: boolean;
}

/** Thrown into requests still waiting when the merge is over. */
class Finished extends Error {}

/** A stream's index as the merge consumes it: read_index pages, filtered by --since/--until. */
class IndexFeed {
  readonly queue: Item[] = [];
  /** Cursor the next read_index starts at. */
  next: number;
  /** No item will be added any more. */
  ended = false;
  /** Ended as a snapshot of a live stream (no --follow): it knows its reads up to throughUs only. */
  cut = false;
  /** Every read arrived at or before it is in the queue or was given (see ReadIndexResult.through_us); null: not known. */
  throughUs: number | null = null;
  private started = false;
  private more = false;
  private lastAtUs: number | null = null;
  private polling: Promise<void> | null = null;

  constructor(readonly stream: StreamName, from: number, private readonly opts: LogsOptions, private readonly call: <T>(fn: (c: SupervisorClient) => Promise<T>) => Promise<T>) {
    this.next = from;
  }

  /** Whether the feed needs a read_index now: never asked, or a page cut by the limit. */
  get wantsPage(): boolean {
    return !this.ended && this.queue.length === 0 && (!this.started || this.more);
  }

  /** read_index now (no wait). */
  async refresh(): Promise<void> {
    const from = this.next;
    this.apply(await this.call((c) => c.readIndex({ ...this.opts.selector, stream: this.stream, from, follow: false })));
  }

  /** read_index with follow (answers once the stream stores a read or ends); one at a time. */
  poll(): Promise<void> {
    const from = this.next;
    this.polling ??= this.call((c) => c.readIndex({ ...this.opts.selector, stream: this.stream, from, follow: true })).then(
      (r) => {
        this.polling = null;
        this.apply(r);
      },
      (err: unknown) => {
        this.polling = null;
        throw err;
      },
    );
    return this.polling;
  }

  /** Takes an answer, unless an answer from the same cursor was taken first (a poll and a refresh crossed). */
  private apply(r: ReadIndexResult): void {
    if (r.from !== this.next || this.ended) return;
    this.started = true;
    const { sinceUs, untilUs } = this.opts;
    for (const rec of r.records) {
      const item = trimmed(rec, r.from);
      this.lastAtUs = rec.at_us;
      if (untilUs !== undefined && rec.at_us > untilUs) {
        this.ended = true;
        return;
      }
      if (sinceUs === undefined || rec.at_us >= sinceUs) this.queue.push(item);
    }
    this.next = r.next;
    this.more = r.more;
    this.throughUs = r.through_us;
    if (r.more) return;
    if (r.final) {
      // The index's end: bytes stored past it (an index cut short) are output too, never
      // dropped: after every indexed read, stamped with the latest time known to precede them.
      // (Only once final: on a live stream next < cursor is also a read not yet wholly stored.)
      if (r.next < r.cursor) {
        const atUs = this.lastAtUs ?? this.opts.noRecordAtUs;
        if ((sinceUs === undefined || atUs >= sinceUs) && (untilUs === undefined || atUs <= untilUs)) {
          this.queue.push({ cursor: r.next, length: r.cursor - r.next, atUs, orderUs: Infinity, indexed: false });
        }
      }
      this.ended = true;
    } else if (!this.opts.follow) {
      // A snapshot of a live stream: it ends at the last wholly stored indexed read (next);
      // reads of it after through_us are not known, so the merge stops before them (writeLogs).
      this.ended = true;
      this.cut = true;
    } else if (untilUs !== undefined && r.through_us !== null && r.through_us >= untilUs) {
      this.ended = true; // every read up to --until is known
    }
  }
}

/** A record from `from` on (the first may start before it). */
function trimmed(rec: IndexRecordWire, from: number): Item {
  const skip = Math.max(0, from - rec.cursor);
  return { cursor: rec.cursor + skip, length: rec.length - skip, atUs: rec.at_us, orderUs: rec.at_us, indexed: true };
}

/** A stream's bytes from a cursor, taken piece by piece (subscribe with follow: a piece's bytes are stored before its record is told). */
class ByteSource {
  private iter: AsyncGenerator<{ cursor: number; data: Buffer }> | null = null;
  private buf: Buffer = Buffer.alloc(0);
  private pos = 0;

  constructor(private readonly stream: StreamName, private readonly opts: LogsOptions) {}

  /** Bytes [cursor, cursor + length); cursor must follow the last taken. */
  async take(cursor: number, length: number): Promise<Buffer> {
    if (!this.iter) {
      this.pos = cursor;
      this.iter = readOutput({ ...endpoint(this.opts), clientName: 'sbx', selector: this.opts.selector, stream: this.stream, from: cursor, follow: true, onReconnecting: this.opts.onReconnecting });
    }
    if (cursor !== this.pos) throw new Error(`sbx logs: ${this.stream} piece at ${cursor}, expected ${this.pos}`);
    while (this.buf.length < length) {
      const next = await this.iter.next();
      if (next.done) throw new Error(`sbx logs: ${this.stream} ended at ${this.pos + this.buf.length}, before ${cursor + length}`);
      this.buf = this.buf.length ? Buffer.concat([this.buf, next.value.data]) : next.value.data;
    }
    const out = this.buf.subarray(0, length);
    this.buf = this.buf.subarray(length);
    this.pos += length;
    return out;
  }

  async close(): Promise<void> {
    await this.iter?.return(undefined);
  }
}

/**
 * Writes the selected output of opts.streams to sink in arrival order: reads ordered by
 * arrival time, ties stdout before stderr, then by cursor. A read is given only once every
 * other stream is known (through_us) to hold no earlier one; with follow, it waits for that
 * (a long poll, never a timer), and ends once every stream is final (or past --until).
 */
export async function writeLogs(opts: LogsOptions, sink: PieceSink): Promise<void> {
  const conn = new ReconnectingClient({ ...endpoint(opts), clientName: 'sbx', onReconnecting: opts.onReconnecting });
  let finished = false;
  // One connection for every read_index: feeds ask at once, and two get()s of a client not
  // yet connected would each connect (one left open would keep sbx from exiting).
  let connecting: Promise<SupervisorClient> | null = null;
  const call = async <T>(fn: (c: SupervisorClient) => Promise<T>): Promise<T> => {
    for (;;) {
      if (finished) throw new Finished();
      const pending = (connecting ??= conn.get());
      const client = await pending;
      try {
        return await fn(client);
      } catch (err) {
        if (err instanceof SupervisorError || finished) throw err;
        if (connecting === pending) {
          connecting = null;
          conn.drop();
        }
      }
    }
  };
  const stop = () => {
    finished = true;
    conn.drop();
  };
  opts.signal?.addEventListener('abort', stop, { once: true });
  const feeds = opts.streams.map((s) => new IndexFeed(s, opts.from ?? 0, opts, call));
  const bytes = new Map(opts.streams.map((s) => [s, new ByteSource(s, opts)]));
  try {
    for (;;) {
      // Pages first: then a feed not ended with an empty queue has told everything stored
      // (without follow, every feed is ended or holds items).
      while (feeds.some((f) => f.wantsPage)) await Promise.all(feeds.filter((f) => f.wantsPage).map((f) => f.refresh()));
      const heads = feeds.filter((f) => f.queue.length > 0);
      if (heads.length === 0) {
        if (feeds.every((f) => f.ended)) break;
        await sink.idle();
        await Promise.race(feeds.filter((f) => !f.ended).map((f) => f.poll()));
        continue;
      }
      const feed = heads.reduce((a, b) => (before(b, a) ? b : a));
      const item = feed.queue[0]!;
      // Without follow, a stream cut live (its snapshot given whole) may have reads after its
      // through_us not known here: the output stops before any later read of the others, so
      // it is a prefix of the merge a later sbx logs gives (every item after this is later).
      if (feeds.some((f) => f !== feed && f.cut && f.queue.length === 0 && (f.throughUs === null || f.throughUs < item.orderUs))) break;
      const blockers = feeds.filter((f) => f !== feed && f.queue.length === 0 && !f.ended && (f.throughUs === null || f.throughUs < item.orderUs));
      if (blockers.length > 0) {
        await Promise.all(blockers.map((f) => f.refresh()));
        if (blockers.some((f) => f.queue.length === 0 && !f.ended && (f.throughUs === null || f.throughUs < item.orderUs))) {
          await sink.idle();
          await Promise.race(blockers.map((f) => f.poll()));
        }
        continue;
      }
      feed.queue.shift();
      const data = await bytes.get(feed.stream)!.take(item.cursor, item.length);
      await sink.write({ stream: feed.stream, cursor: item.cursor, atUs: item.atUs, indexed: item.indexed, data });
    }
    await sink.end();
  } catch (err) {
    if (!(err instanceof Finished && opts.signal?.aborted)) throw err;
  } finally {
    opts.signal?.removeEventListener('abort', stop);
    finished = true;
    conn.drop();
    await Promise.all([...bytes.values()].map((b) => b.close()));
  }
}

/** Whether feed a's head goes before feed b's: arrival, then stdout before stderr, then cursor. */
function before(a: IndexFeed, b: IndexFeed): boolean {
  const x = a.queue[0]!;
  const y = b.queue[0]!;
  if (x.orderUs !== y.orderUs) return x.orderUs < y.orderUs;
  if (a.stream !== b.stream) return STREAM_RANK[a.stream] < STREAM_RANK[b.stream];
  return x.cursor < y.cursor;
}
