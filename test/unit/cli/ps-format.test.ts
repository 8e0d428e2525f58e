// sbx ps's table (cli/ps-format.ts) as a pure function: the STATUS sentences, escaping, and
// how rows are cut to a terminal's width or, piped, COMMAND alone.
import { describe, expect, it } from 'vitest';
import { displayWidth } from '../../../cli/escape.js';
import {
  coarseDuration,
  commandText,
  escapeControls,
  parsePsFilters,
  preciseDuration,
  psNeedsAll,
  psTable,
  selectPsRows,
  statusText,
  truncate,
  unknownNotes,
} from '../../../cli/ps-format.js';
import type { SessionSummary } from '../../../ipc/protocol.js';

const NOW = Date.parse('2026-12-01T12:00:00.000Z');
const ago = (ms: number) => new Date(NOW - ms).toISOString();

function row(over: Partial<SessionSummary>): SessionSummary {
  return {
    session_id: 's-1-aa',
    invocation_key: 'k',
    task: 'default',
    state: 'ended',
    argv: ['true'],
    pid: 42,
    admitted_at: ago(130_000),
    started_at: ago(125_000),
    ended_at: ago(120_000),
    outcome: 'exited',
    exit: { code: 0, signal: null },
    termination_cause: null,
    user: null,
    live_pids: null,
    cursors: {},
    usage: {},
    ...over,
  };
}

describe('statusText', () => {
  it('reads as docker ps does, for every state and outcome', () => {
    expect(statusText(row({ exit: { code: 3, signal: null } }), NOW)).toBe('exited 3, 2 min ago');
    expect(statusText(row({ outcome: 'signaled', exit: { code: null, signal: 'SIGTERM' } }), NOW)).toBe('killed by SIGTERM, 2 min ago');
    expect(statusText(row({ outcome: 'timed_out', exit: { code: null, signal: 'SIGKILL' }, termination_cause: 'deadline' }), NOW)).toBe(
      'timed out (SIGKILL), 2 min ago',
    );
    expect(statusText(row({ outcome: 'cancelled', exit: { code: null, signal: 'SIGTERM' }, termination_cause: 'cancel' }), NOW)).toBe(
      'cancelled (SIGTERM), 2 min ago',
    );
    expect(statusText(row({ outcome: 'cancelled', exit: { code: null, signal: 'SIGTERM' }, termination_cause: 'shutdown' }), NOW)).toBe(
      'cancelled by shutdown (SIGTERM), 2 min ago',
    );
    expect(statusText(row({ outcome: 'spawn_failed', exit: { code: 127, signal: null } }), NOW)).toBe('spawn failed (127), 2 min ago');
    expect(statusText(row({ exit: { code: 0, signal: null }, escaped: 'unproven' }), NOW)).toBe(
      'exited 0, 2 min ago, processes left its cgroup (end unproven)',
    );
    expect(statusText(row({ exit: { code: 0, signal: null }, escaped: 'attested' }), NOW)).toBe(
      'exited 0, 2 min ago, processes left its cgroup (end attested)',
    );
    expect(statusText(row({ outcome: 'owner_lost', exit: { code: null, signal: null } }), NOW)).toBe('ended, status unknown (owner lost), 2 min ago');
    expect(statusText(row({ state: 'running', ended_at: null, outcome: null, exit: null, started_at: ago(12_400) }), NOW)).toBe('running 12 s');
    expect(statusText(row({ state: 'unknown', ended_at: null, outcome: null, exit: null }), NOW)).toBe('unknown: owner lost');
    expect(statusText(row({ state: 'unknown', ended_at: null, outcome: null, exit: null, receipt_pending: true }), NOW)).toBe('unknown: being ended');
    expect(statusText(row({ state: 'terminating', ended_at: null, outcome: null, exit: null }), NOW)).toBe('terminating');
  });

  it('a spawn failure has no start or run time; a start ahead of the clock says so; a bad timestamp is "?", never NaN; an ended owner-lost session has a note', () => {
    const failed = psTable([row({ outcome: 'spawn_failed', exit: { code: 127, signal: null } })], { nowMs: NOW, terminalColumns: null, noTrunc: false }).split(
      '\n',
    )[1];
    expect(failed).toMatch(/^s-1-aa +spawn failed \(127\), 2 min ago +- +- /);
    const ahead = psTable([row({ started_at: new Date(NOW + 90_000).toISOString() })], { nowMs: NOW, terminalColumns: null, noTrunc: false }).split('\n')[1];
    expect(ahead).toContain('in 1 min (clock skew?)');
    const bad = psTable([row({ started_at: 'not a time', ended_at: 'nor this' })], { nowMs: NOW, terminalColumns: null, noTrunc: false });
    expect(bad).not.toContain('NaN');
    expect(bad.split('\n')[1]).toMatch(/^s-1-aa +exited 0, \? ago +\? ago +\? /);
    expect(unknownNotes([row({ outcome: 'owner_lost', exit: { code: null, signal: null } })])).toBe(
      '\ns-1-aa ended with its owner lost: the supervisor that ran it stopped before it ended, so its exit status is unknown (sbx receipt s-1-aa has the evidence of its end)\n',
    );
    expect(preciseDuration(9960)).toBe('10 s');
    expect(preciseDuration(9940)).toBe('9.9 s');
  });

  it('durations: coarse for ages, one unit finer for run times', () => {
    expect([450, 12_900, 150_000, 5 * 3600_000, 3 * 86400_000].map(coarseDuration)).toEqual(['450 ms', '12 s', '2 min', '5 h', '3 days']);
    expect([1_230, 12_900, 125_000, 3_780_000, 2 * 86400_000 + 3 * 3600_000].map(preciseDuration)).toEqual([
      '1.2 s',
      '12 s',
      '2 min 5 s',
      '1 h 3 min',
      '2 d 3 h',
    ]);
  });
});

