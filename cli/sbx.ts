#!/usr/bin/env node
// sbx: the launch-only client. It asks the supervisor to run commands and streams their
// bytes; it never owns a process, so killing sbx never kills a command (unless it was
// launched with --on-disconnect cancel: the supervisor then cancels it). A launch carries an
// invocation key (sbx makes one when none is given), so a drop before the answer is resent.
// Exit statuses follow sh, timeout(1) and docker run (SPEC.md): the command's code, 128+N for
// a signal, 124 for the deadline, 125 when the supervisor or the request failed. Imports ipc/
// only, never supervisor/, and no zod (types only): it starts fast (DESIGN.md 17).
import { readFileSync } from 'node:fs';
import { join, resolve as resolvePath } from 'node:path';
import { Command, InvalidArgumentError, Option } from 'commander';
import { ReconnectingClient } from '../ipc/client.js';
import { defaultStateDir } from '../ipc/paths.js';
import { type CloseReceipt, exitStatusOf, type Receipt, type StreamName } from '../ipc/protocol.js';
import { VERSION } from '../ipc/version.js';
import { call, collectEnv, connect, describe, duration, fail, FAILURE, type GlobalOptions, mib, pipeOutput, positiveInt, printJson, selector, signalNumber } from './common.js';
import { takeCommandArgv } from './raw-args.js';
import { run, type RunOptions } from './run.js';

const program: Command = new Command()
  .name('sbx')
  .description('Launch commands through sandbox-supervisor and read their output and receipts.')
  .version(VERSION)
  .option('--socket <path>', 'supervisor socket (default: $SBX_SOCKET or the SPEC path)')
  .option('--json', 'machine-readable output')
  .enablePositionalOptions()
  .showHelpAfterError()
  .exitOverride((err) => process.exit(err.exitCode === 0 ? 0 : FAILURE));

/** A subcommand that also takes --socket and --json (SPEC: all subcommands do). */
function sub(name: string): Command {
  return program
    .command(name)
    .option('--socket <path>', 'supervisor socket (default: $SBX_SOCKET or the SPEC path)')
    .option('--json', 'machine-readable output');
}

/** Global options merged with the subcommand's own. */
function globals(o: object): GlobalOptions {
  return { ...program.opts<GlobalOptions>(), ...Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) };
}

sub('run')
  .description('launch CMD and stream its stdout/stderr; exit with its status')
  .usage('[options] -- CMD [ARG...]')
  .argument('<cmd...>', 'the command and its arguments')
  .option('--key <key>', 'invocation key (idempotency): a retry returns the existing session')
  .option('--timeout <dur>', 'deadline (0: none), e.g. 30s', duration, 0)
  .option('--grace <dur>', 'TERM→KILL grace, e.g. 10s', duration)
  .option('--cwd <dir>', 'working directory (default: the current one)')
  .option('--env <NAME=VALUE>', 'set an environment variable (repeatable)', collectEnv, {})
  .option('--inherit-env', "add this shell's whole environment")
  .option('--user <name|uid>', 'run as this user (the supervisor must be root)')
  .option('--pty', 'give the command a pseudo-terminal (one output stream, "pty")')
  .option('--cols <n>', 'pty width (default: this terminal\'s, else 80)', positiveInt)
  .option('--rows <n>', 'pty height (default: this terminal\'s, else 24)', positiveInt)
  .option('--stdin', "stream this CLI's stdin into the session (default: /dev/null)")
  .addOption(new Option('--linger <policy>', 'descendants left when the leader exits').choices(['kill', 'wait']).default('kill'))
  .addOption(new Option('--on-disconnect <policy>', 'what a lost connection does to the session').choices(['continue', 'cancel']).default('continue'))
  .option('--detach', 'print the session id and return at once')
  .option('--receipt <file>', 'write the receipt as JSON to FILE when the session ends')
  .passThroughOptions()
  .action(async (cmd: string[], o: RunOptions) => {
    await run(globals(o), commandArgv ?? cmd, o);
  });

sub('cancel')
  .description('end the session: SIGTERM to every process, SIGKILL after the grace')
  .argument('[id]', 'session id')
  .option('--key <key>', 'select the session by invocation key')
  .option('--grace <dur>', 'TERM→KILL grace (default: the session\'s)', duration)
  .action(async (id: string | undefined, o: { key?: string; grace?: number }) => {
    const g = globals(o);
    const r = await call(g, (c) => c.request('cancel', { ...selector(id, o.key), grace_ms: o.grace }));
    if (g.json) printJson(r);
  });

