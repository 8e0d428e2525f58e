// checkpoint_scale: checkpoints at the size of real workspaces (issue 34), against the tools
// harnesses and people use for this today, on the same tree in the same run: N files of
// 10 KiB (random bytes from a logged seed) in directories of 100, on the state dir's file
// system. Each of `git add -A && git commit` (a GIT_DIR of its own) + sync, `restic backup`
// and `sbx checkpoint` takes the tree four times: first, unchanged again (twice: the second is
// the steady cost, without what the first pays once after a first checkpoint, such as the
// object store's fan listings read again), and after the same 10 files changed (one byte each,
// sizes kept). Then `sbx restore` + sync against `cp -a` + sync,
// and the supervisor's peak RSS (VmHWM) over all of it. Peers missing (restic) are skipped.
import { execFileSync, spawnSync } from 'node:child_process';
import { createCipheriv, createHash, randomInt } from 'node:crypto';
import { mkdirSync, openSync, closeSync, readSync, writeSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { TestDaemon } from '../../test/helpers/daemon.js';
import { connect, fmtMs, nowMs, peakRss, printTable, type Row, shellMs, writeJson } from './common.js';

const FILE_BYTES = 10 * 1024;
const PER_DIR = 100;

function has(tool: string): boolean {
  return spawnSync('/bin/sh', ['-c', `command -v ${tool}`], { stdio: 'ignore' }).status === 0;
}

/** Writes `files` files of FILE_BYTES under ws (d<k>/f<i>), seeded random bytes; returns their paths. */
function makeTree(ws: string, files: number, seed: number): string[] {
  const key = createHash('sha256').update(`scale:${seed}`).digest();
  const stream = createCipheriv('aes-256-ctr', key, Buffer.alloc(16));
  const zero = Buffer.alloc(FILE_BYTES * PER_DIR);
  const paths: string[] = [];
  for (let i = 0; i < files; i += PER_DIR) {
    const dir = join(ws, `d${i / PER_DIR}`);
    mkdirSync(dir, { recursive: true });
    const bytes = stream.update(zero);
    for (let j = 0; j < PER_DIR && i + j < files; j++) {
      const p = join(dir, `f${i + j}`);
      writeFileSync(p, bytes.subarray(j * FILE_BYTES, (j + 1) * FILE_BYTES));
      paths.push(p);
    }
  }
  return paths;
}

/** Flips one byte in the middle of each file (inverted, so its content always changes; size kept, mtime and ctime move). */
function change(paths: string[]): void {
  const b = Buffer.alloc(1);
  for (const p of paths) {
    const fd = openSync(p, 'r+');
    readSync(fd, b, 0, 1, FILE_BYTES / 2);
    b[0] ^= 0xff;
    writeSync(fd, b, 0, 1, FILE_BYTES / 2);
    closeSync(fd);
  }
}

export async function checkpointScaleBench(opts: { files: number }): Promise<Row[]> {
  const seed = Number(process.env.CK_SEED ?? randomInt(1, 2 ** 31));
  process.stdout.write(`checkpoint_scale bench: CK_SEED=${seed}, ${opts.files} files of ${FILE_BYTES} bytes\n`);
  const d = new TestDaemon({ cgroupPrefix: 'sbx-bench-', config: { logLevel: 'warn', checkpoint: { deadlineMs: 1_800_000 } } });
  const ws = join(d.dir, 'ws');
  const t0 = nowMs();
  const paths = makeTree(ws, opts.files, seed);
  spawnSync('sync');
  process.stdout.write(`tree made in ${fmtMs(nowMs() - t0)}\n`);
  const changed = Array.from({ length: 10 }, (_, i) => paths[Math.floor(((i + 0.5) * paths.length) / 10)]!);
  const gitDir = join(d.dir, 'git');
  const resticRepo = join(d.dir, 'restic');
  const env = {
    ...process.env,
    GIT_DIR: gitDir,
    GIT_WORK_TREE: ws,
    RESTIC_PASSWORD: 'bench',
    RESTIC_REPOSITORY: resticRepo,
    RESTIC_CACHE_DIR: join(d.dir, 'restic-cache'),
  };
  const sh = (script: string) => {
    const t = nowMs();
    execFileSync('/bin/bash', ['-c', script], { stdio: 'ignore', env });
    return nowMs() - t;
  };
  const git = { first: NaN, again: NaN, again2: NaN, changed: NaN };
  const restic = { first: NaN, again: NaN, changed: NaN };
  const sbx = {
    first: NaN,
    again: NaN,
    again2: NaN,
    changed: NaN,
    firstBeforeReadBack: NaN,
    againBeforeReadBack: NaN,
    again2BeforeReadBack: NaN,
    changedBeforeReadBack: NaN,
  };
  const withGit = has('git');
  const withRestic = has('restic');
  d.withConfig({ workspace: { paths: [ws] } });
  await d.start();
  try {
    const c = await connect(d);
    const rss = peakRss(d.pid);
    // gc.auto=0: git's automatic gc (past 6,700 loose objects) would pack 100,000 objects in a
    // background process while the next measurements run, sbx's among them.
    const commit = 'git -c gc.auto=0 add -A && git -c gc.auto=0 -c user.name=bench -c user.email=bench@localhost commit -q --allow-empty -m x && sync';
    if (withGit) {
      execFileSync('git', ['init', '-q'], { env });
      git.first = sh(commit);
      git.again = sh(commit);
      git.again2 = sh(commit);
    }
    if (withRestic) {
      execFileSync('restic', ['init', '-q'], { env });
      restic.first = sh(`restic backup -q ${ws}`);
      restic.again = sh(`restic backup -q ${ws}`);
    }
    const take = async (what: 'first' | 'again' | 'again2' | 'changed') => {
      const t = nowMs();
      const r = await c.checkpoint({ workspace: ws });
      sbx[what] = nowMs() - t;
      sbx[`${what}BeforeReadBack`] = r.phases_ms.boundary + r.phases_ms.capture + r.phases_ms.store;
      return r;
    };
    const r1 = await take('first');
    if (r1.scan.files !== opts.files || !r1.consistent)
      throw new Error(`first checkpoint: ${r1.scan.files} files of ${opts.files}, consistent ${r1.consistent}`);
    const r2 = await take('again');
    if (r2.objects.written !== 0) throw new Error(`the unchanged re-checkpoint wrote ${r2.objects.written} objects`);
    const r2b = await take('again2');
    if (r2b.objects.written !== 0 || r2b.scan.passes !== 1)
      throw new Error(`the second unchanged re-checkpoint wrote ${r2b.objects.written} objects in ${r2b.scan.passes} passes`);
    change(changed);
    if (withGit) git.changed = sh(commit);
    if (withRestic) restic.changed = sh(`restic backup -q ${ws}`);
    const r3 = await take('changed');
    if (r3.objects.written !== changed.length) throw new Error(`the re-checkpoint after ${changed.length} changes wrote ${r3.objects.written} objects`);
    const target = join(d.dir, 'restored');
    let t = nowMs();
    const rs = await d.sbx(['restore', r3.checkpoint_id, target, '--state-dir', d.stateDir]);
    if (rs.status !== 0) throw new Error(`sbx restore exited ${rs.status}: ${rs.stdout}${rs.stderr}`);
    // Like for like with `cp -a` + sync: sbx restore does not sync what it wrote (as cp does not).
    execFileSync('sync', ['-f', target]);
    const restoreMs = nowMs() - t;
    rmSync(target, { recursive: true });
    const copy = join(d.dir, 'copy');
    const cpMs = shellMs(`cp -a ${ws} ${copy} && sync -f ${copy}`);
    rmSync(copy, { recursive: true });
    t = nowMs();
    const vr = await d.sbx(['verify', r3.checkpoint_id, '--state-dir', d.stateDir]);
    const verifyMs = nowMs() - t;
    if (vr.status !== 0) throw new Error(`sbx verify exited ${vr.status}: ${vr.stdout}${vr.stderr}`);
    const mem = rss.stop();
    c.close();
    const growthMiB = (mem.peakKb - mem.startKb) / 1024;
    const peer = (ms: number, name: string) => (Number.isNaN(ms) ? `${name}: not installed` : `${fmtMs(ms)} ${name}`);
    const tree = `${opts.files} files, ${((opts.files * FILE_BYTES) / 2 ** 20).toFixed(0)} MiB`;
    const rows: Row[] = [
      {
        metric: `first checkpoint, ${tree}`,
        value: fmtMs(sbx.first),
        baseline: `${peer(restic.first, 'restic')}; ${peer(git.first, 'git')}`,
        ratio: `${(sbx.first / restic.first).toFixed(2)}x restic`,
        target: '<= restic',
        met: withRestic ? sbx.first <= restic.first : null,
      },
      {
        metric: 'unchanged re-checkpoint (published)',
        value: `${fmtMs(sbx.again)} (${fmtMs(sbx.againBeforeReadBack)} to its manifest)`,
        baseline: `${peer(git.again, 'git')}; ${peer(restic.again, 'restic')}`,
        ratio: `${(sbx.again / git.again).toFixed(2)}x git`,
        target: '<= git',
        met: withGit ? sbx.again <= git.again : null,
      },
      {
        metric: 'unchanged again, the steady cost (published)',
        value: `${fmtMs(sbx.again2)} (${fmtMs(sbx.again2BeforeReadBack)} to its manifest)`,
        baseline: `${peer(git.again2, 'git')}`,
        ratio: `${(sbx.again2 / git.again2).toFixed(2)}x git`,
        target: '<= git',
        met: withGit ? sbx.again2 <= git.again2 : null,
      },
      {
        metric: 're-checkpoint after 10 files changed (published)',
        value: `${fmtMs(sbx.changed)} (${fmtMs(sbx.changedBeforeReadBack)} to its manifest; ${r3.scan.passes} walk(s), ${r3.read.hinted_paths} journal paths)`,
        baseline: `${peer(git.changed, 'git')}; ${peer(restic.changed, 'restic')}`,
        ratio: `${(sbx.changed / git.changed).toFixed(2)}x git`,
        target: '<= git',
        met: withGit ? sbx.changed <= git.changed : null,
      },
      {
        metric: 'sbx restore + sync (copy, re-hash, rescan, compare)',
        value: fmtMs(restoreMs),
        baseline: `${fmtMs(cpMs)} cp -a + sync`,
        ratio: `${(restoreMs / cpMs).toFixed(2)}x`,
        target: '<= 1.2x',
        met: restoreMs <= 1.2 * cpMs,
      },
      { metric: 'sbx verify (manifest + every object re-hashed)', value: fmtMs(verifyMs), baseline: '', ratio: '', target: '', met: null },
      {
        metric: 'supervisor RSS growth (peak over start)',
        value: `+${growthMiB.toFixed(1)} MiB`,
        baseline: `${(mem.startKb / 1024).toFixed(1)} MiB at start`,
        ratio: '',
        target: '<= 128 MiB',
        met: growthMiB <= 128,
      },
    ];
    printTable(`checkpoint_scale (${tree}, state dir's file system)`, rows);
    writeJson('checkpoint_scale', {
      seed,
      files: opts.files,
      file_bytes: FILE_BYTES,
      git,
      restic,
      sbx,
      changed_passes: r3.scan.passes,
      changed_hinted_paths: r3.read.hinted_paths,
      restore_ms: restoreMs,
      cp_sync_ms: cpMs,
      verify_ms: verifyMs,
      rss_kb: mem,
    });
    return rows;
  } finally {
    await d.stop();
  }
}
