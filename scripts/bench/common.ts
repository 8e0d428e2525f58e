// Shared parts of the benchmarks (scripts/bench/run.ts): the bench's own supervisor, timing,
// distributions, the same-run baseline, and the table/JSON output. Benchmarks are run by
// hand (`npm run bench`), never as timed tests.
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  closeSync,
  constants,
  fsyncSync,
  ftruncateSync,
  linkSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  rmSync,
  unlinkSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { open } from 'node:fs/promises';
import { join } from 'node:path';
import { SupervisorClient } from '../../ipc/client.js';
import { TestDaemon } from '../../test/helpers/daemon.js';

export const nowMs = () => performance.timeOrigin + performance.now();

/** A supervisor of the bench's own (cgroup mode as root), with limits raised for the bench. */
export async function benchDaemon(extra: { config?: Record<string, unknown>; env?: NodeJS.ProcessEnv } = {}): Promise<TestDaemon> {
  // Changed from the defaults: the scale run keeps 1,000 waits in flight on one connection
  // (ipc.maxInFlight is 64), no output quota, and logLevel warn drops the two info lines a
  // session logs. extra: config keys merged over these (e.g. remote), and environment.
  return new TestDaemon({
    cgroupPrefix: 'sbx-bench-',
    config: {
      logLevel: 'warn',
      ipc: { maxInFlight: 4096, maxConnections: 4096 },
      session: { maxSessions: 4096 },
      // 2 GiB streams: over the default 1 GiB quota per stream (issue 10: raise it here).
      drain: { quotaBytes: 0 },
      ...extra.config,
    },
    env: extra.env,
  }).start();
}

/**
 * What one file costs in the state dir's file system (mkdir, then a file created with
 * O_CREAT|O_EXCL, 64 bytes written, fsync'ed, closed), median of `files`, in ms: a launch
 * makes about 6 files and 4 fsyncs, so the launch rows are read against it. On this machine,
 * creating under /tmp cost ~1 ms a file in one measurement and ~0.03 ms under /var/tmp, on
 * the same ext4 file system (TMPDIR picks where the bench's supervisor keeps its state).
 */
export function fileCostMs(dir: string, files = 50): { createMs: number; fsyncMs: number; fsType: string } {
  const base = mkdtempSync(join(dir, 'fs-probe-'));
  const create: number[] = [];
  const sync: number[] = [];
  try {
    for (let i = 0; i < files; i++) {
      const t0 = nowMs();
      mkdirSync(join(base, `d${i}`));
      const fd = openSync(join(base, `d${i}`, 'f'), constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL, 0o600);
      writeSync(fd, Buffer.alloc(64));
      const t1 = nowMs();
      fsyncSync(fd);
      closeSync(fd);
      create.push(t1 - t0);
      sync.push(nowMs() - t1);
    }
  } finally {
    rmSync(base, { recursive: true, force: true });
  }
  let fsType = 'unknown';
  try {
    fsType = execFileSync('findmnt', ['-n', '-o', 'FSTYPE', '-T', dir], { encoding: 'utf8' }).trim();
  } catch {
    // findmnt(8) missing: the type is not essential
  }
  return { createMs: median(create), fsyncMs: median(sync), fsType };
}

export async function connect(d: TestDaemon): Promise<SupervisorClient> {
  return SupervisorClient.connect({ socketPath: d.socketPath, clientName: 'bench' });
}

/** Wall time of a shell pipeline (bash -c), in ms. */
export function shellMs(script: string): number {
  const t0 = nowMs();
  execFileSync('/bin/bash', ['-c', script], { stdio: 'ignore' });
  return nowMs() - t0;
}

export function median(xs: number[]): number {
  return quantile(xs, 0.5);
}

export function quantile(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))]!;
}

export interface Distribution {
  n: number;
  p50: number;
  p90: number;
  p99: number;
  max: number;
}

export function distribution(xs: number[]): Distribution {
  return { n: xs.length, p50: quantile(xs, 0.5), p90: quantile(xs, 0.9), p99: quantile(xs, 0.99), max: Math.max(...xs) };
}

