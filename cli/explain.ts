// What sbx says on stderr when something is not as asked: an error's one line (the code, the
// supervisor's message, and what to do next), why a wait waits, what a receipt's exit status
// cannot say (owner lost), and the note of a deprecated option. Text from errors, details and
// receipts; sbx.ts prints it (the reconnect line and the note print themselves, once). The codes are docs/reference/contract.md "Error codes"; the details are docs/reference/protocol.md's.
import { Option } from 'commander';
import { DEFAULT_RECONNECT_MS } from '../ipc/client.js';
import { isSupervisorError, type SupervisorError } from '../ipc/errors.js';
import type { LimitsStatus, Receipt, SessionSummary } from '../ipc/protocol.js';
import { sizeText } from '../ipc/size.js';
import { escapeControls, stderrLine } from './escape.js';
import { systemError } from '../ipc/errno.js';

/** The socket sbx talks to this run (--socket, $SBX_SOCKET or the default path), for messages. */
let socketInUse: string | null = null;

/** Sets the socket path connection errors name. */
export function useSocket(path: string): void {
  socketInUse = path;
}

export const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(bytes < 10 * 2 ** 20 ? 1 : 0)} MiB`;

/** A duration in seconds as sbx status shows uptimes: `42 s`, `12 min`, `3.5 h`, `2.1 days`. */
export function uptimeText(seconds: number): string {
  if (seconds < 120) return `${Math.floor(seconds)} s`;
  if (seconds < 7200) return `${Math.floor(seconds / 60)} min`;
  if (seconds < 172_800) return `${(seconds / 3600).toFixed(1)} h`;
  return `${(seconds / 86_400).toFixed(1)} days`;
}

/** What a connect errno means, for the one line that names it. */
const CONNECT_ERRNO: Record<string, string> = {
  ENOENT: 'no socket there',
  ECONNREFUSED: 'nothing listens there',
  EACCES: 'permission denied',
  ENOTSOCK: 'not a socket',
  ECONNRESET: 'the connection was reset',
  EPIPE: 'the connection was closed',
};

/** An error as sbx's one line (without the `sbx: ` prefix), the supervisor's text in it escaped. */
export function describe(err: unknown): string {
  return escapeControls(describeRaw(err));
}

function describeRaw(err: unknown): string {
  if (isSupervisorError(err, 'ADMISSION_DENIED')) return `${err.code}: ${err.message} (sbx status says why)`;
  if (isSupervisorError(err, 'KEY_CONFLICT')) {
    const session = typeof err.details?.session_id === 'string' ? err.details.session_id : null;
    // A key whose session retention removed: its receipt is gone, so sbx receipt cannot show the command.
    const retired = err.details?.retired === true;
    const hint = !session
      ? ''
      : retired
        ? ` (session ${session} was removed by retention: its receipt is gone)`
        : ` (sbx receipt ${session} shows the command it ran)`;
    return `${err.code}: ${err.message}; a key runs one command, ever: use another --key${hint}`;
  }
  if (isSupervisorError(err)) return `${err.code}: ${err.message}`;
  const e = systemError(err);
  const at = socketInUse ?? (e as { address?: string }).address ?? null;
  if (e.code === 'ENOTSOCK') {
    const found = (e as { found?: string }).found ?? 'something';
    return `cannot reach the supervisor${at ? ` at ${at}` : ''} (ENOTSOCK: ${found} is there, not a socket); --socket or SBX_SOCKET name the supervisor's socket (its log and sbx status show it)`;
  }
  if (at && /^wss?:\/\//i.test(at) && e.code === 'ECONNREFUSED') {
    // A URL: the message says what answered (an HTTP status) or the connect error.
    return `cannot reach the supervisor at ${at} (${e.message}); is its listener on (serve --listen, remote.listen)? --url or SBX_URL name another`;
  }
  if (e.code === 'ENOENT' || e.code === 'ECONNREFUSED' || e.code === 'EACCES') {
    return `cannot reach the supervisor${at ? ` at ${at}` : ''} (${e.code}: ${CONNECT_ERRNO[e.code]}); is it running? sbx status checks (start it with npm start or the systemd unit; --socket or SBX_SOCKET name another)`;
  }
  if (e.code === 'ECONNRESET' || e.code === 'EPIPE') {
    return `lost the connection to the supervisor${at ? ` at ${at}` : ''} (${e.code}: ${CONNECT_ERRNO[e.code]}); sbx status says whether it is up`;
  }
  return e.message ?? String(err);
}

