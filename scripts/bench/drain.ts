// drain: how fast the supervisor stores a producer's output (SHA-256 digests on), against
// `cat > file` on the same file system in the same run, plain (page cache) and durable (then
// an fsync of the file, timed together: a receipt waits for every byte's fsync). Launch-to-receipt wall time, so it
// includes the fsync of every chunk and the receipt. Each receipt is checked: final cursor,
// digest (computed here from the bytes the producer writes: zeros, or for one variant a
// position-dependent pattern that reordered, repeated or shifted bytes would change) and
// `complete`. Repetitions alternate cat and supervisor.
import { createHash } from 'node:crypto';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import type { TestDaemon } from '../../test/helpers/daemon.js';
import { connect, fmtMs, fmtRate, median, nowMs, PATTERN_PRODUCER, patternSha256, printTable, type Row, shellMs, writeJson } from './common.js';
import { cpuDelta, THREAD_GROUPS, threadCpu } from './stages.js';

type StageCpu = Record<string, { userMs: number; sysMs: number }>;

const zeroDigests = new Map<number, string>();
function zerosSha256(bytes: number): string {
  let d = zeroDigests.get(bytes);
  if (!d) {
    const h = createHash('sha256');
    const z = Buffer.alloc(1 << 20);
    for (let left = bytes; left > 0; left -= z.length) h.update(left >= z.length ? z : z.subarray(0, left));
    d = h.digest('hex');
    zeroDigests.set(bytes, d);
  }
  return d;
}

interface Variant {
  name: string;
  /** Producer commands run at once (one session each). */
  producers: string[];
  bytesEach: number;
  /** SHA-256 of what each producer writes, computed here. */
  sha256: (bytes: number) => string;
  /** A check of exactness, not of speed: the producer itself is the bottleneck. */
  exactness?: boolean;
  /** The ratio to reach against plain `cat > f` (page cache), and against `cat > f` then fsync of f (durable, as a receipt is). */
  target?: { plain: number; durable?: number };
}

const patternDigests = new Map<number, string>();
const patternSha = (bytes: number) => patternDigests.get(bytes) ?? patternDigests.set(bytes, patternSha256(bytes)).get(bytes)!;

async function supervisorRun(d: TestDaemon, v: Variant): Promise<{ ms: number; cpu: StageCpu }> {
  const client = await connect(d);
  try {
    const before = threadCpu(d.pid);
    const t0 = nowMs();
    const ids = await Promise.all(v.producers.map(async (cmd) => (await client.launch({ argv: ['/bin/sh', '-c', cmd], cwd: '/' })).session_id));
    const receipts = await Promise.all(ids.map((session_id) => client.wait({ session_id })));
    const ms = nowMs() - t0;
    const cpu = cpuDelta(before, threadCpu(d.pid), d.pid);
    for (const r of receipts) {
      const out = r.output.stdout!;
      if (out.final_cursor !== v.bytesEach || out.sha256 !== v.sha256(v.bytesEach) || !out.complete || r.exit.code !== 0) {
        throw new Error(
          `drain ${v.name}: receipt ${r.session_id} says ${out.final_cursor} bytes, ${out.sha256}, complete ${out.complete}, exit ${JSON.stringify(r.exit)}`,
        );
      }
    }
    for (const id of ids) rmSync(join(d.stateDir, 'sessions', id, 'stdout'), { recursive: true, force: true }); // keep the disk free
    return { ms, cpu };
  } finally {
    client.close();
  }
}

/**
 * `cmd | cat > f` per producer, at once, on the state dir's file system; durable: then
 * `sync f` (fsync(2) of f, coreutils >= 8.24), timed together, as a receipt is only written
 * once every byte is fsync'ed.
 */
function catMs(d: TestDaemon, v: Variant, durable: boolean): number {
  const files = v.producers.map((_, i) => join(d.stateDir, `cat-baseline-${i}.out`));
  const script = v.producers.map((cmd, i) => `(${cmd} | cat > ${files[i]}${durable ? ` && sync ${files[i]}` : ''}) &`).join(' ') + ' wait';
  const ms = shellMs(script);
  for (const f of files) rmSync(f, { force: true });
  return ms;
}