sub('kill')
  .description('send a signal to every process of the session (default SIGKILL, as docker kill)')
  .argument('[id]', 'session id')
  .option('--key <key>', 'select the session by invocation key')
  .option('--signal <sig>', 'signal name or number', 'SIGKILL')
  .action(async (id: string | undefined, o: { key?: string; signal: string }) => {
    const g = globals(o);
    const signal = /^\d+$/.test(o.signal) ? Number(o.signal) : o.signal.toUpperCase();
    const r = await call(g, (c) => c.request('kill', { ...selector(id, o.key), signal }));
    if (g.json) printJson(r);
  });

sub('verify')
  .description("check a receipt's signature and, with the state dir, every stored byte it names (works with the supervisor stopped)")
  .argument('<receipt>', 'the receipt as JSON (sbx receipt ID > r.json, or --receipt FILE)')
  .option('--key <file>', 'the public key, SPKI PEM (default: receipt-key.pub in the state dir)')
  .option('--state-dir <dir>', 'also re-read the chunk files there and check cursors and digests')
  .action(async (file: string, o: { key?: string; stateDir?: string; json?: boolean }) => {
    const g = globals(o);
    // Loaded here only: run, the common case, starts faster without it (DESIGN.md 17).
    const { verifyCloseSessions, verifySignature, verifyStoredOutput } = await import('../ipc/verify.js');
    let receipt: Receipt;
    try {
      receipt = JSON.parse(readFileSync(file, 'utf8')) as Receipt;
    } catch (err) {
      fail(`INVALID_ARGUMENT: cannot read the receipt ${file}: ${(err as Error).message}`);
    }
    const keyFile = o.key ?? join(o.stateDir ?? defaultStateDir(), 'receipt-key.pub');
    let keyPem: string;
    try {
      keyPem = readFileSync(keyFile, 'utf8');
    } catch (err) {
      fail(`INVALID_ARGUMENT: cannot read the public key ${keyFile} (give --key FILE): ${(err as Error).message}`);
    }
    const problems = verifySignature(receipt, keyPem);
    const isClose = (receipt as unknown as { kind?: string }).kind === 'close';
    if (o.stateDir && problems.length === 0) {
      problems.push(...(isClose ? verifyCloseSessions(receipt as unknown as CloseReceipt, o.stateDir, keyPem) : verifyStoredOutput(receipt, o.stateDir)));
    }
    if (g.json) printJson({ ok: problems.length === 0, key_id: receipt.signature?.key_id ?? null, problems });
    else if (problems.length === 0 && isClose) {
      const n = (receipt as unknown as CloseReceipt).sessions.length;
      process.stdout.write(`OK: close receipt signed by ${receipt.signature!.key_id}${o.stateDir ? `; the ${n} session receipts it lists match` : ''}\n`);
    } else if (problems.length === 0) {
      const streams = Object.entries(receipt.output).map(([n, s]) => `${n} ${s!.final_cursor} bytes`).join(', ');
      process.stdout.write(`OK: signed by ${receipt.signature!.key_id}${o.stateDir ? `; stored output matches (${streams})` : ''}\n`);
    } else for (const p of problems) process.stdout.write(`MISMATCH: ${p}\n`);
    process.exitCode = problems.length === 0 ? 0 : 1;
  });

sub('write')
  .description("write this CLI's stdin to a session started with --stdin")
  .argument('[id]', 'session id')
  .option('--key <key>', 'select the session by invocation key')
  .option('--eof', 'then close the session\'s stdin')
  .action(async (id: string | undefined, o: { key?: string; eof?: boolean }) => {
    const g = globals(o);
    const sel = selector(id, o.key);
    const client = await connect(g);
    try {
      let sent = false;
      if (!process.stdin.isTTY) {
        for await (const chunk of process.stdin) {
          await client.request('write', { ...sel, data: chunk as Buffer });
          sent = true;
        }
      }
      // Nothing read (or only --eof): still one request, so a wrong session is an error.
      if (o.eof || !sent) await client.request('write', { ...sel, data: Buffer.alloc(0), eof: Boolean(o.eof) });
    } catch (err) {
      fail(describe(err));
    }
    client.close();
  });

sub('resize')
  .description("set a pty session's terminal size")
  .argument('<id>', 'session id')
  .argument('<cols>', 'columns', positiveInt)
  .argument('<rows>', 'rows', positiveInt)
  .action(async (id: string, cols: number, rows: number, o: object) => {
    await call(globals(o), (c) => c.request('resize', { session_id: id, cols, rows }));
  });

