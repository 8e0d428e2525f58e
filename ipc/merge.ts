// The arrival-order merge of a session's streams (issue 21; moved from cli/logs.ts in issue
// 31 so the clients need nothing of cli/): read_index of each stream, a read handed on once
// every other stream is known (through_us) to hold no earlier one, ties stdout first, then by
// cursor; selections by time (--since/--until), live or not (follow). Reads the index and the
// bytes (subscribe, through readOutput); owns the order, not the output formats.
import { readOutput, ReconnectingClient, type EndpointOptions, type SupervisorClient } from './client.js';
import { SupervisorError } from './errors.js';
import type { IndexRecordWire, ReadIndexResult, SessionSelector, StreamName } from './protocol.js';

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

/** The endpoint fields of the options (where the supervisor is). */
function endpoint(o: MergeOptions): EndpointOptions {
  return { socketPath: o.socketPath, url: o.url, token: o.token, tokenFile: o.tokenFile, caFile: o.caFile, command: o.command, commandStderr: o.commandStderr };
}

/** Merge order of streams at the same arrival microsecond. */
const STREAM_RANK: Record<StreamName, number> = { stdout: 0, stderr: 1, pty: 2 };

export interface MergeOptions extends EndpointOptions {
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
  /** Ends the merge early (a client's reader that stopped iterating): the connection is dropped and mergeStreams returns. */
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

  constructor(
    readonly stream: StreamName,
    from: number,
    private readonly opts: MergeOptions,
    private readonly call: <T>(fn: (c: SupervisorClient) => Promise<T>) => Promise<T>,
  ) {
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
      // reads of it after through_us are not known, so the merge stops before them (mergeStreams).
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

  constructor(
    private readonly stream: StreamName,
    private readonly opts: MergeOptions,
  ) {}

  /** Bytes [cursor, cursor + length); cursor must follow the last taken. */
  async take(cursor: number, length: number): Promise<Buffer> {
    if (!this.iter) {
      this.pos = cursor;
      this.iter = readOutput({
        ...endpoint(this.opts),
        clientName: 'sbx',
        selector: this.opts.selector,
        stream: this.stream,
        from: cursor,
        follow: true,
        onReconnecting: this.opts.onReconnecting,
      });
    }
    if (cursor !== this.pos) throw new Error(`merge: ${this.stream} piece at ${cursor}, expected ${this.pos}`);
    while (this.buf.length < length) {
      const next = await this.iter.next();
      if (next.done) throw new Error(`merge: ${this.stream} ended at ${this.pos + this.buf.length}, before ${cursor + length}`);
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
export async function mergeStreams(opts: MergeOptions, sink: PieceSink): Promise<void> {
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
