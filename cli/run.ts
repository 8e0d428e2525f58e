// sbx run: launch a command and stream its bytes until its receipt, exiting with its status.
// The launch is resent until answered (safe: it carries an invocation key), stdin is written
// at offsets so a reconnect delivers every byte exactly once, signals to sbx are sent on to
// the session, and what an exit status cannot say (bytes not stored, an owner lost) is said on
// stderr. sbx never owns the process: killing sbx leaves the session to the supervisor.
import { randomBytes } from 'node:crypto';
import { resolve as resolvePath } from 'node:path';
import { DEFAULT_RECONNECT_MS, ReconnectingClient, SupervisorClient } from '../ipc/client.js';
import { isSupervisorError, type SupervisorError } from '../ipc/errors.js';
import { closeOutputDir, OutputFileError, openOutputDir, outputNameRefusal, writeOutputFile, type OutputDir } from '../ipc/output-file.js';
import { defaultSocketPath } from '../ipc/paths.js';
import { exitStatusOf, type LaunchParams, type LaunchResult, type Receipt, type SessionSelector } from '../ipc/protocol.js';
import { describe, fail, FAILURE, type GlobalOptions, mib, pipeOutput, printJson, signalNumber } from './common.js';
import { inheritedEnv } from './raw-args.js';

/** The options of sbx run, as commander parses them (cli/sbx.ts declares them). */
export interface RunOptions {
  key?: string;
  timeout: number;
  grace?: number;
  cwd?: string;
  env: Record<string, string>;
  inheritEnv?: boolean;
  user?: string;
  pty?: boolean;
  cols?: number;
  rows?: number;
  stdin?: boolean;
  linger: 'kill' | 'wait';
  onDisconnect: 'continue' | 'cancel';
  detach?: boolean;
  receipt?: string;
}

