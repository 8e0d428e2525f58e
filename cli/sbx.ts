#!/usr/bin/env node
// sbx: the launch-only client: asks the supervisor to run commands and streams their bytes. It never owns a
// process, so killing sbx never kills a command (unless launched with --on-disconnect cancel: the supervisor
// then cancels it). Exit statuses follow sh, timeout(1) and docker run (docs/reference/exit-statuses.md).
// Imports ipc/ and core/ only, never supervisor/ (test/unit/repo/layers.test.ts), and no zod (types only): it starts fast (docs/design/facts.md 17).
// Runs bundled (scripts/build/sbx-bundle.mjs): no side effects at the top level ("Start" below).
import { isUtf8 } from 'node:buffer';
import { randomBytes } from 'node:crypto';
import { closeSync, existsSync, openSync, readFileSync, writeSync } from 'node:fs';
import { isatty } from 'node:tty';
import { join, resolve as resolvePath } from 'node:path';
import { constants as osConstants } from 'node:os';
import { realpathSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { Command, InvalidArgumentError, Option } from 'commander';
import { DEFAULT_RECONNECT_MS, readOutput, ReconnectingClient, SupervisorClient, type EndpointOptions } from '../ipc/client.js';
import { describeEndpoint, resolveEndpoint } from '../ipc/transport.js';
import { parseDurationMs } from '../ipc/duration.js';
import { parseSizeBytes } from '../ipc/size.js';
import { mergeStreams } from '../ipc/merge.js';
import { JsonSink, parseTimeUs, RawSink, SplitSink, TailSink, TimestampSink } from './logs.js';
import { isSupervisorError, SupervisorError } from '../ipc/errors.js';
import { closeOutputDir, OutputFileError, openOutputDir, outputNameRefusal, writeOutputFile, type OutputDir } from './output-file.js';
import { defaultSocketPath, defaultStateDir } from '../ipc/paths.js';
import {
  type CheckpointResult,
  type CloseReceipt,
  exitStatusOf,
  type LaunchParams,
  type LaunchResult,
  type Receipt,
  type SessionSelector,
  type SessionSummary,
  type StatusResult,
  type StreamName,
  type TaskReceipt,
} from '../ipc/protocol.js';
import { STATE } from '../core/state/names.js';
import { VERSION } from '../ipc/version.js';
import { attachCommand, forwardTerminalSize, pumpStdin } from './attach.js';
import { runBridge } from './bridge.js';
import { bashCompletion, zshCompletion } from './completion.js';
import {
  deprecatedKeyOption,
  describe,
  endedAs,
  escapedLine,
  leftoversLine,
  limitsLine,
  mib,
  oomLine,
  ownerLostLine,
  publicKeyFile,
  reconnectingLine,
  refusalWait,
  uptimeText,
  useSocket,
} from './explain.js';
import { Progress } from './progress.js';
import { FAILURE, fail } from './fail.js';
import { escapeControls, stderrEnded, stderrLine, warn } from './escape.js';
import { parsePsFilters, PS_FILTER_KEYS, psNeedsAll, type PsFilters, psTable, selectPsRows, unknownNotes } from './ps-format.js';
import { errnoCode, systemError } from '../ipc/errno.js';
import { cleanupBeforeDying } from './signals.js';

// The core is one module on purpose: split into four (the commands, sbx run, what they share, argument bytes) it
// took 2.5-3 ms longer to load as a script (Node 20's ESM loader, per module and import edge: 70.7 vs 73.6 ms to
// the first line of `sbx run`, interleaved runs, issue 16; the bundle loads none); what only explains
// (explain.ts: messages, ps-format.ts, progress.ts, completion.ts) is apart, and so is sbx attach (attach.ts, with
// the stdin pump sbx run shares). Its parts, in order: what every command shares; sbx run (resend until answered,
// signals sent on); the commands; the argument and environment bytes.

// --- What every command shares.

/** `sbx kill`/`sbx cancel` of a session that has ended: nothing was done (docker kill of a stopped container exits 1). */
const ENDED_ALREADY = 1;

interface GlobalOptions {
  socket?: string;
  /** --url: a supervisor's remote listener, ws:// or wss:// (else $SBX_URL). */
  url?: string;
  /** --token-file: its bearer token (else $SBX_TOKEN_FILE, $SBX_TOKEN). */
  tokenFile?: string;
  json?: boolean;
}

/**
 * Where every command talks to the supervisor: --socket, or --url with --token-file (else
 * $SBX_URL with $SBX_TOKEN / $SBX_TOKEN_FILE, else $SBX_SOCKET or the default path). --socket
 * with --url, or --token-file without a URL, is refused (125) before anything is sent.
 */
function endpointOf(g: GlobalOptions): EndpointOptions {
  if (g.socket !== undefined && g.url !== undefined) fail('INVALID_ARGUMENT: --socket and --url both name a supervisor; give one of them');
  if (g.tokenFile !== undefined && g.url === undefined && !(g.socket === undefined && process.env.SBX_URL)) {
    fail('INVALID_ARGUMENT: --token-file is the token of a supervisor URL: give --url (or SBX_URL) too');
  }
  return g.url !== undefined ? { url: g.url, tokenFile: g.tokenFile } : g.socket !== undefined ? { socketPath: g.socket } : { tokenFile: g.tokenFile };
}

/** Whether the supervisor is reached over its remote listener (--url, or $SBX_URL without --socket): then this shell's directory means nothing there. */
function remoteEndpoint(g: GlobalOptions): boolean {
  return g.url !== undefined || (g.socket === undefined && Boolean(process.env.SBX_URL));
}

/**
 * The session's working directory: --cwd; else, over a local socket, this shell's; over a URL
 * (the shell is on another machine), the supervisor's first watched workspace, else `/`.
 */
async function sessionCwd(g: GlobalOptions, client: SupervisorClient, cwd: string | undefined): Promise<string> {
  if (cwd !== undefined) return remoteEndpoint(g) ? cwd : resolvePath(cwd);
  if (!remoteEndpoint(g)) return resolvePath('.');
  return (await client.status()).workspaces[0]?.path ?? '/';
}

/** The endpoint as messages name it (the socket path or the URL). */
function where(g: GlobalOptions): string {
  try {
    return describeEndpoint(resolveEndpoint(endpointOf(g)));
  } catch (err) {
    fail(describe(err));
  }
}

function signalNumber(name: string): number {
  return osConstants.signals[name as keyof typeof osConstants.signals] ?? 0;
}

async function connect(g: GlobalOptions): Promise<SupervisorClient> {
  try {
    return await SupervisorClient.connect({ ...endpointOf(g), clientName: 'sbx' });
  } catch (err) {
    fail(describe(err));
  }
}

/** Connects, runs one exchange, closes; any failure is the message and exit 125. */
async function call<T>(g: GlobalOptions, fn: (client: SupervisorClient) => Promise<T>): Promise<T> {
  const client = await connect(g);
  try {
    return await fn(client);
  } catch (err) {
    fail(describe(err));
  } finally {
    client.close();
  }
}

/** The row of this id, else of the one id it is a prefix of (as the supervisor resolves it: its answer decides, this only picks a stream). */
function byIdOrPrefix<T extends { session_id: string }>(rows: T[], id: string): T | undefined {
  const prefixed = rows.filter((r) => r.session_id.startsWith(id));
  return rows.find((r) => r.session_id === id) ?? (prefixed.length === 1 ? prefixed[0] : undefined);
}

function selector(id: string | undefined, key: string | undefined): SessionSelector {
  if (key !== undefined && id !== undefined) fail('give a session ID or --key, not both');
  if (key !== undefined) return { invocation_key: key };
  if (id === undefined) fail('a session ID (or --key K) is required');
  return { session_id: id };
}

/** Option parser for durations; a bad one is INVALID_ARGUMENT, exit 125, before any request. */
function duration(text: string): number {
  try {
    return parseDurationMs(text);
  } catch (err) {
    fail(`INVALID_ARGUMENT: ${(err as Error).message}`);
  }
}

function collectEnv(kv: string, acc: Record<string, string>): Record<string, string> {
  const eq = kv.indexOf('=');
  if (eq <= 0) throw new InvalidArgumentError(`--env takes NAME=VALUE, got ${JSON.stringify(kv)}`);
  acc[kv.slice(0, eq)] = kv.slice(eq + 1);
  return acc;
}

/** Copies one stream to a local output, waiting for the output to drain (backpressure). */
async function pipeOutput(
  g: GlobalOptions,
  sel: SessionSelector,
  stream: StreamName,
  out: NodeJS.WriteStream,
  from: number,
  followToEnd: boolean,
  onReconnecting?: (code: string) => void,
): Promise<void> {
  for await (const chunk of readOutput({ ...endpointOf(g), clientName: 'sbx', selector: sel, stream, from, follow: followToEnd, onReconnecting })) {
    if (!out.write(chunk.data)) await new Promise((r) => out.once('drain', r));
  }
}

/** --memory: a size (ipc/size.ts); a bad one is INVALID_ARGUMENT, exit 125, before any request. */
function sizeOption(text: string): number {
  try {
    return parseSizeBytes(text);
  } catch (err) {
    fail(`INVALID_ARGUMENT: --memory: ${(err as Error).message}`);
  }
}

/** --pids: a whole number of tasks from 1 to 4194304 (the kernel's PID_MAX_LIMIT). */
function pidsOption(v: string): number {
  if (!/^\d+$/.test(v) || Number(v) < 1 || Number(v) > 4_194_304)
    fail(`INVALID_ARGUMENT: --pids: expected a whole number of tasks from 1 to 4194304, got ${JSON.stringify(v)}`);
  return Number(v);
}

/** --cpus: a number of CPUs, at least 0.01 (cpu.max's least quota, 1000 µs per 100000 µs). */
function cpusOption(v: string): number {
  if (!/^\d+(\.\d+)?$/.test(v) || Number(v) < 0.01 || Number(v) > 1_000_000)
    fail(`INVALID_ARGUMENT: --cpus: expected a number of CPUs of at least 0.01 (0.5: half of one), got ${JSON.stringify(v)}`);
  return Number(v);
}

function positiveInt(v: string): number {
  if (!/^\d+$/.test(v) || Number(v) < 1 || Number(v) > 65535) fail(`INVALID_ARGUMENT: expected an integer from 1 to 65535, got ${JSON.stringify(v)}`);
  return Number(v);
}

// --- sbx run: the parts of its action below.

// pumpStdin (stdin at offsets) is attach.ts's: sbx attach forwards stdin the same way.

/**
 * A fresh invocation key in the supervisor's own format: `auto-` and 24 hex digits. Every launch carries a key
 * (sbx makes this one when none is given), so a drop before the answer is resent (launchUntilAnswered).
 */
function newInvocationKey(): string {
  return `auto-${randomBytes(12).toString('hex')}`;
}

/** Transport failures a resent launch may outlive (the supervisor restarting, a reset, a silent transport). */
const RETRYABLE_TRANSPORT = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'EAGAIN', 'ENOENT', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH']);

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Sends the launch until it is answered: after a dropped connection (before the answer) or
 * ECONNREFUSED it reconnects and resends, and a retryable refusal (ADMISSION_DENIED,
 * LIMIT_EXCEEDED, SHUTTING_DOWN) is retried after its retry_after_ms, for up to
 * DEFAULT_RECONNECT_MS from the first failure; safe because params carry an invocation key.
 * ENOENT on the very first connect fails at once (no supervisor at all), as does a refusal
 * with `detach`. One line on stderr says that it waits (`say`, at most once per run).
 */
async function launchUntilAnswered(
  g: GlobalOptions,
  params: Omit<LaunchParams, 'cwd'> & { cwd?: string },
  cwdOption: string | undefined,
  detach: boolean,
  say: (line: string) => void,
): Promise<{ client: SupervisorClient; launched: LaunchResult }> {
  const socketPath = where(g);
  const budgetS = Math.round(DEFAULT_RECONNECT_MS / 1000);
  let giveUpAt: number | null = null; // set at the first failure
  for (;;) {
    let client: SupervisorClient | null = null;
    let line: string;
    let delayMs: number;
    try {
      client = await SupervisorClient.connect({ ...endpointOf(g), clientName: 'sbx' });
      // Decided once: a resend must carry what the first send did (else KEY_CONFLICT).
      params.cwd ??= await sessionCwd(g, client, cwdOption);
      return { client, launched: await client.launch({ ...params, cwd: params.cwd }) };
    } catch (err) {
      client?.close();
      const code = errnoCode(err) ?? '';
      const expired = giveUpAt !== null && performance.now() > giveUpAt;
      if (isSupervisorError(err)) {
        if (!err.retryable || detach || expired) fail(describe(err));
        line = `sbx: waiting: ${refusalWait(err)} (retrying for up to ${budgetS} s)`;
        delayMs = Math.min(Math.max(Number(err.details?.retry_after_ms ?? 250), 50), 5000);
      } else if (RETRYABLE_TRANSPORT.has(code) && !(code === 'ENOENT' && giveUpAt === null)) {
        if (expired)
          fail(
            `the supervisor at ${socketPath} did not answer the launch within ${budgetS} s (${code}); if it was sent, sbx run --key ${params.invocation_key} finds the session`,
          );
        line = `sbx: waiting for the supervisor at ${socketPath} (${code}); retrying for up to ${budgetS} s`;
        delayMs = 200;
      } else {
        fail(describe(err));
      }
    }
    giveUpAt ??= performance.now() + DEFAULT_RECONNECT_MS;
    say(line);
    launchRetrying = params.invocation_key ?? '';
    await sleep(delayMs);
  }
}

/** While `sbx run` waits to send its launch again: the invocation key (a signal then ends sbx: takeSignals). */
let launchRetrying: string | null = null;

/**
 * Where a session found unknown stands, from ps: null once it is not unknown; else whether its
 * receipt is on its way (a restarted supervisor is ending it, or its receipt waits for disk
 * space: receipt_pending), and ps's reason (null: none given).
 */
async function unknownStanding(client: SupervisorClient, sessionId: string): Promise<{ pending: boolean; reason: string | null } | null> {
  const row = (await client.ps(true)).sessions.find((x) => x.session_id === sessionId);
  if (row && row.state !== 'unknown') return null;
  return { pending: row?.receipt_pending === true, reason: row?.reason ?? null };
}

/** The line said once while a session unknown until its receipt is written is waited for. */
const pendingLine = (sessionId: string, reason: string | null) =>
  `sbx: waiting: session ${sessionId} is unknown until its receipt is written: ${reason ?? 'evidence is on its way'}`;

/**
 * A retry answered with an unknown session: one whose receipt is on its way is waited for like
 * a running one, saying so once; one with no evidence to come fails (125).
 */
async function unlessPending(client: SupervisorClient, launched: LaunchResult, say: (line: string) => void): Promise<void> {
  const standing = await unknownStanding(client, launched.session_id);
  if (!standing) return;
  if (!standing.pending) {
    fail(
      `session ${launched.session_id} (key ${launched.invocation_key}) is unknown: ${standing.reason ?? 'no evidence of its end yet'}; it is never run again (sbx ps, sbx resolve)`,
    );
  }
  say(pendingLine(launched.session_id, standing.reason));
}

/** How often sbx run and sbx wait look whether the session they wait for has turned unknown (ms). */
const UNKNOWN_CHECK_MS = 2000;

/**
 * The receipt `waiting` answers with. Meanwhile, every UNKNOWN_CHECK_MS, whether the session
 * turned unknown (its exec shim died before reporting, its supervisor restarted): the wire's
 * wait stays open until evidence comes, which for some never does. One whose receipt is on its
 * way is waited for, said once; one with no evidence to come fails (125) with the reason, as a
 * retried launch answered unknown does (unlessPending).
 */
async function receiptUnlessUnknown(
  conn: ReconnectingClient,
  sel: SessionSelector,
  waiting: Promise<Receipt>,
  say: (line: string) => void,
  outputs: Promise<unknown> = Promise.resolve(),
): Promise<Receipt> {
  let saidPending = false;
  for (;;) {
    let timer: NodeJS.Timeout | undefined;
    const answered = await Promise.race([waiting.then(() => true), new Promise<boolean>((r) => (timer = setTimeout(() => r(false), UNKNOWN_CHECK_MS)))]);
    clearTimeout(timer);
    if (answered) return waiting;
    const { session_id, state } = await conn.run((c) => c.receipt(sel));
    if (state !== 'unknown') continue;
    const standing = await conn.run((c) => unknownStanding(c, session_id));
    if (!standing) continue;
    if (!standing.pending) {
      // What its streams still hold is printed first (up to UNKNOWN_CHECK_MS more: a process
      // of it may still write, and the session is no longer followed to its end).
      await Promise.race([outputs.catch(() => {}), new Promise((r) => setTimeout(r, UNKNOWN_CHECK_MS))]);
      fail(`session ${session_id} is unknown: ${standing.reason ?? 'no evidence of its end'}; it is never run again (sbx ps, sbx resolve)`);
    }
    if (!saidPending) say(pendingLine(session_id, standing.reason));
    saidPending = true;
  }
}

/** How long after the first Ctrl-C of sbx run a session still running is said to ignore SIGINT. */
const IGNORED_SIGINT_MS = 2000;

/**
 * SIGINT/SIGTERM/SIGHUP/SIGQUIT to sbx run are sent on to every process of the session; a
 * second SIGINT detaches (the session runs on) and exits 130. They are taken from the start
 * of `sbx run`, before the launch is answered (else one sent meanwhile killed sbx and never
 * reached the session): they wait, then go to the session once `to` names it. While the
 * launch waits to be sent again (no supervisor answers), a signal ends sbx with 128+N, saying so.
 * A session still running IGNORED_SIGINT_MS after the first SIGINT is said (once, on stderr)
 * to ignore it, with what ends it.
 */
function takeSignals(): { to: (conn: ReconnectingClient, sessionId: string) => void } {
  let target: { conn: ReconnectingClient; sessionId: string } | null = null;
  const waiting: NodeJS.Signals[] = [];
  let interrupts = 0;
  const forward = (signal: NodeJS.Signals) => {
    if (!target && launchRetrying !== null) {
      // Waiting for a supervisor that does not answer: the signal is for sbx, as before.
      warn(`${signal} while waiting to launch; a launch that was admitted runs on (sbx run --key ${launchRetrying} finds it)`);
      process.exit(128 + signalNumber(signal));
    }
    if (!target) return void waiting.push(signal); // the launch is in flight: its answer names the session
    const { conn, sessionId } = target;
    if (signal === 'SIGINT' && ++interrupts >= 2) {
      warn(`detached; session ${sessionId} goes on (sbx wait ${sessionId})`);
      process.exit(130);
    }
    // The supervisor unreachable (sbx reconnects): the signal cannot be sent on, and is for sbx,
    // as while a launch waits; the session goes on (it is the supervisor's).
    const unsent = () => {
      warn(
        `${signal} while the supervisor is unreachable: not sent on; session ${sessionId} goes on (sbx cancel ${sessionId} ends it, sbx wait ${sessionId} waits for it)`,
      );
      process.exit(128 + signalNumber(signal));
    };
    const client = conn.current;
    if (!client) return unsent();
    const send = (sig: NodeJS.Signals) =>
      client.request('kill', { session_id: sessionId, signal: sig }).catch((err: unknown) => {
        if (!(err instanceof SupervisorError)) unsent(); // the connection failed under it; an answer (the session ended) is no failure
      });
    void send(signal);
    // As bash's kill of a stopped job: SIGCONT after a TERM or HUP, so a stopped command acts on
    // it (`timeout 60 sbx run -- CMD` ends a CMD that stopped itself). Sent after it, in order.
    if (signal === 'SIGTERM' || signal === 'SIGHUP') void send('SIGCONT');
    // A command that ignores (or handles and outlives) SIGINT: said once, what ends it.
    if (signal === 'SIGINT' && interrupts === 1) {
      setTimeout(() => {
        if (attachedSession !== sessionId) return; // it ended meanwhile
        warn(
          `session ${sessionId} is still running ${IGNORED_SIGINT_MS / 1000} s after SIGINT: the command ignores it. Ctrl-C again detaches (the session goes on: sbx wait ${sessionId}); sbx kill ${sessionId} (SIGKILL) or sbx cancel ${sessionId} (SIGTERM, then SIGKILL after the grace) ends it`,
        );
      }, IGNORED_SIGINT_MS).unref();
    }
  };
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP', 'SIGQUIT'] as const) process.on(signal, () => forward(signal));
  return {
    to: (conn, sessionId) => {
      target = { conn, sessionId };
      for (const signal of waiting.splice(0)) forward(signal);
    },
  };
}

function printJson(value: unknown): void {
  process.stdout.write(JSON.stringify(value, null, 2) + '\n');
}

/** A subcommand that also takes --socket and --json (docs/reference/contract.md "sbx": all subcommands do). */
function sub(name: string): Command {
  // A usage error: its one line, then where the usage is (as docker's "See 'docker run --help'."), not the whole help.
  return program
    .command(name)
    .showHelpAfterError(`See 'sbx ${name} --help'.`)
    .option('--socket <path>', 'supervisor socket (default: $SBX_SOCKET or the default path)')
    .option('--url <url>', 'the remote listener of a supervisor, ws://HOST:PORT or wss://HOST:PORT (default: $SBX_URL)')
    .option('--token-file <file>', 'its bearer token (default: $SBX_TOKEN_FILE, or the token in $SBX_TOKEN)')
    .option('--json', 'machine-readable output');
}

/** Global options merged with the subcommand's own. */
function globals(o: object): GlobalOptions {
  const g: GlobalOptions = { ...program.opts<GlobalOptions>(), ...Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) };
  useSocket(where(g));
  return g;
}

