// The table `sbx ps` prints, as `docker ps` does: a STATUS that reads as a sentence ("exited 3, 2 min ago",
// "killed by SIGTERM, 5 s ago", "running 12 s", "unknown: owner lost"), when it started, how long it ran, its
// user and task; and which rows, in which order (selectPsRows). Pure: rows in, text out (the clock and the
// terminal width are arguments), so it is tested without a daemon. The --json output is the supervisor's
// summaries, not this.
import type { SessionSummary } from '../ipc/protocol.js';
import { displayWidth, escapeControls, truncateToWidth } from './escape.js';

export { escapeControls };

/** COMMAND's width when stdout is not a terminal (docker: 20, whatever stdout is). */
export const PIPE_COMMAND_COLUMNS = 40;

/** What a cut cell ends with (docker's ellipsis). */
const ELLIPSIS = '…';

/** One argument as a shell would need it: bare when it is plain, else in single quotes. */
function shellWord(arg: string): string {
  if (/^[A-Za-z0-9_@%+=:,./-]+$/.test(arg)) return arg;
  return `'${arg.replace(/'/g, `'\\''`)}'`;
}

/**
 * argv as one escaped line of shell words; with limitChars, stops once it is longer than that
 * (a 1 MiB argument is not escaped whole to show 40 characters of it).
 */
export function commandText(argv: string[], limitChars?: number): string {
  let out = '';
  for (const arg of argv) {
    const word = limitChars !== undefined && arg.length > limitChars + 2 ? shellWord(arg.slice(0, limitChars + 2)) : shellWord(arg);
    out += (out ? ' ' : '') + escapeControls(word);
    if (limitChars !== undefined && out.length > limitChars) break;
  }
  return out;
}

/** text cut to at most width display columns (CJK and emoji 2, combining marks 0), ending in … when cut. */
export function truncate(text: string, width: number): string {
  return truncateToWidth(text, Math.max(0, width), ELLIPSIS);
}

/** An age or a wait, coarse as docker's: "450 ms", "12 s", "2 min", "5 h", "3 days"; "?" for no number (a bad timestamp). */
export function coarseDuration(ms: number): string {
  if (!Number.isFinite(ms)) return '?';
  const s = Math.max(0, ms) / 1000;
  if (s < 1) return `${Math.max(0, Math.round(ms))} ms`;
  if (s < 60) return `${Math.floor(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 48 * 3600) return `${Math.floor(s / 3600)} h`;
  return `${Math.floor(s / 86400)} days`;
}

/** A run time, to the unit below the largest: "1.2 s", "12 s", "2 min 5 s", "1 h 3 min", "2 d 3 h". */
export function preciseDuration(ms: number): string {
  if (!Number.isFinite(ms)) return '?';
  const s = Math.max(0, ms) / 1000;
  if (s < 10) return s.toFixed(1) === '10.0' ? '10 s' : `${s.toFixed(1)} s`; // 9.96 s is "10 s", not "10.0 s"
  if (s < 60) return `${Math.floor(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.floor(s % 60)} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

/** The STARTED cell: "2 min ago"; a start ahead of this clock (skew between hosts or a clock set back) says so. */
function startedText(agoMs: number): string {
  if (agoMs < -1000) return `in ${coarseDuration(-agoMs)} (clock skew?)`;
  return `${coarseDuration(agoMs)} ago`;
}

/** The STATUS cell of one session at nowMs (ms since the epoch). */
export function statusText(s: SessionSummary, nowMs: number): string {
  // A service says so, and which session's leftovers it is; a command says where its leftovers went.
  const what = s.service ? (s.service.handed_off_from ? `service of ${s.service.handed_off_from}, ` : 'service, ') : '';
  const went = s.handed_off_to ? `, handed off to ${s.handed_off_to}` : '';
  // Its exit status is not the whole story: processes left its cgroup (docs/guide/escapes.md).
  const escaped = s.escaped ? `, processes left its cgroup (end ${s.escaped})` : '';
  return `${what}${stateText(s, nowMs)}${went}${escaped}`;
}

function stateText(s: SessionSummary, nowMs: number): string {
  const since = (iso: string | null | undefined) => (iso ? nowMs - Date.parse(iso) : 0);
  switch (s.state) {
    case 'admitted':
      return 'admitted';
    case 'running':
      return `running ${coarseDuration(since(s.started_at ?? s.admitted_at))}`;
    case 'leader_exited':
      return 'leader exited, descendants remain';
    case 'terminating':
      return 'terminating';
    case 'unknown':
      // Not ended: no evidence of its end yet (why: a note under the table).
      return s.receipt_pending ? 'unknown: being ended' : 'unknown: owner lost';
    case 'ended':
      break;
  }
  const ago = `, ${coarseDuration(since(s.ended_at))} ago`;
  const exit = s.exit ?? { code: null, signal: null };
  const how = exit.signal ?? (exit.code !== null ? `exit ${exit.code}` : 'no status');
  switch (s.outcome) {
    case 'exited':
      return `exited ${exit.code ?? '?'}${ago}`;
    case 'signaled':
      return `killed by ${s.termination_cause === 'oom_kill' ? 'the OOM killer' : (exit.signal ?? '?')}${ago}`;
    case 'timed_out':
      return `timed out (${how})${ago}`;
    case 'cancelled':
      return `cancelled${s.termination_cause && s.termination_cause !== 'cancel' ? ` by ${s.termination_cause}` : ''} (${how})${ago}`;
    case 'spawn_failed':
      return `spawn failed (${exit.code ?? '?'})${ago}`;
    case 'owner_lost':
      // Ended, its exit status not known: the supervisor that ran it stopped first (a note
      // says so under the table). Not "unknown: …", which is a session not ended.
      return `ended, status unknown (owner lost)${ago}`;
    default:
      return `ended${ago}`;
  }
}

const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(bytes < 10 * 2 ** 20 ? 1 : 0)} MiB`;

const HEADER = ['SESSION', 'STATUS', 'STARTED', 'DURATION', 'USER', 'TASK', 'PID', 'LIVE', 'CPU', 'MEM PEAK', 'KEY', 'COMMAND'] as const;
/** Then columns cut on a terminal to fit its width, in this order, each down to its floor (display columns); COMMAND last. */
const SHRINK: [column: (typeof HEADER)[number], floor: number][] = [
  ['KEY', 12],
  ['TASK', 8],
  ['USER', 8],
  ['COMMAND', 12],
];
/**
 * Columns left out first, in this order, while the rest at their floors would not fit (`sbx ps
 * --json` has them all); SESSION, STATUS and COMMAND stay: which session, how it is, what it runs.
 */
const DROP: (typeof HEADER)[number][] = ['MEM PEAK', 'CPU', 'LIVE', 'USER', 'STARTED', 'PID', 'DURATION', 'TASK', 'KEY'];

export interface PsTableOptions {
  /** ms since the epoch (Date.now()). */
  nowMs: number;
  /** The terminal's columns when stdout is one, else null (COMMAND is then cut at PIPE_COMMAND_COLUMNS). */
  terminalColumns: number | null;
  /** Cut nothing. */
  noTrunc: boolean;
}

/**
 * The whole table, header first, one line per session, each line ending in \n. Widths are display columns
 * (cli/escape.ts: CJK and emoji 2, combining marks 0). Every cell is shown with its control characters escaped
 * (a newline or an ANSI escape in an argv never reaches the terminal as itself). Truncation: on a terminal the rows
 * are fitted to its width (MEM PEAK, CPU, LIVE, USER, STARTED, PID, DURATION, TASK, KEY left out while the rest at
 * their floors would not fit; then KEY, TASK, USER, COMMAND cut, each to a floor, only by what is still over; a
 * line still too wide is cut); not on a terminal COMMAND alone is cut at PIPE_COMMAND_COLUMNS, as docker cuts
 * COMMAND whether or not stdout is a terminal; `--no-trunc` cuts nothing.
 */
export function psTable(sessions: SessionSummary[], o: PsTableOptions): string {
  const commandLimit = o.noTrunc ? undefined : o.terminalColumns !== null ? Math.max(o.terminalColumns, PIPE_COMMAND_COLUMNS) : PIPE_COMMAND_COLUMNS;
  const rows: string[][] = [[...HEADER]];
  for (const s of sessions) {
    // A command that never started (spawn failed) has no start and no run time.
    const startedIso = s.outcome === 'spawn_failed' ? null : (s.started_at ?? null);
    const endMs = s.ended_at ? Date.parse(s.ended_at) : s.state === 'unknown' ? null : o.nowMs;
    const duration = startedIso && endMs !== null ? preciseDuration(endMs - Date.parse(startedIso)) : '-';
    rows.push(
      [
        s.session_id,
        statusText(s, o.nowMs),
        startedIso ? startedText(o.nowMs - Date.parse(startedIso)) : '-',
        duration,
        s.user === null || s.user === undefined ? '-' : s.user,
        s.task ?? '?',
        String(s.pid ?? '-'),
        String(s.live_pids ?? '-'),
        s.usage?.cpu_usec !== undefined ? `${(s.usage.cpu_usec / 1e6).toFixed(2)}s` : '-',
        s.usage?.memory_peak_bytes !== undefined ? mib(s.usage.memory_peak_bytes) : '-',
        s.invocation_key,
        commandText(s.argv, commandLimit),
      ].map((cell, i) => (i === HEADER.length - 1 ? cell : escapeControls(cell))),
    );
  }
  const widths = HEADER.map((_, i) => rows.reduce((m, r) => Math.max(m, displayWidth(r[i])), -Infinity));
  const shown = HEADER.map(() => true);
  const col = (name: (typeof HEADER)[number]) => HEADER.indexOf(name);
  if (!o.noTrunc) {
    if (o.terminalColumns === null) widths[col('COMMAND')] = Math.min(widths[col('COMMAND')], PIPE_COMMAND_COLUMNS);
    else {
      const width = o.terminalColumns;
      const total = () => widths.reduce((sum, w, i) => (shown[i] ? sum + w + 2 : sum), -2);
      // Columns go first while even the cut ones at their floors would not fit; then the cut
      // ones give up only what is still over, so COMMAND keeps what the dropped ones freed.
      const floorOf = (i: number) => SHRINK.find(([name]) => col(name) === i)?.[1] ?? widths[i];
      const leastTotal = () => widths.reduce((sum, w, i) => (shown[i] ? sum + Math.min(w, floorOf(i)) + 2 : sum), -2);
      for (const name of DROP) {
        if (leastTotal() <= width) break;
        shown[col(name)] = false;
      }
      for (const [name, floor] of SHRINK) {
        const i = col(name);
        const over = total() - width;
        if (over <= 0) break;
        widths[i] = Math.max(Math.min(widths[i], floor), widths[i] - over);
      }
    }
  }
  let text = '';
  for (const r of rows) {
    const cells = r.flatMap((c, i) => {
      if (!shown[i]) return [];
      const cut = o.noTrunc ? c : truncate(c, widths[i]);
      return [i === r.length - 1 ? cut : cut + ' '.repeat(Math.max(0, widths[i] - displayWidth(cut)))];
    });
    const line = cells.join('  ').trimEnd();
    // Narrower still than the floors: the line itself is cut, so nothing wraps.
    text += (o.terminalColumns !== null && !o.noTrunc ? truncate(line, o.terminalColumns) : line) + '\n';
  }
  return text;
}

/** The lines under the table: why each unknown session is unknown (and whether its receipt is on its way). */
export function unknownNotes(sessions: SessionSummary[]): string {
  let text = '';
  for (const s of sessions) {
    if (s.state === 'unknown')
      text += `\n${s.session_id} is unknown${s.receipt_pending ? ' (its receipt is on its way)' : ''}: ${escapeControls(s.reason ?? 'no evidence of its end yet')}\n`;
    else if (s.state === 'ended' && s.outcome === 'owner_lost')
      text += `\n${s.session_id} ended with its owner lost: the supervisor that ran it stopped before it ended, so its exit status is unknown (sbx receipt ${s.session_id} has the evidence of its end)\n`;
  }
  return text;
}

// --- Which rows, in which order (sbx ps --all, --task, --filter): docker ps's selection.

/** The --filter keys sbx ps takes (docker's names where docker has one). */
export const PS_FILTER_KEYS = ['status', 'outcome', 'task', 'key', 'id', 'since', 'before'] as const;
export type PsFilterKey = (typeof PS_FILTER_KEYS)[number];
/** status= values: the session states, and docker's `exited` for ended. */
const STATUSES = ['admitted', 'running', 'leader_exited', 'terminating', 'ended', 'exited', 'unknown'];
const OUTCOMES = ['exited', 'signaled', 'timed_out', 'cancelled', 'spawn_failed', 'owner_lost'];

/** Parsed --filter KEY=VALUE options: each key's values (a row matches any value of a key, and every key). */
export type PsFilters = Partial<Record<PsFilterKey, string[]>>;

/**
 * Parses --filter KEY=VALUE options (repeatable) as docker ps does: the same key repeated is
 * OR, different keys AND. Keys: status (a state, or exited = ended), outcome, task, key
 * (invocation key), id (an id prefix), since / before (a session id or unique prefix: those
 * admitted after / before it). Throws RangeError naming an unknown key or a bad value.
 */
export function parsePsFilters(list: string[]): PsFilters {
  const filters: PsFilters = {};
  for (const item of list) {
    const eq = item.indexOf('=');
    const k = item.slice(0, Math.max(eq, 0)) as PsFilterKey;
    const v = item.slice(eq + 1);
    if (eq <= 0 || !PS_FILTER_KEYS.includes(k))
      throw new RangeError(
        `--filter ${JSON.stringify(item)}: ${eq <= 0 ? 'takes KEY=VALUE' : `unknown key ${JSON.stringify(k)}`} (keys: ${PS_FILTER_KEYS.join(', ')})`,
      );
    if (v === '') throw new RangeError(`--filter ${JSON.stringify(item)}: ${k} needs a value`);
    if (k === 'status' && !STATUSES.includes(v)) throw new RangeError(`--filter ${JSON.stringify(item)}: status is one of ${STATUSES.join(', ')}`);
    if (k === 'outcome' && !OUTCOMES.includes(v)) throw new RangeError(`--filter ${JSON.stringify(item)}: outcome is one of ${OUTCOMES.join(', ')}`);
    if ((k === 'since' || k === 'before') && filters[k]) throw new RangeError(`--filter ${k}= is given once`);
    (filters[k] ??= []).push(v);
  }
  return filters;
}

/** Whether ended sessions are shown without --all: a status or outcome filter asks for them (docker: status=exited lists stopped containers without -a). */
function showsEnded(filters: PsFilters): boolean {
  return Boolean(filters.status || filters.outcome);
}

/** Whether sbx ps must ask the supervisor for every session (ps all): --all, or a filter that needs ended ones (since/before: to find the session named). */
export function psNeedsAll(filters: PsFilters, all: boolean): boolean {
  return all || showsEnded(filters) || Boolean(filters.since || filters.before);
}

/**
 * The rows sbx ps shows (--all, --task, --filter): ended ones only with all (or a status/outcome filter), those
 * matching every filter key, newest first (admitted_at, then session id: ids sort by
 * admission). since/before name a session by id or unique prefix among rows (RangeError when
 * none or several).
 */
export function selectPsRows(rows: SessionSummary[], filters: PsFilters, all: boolean): SessionSummary[] {
  const anchor = (k: 'since' | 'before'): SessionSummary | null => {
    const v = filters[k]?.[0];
    if (v === undefined) return null;
    const exact = rows.find((r) => r.session_id === v);
    const prefixed = rows.filter((r) => r.session_id.startsWith(v));
    if (exact) return exact;
    if (prefixed.length === 1 && v.length >= 3) return prefixed[0]!;
    throw new RangeError(
      `--filter ${k}=${v}: ${
        prefixed.length > 1 && v.length >= 3
          ? `ambiguous: it matches ${prefixed
              .map((r) => r.session_id)
              .sort()
              .join(', ')}`
          : 'no such session'
      }`,
    );
  };
  const order = (a: SessionSummary, b: SessionSummary) =>
    Date.parse(b.admitted_at) - Date.parse(a.admitted_at) || (a.session_id < b.session_id ? 1 : a.session_id > b.session_id ? -1 : 0);
  const since = anchor('since');
  const before = anchor('before');
  const any = (k: PsFilterKey, test: (v: string) => boolean) => !filters[k] || filters[k]!.some(test);
  return rows
    .filter((r) => all || showsEnded(filters) || r.state !== 'ended')
    .filter((r) => any('status', (v) => (v === 'exited' ? 'ended' : v) === r.state))
    .filter((r) => any('outcome', (v) => v === r.outcome))
    .filter((r) => any('task', (v) => v === r.task))
    .filter((r) => any('key', (v) => v === r.invocation_key))
    .filter((r) => any('id', (v) => r.session_id.startsWith(v)))
    .filter((r) => !since || order(r, since) < 0)
    .filter((r) => !before || order(r, before) > 0)
    .sort(order);
}
