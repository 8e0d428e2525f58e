// The case format (docs/reference/field-cases.md), the judge that checks one observation against
// a case's expected facts, and the sandbox-supervisor target: every case through the client
// library and through sbx (and with a pty for the pty kind), plus the probe-only facts
// (client SIGKILLed mid-run, supervisor SIGKILLed and restarted). scripts/probes/run.ts is
// the command line (`npm run probes`); test/e2e/field-cases.test.ts runs the cases in CI.
import { execSync, spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { z } from 'zod';
import { SupervisorClient } from '../../ipc/client.js';
import type { LaunchParams, Receipt } from '../../ipc/protocol.js';
import { runSbx, SBX, type TestDaemon, zombieChildren } from '../../test/helpers/daemon.js';
import { killMarked, MARK_VAR, pidsWithMark, rssKb } from './procs.js';

export interface FieldCase {
  id: string;
  kind: string;
  command: string;
  stdin: string | null;
  timeout_ms: number;
  /** Facts of docs/reference/field-cases.md, plus the probe-only ones in scripts/probes/probes.ts. */
  expect: Record<string, any>;
  /** A line for the table (probes only). */
  title?: string;
}

/** What one run of a case showed, whichever target ran it. */
export interface Observation {
  stdout: { bytes: number; sha256: string; newlines: number };
  stderr: { bytes: number; sha256: string };
  exitCode: number | null;
  signal: number | null;
  timedOut: boolean;
  /** From launch to receipt (supervisor) or to "done" (naive targets), ms. */
  wallMs: number;
  /** Receipt death evidence; null for the naive targets (they have none). */
  evidence: string | null;
  /** Receipt outcome; null for the naive targets. */
  outcome: string | null;
  /** Processes of the run still alive once it was reported over. */
  alive: number;
  /** Streams the receipt marked incomplete, with their reason. */
  incomplete: string[];
  /** Set when the run was not comparable at all (hung, crashed, owner gone). */
  error?: string;
}

export interface CaseResult {
  id: string;
  via: 'client' | 'sbx' | 'client+pty';
  ok: boolean;
  wallMs: number;
  observed: string;
  failures: string[];
}

export interface RunOptions {
  /** Scales `repeat` counts (e.g. 0.1 for a quick pass). */
  repeatScale?: number;
  /** The supervisor behind socketPath, when this process owns it (needed to SIGKILL it). */
  daemon?: TestDaemon;
  /** Called between polls; a subreaper harness reaps reparented orphans here. */
  reap?: () => void;
}

export const GRACE_MS = 1000;
export const SLACK_MS = 1000;
export const sha256 = (b: Uint8Array | string) => createHash('sha256').update(b).digest('hex');
export const signalNumbers: Record<string, number> = {
  SIGHUP: 1,
  SIGINT: 2,
  SIGQUIT: 3,
  SIGKILL: 9,
  SIGUSR1: 10,
  SIGSEGV: 11,
  SIGUSR2: 12,
  SIGPIPE: 13,
  SIGALRM: 14,
  SIGTERM: 15,
};
const EMPTY_SHA256 = sha256('');
const poll = (ms = 20) => new Promise((r) => setTimeout(r, ms));

const sha = z.string().regex(/^[0-9a-f]{64}$/, 'a SHA-256 in hex');
const count = z.number().int().min(0);
/** The case format of docs/reference/field-cases.md, plus the probe-only facts; unknown keys are errors. */
const CaseSchema = z.strictObject({
  id: z.string().regex(/^[A-Za-z0-9._-]+$/, 'letters, digits, dot, dash, underscore'),
  kind: z.string(),
  title: z.string().optional(),
  fast: z.boolean().optional(),
  command: z.string().min(1),
  stdin: z.string().nullable(),
  timeout_ms: z.number().int().positive(),
  expect: z.strictObject({
    stdout_bytes: count.optional(),
    stdout_sha256: sha.optional(),
    stderr_bytes: count.optional(),
    stderr_sha256: sha.optional(),
    stdout_newlines: count.optional(),
    exit_code: z.number().int().nullable().optional(),
    signal: z.number().int().nullable().optional(),
    timed_out: z.boolean().optional(),
    min_wall_ms: count.optional(),
    max_wall_ms: count.optional(),
    descendants_dead: z.boolean().optional(),
    zombies_after: count.optional(),
    repeat: z.number().int().positive().optional(),
    identical_runs: count.optional(),
    reader_disconnect_at_byte: count.optional(),
    reader_pause_ms: count.optional(),
    reader_resume_cursor: count.optional(),
    reader_concat_sha256: sha.optional(),
    setup_command: z.string().optional(),
    teardown_command: z.string().optional(),
    retry_test: z.string().optional(),
    submissions: z.number().int().positive().optional(),
    same_idempotency_key: z.boolean().optional(),
    executions: count.optional(),
    max_supervisor_rss_growth_mb: z.number().positive().optional(),
    kill_client_after_output: z.boolean().optional(),
    kill_supervisor_after_output: z.boolean().optional(),
    outcome: z.string().optional(),
    allow_incomplete: z.boolean().optional(),
  }),
});

/** One case checked against the format; throws listing every problem. */
export function parseCase(value: unknown): FieldCase {
  const r = CaseSchema.safeParse(value);
  if (!r.success) throw new Error(r.error.issues.map((x) => `${x.path.join('.') || '(case)'}: ${x.message}`).join('; '));
  return r.data as FieldCase;
}

/** The cases of a JSONL file, each checked against the format; throws naming the line. */
export function loadCases(file: string): FieldCase[] {
  const cases: FieldCase[] = [];
  readFileSync(file, 'utf8')
    .split('\n')
    .forEach((line, i) => {
      if (!line.trim()) return;
      let value: unknown;
      try {
        value = JSON.parse(line);
      } catch (err) {
        throw new Error(`${file}:${i + 1}: not JSON: ${(err as Error).message}`);
      }
      try {
        cases.push(parseCase(value));
      } catch (err) {
        throw new Error(`${file}:${i + 1}: ${(err as Error).message}`);
      }
    });
  if (cases.length === 0) throw new Error(`${file}: no cases`);
  return cases;
}

/** Runs started and not yet released: marker -> execution counter file. */
const activeRuns = new Map<string, string>();

/** A fresh marker and execution counter file for one run of a case (released by releaseRuns). */
export function runEnv(c: FieldCase): { marker: string; counter: string; env: Record<string, string> } {
  const marker = `${c.id}-${randomBytes(6).toString('hex')}`;
  const counter = join(tmpdir(), `sbx-probe-${marker}.count`);
  activeRuns.set(marker, counter);
  return { marker, counter, env: { [MARK_VAR]: marker, SBX_PROBE_COUNTER: counter } };
}

/**
 * SIGKILLs what is left of every run not yet released (by the pids carrying its marker) and
 * removes its counter file; `reap` is called between polls. Returns how many were killed.
 */
export async function releaseRuns(reap?: () => void): Promise<number> {
  let killed = 0;
  for (const [marker, counter] of activeRuns) {
    killed += await killMarked(marker, reap);
    rmSync(counter, { force: true });
    activeRuns.delete(marker);
  }
  return killed;
}

/** Lines in the execution counter a probe's command appends to ("$SBX_PROBE_COUNTER"). */
export function executions(counter: string): number {
  try {
    return readFileSync(counter, 'utf8').split('\n').filter(Boolean).length;
  } catch {
    return 0;
  }
}

/** The case's stated facts checked against one observation; returns what failed. */
export function judge(c: FieldCase, o: Observation, opts: { pty?: boolean } = {}): string[] {
  const e = c.expect;
  const f: string[] = [];
  if (o.error) f.push(o.error);
  // An empty digest means the target never reported its streams (hung, or its owner died).
  const known = o.stdout.sha256 !== '';
  if (!known) {
    // nothing to compare
  } else if (e.stdout_bytes !== undefined && o.stdout.bytes !== e.stdout_bytes) f.push(`stdout ${o.stdout.bytes} of ${e.stdout_bytes} bytes`);
  else if (e.stdout_sha256 && o.stdout.sha256 !== e.stdout_sha256)
    f.push(`stdout sha256 ${o.stdout.sha256.slice(0, 12)}..., expected ${e.stdout_sha256.slice(0, 12)}...`);
  if (known && !opts.pty) {
    if (e.stderr_bytes !== undefined && o.stderr.bytes !== e.stderr_bytes) f.push(`stderr ${o.stderr.bytes} of ${e.stderr_bytes} bytes`);
    else if (e.stderr_sha256 && o.stderr.sha256 !== e.stderr_sha256)
      f.push(`stderr sha256 ${o.stderr.sha256.slice(0, 12)}..., expected ${e.stderr_sha256.slice(0, 12)}...`);
  }
  if (known && e.stdout_newlines !== undefined && o.stdout.newlines !== e.stdout_newlines)
    f.push(`${o.stdout.newlines} newlines, expected ${e.stdout_newlines}`);
  if (!o.error) {
    if ('timed_out' in e && o.timedOut !== e.timed_out) f.push(e.timed_out ? 'deadline not enforced' : 'reported a timeout');
    else {
      if ('exit_code' in e && o.exitCode !== e.exit_code) f.push(`exit code ${o.exitCode}, expected ${e.exit_code}`);
      if ('signal' in e && o.signal !== e.signal) f.push(`signal ${o.signal}, expected ${e.signal}`);
    }
  }
  if (e.min_wall_ms !== undefined && o.wallMs < e.min_wall_ms) f.push(`wall ${o.wallMs} ms < min ${e.min_wall_ms}`);
  if (e.max_wall_ms !== undefined && o.wallMs > e.max_wall_ms + SLACK_MS) f.push(`wall ${o.wallMs} ms > max ${e.max_wall_ms} (+${SLACK_MS} slack)`);
  if (e.descendants_dead) {
    if (o.alive > 0) f.push(`${o.alive} process${o.alive > 1 ? 'es' : ''} left alive`);
    if (o.evidence !== null && !['cgroup_empty', 'subreaper_reaped'].includes(o.evidence)) f.push(`death evidence ${o.evidence}`);
  }
  if (e.outcome !== undefined && o.outcome !== e.outcome) f.push(`outcome ${o.outcome ?? 'none'}, expected ${e.outcome}`);
  if (!e.allow_incomplete) for (const s of o.incomplete) f.push(`${s} incomplete`);
  return f;
}

/** One line of what a run showed. */
export function describeObservation(o: Observation): string {
  const status = o.signal !== null ? `signal ${o.signal}` : o.exitCode !== null ? `exit ${o.exitCode}` : 'no exit status';
  const parts = [
    o.stdout.sha256 === '' ? '' : `${o.stdout.bytes} B out`,
    status,
    o.timedOut ? 'timed out' : '',
    `${(o.wallMs / 1000).toFixed(2)} s`,
    `${o.alive} alive`,
  ];
  if (o.evidence) parts.push(o.outcome && o.outcome !== 'exited' && o.outcome !== 'timed_out' ? `${o.outcome}/${o.evidence}` : o.evidence);
  return parts.filter(Boolean).join(', ');
}

function observe(stdout: Buffer, stderr: Buffer, receipt: Receipt, wallMs: number, alive: number, pty: boolean): Observation {
  // A pty turns \n into \r\n: compare with that undone (docs/reference/field-cases.md).
  const out = pty ? Buffer.from(stdout.toString('latin1').replaceAll('\r\n', '\n'), 'latin1') : stdout;
  const sig = receipt.exit.signal;
  return {
    stdout: { bytes: out.length, sha256: sha256(out), newlines: out.filter((b) => b === 10).length },
    stderr: { bytes: stderr.length, sha256: stderr.length ? sha256(stderr) : EMPTY_SHA256 },
    exitCode: receipt.exit.code,
    signal: sig === null || sig === undefined ? null : (signalNumbers[sig] ?? Number(sig)),
    timedOut: receipt.outcome === 'timed_out',
    wallMs,
    evidence: receipt.death.evidence,
    outcome: receipt.outcome,
    alive,
    incomplete: Object.entries(receipt.output)
      .filter(([, s]) => !s!.complete)
      .map(([n, s]) => `${n} (${s!.reason})`),
  };
}

/**
 * A case's run is over when nothing of it runs (descendants_dead): the harness asks for linger
 * kill, not the default handoff (which would keep leftovers running as a service), and through
 * sbx for -q, so sbx's stderr is the command's own, byte for byte.
 */
const RUN_OVER = { linger: 'kill' } as const;

function launchRequest(c: FieldCase, env: Record<string, string>, extra: Partial<LaunchParams> = {}): LaunchParams {
  return { argv: ['/bin/sh', '-c', c.command], cwd: '/', env, timeout_ms: c.timeout_ms, grace_ms: GRACE_MS, ...RUN_OVER, ...extra };
}

async function settled(session_id: string, client: SupervisorClient, t0: number, marker: string, pty = false): Promise<Observation> {
  const receipt = await client.wait({ session_id });
  const wallMs = Date.now() - t0;
  const alive = pidsWithMark(marker).length; // the receipt is written only once the cgroup is empty
  const stdout = await client.read({ session_id }, pty ? 'pty' : 'stdout');
  const stderr = pty ? Buffer.alloc(0) : await client.read({ session_id }, 'stderr');
  return observe(stdout, stderr, receipt, wallMs, alive, pty);
}

async function viaClient(socketPath: string, c: FieldCase, pty: boolean): Promise<Observation> {
  const { marker, env } = runEnv(c);
  const client = await SupervisorClient.connect({ socketPath, clientName: 'probes' });
  try {
    const t0 = Date.now();
    const { session_id } = await client.launch(launchRequest(c, env, { stdin: c.stdin !== null, ...(pty ? { pty: {} } : {}), invocation_key: marker }));
    if (c.stdin !== null) await client.request('write', { session_id, data: Buffer.from(c.stdin), offset: 0, eof: true });
    return await settled(session_id, client, t0, marker, pty);
  } finally {
    client.close();
  }
}

function sbxArgs(c: FieldCase, env: Record<string, string>, extra: string[]): string[] {
  const envArgs = Object.entries(env).flatMap(([k, v]) => ['--env', `${k}=${v}`]);
  return [
    'run',
    '--cwd',
    '/',
    '--timeout',
    `${c.timeout_ms}ms`,
    '--grace',
    `${GRACE_MS}ms`,
    '--linger',
    RUN_OVER.linger,
    '-q',
    ...envArgs,
    ...extra,
    '--',
    '/bin/sh',
    '-c',
    c.command,
  ];
}

async function viaSbx(socketPath: string, c: FieldCase): Promise<Observation> {
  const { marker, env } = runEnv(c);
  const receiptPath = join(tmpdir(), `sbx-probe-${marker}.json`);
  const t0 = Date.now();
  try {
    const { stdout, stderr } = await runSbx(socketPath, sbxArgs(c, env, ['--receipt', receiptPath, ...(c.stdin !== null ? ['--stdin'] : [])]), {
      input: c.stdin ?? '',
    });
    const wallMs = Date.now() - t0;
    const receipt = JSON.parse(readFileSync(receiptPath, 'utf8')) as Receipt;
    return observe(stdout, stderr, receipt, wallMs, pidsWithMark(marker).length, false);
  } finally {
    rmSync(receiptPath, { force: true });
  }
}

/** `sbx run --key K` SIGKILLed after its first output byte; the session is then found by its key. */
async function clientKilled(socketPath: string, c: FieldCase): Promise<{ o: Observation; f: string[] }> {
  const { marker, env } = runEnv(c);
  const t0 = Date.now();
  const child = spawn(process.execPath, [SBX, ...sbxArgs(c, env, ['--key', marker])], {
    env: { ...process.env, SBX_SOCKET: socketPath },
    stdio: ['ignore', 'pipe', 'ignore'],
  });
  const closed = new Promise((r) => child.on('close', r));
  await new Promise<void>((res) => {
    child.stdout!.once('data', () => res());
    child.once('close', () => res());
  });
  child.kill('SIGKILL');
  await closed;
  const client = await SupervisorClient.connect({ socketPath, clientName: 'probes' });
  try {
    const again = await client.launch(launchRequest(c, env, { invocation_key: marker }));
    const o = await settled(again.session_id, client, t0, marker);
    return { o, f: again.existing ? [] : ['the key did not find the session'] };
  } finally {
    client.close();
  }
}

/** The supervisor SIGKILLed after the session's first output byte, then restarted. */
async function supervisorKilled(daemon: TestDaemon, c: FieldCase, reap: () => void): Promise<{ o: Observation; f: string[] }> {
  const { marker, env, counter } = runEnv(c); // the counter goes with releaseRuns()
  const f: string[] = [];
  const t0 = Date.now();
  let client = await SupervisorClient.connect({ socketPath: daemon.socketPath, clientName: 'probes' });
  const first = await client.launch(launchRequest(c, env, { invocation_key: marker }));
  const deadline = Date.now() + 10_000;
  while ((await client.read({ session_id: first.session_id }, 'stdout')).length === 0) {
    if (Date.now() > deadline) throw new Error('no output within 10 s');
    await poll();
  }
  client.close();
  await daemon.kill9();
  const orphaned = pidsWithMark(marker).length; // still running, with nobody supervising
  await daemon.start();
  client = await SupervisorClient.connect({ socketPath: daemon.socketPath, clientName: 'probes' });
  try {
    const again = await client.launch(launchRequest(c, env, { invocation_key: marker }));
    if (!again.existing || again.session_id !== first.session_id) f.push('the retry after the restart was not the same session');
    const waiting = settled(first.session_id, client, t0, marker);
    const reaping = setInterval(reap, 20);
    const o = await waiting.finally(() => clearInterval(reaping));
    if (orphaned === 0) f.push('the session was not running when the supervisor died');
    const runs = executions(counter);
    if (c.expect.executions !== undefined && runs !== c.expect.executions) f.push(`${runs} executions, expected ${c.expect.executions}`);
    return { o, f };
  } finally {
    client.close();
  }
}

/** The same launch submitted n times with one key, each answer dropped: one execution. */
async function retried(socketPath: string, c: FieldCase): Promise<{ o: Observation; f: string[]; note: string }> {
  const { marker, env, counter } = runEnv(c); // the counter goes with releaseRuns()
  const ids = new Set<string>();
  let spawned = 0;
  const t0 = Date.now();
  for (let i = 0; i < c.expect.submissions; i++) {
    const client = await SupervisorClient.connect({ socketPath });
    const r = await client.launch(launchRequest(c, env, { invocation_key: marker }));
    client.close(); // the answer is dropped
    ids.add(r.session_id);
    if (!r.existing) spawned++;
  }
  const client = await SupervisorClient.connect({ socketPath });
  const o = await settled([...ids][0]!, client, t0, marker);
  client.close();
  const counted = executions(counter);
  const runs = c.command.includes('SBX_PROBE_COUNTER') ? counted : spawned;
  const f = ids.size === 1 && runs === c.expect.executions ? [] : [`${runs} executions over ${ids.size} sessions, expected ${c.expect.executions}`];
  return { o, f, note: `${c.expect.submissions} submissions, ${runs} execution${runs === 1 ? '' : 's'}` };
}

/** A follower that disconnects at byte N, pauses, and resumes from cursor M. */
async function resumed(socketPath: string, c: FieldCase): Promise<{ o: Observation; f: string[]; note: string }> {
  const e = c.expect;
  const { marker, env } = runEnv(c);
  const client = await SupervisorClient.connect({ socketPath });
  const t0 = Date.now();
  const { session_id } = await client.launch(launchRequest(c, env));
  const head: Buffer[] = [];
  await new Promise<void>((res) => {
    void client.subscribe(
      { session_id, stream: 'stdout', from: 0, follow: true },
      {
        onOutput: (ev) => {
          head.push(Buffer.from(ev.data));
          if (Buffer.concat(head).length >= e.reader_disconnect_at_byte) {
            client.close();
            res();
          }
        },
        onEnd: () => res(),
      },
    );
  });
  await new Promise((r) => setTimeout(r, e.reader_pause_ms ?? 0)); // the case's own pause
  const second = await SupervisorClient.connect({ socketPath });
  try {
    const tail: Buffer[] = [];
    await new Promise<void>((res) => {
      void second.subscribe(
        { session_id, stream: 'stdout', from: e.reader_resume_cursor, follow: true },
        { onOutput: (ev) => tail.push(Buffer.from(ev.data)), onEnd: () => res() },
      );
    });
    const o = await settled(session_id, second, t0, marker);
    const concat = Buffer.concat([Buffer.concat(head).subarray(0, e.reader_resume_cursor), ...tail]);
    const f = sha256(concat) === e.reader_concat_sha256 ? [] : ['the resumed reader did not get exactly the log'];
    return { o, f, note: `${concat.length} B across a reconnect` };
  } finally {
    second.close();
  }
}

async function zombiesSettled(supervisorPid: number, allowed: number): Promise<number> {
  const deadline = Date.now() + 5000;
  while (zombieChildren(supervisorPid).length > allowed && Date.now() < deadline) await poll();
  return zombieChildren(supervisorPid).length;
}

/** Runs one case every way that applies against a supervisor; one result per way. */
export async function runCase(socketPath: string, supervisorPid: number, c: FieldCase, options: RunOptions = {}): Promise<CaseResult[]> {
  const e = c.expect;
  const results: CaseResult[] = [];
  const record = (via: CaseResult['via'], o: Observation, failures: string[], note?: string) =>
    results.push({
      id: c.id,
      via,
      ok: failures.length === 0,
      wallMs: o.wallMs,
      observed: note ? `${note}; ${describeObservation(o)}` : describeObservation(o),
      failures,
    });
  if (e.setup_command) execSync(e.setup_command, { shell: '/bin/sh', stdio: 'ignore' });
  try {
    if (e.kill_supervisor_after_output) {
      if (!options.daemon) throw new Error(`${c.id} needs a supervisor of the harness's own (no --socket)`);
      const { o, f } = await supervisorKilled(options.daemon, c, options.reap ?? (() => {}));
      record('client', o, [...judge(c, o), ...f], 'supervisor SIGKILLed and restarted');
      return results;
    }
    if (e.kill_client_after_output) {
      const { o, f } = await clientKilled(socketPath, c);
      record('sbx', o, [...judge(c, o), ...f], 'sbx SIGKILLed mid-run');
      return results;
    }
    if (e.submissions) {
      const { o, f, note } = await retried(socketPath, c);
      record('client', o, [...judge(c, { ...o, wallMs: 0 }), ...f], note);
      return results;
    }
    if (e.reader_disconnect_at_byte !== undefined) {
      const { o, f, note } = await resumed(socketPath, c);
      record('client', o, [...judge(c, o), ...f], note);
      return results;
    }
    const rssBefore = rssKb(supervisorPid);
    const runs = e.repeat ? Math.max(1, Math.round(e.repeat * (options.repeatScale ?? 1))) : 1;
    const ways: CaseResult['via'][] = c.kind === 'f' ? ['client', 'client+pty', 'sbx'] : ['client', 'sbx'];
    for (const via of ways) {
      const digests = new Set<string>();
      let f: string[] = [];
      let last: Observation | null = null;
      for (let i = 0; i < runs && f.length === 0; i++) {
        last = via === 'sbx' ? await viaSbx(socketPath, c) : await viaClient(socketPath, c, via === 'client+pty');
        f = judge(c, last, { pty: via === 'client+pty' });
        digests.add(last.stdout.sha256);
      }
      if (e.identical_runs && digests.size !== 1) f.push(`${digests.size} different outputs over ${runs} runs`);
      if (e.zombies_after !== undefined) {
        const zombies = await zombiesSettled(supervisorPid, e.zombies_after);
        if (zombies > e.zombies_after) f.push(`${zombies} zombies under the supervisor`);
      }
      let note = runs > 1 ? `${runs} runs, ${digests.size} distinct` : undefined;
      if (e.max_supervisor_rss_growth_mb !== undefined) {
        const growthMb = (rssKb(supervisorPid) - rssBefore) / 1024;
        note = `supervisor RSS ${growthMb >= 0 ? '+' : ''}${growthMb.toFixed(0)} MB`;
        if (growthMb > e.max_supervisor_rss_growth_mb) f.push(`supervisor RSS grew ${growthMb.toFixed(1)} MB`);
      }
      record(via, last!, f, note);
    }
    return results;
  } finally {
    await releaseRuns(options.reap);
    if (e.teardown_command) execSync(e.teardown_command, { shell: '/bin/sh', stdio: 'ignore' });
  }
}

export function markdown(results: CaseResult[]): string {
  const rows = results.map(
    (r) => `| ${r.id} | ${r.via} | ${r.ok ? 'pass' : 'FAIL'} | ${r.wallMs} | ${r.observed}${r.failures.length ? ` — ${r.failures.join('; ')}` : ''} |`,
  );
  return ['| case | via | result | wall ms | observed |', '|---|---|---|---|---|', ...rows].join('\n');
}
