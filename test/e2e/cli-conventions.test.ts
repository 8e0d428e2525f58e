// docker's CLI conventions in sbx (issue 31), through the sbx bin against one real supervisor:
// short flags (run -d -e -w -u -i -t, ps -a -q, logs -f -t -n) and their completion; session
// ids by unique prefix, resolved by the supervisor for every verb; ps newest first, --task and
// --filter; --since in local time without a zone (TZ set in the child's environment); a stdout
// that cannot be written ends sbx as coreutils' tools end (125; a closed pipe 141).
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { SessionSummary } from '../../ipc/protocol.js';
import { SBX_BIN, TestDaemon, until } from '../helpers/daemon.js';

const sq = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;
const text = (r: { stdout: Buffer }) => r.stdout.toString();
const d = new TestDaemon({ config: { logLevel: 'error' } });

beforeAll(async () => {
  await d.start();
});
afterAll(async () => {
  await d.stop();
});

/** Launches detached with `sbx run -d` and returns the id it printed. */
async function detached(args: string[]): Promise<string> {
  const r = await d.sbx(['run', '-d', ...args]);
  expect([r.status, r.stderr.toString()]).toEqual([0, '']);
  const id = text(r).trim();
  expect(id).toMatch(/^s-[0-9a-z]{9}-[0-9a-f]{12}$/);
  return id;
}

describe('short flags, as docker has them', () => {
  it('run -d -e -w -u: detached, with env, cwd and user; the long forms are the same options', async () => {
    const id = await detached(['-e', 'FOO=bar', '-e', 'X=1', '-w', '/tmp', '-u', 'nobody', '--', 'sh', '-c', 'echo "$FOO $X"; pwd; id -u']);
    const w = await d.sbx(['wait', id]);
    expect(w.status).toBe(0);
    expect(text(await d.sbx(['logs', id]))).toBe('bar 1\n/tmp\n65534\n');
    // -eNAME=VALUE glued, as docker takes it.
    const glued = await d.sbx(['run', '-eA=b', '--', 'sh', '-c', 'echo $A']);
    expect([glued.status, text(glued)]).toEqual([0, 'b\n']);
  });

  it('run -i streams stdin, -t gives a pty, -it both; without them stdin is /dev/null', async () => {
    const i = await d.sbx(['run', '-i', '--', 'cat'], { input: 'hello\n' });
    expect([i.status, text(i)]).toEqual([0, 'hello\n']);
    const none = await d.sbx(['run', '--', 'cat'], { input: 'hello\n' });
    expect([none.status, text(none)]).toEqual([0, '']);
    const t = await d.sbx(['run', '-t', '--', 'sh', '-c', 'test -t 1 && echo tty']);
    expect([t.status, text(t)]).toEqual([0, 'tty\r\n']);
    const it2 = await d.sbx(['run', '-it', '--', 'sh', '-c', 'test -t 0 && read x && echo "got $x"'], { input: 'abc\n' });
    expect(it2.status).toBe(0);
    expect(text(it2)).toContain('got abc\r\n');
  });

  it("options after CMD are CMD's, with or without --", async () => {
    const a = await d.sbx(['run', '--', 'echo', '-d', '-e', 'X=1', '-t']);
    expect([a.status, text(a)]).toEqual([0, '-d -e X=1 -t\n']);
    const b = await d.sbx(['run', '-e', 'Y=2', 'sh', '-c', 'echo "$Y $0"', '-d']);
    expect([b.status, text(b)]).toEqual([0, '2 -d\n']);
  });

  it('ps -a includes ended sessions, -q prints only ids, one per line (over --json too)', async () => {
    const id = await detached(['--', 'true']);
    await d.sbx(['wait', id]);
    const running = await detached(['--', 'sleep', '60']);
    const all = text(await d.sbx(['ps', '-a', '-q'])).split('\n');
    expect(all.at(-1)).toBe('');
    expect(all).toContain(id);
    expect(all).toContain(running);
    for (const line of all.slice(0, -1)) expect(line).toMatch(/^s-[0-9a-z]{9}-[0-9a-f]{12}$/);
    const live = text(await d.sbx(['ps', '--quiet'])).split('\n');
    expect(live).toContain(running);
    expect(live).not.toContain(id);
    expect(text(await d.sbx(['ps', '-aq', '--json']))).toBe(text(await d.sbx(['ps', '--all', '--quiet'])));
    await d.sbx(['kill', running]);
  });

  it('logs -n (--tail), -t (--timestamps), -f (--follow)', async () => {
    const id = await detached(['--', 'sh', '-c', 'printf "a\\nb\\nc\\n"']);
    await d.sbx(['wait', id]);
    expect(text(await d.sbx(['logs', '-n', '2', id]))).toBe('b\nc\n');
    expect(text(await d.sbx(['logs', '-n1', id]))).toBe('c\n');
    const ts = text(await d.sbx(['logs', '-t', '-n', '1', id]));
    expect(ts).toMatch(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z c\n$/);
    // -f on a running session returns once it has ended, with every byte.
    const live = await detached(['-i', '--', 'sh', '-c', 'echo one; read x; echo "two $x"']);
    const follow = d.sbx(['logs', '-f', live]);
    await until(async () => text(await d.sbx(['logs', live])) === 'one\n', 'the first line');
    const w = await d.sbx(['write', '--eof', live], { input: 'x\n' });
    expect(w.status).toBe(0);
    const f = await follow;
    expect([f.status, text(f)]).toEqual([0, 'one\ntwo x\n']);
  });
});

