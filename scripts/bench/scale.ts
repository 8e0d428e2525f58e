// scale, replay and long lines.
// - scale: 1,000 sessions at once, each writing 1 MiB in writes of at most 1 KiB
//   (`seq | dd bs=1024`: position-dependent bytes): bytes lost or extra, every receipt on disk
//   and exact (cursor, digest computed here, complete, exit 0), the supervisor's peak RSS
//   (VmHWM), wall time; then 100 idle sessions: the supervisor's CPU time over 10 s.
// - replay: a finished 1 GiB log of the position-dependent pattern read from cursor 0 over the
//   socket, each event compared with the pattern at its cursor, against the rate the same
//   log was drained at (the log is in the page cache then, as a fresh log is).
// - long lines: one 4 MiB and one 1 GiB line: byte-exact, and the supervisor's peak RSS over
//   the run minus its RSS before (VmHWM reset first, so nothing between samples is missed).
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import type { Receipt } from '../../ipc/protocol.js';
import type { SupervisorClient } from '../../ipc/client.js';
import type { TestDaemon } from '../../test/helpers/daemon.js';
import { connect, cpuMs, fmtMs, fmtRate, nowMs, PATTERN_PRODUCER, patternBytes, peakRss, printTable, type Row, writeJson } from './common.js';

const MiB = 1 << 20;
const mib = (kb: number) => `${(kb / 1024).toFixed(1)} MiB`;

/** The 1 MiB each scale session writes: `seq -f %07g 1 131072`, 8 bytes a line. */
const SEQ_COMMAND = 'seq -f %07g 1 131072 | dd bs=1024 status=none';
function seqSha256(): string {
  const h = createHash('sha256');
  for (let i = 1; i <= 131072; i++) h.update(`${String(i).padStart(7, '0')}\n`);
  return h.digest('hex');
}

export async function scaleBench(d: TestDaemon, sessions: number, idleSessions: number): Promise<Row[]> {
  const client = await connect(d);
  const rows: Row[] = [];
  try {
    const expected = seqSha256();
    const mem = peakRss(d.pid);
    const t0 = nowMs();
    const ids = await Promise.all(
      Array.from({ length: sessions }, async () => (await client.launch({ argv: ['/bin/sh', '-c', SEQ_COMMAND], cwd: '/' })).session_id),
    );
    const receipts = await Promise.all(ids.map((session_id) => client.wait({ session_id })));
    const wallMs = nowMs() - t0;
    const { peakKb, startKb } = mem.stop();
    let lost = 0;
    let extra = 0;
    let inexact = 0;
    let onDisk = 0;
    receipts.forEach((r, i) => {
      const out = r.output.stdout!;
      lost += Math.max(0, MiB - out.final_cursor);
      extra += Math.max(0, out.final_cursor - MiB);
      if (out.sha256 !== expected || !out.complete || r.exit.code !== 0) inexact++;
      const path = join(d.stateDir, 'sessions', ids[i]!, 'receipt.json');
      if (existsSync(path) && (JSON.parse(readFileSync(path, 'utf8')) as Receipt).signature?.value === r.signature?.value) onDisk++;
    });
    for (const id of ids) rmSync(join(d.stateDir, 'sessions', id, 'stdout'), { recursive: true, force: true });
    rows.push(
      {
        metric: `${sessions} sessions x 1 MiB (<= 1 KiB writes): bytes lost / extra`,
        value: `${lost} / ${extra}`,
        baseline: '',
        ratio: '',
        target: '0 / 0',
        met: lost === 0 && extra === 0,
      },
      {
        metric: 'receipts on disk (signed, same as answered) / exact',
        value: `${onDisk} / ${sessions - inexact}`,
        baseline: '',
        ratio: '',
        target: `${sessions} / ${sessions}`,
        met: onDisk === sessions && inexact === 0,
      },
      {
        metric: 'supervisor peak RSS (VmHWM)',
        value: mib(peakKb),
        baseline: `${mib(startKb)} before`,
        ratio: '',
        target: '<= 300 MiB',
        met: peakKb / 1024 <= 300,
      },
      { metric: 'wall time, launch of the first to the last receipt', value: fmtMs(wallMs), baseline: '', ratio: '', target: '', met: null },
    );

    const idle = await Promise.all(Array.from({ length: idleSessions }, async () => (await client.launch({ argv: ['sleep', '600'], cwd: '/' })).session_id));
    await new Promise((r) => setTimeout(r, 1000)); // let the launches settle before sampling
    const cpu0 = cpuMs(d.pid);
    const tIdle = nowMs();
    await new Promise((r) => setTimeout(r, 10_000)); // the measurement window itself
    const cpu = cpuMs(d.pid) - cpu0;
    const windowMs = nowMs() - tIdle;
    await Promise.all(idle.map((session_id) => client.request('cancel', { session_id })));
    await Promise.all(idle.map((session_id) => client.wait({ session_id })));
    rows.push({
      metric: `${idleSessions} idle sessions: supervisor CPU over ${(windowMs / 1000).toFixed(0)} s`,
      value: `${cpu} ms (${((cpu / windowMs) * 100).toFixed(2)} %)`,
      baseline: '',
      ratio: '',
      target: '~0 (< 1 %)',
      met: cpu / windowMs < 0.01,
    });
    writeJson('scale', {
      sessions,
      wall_ms: wallMs,
      bytes_lost: lost,
      bytes_extra: extra,
      inexact_receipts: inexact,
      receipts_on_disk: onDisk,
      peak_rss_kb: peakKb,
      start_rss_kb: startKb,
      idle_sessions: idleSessions,
      idle_cpu_ms: cpu,
      idle_window_ms: windowMs,
    });
  } finally {
    client.close();
  }
  printTable('scale', rows);
  return rows;
}

