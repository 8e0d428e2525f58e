// sbx logs' pure parts (cli/logs.ts): the RFC 3339 µs format, --since/--until parsing,
// the --tail selection and the --timestamps prefixes, without a daemon.
import { afterEach, describe, expect, it } from 'vitest';
import { formatArrivalUs, type Piece, type PieceSink, parseTimeUs, TailSink, TimestampSink } from '../../../cli/logs.js';

const NOW_US = Date.UTC(2026, 11, 1, 10, 0, 0) * 1000 + 123_456;

class Collect implements PieceSink {
  pieces: Piece[] = [];
  async write(p: Piece) {
    this.pieces.push(p);
  }
  async idle() {}
  async end() {}
}

const piece = (stream: 'stdout' | 'stderr', cursor: number, atUs: number, text: string): Piece => ({
  stream,
  cursor,
  atUs,
  indexed: true,
  data: Buffer.from(text),
});

describe('times', () => {
  it('formats µs as docker logs -t does and parses RFC 3339, Unix seconds and durations ago', () => {
    expect(formatArrivalUs(NOW_US)).toBe('2026-12-01T10:00:00.123456Z');
    expect(formatArrivalUs(NOW_US - 123_456 + 7)).toBe('2026-12-01T10:00:00.000007Z');
    expect(parseTimeUs('2026-12-01T10:00:00.123456Z', 0, '--since')).toBe(NOW_US);
    expect(parseTimeUs('2026-12-01T11:00:00.123456+01:00', 0, '--since')).toBe(NOW_US);
    expect(parseTimeUs('2026-12-01T10:00:00.123456-23:59', 0, '--since')).toBe(NOW_US + (23 * 60 + 59) * 60e6);
    // Years before 1000 as written (Date.UTC would read 0099 as 1999).
    const y99 = new Date(0);
    y99.setUTCFullYear(99, 2, 1);
    expect(parseTimeUs('0099-03-01T00:00:00Z', 0, '--since')).toBe(y99.getTime() * 1000);
    expect(parseTimeUs('0000-01-01T00:00:00Z', 0, '--since')).toBe(-62167219200e6);
    // More than 6 fraction digits: refused, not rounded or cut (times are to the µs).
    for (const nano of ['2026-12-01T10:00:00.1234567Z', '2026-12-01T11:00:00.123456789+01:00', '1764583200.1234567']) {
      expect(() => parseTimeUs(nano, NOW_US, '--since'), nano).toThrow(/^--since: .* more than 6 fraction digits/);
    }
    expect(parseTimeUs('2026-12-01T10:00:00Z', 0, '--since')).toBe(NOW_US - 123_456);
    expect(parseTimeUs(`${Math.floor(NOW_US / 1e6)}.123456`, 0, '--since')).toBe(NOW_US);
    expect(parseTimeUs('10m', NOW_US, '--since')).toBe(NOW_US - 600e6);
    expect(parseTimeUs('1h30m', NOW_US, '--since')).toBe(NOW_US - 5400e6);
    expect(parseTimeUs('500ms', NOW_US, '--since')).toBe(NOW_US - 500e3);
    // (a bare number is a Unix time, as docker takes it: `10` is 1970-01-01T00:00:10Z)
    expect(parseTimeUs('10', NOW_US, '--until')).toBe(10e6);
    for (const bad of [
      'garbage',
      '',
      '-1',
      '10x',
      '2026-02-30T00:00:00Z',
      '2026-12-01T24:00:00Z',
      '2026-12-01T24:00',
      '2026-02-29',
      '2026-12-01T10',
      '2026-12-1',
      '2026-12-01T10:00Z',
      '2026-12-01T10:00:00+25:99',
      '2026-12-01T10:00:00+24:00',
      '2026-12-01T10:00:00-01:60',
      '0099-02-29T00:00:00Z',
    ]) {
      expect(() => parseTimeUs(bad, NOW_US, '--until'), bad).toThrow(/^--until: not a time/);
    }
  });
});