describe('completion offers the short flags', () => {
  function complete(...words: string[]): string[] {
    const script = `source <(${sq(SBX_BIN)} completion bash) && COMP_WORDS=(${words.map(sq).join(' ')}) && COMP_CWORD=${words.length - 1} && _sbx && printf '%s\\n' "\${COMPREPLY[@]}"`;
    const r = spawnSync('bash', ['-c', script], { encoding: 'utf8' });
    expect([r.status, r.stderr]).toEqual([0, '']);
    return r.stdout.split('\n').filter((l) => l !== '');
  }

  it('bash: the short forms beside the long ones; a short flag taking a value skips it', () => {
    const run = complete('sbx', 'run', '-');
    for (const f of ['-d', '--detach', '-e', '--env', '-w', '--cwd', '-u', '--user', '-i', '--stdin', '-t', '--pty']) expect(run).toContain(f);
    expect(complete('sbx', 'ps', '-')).toEqual(expect.arrayContaining(['-a', '--all', '-q', '--quiet']));
    expect(complete('sbx', 'logs', '-')).toEqual(expect.arrayContaining(['-f', '--follow', '-t', '--timestamps', '-n', '--tail']));
    // The value of -e is not a subcommand word, and nothing is offered for it.
    expect(complete('sbx', 'run', '-e', '')).toEqual([]);
    expect(complete('sbx', 'logs', '-n', '5', '--foll')).toEqual(['--follow']);
  });

  it('zsh: both spellings, excluding each other', () => {
    const zsh = spawnSync(SBX_BIN, ['completion', 'zsh'], { encoding: 'utf8' }).stdout;
    expect(zsh).toContain("'(-d --detach)-d[print the session id and return at once]'");
    expect(zsh).toContain("'(-d --detach)--detach[print the session id and return at once]'");
    expect(zsh).toContain("'(-q --quiet)-q[only the session ids, one a line]'");
  });
});

