// attribution: who wrote what, and what holding exited writers costs (issue 33). Two
// supervisors of the bench's own, each watching a tmpfs of its own (fanotify marks a whole file
// system): one with workspace.holdExited (the default: an exited process it reaps stays a zombie
// until the watcher has read past it), one without (the behaviour before). Interleaved:
// - common agent edits, each its own session (sed -i, mv, cp, echo >>, python3 write, git add -A,
//   tar -x, npm install of a local package, and a writer reaped by its shell: sh -c 'cp a b; true'):
//   the share of each session's events attributed to it, and whether `changes` names the file;
// - exit -> receipt of `true` sessions, p50 / p99;
// - make -j2 of a generated C project (gcc: ~5 short processes per file): wall time.
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { SupervisorClient } from '../../ipc/client.js';
import { TestDaemon } from '../../test/helpers/daemon.js';
import { connect, distribution, fmtMs, median, nowMs, printTable, type Row, writeJson } from './common.js';

type Mode = 'hold' | 'nohold';

/** One edit: its setup (run directly, not a session), the session's shell script, and the path `changes` must name. */
interface Edit {
  name: string;
  setup: (dir: string) => void;
  script: string;
  path: string;
}

const EDITS: Edit[] = [
  { name: 'sed -i', setup: (d) => writeFileSync(join(d, 'f.txt'), 'a\n'), script: 'exec sed -i s/a/b/ f.txt', path: 'f.txt' },
  { name: 'mv', setup: (d) => writeFileSync(join(d, 'm.txt'), 'm\n'), script: 'exec mv m.txt n.txt', path: 'n.txt' },
  { name: 'cp', setup: (d) => writeFileSync(join(d, 'c.txt'), 'c\n'), script: 'exec cp c.txt d.txt', path: 'd.txt' },
  { name: "sh -c 'echo x >> f'", setup: () => {}, script: 'echo x >> e.txt', path: 'e.txt' },
  { name: 'python3 write', setup: () => {}, script: `exec python3 -c "open('p.txt','w').write('x')"`, path: 'p.txt' },
  { name: "sh -c 'cp a b; true' (reaped by sh)", setup: (d) => writeFileSync(join(d, 'a.txt'), 'a\n'), script: 'cp a.txt b.txt; true', path: 'b.txt' },
  {
    name: 'git add -A',
    setup: (d) => {
      execFileSync('git', ['init', '-q', d]);
      writeFileSync(join(d, 'g.txt'), 'g\n');
    },
    script: 'exec git add -A',
    path: '.git/index',
  },
  { name: 'tar -x', setup: () => {}, script: 'exec tar -xf "$TARBALL"', path: 'tree/t0' },
  {
    name: 'npm install ./pkg',
    setup: (d) => {
      mkdirSync(join(d, 'pkg'));
      writeFileSync(join(d, 'pkg', 'package.json'), '{"name":"pkg","version":"1.0.0"}\n');
      writeFileSync(join(d, 'package.json'), '{"name":"app","version":"1.0.0"}\n');
    },
    script: 'exec npm install --offline --no-audit --no-fund ./pkg >/dev/null 2>&1',
    path: 'package-lock.json',
  },
];

function mountTmpfs(at: string): void {
  mkdirSync(at, { recursive: true });
  const r = spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=512m', 'tmpfs', at]);
  if (r.status !== 0) throw new Error(`mount tmpfs ${at}: ${r.stderr.toString()}`);
}

/** A C project of n files and a Makefile (each file: gcc -c, i.e. gcc, cc1, as; then one link). */
function cProject(dir: string, n: number): void {
  mkdirSync(dir, { recursive: true });
  const objs: string[] = [];
  for (let i = 0; i < n; i++) {
    writeFileSync(join(dir, `f${i}.c`), `int f${i}(int x) { return x * ${i} + 1; }\n`);
    objs.push(`f${i}.o`);
  }
  writeFileSync(join(dir, 'main.c'), 'int main(void) { return 0; }\n');
  writeFileSync(
    join(dir, 'Makefile'),
    `OBJS = main.o ${objs.join(' ')}\nprog: $(OBJS)\n\tgcc -o $@ $(OBJS)\n%.o: %.c\n\tgcc -O0 -c -o $@ $<\nclean:\n\trm -f prog $(OBJS)\n`,
  );
}