describe('--since in local time (no zone), as docker', () => {
  const saved = process.env.TZ;
  afterEach(() => {
    if (saved === undefined) delete process.env.TZ;
    else process.env.TZ = saved;
  });
  it('reads a date, a date and time, or one with seconds and a fraction in TZ', () => {
    process.env.TZ = 'Asia/Kolkata'; // +05:30, no DST
    const at = (iso: string) => Date.parse(iso) * 1000;
    expect(parseTimeUs('2026-12-03T10:00:00', 0, '--since')).toBe(at('2026-12-03T04:30:00Z'));
    expect(parseTimeUs('2026-12-03 10:00', 0, '--since')).toBe(at('2026-12-03T04:30:00Z'));
    expect(parseTimeUs('2026-12-03t10:00:05.25', 0, '--since')).toBe(at('2026-12-03T04:30:05.250Z'));
    expect(parseTimeUs('2026-12-03T10:00:00.000001', 0, '--since')).toBe(at('2026-12-03T04:30:00Z') + 1);
    expect(parseTimeUs('2026-12-03', 0, '--since')).toBe(at('2026-12-02T18:30:00Z'));
    process.env.TZ = 'America/New_York'; // -05:00 in December, -04:00 in July
    expect(parseTimeUs('2026-12-03T10:00:00', 0, '--since')).toBe(at('2026-12-03T15:00:00Z'));
    expect(parseTimeUs('2026-07-03 10:00', 0, '--until')).toBe(at('2026-07-03T14:00:00Z'));
    process.env.TZ = 'UTC';
    expect(parseTimeUs('2026-12-03', 0, '--since')).toBe(at('2026-12-03T00:00:00Z'));
    // A zone still wins over TZ; unix seconds and durations are unchanged.
    process.env.TZ = 'Asia/Kolkata';
    expect(parseTimeUs('2026-12-03T10:00:00Z', 0, '--since')).toBe(at('2026-12-03T10:00:00Z'));
    expect(parseTimeUs('2026-12-03 10:00:00+01:00', 0, '--since')).toBe(at('2026-12-03T09:00:00Z'));
    expect(parseTimeUs('1764583200', 0, '--since')).toBe(1764583200e6);
    expect(parseTimeUs('1m30s', NOW_US, '--since')).toBe(NOW_US - 90e6);
    expect(parseTimeUs('1000h', NOW_US, '--since')).toBe(NOW_US - 3600e9); // an age has no 30-day bound
    expect(() => parseTimeUs('1m30', NOW_US, '--since')).toThrow(/^--since: not a time: "1m30"/);
  });
});

describe('--tail', () => {
  const pieces = [piece('stdout', 0, 1, 'a1\na2\npart'), piece('stderr', 0, 2, 'e1\n'), piece('stdout', 11, 3, 'ial\na3\n'), piece('stderr', 3, 4, 'e2')];
  const all = pieces.map((p) => p.data.toString()).join('');
  const lastLines = (n: number) => {
    const lines = all.split(/(?<=\n)/);
    return lines.slice(Math.max(0, lines.length - n)).join('');
  };
  it('keeps the last N lines of the merged bytes, cutting the first piece at its line start', async () => {
    for (const n of [0, 1, 2, 3, 4, 5, 6, 50]) {
      const out = new Collect();
      const tail = new TailSink(n, out);
      for (const p of pieces) await tail.write(p);
      await tail.end();
      expect(out.pieces.map((p) => p.data.toString()).join(''), `tail ${n}`).toBe(lastLines(n));
      for (const p of out.pieces) {
        const original = pieces.find((q) => q.stream === p.stream && q.cursor <= p.cursor && p.cursor < q.cursor + q.data.length)!;
        expect(original.data.subarray(p.cursor - original.cursor).equals(p.data)).toBe(true);
      }
    }
  });
  it('passes everything through after the first idle()', async () => {
    const out = new Collect();
    const tail = new TailSink(1, out);
    await tail.write(piece('stdout', 0, 1, 'x\ny\n'));
    await tail.idle();
    await tail.write(piece('stdout', 4, 2, 'z\n'));
    expect(out.pieces.map((p) => [p.cursor, p.data.toString()])).toEqual([
      [2, 'y\n'],
      [4, 'z\n'],
    ]);
  });
});

describe('--timestamps', () => {
  it('a prefix per line start; a partial line cut by the other stream stays as it came, its rest prefixed', async () => {
    const chunks: Buffer[] = [];
    const out = { write: (b: Buffer) => (chunks.push(Buffer.from(b)), true) } as unknown as NodeJS.WritableStream;
    const sink = new TimestampSink(out);
    const t = (k: number) => formatArrivalUs(NOW_US + k);
    await sink.write(piece('stdout', 0, NOW_US + 1, 'a\nb'));
    await sink.write(piece('stdout', 3, NOW_US + 2, 'c\n'));
    await sink.write(piece('stdout', 5, NOW_US + 3, 'd'));
    await sink.write(piece('stderr', 0, NOW_US + 4, 'E\n'));
    await sink.write(piece('stdout', 6, NOW_US + 5, 'e\n'));
    expect(Buffer.concat(chunks).toString()).toBe(`${t(1)} a\n${t(1)} bc\n${t(3)} d${t(4)} E\n${t(5)} e\n`);
  });
});
