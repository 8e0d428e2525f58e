// exit_to_receipt and launch: what a short command costs around it.
// - exit_to_receipt: 1,000 short sessions one after another, each `date +%s%N`, whose last act
//   is to print the wall clock (ns) before it exits. From that time to the moment the client
//   holds the fsync'ed receipt (wait() resolves): the leader's exit and reaping included, so
//   never less than exit -> receipt. Also from the receipt's leader_exited_at (taken when it is
//   reaped, ms resolution: +0.5 ms on average), and from the launch request.
// - launch: launch request to exec, measured by the command itself (`date +%s%N` prints the
//   wall clock once exec'd), against child_process.spawn of the same command in this
//   process; and `sbx run -- true` against `node -e 0` (both whole processes).
import { execFileSync, spawn } from 'node:child_process';
import { join, resolve } from 'node:path';
import type { TestDaemon } from '../../test/helpers/daemon.js';
import { connect, distribution, durableFloors, fmtMs, histogram, median, nowMs, printTable, type Row, writeJson } from './common.js';

const ROOT = resolve(import.meta.dirname, '../..');

export async function exitToReceiptBench(d: TestDaemon, sessions: number): Promise<Row[]> {
  const client = await connect(d);
  const exitToReceipt: number[] = [];
  const reapedToReceipt: number[] = [];
  const launchToReceipt: number[] = [];
  try {
    for (let i = 0; i < sessions; i++) {
      const t0 = nowMs();
      const { session_id } = await client.launch({ argv: ['date', '+%s%N'], cwd: '/' });
      const r = await client.wait({ session_id });
      const t1 = nowMs();
      if (r.outcome !== 'exited' || r.exit.code !== 0) throw new Error(`exit_to_receipt: session ${session_id} ended ${r.outcome} ${JSON.stringify(r.exit)}`);
      launchToReceipt.push(t1 - t0);
      exitToReceipt.push(t1 - execAt(await client.read({ session_id }, 'stdout'), 0));
      reapedToReceipt.push(t1 - Date.parse(r.leader_exited_at!));
    }
  } finally {
    client.close();
  }
  const e = distribution(exitToReceipt);
  const reaped = distribution(reapedToReceipt);
  const l = distribution(launchToReceipt);
  const floor = (await durableFloors(d.stateDir, Math.min(sessions, 300))).receipt;
  const bounds = [1, 2, 3, 4, 5, 7, 10, 15, 20, 50];
  process.stdout.write(
    `\n### exit_to_receipt (${sessions} sessions of \`date +%s%N\`)\n\nthe command's last act (its clock printed) -> fsync'ed receipt at the client:\n${histogram(exitToReceipt, bounds)}\n\nlaunch request -> receipt:\n${histogram(launchToReceipt, bounds)}\n`,
  );
  const rows: Row[] = [
    { metric: 'exit -> receipt p50', value: fmtMs(e.p50), baseline: '', ratio: '', target: '<= 2 ms', met: e.p50 <= 2 },
    { metric: 'exit -> receipt p99', value: fmtMs(e.p99), baseline: '', ratio: '', target: '<= 6 ms', met: e.p99 <= 6 },
    { metric: 'exit -> receipt p90 / max', value: `${fmtMs(e.p90)} / ${fmtMs(e.max)}`, baseline: '', ratio: '', target: '', met: null },
    {
      metric: "from the receipt's leader_exited_at (ms resolution), p50 / p99",
      value: `${fmtMs(reaped.p50)} / ${fmtMs(reaped.p99)}`,
      baseline: '',
      ratio: '',
      target: '',
      met: null,
    },
    {
      metric: "the receipt's fsyncs alone (streams' index+dir at once, then receipt+link+dir), p50 / p99",
      value: `${fmtMs(floor.p50)} / ${fmtMs(floor.p99)}`,
      baseline: '',
      ratio: '',
      target: '',
      met: null,
    },
    {
      metric: 'launch -> receipt p50 / p90 / p99 / max',
      value: `${fmtMs(l.p50)} / ${fmtMs(l.p90)} / ${fmtMs(l.p99)} / ${fmtMs(l.max)}`,
      baseline: '',
      ratio: '',
      target: '',
      met: null,
    },
  ];
  printTable('exit_to_receipt', rows);
  writeJson('exit_to_receipt', {
    exit_to_receipt_ms: e,
    reaped_to_receipt_ms: reaped,
    launch_to_receipt_ms: l,
    receipt_fsyncs_alone_ms: floor,
    samples: { exit_to_receipt: exitToReceipt, reaped_to_receipt: reapedToReceipt, launch_to_receipt: launchToReceipt },
  });
  return rows;
}

