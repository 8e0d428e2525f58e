// peer: the supervisor side by side with what users would otherwise pick, systemd 252 booted
// as PID 1 in systemd-nspawn (the recipe of test/nspawn.test.ts and DESIGN.md "Testing the
// systemd unit for real"), with this checkout installed as its unit (scripts/install.sh).
// Inside the container, in the same run: launch wall (`systemd-run --wait --pipe -- true`
// against `sbx run -- true` and a launch -> receipt through the client library on one
// connection), a line flood under journald's defaults (lines kept, time until journalctl
// reads them) against the supervisor (lines kept, time until the receipt), and one 4 MiB line
// (records and the longest). Timed inside the container (date +%s%N around each loop), so
// nsenter's own start is not counted. Skipped, saying why, where nspawn cannot run.
import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, rmdirSync } from 'node:fs';
import { join } from 'node:path';
import { cgroupMount, removeCgroupTree } from '../../test/helpers/cgroup-cleanup.js';
import { ROOT, until } from '../../test/helpers/daemon.js';
import { fmtMs, printTable, type Row, writeJson } from './common.js';

const PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
const ROOTFS = '/tmp/sbx-bench-nspawn-root';
const CHECKOUT = '/mnt/sandbox-supervisor-checkout';

/** Why the peer section cannot run here, or null. */
function cannotRun(): string | null {
  if (spawnSync('sh', ['-c', 'command -v systemd-nspawn']).status !== 0) return 'systemd-nspawn is not installed (apt-get install systemd-container)';
  if (process.getuid?.() !== 0) return 'systemd-nspawn needs root';
  if (!cgroupMount()) return 'no cgroup2 mount';
  return null;
}

class Container {
  private child: ChildProcess | null = null;
  pid1 = 0;
  readonly cg: string;

  constructor() {
    this.cg = join(cgroupMount()!, 'sbx-bench-nspawn');
  }

  private mounted(): boolean {
    return spawnSync('mountpoint', ['-q', ROOTFS]).status === 0;
  }

  async boot(): Promise<void> {
    await this.cleanUp();
    mkdirSync(this.cg);
    mkdirSync(ROOTFS);
    execFileSync('mount', ['--bind', '/', ROOTFS]);
    execFileSync('mount', ['--make-private', ROOTFS]);
    this.child = spawn('sh', ['-c', `echo $$ > ${this.cg}/cgroup.procs && exec systemd-nspawn -D ${ROOTFS} --volatile=overlay --register=no --keep-unit --private-network --bind-ro=${ROOT}:${CHECKOUT} -b -M sbxbench`], {
      env: { PATH, SYSTEMD_NSPAWN_UNIFIED_HIERARCHY: '1' },
      stdio: ['ignore', 'ignore', 'ignore'],
    });
    this.pid1 = await until(() => Number(spawnSync('pgrep', ['-P', String(this.child!.pid)], { encoding: 'utf8' }).stdout.trim().split('\n')[0]) || 0, 'the container to start', 30_000);
    await until(() => /^(running|degraded)$/m.test(this.run(['systemctl', 'is-system-running'], true).stdout), 'the container to boot', 60_000);
    this.run(['bash', join(CHECKOUT, 'scripts/install.sh')]);
    await until(() => this.run(['systemctl', 'is-active', 'sandbox-supervisor.socket'], true).stdout.trim() === 'active', 'the socket unit', 30_000);
  }

  /** A command in every namespace of the container's PID 1. */
  run(args: string[], allowFail = false): { status: number | null; stdout: string; stderr: string } {
    const r = spawnSync('nsenter', ['-t', String(this.pid1), '-a', ...args], { env: { PATH, HOME: '/root' }, encoding: 'utf8', timeout: 300_000, maxBuffer: 64 << 20 });
    if (!allowFail && r.status !== 0) throw new Error(`in the container: ${args.join(' ')}: exit ${r.status}\n${r.stdout}\n${r.stderr}`);
    return { status: r.status, stdout: r.stdout, stderr: r.stderr };
  }

  bash(script: string): string {
    return this.run(['bash', '-c', script]).stdout.trim();
  }

  /** Powers the container off, kills what is left by its cgroup, unmounts (never rm -rf a bind of /). */
  async cleanUp(): Promise<void> {
    const c = this.child;
    if (c && c.exitCode === null && c.signalCode === null) {
      c.kill('SIGTERM'); // nspawn asks the container's systemd to power off
      await until(() => c.exitCode !== null || c.signalCode !== null, 'the container to power off', 30_000).catch(() => c.kill('SIGKILL'));
    }
    if (existsSync(this.cg)) await removeCgroupTree(this.cg);
    if (this.mounted()) execFileSync('umount', [ROOTFS]);
    if (existsSync(ROOTFS)) rmdirSync(ROOTFS);
  }
}

/** ms per iteration of body, n times, timed inside the container. */
function perOpMs(c: Container, body: string, n: number): number {
  const ns = Number(c.bash(`t0=$(date +%s%N); for i in $(seq ${n}); do ${body}; done; t1=$(date +%s%N); echo $(( (t1 - t0) / ${n} ))`));
  return ns / 1e6;
}