/** Runs `cmd` to its receipt and sets process.exitCode from it (SPEC.md exit statuses); exits 125 on a failure. */
export async function run(g: GlobalOptions, cmd: string[], o: RunOptions): Promise<void> {
  if (o.detach && o.onDisconnect === 'cancel') {
    fail('INVALID_ARGUMENT: --detach with --on-disconnect cancel: a detached sbx closes its connection at once, which would cancel the session; drop one of them');
  }
  if (o.detach && o.receipt) {
    fail('INVALID_ARGUMENT: --detach with --receipt: a detached sbx is gone before the session ends; get the receipt later with sbx wait ID (or sbx receipt ID)');
  }
  // The receipt's directory is pinned now, before anything runs (the session may write it).
  let receiptDir: OutputDir | null = null;
  if (o.receipt && !o.detach) {
    try {
      receiptDir = openOutputDir(o.receipt);
    } catch (err) {
      fail(`--receipt ${(err as OutputFileError).message}; nothing was run`);
    }
    const refusal = outputNameRefusal(receiptDir);
    if (refusal) fail(`--receipt ${receiptDir.path}: refused: ${refusal}, and sbx never writes through or replaces one; nothing was run`);
  }
  let said = false;
  const say = (line: string) => {
    if (!said) process.stderr.write(`${line}\n`);
    said = true;
  };
  const { client, launched } = await launchUntilAnswered(g, {
    argv: cmd,
    cwd: resolvePath(o.cwd ?? '.'),
    env: o.env,
    inherit_env: o.inheritEnv ? inheritedEnv() : undefined,
    // A key before the first send, so a resend after a drop finds this launch's session.
    invocation_key: o.key ?? newInvocationKey(),
    timeout_ms: o.timeout,
    grace_ms: o.grace,
    linger: o.linger,
    on_disconnect: o.onDisconnect,
    user: o.user,
    pty: o.pty ? { cols: o.cols ?? process.stdout.columns ?? 80, rows: o.rows ?? process.stdout.rows ?? 24 } : undefined,
    stdin: o.stdin,
  }, Boolean(o.detach), say);
  if (o.detach) {
    if (g.json) printJson({ session_id: launched.session_id, existing: launched.existing, state: launched.state });
    else process.stdout.write(`${launched.session_id}\n`);
    client.close();
    return;
  }
  if (launched.state === 'retired') {
    fail(`session ${launched.session_id} (key ${launched.invocation_key}) was removed by the retention policy; it is never run again`);
  }
  if (launched.state === 'unknown') {
    try {
      await unlessPending(client, launched, say);
    } catch (err) {
      fail(describe(err));
    }
  }
  const conn = new ReconnectingClient({ socketPath: g.socket, clientName: 'sbx' }, client);
  forwardSignals(conn, launched.session_id);
  const sel = { session_id: launched.session_id };
  let receipt: Receipt;
  if (o.pty && process.stdout.isTTY) {
    // Our terminal's size follows us; SIGWINCH is sent on as a resize.
    process.on('SIGWINCH', () => void conn.current?.request('resize', { ...sel, cols: process.stdout.columns, rows: process.stdout.rows }).catch(() => {}));
  }
  // A person at a terminal reattaching types from where the session's stdin is now; piped
  // stdin is replayed from 0 and only bytes past what was delivered are added (exactly once).
  // A session that has ended takes no more stdin: a retry only replays it.
  if (o.stdin && launched.state !== 'ended') void pumpStdin(conn, sel, Boolean(o.pty), process.stdin.isTTY ? (launched.stdin_cursor ?? 0) : 0);
  try {
    // The wait is in flight from the start, so a supervisor shutting down answers it
    // (it lets requests in flight finish) before it closes the connection.
    const waiting = conn.run((c) => c.wait(sel));
    waiting.catch(() => {});
    const outputs = o.pty
      ? [pipeOutput(g, sel, 'pty', process.stdout, 0, true)]
      : [pipeOutput(g, sel, 'stdout', process.stdout, 0, true), pipeOutput(g, sel, 'stderr', process.stderr, 0, true)];
    // A replay whose output retention removed still ends with the recorded status.
    let removedSaid = false;
    const outputRemoved = (err: unknown) => {
      if (!isSupervisorError(err) || err.code !== 'OUTPUT_REMOVED') throw err;
      if (!removedSaid) process.stderr.write(`sbx: ${err.message}\n`);
      removedSaid = true;
    };
    await Promise.all(outputs.map((p) => p.catch(outputRemoved)));
    receipt = await waiting;
  } catch (err) {
    fail(describe(err));
  }
  if (receipt.spawn_error) {
    const why = { ENOENT: 'not found', ENOTDIR: 'not found', EACCES: 'permission denied', ENOEXEC: 'exec format error', E2BIG: 'argument list too long' }[receipt.spawn_error.code];
    process.stderr.write(`sbx: ${cmd[0]}: ${why ?? receipt.spawn_error.code} (${receipt.spawn_error.stage} failed: ${receipt.spawn_error.code})\n`);
  }
  // What the exit status cannot say: bytes that were not stored, a status nobody saw.
  if (receipt.outcome === 'owner_lost') {
    process.stderr.write(`sbx: session ${receipt.session_id}: owner lost (the supervisor that ran it stopped before it ended): its exit status is unknown, death evidence ${receipt.death.evidence} (sbx receipt ${receipt.session_id})\n`);
  } else {
    for (const [name, out] of Object.entries(receipt.output)) {
      if (out && !out.complete) process.stderr.write(`sbx: ${name} is incomplete: ${out.reason}${out.dropped_bytes ? `, ${out.dropped_bytes} bytes not stored` : ''} (sbx receipt ${receipt.session_id})\n`);
    }
  }
  process.exitCode = exitStatusOf(receipt, signalNumber);
  if (receiptDir) {
    try {
      writeOutputFile(receiptDir, Buffer.from(JSON.stringify(receipt, null, 2) + '\n'));
    } catch (err) {
      const e = err as OutputFileError;
      const why = e.refused ? `${e.reason}; sbx never writes through or replaces a link (the session's directory may hold one it planted)` : e.reason;
      process.stderr.write(`sbx: --receipt ${e.path}: not written: ${why}; the supervisor keeps the receipt: sbx receipt ${receipt.session_id}\n`);
      process.exitCode = FAILURE;
    }
    closeOutputDir(receiptDir);
  }
  process.stdout.write('', () => process.exit());
}

/**
 * Streams this CLI's stdin into the session from stdin offset fromOffset, each write at its
 * offset so a retry after a reconnect delivers every byte exactly once; EOF closes the
 * session's stdin. A terminal on stdin is put in raw mode for a pty session (restored on
 * every exit path).
 */
async function pumpStdin(conn: ReconnectingClient, sel: SessionSelector, pty: boolean, fromOffset: number): Promise<void> {
  if (pty && process.stdin.isTTY) {
    process.stdin.setRawMode(true);
    process.on('exit', () => process.stdin.setRawMode?.(false));
  }
  let offset = fromOffset;
  try {
    for await (const chunk of process.stdin) {
      const data = chunk as Buffer;
      await conn.run((c) => c.request('write', { ...sel, data, offset }));
      offset += data.length;
    }
    await conn.run((c) => c.request('write', { ...sel, data: Buffer.alloc(0), offset, eof: true }));
  } catch (err) {
    process.stderr.write(`sbx: stdin: ${describe(err)}\n`);
  }
}

/** A fresh invocation key in the supervisor's own format: `auto-` and 24 hex digits. */
function newInvocationKey(): string {
  return `auto-${randomBytes(12).toString('hex')}`;
}