/** A text histogram of values (ms) in the given bucket upper bounds. */
export function histogram(xs: number[], bounds: number[]): string {
  const counts = bounds.map(() => 0);
  let over = 0;
  for (const x of xs) {
    const i = bounds.findIndex((b) => x <= b);
    if (i < 0) over++;
    else counts[i]!++;
  }
  const width = 50;
  const top = Math.max(...counts, over, 1);
  const bar = (n: number) => '#'.repeat(Math.ceil((n / top) * width));
  const lines = bounds.map((b, i) => `  <= ${String(b).padStart(5)} ms ${String(counts[i]).padStart(6)} ${bar(counts[i]!)}`);
  lines.push(`  >  ${String(bounds.at(-1)).padStart(5)} ms ${String(over).padStart(6)} ${bar(over)}`);
  return lines.join('\n');
}

/** RSS (VmRSS) and its peak (VmHWM) of a process, KiB (proc(5)). */
export function memoryKb(pid: number): { rss: number; hwm: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return { rss: Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0), hwm: Number(/VmHWM:\s+(\d+)/.exec(status)?.[1] ?? 0) };
}

/** utime + stime of a process, in ms (proc(5) stat fields 14 and 15, USER_HZ = 100). */
export function cpuMs(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(f[11]) + Number(f[12])) * 10;
}

/**
 * Peak resident memory of a process over a stretch of work, in KiB: the kernel's own high-water
 * mark (VmHWM), reset to the current RSS first (proc(5): writing 5 to clear_refs), so nothing
 * between samples is missed. stop() returns the peak and the RSS at the start.
 */
export function peakRss(pid: number): { stop(): { peakKb: number; startKb: number } } {
  const startKb = memoryKb(pid).rss;
  writeFileSync(`/proc/${pid}/clear_refs`, '5');
  return { stop: () => ({ peakKb: memoryKb(pid).hwm, startKb }) };
}

/**
 * A position-dependent test pattern: each 8-byte word holds its own index (little endian), so
 * reordered, repeated or shifted bytes change it. `pattern.mjs N` writes the first N bytes.
 */
export function patternBytes(offset: number, length: number): Buffer {
  const first = Math.floor(offset / 8);
  const words = Math.ceil((offset + length) / 8) - first;
  const u32 = new Uint32Array(words * 2);
  for (let i = 0; i < words; i++) {
    const w = first + i;
    u32[2 * i] = w; // ToUint32: the low word
    u32[2 * i + 1] = Math.floor(w / 0x1_0000_0000);
  }
  const bytes = Buffer.from(u32.buffer);
  return bytes.subarray(offset - first * 8, offset - first * 8 + length);
}

/** SHA-256 (hex) of the first `bytes` bytes of the pattern. */
export function patternSha256(bytes: number): string {
  const h = createHash('sha256');
  for (let off = 0; off < bytes; off += 1 << 20) h.update(patternBytes(off, Math.min(1 << 20, bytes - off)));
  return h.digest('hex');
}

export const PATTERN_PRODUCER = join(import.meta.dirname, 'pattern.mjs');

/** One result line: what was measured, the same-run baseline, the ratio and the target. */
export interface Row {
  metric: string;
  value: string;
  baseline: string;
  ratio: string;
  target: string;
  met: boolean | null;
}

export function printTable(title: string, rows: Row[]): void {
  const head = ['metric', 'measured', 'same-run baseline', 'ratio', 'target', 'met'];
  const cells = rows.map((r) => [r.metric, r.value, r.baseline, r.ratio, r.target, r.met === null ? '' : r.met ? 'yes' : 'NO']);
  const widths = head.map((h, i) => Math.max(h.length, ...cells.map((c) => c[i]!.length)));
  const line = (c: string[]) => `| ${c.map((x, i) => x.padEnd(widths[i]!)).join(' | ')} |`;
  process.stdout.write(`\n### ${title}\n\n${line(head)}\n|${widths.map((w) => '-'.repeat(w + 2)).join('|')}|\n${cells.map(line).join('\n')}\n`);
}

