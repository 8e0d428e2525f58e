// workspace: what the workspace clock costs (issue 17). Two tmpfs mounts of the same size, one
// a watched workspace of a supervisor of its own, the other not watched by anyone (fanotify
// marks a whole file system, so "unwatched" must be another file system). Interleaved:
// - tar -x of a 100 MB, 5,000-file tree into each, as a session: launch -> receipt wall time
//   (the watched one includes its barrier), median of the reps, and the ratio;
// - the supervisor's CPU (its reading thread included) over the watched and unwatched reps,
//   and its RSS before and after;
// - exit -> receipt of `true` sessions on that supervisor against the bench's own supervisor
//   (no workspace) in the same run: what the barrier adds, p50 and p99.
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { TestDaemon } from '../../test/helpers/daemon.js';
import { connect, cpuMs, distribution, fmtMs, median, memoryKb, nowMs, printTable, type Row, writeJson } from './common.js';

function mountTmpfs(at: string): void {
  mkdirSync(at, { recursive: true });
  const r = spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=512m', 'tmpfs', at]);
  if (r.status !== 0) throw new Error(`mount tmpfs ${at}: ${r.stderr.toString()}`);
}

async function exitToReceipt(d: TestDaemon, n: number): Promise<number[]> {
  const c = await connect(d);
  const out: number[] = [];
  try {
    for (let i = 0; i < n; i++) {
      const { session_id } = await c.launch({ argv: ['true'], cwd: '/' });
      const r = await c.wait({ session_id });
      out.push(nowMs() - Date.parse(r.leader_exited_at!));
    }
  } finally {
    c.close();
  }
  return out;
}

export async function workspaceBench(base: TestDaemon, opts: { files: number; totalBytes: number; reps: number; sessions: number }): Promise<Row[]> {
  const root = mkdtempSync(join(tmpdir(), 'sbx-bench-ws-'));
  const watched = join(root, 'watched');
  const plain = join(root, 'plain');
  const mounted: string[] = [];
  let d: TestDaemon | null = null;
  try {
    // The tree to extract: files of equal size, 50 per directory.
    const src = join(root, 'src');
    const size = Math.floor(opts.totalBytes / opts.files);
    const block = Buffer.alloc(size, 0x61);
    for (let i = 0; i < opts.files; i++) {
      const dir = join(src, `d${Math.floor(i / 50)}`);
      if (i % 50 === 0) mkdirSync(dir, { recursive: true });
      writeFileSync(join(dir, `f${i}`), block);
    }
    const tarball = join(root, 'tree.tar');
    execFileSync('tar', ['-cf', tarball, '-C', src, '.']);
    rmSync(src, { recursive: true });
    for (const m of [watched, plain]) {
      mountTmpfs(m);
      mounted.push(m);
    }
    d = await new TestDaemon({
      cgroupPrefix: 'sbx-bench-',
      config: {
        logLevel: 'warn',
        workspace: { paths: [watched], batchMs: Number(process.env.WS_BATCH_MS ?? 10), reportModify: process.env.WS_REPORT_MODIFY === '1' },
      },
    }).start();
    const c = await connect(d);
    const times: Record<'watched' | 'plain', number[]> = { watched: [], plain: [] };
    const cpu: Record<'watched' | 'plain', number> = { watched: 0, plain: 0 };
    const rssStartKb = memoryKb(d.pid).rss;
    let unattributed = 0;
    let attributed = 0;
    for (let rep = 0; rep < opts.reps; rep++) {
      for (const kind of rep % 2 === 0 ? (['watched', 'plain'] as const) : (['plain', 'watched'] as const)) {
        const dir = kind === 'watched' ? watched : plain;
        const target = join(dir, `x${rep}`);
        const cpu0 = cpuMs(d.pid);
        const t0 = nowMs();
        const { session_id } = await c.launch({ argv: ['sh', '-c', `mkdir ${target} && tar -xf ${tarball} -C ${target}`], cwd: '/' });
        const r = await c.wait({ session_id });
        times[kind].push(nowMs() - t0);
        cpu[kind] += cpuMs(d.pid) - cpu0;
        if (r.exit.code !== 0) throw new Error(`tar -x into ${dir} exited ${r.exit.code}`);
        if (kind === 'watched') {
          attributed += r.workspace![0].attributed.events;
          unattributed += r.workspace![0].unattributed_events;
        }
        rmSync(target, { recursive: true });
      }
    }
    c.close();
    const rssEndKb = memoryKb(d.pid).rss;
    const w = median(times.watched);
    const p = median(times.plain);
    // The barrier: exit -> receipt with and without a workspace, interleaved in blocks.
    const withWs: number[] = [];
    const without: number[] = [];
    for (let i = 0; i < 4; i++) {
      withWs.push(...(await exitToReceipt(d, opts.sessions / 4)));
      without.push(...(await exitToReceipt(base, opts.sessions / 4)));
    }
    const a = distribution(withWs);
    const b = distribution(without);
    const rows: Row[] = [
      {
        metric: `tar -x ${opts.files} files, ${(opts.totalBytes / 1e6).toFixed(0)} MB (median of ${opts.reps})`,
        value: fmtMs(w),
        baseline: fmtMs(p),
        ratio: `${((w / p - 1) * 100).toFixed(1)}% over`,
        target: '<= 20% over',
        met: w <= p * 1.2,
      },
      {
        metric: 'supervisor CPU per tar -x (watched / unwatched)',
        value: `${(cpu.watched / opts.reps).toFixed(0)} ms`,
        baseline: `${(cpu.plain / opts.reps).toFixed(0)} ms`,
        ratio: '',
        target: '',
        met: null,
      },
      {
        metric: 'supervisor RSS over the tar runs',
        value: `${(rssEndKb / 1024).toFixed(1)} MiB`,
        baseline: `${(rssStartKb / 1024).toFixed(1)} MiB`,
        ratio: `+${((rssEndKb - rssStartKb) / 1024).toFixed(1)} MiB`,
        target: '',
        met: null,
      },
      {
        metric: 'events attributed / unattributed (all watched reps)',
        value: `${attributed} / ${unattributed}`,
        baseline: '',
        ratio: '',
        target: '',
        met: null,
      },
      {
        metric: 'exit -> receipt p50 with the barrier',
        value: fmtMs(a.p50),
        baseline: fmtMs(b.p50),
        ratio: `+${fmtMs(a.p50 - b.p50)}`,
        target: '<= +2 ms',
        met: a.p50 - b.p50 <= 2,
      },
      { metric: 'exit -> receipt p99 with the barrier', value: fmtMs(a.p99), baseline: fmtMs(b.p99), ratio: `+${fmtMs(a.p99 - b.p99)}`, target: '', met: null },
    ];
    printTable('workspace (tmpfs watched vs tmpfs not watched; same supervisor, interleaved)', rows);
    writeJson('workspace', {
      tar_ms: times,
      cpu_ms: cpu,
      rss_kb: { start: rssStartKb, end: rssEndKb },
      exit_to_receipt_ms: { with_workspace: a, without: b },
      attributed,
      unattributed,
    });
    return rows;
  } finally {
    if (d) await d.terminate();
    for (const m of mounted.reverse()) spawnSync('umount', [m]);
    if (d) await d.stop();
    rmSync(root, { recursive: true, force: true });
  }
}
