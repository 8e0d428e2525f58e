// The field-case harness: runs every case of a JSONL file (../shared/cases/README.md gives the
// format) through a supervisor, by the client library and by sbx, and checks each expected
// fact: exact bytes and digests, exit status, signal, deadline, wall time (with 1 s of slack
// for a loaded machine), death evidence, zombies, resume from a cursor, one execution per
// key, supervisor memory. Prints a Markdown table, or JSON with --json; exits 1 on a failure.
//
//   npm run probes:cases -- [--cases FILE] [--socket PATH] [--json] [--repeat-scale N]
//
// Without --socket it boots a supervisor of its own in a temp dir (root: cgroup mode).
import { execSync, spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { SupervisorClient } from '../../ipc/client.js';
import type { Receipt } from '../../ipc/protocol.js';
import { TestDaemon, zombieChildren } from '../../test/helpers/daemon.js';

export interface FieldCase {
  id: string;
  kind: string;
  command: string;
  stdin: string | null;
  timeout_ms: number;
  expect: Record<string, any>;
}

export interface CaseResult {
  id: string;
  via: 'client' | 'sbx' | 'client+pty';
  ok: boolean;
  wallMs: number;
  observed: string;
  failures: string[];
}

const ROOT = resolve(import.meta.dirname, '../..');
const SBX = join(ROOT, 'dist/cli/sbx.js');
const GRACE_MS = 1000;
const SLACK_MS = 1000;
const sha256 = (b: Uint8Array | string) => createHash('sha256').update(b).digest('hex');
const signalNumbers: Record<string, number> = { SIGHUP: 1, SIGINT: 2, SIGQUIT: 3, SIGKILL: 9, SIGUSR1: 10, SIGSEGV: 11, SIGUSR2: 12, SIGPIPE: 13, SIGALRM: 14, SIGTERM: 15 };

export function loadCases(file: string): FieldCase[] {
  return readFileSync(file, 'utf8').split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l) as FieldCase);
}

/** The facts every case states, checked against one run. */
function checkCommon(c: FieldCase, r: { stdout: Buffer; stderr: Buffer; receipt: Receipt; wallMs: number }, pty: boolean): string[] {
  const e = c.expect;
  const f: string[] = [];
  // A pty turns \n into \r\n: compare with that undone (../shared/cases/README.md).
  const out = pty ? Buffer.from(r.stdout.toString('latin1').replaceAll('\r\n', '\n'), 'latin1') : r.stdout;
  if (e.stdout_bytes !== undefined && out.length !== e.stdout_bytes) f.push(`stdout ${out.length} bytes, expected ${e.stdout_bytes}`);
  if (e.stdout_sha256 && sha256(out) !== e.stdout_sha256) f.push('stdout sha256 differs');
  if (!pty && e.stderr_bytes !== undefined && r.stderr.length !== e.stderr_bytes) f.push(`stderr ${r.stderr.length} bytes, expected ${e.stderr_bytes}`);
  if (!pty && e.stderr_sha256 && sha256(r.stderr) !== e.stderr_sha256) f.push('stderr sha256 differs');
  if (e.stdout_newlines !== undefined && out.filter((b) => b === 10).length !== e.stdout_newlines) f.push('newline count differs');
  if ('exit_code' in e && r.receipt.exit.code !== e.exit_code) f.push(`exit code ${r.receipt.exit.code}, expected ${e.exit_code}`);
  if ('signal' in e) {
    const sig = r.receipt.exit.signal ? signalNumbers[r.receipt.exit.signal] ?? r.receipt.exit.signal : null;
    if (sig !== e.signal) f.push(`signal ${sig}, expected ${e.signal}`);
  }
  if ('timed_out' in e && (r.receipt.outcome === 'timed_out') !== e.timed_out) f.push(`outcome ${r.receipt.outcome}, timed_out expected ${e.timed_out}`);
  if (e.min_wall_ms !== undefined && r.wallMs < e.min_wall_ms) f.push(`wall ${r.wallMs} ms < min ${e.min_wall_ms}`);
  if (e.max_wall_ms !== undefined && r.wallMs > e.max_wall_ms + SLACK_MS) f.push(`wall ${r.wallMs} ms > max ${e.max_wall_ms} (+${SLACK_MS} slack)`);
  if (e.descendants_dead && !['cgroup_empty', 'subreaper_reaped'].includes(r.receipt.death.evidence)) f.push(`death evidence ${r.receipt.death.evidence}`);
  for (const [name, s] of Object.entries(r.receipt.output)) if (!s!.complete) f.push(`${name} incomplete: ${s!.reason}`);
  return f;
}