/**
 * Reads a session's stdout from cursor 0 (to its stored end, or with `follow` to its final end as
 * it is stored); returns ms, bytes, output events and whether each event came in order and matched `expect`.
 */
async function replay(
  client: SupervisorClient,
  session_id: string,
  expect: (cursor: number, data: Buffer) => boolean,
  follow = false,
): Promise<{ ms: number; bytes: number; events: number; exact: boolean }> {
  const t0 = nowMs();
  let got = 0;
  let events = 0;
  let exact = true;
  await new Promise<void>((res, rej) => {
    client
      .subscribe(
        { session_id, stream: 'stdout', from: 0, follow },
        {
          onOutput: (ev) => {
            const data = Buffer.from(ev.data.buffer, ev.data.byteOffset, ev.data.byteLength);
            if (ev.cursor !== got || !expect(ev.cursor, data)) exact = false;
            got += data.length;
            events++;
          },
          onEnd: () => res(),
        },
      )
      .catch(rej);
  });
  return { ms: nowMs() - t0, bytes: got, events, exact };
}

/**
 * drainBytesPerMs: the drain rate to compare with (the drain benchmark's median for one
 * producer, same run); without it, this log's own drain. The timed log is zeros (compared
 * with memcmp, so the check does not cap the rate); a second, untimed 256 MiB log of the
 * position-dependent pattern checks that replay returns every byte in place.
 */
export async function replayBench(d: TestDaemon, gib: number, drainBytesPerMs?: number): Promise<Row[]> {
  const client = await connect(d);
  try {
    const bytes = gib * 2 ** 30;
    const t0 = nowMs();
    const zerosLog = (await client.launch({ argv: ['head', '-c', String(bytes), '/dev/zero'], cwd: '/' })).session_id;
    await client.wait({ session_id: zerosLog });
    const ownDrainMs = nowMs() - t0;
    const zeros = Buffer.alloc(1 << 20);
    const timed = await replay(client, zerosLog, (_c, data) => data.length <= zeros.length && data.equals(zeros.subarray(0, data.length)));
    const patternSize = 256 * MiB;
    const patternLog = (await client.launch({ argv: [process.execPath, PATTERN_PRODUCER, String(patternSize)], cwd: '/' })).session_id;
    await client.wait({ session_id: patternLog });
    const checked = await replay(client, patternLog, (cursor, data) => data.equals(patternBytes(cursor, data.length)));
    for (const id of [zerosLog, patternLog]) rmSync(join(d.stateDir, 'sessions', id, 'stdout'), { recursive: true, force: true });
    const exact = timed.exact && timed.bytes === bytes && checked.exact && checked.bytes === patternSize;
    const drainRate = drainBytesPerMs ?? bytes / ownDrainMs;
    const ratio = bytes / timed.ms / drainRate;
    const rows: Row[] = [
      {
        metric: `replay ${gib} GiB from cursor 0 (and 256 MiB of the pattern, byte by byte)`,
        value: `${fmtRate(bytes, timed.ms)} (${fmtMs(timed.ms)}), ${exact ? 'exact' : 'NOT EXACT'}`,
        baseline: `drain: ${fmtRate(drainRate, 1)}${drainBytesPerMs ? ' (drain bench median)' : ' (this log)'}`,
        ratio: `${ratio.toFixed(2)}x`,
        target: '>= 0.5x',
        met: ratio >= 0.5 && exact,
      },
    ];
    printTable('replay', rows);
    writeJson('replay', { bytes, replay_ms: timed.ms, drain_bytes_per_ms: drainRate, pattern_bytes: patternSize, pattern_replay_ms: checked.ms, exact });
    return rows;
  } finally {
    client.close();
  }
}

