// `sbx attach ID` (issue 31): follow a session by its id alone, as docker attach: its output
// from a cursor (default: where it is now; --from-start or --cursor N replays), stdout to fd 1
// and stderr to fd 2 byte for byte, this CLI's stdin into the session's if it takes stdin, and
// the session's exit status when it ends (docs/reference/exit-statuses.md). Ctrl-C detaches
// (the session goes on). Also owns pumpStdin (stdin at offsets) and forwardTerminalSize, which sbx run uses too.
import { randomUUID } from 'node:crypto';
import { constants as osConstants } from 'node:os';
import { type Command, InvalidArgumentError } from 'commander';
import { readOutput, ReconnectingClient, SupervisorClient, type EndpointOptions } from '../ipc/client.js';
import { isSupervisorError } from '../ipc/errors.js';
import { exitStatusOf, type SessionSelector, type SessionSummary, type StreamName } from '../ipc/protocol.js';
import { describe, howEnded, reconnectingLine } from './explain.js';
import { warn } from './escape.js';
import { holdRawTerminal } from './terminal.js';

/**
 * A pty session's size follows this CLI's terminal (stdout a terminal; else nothing): each
 * SIGWINCH is sent on as a resize (the session's foreground process group gets its own
 * SIGWINCH), and `now` sends the current size at once. A resize that fails (the session
 * ended, the supervisor away) is not an error. sbx run's and attach's.
 */
export function forwardTerminalSize(conn: ReconnectingClient, sel: SessionSelector, now: boolean): void {
  if (!process.stdout.isTTY) return;
  const resize = () => void conn.current?.request('resize', { ...sel, cols: process.stdout.columns, rows: process.stdout.rows }).catch(() => {});
  if (now) resize();
  process.on('SIGWINCH', resize);
}

/**
 * Streams this CLI's stdin into the session, each write at its offset, so a retry after a
 * reconnect delivers every byte exactly once: without writer, in the shared stream of
 * tokenless writes from fromOffset (sbx run: a rerun of its key replaying its input is a
 * retry); with a writer token, in that writer's own stream (a new token's starts at 0: sbx
 * attach, beside other writers, bytes interleave per write, as two processes writing one pipe). EOF closes the
 * session's stdin unless eofCloses is false (then forwarding just stops). A terminal on stdin
 * is put in raw mode for a pty session, output processing off as cfmakeraw(3) does, and given
 * back at exit, before an ending signal and while sbx is stopped (terminal.ts).
 */
export async function pumpStdin(
  conn: ReconnectingClient,
  sel: SessionSelector,
  pty: boolean,
  fromOffset: number,
  eofCloses = true,
  writer?: string,
): Promise<void> {
  if (pty && process.stdin.isTTY) holdRawTerminal();
  let offset = fromOffset;
  const send = async (data: Buffer, eof: boolean): Promise<void> => {
    await conn.run((c) => c.request('write', { ...sel, data, offset, ...(writer === undefined ? {} : { writer }), ...(eof ? { eof } : {}) }));
    offset += data.length;
  };
  try {
    for await (const chunk of process.stdin) await send(chunk as Buffer, false);
    if (eofCloses) await send(Buffer.alloc(0), true);
  } catch (err) {
    // The command stopped reading its stdin (`yes | sbx run --stdin -- head -c5`) or ended:
    // like a writer to a closed pipe, sbx stops feeding it, and says nothing (the shell's
    // `yes | head -c5` prints nothing either).
    if (isSupervisorError(err) && err.details?.stdin_closed === true) return;
    warn(`stdin: ${describe(err)}`);
  }
}

/** What sbx.ts gives the command: where the supervisor is (from the options), and how to fail. */
export interface AttachContext {
  endpoint(o: object): EndpointOptions;
  /** The endpoint as messages name it. */
  where(o: object): string;
  /** The session an ID or --key names (sbx.ts's one rule: one of them, not both). */
  selector(id: string | undefined, key: string | undefined): SessionSelector;
  fail(message: string, status?: number): never;
}

interface AttachOptions {
  key?: string;
  fromStart?: boolean;
  cursor?: number;
  stderrCursor?: number;
  stdin: boolean;
  closeStdin?: boolean;
}

const cursorArg =
  (flag: string) =>
  (v: string): number => {
    if (!/^\d+$/.test(v) || !Number.isSafeInteger(Number(v)))
      throw new InvalidArgumentError(`${flag} takes a byte cursor (a non-negative integer), got ${JSON.stringify(v)}`);
    return Number(v);
  };

const signalNumber = (name: string) => osConstants.signals[name as keyof typeof osConstants.signals] ?? 0;

/**
 * Adds attach's arguments, options and action to cmd (made by sbx.ts's sub('attach')).
 * Exit: the session's status (code, 128+N, 124 for the deadline); 130 on a Ctrl-C (detached,
 * the session goes on); 1 for a session that has ended when nothing is to be replayed (as
 * docker attach to a stopped container); 125 when the supervisor or the request failed.
 */