async function viaClient(socketPath: string, c: FieldCase, pty = false) {
  const client = await SupervisorClient.connect({ socketPath, clientName: 'field-cases' });
  try {
    const t0 = Date.now();
    const { session_id } = await client.launch({
      argv: ['/bin/sh', '-c', c.command],
      cwd: '/',
      timeout_ms: c.timeout_ms,
      grace_ms: GRACE_MS,
      stdin: c.stdin !== null,
      ...(pty ? { pty: {} } : {}),
      invocation_key: `${c.id}-${randomBytes(6).toString('hex')}`,
    });
    if (c.stdin !== null) await client.request('write', { session_id, data: Buffer.from(c.stdin), offset: 0, eof: true });
    const receipt = await client.wait({ session_id });
    const wallMs = Date.now() - t0;
    const stdout = await client.read({ session_id }, pty ? 'pty' : 'stdout');
    const stderr = pty ? Buffer.alloc(0) : await client.read({ session_id }, 'stderr');
    return { stdout, stderr, receipt, wallMs, session_id };
  } finally {
    client.close();
  }
}

async function viaSbx(socketPath: string, c: FieldCase) {
  const receiptPath = join(tmpdir(), `field-case-${randomBytes(6).toString('hex')}.json`);
  const args = [SBX, 'run', '--cwd', '/', '--timeout', `${c.timeout_ms}ms`, '--grace', `${GRACE_MS}ms`, '--receipt', receiptPath, ...(c.stdin !== null ? ['--stdin'] : []), '--', '/bin/sh', '-c', c.command];
  const t0 = Date.now();
  const { stdout, stderr } = await new Promise<{ stdout: Buffer; stderr: Buffer }>((res, rej) => {
    const child = spawn(process.execPath, args, { env: { ...process.env, SBX_SOCKET: socketPath }, stdio: ['pipe', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (d: Buffer) => out.push(d));
    child.stderr.on('data', (d: Buffer) => err.push(d));
    child.on('error', rej);
    child.on('close', () => res({ stdout: Buffer.concat(out), stderr: Buffer.concat(err) }));
    child.stdin.end(c.stdin ?? '');
  });
  const wallMs = Date.now() - t0;
  const receipt = JSON.parse(readFileSync(receiptPath, 'utf8')) as Receipt;
  rmSync(receiptPath, { force: true });
  return { stdout, stderr, receipt, wallMs };
}

function rssKb(pid: number): number {
  return Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? 0);
}

/** Runs one case every way that applies; returns one result per way. */
export async function runCase(socketPath: string, supervisorPid: number, c: FieldCase, repeatScale = 1): Promise<CaseResult[]> {
  const e = c.expect;
  const results: CaseResult[] = [];
  const record = (via: CaseResult['via'], wallMs: number, observed: string, failures: string[]) => results.push({ id: c.id, via, ok: failures.length === 0, wallMs, observed, failures });
  if (e.setup_command) execSync(e.setup_command, { shell: '/bin/sh', stdio: 'ignore' });
  try {
    if (e.submissions) {
      // Submit with one key n times, dropping the first answer: the command runs once.
      const key = `${c.id}-${randomBytes(6).toString('hex')}`;
      const ids = new Set<string>();
      let spawned = 0;
      for (let i = 0; i < e.submissions; i++) {
        const client = await SupervisorClient.connect({ socketPath });
        const r = await client.launch({ argv: ['/bin/sh', '-c', c.command], cwd: '/', timeout_ms: c.timeout_ms, grace_ms: GRACE_MS, invocation_key: key });
        client.close(); // the answer is dropped
        ids.add(r.session_id);
        if (!r.existing) spawned++;
      }
      const client = await SupervisorClient.connect({ socketPath });
      const [sessionId] = [...ids];
      const receipt = await client.wait({ session_id: sessionId });
      const stdout = await client.read({ session_id: sessionId }, 'stdout');
      const stderr = await client.read({ session_id: sessionId }, 'stderr');
      client.close();
      const f = checkCommon(c, { stdout, stderr, receipt, wallMs: 0 }, false);
      if (spawned !== e.executions || ids.size !== 1) f.push(`${spawned} executions over ${ids.size} sessions, expected ${e.executions}`);
      record('client', 0, `${e.submissions} submissions, ${spawned} execution`, f);
      return results;
    }
    if (e.reader_disconnect_at_byte !== undefined) {
      // A follower that disconnects at byte N, pauses, and resumes from cursor M.
      const client = await SupervisorClient.connect({ socketPath });
      const t0 = Date.now();
      const { session_id } = await client.launch({ argv: ['/bin/sh', '-c', c.command], cwd: '/', timeout_ms: c.timeout_ms, grace_ms: GRACE_MS });
      const head: Buffer[] = [];
      await new Promise<void>((res) => {
        void client.subscribe({ session_id, stream: 'stdout', from: 0, follow: true }, {
          onOutput: (ev) => {
            head.push(Buffer.from(ev.data));
            if (Buffer.concat(head).length >= e.reader_disconnect_at_byte) {
              client.close();
              res();
            }
          },
          onEnd: () => res(),
        });
      });
      await new Promise((r) => setTimeout(r, e.reader_pause_ms ?? 0)); // the case's own pause
      const second = await SupervisorClient.connect({ socketPath });
      const tail: Buffer[] = [];
      await new Promise<void>((res) => {
        void second.subscribe({ session_id, stream: 'stdout', from: e.reader_resume_cursor, follow: true }, { onOutput: (ev) => tail.push(Buffer.from(ev.data)), onEnd: () => res() });
      });
      const receipt = await second.wait({ session_id });
      const wallMs = Date.now() - t0;
      const stdout = await second.read({ session_id }, 'stdout');
      const stderr = await second.read({ session_id }, 'stderr');
      second.close();
      const concat = Buffer.concat([Buffer.concat(head).subarray(0, e.reader_resume_cursor), ...tail]);
      const f = checkCommon(c, { stdout, stderr, receipt, wallMs }, false);
      if (sha256(concat) !== e.reader_concat_sha256) f.push('the resumed reader did not get exactly the log');
      record('client', wallMs, `${concat.length} bytes across a reconnect`, f);
      return results;
    }
    const rssBefore = rssKb(supervisorPid);
    const runs = e.repeat ? Math.max(1, Math.round(e.repeat * repeatScale)) : 1;
    const ways: CaseResult['via'][] = c.kind === 'f' ? ['client', 'client+pty', 'sbx'] : ['client', 'sbx'];
    for (const via of ways) {
      const digests = new Set<string>();
      let f: string[] = [];
      let last = { wallMs: 0, observed: '' };
      for (let i = 0; i < runs && f.length === 0; i++) {
        const r = via === 'sbx' ? await viaSbx(socketPath, c) : await viaClient(socketPath, c, via === 'client+pty');
        f = checkCommon(c, r, via === 'client+pty');
        digests.add(sha256(r.stdout));
        last = { wallMs: r.wallMs, observed: `${r.stdout.length}B out, ${r.receipt.outcome} ${r.receipt.exit.code ?? r.receipt.exit.signal}, ${r.receipt.death.evidence}` };
      }
      if (e.identical_runs && digests.size !== 1) f.push(`${digests.size} different outputs over ${runs} runs`);
      if (e.zombies_after !== undefined) {
        const deadline = Date.now() + 5000;
        while (zombieChildren(supervisorPid).length > e.zombies_after && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
        if (zombieChildren(supervisorPid).length > e.zombies_after) f.push(`${zombieChildren(supervisorPid).length} zombies under the supervisor`);
      }
      if (e.max_supervisor_rss_growth_mb !== undefined) {
        const growthMb = (rssKb(supervisorPid) - rssBefore) / 1024;
        if (growthMb > e.max_supervisor_rss_growth_mb) f.push(`supervisor RSS grew ${growthMb.toFixed(1)} MB`);
      }
      record(via, last.wallMs, runs > 1 ? `${runs} runs, ${digests.size} distinct; ${last.observed}` : last.observed, f);
    }
    return results;
  } finally {
    if (e.teardown_command) execSync(e.teardown_command, { shell: '/bin/sh', stdio: 'ignore' });
  }
}

/** Every case of a file, in order. */
export async function runCases(socketPath: string, supervisorPid: number, cases: FieldCase[], repeatScale = 1): Promise<CaseResult[]> {
  const all: CaseResult[] = [];
  for (const c of cases) all.push(...(await runCase(socketPath, supervisorPid, c, repeatScale)));
  return all;
}

export function markdown(results: CaseResult[]): string {
  const rows = results.map((r) => `| ${r.id} | ${r.via} | ${r.ok ? 'pass' : 'FAIL'} | ${r.wallMs} | ${r.observed}${r.failures.length ? ` — ${r.failures.join('; ')}` : ''} |`);
  return ['| case | via | result | wall ms | observed |', '|---|---|---|---|---|', ...rows].join('\n');
}

async function main(): Promise<void> {
  const argv = process.argv.slice(2);
  const opt = (name: string) => (argv.includes(name) ? argv[argv.indexOf(name) + 1] : undefined);
  const shared = resolve(ROOT, '../shared/cases/field-cases.jsonl');
  const file = opt('--cases') ?? (existsSync(shared) ? shared : join(ROOT, 'test/fixtures/field-cases.jsonl'));
  const cases = loadCases(file);
  let socketPath = opt('--socket');
  let own: TestDaemon | null = null;
  if (!socketPath) {
    own = await new TestDaemon({ config: { logLevel: 'warn' } }).start();
    socketPath = own.socketPath;
  }
  try {
    const client = await SupervisorClient.connect({ socketPath });
    const { pid } = await client.status();
    client.close();
    const results = await runCases(socketPath, pid, cases, Number(opt('--repeat-scale') ?? 1));
    process.stdout.write(argv.includes('--json') ? JSON.stringify(results, null, 2) + '\n' : `cases: ${file}\n\n${markdown(results)}\n`);
    process.exitCode = results.every((r) => r.ok) ? 0 : 1;
  } finally {
    await own?.stop();
  }
}

if (process.argv[1] && resolve(process.argv[1]) === resolve(import.meta.filename)) {
  main().catch((err) => {
    process.stderr.write(`field-cases: ${(err as Error).stack}\n`);
    process.exit(2);
  });
}
