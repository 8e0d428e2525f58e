// drain: how fast the supervisor stores a producer's output (SHA-256 digests on), against, in the same
// run and interleaved: `cat > file` plain (page cache) and durable (then `sync file`), and the reference
// drain (reference-drain.c: durable and hashed, writeback started as it reads), one per producer. Launch
// to fsync'ed receipt, so every chunk's fsync and the receipt count. Each receipt and each reference
// drain's digest is checked against the bytes the producer writes; repetitions alternate the four.
import { createHash } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
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
  /** The ratio to reach against `cat > f` then fsync of f (durable, as a receipt is), and against the reference drain (issue 36); plain `cat > f` is shown, not judged. */
  target?: { durable?: number; reference: number };
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

const REFERENCE_SOURCE = join(dirname(fileURLToPath(import.meta.url)), 'reference-drain.c');

/** Compiles reference-drain.c (cc, OpenSSL's libcrypto: Debian's gcc and libssl-dev) into dist/bench/; its path, or why it cannot be built. */
function buildReferenceDrain(): { path: string } | { error: string } {
  const out = join(dirname(fileURLToPath(import.meta.url)), '../../dist/bench/reference-drain');
  mkdirSync(dirname(out), { recursive: true });
  try {
    execFileSync('cc', ['-std=gnu11', '-O2', '-Wall', '-Wextra', '-pthread', '-o', out, REFERENCE_SOURCE, '-lcrypto'], { stdio: 'pipe' });
    return { path: out };
  } catch (err) {
    const why = String((err as { stderr?: Buffer }).stderr ?? (err as Error).message)
      .trim()
      .split('\n')
      .slice(-3)
      .join(' ');
    return { error: `cannot build ${REFERENCE_SOURCE} (needs cc and libcrypto: apt-get install gcc libssl-dev): ${why}` };
  }
}

/**
 * `cmd | reference-drain f` per producer, at once, on the state dir's file system: each drains
 * its pipe durably and hashed (reference-drain.c). Each one's exit status, byte count and
 * digest are checked; a failure throws with its stderr.
 */
function referenceMs(d: TestDaemon, v: Variant, bin: string): number {
  const files = v.producers.map((_, i) => join(d.stateDir, `reference-drain-${i}.out`));
  // Each job records the drain's status ($? of the pipeline: its last command's) and keeps its stderr.
  const script =
    v.producers.map((cmd, i) => `(${cmd} | ${bin} ${files[i]} > ${files[i]}.sum 2> ${files[i]}.err; echo $? > ${files[i]}.rc) &`).join(' ') + ' wait';
  const ms = shellMs(script);
  try {
    for (const f of files) {
      const rc = readFileSync(`${f}.rc`, 'utf8').trim();
      const said = readFileSync(`${f}.sum`, 'utf8').trim();
      if (rc !== '0' || said !== `${v.bytesEach} ${v.sha256(v.bytesEach)}`)
        throw new Error(`reference drain ${v.name}: exit ${rc}, says ${JSON.stringify(said)}; stderr: ${readFileSync(`${f}.err`, 'utf8').trim()}`);
    }
  } finally {
    for (const f of files) for (const x of ['', '.sum', '.err', '.rc']) rmSync(`${f}${x}`, { force: true });
  }
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
      target: { durable: 1.0, reference: 0.9 },
    },
    {
      name: `${options.gib} GiB, 4 KiB writes (dd bs=4096)`,
      producers: [`dd if=/dev/zero bs=4096 count=${total / 4096} status=none`],
      bytesEach: total,
      sha256: zerosSha256,
      target: { reference: 0.85 },
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
      target: { reference: 0.8 },
    },
  ];
  const built = buildReferenceDrain();
  const reference = 'path' in built ? built.path : null;
  if ('error' in built) process.stderr.write(`drain: the reference drain's rows are left out: ${built.error}\n`);
  const rows: Row[] = [];
  const stageRows: Row[] = [];
  const json: unknown[] = [];
  for (const v of variants) {
    v.sha256(v.bytesEach); // computed before the clock runs
    const sup: number[] = [];
    const cpus: StageCpu[] = [];
    const cat: number[] = [];
    const catDurable: number[] = [];
    const ref: number[] = [];
    for (let i = 0; i < options.reps; i++) {
      // Interleaved, so all four see the same machine.
      cat.push(catMs(d, v, false));
      catDurable.push(catMs(d, v, true));
      if (reference) ref.push(referenceMs(d, v, reference));
      const run = await supervisorRun(d, v);
      sup.push(run.ms);
      cpus.push(run.cpu);
    }
    const s = median(sup);
    const c = median(cat);
    const cd = median(catDurable);
    const ratio = c / s;
    const ratioDurable = cd / s;
    const r = reference ? median(ref) : NaN;
    const ratioReference = r / s;
    if (v.exactness) {
      rows.push({
        metric: v.name,
        value: `digest exact; ${fmtRate(total, s)}`,
        baseline: `cat: ${fmtRate(total, c)}${reference ? `; reference drain: ${fmtRate(total, r)}` : ''}`,
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
        target: '',
        met: null,
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
      if (reference)
        rows.push({
          metric: `${v.name}, vs the reference drain (durable, hashed, writeback as it reads)`,
          value: `${fmtRate(total, s)} (${fmtMs(s)})`,
          baseline: `reference: ${fmtRate(total, r)} (${fmtMs(r)})`,
          ratio: `${ratioReference.toFixed(2)}x`,
          target: `>= ${v.target!.reference.toFixed(2)}x`,
          met: ratioReference >= v.target!.reference,
        });
    }
    json.push({
      variant: v.name,
      bytes: total,
      supervisor_ms: sup,
      cat_ms: cat,
      cat_fsync_ms: catDurable,
      reference_ms: ref,
      median_ratio: ratio,
      median_ratio_durable: ratioDurable,
      median_ratio_reference: ratioReference,
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