sub('logs')
  .description('print a stream from a byte cursor')
  .argument('[id]', 'session id')
  .option('--key <key>', 'select the session by invocation key')
  .option('--from <n>', 'start at byte cursor N', (v) => {
    if (!/^\d+$/.test(v) || !Number.isSafeInteger(Number(v))) throw new InvalidArgumentError('--from takes a non-negative integer');
    return Number(v);
  }, 0)
  .addOption(new Option('--stream <name>', 'stream to read (default: stdout, or pty for a pty session)').choices(['stdout', 'stderr', 'pty']))
  .option('--follow', 'keep reading until the stream is final')
  .action(async (id: string | undefined, o: { key?: string; from: number; stream?: StreamName; follow?: boolean }) => {
    const g = globals(o);
    const sel = selector(id, o.key);
    const first = await connect(g); // a clear message now if no supervisor is there
    let stream: StreamName = o.stream ?? 'stdout';
    if (!o.stream) {
      const { sessions } = await first.ps(true);
      const found = sessions.find((s) => (sel.session_id ? s.session_id === sel.session_id : s.invocation_key === sel.invocation_key));
      if (found && found.cursors.pty !== undefined) stream = 'pty';
    }
    first.close();
    try {
      await pipeOutput(g, sel, stream, process.stdout, o.from, o.follow ?? false);
    } catch (err) {
      fail(describe(err));
    }
  });

sub('resolve')
  .description('end a session stuck unknown on your word: evidence operator_attested (never automatic)')
  .argument('[id]', 'session id')
  .option('--key <key>', 'select the session by invocation key')
  .option('--as-operator', 'required: you attest that nothing of the session runs any more')
  .requiredOption('--reason <text>', 'why you know it is over (recorded in the receipt)')
  .action(async (id: string | undefined, o: { key?: string; asOperator?: boolean; reason: string }) => {
    const g = globals(o);
    if (!o.asOperator) fail('INVALID_ARGUMENT: resolve needs --as-operator: it records your word, not evidence');
    printJson(await call(g, (c) => c.request('resolve', { ...selector(id, o.key), as_operator: true, reason: o.reason })));
  });

sub('wait')
  .description('wait for the receipt, print it, exit with the session status')
  .argument('[id]', 'session id')
  .option('--key <key>', 'select the session by invocation key')
  .action(async (id: string | undefined, o: { key?: string }) => {
    const g = globals(o);
    const sel = selector(id, o.key);
    const conn = new ReconnectingClient({ socketPath: g.socket, clientName: 'sbx' }, await connect(g));
    let receipt: Receipt;
    try {
      receipt = await conn.run((c) => c.wait(sel));
    } catch (err) {
      fail(describe(err));
    }
    printJson(receipt);
    conn.drop();
    process.exitCode = exitStatusOf(receipt, signalNumber);
  });

sub('receipt')
  .description('print the receipt of an ended session')
  .argument('[id]', 'session id')
  .option('--key <key>', 'select the session by invocation key')
  .action(async (id: string | undefined, o: { key?: string }) => {
    const g = globals(o);
    const answer = await call(g, (c) => c.receipt(selector(id, o.key)));
    if (!answer.receipt) fail(`session is ${answer.state}: no receipt yet`, 1);
    printJson(answer.receipt);
  });