// --- The commands.

/** The commander definition of every command; exported for scripts/docs/generate.ts (man/sbx.1). */
export const program: Command = new Command()
  .name('sbx')
  .description('Launch commands through sandbox-supervisor and read their output and receipts.')
  .version(VERSION)
  .option('--socket <path>', 'supervisor socket (default: $SBX_SOCKET or the default path)')
  .option(
    '--url <url>',
    'the remote listener of a supervisor, ws://HOST:PORT or wss://HOST:PORT (default: $SBX_URL; token: --token-file, $SBX_TOKEN_FILE or $SBX_TOKEN)',
  )
  .option('--token-file <file>', 'the bearer token of --url (default: $SBX_TOKEN_FILE, or the token in $SBX_TOKEN)')
  .option('--json', 'machine-readable output')
  .enablePositionalOptions()
  .showHelpAfterError("See 'sbx --help'.")
  .exitOverride((err) => process.exit(err.exitCode === 0 ? 0 : FAILURE))
  // --help and --version are written before commander exits at once: written synchronously, so a
  // failed write is seen (stdoutFailed), not lost to an 'error' event the exit never waits for.
  .configureOutput({
    writeOut: (text) => {
      try {
        writeSync(1, text);
      } catch (err) {
        stdoutFailed(systemError(err), process.stdout);
      }
    },
  });