/** Returns the rows, and the median drain rate of one large-write producer (bytes/ms). */
export async function drainBench(d: TestDaemon, options: { gib: number; reps: number }): Promise<{ rows: Row[]; bytesPerMs: number }> {
  const total = options.gib * 2 ** 30;
  const variants: Variant[] = [
    {
      name: `${options.gib} GiB, head -c (large writes)`,
      producers: [`head -c ${total} /dev/zero`],
      bytesEach: total,
      sha256: zerosSha256,
      target: { plain: 0.7, durable: 0.9 },
    },
    {
      name: `${options.gib} GiB, 4 KiB writes (dd bs=4096)`,
      producers: [`dd if=/dev/zero bs=4096 count=${total / 4096} status=none`],
      bytesEach: total,
      sha256: zerosSha256,
      target: { plain: 0.65 },
    },
    {
      name: `${options.gib} GiB, position-dependent bytes (pattern.mjs)`,
      producers: [`${process.execPath} ${PATTERN_PRODUCER} ${total}`],
      bytesEach: total,
      sha256: patternSha,
      exactness: true,
    },
    {
      name: `8 producers x ${options.gib / 8} GiB at once`,
      producers: Array.from({ length: 8 }, () => `head -c ${total / 8} /dev/zero`),
      bytesEach: total / 8,
      sha256: zerosSha256,
      target: { plain: 0.5 },
    },
  ];
  const rows: Row[] = [];
  const stageRows: Row[] = [];
  const json: unknown[] = [];
  for (const v of variants) {
    v.sha256(v.bytesEach); // computed before the clock runs
    const sup: number[] = [];
    const cpus: StageCpu[] = [];
    const cat: number[] = [];
    const catDurable: number[] = [];
    for (let i = 0; i < options.reps; i++) {
      // Interleaved, so all three see the same machine.
      cat.push(catMs(d, v, false));
      catDurable.push(catMs(d, v, true));
      const run = await supervisorRun(d, v);
      sup.push(run.ms);
      cpus.push(run.cpu);
    }
    const s = median(sup);
    const c = median(cat);
    const cd = median(catDurable);
    const ratio = c / s;
    const ratioDurable = cd / s;
    if (v.exactness) {
      rows.push({
        metric: v.name,
        value: `digest exact; ${fmtRate(total, s)}`,
        baseline: `cat: ${fmtRate(total, c)}`,
        ratio: `${ratio.toFixed(2)}x`,
        target: 'exact (the producer limits the rate)',
        met: true,
      });
    } else {
      rows.push({
        metric: `${v.name}, vs cat > f`,
        value: `${fmtRate(total, s)} (${fmtMs(s)})`,
        baseline: `cat: ${fmtRate(total, c)} (${fmtMs(c)})`,
        ratio: `${ratio.toFixed(2)}x`,
        target: `>= ${v.target!.plain.toFixed(2)}x`,
        met: ratio >= v.target!.plain,
      });
      const durable = v.target!.durable;
      rows.push({
        metric: `${v.name}, vs cat > f then fsync (durable)`,
        value: `${fmtRate(total, s)} (${fmtMs(s)})`,
        baseline: `cat+fsync: ${fmtRate(total, cd)} (${fmtMs(cd)})`,
        ratio: `${ratioDurable.toFixed(2)}x`,
        target: durable ? `>= ${durable.toFixed(2)}x` : '',
        met: durable ? ratioDurable >= durable : null,
      });
      // A receipt comes only once every byte is fsync'ed: no drain that keeps that promise
      // beats `cat` then fsync, so against plain `cat` it is held to cat / (cat + fsync).
      rows.push({
        metric: `${v.name}: ceiling vs cat > f for any drain that fsyncs (cat / cat+fsync)`,
        value: `${(c / cd).toFixed(2)}x`,
        baseline: `cat ${fmtMs(c)}, cat+fsync ${fmtMs(cd)}`,
        ratio: '',
        target: '',
        met: null,
      });
    }
    json.push({
      variant: v.name,
      bytes: total,
      supervisor_ms: sup,
      cat_ms: cat,
      cat_fsync_ms: catDurable,
      median_ratio: ratio,
      median_ratio_durable: ratioDurable,
      supervisor_cpu_ms: cpus,
    });
    // Where the median run's CPU went, per thread group of the supervisor (stages.ts).
    const mid = cpus[sup.indexOf(s)]!;
    stageRows.push({
      metric: v.name,
      value: THREAD_GROUPS.map((k) => `${k} ${(mid[k]!.userMs / 1000).toFixed(2)}u+${(mid[k]!.sysMs / 1000).toFixed(2)}s`).join('; '),
      baseline: `wall ${(s / 1000).toFixed(2)} s`,
      ratio: '',
      target: '',
      met: null,
    });
  }
  // The ceiling a single stream can reach with a digest: SHA-256 is sequential, one core.
  const hashMs: number[] = [];
  for (let i = 0; i < options.reps; i++) {
    zeroDigests.delete(total);
    const t0 = nowMs();
    zerosSha256(total);
    hashMs.push(nowMs() - t0);
  }
  const catAll = json.map((j) => median((j as { cat_ms: number[] }).cat_ms));
  const h = median(hashMs);
  rows.push({
    metric: `ceiling: SHA-256 of ${options.gib} GiB alone, one thread`,
    value: `${fmtRate(total, h)} (${fmtMs(h)})`,
    baseline: `cat: ${fmtRate(total, catAll[0]!)}`,
    ratio: `${(catAll[0]! / h).toFixed(2)}x`,
    target: '',
    met: null,
  });
  printTable(`drain (median of ${options.reps}, digests on, launch to fsync'ed receipt)`, rows);
  printTable(
    "drain: the median run's CPU by thread group of the supervisor (user u + system s, seconds, 10 ms steps; the producers not counted; 'same-run baseline' is that run's wall time)",
    stageRows,
  );
  writeJson('drain', { runs: json, sha256_only_ms: hashMs });
  return { rows, bytesPerMs: total / median((json[0] as { supervisor_ms: number[] }).supervisor_ms) };
}