/** A waiting line's reason for a retryable refusal, from its details when it has them. */
export function refusalWait(err: SupervisorError): string {
  const d = err.details ?? {};
  if (err.code === 'ADMISSION_DENIED' && d.reason === 'disk_low' && typeof d.free_bytes === 'number' && typeof d.min_free_bytes === 'number') {
    return `disk low in the state dir, ${mib(d.free_bytes)} free, ${mib(d.min_free_bytes)} needed`;
  }
  if (err.code === 'ADMISSION_DENIED' && d.reason === 'reconciling') return 'the supervisor is reconciling the sessions left by a restart';
  if (err.code === 'LIMIT_EXCEEDED' && typeof d.limit === 'string') {
    const what = { sessions: 'sessions running', connections: 'connections open', in_flight: 'requests in flight' }[d.limit] ?? d.limit;
    return `the supervisor is at its limit of ${String(d.max ?? '?')} ${what}`;
  }
  if (err.code === 'SHUTTING_DOWN') return 'the supervisor is stopping';
  return err.message;
}

/** The line for a receipt whose death is cgroup_escaped: what left the cgroup, and that its end is not proven or that an operator attested it (attested: the receipt answer's escape_attested); null for any other. */
export function escapedLine(receipt: Receipt, attested?: { uid: number; reason: string; attested_at: string } | null): string | null {
  if (receipt.death.evidence !== 'cgroup_escaped') return null;
  const where = [
    ...new Set((receipt.death.escapes ?? []).map((e) => `${e.kind === 'escape_possible' ? 'possibly ' : ''}to ${e.to ?? 'a cgroup since removed'}`)),
  ].join(', ');
  const moved = `session ${receipt.session_id}: processes were moved out of its cgroup (${where || 'destination not recorded'})`;
  if (attested)
    return `${moved}: an operator attested their end (uid ${attested.uid} at ${attested.attested_at}: ${JSON.stringify(attested.reason)}; sbx receipt ${receipt.session_id})`;
  return `${moved}: their end is not proven (death evidence cgroup_escaped; sbx receipt ${receipt.session_id})`;
}

/**
 * The line `sbx run` says once on stderr about processes the leader left (null: none were
 * left): "sbx: 2 processes handed off to service s-… (sbx ps; sbx close --task T ends it)" or
 * "sbx: 3 leftover processes were ended (linger kill)", with ": SIGTERM, then SIGKILL to 1
 * process still running after the grace" inside the parentheses when the grace ran out (":
 * SIGKILL, no grace" with --grace 0).
 */
export function leftoversLine(receipt: Pick<Receipt, 'handed_off' | 'termination' | 'descendants_terminated' | 'task'>): string | null {
  const n = (count: number, what: string) => `${count} ${what}${count === 1 ? '' : 'es'}`;
  if (receipt.handed_off) {
    const ends = receipt.task ? `; sbx close --task ${receipt.task} ends it` : '';
    return `sbx: ${n(receipt.handed_off.pids, 'process')} handed off to service ${receipt.handed_off.service_id} (sbx ps, sbx logs ${receipt.handed_off.service_id}${ends})`;
  }
  if (receipt.termination.cause === 'linger' && receipt.descendants_terminated > 0) {
    // Those still there when the grace ran out (they ignored or trapped SIGTERM) got SIGKILL; with
    // no grace (--grace 0) SIGKILL was the only step. "linger kill": --linger kill, or the
    // default of a pty session or of subreaper mode.
    const { steps } = receipt.termination;
    const killed = steps.find((s) => s.signal === 'SIGKILL' && s.pids > 0);
    const termed = steps.some((s) => s.signal === 'SIGTERM');
    // The count is of the processes SIGTERM reached; more may have been forked during the grace.
    const forked = killed && killed.pids > receipt.descendants_terminated ? ', some forked during it' : '';
    const how = !killed
      ? ''
      : termed
        ? `: SIGTERM, then SIGKILL to ${n(killed.pids, 'process')} still running after the grace${forked}`
        : ': SIGKILL, no grace';
    return `sbx: ${n(receipt.descendants_terminated, 'leftover process')} ${receipt.descendants_terminated === 1 ? 'was' : 'were'} ended (linger kill${how})`;
  }
  return null;
}

/**
 * The line for a receipt whose leader the OOM killer ended (termination.cause oom_kill):
 * "killed by the OOM killer at memory.max 64 MiB (peak 64 MiB; sbx receipt ID)"; null for any other.
 */