describe('session ids by unique prefix, resolved by the supervisor', () => {
  /** The shortest prefix (3+ characters) of id that no other id in ids starts with. */
  const uniquePrefix = (id: string, ids: string[]) => {
    for (let n = 3; n <= id.length; n++) if (ids.filter((o) => o.startsWith(id.slice(0, n))).length === 1) return id.slice(0, n);
    throw new Error(`no unique prefix of ${id}`);
  };
  const allIds = async () =>
    text(await d.sbx(['ps', '-a', '-q']))
      .split('\n')
      .filter(Boolean);

  it('every verb taking an id takes a unique prefix: wait, logs, receipt, write, resize, kill, cancel, changes', async () => {
    const echo = await detached(['-i', '--', 'sh', '-c', 'read x; echo "got $x"']);
    const pty = await detached(['-t', '--', 'sh', '-c', 'stty size; sleep 60']);
    const sleeper = await detached(['--', 'sleep', '60']);
    const ids = await allIds();
    const [pe, pp, ps] = [uniquePrefix(echo, ids), uniquePrefix(pty, ids), uniquePrefix(sleeper, ids)];
    expect((await d.sbx(['write', '--eof', pe], { input: 'x\n' })).status).toBe(0);
    const w = await d.sbx(['wait', pe]);
    expect(w.status).toBe(0);
    expect(JSON.parse(text(w)).session_id).toBe(echo);
    expect(text(await d.sbx(['logs', pe]))).toBe('got x\n');
    expect(JSON.parse(text(await d.sbx(['receipt', pe]))).session_id).toBe(echo);
    expect(JSON.parse(text(await d.sbx(['changes', '--json', pe]))).session_id).toBe(echo);
    // logs of a pty session by prefix still finds its one stream.
    await until(async () => text(await d.sbx(['logs', pp])).length > 0, 'the pty output');
    expect((await d.sbx(['resize', pp, '100', '30'])).status).toBe(0);
    const k = await d.sbx(['kill', '--json', '--signal', 'TERM', ps]);
    expect([k.status, JSON.parse(text(k)).session_id]).toEqual([0, sleeper]);
    const c = await d.sbx(['cancel', '--json', pp]);
    expect([c.status, JSON.parse(text(c)).session_id]).toEqual([0, pty]);
    // The client library (and so the Python client and sbx --url) gets the same.
    const client = await d.client();
    expect((await client.wait({ session_id: ps })).session_id).toBe(sleeper);
    expect((await client.wait({ session_id: pp })).session_id).toBe(pty);
    expect((await client.receipt({ session_id: pp })).receipt?.session_id).toBe(pty);
  });

  it('an ambiguous prefix is INVALID_ARGUMENT listing the matches; too short or none is SESSION_NOT_FOUND', async () => {
    const a = await detached(['--', 'true']);
    const b = await detached(['--', 'true']);
    await d.sbx(['wait', a]);
    await d.sbx(['wait', b]);
    let common = 0;
    while (a[common] === b[common]) common++;
    const prefix = a.slice(0, common);
    expect(prefix.length).toBeGreaterThanOrEqual(3); // both are s-<time>-..., made moments apart
    const matches = (await allIds()).filter((id) => id.startsWith(prefix)).sort();
    expect(matches).toEqual(expect.arrayContaining([a, b]));
    const r = await d.sbx(['receipt', prefix]);
    expect([r.status, text(r), r.stderr.toString()]).toEqual([
      125,
      '',
      `sbx: INVALID_ARGUMENT: session id prefix "${prefix}" is ambiguous: it matches ${matches.slice(0, 10).join(', ')}${matches.length > 10 ? `, ... (${matches.length} in all)` : ''}; give more of the id\n`,
    ]);
    const client = await d.client();
    const err = await client.receipt({ session_id: prefix }).then(
      () => null,
      (e: unknown) => e as { code: string; details: unknown },
    );
    expect(err?.code).toBe('INVALID_ARGUMENT');
    expect(err?.details).toEqual({ field: 'session_id', prefix, matches, count: matches.length });
    // Shorter than 3 characters: only the exact id, so not found; a prefix of nothing: not found.
    const short = await d.sbx(['receipt', 's-']);
    expect([short.status, short.stderr.toString()]).toEqual([125, 'sbx: SESSION_NOT_FOUND: no session s-\n']);
    const none = await d.sbx(['wait', 's-zzzzzzzzz']);
    expect([none.status, none.stderr.toString()]).toEqual([125, 'sbx: SESSION_NOT_FOUND: no session s-zzzzzzzzz\n']);
    // The exact id wins even when it is a prefix of nothing else: a full id always resolves.
    expect(JSON.parse(text(await d.sbx(['receipt', a]))).session_id).toBe(a);
  });
});