describe('cells', () => {
  it('escapes C0, DEL and C1 controls; argv as shell words', () => {
    expect(escapeControls('a\nb\tc\rd\x1b[0m\x7f\x9b')).toBe('a\\nb\\tc\\rd\\x1b[0m\\x7f\\x9b');
    expect(commandText(['sh', '-c', "echo 'hi'; exit 3", ''])).toBe(`sh -c 'echo '\\''hi'\\''; exit 3' ''`);
    expect(truncate('abcdef', 4)).toBe('abc…');
    expect(truncate('abc', 4)).toBe('abc');
    // A huge argument is not escaped whole to show a few characters of it.
    expect(commandText(['x', 'y'.repeat(1 << 20)], 40).length).toBeLessThan(100);
  });
});

describe('psTable', () => {
  const sessions = [row({ argv: ['sh', '-c', 'x'.repeat(200)], invocation_key: 'auto-0123456789abcdef01234567' })];

  it('piped: COMMAND cut at 40 characters, the rest whole; --no-trunc cuts nothing', () => {
    const piped = psTable(sessions, { nowMs: NOW, terminalColumns: null, noTrunc: false }).split('\n');
    expect(piped[1].endsWith(`auto-0123456789abcdef01234567  sh -c ${'x'.repeat(33)}…`)).toBe(true);
    const whole = psTable(sessions, { nowMs: NOW, terminalColumns: null, noTrunc: true }).split('\n');
    expect(whole[1].endsWith(`sh -c ${'x'.repeat(200)}`)).toBe(true);
  });

  it('on a terminal every line fits its width: columns cut to floors, then left out, then the line cut', () => {
    for (const width of [200, 120, 80, 40]) {
      const lines = psTable(sessions, { nowMs: NOW, terminalColumns: width, noTrunc: false }).split('\n').filter(Boolean);
      for (const l of lines) expect(Array.from(l).length).toBeLessThanOrEqual(width);
    }
    const at80 = psTable(sessions, { nowMs: NOW, terminalColumns: 80, noTrunc: false }).split('\n');
    expect(at80[0]).toMatch(/^SESSION +STATUS +DURATION +TASK +PID +KEY +COMMAND$/);
  });

  it('at 80 columns the columns left out free room for COMMAND: it keeps at least its floor, the session id is whole, the width is used', () => {
    const many = [
      row({ session_id: 's-0mx5f0jwx-a9309f3b93d6', argv: ['sh', '-c', 'sleep 600; echo done'], invocation_key: 'auto-18d875c2f1e04a9b7c3d2e1f' }),
      row({ session_id: 's-0mx5f0k1i-507288431972', argv: ['make', '-j2', 'test'], invocation_key: 'build-7', user: 'builder', task: 'ci-1234' }),
    ];
    for (const width of [80, 100]) {
      const lines = psTable(many, { nowMs: NOW, terminalColumns: width, noTrunc: false }).split('\n').filter(Boolean);
      const at = lines[0].indexOf('COMMAND');
      expect(at).toBeGreaterThan(0);
      for (const l of lines.slice(1)) {
        expect(displayWidth(l)).toBeLessThanOrEqual(width);
        expect(l).toMatch(/^s-0mx5f0\w{3}-\w{12}  /);
        // The COMMAND cell: its floor (12) of the argv at least, unless the whole argv is shorter.
        expect(l.slice(at).replace(/…$/, '').length).toBeGreaterThanOrEqual(12);
      }
      // Nothing wasted: the longest row reaches the width, or every cell is whole.
      const full = lines.some((l) => displayWidth(l) >= width - 1) || !lines.some((l) => l.endsWith('…'));
      expect(full).toBe(true);
    }
  });

  it('measures display columns, not code points: CJK and emoji (2 columns) stay aligned and within the width', () => {
    const wide = [
      row({ session_id: 's-1-aa', invocation_key: '鍵'.repeat(30), argv: ['echo', '漢字👍e\u0301'.repeat(10)] }),
      row({ session_id: 's-2-bb', invocation_key: 'plain', argv: ['echo', 'abc'] }),
    ];
    for (const width of [100, 200]) {
      const lines = psTable(wide, { nowMs: NOW, terminalColumns: width, noTrunc: false }).split('\n').filter(Boolean);
      for (const l of lines) expect(displayWidth(l)).toBeLessThanOrEqual(width);
      // COMMAND starts at the same column on every line.
      const starts = lines.map((l, i) => displayWidth(l.slice(0, i === 0 ? l.indexOf('COMMAND') : l.indexOf('echo'))));
      expect(new Set(starts).size).toBe(1);
    }
    expect(displayWidth('漢字👍e\u0301')).toBe(7);
    expect(truncate('漢字漢字', 5)).toBe('漢字…');
  });
});

