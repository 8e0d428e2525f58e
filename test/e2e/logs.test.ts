// sbx logs over the per-read index (issue 21), against a real daemon through the sbx bin:
// stdout and stderr merged in arrival order byte for byte, --timestamps equal to the index's
// arrivals, --json back to the exact bytes, --tail and --since/--until selections, --follow
// to both streams' end, bytes past a cut index, pty sessions, read_index's errors, and usage
// errors. The producer writes stdout and stderr alternately, each write only after the test
// saw the previous one stored and indexed (it waits on a fifo the test writes to), so the
// arrival order is known, not hoped for.
import { closeSync, constants, openSync, readFileSync, truncateSync, writeFileSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { execFileSync, spawn } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { SupervisorClient } from '../../ipc/client.js';
import { isSupervisorError } from '../../ipc/errors.js';
import type { IndexRecordWire, StreamName } from '../../ipc/protocol.js';
import { SBX_BIN, TestDaemon, until } from '../helpers/daemon.js';
import { formatArrivalUs } from '../../cli/logs.js';

let daemon: TestDaemon;
let client: SupervisorClient;
const SEED = Number(process.env.SBX_TEST_SEED ?? Date.now() % 2 ** 31);
console.log(`logs.test: random seed ${SEED} (SBX_TEST_SEED=${SEED} repeats it)`);

beforeAll(async () => {
  daemon = await new TestDaemon().start();
  client = await daemon.client();
});
afterAll(async () => {
  const exit = await daemon.stop();
  expect(exit).toEqual({ code: 0, signal: null });
});

/** mulberry32: the seeded bytes of the binary step. */
function seededBytes(seed: number, n: number): Buffer {
  let a = seed >>> 0;
  const out = Buffer.alloc(n);
  for (let i = 0; i < n; i++) {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    const b = ((t ^ (t >>> 14)) >>> 0) & 0xff;
    out[i] = b === 0x0a ? 0x0b : b; // no newline: the expected prefixes stay simple
  }
  return out;
}

/** printf(1) format writing exactly these bytes (every byte octal: no % or \ left to interpret). */
const printfFormat = (bytes: Buffer) => [...bytes].map((b) => `\\${b.toString(8).padStart(3, '0')}`).join('');

interface Step {
  stream: 'stdout' | 'stderr';
  bytes: Buffer;
}

/** The interleaving: whole lines, a partial stdout line cut by stderr, binary bytes (NUL, 0xff, seeded). */
const STEPS: Step[] = [
  { stream: 'stdout', bytes: Buffer.from('out one\n') },
  { stream: 'stderr', bytes: Buffer.from('err one\n') },
  { stream: 'stdout', bytes: Buffer.from('out two, partial') },
  { stream: 'stderr', bytes: Buffer.from('err two\n') },
  { stream: 'stdout', bytes: Buffer.from(' rest\nout three\n') },
  { stream: 'stderr', bytes: Buffer.concat([Buffer.from([0, 0xff, 0x0a]), seededBytes(SEED, 40), Buffer.from('\n')]) },
  { stream: 'stdout', bytes: Buffer.from('out four\n') },
];

/** A producer session: reads "o|e FORMAT" lines from a fifo and printf's FORMAT to stdout or stderr; "q" ends it. */
async function startProducer(name: string): Promise<{ sessionId: string; fifoFd: number }> {
  const fifo = join(daemon.dir, `${name}.fifo`);
  execFileSync('mkfifo', [fifo]);
  const fifoFd = openSync(fifo, constants.O_RDWR); // never blocks; the producer's read end opens at once
  const script = `exec 3<"$0"; while read -r kind fmt <&3; do case $kind in o) printf "$fmt";; e) printf "$fmt" >&2;; q) exit 0;; esac; done`;
  const r = await daemon.sbx(['run', '--detach', '--', 'sh', '-c', script, fifo]);
  expect(r.status).toBe(0);
  return { sessionId: r.stdout.toString().trim(), fifoFd };
}

/** The stream's whole index now (read_index pages). */
async function indexOf(sessionId: string, stream: StreamName): Promise<IndexRecordWire[]> {
  const out: IndexRecordWire[] = [];
  for (let from = 0; ;) {
    const r = await client.readIndex({ session_id: sessionId, stream, from });
    out.push(...r.records);
    if (!r.more) return out;
    from = r.next;
  }
}

/** Runs every step, each after the previous one is stored and indexed (read_index covers its cursor); cursors: each stream's before the first. */
async function play(sessionId: string, fifoFd: number, steps: Step[], cursors = { stdout: 0, stderr: 0 }): Promise<void> {
  for (const step of steps) {
    writeSync(fifoFd, `${step.stream === 'stdout' ? 'o' : 'e'} ${printfFormat(step.bytes)}\n`);
    cursors[step.stream] += step.bytes.length;
    const want = cursors[step.stream];
    await until(async () => {
      const r = await client.readIndex({ session_id: sessionId, stream: step.stream, from: 0, limit: 65536 });
      // Stored bytes are indexed at once (records still in memory are served too).
      expect(r.next).toBe(r.cursor);
      return r.next === want;
    }, `${step.stream} stored to ${want}`);
  }
}

const merged = (steps: Step[]) => Buffer.concat(steps.map((s) => s.bytes));

/** Every record of both streams in merged order (arrival, stdout first, cursor). */
async function mergedRecords(sessionId: string) {
  const all = [
    ...(await indexOf(sessionId, 'stdout')).map((r) => ({ ...r, stream: 'stdout' as const })),
    ...(await indexOf(sessionId, 'stderr')).map((r) => ({ ...r, stream: 'stderr' as const })),
  ];
  return all.sort((a, b) => a.at_us - b.at_us || (a.stream === b.stream ? a.cursor - b.cursor : a.stream === 'stdout' ? -1 : 1));
}

describe('sbx logs over the index', () => {
  let sessionId: string;
  beforeAll(async () => {
    const p = await startProducer('ended');
    sessionId = p.sessionId;
    await play(sessionId, p.fifoFd, STEPS);
    writeSync(p.fifoFd, 'q\n');
    closeSync(p.fifoFd);
    expect((await daemon.sbx(['wait', sessionId])).status).toBe(0);
  });

  it('--stream all: the reads of both streams in arrival order, byte for byte', async () => {
    const r = await daemon.sbx(['logs', sessionId, '--stream', 'all']);
    expect(r.stderr.toString()).toBe('');
    expect(r.status).toBe(0);
    expect(r.stdout.equals(merged(STEPS))).toBe(true);
    // One read per step, in the order played.
    const records = await mergedRecords(sessionId);
    expect(records.map((x) => [x.stream, x.length])).toEqual(STEPS.map((s) => [s.stream, s.bytes.length]));
    // A single stream is as before, and the same with the index's flags.
    const stdout = merged(STEPS.filter((s) => s.stream === 'stdout'));
    expect((await daemon.sbx(['logs', sessionId, '--stream', 'stdout'])).stdout.equals(stdout)).toBe(true);
    expect((await daemon.sbx(['logs', sessionId, '--stream', 'stdout', '--since', '1h'])).stdout.equals(stdout)).toBe(true);
  });

  it('--timestamps: each line after the arrival of the read carrying its first byte (RFC 3339, µs, UTC)', async () => {
    const r = await daemon.sbx(['logs', sessionId, '--stream', 'all', '--timestamps']);
    expect(r.status).toBe(0);
    const records = await mergedRecords(sessionId);
    const ts = records.map((x) => formatArrivalUs(x.at_us));
    // Expected from the steps: a prefix at each line start of its stream; the partial stdout
    // line cut by stderr stays as it came, its rest after a prefix of its own read.
    const expected = Buffer.concat([
      Buffer.from(`${ts[0]} out one\n${ts[1]} err one\n${ts[2]} out two, partial${ts[3]} err two\n${ts[4]}  rest\n${ts[4]} out three\n`),
      Buffer.from(`${ts[5]} `),
      STEPS[5]!.bytes.subarray(0, 3),
      Buffer.from(`${ts[5]} `),
      STEPS[5]!.bytes.subarray(3),
      Buffer.from(`${ts[6]} out four\n`),
    ]);
    expect(r.stdout.toString('latin1')).toBe(expected.toString('latin1'));
    for (const t of ts) expect(t).toMatch(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$/);
    const us = records.map((x) => x.at_us);
    for (let i = 1; i < us.length; i++) expect(us[i]!).toBeGreaterThan(us[i - 1]!);
    // Exactly the index's microsecond: parse back.
    expect(Date.parse(ts[0]!) * 1000 + Number(ts[0]!.slice(23, 26))).toBe(us[0]);
  });

  it('--json: {stream, cursor, at, data} per read, decoding back to the exact bytes', async () => {
    const r = await daemon.sbx(['logs', sessionId, '--stream', 'all', '--json']);
    expect(r.status).toBe(0);
    const lines = r.stdout
      .toString()
      .trimEnd()
      .split('\n')
      .map((l) => JSON.parse(l) as { stream: string; cursor: number; at: string; data: string });
    const records = await mergedRecords(sessionId);
    expect(lines).toEqual(records.map((x) => ({ stream: x.stream, cursor: x.cursor, at: formatArrivalUs(x.at_us), data: expect.any(String) })));
    expect(Buffer.concat(lines.map((l) => Buffer.from(l.data, 'base64'))).equals(merged(STEPS))).toBe(true);
  });

  it('--tail N: the last N lines of the merged output (an unterminated line counts)', async () => {
    const all = merged(STEPS);
    const lastLines = (n: number) => {
      let pos = all.length - 1; // skip the final \n
      for (let k = 0; k < n; k++) pos = all.lastIndexOf(0x0a, pos - 1);
      return all.subarray(pos + 1);
    };
    for (const n of [1, 2, 3, 5]) {
      const r = await daemon.sbx(['logs', sessionId, '--stream', 'all', '--tail', String(n)]);
      expect(r.status).toBe(0);
      expect(r.stdout.toString('latin1')).toBe(lastLines(n).toString('latin1'));
    }
    expect((await daemon.sbx(['logs', sessionId, '--stream', 'all', '--tail', '0'])).stdout.length).toBe(0);
    expect((await daemon.sbx(['logs', sessionId, '--stream', 'all', '--tail', '100'])).stdout.equals(all)).toBe(true);
    expect((await daemon.sbx(['logs', sessionId, '--stream', 'all', '--tail', 'all'])).stdout.equals(all)).toBe(true);
    // One stream: stdout's last line; with --json the record is cut at the line's start.
    expect((await daemon.sbx(['logs', sessionId, '--stream', 'stdout', '--tail', '2'])).stdout.toString()).toBe('out three\nout four\n');
    const tailJson = await daemon.sbx(['logs', sessionId, '--stream', 'stdout', '--tail', '2', '--json']);
    const recs = tailJson.stdout
      .toString()
      .trimEnd()
      .split('\n')
      .map((l) => JSON.parse(l) as { cursor: number; data: string });
    expect(recs.map((x) => [x.cursor, Buffer.from(x.data, 'base64').toString()])).toEqual([
      [30, 'out three\n'],
      [40, 'out four\n'],
    ]);
  });

  it('--since/--until: the reads arrived in [since, until], by RFC 3339 µs and Unix time', async () => {
    const records = await mergedRecords(sessionId);
    const at = (i: number) => formatArrivalUs(records[i]!.at_us);
    const sel = (args: string[]) => daemon.sbx(['logs', sessionId, '--stream', 'all', ...args]);
    expect((await sel(['--since', at(2)])).stdout.equals(merged(STEPS.slice(2)))).toBe(true);
    expect((await sel(['--until', at(3)])).stdout.equals(merged(STEPS.slice(0, 4)))).toBe(true);
    expect((await sel(['--since', at(1), '--until', at(4)])).stdout.equals(merged(STEPS.slice(1, 5)))).toBe(true);
    // One microsecond past a read leaves it out; an offset is the same instant.
    const justAfter = formatArrivalUs(records[2]!.at_us + 1);
    expect((await sel(['--since', justAfter])).stdout.equals(merged(STEPS.slice(3)))).toBe(true);
    const unix = `${Math.floor(records[5]!.at_us / 1e6)}.${String(records[5]!.at_us % 1e6).padStart(6, '0')}`;
    expect((await sel(['--since', unix])).stdout.equals(merged(STEPS.slice(5)))).toBe(true);
    // Durations ago: everything was within the hour; nothing in the future.
    expect((await sel(['--since', '1h'])).stdout.equals(merged(STEPS))).toBe(true);
    expect((await sel(['--until', '1h'])).stdout.length).toBe(0);
    // With --timestamps the first line is stamped by its read.
    expect((await sel(['--since', at(6), '--timestamps'])).stdout.toString()).toBe(`${at(6)} out four\n`);
  });

  it('bytes past a cut index are output, never dropped, at the last indexed arrival (indexed: false in --json)', async () => {
    // A crash can leave index.bin behind its chunks (its records are written within 100 ms):
    // cut the stdout index's last record off an ended session's files.
    const indexPath = join(daemon.stateDir, 'sessions', sessionId, 'stdout', 'index.bin');
    const before = readFileSync(indexPath);
    truncateSync(indexPath, before.length - 24);
    try {
      const r = await daemon.sbx(['logs', sessionId, '--stream', 'all']);
      expect(r.stdout.equals(merged(STEPS))).toBe(true);
      const j = await daemon.sbx(['logs', sessionId, '--stream', 'all', '--json']);
      const lines = j.stdout
        .toString()
        .trimEnd()
        .split('\n')
        .map((l) => JSON.parse(l) as { stream: string; cursor: number; at: string; data: string; indexed?: boolean });
      const last = lines[lines.length - 1]!;
      const stdoutRecords = await indexOf(sessionId, 'stdout');
      expect(last).toEqual({
        stream: 'stdout',
        cursor: 40,
        at: formatArrivalUs(stdoutRecords[stdoutRecords.length - 1]!.at_us),
        data: Buffer.from('out four\n').toString('base64'),
        indexed: false,
      });
      expect(Buffer.concat(lines.map((l) => Buffer.from(l.data, 'base64'))).equals(merged(STEPS))).toBe(true);
    } finally {
      const fd = openSync(indexPath, constants.O_WRONLY | constants.O_APPEND);
      writeSync(fd, before.subarray(before.length - 24));
      closeSync(fd);
    }
  });

  it('read_index: records tile the stream; a cursor past the end is CURSOR_OUT_OF_RANGE; bad fields are INVALID_ARGUMENT', async () => {
    const r = await client.readIndex({ session_id: sessionId, stream: 'stdout', from: 20, limit: 1 });
    expect(r).toMatchObject({ stream: 'stdout', from: 20, next: 24, more: true, cursor: 49, final: false, through_us: r.records[0]!.at_us - 1 });
    expect(r.records.map((x) => [x.cursor, x.length])).toEqual([[8, 16]]);
    const end = await client.readIndex({ session_id: sessionId, stream: 'stdout', from: 24 });
    expect(end).toMatchObject({ next: 49, more: false, cursor: 49, final: true, through_us: null });
    expect(end.records.map((x) => [x.cursor, x.length])).toEqual([
      [24, 16],
      [40, 9],
    ]);
    const atEnd = await client.readIndex({ session_id: sessionId, stream: 'stdout', from: 49, follow: true });
    expect(atEnd).toMatchObject({ records: [], next: 49, final: true });
    const codeOf = (p: Promise<unknown>) =>
      p.then(
        () => 'ok',
        (e: unknown) => (isSupervisorError(e) ? `${e.code} ${JSON.stringify(e.details ?? {})}` : String(e)),
      );
    expect(await codeOf(client.readIndex({ session_id: sessionId, stream: 'stdout', from: 50 }))).toBe('CURSOR_OUT_OF_RANGE {"cursor":49}');
    expect(await codeOf(client.readIndex({ session_id: sessionId, stream: 'stdout', limit: 0 }))).toMatch(/^INVALID_ARGUMENT \{"field":"limit"\}/);
    expect(await codeOf(client.readIndex({ session_id: sessionId, stream: 'pty' }))).toMatch(/^INVALID_ARGUMENT/);
    expect(await codeOf(client.readIndex({ session_id: 's-nope', stream: 'stdout' }))).toMatch(/^SESSION_NOT_FOUND/);
  });
});

describe('sbx logs --follow', () => {
  it('merges a running session as it writes and ends when both streams are final', async () => {
    const p = await startProducer('follow');
    // Started before the first byte: it waits for both streams (a long poll, not a timer).
    const child = spawn(SBX_BIN, ['logs', p.sessionId, '--stream', 'all', '--follow', '--json'], {
      env: { ...process.env, SBX_SOCKET: daemon.socketPath },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (d: Buffer) => out.push(d));
    child.stderr.on('data', (d: Buffer) => err.push(d));
    const closed = new Promise<number | null>((r) => child.on('close', (code) => r(code)));
    try {
      const cursors = { stdout: 0, stderr: 0 };
      await play(p.sessionId, p.fifoFd, STEPS.slice(0, 3), cursors);
      // The follower has shown what is stored (stdout's partial line included) while the session runs.
      await until(() => Buffer.concat(out).toString().trimEnd().split('\n').length === 3, 'three records followed');
      await play(p.sessionId, p.fifoFd, STEPS.slice(3), cursors);
      writeSync(p.fifoFd, 'q\n');
    } finally {
      closeSync(p.fifoFd);
    }
    expect(await closed).toBe(0);
    expect(Buffer.concat(err).toString()).toBe('');
    const lines = Buffer.concat(out)
      .toString()
      .trimEnd()
      .split('\n')
      .map((l) => JSON.parse(l) as { stream: string; data: string });
    expect(lines.map((l) => l.stream)).toEqual(STEPS.map((s) => s.stream));
    expect(Buffer.concat(lines.map((l) => Buffer.from(l.data, 'base64'))).equals(merged(STEPS))).toBe(true);
    // Raw follow of the ended session: the same bytes, at once.
    expect((await daemon.sbx(['logs', p.sessionId, '--stream', 'all', '--follow'])).stdout.equals(merged(STEPS))).toBe(true);
  });
});

describe('sbx logs over a damaged index.bin', () => {
  type Rec = { cursor: number; length: number; at_us: number };
  const decode = (b: Buffer): Rec[] =>
    Array.from({ length: b.length / 24 }, (_, i) => ({
      length: b.readUInt32LE(i * 24 + 4),
      cursor: Number(b.readBigUInt64LE(i * 24 + 8)),
      at_us: Number(b.readBigUInt64LE(i * 24 + 16)),
    }));
  const encode = (recs: Rec[]): Buffer => {
    const b = Buffer.alloc(recs.length * 24);
    recs.forEach((r, i) => {
      b.writeUInt32LE(r.length, i * 24 + 4);
      b.writeBigUInt64LE(BigInt(r.cursor), i * 24 + 8);
      b.writeBigUInt64LE(BigInt(r.at_us), i * 24 + 16);
    });
    return b;
  };
  const damages: Record<string, (r: Rec[]) => Rec[]> = {
    beyond: (r) => [...r, { cursor: r.at(-1)!.cursor + r.at(-1)!.length, length: 100, at_us: r.at(-1)!.at_us + 1 }],
    backwards: (r) => [...r, { ...r[0]!, at_us: r.at(-1)!.at_us + 1 }],
    overlap: (r) => [{ ...r[0]!, length: r[0]!.length + 2 }, ...r.slice(1)],
    gap: (r) => [r[0]!, { ...r[1]!, cursor: r[1]!.cursor + 1, length: r[1]!.length - 1 }, ...r.slice(2)],
    zero: (r) => [r[0]!, { ...r[1]!, length: 0 }, ...r.slice(1)],
    huge: (r) => [...r.slice(0, -1), { ...r.at(-1)!, length: 2 ** 32 - 1 }],
  };
  for (const [kind, damage] of Object.entries(damages)) {
    it(`${kind}: every stored byte once, exit 0; the damage logged once`, async () => {
      const r = await daemon.sbx([
        'run',
        '--detach',
        '--',
        'sh',
        '-c',
        'printf "o1\\n"; sleep 0.2; printf "e1\\n" >&2; sleep 0.2; printf "o2\\n"; sleep 0.2; printf "o3\\n"',
      ]);
      expect(r.status).toBe(0);
      const id = r.stdout.toString().trim();
      expect((await daemon.sbx(['wait', id])).status).toBe(0);
      const indexPath = join(daemon.stateDir, 'sessions', id, 'stdout', 'index.bin');
      const recs = decode(readFileSync(indexPath));
      expect(recs.map((x) => x.length)).toEqual([3, 3, 3]);
      writeFileSync(indexPath, encode(damage(recs)));
      const stream = { stdout: 'o1\no2\no3\n', stderr: 'e1\n' };
      const j = await daemon.sbx(['logs', id, '--stream', 'all', '--json']);
      expect(j.stderr.toString()).toBe('');
      expect(j.status).toBe(0);
      const lines = j.stdout
        .toString()
        .trimEnd()
        .split('\n')
        .map((l) => JSON.parse(l) as { stream: 'stdout' | 'stderr'; cursor: number; data: string });
      for (const name of ['stdout', 'stderr'] as const) {
        let cursor = 0;
        for (const l of lines.filter((x) => x.stream === name)) {
          expect(l.cursor, `${name} ${JSON.stringify(lines)}`).toBe(cursor);
          cursor += Buffer.from(l.data, 'base64').length;
        }
        expect(Buffer.concat(lines.filter((x) => x.stream === name).map((l) => Buffer.from(l.data, 'base64'))).toString()).toBe(stream[name]);
      }
      for (const mode of [[], ['--timestamps'], ['--tail', '1']]) {
        const o = await daemon.sbx(['logs', id, '--stream', 'all', ...mode]);
        expect(o.stderr.toString(), mode.join(' ')).toBe('');
        expect(o.status).toBe(0);
        if (mode.length === 0) expect(o.stdout.toString()).toBe(Buffer.concat(lines.map((l) => Buffer.from(l.data, 'base64'))).toString());
      }
      expect(
        daemon
          .log()
          .split('\n')
          .filter((l) => l.includes(id) && l.includes('index.bin is damaged')),
      ).toHaveLength(1);
    });
  }
});

describe('sbx logs without --follow on a live session', () => {
  // 4 KiB chunk files: a read of the pipe (up to 64 KiB) is stored a chunk at a time, so
  // while a stream is written it mostly has a read partly stored (next < cursor).
  let live: TestDaemon;
  beforeAll(async () => {
    live = await new TestDaemon({ config: { drain: { postDeathDrainMs: 2000, chunkBytes: 4096 } } }).start();
  });
  afterAll(async () => {
    expect(await live.stop()).toEqual({ code: 0, signal: null });
  });

  it('a snapshot ends at the last wholly stored read of each stream: nothing "indexed": false, each stream contiguous from 0, a prefix of the final merge', async () => {
    const liveClient = await live.client();
    const stop = join(live.dir, 'live-snapshots.stop');
    const script = 'while [ ! -e "$0" ]; do head -c 16384 /dev/zero | tr "\\0" o & head -c 16384 /dev/zero | tr "\\0" e >&2; wait; sleep 0.02; done';
    const run = await live.sbx(['run', '--detach', '--', 'sh', '-c', script, stop]);
    expect(run.status).toBe(0);
    const id = run.stdout.toString().trim();
    /** A --json line without its data: stream, cursor, at, the data's length, and whether it was all the stream's byte. */
    const parse = (b: Buffer) =>
      b
        .toString()
        .trimEnd()
        .split('\n')
        .filter(Boolean)
        .map((l) => {
          const x = JSON.parse(l) as { stream: 'stdout' | 'stderr'; cursor: number; at: string; data: string; indexed?: boolean };
          const data = Buffer.from(x.data, 'base64');
          return {
            stream: x.stream,
            cursor: x.cursor,
            at: x.at,
            length: data.length,
            indexed: x.indexed,
            right: data.every((c) => c === (x.stream === 'stdout' ? 0x6f : 0x65)),
          };
        });
    const snapshots: ReturnType<typeof parse>[] = [];
    try {
      await until(async () => (await liveClient.readIndex({ session_id: id, stream: 'stderr' })).cursor > 0, 'stderr written');
      for (let i = 0; i < 8; i++) {
        const r = await live.sbx(['logs', id, '--stream', 'all', '--json']);
        expect(r.stderr.toString()).toBe('');
        expect(r.status).toBe(0);
        snapshots.push(parse(r.stdout));
      }
    } finally {
      writeFileSync(stop, '');
    }
    expect((await live.sbx(['wait', id])).status).toBe(0);
    const key = (x: { stream: string; cursor: number; at: string; length: number }) => `${x.stream} ${x.cursor} ${x.at} ${x.length}`;
    const finalKeys = parse((await live.sbx(['logs', id, '--stream', 'all', '--json'])).stdout).map(key);
    for (const [i, snap] of snapshots.entries()) {
      expect(
        snap.filter((x) => x.indexed === false),
        `snapshot ${i}`,
      ).toEqual([]);
      expect(snap.every((x) => x.right)).toBe(true);
      for (const stream of ['stdout', 'stderr'] as const) {
        let cursor = 0;
        for (const x of snap.filter((y) => y.stream === stream)) {
          expect(x.cursor, `snapshot ${i} ${stream}`).toBe(cursor);
          cursor += x.length;
        }
      }
      // In the ended session's merged order: a prefix of it, read for read.
      expect(snap.map(key), `snapshot ${i}`).toEqual(finalKeys.slice(0, snap.length));
    }
  }, 240_000);
});

describe('sbx logs: pty and usage errors', () => {
  it('--stream all of a pty session is its one stream, pty', async () => {
    const r = await daemon.sbx(['run', '--pty', '--', 'printf', 'pty bytes']);
    expect(r.status).toBe(0);
    const { sessions } = await client.ps(true);
    const s = sessions.find((x) => x.argv.join(' ') === 'printf pty bytes')!;
    const all = await daemon.sbx(['logs', s.session_id, '--stream', 'all']);
    expect(all.stdout.toString()).toBe('pty bytes');
    const json = await daemon.sbx(['logs', s.session_id, '--stream', 'all', '--json']);
    expect(JSON.parse(json.stdout.toString())).toMatchObject({ stream: 'pty', cursor: 0, data: Buffer.from('pty bytes').toString('base64') });
  });

  it('bad values: a clear INVALID_ARGUMENT, exit 125, nothing on stdout', async () => {
    const p = await daemon.sbx(['run', '--detach', '--', 'true']);
    const id = p.stdout.toString().trim();
    const cases: [string[], RegExp][] = [
      [['--tail', '-1'], /--tail takes a number of lines/],
      [['--tail', 'x'], /--tail takes a number of lines/],
      [['--since', 'garbage'], /--since: not a time: "garbage"/],
      [['--until', '2026-13-01T00:00:00Z'], /--until: not a time/],
      [['--stream', 'all', '--from', '3'], /--from is a cursor of one stream/],
    ];
    for (const [args, message] of cases) {
      const r = await daemon.sbx(['logs', id, ...args]);
      expect(r.status, args.join(' ')).toBe(125);
      expect(r.stdout.length).toBe(0);
      expect(r.stderr.toString()).toMatch(/^sbx: INVALID_ARGUMENT: /);
      expect(r.stderr.toString()).toMatch(message);
    }
    const bad = await daemon.sbx(['logs', id, '--stream', 'both']);
    expect(bad.status).toBe(125);
    expect(bad.stderr.toString()).toMatch(/--stream.*both.*Allowed choices are stdout, stderr, pty, all/s);
  });
});