describe('ps: newest first, --task, --filter', () => {
  it('lists newest first (table, -q and --json); --task and repeatable --filter select; an unknown key is refused', async () => {
    const task = `t-${Date.now()}`;
    const first = await detached(['--task', task, '--', 'true']);
    await d.sbx(['wait', first]);
    const second = await detached(['--task', task, '--', 'sh', '-c', 'exit 3']);
    await d.sbx(['wait', second]);
    const third = await detached(['--task', task, '--key', `${task}-k`, '--', 'sleep', '60']);
    const other = await detached(['--', 'sleep', '60']);
    // Newest first: the ids, the table's rows and --json agree.
    const q = text(await d.sbx(['ps', '-aq']))
      .split('\n')
      .filter(Boolean);
    expect(q.slice(0, 4)).toEqual([other, third, second, first]);
    const rows = JSON.parse(text(await d.sbx(['ps', '-a', '--json']))) as SessionSummary[];
    expect(rows.map((r) => r.session_id)).toEqual(q);
    const admitted = rows.map((r) => Date.parse(r.admitted_at));
    expect([...admitted].sort((a, b) => b - a)).toEqual(admitted);
    const table = text(await d.sbx(['ps', '-a']))
      .split('\n')
      .slice(1, 5)
      .map((l) => l.split(' ')[0]);
    expect(table).toEqual([other, third, second, first]);
    // --task T: that task's (running ones without -a).
    expect(text(await d.sbx(['ps', '-q', '--task', task]))).toBe(`${third}\n`);
    expect(text(await d.sbx(['ps', '-aq', '--task', task]))).toBe(`${third}\n${second}\n${first}\n`);
    // --filter: status=exited lists ended ones without -a (docker's); keys AND, one key repeated OR.
    expect(text(await d.sbx(['ps', '-q', '--task', task, '--filter', 'status=exited']))).toBe(`${second}\n${first}\n`);
    expect(text(await d.sbx(['ps', '-q', '-f', `task=${task}`, '-f', 'status=running', '-f', 'status=exited']))).toBe(`${third}\n${second}\n${first}\n`);
    expect(text(await d.sbx(['ps', '-q', '--filter', `key=${task}-k`]))).toBe(`${third}\n`);
    expect(text(await d.sbx(['ps', '-q', '--filter', `task=${task}`, '--filter', 'outcome=exited']))).toBe(`${second}\n${first}\n`);
    expect(text(await d.sbx(['ps', '-aq', '--filter', `since=${first}`, '--filter', `before=${other}`]))).toBe(`${third}\n${second}\n`);
    const bad = await d.sbx(['ps', '--filter', 'name=x']);
    expect([bad.status, text(bad), bad.stderr.toString()]).toEqual([
      125,
      '',
      'sbx: INVALID_ARGUMENT: --filter "name=x": unknown key "name" (keys: status, outcome, task, key, id, since, before)\n',
    ]);
    await d.sbx(['kill', third]);
    await d.sbx(['kill', other]);
  });
});