/** ms from t0 (wall clock) to the time `date +%s%N` printed. */
const execAt = (out: Buffer | string, t0: number) => Number(BigInt(String(out).trim()) / 1000n) / 1000 - t0;

export async function launchBench(d: TestDaemon, runs: number): Promise<Row[]> {
  const client = await connect(d);
  const viaSupervisor: number[] = [];
  const viaSpawn: number[] = [];
  try {
    for (let i = 0; i < runs; i++) {
      let t0 = nowMs();
      const out = await new Promise<Buffer>((res, rej) => {
        const c = spawn('date', ['+%s%N'], { stdio: ['ignore', 'pipe', 'ignore'] });
        const parts: Buffer[] = [];
        c.stdout.on('data', (b: Buffer) => parts.push(b));
        c.on('error', rej);
        c.on('close', () => res(Buffer.concat(parts)));
      });
      viaSpawn.push(execAt(out, t0));
      t0 = nowMs();
      const { session_id } = await client.launch({ argv: ['date', '+%s%N'], cwd: '/' });
      await client.wait({ session_id });
      viaSupervisor.push(execAt(await client.read({ session_id }, 'stdout'), t0));
    }
  } finally {
    client.close();
  }
  const sbx = join(ROOT, 'dist/cli/sbx'); // the bin as users run it: the launcher and its bundle
  const sbxRuns: number[] = [];
  const nodeRuns: number[] = [];
  for (let i = 0; i < Math.min(runs, 30); i++) {
    let t0 = nowMs();
    execFileSync(process.execPath, ['-e', '0']);
    nodeRuns.push(nowMs() - t0);
    t0 = nowMs();
    execFileSync(sbx, ['run', '--', 'true'], { env: { ...process.env, SBX_SOCKET: d.socketPath } });
    sbxRuns.push(nowMs() - t0);
  }
  const s = median(viaSupervisor);
  const b = median(viaSpawn);
  const floor = (await durableFloors(d.stateDir, Math.max(runs, 50))).launch;
  const x = median(sbxRuns);
  const n = median(nodeRuns);
  const rows: Row[] = [
    {
      metric: `launch request -> exec (median of ${runs})`,
      value: fmtMs(s),
      baseline: `child_process.spawn: ${fmtMs(b)}`,
      ratio: `${(s / b).toFixed(2)}x`,
      target: '<= 1.3x',
      met: s / b <= 1.3,
    },
    {
      metric: "the launch's records alone (admission: fsync, link, 2 dir fsyncs; key record unsynced), p50 / p99",
      value: `${fmtMs(floor.p50)} / ${fmtMs(floor.p99)}`,
      baseline: `spawn + these: ${fmtMs(b + floor.p50)}`,
      ratio: `${((b + floor.p50) / b).toFixed(2)}x`,
      target: '',
      met: null,
    },
    {
      metric: `sbx run -- true, wall (median of ${sbxRuns.length})`,
      value: fmtMs(x),
      baseline: `node -e 0: ${fmtMs(n)}`,
      ratio: `${(x / n).toFixed(2)}x`,
      target: '<= 1.3x',
      met: x / n <= 1.3,
    },
  ];
  printTable('launch', rows);
  writeJson('launch', {
    records_alone_ms: floor,
    supervisor_launch_to_exec_ms: viaSupervisor,
    spawn_to_exec_ms: viaSpawn,
    sbx_run_true_ms: sbxRuns,
    node_e_0_ms: nodeRuns,
  });
  return rows;
}