export function oomLine(receipt: Receipt): string | null {
  if (receipt.termination.cause !== 'oom_kill') return null;
  const max = receipt.limits?.memory_max_bytes;
  const peak = receipt.usage.memory_peak_bytes;
  return `killed by the OOM killer at memory.max ${max !== undefined ? sizeText(max) : "(the cgroup's)"} (${peak !== undefined ? `peak ${sizeText(peak)}; ` : ''}sbx receipt ${receipt.session_id})`;
}

/** sbx status's limits line: what this host can enforce ("memory, pids, cpu"), else "none enforceable here (why)". */
export function limitsLine(limits: LimitsStatus): string {
  const on = (['memory', 'pids', 'cpu'] as const).filter((c) => limits[c]);
  const head = on.length === 3 ? 'memory, pids, cpu (--memory, --pids, --cpus)' : on.length ? `only ${on.join(', ')}` : 'none enforceable here';
  return limits.reason ? `${head} (${limits.reason})` : head;
}

/** The line for a receipt whose outcome is owner_lost: the status is unknown, and the receipt's evidence. */
export function ownerLostLine(receipt: Receipt): string {
  return `session ${receipt.session_id}: owner lost (the supervisor that ran it stopped before it ended): its exit status is unknown, death evidence ${receipt.death.evidence} (sbx receipt ${receipt.session_id})`;
}

/** How an ended session ended, for `kill`/`cancel` of one ("it ended (exited 3 at T)", "it ended (killed by SIGTERM at T)"). */
export function endedAs(
  receipt: Pick<Receipt, 'outcome' | 'exit' | 'ended_at'> | null,
  summary?: Pick<SessionSummary, 'outcome' | 'exit' | 'ended_at'>,
): string {
  const how = howEnded(receipt ?? summary);
  return how === null ? 'it has ended' : `it ended (${how})`;
}

/** Whether a receipt or summary says the OOM killer ended the leader (termination cause oom_kill). */
function oomKilled(r: object): boolean {
  return (
    ('termination' in r && (r as Receipt).termination?.cause === 'oom_kill') ||
    ('termination_cause' in r && (r as SessionSummary).termination_cause === 'oom_kill')
  );
}

/** The outcome and time alone ("exited 3 at T", "killed by SIGTERM at T", "killed by the OOM killer (SIGKILL) at T"); null when not known. */
export function howEnded(
  r: Pick<Receipt, 'outcome' | 'exit' | 'ended_at'> | Pick<SessionSummary, 'outcome' | 'exit' | 'ended_at'> | null | undefined,
): string | null {
  if (!r || !r.outcome) return null;
  const exit = r.exit ?? { code: null, signal: null };
  const how =
    r.outcome === 'exited'
      ? `exited ${exit.code}`
      : r.outcome === 'signaled'
        ? `killed by ${oomKilled(r) ? 'the OOM killer (SIGKILL)' : exit.signal}`
        : r.outcome === 'owner_lost'
          ? 'owner lost'
          : `${r.outcome.replace('_', ' ')}${exit.signal ? ` (${exit.signal})` : exit.code !== null ? ` (exit ${exit.code})` : ''}`;
  return `${how}${r.ended_at ? ` at ${r.ended_at}` : ''}`;
}

/** The once-a-run line of a wait for a supervisor that went away (run, wait): "sbx: lost the supervisor at S (ECONNREFUSED); reconnecting for up to 60 s". */
export function reconnectingLine(socketPath: string): (code: string) => void {
  let said = false;
  return (code) => {
    if (said) return;
    said = true;
    stderrLine(`sbx: lost the supervisor at ${socketPath} (${code}); reconnecting for up to ${Math.round(DEFAULT_RECONNECT_MS / 1000)} s`);
  };
}

/** `--key FILE` of verify/restore/checkpoints, kept working but hidden: `--key` is the invocation key everywhere else. */
export function deprecatedKeyOption(): Option {
  return new Option('--key <file>', 'deprecated: --public-key').hideHelp();
}

/** The public key file given (--public-key, else the deprecated --key, with a note on stderr), or undefined. */
export function publicKeyFile(command: string, o: { publicKey?: string; key?: string }): string | undefined {
  if (o.key !== undefined && o.publicKey === undefined) {
    stderrLine(`sbx: note: ${command} --key FILE is deprecated, use --public-key FILE (--key names an invocation key everywhere else)`);
  }
  return o.publicKey ?? o.key;
}