describe('--since and --until in local time without a zone, as docker', () => {
  /** µs since the epoch as a wall time without a zone at a fixed offset (minutes east of UTC). */
  const wall = (us: number, offsetMin: number) => {
    const ms = Math.floor(us / 1000);
    return `${new Date(ms + offsetMin * 60_000).toISOString().slice(0, -1)}${String(us - ms * 1000).padStart(3, '0')}`;
  };
  /** A zone's offset from UTC at an instant, in minutes east (from Intl's wall-clock parts). */
  const offsetMinutes = (timeZone: string, ms: number) => {
    const parts = Object.fromEntries(
      new Intl.DateTimeFormat('en-US', {
        timeZone,
        hourCycle: 'h23',
        year: 'numeric',
        month: '2-digit',
        day: '2-digit',
        hour: '2-digit',
        minute: '2-digit',
        second: '2-digit',
      })
        .formatToParts(ms)
        .map((p) => [p.type, p.value]),
    );
    const asUtc = Date.UTC(Number(parts.year), Number(parts.month) - 1, Number(parts.day), Number(parts.hour), Number(parts.minute), Number(parts.second));
    return Math.round((asUtc - Math.floor(ms / 1000) * 1000) / 60_000);
  };
  const usOf = (stamp: string) => {
    const m = /^(.*)\.(\d{6})Z$/.exec(stamp)!;
    return Date.parse(`${m[1]}Z`) * 1000 + Number(m[2]);
  };

  it('reads the time in TZ (set in the environment of sbx); RFC 3339 with a zone, unix seconds and durations still work', async () => {
    const go = `${d.dir}/go-since`;
    const id = await detached(['--', 'sh', '-c', `echo before; while [ ! -e ${go} ]; do sleep 0.01; done; echo after`]);
    await until(async () => text(await d.sbx(['logs', id])) === 'before\n', 'the first line');
    await d.sbx(['run', '--', 'touch', go]);
    await d.sbx(['wait', id]);
    const lines = text(await d.sbx(['logs', '-t', id]))
      .split('\n')
      .filter(Boolean);
    expect(lines.map((l) => l.split(' ')[1])).toEqual(['before', 'after']);
    const [t1, t2] = lines.map((l) => usOf(l.split(' ')[0]!));
    expect(t2! - t1!).toBeGreaterThan(2);
    const mid = Math.floor((t1! + t2!) / 2);
    const kolkata = { TZ: 'Asia/Kolkata' }; // +05:30 all year
    const newYork = { TZ: 'America/New_York' };
    const nyOffset = offsetMinutes('America/New_York', mid / 1000);
    const logs = async (args: string[], env: NodeJS.ProcessEnv) => {
      const r = await d.sbx(['logs', ...args, id], { env });
      expect([r.status, r.stderr.toString()]).toEqual([0, '']);
      return text(r);
    };
    expect(await logs(['--since', wall(mid, 330)], kolkata)).toBe('after\n');
    expect(await logs(['--until', wall(mid, 330)], kolkata)).toBe('before\n');
    // The same wall time read in another zone is another instant: there it is hours away.
    expect(await logs(['--since', wall(mid, 330)], newYork)).toBe('');
    expect(await logs(['--since', wall(mid, nyOffset)], newYork)).toBe('after\n');
    // The space form and minutes only: a minute before t1 (local), and the date alone (local midnight).
    const minuteBefore = wall(t1! - 60e6, 330)
      .slice(0, 16)
      .replace('T', ' ');
    expect(await logs(['--since', minuteBefore], kolkata)).toBe('before\nafter\n');
    expect(await logs(['--since', wall(t1! - 86_400e6, 330).slice(0, 10)], kolkata)).toBe('before\nafter\n');
    expect(await logs(['--until', wall(t1! - 86_400e6, 330).slice(0, 10)], kolkata)).toBe('');
    // With a zone, TZ does not matter; unix seconds and a duration ago as before.
    expect(await logs(['--since', `${wall(mid, 0)}Z`], kolkata)).toBe('after\n');
    expect(await logs(['--since', `${wall(mid, 330)}+05:30`], newYork)).toBe('after\n');
    expect(await logs(['--until', `${Math.floor(mid / 1e6)}.${String(mid % 1e6).padStart(6, '0')}`], newYork)).toBe('before\n');
    expect(await logs(['--since', '1h0m30s'], kolkata)).toBe('before\nafter\n');
    const bad = await d.sbx(['logs', '--since', '2026-12-03T25:00', id]);
    expect([bad.status, bad.stderr.toString()]).toEqual([
      125,
      'sbx: INVALID_ARGUMENT: --since: not a time: "2026-12-03T25:00" (use RFC 3339 like 2026-12-01T10:00:00Z, a local time like 2026-12-01T10:00:00, 2026-12-01 10:00 or 2026-12-01, a Unix time in seconds, or a duration ago like 10m, 1h30m)\n',
    ]);
  });
});

