// The naive targets: each case run by scripts/probes/targets/naive-node.mjs or
// naive-python.py (a stream-shaped path as agent runtimes commonly build it), observed from
// outside: what the runner reported, whether it ever reported (a harness watchdog ends runs
// that hang), which processes of the run are alive after it said "done", how many zombies
// it left, and its peak RSS. Every process of the run is then SIGKILLed by the pids found
// through the run's environment marker, so a misbehaving target leaves nothing behind.
import { type ChildProcess, execSync, spawn } from 'node:child_process';
import { join, resolve } from 'node:path';
import { type FieldCase, type Observation, describeObservation, executions, judge, releaseRuns, runEnv } from './field-cases.js';
import { peakRssKb, pidsWithMark } from './procs.js';

export type NaiveTarget = 'naive-node' | 'naive-python';

export interface NaiveResult {
  id: string;
  target: NaiveTarget;
  /** null: the probe does not apply to this target (the reason is in `observed`). */
  ok: boolean | null;
  observed: string;
  failures: string[];
  peakRssKb: number;
}

/**
 * Zombie accounting for the harness process when it is a child subreaper
 * (prctl PR_SET_CHILD_SUBREAPER; it then stands for a container init that does not reap):
 * orphans of a naive run are reparented to it and counted before being reaped.
 */
export interface ZombieAccount {
  /** Zombie children that are not the harness's own spawned children. */
  zombies(): number[];
  /** Records a child spawned through child_process (libuv reaps it, never us). */
  track(pid: number): void;
  reapNow(): number;
}

const TARGETS = resolve(import.meta.dirname, 'targets');
const poll = (ms = 20) => new Promise((r) => setTimeout(r, ms));

interface RunnerReport {
  leader_pid: number | null;
  stdout_bytes: number;
  stdout_sha256: string;
  stdout_newlines: number;
  stderr_bytes: number;
  stderr_sha256: string;
  exit_code: number | null;
  signal: number | null;
  timed_out: boolean;
  wall_ms: number;
  peak_rss_kb: number;
  error?: string;
}

interface NaiveRun {
  o: Observation;
  zombies: number;
  peakRssKb: number;
  counter: number;
}

function runner(target: NaiveTarget, c: FieldCase, env: Record<string, string>): ChildProcess {
  const request = JSON.stringify({ command: c.command, timeout_ms: c.timeout_ms, stdin: c.stdin === null ? null : Buffer.from(c.stdin).toString('base64') });
  const [cmd, script] = target === 'naive-node' ? [process.execPath, 'naive-node.mjs'] : ['python3', 'naive-python.py'];
  // stdin is a pipe this harness holds open and never writes: what a runtime's own stdin
  // usually is, inherited by naive-python's child.
  return spawn(cmd, [join(TARGETS, script), request], { env: { ...process.env, ...env }, stdio: ['pipe', 'pipe', 'pipe'] });
}

/** One run of a case by a naive target; `killAfterFirstLine` SIGKILLs the runner (the owner) then. */
async function runOnce(target: NaiveTarget, c: FieldCase, account: ZombieAccount | null, killAfterFirstLine = false): Promise<NaiveRun> {
  const { marker, counter, env } = runEnv(c);
  const child = runner(target, c, env);
  account?.track(child.pid!);
  const out: Buffer[] = [];
  let err = '';
  let peak = 0;
  child.stdout!.on('data', (d: Buffer) => out.push(d));
  const firstLine = new Promise<void>((res) => {
    child.stderr!.on('data', (d: Buffer) => {
      err += d.toString();
      if (err.includes('first-line\n')) res();
    });
  });
  const exited = new Promise<void>((res) => child.on('close', () => res()));
  const t0 = Date.now();
  const watchdogMs = Math.max(c.timeout_ms + 5000, 10_000);
  let ended = 'done' as 'done' | 'hung' | 'owner-killed';
  const watchdog = setTimeout(() => {
    ended = 'hung';
    peak = peakRssKb(child.pid!);
    child.kill('SIGKILL');
  }, watchdogMs);
  if (killAfterFirstLine) {
    await Promise.race([firstLine, exited]);
    if (child.exitCode === null) {
      ended = 'owner-killed';
      peak = peakRssKb(child.pid!);
      child.kill('SIGKILL');
    }
  }
  await exited;
  clearTimeout(watchdog);
  const wallMs = Date.now() - t0;
  const alive = pidsWithMark(marker).length;
  const zombies = account ? account.zombies().length : 0;
  const runs = executions(counter);
  await releaseRuns(() => account?.reapNow());
  // Orphans of the run that were zombies already, or became zombies when killed.
  for (const deadline = Date.now() + 5000; account && account.zombies().length > 0 && Date.now() < deadline; await poll()) account.reapNow();
  const empty = {
    stdout: { bytes: 0, sha256: '', newlines: 0 },
    stderr: { bytes: 0, sha256: '' },
    exitCode: null,
    signal: null,
    timedOut: false,
    evidence: null,
    outcome: null,
    incomplete: [],
  };
  if (ended !== 'done') {
    const error =
      ended === 'hung' ? `no end after ${(watchdogMs / 1000).toFixed(0)} s (harness watchdog)` : 'owner SIGKILLed: exit status and the rest of the output lost';
    return { o: { ...empty, wallMs, alive, error }, zombies, peakRssKb: peak, counter: runs };
  }
  let report: RunnerReport;
  try {
    report = JSON.parse(Buffer.concat(out).toString()) as RunnerReport;
  } catch {
    return { o: { ...empty, wallMs, alive, error: `runner failed: ${err.trim().split('\n').pop()}` }, zombies, peakRssKb: peak, counter: runs };
  }
  return {
    o: {
      stdout: { bytes: report.stdout_bytes, sha256: report.stdout_sha256, newlines: report.stdout_newlines },
      stderr: { bytes: report.stderr_bytes, sha256: report.stderr_sha256 },
      exitCode: report.exit_code,
      signal: report.signal,
      timedOut: report.timed_out,
      wallMs: report.wall_ms,
      evidence: null,
      outcome: null,
      alive,
      incomplete: [],
      ...(report.error ? { error: report.error } : {}),
    },
    zombies,
    peakRssKb: report.peak_rss_kb,
    counter: runs,
  };
}

