// checkpoint: what a checkpoint costs (issue 18), on a supervisor of its own whose workspace is
// a 104 MiB, 4,115-file tree (4,096 files of 16 KiB in 64 directories and 19 of 2 MiB, random
// bytes from a logged seed) on the state dir's file system:
// - the first checkpoint (every object written and fsync'ed), against `cp -a` of the tree plus
//   `sync -f` in the same run;
// - an unchanged re-checkpoint (no object written), against `sha256sum` of every file;
// - the read-back of each (its result's read_back.ms);
// - `sbx restore` into a new directory (copy, re-hash, rescan, compare), against `cp -a` + sync;
// - the supervisor's RSS before and at its peak.
import { spawnSync } from 'node:child_process';
import { createCipheriv, createHash, randomInt } from 'node:crypto';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { TestDaemon } from '../../test/helpers/daemon.js';
import { connect, fmtMs, median, nowMs, peakRss, printTable, type Row, shellMs, writeJson } from './common.js';

function seeded(seed: number, salt: string, n: number): Buffer {
  const key = createHash('sha256').update(`${seed}:${salt}`).digest();
  return createCipheriv('aes-256-ctr', key, Buffer.alloc(16)).update(Buffer.alloc(n));
}

export async function checkpointBench(opts: { smallFiles: number; smallBytes: number; largeFiles: number; largeBytes: number; reps: number }): Promise<Row[]> {
  const seed = Number(process.env.CK_SEED ?? randomInt(1, 2 ** 31));
  process.stdout.write(`checkpoint bench: CK_SEED=${seed}\n`);
  const d = new TestDaemon({ cgroupPrefix: 'sbx-bench-', config: { logLevel: 'warn' } });
  const ws = join(d.dir, 'ws');
  let total = 0;
  for (let i = 0; i < opts.smallFiles; i++) {
    const dir = join(ws, `d${Math.floor(i / 64)}`);
    if (i % 64 === 0) mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, `f${i}`), seeded(seed, `s${i}`, opts.smallBytes));
    total += opts.smallBytes;
  }
  mkdirSync(join(ws, 'large'), { recursive: true });
  for (let i = 0; i < opts.largeFiles; i++) {
    writeFileSync(join(ws, 'large', `l${i}`), seeded(seed, `l${i}`, opts.largeBytes));
    total += opts.largeBytes;
  }
  const files = opts.smallFiles + opts.largeFiles;
  d.withConfig({ workspace: { paths: [ws] } });
  await d.start();
  try {
    spawnSync('sync');
    const c = await connect(d);
    const rss = peakRss(d.pid);
    const first: number[] = [];
    const again: number[] = [];
    const againBeforeReadBack: number[] = [];
    const readBackFirst: number[] = [];
    const readBackAgain: number[] = [];
    const restore: number[] = [];
    const cpSync: number[] = [];
    const sha: number[] = [];
    let id = '';
    for (let rep = 0; rep < opts.reps; rep++) {
      // A fresh store each rep for the first checkpoint (every object written).
      rmSync(join(d.stateDir, 'checkpoints', 'objects'), { recursive: true, force: true });
      spawnSync('sync');
      let t = nowMs();
      const r1 = await c.checkpoint({ workspace: ws });
      first.push(nowMs() - t);
      readBackFirst.push(r1.read_back.ms);
      if (r1.objects.written !== files || !r1.consistent)
        throw new Error(`first checkpoint wrote ${r1.objects.written} objects of ${files}, consistent ${r1.consistent}`);
      t = nowMs();
      const r2 = await c.checkpoint({ workspace: ws });
      again.push(nowMs() - t);
      againBeforeReadBack.push(r2.phases_ms.boundary + r2.phases_ms.capture + r2.phases_ms.store);
      readBackAgain.push(r2.read_back.ms);
      if (r2.objects.written !== 0) throw new Error(`the unchanged re-checkpoint wrote ${r2.objects.written} objects`);
      id = r2.checkpoint_id;
      const target = join(d.dir, `restored-${rep}`);
      t = nowMs();
      const rs = await d.sbx(['restore', id, target, '--state-dir', d.stateDir]);
      restore.push(nowMs() - t);
      if (rs.status !== 0) throw new Error(`sbx restore exited ${rs.status}: ${rs.stdout}${rs.stderr}`);
      rmSync(target, { recursive: true });
      const copy = join(d.dir, `copy-${rep}`);
      cpSync.push(shellMs(`cp -a ${ws} ${copy} && sync -f ${copy}`));
      rmSync(copy, { recursive: true });
      sha.push(shellMs(`find ${ws} -type f -print0 | xargs -0 sha256sum > /dev/null`));
    }
    const mem = rss.stop();
    c.close();
    const growthMiB = (mem.peakKb - mem.startKb) / 1024;
    const tree = `${files} files, ${(total / 2 ** 20).toFixed(0)} MiB`;
    const rows: Row[] = [
      {
        metric: `first checkpoint, ${tree} (median of ${opts.reps})`,
        value: fmtMs(median(first)),
        baseline: `${fmtMs(median(cpSync))} cp -a + sync`,
        ratio: `${(median(first) / median(cpSync)).toFixed(2)}x`,
        target: '<= 1.5 s',
        met: median(first) <= 1500,
      },
      {
        metric: 'unchanged re-checkpoint, up to its stored manifest',
        value: fmtMs(median(againBeforeReadBack)),
        baseline: `${fmtMs(median(sha))} sha256sum`,
        ratio: `${(median(againBeforeReadBack) / median(sha)).toFixed(2)}x`,
        target: '<= 0.2 s',
        met: median(againBeforeReadBack) <= 200,
      },
      {
        metric: 'unchanged re-checkpoint, published (read-back included)',
        value: fmtMs(median(again)),
        baseline: `${fmtMs(median(sha))} sha256sum`,
        ratio: `${(median(again) / median(sha)).toFixed(2)}x`,
        target: '',
        met: null,
      },
      {
        metric: 'read-back (manifest + every object re-hashed)',
        value: fmtMs(median(readBackAgain)),
        baseline: `${fmtMs(median(readBackFirst))} after the first`,
        ratio: '',
        target: '<= 0.2 s',
        met: median(readBackAgain) <= 200,
      },
      {
        metric: 'sbx restore (copy, re-hash, rescan, compare)',
        value: fmtMs(median(restore)),
        baseline: `${fmtMs(median(cpSync))} cp -a + sync`,
        ratio: `${(median(restore) / median(cpSync)).toFixed(2)}x`,
        target: '<= 1.5 s',
        met: median(restore) <= 1500,
      },
      {
        metric: 'supervisor RSS growth (peak over start)',
        value: `+${growthMiB.toFixed(1)} MiB`,
        baseline: `${(mem.startKb / 1024).toFixed(1)} MiB at start`,
        ratio: '',
        target: '<= 64 MiB',
        met: growthMiB <= 64,
      },
    ];
    printTable(`checkpoint (${tree}, state dir's file system)`, rows);
    writeJson('checkpoint', {
      seed,
      files,
      bytes: total,
      first_ms: first,
      again_ms: again,
      again_before_read_back_ms: againBeforeReadBack,
      read_back_ms: { first: readBackFirst, again: readBackAgain },
      restore_ms: restore,
      cp_sync_ms: cpSync,
      sha256sum_ms: sha,
      rss_kb: mem,
    });
    return rows;
  } finally {
    await d.stop();
  }
}