/** Writes bench-results/<name>.json (in the current directory). */
export function writeJson(name: string, data: unknown): string {
  mkdirSync('bench-results', { recursive: true });
  const path = join('bench-results', `${name}.json`);
  writeFileSync(path, JSON.stringify({ name, at: new Date().toISOString(), ...(data as object) }, null, 2) + '\n');
  return path;
}

export const fmtMs = (ms: number) => `${ms.toFixed(ms < 10 ? 2 : ms < 100 ? 1 : 0)} ms`;
export const fmtRate = (bytes: number, ms: number) => `${(bytes / (ms / 1000) / 1e9).toFixed(2)} GB/s`;

/** p50 and p99 of the durable steps alone, in ms (see durableFloors). */
export interface Floor {
  p50: number;
  p99: number;
}

/**
 * The fsyncs a short session's receipt and its launch need, alone, in a temp dir on the state
 * dir's file system, done the way the supervisor does them (supervisor/store), `runs` times:
 * - receipt: both streams' index and dir fsync'ed at once on the threadpool (StreamLog.finalize),
 *   then the receipt written into its reservation, truncated, fsync'ed, linked, the
 *   reservation unlinked, the session dir fsync'ed (receipt-file.ts writeReceiptFile);
 * - launch: the admission record, a fsync'ed temp file linked into place, its dir and the
 *   sessions dir fsync'ed (durable.ts createFileDurable, live.ts admit), then the key record
 *   written the same way without any fsync (createFileUnsynced: rebuilt from the admission
 *   record after a crash).
 * No hashing, signing, IPC or process: what the disk alone costs, the floor under the
 * exit -> receipt and launch -> exec rows.
 */
export async function durableFloors(dir: string, runs: number): Promise<{ receipt: Floor; launch: Floor }> {
  const { createFileDurable, createFileUnsynced, fsyncDir } = await import('../../core/fs/durable.js');
  const base = mkdtempSync(join(dir, 'floor-'));
  const receipt: number[] = [];
  const launch: number[] = [];
  const fsyncPath = async (path: string) => {
    const h = await open(path, 'r');
    try {
      await h.sync();
    } finally {
      await h.close();
    }
  };
  try {
    mkdirSync(join(base, 'keys'));
    for (let i = 0; i < runs; i++) {
      const session = join(base, `s${i}`);
      let t0 = nowMs();
      mkdirSync(session);
      // As a launch makes them (live.ts admit, records.ts): the admission record durable with
      // its directory and the sessions directory; the key record not fsync'ed (rebuilt from it).
      createFileDurable(join(session, 'admission.json'), `{"admission":"${'x'.repeat(300)}"}\n`);
      fsyncDir(base);
      createFileUnsynced(join(base, 'keys', `k${i}.json`), '{"key":"x"}\n'.padEnd(200));
      launch.push(nowMs() - t0);
      for (const s of ['stdout', 'stderr']) {
        mkdirSync(join(session, s));
        closeSync(openSync(join(session, s, 'index.bin'), 'a'));
      }
      const reservation = join(session, 'receipt.reserved');
      writeFileSync(reservation, Buffer.alloc(4096));
      t0 = nowMs();
      await Promise.all(['stdout', 'stderr'].flatMap((s) => [fsyncPath(join(session, s, 'index.bin')), fsyncPath(join(session, s))]));
      const fd = openSync(reservation, constants.O_WRONLY);
      writeSync(fd, Buffer.from('{"receipt":1}\n'.padEnd(1500)));
      ftruncateSync(fd, 1500);
      fsyncSync(fd);
      closeSync(fd);
      linkSync(reservation, join(session, 'receipt.json'));
      unlinkSync(reservation);
      const dfd = openSync(session, constants.O_RDONLY | constants.O_DIRECTORY);
      fsyncSync(dfd);
      closeSync(dfd);
      receipt.push(nowMs() - t0);
    }
  } finally {
    rmSync(base, { recursive: true, force: true });
  }
  const floor = (v: number[]): Floor => {
    const s = [...v].sort((a, b) => a - b);
    return { p50: s[Math.floor(s.length / 2)]!, p99: s[Math.min(s.length - 1, Math.floor(s.length * 0.99))]! };
  };
  return { receipt: floor(receipt), launch: floor(launch) };
}