sub('run')
  .description('launch CMD and stream its stdout/stderr; exit with its status')
  .usage('[options] -- CMD [ARG...]')
  .argument('<cmd...>', 'the command and its arguments')
  .option('--key <key>', 'invocation key (idempotency): a retry returns the existing session')
  .option('--task <task>', 'the task the session belongs to (default: the task "default"); sbx close --task T joins over its sessions')
  .option('--timeout <dur>', 'deadline (0: none), e.g. 30s, 1m30s', duration, 0)
  .option('--grace <dur>', 'TERM→KILL grace, e.g. 10s', duration)
  .option('-w, --cwd <dir>', 'working directory (default: the current one; with --url, the first watched workspace, else /)')
  .option('-e, --env <NAME=VALUE>', 'set an environment variable (repeatable)', collectEnv, {})
  .option('--inherit-env', "add this shell's whole environment")
  .option('-u, --user <name|uid>', 'run as this user (the supervisor must be root)')
  .option('-t, --pty', 'give the command a pseudo-terminal (one output stream, "pty")')
  .option('--cols <n>', "pty width (default: this terminal's, else 80)", positiveInt)
  .option('--rows <n>', "pty height (default: this terminal's, else 24)", positiveInt)
  .option(
    '-i, --stdin',
    "stream this CLI's stdin into the session; without it the command's stdin is /dev/null (as docker run without -i): sbx run -- cat returns at once",
  )
  .addOption(
    new Option(
      '--linger <policy>',
      "descendants left when the leader exits: handoff (they go on as a service of their own: sbx ps), kill (TERM, grace, KILL) or wait (default: the supervisor's session.defaultLinger, handoff; kill with --pty or in subreaper mode)",
    ).choices(['handoff', 'kill', 'wait']),
  )
  .option(
    '--service',
    'start a service: a session meant to keep running (a dev server, a database); prints its id and returns, as --detach; sbx close --task ends it',
  )
  .option('--keep-after-close', "with --service: the service outlives its task's close (sbx close --task); the sandbox-wide sbx close ends it")
  .option('-q, --quiet', "say nothing of sbx's own on stderr but errors and warnings (not the line on what became of leftover processes)")
  .option(
    '--memory <size>',
    "memory.max of the session's cgroup: bytes, or with a 1024-based unit K, M, G, T (or KiB, MiB, GiB, TiB), e.g. 64M, 1.5G; no swap past it; past it the OOM killer ends a process (the receipt says oom_kill)",
    sizeOption,
  )
  .option('--pids <n>', "pids.max of the session's cgroup: at most N tasks (processes and threads) at once; a fork past it fails (EAGAIN)", pidsOption)
  .option('--cpus <x>', "cpu.max of the session's cgroup: X CPUs' worth of time per 100 ms (0.5: half of one CPU; at least 0.01)", cpusOption)
  .addOption(new Option('--on-disconnect <policy>', 'what a lost connection does to the session').choices(['continue', 'cancel']).default('continue'))
  .option('-d, --detach', 'print the session id and return at once')
  .option('--receipt <file>', 'write the receipt as JSON to FILE when the session ends')
  .passThroughOptions()
  .action(
    async (
      cmd: string[],
      o: {
        key?: string;
        task?: string;
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
        linger?: 'handoff' | 'kill' | 'wait';
        service?: boolean;
        keepAfterClose?: boolean;
        quiet?: boolean;
        memory?: number;
        pids?: number;
        cpus?: number;
        onDisconnect: 'continue' | 'cancel';
        detach?: boolean;
        receipt?: string;
      },
    ) => {
      const g = globals(o);
      if (o.keepAfterClose && !o.service) fail('INVALID_ARGUMENT: --keep-after-close is for a service: add --service');
      if (o.service && o.receipt)
        fail(
          'INVALID_ARGUMENT: --service with --receipt: a service is detached, and sbx is gone before it ends; get the receipt later with sbx wait ID (or sbx receipt ID)',
        );
      if (o.service) o.detach = true;
      // A size with no pty would be dropped unsaid: refused, so a forgotten -t is seen.
      if (!o.pty && (o.cols !== undefined || o.rows !== undefined)) fail('INVALID_ARGUMENT: --cols and --rows are the size of a pty: add --pty (-t)');
      if (o.detach && o.onDisconnect === 'cancel') {
        fail(
          'INVALID_ARGUMENT: --detach with --on-disconnect cancel: a detached sbx closes its connection at once, which would cancel the session; drop one of them',
        );
      }
      if (o.detach && o.receipt) {
        fail(
          'INVALID_ARGUMENT: --detach with --receipt: a detached sbx is gone before the session ends; get the receipt later with sbx wait ID (or sbx receipt ID)',
        );
      }
      cmd = commandArgv ?? cmd;
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
        if (!said) stderrLine(escapeControls(line));
        said = true;
      };
      // Signals from now on are the session's (a detached sbx keeps the default actions).
      const signals = o.detach ? null : takeSignals();
      const { client, launched } = await launchUntilAnswered(
        g,
        {
          argv: cmd,
          env: o.env,
          inherit_env: o.inheritEnv ? inheritedEnv() : undefined,
          // A key before the first send, so a resend after a drop finds this launch's session.
          invocation_key: o.key ?? newInvocationKey(),
          task: o.task,
          timeout_ms: o.timeout,
          grace_ms: o.grace,
          linger: o.linger,
          ...(o.service ? { service: true, ...(o.keepAfterClose ? { keep_after_close: true } : {}) } : {}),
          memory_max_bytes: o.memory,
          pids_max: o.pids,
          cpus: o.cpus,
          on_disconnect: o.onDisconnect,
          user: o.user,
          // A terminal that reports 0x0 (some consoles and CI ptys) counts as none: 80x24.
          pty: o.pty ? { cols: o.cols ?? (process.stdout.columns || 80), rows: o.rows ?? (process.stdout.rows || 24) } : undefined,
          stdin: o.stdin,
        },
        o.cwd,
        Boolean(o.detach),
        say,
      );
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
      // A dropped connection (the supervisor restarting) is waited for: one line says so at once.
      const reconnecting = reconnectingLine(where(g));
      const conn = new ReconnectingClient({ ...endpointOf(g), clientName: 'sbx', onReconnecting: reconnecting }, client);
      signals?.to(conn, launched.session_id);
      attachedSession = launched.session_id;
      const sel = { session_id: launched.session_id };
      let receipt: Receipt;
      // Our terminal's size follows us (the launch took it): SIGWINCH is sent on as a resize.
      if (o.pty) forwardTerminalSize(conn, sel, false);
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
          ? [pipeOutput(g, sel, 'pty', process.stdout, 0, true, reconnecting)]
          : [pipeOutput(g, sel, 'stdout', process.stdout, 0, true, reconnecting), pipeOutput(g, sel, 'stderr', process.stderr, 0, true, reconnecting)];
        // A replay whose output retention removed still ends with the recorded status.
        let removedSaid = false;
        const outputRemoved = (err: unknown) => {
          if (!isSupervisorError(err) || err.code !== 'OUTPUT_REMOVED') throw err;
          if (!removedSaid) warn(`${err.message}`);
          removedSaid = true;
        };
        const printed = Promise.all(outputs.map((p) => p.catch(outputRemoved)));
        // Looked at beside the output: a session that turns unknown may never end its streams.
        const ended = receiptUnlessUnknown(conn, sel, waiting, say, printed);
        ended.catch(() => {});
        await printed;
        receipt = await ended;
        attachedSession = null; // ended: nothing goes on
      } catch (err) {
        fail(describe(err));
      }
      if (receipt.spawn_error) {
        const why = { ENOENT: 'not found', ENOTDIR: 'not found', EACCES: 'permission denied', ENOEXEC: 'exec format error', E2BIG: 'argument list too long' }[
          receipt.spawn_error.code
        ];
        // Stage spawn: the supervisor could not start the exec shim at all (its log says why);
        // the command itself was never looked up.
        if (receipt.spawn_error.stage === 'spawn')
          warn(`${cmd[0]}: the supervisor could not start it (spawn failed: ${receipt.spawn_error.code}; its log says why)`);
        else warn(`${cmd[0]}: ${why ?? receipt.spawn_error.code} (${receipt.spawn_error.stage} failed: ${receipt.spawn_error.code})`);
      }
      // What the exit status cannot say: who ended it, bytes that were not stored, a status nobody saw.
      // What became of leftover processes, once (the exit status is the leader's).
      const leftovers = leftoversLine(receipt);
      if (leftovers && !o.quiet) stderrLine(leftovers);
      const oom = oomLine(receipt);
      if (oom) warn(oom);
      if (receipt.termination.cause === 'shutdown') {
        warn(
          `session ${receipt.session_id} was ended because the supervisor is stopping (${receipt.outcome}, cause shutdown; sbx receipt ${receipt.session_id})`,
        );
      }
      // An escape the operator attested already (a replay of the key) says so.
      const attested =
        receipt.death.evidence === 'cgroup_escaped'
          ? await conn
              .run((c) => c.receipt({ session_id: receipt.session_id }))
              .then(
                (a) => a.escape_attested ?? null,
                () => null,
              )
          : null;
      const escaped = escapedLine(receipt, attested);
      if (escaped) warn(escaped);
      if (receipt.outcome === 'owner_lost') {
        warn(`${ownerLostLine(receipt)}`);
      } else {
        for (const [name, out] of Object.entries(receipt.output)) {
          if (out && !out.complete)
            warn(
              `${name} is incomplete: ${out.reason}${out.dropped_bytes ? `, ${out.dropped_bytes} bytes not stored` : ''} (sbx receipt ${receipt.session_id})`,
            );
        }
      }
      // The command's code, 128+N for a signal, 124 for the deadline; 125 (FAILURE) is sbx's own: the supervisor
      // or the request failed.
      process.exitCode = exitStatusOf(receipt, signalNumber);
      if (receiptDir) {
        try {
          writeOutputFile(receiptDir, Buffer.from(JSON.stringify(receipt, null, 2) + '\n'));
        } catch (err) {
          const e = err as OutputFileError;
          const why = e.refused ? `${e.reason}; sbx never writes through or replaces a link (the session's directory may hold one it planted)` : e.reason;
          warn(`--receipt ${e.path}: not written: ${why}; the supervisor keeps the receipt: sbx receipt ${receipt.session_id}`);
          process.exitCode = FAILURE;
        }
        closeOutputDir(receiptDir);
      }
      process.stdout.write('', () => process.exit());
    },
  );

attachCommand(sub('attach'), {
  endpoint: (o) => endpointOf(globals(o)),
  where: (o) => where(globals(o)),
  selector,
  fail,
});

/**
 * kill/cancel of a session retention removed: it has ended, as one not removed (exit 1, the
 * docs/reference/exit-statuses.md), not a session that never was (SESSION_NOT_FOUND, 125).
 */
function retiredOr(sel: SessionSelector, verb: string): (err: unknown) => never {
  return (err) => {
    if (isSupervisorError(err, 'SESSION_NOT_FOUND') && typeof err.details?.retired_at === 'string') {
      const what = sel.session_id !== undefined ? `session ${sel.session_id}` : `the session of key ${JSON.stringify(sel.invocation_key)}`;
      const ended = typeof err.details.outcome === 'string' ? err.details.outcome : null;
      fail(
        `${what} was not ${verb}: it ended${ended ? ` (${ended.replace('_', ' ')})` : ''} and was removed by the retention policy at ${err.details.retired_at}; nothing of it runs`,
        ENDED_ALREADY,
      );
    }
    throw err;
  };
}