sub('ps')
  .description('list sessions')
  .option('--all', 'include ended sessions')
  .action(async (o: { all?: boolean }) => {
    const g = globals(o);
    const { sessions } = await call(g, (c) => c.ps(o.all ?? false));
    if (g.json) return printJson(sessions);
    const rows = [['SESSION', 'STATE', 'PID', 'LIVE', 'CPU', 'MEM PEAK', 'OUTCOME', 'KEY', 'COMMAND']];
    for (const s of sessions) {
      const cpu = s.usage?.cpu_usec !== undefined ? `${(s.usage.cpu_usec / 1e6).toFixed(2)}s` : '-';
      const mem = s.usage?.memory_peak_bytes !== undefined ? mib(s.usage.memory_peak_bytes) : '-';
      rows.push([s.session_id, s.state, String(s.pid ?? '-'), String(s.live_pids ?? '-'), cpu, mem, s.outcome ?? '-', s.invocation_key, s.argv.join(' ')]);
    }
    const widths = rows[0].map((_, i) => Math.max(...rows.map((r) => r[i].length)));
    for (const r of rows) process.stdout.write(r.map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i]))).join('  ') + '\n');
    // Why each unknown session is unknown (and whether its receipt is on its way).
    for (const s of sessions) {
      if (s.state === 'unknown') process.stdout.write(`\n${s.session_id} is unknown${s.receipt_pending ? ' (its receipt is on its way)' : ''}: ${s.reason ?? 'no evidence of its end yet'}\n`);
    }
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
        const sessions = Object.entries(status.sessions).map(([k, v]) => `${k} ${v}`).join(', ') || 'none';
        const lines = [
          ['version', `${status.version} (protocol ${status.protocol})`],
          ['instance', `${status.instance}, generation ${status.generation}, pid ${status.pid}`],
          ['mode', status.mode + (status.cgroup ? ` (${status.cgroup})` : '')],
          ['socket', status.socket],
          ['state dir', status.state_dir],
          ['receipts', `signed by ${status.receipt_key.key_id} (${status.receipt_key.path})`],
          ['admission', status.admission + (status.sealed ? ` (sealed at generation ${status.sealed.generation}, ${status.sealed.sealed_at})` : status.admission_reason ? `: ${status.admission_reason}` : '')],
          ['sessions', sessions],
          ['storage', `${mib(status.storage.state_dir_bytes)} in the state dir, ${mib(status.storage.free_bytes)} free of ${mib(status.storage.total_bytes)} (reserve ${mib(status.storage.reserve_bytes)}, launches need ${mib(status.storage.min_free_bytes)}, retention keeps ${mib(status.storage.keep_free_bytes)} free)`],
          ['load', `${status.load.loadavg.map((l) => l.toFixed(2)).join(' ')} on ${status.load.cpus} cpus, cpu ${status.machine.cpu_load_percent ?? '-'}%`],
          ['memory', `${mib(status.machine.mem_available_bytes)} available of ${mib(status.machine.mem_total_bytes)}`],
          ['uptime', `${(status.machine.uptime_s / 3600).toFixed(1)} h`],
        ];
        for (const [k, v] of lines) process.stdout.write(`${k.padEnd(10)} ${v}\n`);
      }
    } catch (err) {
      fail(describe(err));
    }
    client.close();
  });

sub('gc')
  .description('apply the retention policy now: old output first, then old receipts (never a running session, never a key)')
  .action(async (o: GlobalOptions) => {
    const g = globals(o);
    const r = await call(g, (c) => c.gc());
    if (g.json) printJson(r);
    else if (r.closed) process.stdout.write('nothing removed: the state dir is closed (its close receipt keeps every listed receipt verifiable)\n');
    else process.stdout.write(`removed the output of ${r.removed_output.length} session(s) and ${r.retired.length} whole session(s); ${r.freed_bytes} bytes freed\n`);
  });

sub('seal')
  .description('stop admission for good: new launches get ADMISSION_SEALED (retries of existing keys still answer)')
  .action(async (o: GlobalOptions) => {
    const g = globals(o);
    const r = await call(g, (c) => c.seal());
    if (g.json) printJson(r);
    else process.stdout.write(`${r.already_sealed ? 'already sealed' : 'sealed'} at generation ${r.generation} (${r.sealed_at})\n`);
  });

sub('close')
  .description('seal, settle every session, wait for every receipt, and print the signed close receipt (exit 1 when a workspace could not be scanned)')
  .option('--timeout <dur>', 'how long sessions may take to end by themselves before they are terminated (default 60s)', duration)
  .option('--workspace <dir...>', 'directories to scan after the last session died (file count, bytes, newest mtime, digest)')
  .action(async (o: { timeout?: number; workspace?: string[] }) => {
    const g = globals(o);
    const workspaces = (o.workspace ?? []).map((w) => resolvePath(w));
    const receipt = await call(g, (c) => c.closeSupervisor({ timeout_ms: o.timeout, workspaces }));
    printJson(receipt);
    // Closed, but a workspace has no digest: done, incomplete (1), as verify's mismatch.
    const unscanned = receipt.workspaces.filter((w) => w.error);
    for (const w of unscanned) process.stderr.write(`sbx: workspace ${w.path} was not scanned: ${w.error_message ?? w.error}\n`);
    process.exitCode = unscanned.length > 0 ? 1 : 0;
  });

// A reader that went away (`sbx status | head -1`): end quietly, as a program killed by
// SIGPIPE would (128 + 13). The session, if any, goes on: the supervisor owns it.
for (const out of [process.stdout, process.stderr]) {
  out.on('error', (err: NodeJS.ErrnoException) => {
    if (err.code === 'EPIPE') process.exit(141);
    throw err;
  });
}

const argv = process.argv;
const commandArgv = takeCommandArgv(argv);

program.parseAsync(argv).catch((err: unknown) => fail(describe(err)));