export function attachCommand(cmd: Command, ctx: AttachContext): Command {
  return cmd
    .description(
      "follow a running session by its id, as docker attach: its output from where it is now (stdout to fd 1, stderr to fd 2), this CLI's stdin into its stdin if it was started with --stdin; exits with its status when it ends; Ctrl-C detaches (it goes on)",
    )
    .argument('[id]', 'session id, or a unique prefix of one (3 characters or more)')
    .option('--key <key>', 'select the session by invocation key')
    .option('--from-start', 'replay its output from the first byte, then follow')
    .option('--cursor <n>', "start stdout (a pty session's output) at byte cursor N", cursorArg('--cursor'))
    .option('--stderr-cursor <n>', 'start stderr at byte cursor N', cursorArg('--stderr-cursor'))
    .option('--no-stdin', "do not forward this CLI's stdin (watch only)")
    .option('--close-stdin', "at the end of this CLI's stdin, close the session's (else forwarding stops and its stdin stays open for another writer)")
    .action(async (id: string | undefined, o: AttachOptions) => {
      await attach(ctx.selector(id, o.key), o, ctx.endpoint(o), ctx.where(o), ctx.fail);
    });
}

async function attach(given: SessionSelector, o: AttachOptions, endpoint: EndpointOptions, where: string, fail: AttachContext['fail']): Promise<void> {
  let client: SupervisorClient;
  try {
    client = await SupervisorClient.connect({ ...endpoint, clientName: 'sbx' });
  } catch (err) {
    fail(describe(err));
  }
  let row: SessionSummary | undefined;
  let takesStdin = false;
  let id: string;
  try {
    // The supervisor resolves a prefix or a key to the one id (or answers SESSION_NOT_FOUND,
    // with its details, or INVALID_ARGUMENT for an ambiguous prefix).
    id = (await client.receipt(given)).session_id;
    row = (await client.ps(true)).sessions.find((s) => s.session_id === id);
    if (!row) fail(`SESSION_NOT_FOUND: no session ${id} (sbx ps --all lists them)`);
    // Whether it takes stdin: an empty write is answered while its stdin is open.
    if (o.stdin && row.state !== 'ended') {
      takesStdin = await client.request('write', { session_id: id, data: Buffer.alloc(0) }).then(
        () => true,
        () => false, // started without --stdin, or its stdin is closed: nothing to forward
      );
    }
  } catch (err) {
    client.close();
    fail(describe(err));
  }
  const replay = o.fromStart || o.cursor !== undefined || o.stderrCursor !== undefined;
  if (row.state === 'ended' && !replay) {
    client.close();
    fail(
      `session ${id} has ended: ${howEnded(row) ?? 'its status is in its receipt'}; nothing to attach to (sbx logs ${id} shows its output, sbx wait ${id} its status; sbx attach --from-start replays it)`,
      1,
    );
  }
  if (row.state === 'unknown') {
    client.close();
    fail(`session ${id} is unknown: ${row.reason ?? 'no evidence of its end yet'} (sbx ps, sbx resolve)`);
  }
  const pty = row.cursors.pty !== undefined;
  const streams: StreamName[] = pty ? ['pty'] : ['stdout', 'stderr'];
  const startOf = (s: StreamName): number => {
    const cursor = s === 'stderr' ? o.stderrCursor : o.cursor;
    return cursor ?? (o.fromStart ? 0 : (row.cursors[s] ?? 0));
  };
  for (const s of streams) {
    // As sbx logs --from: a cursor past what is stored is refused, not waited on in silence.
    const end = row.cursors[s] ?? 0;
    if (startOf(s) > end) {
      client.close();
      fail(`CURSOR_OUT_OF_RANGE: ${s === 'stderr' ? '--stderr-cursor' : '--cursor'} ${startOf(s)} is past the end of ${s} (${end} bytes so far)`);
    }
  }
  // Ctrl-C detaches; so do SIGHUP (the terminal closed, or kill -HUP) and SIGTERM, through
  // exit, so the terminal's modes are put back (a death by the signal left it raw): 128 + N.
  const detach = (status: number) => () => {
    warn(`detached from session ${id}; it goes on (sbx attach ${id} follows it again, sbx wait ${id} waits for its status)`);
    process.exit(status);
  };
  process.on('SIGINT', detach(130));
  process.on('SIGHUP', detach(129));
  process.on('SIGTERM', detach(143));
  const sel = { session_id: id };
  const reconnecting = reconnectingLine(where);
  const conn = new ReconnectingClient({ ...endpoint, clientName: 'sbx', onReconnecting: reconnecting }, client);
  // As docker attach to a container with a tty: the session's terminal takes this one's size now.
  if (pty) forwardTerminalSize(conn, sel, true);
  // A writer of its own: beside `sbx run --stdin` or another attach, bytes interleave per write.
  if (takesStdin) void pumpStdin(conn, sel, pty, 0, Boolean(o.closeStdin), randomUUID());
  let status: number;
  try {
    const waiting = conn.run((c) => c.wait(sel));
    waiting.catch(() => {});
    const copy = async (s: StreamName) => {
      const out = s === 'stderr' ? process.stderr : process.stdout;
      for await (const chunk of readOutput({
        ...endpoint,
        clientName: 'sbx',
        selector: sel,
        stream: s,
        from: startOf(s),
        follow: true,
        onReconnecting: reconnecting,
      })) {
        if (!out.write(chunk.data)) await new Promise((r) => out.once('drain', r));
      }
    };
    await Promise.all(streams.map(copy));
    status = exitStatusOf(await waiting, signalNumber);
  } catch (err) {
    fail(describe(err));
  }
  process.exitCode = status;
  process.stdout.write('', () => process.exit());
}