sub('cancel')
  .description('end the session: SIGTERM to every process, SIGKILL after the grace')
  .argument('[id]', 'session id (or a unique prefix of 3+ characters)')
  .option('--key <key>', 'select the session by invocation key')
  .option('--grace <dur>', "TERM→KILL grace (default: the session's)", duration)
  .action(async (id: string | undefined, o: { key?: string; grace?: number }) => {
    const g = globals(o);
    const sel = selector(id, o.key);
    const r = await call(g, async (c) => {
      const answer = await c.request('cancel', { ...sel, grace_ms: o.grace }).catch(retiredOr(sel, 'cancelled'));
      return { answer, ended: answer.state === 'ended' ? await c.receipt(sel) : null };
    });
    if (g.json) printJson(r.answer);
    // As docker kill of a stopped container: nothing was done, so not 0.
    if (r.ended) fail(`session ${r.answer.session_id} was not cancelled: ${endedAs(r.ended.receipt)}; nothing of it runs`, ENDED_ALREADY);
  });

sub('kill')
  .description('send a signal to every process of the session (default SIGKILL, as docker kill)')
  .argument('[id]', 'session id (or a unique prefix of 3+ characters)')
  .option('--key <key>', 'select the session by invocation key')
  .option('--signal <sig>', 'signal name or number', 'SIGKILL')
  .action(async (id: string | undefined, o: { key?: string; signal: string }) => {
    const g = globals(o);
    const signal = /^\d+$/.test(o.signal) ? Number(o.signal) : o.signal.toUpperCase();
    const sel = selector(id, o.key);
    const r = await call(g, async (c) => {
      const answer = await c.request('kill', { ...sel, signal }).catch(retiredOr(sel, 'signalled'));
      // No process reached: ended (docker kill: "is not running"), or between its leader and its receipt.
      return { answer, ended: answer.pids === 0 ? await c.receipt(sel) : null };
    });
    // --json says so too: a script reading stdout alone sees that nothing was signalled, and why.
    if (g.json) printJson(r.ended?.state === 'ended' ? { ...r.answer, ended: true, outcome: r.ended.receipt?.outcome ?? null } : r.answer);
    if (r.ended?.state === 'ended') fail(`session ${r.answer.session_id} was not signalled: ${endedAs(r.ended.receipt)}; nothing of it runs`, ENDED_ALREADY);
  });

sub('verify')
  .description(
    "check a receipt's, close receipt's, task receipt's or checkpoint manifest's signature and, with the state dir (or --store), every stored byte it names (works with the supervisor stopped; exit 0 says it is authentic, not that a task is complete: read its complete)",
  )
  .argument(
    '<file|checkpoint>',
    'a receipt, close receipt or task receipt as JSON (sbx receipt ID > r.json, --receipt FILE, sbx close --task T > t.json), a checkpoint manifest (<state>/checkpoints/manifests/<id>.json), or a checkpoint id',
  )
  .option('--public-key <file>', 'the public key, SPKI PEM (default: receipt-key.pub in the state dir)')
  .addOption(deprecatedKeyOption())
  .option('--state-dir <dir>', 'also re-read the chunk files (or checkpoint objects) there and check cursors and digests')
  .option('--store <dir|s3://bucket/prefix>', 'a checkpoint manifest: the store to re-hash its objects from (default with --state-dir: its checkpoints/)')
  .action(async (file: string, o: { publicKey?: string; key?: string; stateDir?: string; store?: string; json?: boolean }) => {
    const g = globals(o);
    const key = publicKeyFile('verify', o);
    // Loaded here only: run, the common case, starts faster without it (docs/design/facts.md 17).
    const { verifyCloseSessions, verifyCloseTasks, verifySignature, verifyStoredOutput } = await import('../core/receipts/verify.js');
    let receipt: Receipt;
    let bytes: Buffer | null = null;
    try {
      bytes = readFileSync(file);
      receipt = JSON.parse(bytes.toString('utf8')) as Receipt;
    } catch (err) {
      if (bytes === null && /^(sha256:)?[0-9a-fA-F]{8,64}$/.test(file))
        receipt = { kind: 'checkpoint' } as unknown as Receipt; // a checkpoint id: read from the store
      else fail(`INVALID_ARGUMENT: cannot read the receipt ${file}: ${(err as Error).message}`);
    }
    // What it is, when it is none of the signed things this verifies: said, never a "MISMATCH".
    const shape = (typeof receipt === 'object' && receipt !== null ? receipt : {}) as {
      kind?: unknown;
      checkpoint_id?: unknown;
      session_id?: unknown;
      output?: unknown;
      signature?: unknown;
    };
    if (shape.kind === 'checkpoint_published')
      fail(
        `INVALID_ARGUMENT: ${file} is a checkpoint's published record, not its manifest: verify checkpoint ${String(shape.checkpoint_id)} by its id (sbx verify ${String(shape.checkpoint_id)} --state-dir DIR) or its manifest (<state>/checkpoints/manifests/${String(shape.checkpoint_id)}.json)`,
      );
    if (shape.kind === undefined && typeof shape.checkpoint_id === 'string' && shape.signature === undefined)
      fail(
        `INVALID_ARGUMENT: ${file} is a checkpoint result (sbx checkpoint --json), which is not signed: verify the checkpoint itself: sbx verify ${shape.checkpoint_id}`,
      );
    if (shape.kind === undefined && (typeof shape.session_id !== 'string' || typeof shape.output !== 'object' || shape.output === null))
      fail(`INVALID_ARGUMENT: ${file} is not a receipt, close receipt, task receipt or checkpoint manifest (sbx verify --help says what each is)`);
    if (shape.kind === 'checkpoint') {
      const { verifyManifestCommand } = await import('./checkpoints.js');
      // A checkpoint id is read from the store: the one chosen, else the supervisor's (offlineStore).
      // A file: its key from the state dir chosen, else the local supervisor's (verifyStateDir); its objects only from one chosen.
      const found = bytes === null ? null : await verifyStateDir(g, o);
      const where =
        bytes === null
          ? await offlineStore(g, o)
          : { stateDir: o.stateDir ?? found?.stateDir ?? defaultStateDir(), stateDirGiven: o.stateDir !== undefined, store: o.store };
      return verifyManifestCommand(file, bytes, {
        ...where,
        key,
        json: g.json,
        // A state dir chosen (--state-dir, or $SBX_STATE_DIR as every other command takes it) or a store: its objects are checked too.
        withStore: storeChosen(o),
      });
    }
    // No state dir chosen: the local supervisor's, when one answers (its key, its sessions), else the default.
    const found = await verifyStateDir(g, o);
    const here = found?.stateDir ?? defaultStateDir();
    const keyFile = key ?? join(o.stateDir ?? here, 'receipt-key.pub');
    let keyPem: string;
    try {
      keyPem = readFileSync(keyFile, 'utf8');
    } catch (err) {
      fail(`INVALID_ARGUMENT: cannot read the public key ${keyFile} (give --public-key FILE): ${(err as Error).message}`);
    }
    if ((receipt as unknown as { kind?: string }).kind === 'task') {
      const { verifyTaskCommand } = await import('./tasks.js');
      return verifyTaskCommand(receipt as unknown as TaskReceipt, keyPem, { stateDir: o.stateDir ?? here, store: o.store ?? found?.store, json: g.json });
    }
    const problems = verifySignature(receipt, keyPem);
    const isClose = (receipt as unknown as { kind?: string }).kind === 'close';
    // A session receipt's stored bytes are re-read from --state-dir, else from the local
    // supervisor's or the default state dir ($SBX_STATE_DIR) when it holds that session, as a
    // task receipt's are: an OK never rests on the signature alone while the bytes are at hand.
    const stateDir =
      o.stateDir ?? (!isClose && typeof receipt.session_id === 'string' && existsSync(join(here, 'sessions', receipt.session_id)) ? here : undefined);
    if (stateDir && problems.length === 0) {
      if (isClose) {
        for (const p of verifyCloseSessions(receipt as unknown as CloseReceipt, stateDir, keyPem)) problems.push(p);
        for (const p of verifyCloseTasks(receipt as unknown as CloseReceipt, stateDir)) problems.push(p);
      } else {
        // Every stored byte is re-read and hashed: a line on a terminal counts chunk files and bytes.
        const chunks = Object.values(receipt.output).flatMap((s) => s?.chunks ?? []);
        const progress = new Progress(`verify ${receipt.session_id}`);
        const done = { objects: 0, totalObjects: chunks.length, bytes: 0, totalBytes: chunks.reduce((n, c) => n + c.length, 0) };
        progress.counts(done);
        const stored = verifyStoredOutput(receipt, stateDir, (bytes) => progress.counts({ ...done, objects: ++done.objects, bytes: (done.bytes += bytes) }));
        for (const p of stored) problems.push(p);
        progress.done();
      }
    }
    if (g.json) printJson({ ok: problems.length === 0, key_id: receipt.signature?.key_id ?? null, problems });
    else if (problems.length === 0 && isClose) {
      const n = (receipt as unknown as CloseReceipt).sessions.length;
      process.stdout.write(
        `OK: close receipt signed by ${receipt.signature!.key_id}${stateDir ? `; the ${n} session receipts it lists match` : '; signature only (--state-dir DIR also checks the session receipts it lists)'}\n`,
      );
    } else if (problems.length === 0) {
      const streams = Object.entries(receipt.output)
        .map(([n, s]) => `${n} ${s!.final_cursor} bytes`)
        .join(', ');
      process.stdout.write(
        `OK: signed by ${receipt.signature!.key_id}${stateDir ? `; stored output matches (${streams})` : `; signature only (the state dir ${here} does not hold this session: --state-dir DIR re-reads its stored output)`}\n`,
      );
    } else for (const p of problems) process.stdout.write(`MISMATCH: ${escapeControls(p)}\n`);
    // Another key than the receipt's: say which one was taken when none was named.
    if (!key && !g.json && receipt.signature && problems.some((p) => p.includes('the key checked against'))) {
      warn(
        `the key checked against is ${keyFile} (${o.stateDir ? 'in --state-dir' : found ? "the local supervisor's" : "the default state dir's"}); a receipt from another supervisor needs its key: --public-key FILE or --state-dir DIR`,
      );
    }
    process.exitCode = problems.length === 0 ? 0 : 1;
  });

sub('write')
  .description("write this CLI's stdin to a session started with --stdin")
  .argument('[id]', 'session id (or a unique prefix of 3+ characters)')
  .option('--key <key>', 'select the session by invocation key')
  .option('--eof', "then close the session's stdin")
  .action(async (id: string | undefined, o: { key?: string; eof?: boolean }) => {
    const g = globals(o);
    const sel = selector(id, o.key);
    const client = await connect(g);
    try {
      let last: { session_id: string; cursor: number } | null = null;
      if (!process.stdin.isTTY) {
        for await (const chunk of process.stdin) last = await client.request('write', { ...sel, data: chunk as Buffer });
      }
      // Nothing read (or only --eof): still one request, so a wrong session is an error.
      if (o.eof || !last) last = await client.request('write', { ...sel, data: Buffer.alloc(0), eof: Boolean(o.eof) });
      // --json: the session and the cursor of the writes without a writer token after this one.
      if (g.json) printJson({ ...last, eof: Boolean(o.eof) });
    } catch (err) {
      fail(describe(err));
    }
    client.close();
  });