/** Transport failures a resent launch may outlive (the supervisor restarting, a reset). */
const RETRYABLE_TRANSPORT = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'EAGAIN', 'ENOENT']);

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A waiting line for a retryable refusal, from its details when it has them. */
function refusalWait(err: SupervisorError): string {
  const d = err.details ?? {};
  if (err.code === 'ADMISSION_DENIED' && d.reason === 'disk_low' && typeof d.free_bytes === 'number' && typeof d.min_free_bytes === 'number') {
    return `disk low in the state dir, ${mib(d.free_bytes)} free, ${mib(d.min_free_bytes)} needed`;
  }
  if (err.code === 'ADMISSION_DENIED' && d.reason === 'reconciling') return 'the supervisor is reconciling the sessions left by a restart';
  if (err.code === 'LIMIT_EXCEEDED' && typeof d.limit === 'string') {
    const what = { sessions: 'sessions running', connections: 'connections open', in_flight: 'requests in flight' }[d.limit] ?? d.limit;
    return `the supervisor is at its limit of ${String(d.max ?? '?')} ${what}`;
  }
  return err.message;
}

/**
 * Sends the launch until it is answered: after a dropped connection (before the answer) or
 * ECONNREFUSED it reconnects and resends, and a retryable refusal (ADMISSION_DENIED,
 * LIMIT_EXCEEDED, SHUTTING_DOWN) is retried after its retry_after_ms, for up to
 * DEFAULT_RECONNECT_MS from the first failure; safe because params carry an invocation key.
 * ENOENT on the very first connect fails at once (no supervisor at all), as does a refusal
 * with `detach`. One line on stderr says that it waits (`say`, at most once per run).
 */
async function launchUntilAnswered(g: GlobalOptions, params: LaunchParams, detach: boolean, say: (line: string) => void): Promise<{ client: SupervisorClient; launched: LaunchResult }> {
  const socketPath = g.socket ?? defaultSocketPath();
  const budgetS = Math.round(DEFAULT_RECONNECT_MS / 1000);
  let giveUpAt: number | null = null; // set at the first failure
  for (;;) {
    let client: SupervisorClient | null = null;
    let line: string;
    let delayMs: number;
    try {
      client = await SupervisorClient.connect({ socketPath, clientName: 'sbx' });
      return { client, launched: await client.launch(params) };
    } catch (err) {
      client?.close();
      const code = (err as NodeJS.ErrnoException).code ?? '';
      const expired = giveUpAt !== null && performance.now() > giveUpAt;
      if (isSupervisorError(err)) {
        if (!err.retryable || detach || expired) fail(describe(err));
        line = `sbx: waiting: ${refusalWait(err)} (retrying for up to ${budgetS} s)`;
        delayMs = Math.min(Math.max(Number(err.details?.retry_after_ms ?? 250), 50), 5000);
      } else if (RETRYABLE_TRANSPORT.has(code) && !(code === 'ENOENT' && giveUpAt === null)) {
        if (expired) fail(`the supervisor at ${socketPath} did not answer the launch within ${budgetS} s (${code}); if it was sent, sbx run --key ${params.invocation_key} finds the session`);
        line = `sbx: waiting for the supervisor at ${socketPath} (${code}); retrying for up to ${budgetS} s`;
        delayMs = 200;
      } else {
        fail(describe(err));
      }
    }
    giveUpAt ??= performance.now() + DEFAULT_RECONNECT_MS;
    say(line);
    await sleep(delayMs);
  }
}

/**
 * A retry answered with an unknown session: one whose receipt is on its way (a restarted
 * supervisor is ending it, or its receipt waits for disk space; ps says receipt_pending) is
 * waited for like a running one, saying so once; one with no evidence to come fails (125).
 */
async function unlessPending(client: SupervisorClient, launched: LaunchResult, say: (line: string) => void): Promise<void> {
  const row = (await client.ps(true)).sessions.find((x) => x.session_id === launched.session_id);
  if (row && row.state !== 'unknown') return;
  if (!row?.receipt_pending) {
    fail(`session ${launched.session_id} (key ${launched.invocation_key}) is unknown: ${row?.reason ?? 'no evidence of its end yet'}; it is never run again (sbx ps, sbx resolve)`);
  }
  say(`sbx: waiting: session ${launched.session_id} is unknown until its receipt is written: ${row.reason ?? 'evidence is on its way'}`);
}

/**
 * SIGINT/SIGTERM/SIGHUP/SIGQUIT to sbx run are sent on to every process of the session; a
 * second SIGINT detaches (the session runs on) and exits 130.
 */
function forwardSignals(conn: ReconnectingClient, sessionId: string): void {
  let interrupts = 0;
  const forward = (signal: NodeJS.Signals) => {
    if (signal === 'SIGINT' && ++interrupts >= 2) {
      process.stderr.write(`sbx: detached; session ${sessionId} goes on (sbx wait ${sessionId})\n`);
      process.exit(130);
    }
    conn.current?.request('kill', { session_id: sessionId, signal }).catch(() => {});
  };
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP', 'SIGQUIT'] as const) process.on(signal, () => forward(signal));
}
