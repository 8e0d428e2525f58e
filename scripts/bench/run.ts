// npm run bench -- [--only drain,exit_to_receipt,handoff,attribution,launch,scale,replay,long_lines,workspace,checkpoint,checkpoint_scale,peer,remote] [--quick]
// Runs the benchmarks against a supervisor of its own (temp state dir, cgroup mode as root)
// and prints each result next to its target and its same-run baseline; JSON goes to
// bench-results/<name>.json. Run by hand on an otherwise idle machine; never a timed test.
// --quick: smaller sizes and counts (a smoke run, not a measurement). Exits 1 when a target
// is missed, 2 on an error.
import { dirname } from 'node:path';
import { parseArgs } from 'node:util';
import { attributionBench } from './attribution.js';
import { checkpointScaleBench } from './checkpoint-scale.js';
import { checkpointBench } from './checkpoint.js';
import { benchDaemon, fileCostMs, fmtMs, printTable, type Row } from './common.js';
import { drainBench } from './drain.js';
import { handoffBench } from './handoff.js';
import { exitToReceiptBench, launchBench } from './latency.js';
import { peerBench } from './peer.js';
import { remoteBench } from './remote.js';
import { longLinesBench, replayBench, scaleBench } from './scale.js';
import { workspaceBench } from './workspace.js';

const ALL = [
  'drain',
  'exit_to_receipt',
  'handoff',
  'attribution',
  'launch',
  'scale',
  'replay',
  'long_lines',
  'workspace',
  'checkpoint',
  'checkpoint_scale',
  'peer',
  'remote',
] as const;

/** Prints the usage (and why, on stderr, exit 2), or just the usage (exit 0). */
function usage(error?: string): never {
  const text = `usage: npm run bench -- [--only NAME,...] [--quick]\n  NAME: ${ALL.join(', ')}\n  --quick: 0.25 GiB streams, 1 repetition, 100 sessions: a smoke run (the full targets still apply, so it usually exits 1)\n`;
  if (error) process.stderr.write(`${error}\n${text}`);
  else process.stdout.write(text);
  process.exit(error ? 2 : 0);
}

async function main(): Promise<void> {
  let values: { only?: string; quick?: boolean; help?: boolean };
  try {
    ({ values } = parseArgs({
      options: { only: { type: 'string' }, quick: { type: 'boolean', default: false }, help: { type: 'boolean', short: 'h', default: false } },
    }));
  } catch (err) {
    usage(`bench: ${(err as Error).message}`);
  }
  if (values.help) usage();
  const only = values.only ? values.only.split(',') : [...ALL];
  for (const name of only) if (!(ALL as readonly string[]).includes(name)) usage(`bench: unknown benchmark ${JSON.stringify(name)}`);
  const q = values.quick;
  const started = Date.now();
  const d = await benchDaemon();
  // Ctrl-C: stop the bench's supervisor (its sessions, cgroups and temp dir go with it).
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.once(signal, () => {
      process.stderr.write(`bench: ${signal}: stopping the bench's supervisor\n`);
      void d.stop().finally(() => process.exit(signal === 'SIGINT' ? 130 : 143));
    });
  }
  const summary: Row[] = [];
  const fsCost = fileCostMs(d.stateDir);
  summary.push({
    metric: `the state dir's file system (${fsCost.fsType}, under ${dirname(d.dir)}: $TMPDIR)`,
    value: `mkdir+create ${fmtMs(fsCost.createMs)}, fsync ${fmtMs(fsCost.fsyncMs)} a file`,
    baseline: '',
    ratio: '',
    target: '',
    met: null,
  });
  try {
    let drainBytesPerMs: number | undefined;
    if (only.includes('drain')) {
      const drain = await drainBench(d, { gib: q ? 0.25 : 2, reps: q ? 1 : 3 });
      summary.push(...drain.rows);
      drainBytesPerMs = drain.bytesPerMs;
    }
    if (only.includes('exit_to_receipt')) summary.push(...(await exitToReceiptBench(d, q ? 100 : 1000)));
    if (only.includes('handoff')) summary.push(...(await handoffBench(d, q ? 20 : 200)));
    if (only.includes('attribution'))
      summary.push(...(await attributionBench({ reps: q ? 2 : 20, sessions: q ? 40 : 400, cFiles: q ? 50 : 300, builds: q ? 2 : 6 })));
    if (only.includes('launch')) summary.push(...(await launchBench(d, q ? 20 : 200)));
    if (only.includes('replay')) summary.push(...(await replayBench(d, q ? 0.25 : 1, drainBytesPerMs)));
    if (only.includes('scale')) summary.push(...(await scaleBench(d, q ? 100 : 1000, q ? 20 : 100)));
    if (only.includes('long_lines')) summary.push(...(await longLinesBench(d, q ? [4 << 20, 64 << 20] : [4 << 20, 2 ** 30])));
    if (only.includes('checkpoint'))
      summary.push(
        ...(await checkpointBench(
          q
            ? { smallFiles: 256, smallBytes: 16384, largeFiles: 2, largeBytes: 2 << 20, reps: 1 }
            : { smallFiles: 4096, smallBytes: 16384, largeFiles: 19, largeBytes: 2 << 20, reps: 3 },
        )),
      );
    if (only.includes('checkpoint_scale')) summary.push(...(await checkpointScaleBench({ files: Number(process.env.CK_FILES ?? (q ? 10_000 : 100_000)) })));
    if (only.includes('workspace'))
      summary.push(...(await workspaceBench(d, { files: q ? 500 : 5000, totalBytes: q ? 10e6 : 100e6, reps: q ? 2 : 6, sessions: q ? 40 : 400 })));
  } finally {
    await d.stop();
  }
  // Its own supervisor (the unit in the container), after the bench's is stopped.
  if (only.includes('peer')) summary.push(...(await peerBench({ launches: q ? 5 : 50, lines: q ? 200_000 : 2_000_000 })));
  // Its own supervisor too (with the WebSocket listener on loopback).
  if (only.includes('remote')) summary.push(...(await remoteBench({ launches: q ? 50 : 500, gib: q ? 0.25 : 1 })));
  printTable(`summary (${((Date.now() - started) / 1000).toFixed(0)} s)`, summary);
  const missed = summary.filter((r) => r.met === false).length;
  process.stdout.write(`\n${missed === 0 ? 'every target met' : `${missed} target(s) missed`}\n`);
  process.exitCode = missed === 0 ? 0 : 1;
}

main().catch((err) => {
  process.stderr.write(`bench: ${(err as Error).stack}\n`);
  process.exit(2);
});