sub('resize')
  .description("set a pty session's terminal size")
  .usage('(ID | --key K) COLS ROWS [options]')
  .argument('[id]', 'session id (or a unique prefix of 3+ characters); absent with --key')
  .argument('[cols]', 'columns (1-65535)')
  .argument('[rows]', 'rows (1-65535)')
  .option('--key <key>', 'select the session by invocation key')
  .action(async (first: string | undefined, second: string | undefined, third: string | undefined, o: { key?: string }) => {
    // With --key the ID is absent, and commander fills the positions from the left.
    const given = [first, second, third].filter((a): a is string => a !== undefined);
    const usage = 'sbx resize ID COLS ROWS, or sbx resize --key K COLS ROWS';
    if (o.key !== undefined && given.length === 3 && !/^\d+$/.test(given[0]!)) fail('give a session ID or --key, not both');
    const wanted = o.key === undefined ? 3 : 2;
    if (given.length !== wanted) fail(`INVALID_ARGUMENT: ${given.length < wanted ? 'give COLS and ROWS' : 'too many arguments'}: ${usage}`);
    const [id, cols, rows] = (o.key === undefined ? given : [undefined, ...given]) as [string | undefined, string, string];
    const sel = selector(id, o.key);
    const size = { cols: positiveInt(cols), rows: positiveInt(rows) };
    const g = globals(o);
    const answer = await call(g, (c) => c.request('resize', { ...sel, ...size }));
    if (g.json) printJson(answer); // { session_id, cols, rows }
  });

sub('logs')
  .description(
    'print stdout (fd 1) and stderr (fd 2) as docker logs, or one stream from a byte cursor, or both merged in arrival order, timestamped, selected by time or lines',
  )
  .argument('[id]', 'session id (or a unique prefix of 3+ characters)')
  .option('--key <key>', 'select the session by invocation key')
  .option('--from <n>', 'start at byte cursor N (one stream)', (v) => {
    if (!/^\d+$/.test(v) || !Number.isSafeInteger(Number(v))) throw new InvalidArgumentError('--from takes a non-negative integer');
    return Number(v);
  })
  .addOption(
    new Option(
      '--stream <name>',
      "stream to read (default: stdout to fd 1 and stderr to fd 2, as docker logs; pty for a pty session; with --from, stdout's cursor); all: stdout and stderr merged in arrival order on stdout",
    ).choices(['stdout', 'stderr', 'pty', 'all']),
  )
  .option('-f, --follow', 'keep reading until the stream (every stream) is final')
  .option('-t, --timestamps', 'prefix each line with the arrival of the read carrying its first byte (RFC 3339, µs, UTC)')
  .option(
    '--since <time>',
    'reads arrived at or after TIME: RFC 3339, a local time without a zone (2026-12-03T10:00:00, 2026-12-03 10:00, 2026-12-03; in $TZ), a Unix time, or a duration ago (10m, 1h30m)',
  )
  .option('--until <time>', 'reads arrived at or before TIME (as --since)')
  .option('-n, --tail <n>', 'the last N lines of what is selected (all: every line)')
  .action(
    async (
      id: string | undefined,
      o: { key?: string; from?: number; stream?: StreamName | 'all'; follow?: boolean; timestamps?: boolean; since?: string; until?: string; tail?: string },
    ) => {
      const g = globals(o);
      const sel = selector(id, o.key);
      // No --stream: both streams, each to its own fd (docker logs); --from is one stream's
      // cursor, so with it (and no --stream) stdout alone, as before.
      const split = o.stream === undefined && o.from === undefined;
      const indexed = o.stream === 'all' || o.timestamps || g.json || o.since !== undefined || o.until !== undefined || o.tail !== undefined;
      if (o.stream === 'all' && o.from !== undefined)
        fail('INVALID_ARGUMENT: --from is a cursor of one stream; --stream all merges two (select by time with --since/--until, or by lines with --tail)');
      let tailLines: number | undefined;
      if (o.tail !== undefined && o.tail !== 'all') {
        if (!/^\d+$/.test(o.tail) || !Number.isSafeInteger(Number(o.tail)))
          fail(`INVALID_ARGUMENT: --tail takes a number of lines (0 or more) or all, got ${JSON.stringify(o.tail)}`);
        tailLines = Number(o.tail);
      }
      const nowUs = Date.now() * 1000;
      const time = (text: string | undefined, flag: string): number | undefined => {
        if (text === undefined) return undefined;
        try {
          return parseTimeUs(text, nowUs, flag);
        } catch (err) {
          fail(`INVALID_ARGUMENT: ${(err as Error).message}`);
        }
      };
      const sinceUs = time(o.since, '--since');
      const untilUs = time(o.until, '--until');
      const first = await connect(g); // a clear message now if no supervisor is there
      let streams: StreamName[] = o.stream === 'all' || split ? ['stdout', 'stderr'] : [o.stream ?? 'stdout'];
      let admittedAtUs = 0;
      if (!o.stream || indexed) {
        try {
          const { sessions } = await first.ps(true);
          const found = sel.session_id ? byIdOrPrefix(sessions, sel.session_id) : sessions.find((s) => s.invocation_key === sel.invocation_key);
          if (found && found.cursors.pty !== undefined && (!o.stream || o.stream === 'all')) streams = ['pty'];
          if (found) admittedAtUs = Date.parse(found.admitted_at) * 1000;
        } catch (err) {
          fail(describe(err));
        }
      }
      first.close();
      try {
        // A follow waits for a supervisor that went away: one line says so at once, as run's does.
        const reconnecting = reconnectingLine(where(g));
        if (!indexed) {
          // Without --stream each stream to its fd (no merge to keep: two fds), as sbx run
          // streams them; one selected stream (--stream stderr too) is printed on stdout.
          const outs = streams.map((s) =>
            pipeOutput(g, sel, s, split && s === 'stderr' ? process.stderr : process.stdout, o.from ?? 0, o.follow ?? false, reconnecting),
          );
          return void (await Promise.all(outs));
        }
        const sinkTo = (out: NodeJS.WriteStream) => (g.json ? new JsonSink(out) : o.timestamps ? new TimestampSink(out) : new RawSink(out));
        // --json: one record stream (each names its stream) on stdout; else stderr's bytes to fd 2.
        const out =
          split && !g.json && streams.length === 2 ? new SplitSink({ stderr: sinkTo(process.stderr) }, sinkTo(process.stdout)) : sinkTo(process.stdout);
        const sink = tailLines === undefined ? out : new TailSink(tailLines, out);
        await mergeStreams(
          {
            ...endpointOf(g),
            selector: sel,
            streams,
            from: o.from,
            follow: o.follow ?? false,
            sinceUs,
            untilUs,
            noRecordAtUs: admittedAtUs,
            onReconnecting: reconnecting,
          },
          sink,
        );
      } catch (err) {
        fail(describe(err));
      }
    },
  );

sub('resolve')
  .description(
    'end a session stuck unknown on your word: evidence operator_attested (never automatic); or, for an ended session whose receipt says cgroup_escaped, attest that what left its cgroup is ended (complete(task) then counts it, showing your word)',
  )
  .argument('[id]', 'session id (or a unique prefix of 3+ characters)')
  .option('--key <key>', 'select the session by invocation key')
  .option('--as-operator', 'required: you attest that nothing of the session runs any more')
  .requiredOption('--reason <text>', 'why you know it is over (recorded in the receipt, or for an escape in escape-attested.json and the task receipt)')
  .option('--force', 'for an escape: attest even while a destination cgroup the receipt names still holds processes (refused without it)')
  .action(async (id: string | undefined, o: { key?: string; asOperator?: boolean; reason: string; force?: boolean }) => {
    const g = globals(o);
    if (!o.asOperator) fail('INVALID_ARGUMENT: resolve needs --as-operator: it records your word, not evidence');
    const receipt = await call(g, (c) =>
      c.request('resolve', { ...selector(id, o.key), as_operator: true, reason: o.reason, ...(o.force ? { force: true } : {}) }),
    );
    printJson(receipt);
    if (receipt.death.evidence === 'cgroup_escaped')
      warn(
        `session ${receipt.session_id}: your word that what left its cgroup is ended is recorded (escape-attested.json in its directory of the state dir, sessions/${receipt.session_id}/); the receipt stays as it was, and the next close counts the session`,
      );
  });

sub('wait')
  .description('wait for the receipt, print it, exit with the session status')
  .argument('[id]', 'session id (or a unique prefix of 3+ characters)')
  .option('--key <key>', 'select the session by invocation key')
  .action(async (id: string | undefined, o: { key?: string }) => {
    const g = globals(o);
    const sel = selector(id, o.key);
    const conn = new ReconnectingClient({ ...endpointOf(g), clientName: 'sbx', onReconnecting: reconnectingLine(where(g)) }, await connect(g));
    let receipt: Receipt;
    try {
      receipt = await receiptUnlessUnknown(
        conn,
        sel,
        conn.run((c) => c.wait(sel)),
        (line) => stderrLine(escapeControls(line)),
      );
    } catch (err) {
      fail(describe(err));
    }
    printJson(receipt);
    const attested =
      receipt.death.evidence === 'cgroup_escaped'
        ? await conn
            .run((c) => c.receipt({ session_id: receipt.session_id }))
            .then(
              (a) => a.escape_attested ?? null,
              () => null,
            )
        : null;
    conn.drop();
    if (receipt.outcome === 'owner_lost') warn(`${ownerLostLine(receipt)}`);
    const oom = oomLine(receipt);
    if (oom) warn(oom);
    const escaped = escapedLine(receipt, attested);
    if (escaped) warn(escaped);
    process.exitCode = exitStatusOf(receipt, signalNumber);
  });

sub('receipt')
  .description('print the receipt of an ended session')
  .argument('[id]', 'session id (or a unique prefix of 3+ characters)')
  .option('--key <key>', 'select the session by invocation key')
  .action(async (id: string | undefined, o: { key?: string }) => {
    const g = globals(o);
    const answer = await call(g, (c) => c.receipt(selector(id, o.key)));
    if (!answer.receipt) fail(`session is ${answer.state}: no receipt yet`, 1);
    printJson(answer.receipt);
  });

sub('changes')
  .description('what a session created, modified, deleted and renamed in the workspaces, in order')
  .argument('[id]', 'session id (or a unique prefix of 3+ characters)')
  .option('--key <key>', 'select the session by invocation key')
  .action(async (id: string | undefined, o: { key?: string }) => {
    const g = globals(o);
    const answer = await call(g, (c) => c.changes(selector(id, o.key)));
    if (g.json) return printJson(answer);
    if (answer.workspaces.length === 0) process.stdout.write('no workspaces are watched (workspace.paths, serve --workspace)\n');
    for (const ws of answer.workspaces) {
      const facts = [
        ws.terminal_mutation !== null
          ? `terminal_mutation ${ws.terminal_mutation}`
          : answer.state === 'ended'
            ? 'no terminal_mutation'
            : `session ${answer.state}`,
        ws.gap ? `gap ${ws.gap}: the events are incomplete, see the receipt's scan` : null,
        ws.unattributed_events !== null ? `${ws.unattributed_events} ${ws.unattributed_events === 1 ? 'event' : 'events'} no session claimed meanwhile` : null,
        ws.dropped ? `${ws.dropped} changes past the log's bound, not listed` : null,
      ].filter(Boolean);
      process.stdout.write(`${escapeControls(ws.path)} (${escapeControls(facts.join('; '))})\n`);
      if (ws.changes.length === 0) process.stdout.write('  (no changes attributed to the session)\n');
      const width = ws.changes.reduce((m, c) => Math.max(m, String(c.seq).length), 0);
      for (const c of ws.changes) {
        // One change a line: a newline or other control character in a name is shown escaped.
        const show = escapeControls;
        const what = c.kind === 'renamed' ? `${show(c.from!)} -> ${show(c.path)}` : show(c.path);
        process.stdout.write(`  ${String(c.seq).padStart(width)}  ${c.kind.padEnd(9)} ${what}${c.dir ? '/' : ''}\n`);
      }
    }
  });