function lineSha256(n: number): string {
  const h = createHash('sha256');
  const piece = Buffer.alloc(MiB, 'a');
  for (let left = n; left > 0; left -= piece.length) h.update(left >= piece.length ? piece : piece.subarray(0, left));
  return h.update('\n').digest('hex');
}

/** A command writing one line of n bytes ('a's) and its newline. */
function lineArgv(n: number): string[] {
  return ['/bin/sh', '-c', `head -c ${n} /dev/zero | tr '\\0' a; echo`];
}

const sizeLabel = (n: number) => (n >= 2 ** 30 ? `${n / 2 ** 30} GiB` : `${n / MiB} MiB`);

export async function longLinesBench(d: TestDaemon, sizes: number[]): Promise<Row[]> {
  const client = await connect(d);
  const rows: Row[] = [];
  const json: unknown[] = [];
  try {
    for (const n of sizes) {
      const mem = peakRss(d.pid);
      const { session_id } = await client.launch({ argv: lineArgv(n), cwd: '/' });
      const r = await client.wait({ session_id });
      const { peakKb, startKb } = mem.stop();
      const growthMiB = (peakKb - startKb) / 1024;
      const out = r.output.stdout!;
      const exact = out.final_cursor === n + 1 && out.sha256 === lineSha256(n) && out.complete;
      rmSync(join(d.stateDir, 'sessions', session_id, 'stdout'), { recursive: true, force: true });
      rows.push({
        metric: `one ${sizeLabel(n)} line: exact / supervisor peak RSS growth`,
        value: `${exact ? 'exact' : 'NOT EXACT'} / ${growthMiB.toFixed(1)} MiB`,
        baseline: `${mib(startKb)} before`,
        ratio: '',
        target: 'exact / <= 16 MiB',
        met: exact && growthMiB <= 16,
      });
      json.push({ bytes: n + 1, exact, peak_rss_kb: peakKb, start_rss_kb: startKb });
    }
    // The largest line again, followed live by a client as `sbx run` does (output events as
    // the drain stores the bytes, often a few KiB each): informational, as the row is
    // the launch-and-wait above.
    const n = sizes[sizes.length - 1]!;
    const mem = peakRss(d.pid);
    const { session_id } = await client.launch({ argv: lineArgv(n), cwd: '/' });
    const h = createHash('sha256');
    const followed = await replay(client, session_id, (_c, data) => (h.update(data), true), true);
    const r = await client.wait({ session_id });
    const { peakKb, startKb } = mem.stop();
    const growthMiB = (peakKb - startKb) / 1024;
    const out = r.output.stdout!;
    const sha = lineSha256(n);
    const exact = followed.exact && followed.bytes === n + 1 && h.digest('hex') === sha && out.sha256 === sha && out.complete;
    const events = followed.events;
    rmSync(join(d.stateDir, 'sessions', session_id, 'stdout'), { recursive: true, force: true });
    rows.push({
      metric: `the same ${sizeLabel(n)} line followed live (${events} output events): exact / supervisor peak RSS growth`,
      value: `${exact ? 'exact' : 'NOT EXACT'} / ${growthMiB.toFixed(1)} MiB`,
      baseline: `${mib(startKb)} before`,
      ratio: '',
      target: '',
      met: exact,
    });
    json.push({ bytes: n + 1, followed: true, events, exact, peak_rss_kb: peakKb, start_rss_kb: startKb });
  } finally {
    client.close();
  }
  printTable('long lines', rows);
  writeJson('long_lines', { runs: json });
  return rows;
}