describe('one duration syntax for every option', () => {
  it('--timeout, --grace (run, cancel, close) take Go compounds; a bad one is refused before anything is sent', async () => {
    // 1m30s was refused by --timeout before issue 31; the session's deadline is 90 s.
    const id = await detached(['--timeout', '1m30s', '--grace', '1s500ms', '--', 'sleep', '60']);
    const c = await d.sbx(['cancel', '--grace', '250ms', id]);
    expect([c.status, c.stderr.toString()]).toEqual([0, '']);
    const receipt = JSON.parse(text(await d.sbx(['wait', id])));
    expect(receipt).toMatchObject({ session_id: id, outcome: 'cancelled' });
    // The admission record says what was asked for (docs/reference/state-dir.md).
    const admission = JSON.parse(readFileSync(join(d.stateDir, 'sessions', id, 'admission.json'), 'utf8'));
    expect([admission.timeout_ms, admission.grace_ms]).toEqual([90_000, 1500]);
    const timedOut = await d.sbx(['run', '--timeout', '0.2s', '--grace', '100ms', '--', 'sleep', '60']);
    expect(timedOut.status).toBe(124);
    for (const [flag, value, message] of [
      ['--timeout', '1m30', 'not a duration: "1m30"; the last number needs a unit (use e.g. 500ms, 30s, 1m30s, 1h2m3.5s; a bare number is seconds)'],
      ['--grace', '-1s', 'not a duration: "-1s" (use e.g. 500ms, 30s, 1m30s, 1h2m3.5s; a bare number is seconds)'],
      ['--timeout', '1x', 'not a duration: "1x" (use e.g. 500ms, 30s, 1m30s, 1h2m3.5s; a bare number is seconds)'],
      ['--timeout', '31d', 'duration "31d" is over the limit of 30 days'],
    ]) {
      const r = await d.sbx(['run', flag!, value!, '--', 'true']);
      expect([r.status, text(r), r.stderr.toString()], `${flag} ${value}`).toEqual([125, '', `sbx: INVALID_ARGUMENT: ${message}\n`]);
    }
    const close = await d.sbx(['close', '--task', 'no-such-task', '--timeout', '1m']);
    expect(close.status).toBe(0);
  });
});

describe("stdout that cannot be written, as coreutils' tools end", () => {
  it('a full device: 125 and "cannot write to stdout" (--version and --help exit at once after writing; ps writes later)', () => {
    for (const args of [['--version'], ['--help'], ['ps', '-a']]) {
      const r = spawnSync('sh', ['-c', `${sq(SBX_BIN)} ${args.join(' ')} >/dev/full`], { env: { ...process.env, SBX_SOCKET: d.socketPath } });
      expect({ args, status: r.status, stderr: r.stderr.toString() }).toEqual({ args, status: 125, stderr: 'sbx: cannot write to stdout: ENOSPC\n' });
    }
  });

  it('a reader that went away (sbx run | head -c 1): 141, as SIGPIPE would, saying the session goes on', () => {
    const r = spawnSync('bash', ['-c', `set -o pipefail; ${sq(SBX_BIN)} run -- sh -c 'head -c 4000000 /dev/zero; sleep 0.5' | head -c 1 >/dev/null`], {
      env: { ...process.env, SBX_SOCKET: d.socketPath },
    });
    expect(r.status).toBe(141);
    expect(r.stderr.toString()).toMatch(/^sbx: stdout was closed; session (s-\S+) goes on \(sbx cancel \1 ends it\)\n$/);
  });
});