sub('ps')
  .description(
    'list sessions, newest first, as docker ps: STATUS ("exited 3, 2 min ago", "killed by SIGTERM", "running 12 s"), started, duration, user, task; control characters shown escaped; on a terminal rows fit its width, else COMMAND is cut at 40 characters (--no-trunc: nothing is cut)',
  )
  .option('-a, --all', 'include ended sessions')
  .option('-q, --quiet', 'only the session ids, one a line (newest first; over --json)')
  .option('--task <task>', 'only the sessions of this task (as --filter task=T)')
  .option(
    '-f, --filter <key=value>',
    `only the sessions matching (repeatable: one key repeated is OR, keys AND); keys ${PS_FILTER_KEYS.join(', ')}`,
    (v: string, acc: string[] = []) => [...acc, v],
  )
  .option('--no-trunc', 'do not cut any column')
  .action(async (o: { all?: boolean; quiet?: boolean; task?: string; filter?: string[]; trunc: boolean }) => {
    const g = globals(o);
    let filters: PsFilters;
    try {
      filters = parsePsFilters([...(o.filter ?? []), ...(o.task !== undefined ? [`task=${o.task}`] : [])]);
    } catch (err) {
      fail(`INVALID_ARGUMENT: ${(err as Error).message}`);
    }
    const rows = (await call(g, (c) => c.ps(psNeedsAll(filters, o.all ?? false)))).sessions;
    let sessions: SessionSummary[];
    try {
      // Newest first, as docker ps (by admission: ids sort by it too), the --json output as well.
      sessions = selectPsRows(rows, filters, o.all ?? false);
    } catch (err) {
      fail(`INVALID_ARGUMENT: ${(err as Error).message}`);
    }
    // -q as docker ps -q: the ids alone, for $(sbx ps -q) (over --json, as docker's -q over --format).
    if (o.quiet) return void process.stdout.write(sessions.map((s) => `${s.session_id}\n`).join(''));
    if (g.json) return printJson(sessions);
    const terminalColumns = process.stdout.isTTY ? process.stdout.columns || 80 : null;
    process.stdout.write(psTable(sessions, { nowMs: Date.now(), terminalColumns, noTrunc: !o.trunc }) + unknownNotes(sessions));
  });

sub('status')
  .description('supervisor health: version, generation, mode, sessions, load')
  .action(async (o: GlobalOptions) => {
    const g = globals(o);
    const client = await connect(g);
    try {
      const status = await client.status();
      if (g.json) printJson(status);
      else {
        const sessions =
          Object.entries(status.sessions)
            .map(([k, v]) => `${k} ${v}`)
            .join(', ') || 'none';
        const lines = [
          ['version', `${status.version} (protocol ${status.protocol})`],
          ['instance', `${status.instance}, generation ${status.generation}, pid ${status.pid}`],
          ['mode', status.mode + (status.cgroup ? ` (${status.cgroup})` : '')],
          ...(status.limits ? [['limits', limitsLine(status.limits)]] : []),
          ...(status.escape_watch
            ? [['escapes', status.escape_watch.on ? 'watched (fanotify on cgroup2)' : `not watched: ${status.escape_watch.reason}`]]
            : []),
          ['socket', status.socket],
          ['state dir', status.state_dir],
          ['receipts', `signed by ${status.receipt_key.key_id} (${status.receipt_key.path})`],
          [
            'admission',
            status.admission +
              (status.sealed
                ? ` (sealed at generation ${status.sealed.generation}, ${status.sealed.sealed_at})`
                : status.admission_reason
                  ? `: ${status.admission_reason}`
                  : ''),
          ],
          ['sessions', sessions],
          [
            'storage',
            `${mib(status.storage.state_dir_bytes)} in the state dir, ${mib(status.storage.free_bytes)} free of ${mib(status.storage.total_bytes)} (reserve ${mib(status.storage.reserve_bytes)}, launches need ${mib(status.storage.min_free_bytes)}, retention keeps ${mib(status.storage.keep_free_bytes)} free)`,
          ],
          ['load', `${status.load.loadavg.map((l) => l.toFixed(2)).join(' ')} on ${status.load.cpus} cpus, cpu ${status.machine.cpu_load_percent ?? '-'}%`],
          ['memory', `${mib(status.machine.mem_available_bytes)} available of ${mib(status.machine.mem_total_bytes)}`],
          // The supervisor's (since it started); the machine's after it, named as such.
          ['uptime', `${uptimeText(status.uptime_s)} (since ${status.started_at}; machine up ${uptimeText(status.machine.uptime_s)})`],
          ...(status.workspaces ?? []).map((w) => [
            'workspace',
            `${w.path} (${w.fs}): ${w.mode}, ${w.health}; ${w.events} ${w.events === 1 ? 'event' : 'events'}, ${w.unattributed_events} unattributed`,
          ]),
          ...(status.workspace_unplaced_events
            ? [['unplaced', `${status.workspace_unplaced_events} events whose directory was gone before it could be named (in no workspace)`]]
            : []),
          ...(status.workspace_own_events
            ? [
                [
                  'own events',
                  `${status.workspace_own_events} of the supervisor's own writes read as events and dropped (its state dir and store on a workspace's file system)`,
                ],
              ]
            : []),
          ...(status.checkpoint_store ? [['checkpoints', status.checkpoint_store]] : []),
          ...(status.remote ? [['remote', `${status.remote} (WebSocket; docs/guide/remote.md)`]] : []),
          ...(status.metrics
            ? [['metrics', status.metrics.startsWith('/') ? `${status.metrics} (GET /metrics on the socket)` : `http://${status.metrics}/metrics`]]
            : []),
        ];
        for (const [k, v] of lines) process.stdout.write(`${k.padEnd(10)} ${escapeControls(String(v))}\n`);
      }
    } catch (err) {
      fail(describe(err));
    }
    client.close();
  });

sub('checkpoint')
  .description(
    'a content-addressed, signed checkpoint of a workspace directory, published once its manifest and every object read back exactly; prints its id (exit 1: published, but paths kept changing: not consistent)',
  )
  .requiredOption('--workspace <dir>', 'the directory (absolute or relative to here)')
  .option('--task <task>', 'the task it belongs to')
  .action(async (o: { workspace: string; task?: string }) => {
    const g = globals(o);
    const workspace = resolvePath(o.workspace);
    // On a terminal, what it waits for and for how long (the supervisor answers once it is published).
    const progress = new Progress(`checkpoint ${workspace}`);
    if (!g.json) progress.waiting('the supervisor to scan, store and read back every object');
    // Interrupted, sbx goes; the checkpoint does not (the supervisor owns it): say where to find it.
    process.once('SIGINT', () => {
      progress.done();
      warn(`interrupted; the checkpoint of ${workspace} goes on in the supervisor (sbx checkpoints lists it once published)`);
      process.exit(130);
    });
    const client = await connect(g);
    let r: CheckpointResult;
    try {
      r = await client.checkpoint({ workspace, ...(o.task !== undefined ? { task: o.task } : {}) });
    } catch (err) {
      // --json: the error as JSON on stdout too, for a harness that parses it.
      if (g.json && isSupervisorError(err)) printJson({ error: err.toWire() });
      fail(describe(err));
    } finally {
      client.close();
      progress.done();
    }
    process.exitCode = r.consistent ? 0 : 1;
    if (g.json) return printJson(r);
    process.stdout.write(`${r.checkpoint_id}\n`);
    const n = (k: number, one: string, many = `${one}s`) => `${k} ${k === 1 ? one : many}`;
    const boundary = r.boundary.gap ? `no boundary (gap ${r.boundary.gap})` : `boundary seq ${r.boundary.seq}`;
    const uploaded =
      r.objects.uploaded !== undefined
        ? `, ${r.objects.uploaded} uploaded${r.objects.repaired ? ` (${r.objects.repaired} over bytes that failed their read-back)` : ''}`
        : '';
    warn(
      `published to ${r.store}: ${n(r.scan.entries, 'entry', 'entries')}, ${n(r.scan.files, 'file')}, ${mib(r.scan.bytes)}; ${r.read ? `${r.read.files} read; ` : ''}${n(r.objects.written, 'new object')} (${mib(r.objects.bytes_written)})${r.trees ? ` and ${n(r.trees.written, 'new tree')}` : ''}${uploaded}; ` +
        `read back ${n(r.read_back.objects, 'object')}${readBackParts(r.read_back)}${r.read_back.trees ? ` and ${n(r.read_back.trees.objects, 'tree')}` : ''} in ${r.read_back.ms} ms; ${boundary}; ${r.duration_ms} ms`,
    );
    if (!r.consistent) {
      // A leased path never changed: a lease kept it shut, so it was not captured.
      const leased = new Set(r.leased);
      const changed = r.unstable.filter((p) => !leased.has(p));
      const changedCount = r.unstable_count - r.leased_count;
      if (changedCount > 0) warn(`not consistent: ${n(changedCount, 'path')} changed in every pass (${r.scan.passes}): ${changed.slice(0, 5).join(', ')}`);
      if (r.leased_count > 0)
        warn(
          `not consistent: ${n(r.leased_count, 'path')} held by another process's write lease: not captured: ${r.leased.slice(0, 5).join(', ')}${r.leased_count > 5 ? ', ...' : ''}`,
        );
    }
    if (r.mounts_skipped.length)
      warn(
        `${n(r.mounts_skipped.length, 'mount point')} not entered (recorded as empty directories; what is mounted there is not in the checkpoint): ${r.mounts_skipped.slice(0, 5).join(', ')}${r.mounts_skipped.length > 5 ? ', ...' : ''}`,
      );
  });

/** Where an offline checkpoint command (restore, checkpoints, diff, verify ID) reads: a state dir, and a store when it is not that dir's checkpoints/. */
interface OfflineStore {
  stateDir: string;
  stateDirGiven: boolean;
  store?: string;
}

/**
 * The state dir and store an offline checkpoint command reads (it reads the store directly, so
 * it works with the supervisor stopped): --state-dir and --store as given; else $SBX_STATE_DIR;
 * else the supervisor's own, asked over --socket, $SBX_SOCKET or the default socket (its status:
 * state_dir and checkpoint_store, so a supervisor configured elsewhere is found); when nothing
 * answers there, the default state dir. Fails (INVALID_ARGUMENT) with --url: that supervisor's
 * store is on its machine; and when the --socket (or $SBX_SOCKET) named does not answer: the
 * user named a supervisor, so its store is meant, not the default state dir's.
 */
async function offlineStore(g: GlobalOptions, o: { stateDir?: string; store?: string }): Promise<OfflineStore> {
  if (storeChosen(o)) return { stateDir: o.stateDir ?? defaultStateDir(), stateDirGiven: o.stateDir !== undefined, store: o.store };
  if (remoteEndpoint(g))
    fail(
      'INVALID_ARGUMENT: this command reads the checkpoint store directly, and the supervisor at --url (or $SBX_URL) keeps its store on its own machine: run it there (sbx bridge, or its shell), or give --store s3://bucket/prefix',
    );
  /** The socket the user named (--socket, $SBX_SOCKET), or undefined for the default one. */
  const named = g.socket ?? (process.env.SBX_SOCKET || undefined);
  const asked = await supervisorStore(g);
  if ('store' in asked) return asked.store;
  if (named) fail(asked.failed);
  return { stateDir: defaultStateDir(), stateDirGiven: false };
}

