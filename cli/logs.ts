// sbx logs's output formats over the arrival-order merge (ipc/merge.ts): lines timestamped by
// the arrival of the read carrying their first byte (--timestamps), records as JSON lines
// (--json), each stream to its own fd (SplitSink, the default without --stream), the last N
// lines (--tail); and the times --since/--until take. Formats: RFC 3339 with microseconds,
// UTC (docker logs -t). Imports ipc/ only.
import { isDuration, parseDurationUs } from '../ipc/duration.js';
import type { Piece, PieceSink } from '../ipc/merge.js';
import type { StreamName } from '../ipc/protocol.js';

export type { Piece, PieceSink } from '../ipc/merge.js';

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
    if (
      check.getUTCFullYear() === Number(y) &&
      check.getUTCDate() === Number(d) &&
      check.getUTCMonth() === Number(mo) - 1 &&
      Number(h) < 24 &&
      Number(mi) < 60 &&
      Number(s) < 60 &&
      offsetOk
    ) {
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
    if (
      check.getUTCFullYear() === Number(y) &&
      check.getUTCMonth() === Number(mo) - 1 &&
      check.getUTCDate() === Number(d) &&
      Number(h) < 24 &&
      Number(mi) < 60 &&
      Number(s) < 60
    ) {
      // setFullYear, not the Date constructor: that reads years 0-99 as 1900-1999. A wall time
      // a DST change skips is moved forward by the change, one it repeats is its first time.
      const at = new Date(0);
      at.setFullYear(Number(y), Number(mo) - 1, Number(d));
      at.setHours(Number(h), Number(mi), Number(s), 0);
      return at.getTime() * 1000 + Number(frac.padEnd(6, '0').slice(0, 6));
    }
  }
  throw new RangeError(
    `${flag}: not a time: ${JSON.stringify(text)} (use RFC 3339 like 2026-12-01T10:00:00Z, a local time like 2026-12-01T10:00:00, 2026-12-01 10:00 or 2026-12-01, a Unix time in seconds, or a duration ago like 10m, 1h30m)`,
  );
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

  constructor(
    private readonly lines: number,
    private readonly out: PieceSink,
  ) {}

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
    const record = {
      stream: piece.stream,
      cursor: piece.cursor,
      at: formatArrivalUs(piece.atUs),
      data: piece.data.toString('base64'),
      ...(piece.indexed ? {} : { indexed: false }),
    };
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
  constructor(
    private readonly byStream: Partial<Record<StreamName, PieceSink>>,
    private readonly other: PieceSink,
  ) {}
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