describe('escapeControls', () => {
  it('escapes C0, DEL, C1, the bidi controls and the line and paragraph separators; leaves other text as it is', () => {
    expect(escapeControls('a\x1b[31mb\x7f\x85\x9b')).toBe('a\\x1b[31mb\\x7f\\x85\\x9b');
    expect(escapeControls('x\u202ey\u2066z\u2069\u2028\u2029')).toBe('x\\u202ey\\u2066z\\u2069\\u2028\\u2029');
    expect(escapeControls('漢字 é 👍')).toBe('漢字 é 👍');
  });
});

describe('which rows, in which order (ps --all, --task, --filter)', () => {
  const rows = [
    row({ session_id: 's-0000000a-01', admitted_at: ago(50_000), state: 'ended', outcome: 'exited', task: 'A', invocation_key: 'k1' }),
    row({ session_id: 's-0000000c-03', admitted_at: ago(10_000), state: 'running', outcome: null, task: 'B', invocation_key: 'k3' }),
    row({ session_id: 's-0000000b-02', admitted_at: ago(30_000), state: 'ended', outcome: 'signaled', task: 'B', invocation_key: 'k2' }),
    row({ session_id: 's-0000000d-04', admitted_at: ago(10_000), state: 'unknown', outcome: null, task: 'A', invocation_key: 'k4' }),
  ];
  const ids = (f: string[], all = false) => selectPsRows(rows, parsePsFilters(f), all).map((r) => r.session_id.slice(-2));

  it('newest first by admission, ties by id; ended only with --all or a status/outcome filter', () => {
    expect(ids([], true)).toEqual(['04', '03', '02', '01']);
    expect(ids([])).toEqual(['04', '03']);
    expect(ids(['status=exited'])).toEqual(['02', '01']); // docker's name for ended
    expect(ids(['status=ended', 'status=running'])).toEqual(['03', '02', '01']); // one key repeated: OR
    expect(ids(['outcome=signaled'])).toEqual(['02']);
    expect(ids(['task=A'], true)).toEqual(['04', '01']);
    expect(ids(['task=A', 'status=ended'])).toEqual(['01']); // keys: AND
    expect(ids(['key=k3', 'key=k1'], true)).toEqual(['03', '01']);
    expect(ids(['id=s-0000000b'], true)).toEqual(['02']);
    expect(ids(['since=s-0000000b'], true)).toEqual(['04', '03']);
    expect(ids(['before=s-0000000c-03'], true)).toEqual(['02', '01']);
    expect(ids(['since=s-0000000a', 'before=s-0000000c'], true)).toEqual(['02']);
    expect(ids(['task=nope'], true)).toEqual([]);
  });

  it('asks the supervisor for every session only when the filters need it', () => {
    expect([
      psNeedsAll({}, false),
      psNeedsAll({}, true),
      psNeedsAll(parsePsFilters(['task=A']), false),
      psNeedsAll(parsePsFilters(['status=running']), false),
      psNeedsAll(parsePsFilters(['since=s-1']), false),
    ]).toEqual([false, true, false, true, true]);
  });

  it('refuses unknown keys, bad values and anchors that name no one session', () => {
    expect(() => parsePsFilters(['name=x'])).toThrow('--filter "name=x": unknown key "name" (keys: status, outcome, task, key, id, since, before)');
    expect(() => parsePsFilters(['status'])).toThrow('--filter "status": takes KEY=VALUE (keys: ');
    expect(() => parsePsFilters(['task='])).toThrow('--filter "task=": task needs a value');
    expect(() => parsePsFilters(['status=paused'])).toThrow(
      '--filter "status=paused": status is one of admitted, running, leader_exited, terminating, ended, exited, unknown',
    );
    expect(() => parsePsFilters(['outcome=ok'])).toThrow('outcome is one of exited, signaled, timed_out, cancelled, spawn_failed, owner_lost');
    expect(() => parsePsFilters(['since=a', 'since=b'])).toThrow('--filter since= is given once');
    expect(() => ids(['since=s-00'], true)).toThrow('--filter since=s-00: ambiguous: it matches s-0000000a-01, s-0000000b-02, s-0000000c-03, s-0000000d-04');
    expect(() => ids(['before=s-9'], true)).toThrow('--filter before=s-9: no such session');
  });
});