/** Whether the user chose where the store is: --state-dir, --store, or $SBX_STATE_DIR as every other command takes it. */
function storeChosen(o: { stateDir?: string; store?: string }): boolean {
  return o.stateDir !== undefined || o.store !== undefined || Boolean(process.env.SBX_STATE_DIR);
}

/**
 * The state dir and store of the supervisor at --socket, $SBX_SOCKET or the default socket, as
 * its status says (so one configured elsewhere is found), or why none answered within
 * OFFLINE_STATUS_MS.
 */
async function supervisorStore(g: GlobalOptions): Promise<{ store: OfflineStore } | { failed: string }> {
  const named = g.socket ?? (process.env.SBX_SOCKET || undefined);
  let status: StatusResult | null = null;
  try {
    const client = await SupervisorClient.connect({ ...endpointOf(g), clientName: 'sbx', connectTimeoutMs: OFFLINE_STATUS_MS });
    try {
      status = await Promise.race([client.status(), new Promise<null>((resolve) => setTimeout(resolve, OFFLINE_STATUS_MS, null).unref())]);
    } finally {
      client.close();
    }
  } catch (err) {
    return { failed: `${describe(err)} (give --state-dir DIR to read a stopped supervisor's store)` };
  }
  if (status === null)
    return {
      failed: `UNAVAILABLE: the supervisor at ${named ?? 'the default socket'} did not answer status within ${OFFLINE_STATUS_MS} ms (give --state-dir DIR)`,
    };
  const own = join(status.state_dir, STATE.checkpointsDir);
  const store = status.checkpoint_store !== undefined && status.checkpoint_store !== own ? status.checkpoint_store : undefined;
  return { store: { stateDir: status.state_dir, stateDirGiven: false, ...(store !== undefined ? { store } : {}) } };
}

/**
 * The state dir a file given to sbx verify is checked against when none was chosen (--state-dir,
 * --store, $SBX_STATE_DIR): the local supervisor's (supervisorStore), as `sbx verify ID` reads,
 * so its key and stored bytes are found wherever it is configured; null when none answers (then
 * the default state dir, as before).
 */
async function verifyStateDir(g: GlobalOptions, o: { stateDir?: string; store?: string }): Promise<OfflineStore | null> {
  if (storeChosen(o) || remoteEndpoint(g)) return null;
  const asked = await supervisorStore(g);
  return 'store' in asked ? asked.store : null;
}

/** How long an offline command waits for the supervisor's status before it reads the default state dir. */
const OFFLINE_STATUS_MS = 3000;

sub('restore')
  .description(
    'materialise a published checkpoint into an empty or new directory, byte for byte, then compare it with the manifest (reads the store directly: works with the supervisor stopped; exit 1 when it differs)',
  )
  .argument('<checkpoint>', 'checkpoint id (or a unique prefix of 8+ hex digits)')
  .argument('<dir>', 'an empty or new directory')
  .option(
    '--state-dir <dir>',
    "the state dir whose checkpoints/ to read (default: $SBX_STATE_DIR, else the running supervisor's at --socket, else the default path)",
  )
  .option('--store <dir|s3://bucket/prefix>', 'another store (S3: endpoint and credentials from AWS_* environment variables)')
  .option('--public-key <file>', 'the public key, SPKI PEM (default: receipt-key.pub in the state dir)')
  .addOption(deprecatedKeyOption())
  .option('--same-owner', 'give every entry its recorded owner (the default as root, as tar does)')
  .option('--no-same-owner', "every entry is the restorer's; set-ID bits dropped; owners not compared (the default when not root)")
  .action(async (id: string, dir: string, o: { stateDir?: string; store?: string; publicKey?: string; key?: string; sameOwner?: boolean; json?: boolean }) => {
    const g = globals(o);
    const key = publicKeyFile('restore', o);
    const { restoreCommand } = await import('./checkpoints.js');
    await restoreCommand(id, dir, {
      ...(await offlineStore(g, o)),
      key,
      sameOwner: o.sameOwner,
      json: g.json,
    });
  });

sub('checkpoints')
  .description('list the published checkpoints in the store whose manifest and record verify, oldest first (reads the store directly)')
  .option('--workspace <dir>', 'only those of this workspace')
  .option(
    '--state-dir <dir>',
    "the state dir whose checkpoints/ to read (default: $SBX_STATE_DIR, else the running supervisor's at --socket, else the default path)",
  )
  .option('--store <dir|s3://bucket/prefix>', 'another store')
  .option('--public-key <file>', 'the public key, SPKI PEM (default: receipt-key.pub in the state dir): only what verifies is listed')
  .addOption(deprecatedKeyOption())
  .action(async (o: { workspace?: string; stateDir?: string; store?: string; publicKey?: string; key?: string; json?: boolean }) => {
    const g = globals(o);
    const key = publicKeyFile('checkpoints', o);
    const { listCommand } = await import('./checkpoints.js');
    await listCommand({
      ...(await offlineStore(g, o)),
      key,
      workspace: o.workspace,
      json: g.json,
    });
  });

sub('diff')
  .description(
    'what changed from checkpoint A to B, from their manifests (as git diff --name-status: A added, D removed, M modified, T type changed, m mode changed, o owner changed; mtimes not compared); --task T: its latest checkpoint against the one before it, per workspace (reads the store directly; exit 0 identical, 1 differences)',
  )
  .argument('[a]', 'checkpoint id (or a unique prefix of 8+ hex digits): the old side')
  .argument('[b]', 'checkpoint id (or a unique prefix of 8+ hex digits): the new side')
  .option('--task <task>', "the task's latest published checkpoint against the one before it in its workspace (each workspace)")
  .option(
    '--state-dir <dir>',
    "the state dir whose checkpoints/ to read (default: $SBX_STATE_DIR, else the running supervisor's at --socket, else the default path)",
  )
  .option('--store <dir|s3://bucket/prefix>', 'another store')
  .option('--public-key <file>', 'the public key, SPKI PEM (default: receipt-key.pub in the state dir): only what verifies is compared')
  .addOption(deprecatedKeyOption())
  .action(
    async (
      a: string | undefined,
      b: string | undefined,
      o: { task?: string; stateDir?: string; store?: string; publicKey?: string; key?: string; json?: boolean },
    ) => {
      const g = globals(o);
      const key = publicKeyFile('diff', o);
      const { diffCommand } = await import('./checkpoints.js');
      await diffCommand(a, b, {
        ...(await offlineStore(g, o)),
        key,
        task: o.task,
        json: g.json,
      });
    },
  );

sub('gc')
  .description(
    'apply the retention policy now: old output first, then old receipts (never a running session, never a key); in the local checkpoint store, unpublished and expired manifests and every object no kept manifest names',
  )
  .action(async (o: GlobalOptions) => {
    const g = globals(o);
    const r = await call(g, (c) => c.gc());
    if (g.json) printJson(r);
    else if (r.closed) process.stdout.write('nothing removed: the state dir is closed (its close receipt keeps every listed receipt verifiable)\n');
    else {
      process.stdout.write(
        `removed the output of ${r.removed_output.length} session(s) and ${r.retired.length} whole session(s); ${r.freed_bytes} bytes freed\n`,
      );
      const ck = r.checkpoints;
      if (ck)
        process.stdout.write(
          `checkpoints: ${ck.kept_manifests} kept, ${ck.removed_manifests.length} manifest(s) removed, ${ck.removed_objects} unreferenced object(s) removed; ${ck.freed_bytes} bytes freed\n`,
        );
    }
  });

/** sbx seal and sbx close act on one task (--task T) or on the whole sandbox (--all), said explicitly: a forgotten --task must not end the sandbox. */
function taskOrAll(command: string, o: { task?: string; all?: boolean }, json: boolean | undefined): string | null {
  const refuse = (message: string): never => {
    // --json: the error as JSON on stdout too, as every other refusal of the command.
    if (json) printJson({ error: new SupervisorError('INVALID_ARGUMENT', message, { field: 'task' }).toWire() });
    fail(`INVALID_ARGUMENT: ${message}`);
  };
  if (o.task !== undefined && o.all) refuse(`${command}: --task and --all contradict each other (one task, or every task)`);
  if (o.task === undefined && !o.all) refuse(`${command} needs --task T (that task only) or --all (every task, the whole sandbox, for good); nothing was sent`);
  return o.task ?? null;
}

sub('seal')
  .description(
    'stop admission for good: with --task T, of that task only (other tasks go on); with --all, of the whole sandbox (new launches get ADMISSION_SEALED; retries of existing keys still answer)',
  )
  .option('--task <task>', "seal only this task's admission (other tasks go on)")
  .option('--all', 'seal the whole sandbox: every task, for good')
  .action(async (o: GlobalOptions & { task?: string; all?: boolean }) => {
    const g = globals(o);
    const task = taskOrAll('seal', o, g.json);
    const r = task !== null ? await call(g, (c) => c.sealTask(task)) : await call(g, (c) => c.sealAll());
    if (g.json) printJson(r);
    else
      process.stdout.write(
        `${task !== null ? `task ${JSON.stringify(task)} ` : ''}${r.already_sealed ? 'already sealed' : 'sealed'} at generation ${r.generation} (${r.sealed_at})\n`,
      );
  });