async function editRound(
  c: SupervisorClient,
  ws: string,
  rep: number,
  tarball: string,
): Promise<{ name: string; events: number; attributed: number; named: boolean }[]> {
  const out: { name: string; events: number; attributed: number; named: boolean }[] = [];
  for (const [k, e] of EDITS.entries()) {
    const dir = join(ws, `r${rep}-${k}`);
    mkdirSync(dir);
    e.setup(dir);
    // The setup's own events are read before the edit starts (a session's barrier orders them),
    // so the edit's session counts only its own and what no session claimed meanwhile.
    await c.wait({ session_id: (await c.launch({ argv: ['true'], cwd: '/' })).session_id });
    const { session_id } = await c.launch({
      argv: ['sh', '-c', e.script],
      cwd: dir,
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: dir, TARBALL: tarball },
      linger: 'kill',
    });
    const r = await c.wait({ session_id });
    if (r.exit.code !== 0) throw new Error(`attribution bench: ${e.name} exited ${JSON.stringify(r.exit)}`);
    const w = r.workspace![0];
    const changes = await c.request('changes', { session_id });
    const rel = `r${rep}-${k}/${e.path}`;
    out.push({
      name: e.name,
      events: w.attributed.events + w.unattributed_events,
      attributed: w.attributed.events,
      named: changes.workspaces[0].changes.some((ch) => ch.path === rel),
    });
  }
  return out;
}

async function exitToReceipt(c: SupervisorClient, n: number): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const { session_id } = await c.launch({ argv: ['true'], cwd: '/' });
    const r = await c.wait({ session_id });
    out.push(nowMs() - Date.parse(r.leader_exited_at!));
  }
  return out;
}