/** Runs one case by a naive target, as the supervisor target would, and judges it. */
export async function runNaiveCase(
  target: NaiveTarget,
  c: FieldCase,
  account: ZombieAccount | null,
  options: { repeatScale?: number } = {},
): Promise<NaiveResult> {
  const e = c.expect;
  const na = (why: string): NaiveResult => ({ id: c.id, target, ok: null, observed: why, failures: [], peakRssKb: 0 });
  if (e.reader_disconnect_at_byte !== undefined) return na('n/a: no cursor, a stream reader cannot resume');
  if (e.kill_supervisor_after_output) return na('n/a: no supervisor, the runner is the owner (see the client SIGKILL row)');
  if (e.setup_command) execSync(e.setup_command, { shell: '/bin/sh', stdio: 'ignore' });
  try {
    const result = (r: NaiveRun, failures: string[], note?: string): NaiveResult => {
      const observed = [note, describeObservation(r.o), `peak RSS ${(r.peakRssKb / 1024).toFixed(0)} MB`].filter(Boolean).join('; ');
      return { id: c.id, target, ok: failures.length === 0, observed, failures, peakRssKb: r.peakRssKb };
    };
    if (e.kill_client_after_output) {
      const r = await runOnce(target, c, account, true);
      return result(r, judge(c, r.o), 'runner SIGKILLed mid-run');
    }
    if (e.submissions) {
      // No key: every submission of a retried request is a new execution.
      const runs: NaiveRun[] = [];
      for (let i = 0; i < e.submissions; i++) runs.push(await runOnce(target, c, account));
      const counted = c.command.includes('SBX_PROBE_COUNTER') ? runs.reduce((n, r) => n + r.counter, 0) : runs.length;
      const f = judge(c, { ...runs[0]!.o, wallMs: 0 });
      if (counted !== e.executions) f.push(`${counted} executions, expected ${e.executions}`);
      return result(runs[0]!, f, `${e.submissions} submissions, ${counted} executions`);
    }
    const n = e.repeat ? Math.max(1, Math.round(e.repeat * (options.repeatScale ?? 1))) : 1;
    const digests = new Set<string>();
    let last: NaiveRun | null = null;
    let f: string[] = [];
    for (let i = 0; i < n && f.length === 0; i++) {
      last = await runOnce(target, c, account);
      f = judge(c, last.o);
      digests.add(last.o.stdout.sha256);
    }
    if (e.identical_runs && digests.size !== 1) f.push(`${digests.size} different outputs over ${n} runs`);
    if (e.zombies_after !== undefined && account && last!.zombies > e.zombies_after) f.push(`${last!.zombies} zombies left`);
    return result(last!, f, n > 1 ? `${n} runs, ${digests.size} distinct` : undefined);
  } finally {
    if (e.teardown_command) execSync(e.teardown_command, { shell: '/bin/sh', stdio: 'ignore' });
  }
}