sub('close')
  .description(
    'with --task T: close one task and print its task receipt; with --all: seal the whole sandbox, close every task, and print the signed close receipt listing each task\'s verdict (final only when every task is complete). Exit 0 complete, 1 the join ran but is incomplete (the obligations are on stderr; with --all also a workspace not scanned), 125 the close could not run (the reason on stderr, and with --json as {"error"} on stdout)',
  )
  .option('--timeout <dur>', 'how long sessions may take to end by themselves before they are terminated (default 60s)', duration)
  .option(
    '--workspace <dir...>',
    'with --task, the watched workspaces to checkpoint (default: every watched workspace; every later close of the task must name the same set); with --all, directories to scan after the last session died (file count, bytes, newest mtime, digest)',
  )
  .option('--task <task>', 'close only this task: seal it, settle its sessions, checkpoint the workspaces, read back, fence, and print the signed task receipt')
  .option('--all', 'close the whole sandbox for good: seal every task, settle every session, close each task, and print the signed close receipt')
  .action(async (o: { timeout?: number; workspace?: string[]; task?: string; all?: boolean }) => {
    const g = globals(o);
    const task = taskOrAll('close', o, g.json);
    const workspaces = (o.workspace ?? []).map((w) => resolvePath(w));
    // On a terminal, what the close waits for and for how long.
    const progress = new Progress(task !== null ? `close task ${JSON.stringify(task)}` : 'close --all');
    const client = await connect(g);
    let receipt: TaskReceipt | CloseReceipt;
    const argvOf = new Map<string, string[]>();
    try {
      if (task !== null) {
        progress.waiting(
          `its sessions to end, then the checkpoint of ${workspaces.length ? workspaces.join(', ') : 'every watched workspace'} and its read-back`,
        );
        receipt = await client.closeTask({ task, timeout_ms: o.timeout, workspaces: workspaces.length ? workspaces : undefined });
        // The argv of each session the close cancelled, for the line that names it.
        if (receipt.settle.terminated_ids?.length) for (const s of (await client.ps(true)).sessions) argvOf.set(s.session_id, s.argv);
      } else {
        progress.waiting(`every session to end and its receipt, then each task's close${workspaces.length ? ` and the scan of ${workspaces.join(', ')}` : ''}`);
        receipt = await client.closeSupervisor({ timeout_ms: o.timeout, workspaces });
      }
    } catch (err) {
      progress.done();
      // --json: the error as JSON on stdout too (as sbx checkpoint), for a harness that parses it.
      if (g.json && isSupervisorError(err)) printJson({ error: err.toWire() });
      fail(describe(err));
    } finally {
      client.close();
    }
    progress.done();
    printJson(receipt);
    if (receipt.kind === 'task') {
      // Each running session the close ended (TERM, grace, KILL after --timeout), one a line.
      for (const id of receipt.settle.terminated_ids ?? []) {
        const argv = argvOf.get(id);
        const shown = argv ? ` (${argv.map((a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : `'${a.replaceAll("'", `'\\''`)}'`)).join(' ')})` : '';
        // A service is ended by the close (it is meant to keep running), not after a timeout.
        if (receipt.sessions.find((s) => s.session_id === id)?.service) warn(`ended service ${id}${shown}`);
        else warn(`cancelled session ${id}${shown}: it was still running after the ${receipt.settle.timeout_ms / 1000} s timeout`);
      }
      // Vacuously complete: a misspelled task has no sessions either.
      if (receipt.sessions.length === 0) warn(`note: task ${JSON.stringify(task)} has no sessions (complete holds vacuously; is the task name right?)`);
      for (const ob of receipt.obligations) warn(`task ${JSON.stringify(task)} incomplete: ${ob.authority} must settle ${ob.condition}: ${ob.what}`);
      process.exitCode = receipt.complete ? 0 : 1;
      return;
    }
    for (const t of receipt.tasks ?? [])
      for (const ob of t.obligations) warn(`task ${JSON.stringify(t.task)} incomplete: ${ob.authority} must settle ${ob.condition}: ${ob.what}`);
    for (const s of receipt.sessions)
      if (s.state !== 'ended') warn(`session ${s.session_id} is ${s.state}: the close is not final (close again once it has ended)`);
    if (receipt.complete === false)
      warn('the close is incomplete: nothing was written, the sandbox stays sealed; close --all again once the obligations above are settled');
    // A workspace has no digest: closed, but incomplete (1), as verify's mismatch.
    const unscanned = receipt.workspaces.filter((w) => w.error);
    for (const w of unscanned) warn(`workspace ${w.path} was not scanned: ${w.error_message ?? w.error}`);
    process.exitCode = receipt.complete !== false && unscanned.length === 0 ? 0 : 1;
  });

program
  .command('bridge')
  .description(
    "join stdin/stdout to the supervisor's socket byte for byte, for an exec channel (docker exec -i BOX sbx bridge; docs/guide/remote.md); exits when either side closes",
  )
  .option('--socket <path>', 'supervisor socket (default: $SBX_SOCKET or the default path)')
  .action(async (o: { socket?: string }) => {
    const socketPath = o.socket ?? program.opts<GlobalOptions>().socket ?? defaultSocketPath();
    process.exit(await runBridge(socketPath, warn));
  });

sub('completion')
  .description('print a shell completion script (bash or zsh); install: source <(sbx completion bash) in ~/.bashrc, or sbx completion zsh > "${fpath[1]}/_sbx"')
  .argument('<shell>', 'bash or zsh')
  .action((shell: string) => {
    if (shell === 'bash') process.stdout.write(bashCompletion(program));
    else if (shell === 'zsh') process.stdout.write(zshCompletion(program));
    else fail(`INVALID_ARGUMENT: completion: no script for ${JSON.stringify(shell)} (bash or zsh)`);
  });

// --- The argument and environment bytes.

/**
 * The command after `--` of `sbx run`, taken here rather than by commander, which spreads its
 * arguments onto the stack (`push(...args)`: RangeError past ~120,000 of them, far below the
 * kernel's ARG_MAX). Only the first is left for commander to see. null: no `--`.
 */
let commandArgv: string[] | null = null;
/** The session `sbx run` is attached to, once launched (for the EPIPE message in main). */
let attachedSession: string | null = null;

/** Takes the command after `--` (commandArgv) and checks every argument is UTF-8; argv as process.argv (node, script, args...). */
function takeArguments(argv: string[]): void {
  // Everything sbx sends is text on the wire (msgpack str), and Node decoded our arguments
  // lossily (an invalid byte becomes U+FFFD): an argument that is not UTF-8 (a command's, an
  // --env value, a --cwd, a --key) is refused rather than sent as other bytes than given.
  const raw = readRawArgs(argv.length - 2);
  raw?.forEach((bytes, i) => {
    if (!isUtf8(bytes))
      fail(
        `INVALID_ARGUMENT: argument ${i + 1} (${JSON.stringify(argv[i + 2])}) is not valid UTF-8; sbx passes arguments as text, and will not send other bytes than it was given`,
      );
  });
  const dashDash = argv.indexOf('--');
  if (dashDash > 0 && argv.slice(2, dashDash).includes('run') && dashDash + 1 < argv.length) {
    commandArgv = argv.slice(dashDash + 1);
    argv.splice(dashDash + 2);
  }
}

/** This CLI's whole environment for --inherit-env; a variable that is not UTF-8 is refused (125), as arguments are. */
function inheritedEnv(): Record<string, string> {
  let environ: Buffer | null = null;
  try {
    environ = readFileSync('/proc/self/environ');
  } catch {
    // no /proc: Node's decoding it is
  }
  for (const entry of environ ? splitNul(environ) : []) {
    if (!isUtf8(entry))
      fail(
        `INVALID_ARGUMENT: --inherit-env: the environment variable ${JSON.stringify(entry.toString('utf8').split('=')[0])} is not valid UTF-8; sbx will not send other bytes than it was given (unset it, or pass what is needed with --env)`,
      );
  }
  return Object.fromEntries(Object.entries(process.env).filter(([, v]) => v !== undefined)) as Record<string, string>;
}

/** The NUL-terminated parts of /proc/self/{cmdline,environ}. */
function splitNul(data: Buffer): Buffer[] {
  const parts: Buffer[] = [];
  let start = 0;
  for (let i = 0; i < data.length; i++) {
    if (data[i] === 0) {
      parts.push(data.subarray(start, i));
      start = i + 1;
    }
  }
  return parts;
}

/** This process's own arguments as bytes, the last `count` of /proc/self/cmdline (null where unreadable). */
function readRawArgs(count: number): Buffer[] | null {
  let cmdline: Buffer;
  try {
    cmdline = readFileSync('/proc/self/cmdline');
  } catch {
    return null;
  }
  const parts = splitNul(cmdline);
  return parts.length >= count ? parts.slice(parts.length - count) : null;
}

// --- Start.

// The `sbx` bin is its launcher (sbx-launcher.sh), which starts this module bundled with what it loads
// (scripts/build/sbx-bundle.mjs), else as it is. Lazy imports (verify, restore, diff, checkpoints) are
// left out of the bundle and imported from beside it.

/**
 * A write to stdout or stderr failed. EPIPE (a reader that went away: `sbx status | head -1`):
 * ends quietly, as a program killed by SIGPIPE would (128 + 13); the session, if any, goes on
 * (the supervisor owns it). Any other error (ENOSPC of `>/dev/full`, EIO): says so on stderr,
 * where it can, and exits 125, as coreutils' close_stdout ends with a write error.
 */
function stdoutFailed(err: NodeJS.ErrnoException, out: NodeJS.WriteStream): never {
  const say = (line: string) => {
    try {
      writeSync(2, stderrEnded(line));
    } catch {
      // stderr is gone too
    }
  };
  if (err.code !== 'EPIPE') {
    if (out === process.stdout)
      say(
        `sbx: cannot write to stdout: ${err.code ?? err.message}${attachedSession ? `; session ${attachedSession}'s output stays stored (sbx logs ${attachedSession})` : ''}`,
      );
    process.exit(FAILURE);
  }
  // `sbx run -- yes | head -1`: say once that the session goes on (--on-disconnect continue).
  if (attachedSession && out === process.stdout) say(`sbx: stdout was closed; session ${attachedSession} goes on (sbx cancel ${attachedSession} ends it)`);
  process.exit(141);
}

/**
 * Node puts back the terminal modes of fds 0-2 as it exits (node.cc ResetStdio) and aborts
 * when that tcsetattr(3) fails with anything but EPERM. On a terminal that was hung up (its
 * window closed, ssh dropped: sbx got SIGHUP and sent it on) it fails with EIO, and sbx died
 * of SIGABRT or SIGSEGV instead of exiting with the session's status. At exit, an fd that was
 * a terminal at start and no longer is one (isatty(3) is false on a hung-up tty: TCGETS says
 * EIO) is pointed at /dev/null, which Node then leaves alone (not the file it saw at start).
 */
function releaseHungUpTerminals(): void {
  const ttysAtStart = [0, 1, 2].filter((fd) => isatty(fd));
  if (ttysAtStart.length === 0) return;
  const release = () => {
    for (const fd of ttysAtStart) {
      if (isatty(fd)) continue;
      try {
        closeSync(fd);
        const at = openSync('/dev/null', fd === 0 ? 'r' : 'w'); // the lowest free fd: this one
        if (at !== fd) closeSync(at); // a lower one was free: fd stays closed, which Node skips too
      } catch {
        // closed already: Node skips a closed fd (EBADF)
      }
    }
  };
  process.on('exit', release);
  // Node's own SIGINT and SIGTERM handler puts the modes back the same way before it dies of
  // the signal (and aborts alike). Where the command takes no such signal itself (sbx logs -f,
  // wait: the command's own listener is then the only other one), this listener releases the
  // gone terminals, steps aside and raises the signal again: sbx still dies of it, as before.
  // Node changes no shared terminal's modes or flags by itself (libuv reopens a pty slave).
  cleanupBeforeDying(['SIGINT', 'SIGTERM'], release, true); // alone: the command's (sbx run, attach) ends through exit
}

/** Runs the CLI on argv (process.argv's shape: node, script, args...). */
function main(argv: string[]): void {
  releaseHungUpTerminals();
  for (const out of [process.stdout, process.stderr]) out.on('error', (err: NodeJS.ErrnoException) => stdoutFailed(err, out));
  takeArguments(argv);
  program.parseAsync(argv).catch((err: unknown) => fail(describe(err)));
}

// Imported (scripts/docs/generate.ts reads `program`), it runs nothing: main runs only when
// this module (or its bundle) is the script node was started with.
if (isEntry(process.argv[1], import.meta.url)) main(process.argv);

/** Whether `script` (process.argv[1]) is the module at `url`, symbolic links resolved. */
export function isEntry(script: string | undefined, url: string): boolean {
  if (!script) return false;
  try {
    return realpathSync(script) === realpathSync(fileURLToPath(url));
  } catch {
    return false;
  }
}

/** The read-back's objects split as the result counts them: re-hashed, confirmed by their file's stat, trusted unread (under trees a read-back checked, unchanged since). */
function readBackParts(rb: CheckpointResult['read_back']): string {
  if (rb.rehashed_objects === undefined) return '';
  const byStat = rb.objects - rb.rehashed_objects - (rb.trusted_objects ?? 0);
  const parts = [`${rb.rehashed_objects} re-hashed`];
  if (byStat > 0) parts.push(`${byStat} confirmed by their stat`);
  if (rb.trusted_objects) parts.push(`${rb.trusted_objects} trusted unread: under trees a read-back checked, unchanged since`);
  return ` (${parts.join(', ')})`;
}