export async function attributionBench(opts: { reps: number; sessions: number; cFiles: number; builds: number }): Promise<Row[]> {
  const root = mkdtempSync(join(tmpdir(), 'sbx-bench-attr-'));
  const mounted: string[] = [];
  const daemons: Partial<Record<Mode, TestDaemon>> = {};
  try {
    const tree = join(root, 'src');
    mkdirSync(join(tree, 'tree'), { recursive: true });
    for (let i = 0; i < 50; i++) writeFileSync(join(tree, 'tree', `t${i}`), `t${i}\n`);
    const tarball = join(root, 'tree.tar');
    execFileSync('tar', ['-cf', tarball, '-C', tree, 'tree']);
    const ws: Record<Mode, string> = { hold: join(root, 'hold'), nohold: join(root, 'nohold') };
    for (const mode of ['hold', 'nohold'] as const) {
      mountTmpfs(ws[mode]);
      mounted.push(ws[mode]);
      daemons[mode] = await new TestDaemon({
        cgroupPrefix: 'sbx-bench-',
        config: { logLevel: 'warn', workspace: { paths: [ws[mode]], holdExited: mode === 'hold', batchMs: Number(process.env.WS_BATCH_MS ?? 10) } },
      }).start();
    }
    const clients = { hold: await connect(daemons.hold!), nohold: await connect(daemons.nohold!) };
    const edits: Record<Mode, { name: string; events: number; attributed: number; named: boolean }[]> = { hold: [], nohold: [] };
    for (let rep = 0; rep < opts.reps; rep++) {
      for (const mode of rep % 2 === 0 ? (['hold', 'nohold'] as const) : (['nohold', 'hold'] as const))
        edits[mode].push(...(await editRound(clients[mode], ws[mode], rep, tarball)));
    }
    const exits: Record<Mode, number[]> = { hold: [], nohold: [] };
    for (let i = 0; i < 4; i++) for (const mode of ['hold', 'nohold'] as const) exits[mode].push(...(await exitToReceipt(clients[mode], opts.sessions / 4)));
    const builds: Record<Mode, number[]> = { hold: [], nohold: [] };
    const buildAttr: Record<Mode, { attributed: number; unattributed: number }> = {
      hold: { attributed: 0, unattributed: 0 },
      nohold: { attributed: 0, unattributed: 0 },
    };
    for (const mode of ['hold', 'nohold'] as const) {
      cProject(join(ws[mode], 'c'), opts.cFiles);
      // The project's own files are read before the first build (its barrier orders them).
      await clients[mode].wait({ session_id: (await clients[mode].launch({ argv: ['true'], cwd: '/' })).session_id });
    }
    for (let b = 0; b < opts.builds; b++) {
      for (const mode of b % 2 === 0 ? (['hold', 'nohold'] as const) : (['nohold', 'hold'] as const)) {
        const t0 = nowMs();
        const { session_id } = await clients[mode].launch({ argv: ['sh', '-c', 'make -s clean && make -s -j2'], cwd: join(ws[mode], 'c'), linger: 'kill' });
        const r = await clients[mode].wait({ session_id });
        builds[mode].push(nowMs() - t0);
        if (r.exit.code !== 0) throw new Error(`attribution bench: make exited ${JSON.stringify(r.exit)}`);
        buildAttr[mode].attributed += r.workspace![0].attributed.events;
        buildAttr[mode].unattributed += r.workspace![0].unattributed_events;
      }
    }
    for (const c of Object.values(clients)) c.close();
    const rows: Row[] = [];
    for (const e of EDITS) {
      const of = (mode: Mode) => edits[mode].filter((x) => x.name === e.name);
      const text = (mode: Mode) => {
        const xs = of(mode);
        const ev = xs.reduce((a, x) => a + x.events, 0);
        const at = xs.reduce((a, x) => a + x.attributed, 0);
        return `${at}/${ev} events, named ${xs.filter((x) => x.named).length}/${xs.length}`;
      };
      rows.push({
        metric: `attributed: ${e.name}`,
        value: text('hold'),
        baseline: text('nohold'),
        ratio: '',
        target: 'all',
        met: of('hold').every((x) => x.named && x.attributed === x.events),
      });
    }
    const [a, b] = [distribution(exits.hold), distribution(exits.nohold)];
    rows.push({
      metric: 'exit -> receipt, true, p50 / p99',
      value: `${fmtMs(a.p50)} / ${fmtMs(a.p99)}`,
      baseline: `${fmtMs(b.p50)} / ${fmtMs(b.p99)}`,
      ratio: `+${fmtMs(a.p50 - b.p50)}`,
      target: '',
      met: null,
    });
    const [bh, bn] = [median(builds.hold), median(builds.nohold)];
    rows.push({
      metric: `make -j2, ${opts.cFiles + 1} C files (median of ${opts.builds})`,
      value: fmtMs(bh),
      baseline: fmtMs(bn),
      ratio: `${((bh / bn - 1) * 100).toFixed(1)}%`,
      target: '',
      met: null,
    });
    rows.push({
      metric: 'make -j2: events attributed / unattributed (all builds)',
      value: `${buildAttr.hold.attributed} / ${buildAttr.hold.unattributed}`,
      baseline: `${buildAttr.nohold.attributed} / ${buildAttr.nohold.unattributed}`,
      ratio: '',
      target: '',
      met: null,
    });
    printTable(`attribution (holdExited on vs off; ${opts.reps} rounds of edits, interleaved)`, rows);
    writeJson('attribution', { edits, exit_to_receipt_ms: { hold: a, nohold: b, samples: exits }, make_ms: builds, make_events: buildAttr });
    return rows;
  } finally {
    for (const d of Object.values(daemons)) await d.terminate();
    for (const m of mounted.reverse()) spawnSync('umount', [m]);
    for (const d of Object.values(daemons)) await d.stop();
    rmSync(root, { recursive: true, force: true });
  }
}