export async function peerBench(options: { launches: number; lines: number }): Promise<Row[]> {
  const why = cannotRun();
  if (why) {
    const rows: Row[] = [{ metric: 'peer: systemd 252 in nspawn', value: `skipped: ${why}`, baseline: '', ratio: '', target: '', met: null }];
    printTable('peer (systemd in nspawn)', rows);
    return rows;
  }
  const c = new Container();
  try {
    await c.boot();
    const n = options.launches;
    // Warm both (the first systemd-run loads units; the first sbx run socket-activates the service).
    c.bash('systemd-run --wait --pipe -q -- true; /usr/local/bin/sbx run --cwd / -- true');
    const systemdRun = perOpMs(c, 'systemd-run --wait --pipe -q -- true > /dev/null', n);
    const sbxRun = perOpMs(c, '/usr/local/bin/sbx run --cwd / -- true > /dev/null', n);
    const lib = Number(
      c.bash(
        `node --input-type=module -e "import { SupervisorClient } from '${CHECKOUT}/dist/ipc/client.js'; const c = await SupervisorClient.connect({}); const w = await c.launch({ argv: ['true'], cwd: '/' }); await c.wait({ session_id: w.session_id }); const t0 = performance.now(); for (let i = 0; i < ${n}; i++) { const l = await c.launch({ argv: ['true'], cwd: '/' }); await c.wait({ session_id: l.session_id }); } console.log((performance.now() - t0) / ${n}); c.close();"`,
      ),
    );

    // A line flood: journald under its defaults against the supervisor.
    const lines = options.lines;
    const journald = c
      .bash(
        `t0=$(date +%s%N); systemd-run --wait -q --unit=sbx-bench-flood -- seq 1 ${lines}; prev=-1; last=$(date +%s%N); for i in $(seq 200); do k=$(journalctl -q -u sbx-bench-flood.service -o cat --no-pager | wc -l); now=$(date +%s%N); if [ "$k" != "$prev" ]; then prev=$k; last=$now; elif [ $(( (now - last) / 1000000 )) -gt 1000 ]; then break; fi; sleep 0.1; done; echo "$prev $(( (last - t0) / 1000000 ))"`,
      )
      .split(' ')
      .map(Number);
    const ours = c
      .bash(`t0=$(date +%s%N); id=$(/usr/local/bin/sbx run --cwd / --detach -- seq 1 ${lines}); /usr/local/bin/sbx wait $id > /dev/null; t1=$(date +%s%N); k=$(/usr/local/bin/sbx logs $id | wc -l); echo "$k $(( (t1 - t0) / 1000000 ))"`)
      .split(' ')
      .map(Number);

    // One 4 MiB line (and its newline).
    const LINE = 4 << 20;
    const line = `head -c ${LINE} /dev/zero | tr '\\\\0' a; echo`;
    c.bash(`systemd-run --wait -q --unit=sbx-bench-longline -- sh -c "${line}"`);
    await until(() => Number(c.bash('journalctl -q -u sbx-bench-longline.service -o cat --no-pager | wc -l')) > 0, 'journald to have the long line', 30_000);
    const records = c.bash(`journalctl -q -u sbx-bench-longline.service -o cat --no-pager | awk '{ n++; if (length($0) > m) m = length($0) } END { print n, m }'`).split(' ').map(Number);
    const oursLine = c.bash(`/usr/local/bin/sbx run --cwd / -- sh -c "${line}" | awk '{ n++; if (length($0) > m) m = length($0) } END { print n, m }'`).split(' ').map(Number);

    const rows: Row[] = [
      { metric: 'launch wall: sbx run -- true', value: fmtMs(sbxRun), baseline: `systemd-run --wait --pipe: ${fmtMs(systemdRun)}`, ratio: `${(sbxRun / systemdRun).toFixed(2)}x`, target: '', met: null },
      { metric: 'launch -> receipt: client library, one connection', value: fmtMs(lib), baseline: `systemd-run --wait --pipe: ${fmtMs(systemdRun)}`, ratio: `${(lib / systemdRun).toFixed(2)}x`, target: '', met: null },
      {
        metric: `line flood: seq 1 ${lines}`,
        value: `${ours[0]} lines kept, receipt in ${fmtMs(ours[1]!)}`,
        baseline: `journald: ${journald[0]} lines kept, readable after ${fmtMs(journald[1]!)}`,
        ratio: `${(ours[0]! / Math.max(1, journald[0]!)).toFixed(1)}x lines`,
        target: '',
        met: null,
      },
      { metric: 'one 4 MiB line', value: `${oursLine[0]} record(s), longest ${oursLine[1]} bytes`, baseline: `journald: ${records[0]} records, longest ${records[1]} bytes`, ratio: '', target: '', met: null },
    ];
    printTable(`peer (systemd 252 in nspawn, ${n} launches each, timed inside)`, rows);
    writeJson('peer', { launches: n, systemd_run_ms: systemdRun, sbx_run_ms: sbxRun, client_ms: lib, flood: { lines, journald_kept: journald[0], journald_ms: journald[1], supervisor_kept: ours[0], supervisor_ms: ours[1] }, long_line: { bytes: LINE, journald_records: records[0], journald_longest: records[1], supervisor_records: oursLine[0], supervisor_longest: oursLine[1] } });
    return rows;
  } finally {
    await c.cleanUp();
  }
}
