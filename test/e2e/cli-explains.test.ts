// A CLI that explains itself (issue 21), through the sbx bin against real supervisors: ps as
// docker ps (escaped, fitted to a terminal of known width, COMMAND cut when piped, --no-trunc),
// the messages (KEY_CONFLICT's differing fields, owner lost, unreachable sockets, kill/cancel of
// an ended session, a closed stdin, --public-key), one line per wait as soon as it starts,
// progress on a terminal only, and bash completion.
import { spawn, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { SessionSummary } from '../../ipc/protocol.js';
import { SBX_BIN, TestDaemon, until } from '../helpers/daemon.js';
import { json, WorkspaceRig } from '../helpers/workspace.js';

/** A single-quoted shell word. */
const sq = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

/** sbx on a terminal of cols x 24 (script(1)); stdout and stderr come back as one stream, lines ending \r\n. */
function sbxOnTerminal(socketPath: string, args: string[], cols: number): { status: number | null; output: string } {
  const r = spawnSync('script', ['-qec', `stty cols ${cols} rows 24; ${[SBX_BIN, ...args].map(sq).join(' ')}`, '/dev/null'], {
    env: { ...process.env, SBX_SOCKET: socketPath },
    encoding: 'utf8',
    maxBuffer: 64 * 1024 * 1024,
  });
  return { status: r.status, output: r.stdout };
}

/** sbx started in the background, its stderr readable while it runs. */
function background(d: TestDaemon, args: string[]) {
  const child = spawn(SBX_BIN, args, { cwd: d.dir, env: { ...process.env, SBX_SOCKET: d.socketPath }, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (b: Buffer) => (stdout += b.toString()));
  child.stderr.on('data', (b: Buffer) => (stderr += b.toString()));
  const exited = new Promise<number | null>((r) => child.on('close', (code) => r(code)));
  return { child, exited, stdout: () => stdout, stderr: () => stderr };
}

/** sbx's line on losing d's supervisor. The errno is what failed first: the connect (ECONNREFUSED) or a write to the dead connection (EPIPE, ECONNRESET). */
function reconnectLineOf(d: TestDaemon): RegExp {
  return new RegExp(
    `^sbx: lost the supervisor at ${d.socketPath.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')} \\((ECONNREFUSED|EPIPE|ECONNRESET)\\); reconnecting for up to 60 s\n$`,
  );
}

/** An attached sbx run of `echo up; sleep 60` (grace 100 ms), then d SIGKILLed: once sbx says it reconnects, that line. */
async function runThenLoseSupervisor(d: TestDaemon, options: string[]) {
  const run = background(d, ['run', ...options, '--grace', '100ms', '--', 'sh', '-c', 'echo up; sleep 60']);
  await until(() => run.stdout() === 'up\n', 'the session to run');
  const sessionId = json<SessionSummary[]>(await d.sbx(['ps', '--json']))[0].session_id;
  await d.kill9();
  const reconnectLine = reconnectLineOf(d);
  const line = await until(() => reconnectLine.exec(run.stderr())?.[0], 'the reconnecting line before the supervisor is back');
  return { run, sessionId, line };
}

const rowOf = (text: string, sessionId: string) => text.split(/\r?\n/).find((l) => l.startsWith(`${sessionId} `)) ?? '';

describe('sbx ps', () => {
  const d = new TestDaemon({ config: { logLevel: 'error' } });
  const ids: Record<string, string> = {};
  const big = 'a'.repeat(1 << 20);

  beforeAll(async () => {
    await d.start();
    const c = await d.client();
    const launch = async (name: string, argv: string[]) => (ids[name] = (await c.launch({ argv, cwd: '/', invocation_key: name })).session_id);
    await launch('esc', ['sh', '-c', 'exit 3', 'sh', 'line1\nline2', '\x1b[31mred\x1b[0m']);
    await launch('big', ['true', big]); // one argument past MAX_ARG_STRLEN: E2BIG at exec, 126
    await launch('term', ['sh', '-c', 'kill -TERM $$']);
    await launch('running', ['sleep', '60']);
    for (const name of ['esc', 'big', 'term']) await c.wait({ session_id: ids[name] });
    await until(async () => (await c.ps(false)).sessions.find((s) => s.session_id === ids.running)?.state === 'running', 'sleep to run');
  });
  afterAll(async () => {
    await d.stop();
  });

  it('says each status as a sentence, with control characters (a newline, ANSI escapes) shown escaped: one line per session', async () => {
    const r = await d.sbx(['ps', '--all', '--no-trunc']);
    expect(r.status).toBe(0);
    expect(r.stderr.toString()).toBe('');
    const out = r.stdout.toString();
    expect(out).not.toContain('\x1b');
    const lines = out.split('\n');
    expect(lines).toHaveLength(6); // header, four sessions, and the end of the last line: no row was split
    expect(lines[0]).toMatch(/^SESSION +STATUS +STARTED +DURATION +USER +TASK +PID +LIVE +CPU +MEM PEAK +KEY +COMMAND$/);
    const esc = rowOf(out, ids.esc);
    expect(esc).toMatch(new RegExp(`^${ids.esc} +exited 3, \\d+ (ms|s) ago +\\d+ (ms|s) ago +\\d+\\.\\d s +- +default +\\d+ +- `));
    expect(esc.endsWith(` esc      sh -c 'exit 3' sh 'line1\\nline2' '\\x1b[31mred\\x1b[0m'`)).toBe(true); // KEY padded to "running"
    expect(rowOf(out, ids.term)).toMatch(new RegExp(`^${ids.term} +killed by SIGTERM, \\d+ (ms|s) ago `));
    expect(rowOf(out, ids.big)).toMatch(new RegExp(`^${ids.big} +spawn failed \\(126\\), \\d+ (ms|s) ago `));
    expect(rowOf(out, ids.running)).toMatch(new RegExp(`^${ids.running} +running \\d+ (ms|s) +\\d+ (ms|s) ago +\\d+\\.\\d s +- +default +\\d+ +1 `));
    // --json is the supervisor's summaries, now with started_at, exit, termination_cause and user.
    const rows = json<SessionSummary[]>(await d.sbx(['ps', '--all', '--json']));
    expect(rows.find((s) => s.session_id === ids.term)).toMatchObject({
      state: 'ended',
      outcome: 'signaled',
      exit: { code: null, signal: 'SIGTERM' },
      termination_cause: null,
      user: null,
      started_at: expect.any(String),
    });
    expect(rows.find((s) => s.session_id === ids.running)).toMatchObject({ state: 'running', exit: null, started_at: expect.any(String) });
  });

  it('not on a terminal, COMMAND is cut at 40 characters (docker cuts it whatever stdout is); --no-trunc prints a 1 MiB argument whole', async () => {
    const cut = await d.sbx(['ps', '--all']);
    expect(cut.status).toBe(0);
    expect(cut.stdout.length).toBeLessThan(4096);
    expect(rowOf(cut.stdout.toString(), ids.big).endsWith(` big      true ${'a'.repeat(34)}…`)).toBe(true);
    expect(rowOf(cut.stdout.toString(), ids.esc).endsWith(` esc      sh -c 'exit 3' sh 'line1\\nline2' '\\x1b[…`)).toBe(true);
    const whole = await d.sbx(['ps', '--all', '--no-trunc']);
    expect(rowOf(whole.stdout.toString(), ids.big).endsWith(` big      true ${big}`)).toBe(true);
  });

  it('on a terminal of 120 columns every line fits (columns cut, then left out); --no-trunc cuts nothing', () => {
    const fitted = sbxOnTerminal(d.socketPath, ['ps', '--all'], 120);
    expect(fitted.status).toBe(0);
    const lines = fitted.output.split('\r\n').filter((l) => l !== '');
    expect(lines).toHaveLength(5);
    for (const l of lines) expect(Array.from(l).length).toBeLessThanOrEqual(120);
    expect(lines[0]).toMatch(/^SESSION +STATUS +.* +COMMAND$/);
    expect(rowOf(fitted.output, ids.big)).toMatch(/ true a+…$/);
    const whole = sbxOnTerminal(d.socketPath, ['ps', '--all', '--no-trunc'], 120);
    expect(whole.status).toBe(0);
    expect(whole.output.split('\r\n')[0]).toMatch(/^SESSION +STATUS +STARTED +DURATION +USER +TASK +PID +LIVE +CPU +MEM PEAK +KEY +COMMAND$/);
    expect(rowOf(whole.output, ids.big).endsWith(` true ${big}`)).toBe(true);
  });

  it('kill and cancel of an ended session exit 1 and say how it ended (as docker kill of a stopped container); of a running one, 0 and quiet', async () => {
    const receipt = (await (await d.client()).receipt({ session_id: ids.esc })).receipt!;
    const kill = await d.sbx(['kill', ids.esc]);
    expect([kill.status, kill.stderr.toString(), kill.stdout.toString()]).toEqual([
      1,
      `sbx: session ${ids.esc} was not signalled: it ended (exited 3 at ${receipt.ended_at}); nothing of it runs\n`,
      '',
    ]);
    const cancel = await d.sbx(['cancel', '--key', 'term']);
    const termEnded = (await (await d.client()).receipt({ session_id: ids.term })).receipt!.ended_at;
    expect([cancel.status, cancel.stderr.toString()]).toEqual([
      1,
      `sbx: session ${ids.term} was not cancelled: it ended (killed by SIGTERM at ${termEnded}); nothing of it runs\n`,
    ]);
    const killJson = await d.sbx(['kill', ids.esc, '--json']);
    expect(killJson.status).toBe(1);
    expect(JSON.parse(killJson.stdout.toString())).toEqual({ session_id: ids.esc, signal: 'SIGKILL', pids: 0, ended: true, outcome: 'exited' });
    const live = await d.sbx(['kill', '--signal', 'SIGTERM', ids.running]);
    expect([live.status, live.stderr.toString()]).toEqual([0, '']);
  });

  it('KEY_CONFLICT names the fields that differ (env by name, never its value) and the session that holds the key', async () => {
    const first = await d.sbx(['run', '--key', 'kc', '--', 'echo', 'one']);
    expect(first.status).toBe(0);
    const holder = json<SessionSummary[]>(await d.sbx(['ps', '--all', '--json'])).find((s) => s.invocation_key === 'kc')!.session_id;
    const again = await d.sbx(['run', '--key', 'kc', '--env', 'TOKEN=hunter2', '--stdin', '--', 'echo', 'two']);
    expect(again.status).toBe(125);
    expect(again.stderr.toString()).toBe(
      `sbx: KEY_CONFLICT: invocation key "kc" was used for another command by session ${holder}: argv, env (TOKEN), stdin differ; a key runs one command, ever: use another --key (sbx receipt ${holder} shows the command it ran)\n`,
    );
    expect(again.stdout.toString()).toBe('');
    const err = await (await d.client()).launch({ argv: ['echo', 'one'], cwd: '/', invocation_key: 'kc', env: { TOKEN: 'hunter2' } }).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'KEY_CONFLICT', details: { invocation_key: 'kc', session_id: holder, differs: ['cwd', 'env'], env_names: ['TOKEN'] } });
    expect(JSON.stringify(err)).not.toContain('hunter2');
  });

  it('KEY_CONFLICT shows an env name with an ANSI escape in it escaped: no escape sequence of the caller reaches the terminal', async () => {
    expect((await d.sbx(['run', '--key', 'kc-esc', '--', 'true'])).status).toBe(0);
    const r = spawnSync('sh', ['-c', `${sq(SBX_BIN)} run --key kc-esc --env "$(printf 'X\\033[31mRED\\033[0m')=1" -- true`], {
      env: { ...process.env, SBX_SOCKET: d.socketPath },
      encoding: 'utf8',
    });
    expect(r.status).toBe(125);
    expect(r.stderr).toContain('env (X\\x1b[31mRED\\x1b[0m)');
    expect(r.stderr).not.toMatch(/[\x00-\x09\x0b-\x1f\x7f]/);
  });

  it('yes | sbx run --stdin -- head -c5 prints the five bytes and nothing else, exit 0', () => {
    const r = spawnSync('sh', ['-c', `yes | ${sq(SBX_BIN)} run --stdin -- head -c5`], { env: { ...process.env, SBX_SOCKET: d.socketPath }, encoding: 'utf8' });
    expect([r.status, r.stdout, r.stderr]).toEqual([0, 'y\ny\ny', '']);
  });

  it('verify takes --public-key FILE; --key FILE still works, with a deprecation note', async () => {
    const file = join(d.dir, 'r.json');
    writeFileSync(file, (await d.sbx(['receipt', ids.esc])).stdout);
    const pub = join(d.stateDir, 'receipt-key.pub');
    const now = await d.sbx(['verify', file, '--public-key', pub]);
    expect([now.status, now.stderr.toString()]).toEqual([0, '']);
    // No --state-dir or $SBX_STATE_DIR: the supervisor at $SBX_SOCKET says where its state dir is, and that one holds the session.
    expect(now.stdout.toString()).toMatch(/^OK: signed by sha256:[0-9a-f]{64}; stored output matches \(stdout \d+ bytes, stderr \d+ bytes\)\n$/);
    const old = await d.sbx(['verify', file, '--key', pub]);
    expect([old.status, old.stdout.toString(), old.stderr.toString()]).toEqual([
      0,
      now.stdout.toString(),
      'sbx: note: verify --key FILE is deprecated, use --public-key FILE (--key names an invocation key everywhere else)\n',
    ]);
  });

  it("run's help says stdin is /dev/null unless --stdin", async () => {
    const help = (await d.sbx(['run', '--help'])).stdout.toString().replace(/\s+/g, ' ');
    expect(help).toContain(
      "--stdin stream this CLI's stdin into the session; without it the command's stdin is /dev/null (as docker run without -i): sbx run -- cat returns at once",
    );
  });

  it('a socket with nobody behind it is named, with what the errno means and sbx status; exit 125', async () => {
    const missing = join(d.dir, 'missing.sock');
    const r = await d.sbx(['ps', '--socket', missing]);
    expect([r.status, r.stderr.toString()]).toEqual([
      125,
      `sbx: cannot reach the supervisor at ${missing} (ENOENT: no socket there); is it running? sbx status checks (start it with npm start or the systemd unit; --socket or SBX_SOCKET name another)\n`,
    ]);
    // A socket file nobody listens on (a crashed supervisor's): ECONNREFUSED.
    const stale = join(d.dir, 'stale.sock');
    expect(spawnSync('python3', ['-c', `import socket; socket.socket(socket.AF_UNIX).bind(${JSON.stringify(stale)})`]).status).toBe(0);
    const refused = await d.sbx(['status', '--socket', stale]);
    expect([refused.status, refused.stderr.toString()]).toEqual([
      125,
      `sbx: cannot reach the supervisor at ${stale} (ECONNREFUSED: nothing listens there); is it running? sbx status checks (start it with npm start or the systemd unit; --socket or SBX_SOCKET name another)\n`,
    ]);
    // Something there that is no socket (connect(2) says ECONNREFUSED for it too): named, and
    // sbx run does not wait 60 s for it to answer.
    const file = join(d.dir, 'file.sock');
    writeFileSync(file, '');
    const run = await d.sbx(['run', '--socket', file, '--', 'true']);
    expect([run.status, run.stderr.toString()]).toEqual([
      125,
      `sbx: cannot reach the supervisor at ${file} (ENOTSOCK: a regular file is there, not a socket); --socket or SBX_SOCKET name the supervisor's socket (its log and sbx status show it)\n`,
    ]);
    const dir = await d.sbx(['ps', '--socket', d.dir]);
    expect([dir.status, dir.stderr.toString()]).toEqual([
      125,
      `sbx: cannot reach the supervisor at ${d.dir} (ENOTSOCK: a directory is there, not a socket); --socket or SBX_SOCKET name the supervisor's socket (its log and sbx status show it)\n`,
    ]);
  });
});

describe('a session retention removed', () => {
  it('kill and cancel of it exit 1 saying it ended and was removed; by an id prefix too; a KEY_CONFLICT on its key does not send to sbx receipt', async () => {
    const d = await new TestDaemon({ config: { logLevel: 'error', retention: { receiptMaxAgeMs: 1, intervalMs: 0 } } }).start();
    try {
      const c = await d.client();
      const { session_id: id } = await c.launch({ argv: ['true'], cwd: '/', invocation_key: 'gone' });
      await c.wait({ session_id: id });
      await new Promise((r) => setTimeout(r, 5));
      expect((await c.gc()).retired).toEqual([id]);
      const kill = await d.sbx(['kill', id]);
      expect([kill.status, kill.stdout.toString()]).toEqual([1, '']);
      expect(kill.stderr.toString()).toMatch(
        new RegExp(`^sbx: session ${id} was not signalled: it ended \\(exited\\) and was removed by the retention policy at \\S+; nothing of it runs\n$`),
      );
      // By a prefix of its id, as a live session is found: the same answer, naming the whole id.
      const prefix = id.slice(0, 10);
      const receipt = await d.sbx(['receipt', prefix]);
      expect([receipt.status, receipt.stderr.toString()]).toEqual([
        125,
        expect.stringMatching(
          new RegExp(
            `^sbx: SESSION_NOT_FOUND: session ${id} \\(by its prefix ${prefix}\\) was removed by the retention policy at \\S+ \\(it ended exited; receipt sha256:[0-9a-f]{64}\\); its key stays used\n$`,
          ),
        ),
      ]);
      const cancel = await d.sbx(['cancel', '--key', 'gone']);
      expect(cancel.status).toBe(1);
      expect(cancel.stderr.toString()).toMatch(
        /^sbx: the session of key "gone" was not cancelled: it ended \(exited\) and was removed by the retention policy at \S+; nothing of it runs\n$/,
      );
      const conflict = await d.sbx(['run', '--key', 'gone', '--', 'false']);
      expect(conflict.status).toBe(125);
      expect(conflict.stderr.toString()).toContain(`(session ${id} was removed by retention: its receipt is gone)`);
      expect(conflict.stderr.toString()).not.toContain('sbx receipt');
    } finally {
      await d.stop();
    }
  });
});

describe('every wait says why, once, as soon as it starts', () => {
  it('a refused admission (the session bound) is waited for with one line; --detach never waits on it', async () => {
    const d = await new TestDaemon({ config: { logLevel: 'error', session: { maxSessions: 1 } } }).start();
    try {
      const holder = (await d.sbx(['run', '--detach', '--', 'sleep', '60'])).stdout.toString().trim();
      const detached = await d.sbx(['run', '--detach', '--', 'true']);
      expect([detached.status, detached.stderr.toString(), detached.stdout.toString()]).toEqual([
        125,
        'sbx: LIMIT_EXCEEDED: 1 sessions are running, the limit is 1\n',
        '',
      ]);
      const run = background(d, ['run', '--', 'echo', 'hi']);
      const line = 'sbx: waiting: the supervisor is at its limit of 1 sessions running (retrying for up to 60 s)\n';
      await until(() => run.stderr() === line, 'the waiting line while the bound holds');
      expect((await d.sbx(['kill', holder])).status).toBe(0);
      expect(await run.exited).toBe(0);
      expect([run.stdout(), run.stderr()]).toEqual(['hi\n', line]);
    } finally {
      await d.stop();
    }
  });

  it('a supervisor that went away: run says it reconnects at once, then how the session ended (owner lost); wait says owner lost too', async () => {
    const d = await new TestDaemon({ config: { logLevel: 'error' } }).start();
    try {
      const { run, sessionId, line } = await runThenLoseSupervisor(d, ['--key', 'rc']);
      await d.start();
      const lost = `sbx: session ${sessionId}: owner lost (the supervisor that ran it stopped before it ended): its exit status is unknown, death evidence cgroup_empty (sbx receipt ${sessionId})\n`;
      expect(await run.exited).toBe(125);
      expect(run.stderr()).toBe(line + lost);
      const wait = await d.sbx(['wait', '--key', 'rc']);
      expect([wait.status, wait.stderr.toString()]).toEqual([125, lost]);
      expect(JSON.parse(wait.stdout.toString())).toMatchObject({ outcome: 'owner_lost', session_id: sessionId });
    } finally {
      await d.stop();
    }
  });
});

describe('a signal to sbx run while the supervisor is unreachable', () => {
  it('ends sbx at once (143), saying the SIGTERM was not sent on and the session goes on; not a 60 s wait for the reconnect', async () => {
    const d = await new TestDaemon({ config: { logLevel: 'error' } }).start();
    try {
      const { run, sessionId, line } = await runThenLoseSupervisor(d, []);
      run.child.kill('SIGTERM');
      expect(await run.exited).toBe(143);
      expect(run.stderr()).toBe(
        `${line}sbx: SIGTERM while the supervisor is unreachable: not sent on; session ${sessionId} goes on (sbx cancel ${sessionId} ends it, sbx wait ${sessionId} waits for it)\n`,
      );
      await d.start(); // reconciles the session (owner_lost) and ends its sleep
    } finally {
      await d.stop();
    }
  });
});

describe('sbx logs --follow across a supervisor restart', () => {
  it('says once, at once, that it reconnects (one stream, and --stream all); then ends with every byte', async () => {
    const d = await new TestDaemon({ config: { logLevel: 'error' } }).start();
    try {
      const c = await d.client();
      await c.launch({ argv: ['sh', '-c', 'echo a; echo b >&2; sleep 60'], cwd: '/', invocation_key: 'lf', grace_ms: 100 });
      const one = background(d, ['logs', '--key', 'lf', '--stream', 'stdout', '--follow']);
      const all = background(d, ['logs', '--key', 'lf', '--stream', 'all', '--follow']);
      await until(() => one.stdout() === 'a\n' && all.stdout().length === 4, 'both followers to have the bytes');
      await d.kill9();
      const reconnectLine = reconnectLineOf(d);
      await until(() => reconnectLine.test(one.stderr()) && reconnectLine.test(all.stderr()), 'the reconnecting line from each before the supervisor is back');
      const lines = [one.stderr(), all.stderr()];
      await d.start();
      expect(await one.exited).toBe(0);
      expect(await all.exited).toBe(0);
      expect([one.stdout(), one.stderr()]).toEqual(['a\n', lines[0]]); // the line once, nothing after it
      expect([[...all.stdout()].sort().join(''), all.stderr()]).toEqual(['\n\nab', lines[1]]);
    } finally {
      await d.stop();
    }
  });
});

describe('progress on a terminal only', () => {
  const rig = new WorkspaceRig();
  afterAll(() => rig.cleanup());

  it('checkpoint says what it waits for, restore and verify count objects and bytes; without a terminal stderr is as before', async () => {
    const { d, paths } = await rig.daemon((dir) => {
      const ws = join(dir, 'ws');
      mkdirSync(ws);
      for (const n of ['a', 'b', 'c']) writeFileSync(join(ws, n), `${n}\n`.repeat(1000));
      return [ws];
    });
    const ws = paths[0];
    const shown = sbxOnTerminal(d.socketPath, ['checkpoint', '--workspace', ws], 200);
    expect(shown.status).toBe(0);
    expect(shown.output).toContain(`\r\x1b[Ksbx: checkpoint ${ws}: waiting for the supervisor to scan, store and read back every object (0 s)`);
    const piped = await d.sbx(['checkpoint', '--workspace', ws]);
    expect(piped.status).toBe(0);
    expect(piped.stderr.toString()).toMatch(/^sbx: published to [^\n]*\n$/);
    const id = piped.stdout.toString().trim();
    const restored = sbxOnTerminal(d.socketPath, ['restore', id, join(d.dir, 'r1'), '--state-dir', d.stateDir], 200);
    expect(restored.status).toBe(0);
    expect(restored.output).toContain(`\r\x1b[Ksbx: restore ${id.slice(0, 16)}: 0/3 objects, 0.0 MiB of 0.0 MiB (0%), `);
    expect(restored.output).toContain(`\r\x1b[Ksbx: restore ${id.slice(0, 16)}: 3/3 objects, 0.0 MiB of 0.0 MiB (100%), `);
    const quiet = await d.sbx(['restore', id, join(d.dir, 'r2'), '--state-dir', d.stateDir]);
    expect([quiet.status, quiet.stderr.toString()]).toEqual([0, '']);
    expect(quiet.stdout.toString()).toMatch(
      /^restored checkpoint [0-9a-f]{64} into \S+: 3 entries, 3 files, 6000 bytes in \d+ ms\nOK: the restored tree is identical to the manifest\n$/,
    );
    const verified = sbxOnTerminal(d.socketPath, ['verify', id, '--state-dir', d.stateDir], 200);
    expect(verified.status).toBe(0);
    expect(verified.output).toContain(`sbx: verify ${id.slice(0, 16)}: 4/4 objects`); // the three files' and the root tree
    const verifiedQuiet = await d.sbx(['verify', id, '--state-dir', d.stateDir]);
    expect([verifiedQuiet.status, verifiedQuiet.stderr.toString()]).toEqual([0, '']);
  });

  it('verify of a receipt with the state dir counts the chunk files and bytes it re-hashes on a terminal; nothing extra piped', async () => {
    const d = await new TestDaemon({ config: { logLevel: 'error', drain: { chunkBytes: 65536 } } }).start();
    try {
      const c = await d.client();
      const { session_id } = await c.launch({ argv: ['head', '-c', String(5 * 65536 + 100), '/dev/zero'], cwd: '/' });
      await c.wait({ session_id });
      const file = join(d.dir, 'r.json');
      writeFileSync(file, (await d.sbx(['receipt', session_id])).stdout);
      const shown = sbxOnTerminal(d.socketPath, ['verify', file, '--state-dir', d.stateDir], 200);
      expect(shown.status).toBe(0);
      expect(shown.output).toContain(`\r\x1b[Ksbx: verify ${session_id}: 0/6 objects, 0.0 MiB of 0.3 MiB (0%), `);
      expect(shown.output).toContain(`\r\x1b[Ksbx: verify ${session_id}: 6/6 objects, 0.3 MiB of 0.3 MiB (100%), `);
      const piped = await d.sbx(['verify', file, '--state-dir', d.stateDir]);
      expect([piped.status, piped.stderr.toString()]).toEqual([0, '']);
      expect(piped.stdout.toString()).toMatch(/^OK: /);
    } finally {
      await d.stop();
    }
  });

  it('on a terminal of 40 columns every drawn line is cut to 39 and erased before the next: no wrapped rows are left behind', async () => {
    const { d, paths } = await rig.daemon((dir) => {
      const ws = join(dir, 'ws');
      mkdirSync(ws);
      for (const n of ['a', 'b', 'c']) writeFileSync(join(ws, n), `${n}\n`.repeat(1000));
      return [ws];
    });
    const id = (await d.sbx(['checkpoint', '--workspace', paths[0]])).stdout.toString().trim();
    for (const args of [
      ['restore', id, join(d.dir, 'r40'), '--state-dir', d.stateDir],
      ['verify', id, '--state-dir', d.stateDir],
    ]) {
      const r = sbxOnTerminal(d.socketPath, args, 40);
      expect(r.status).toBe(0);
      // Replayed: before the first draw nothing; each drawn line ends where the next \r ESC[K erases it.
      const pieces = r.output.split('\r\x1b[K');
      expect(pieces.length).toBeGreaterThan(2);
      expect(pieces[0]).toBe('');
      for (const drawn of pieces.slice(1, -1)) {
        expect(drawn).not.toMatch(/[\r\n]/);
        expect(drawn.startsWith('sbx: ')).toBe(true);
        expect(Array.from(drawn).length).toBeLessThanOrEqual(39);
      }
      // After the final clear only the result lines: no fragment of a progress line.
      expect(pieces.at(-1)).not.toContain('sbx: ');
      expect(pieces.at(-1)).toMatch(/^(restored checkpoint|OK)/);
    }
  });
});

describe('sbx completion', () => {
  /** What bash's completion function offers for the words (the last is the one being completed). */
  function complete(...words: string[]): string[] {
    const script = `source <(${sq(SBX_BIN)} completion bash) && COMP_WORDS=(${words.map(sq).join(' ')}) && COMP_CWORD=${words.length - 1} && _sbx && printf '%s\\n' "\${COMPREPLY[@]}"`;
    const r = spawnSync('bash', ['-c', script], { encoding: 'utf8' });
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    return r.stdout.split('\n').filter((l) => l !== '');
  }

  it('the bash script, sourced, completes subcommand names, their options and choices', () => {
    expect(complete('sbx', 'ps', '--no-')).toEqual(['--no-trunc']);
    expect(complete('sbx', 'c')).toEqual(['cancel', 'changes', 'checkpoint', 'checkpoints', 'close', 'completion']);
    expect(complete('sbx', '')).toEqual([
      'run',
      'attach',
      'cancel',
      'kill',
      'verify',
      'write',
      'resize',
      'logs',
      'resolve',
      'wait',
      'receipt',
      'changes',
      'ps',
      'status',
      'checkpoint',
      'restore',
      'checkpoints',
      'diff',
      'gc',
      'seal',
      'close',
      'bridge',
      'completion',
      'help',
    ]);
    expect(complete('sbx', 'attach', '--')).toEqual([
      '--socket',
      '--url',
      '--token-file',
      '--json',
      '--key',
      '--from-start',
      '--cursor',
      '--stderr-cursor',
      '--no-stdin',
      '--close-stdin',
      '--help',
    ]);
    // A global option's value is not taken for the subcommand.
    expect(complete('sbx', '--socket', '/x.sock', 'p')).toEqual(['ps']);
    expect(complete('sbx', 'run', '--linger', '')).toEqual(['handoff', 'kill', 'wait']);
    expect(complete('sbx', 'verify', '--pub')).toEqual(['--public-key']);
    expect(complete('sbx', 'completion', '')).toEqual(['bash', 'zsh']);
    // --opt=value: bash splits the word at "=".
    expect(complete('sbx', 'logs', '--stream', '=', '')).toEqual(['stdout', 'stderr', 'pty', 'all']);
    expect(complete('sbx', 'logs', '--stream', '=', 'st')).toEqual(['stdout', 'stderr']);
    expect(complete('sbx', '--socket', '=', '/x.sock', 'ps', '--no-')).toEqual(['--no-trunc']);
    // After --: the command's name (each once), then its own words are left to bash's file
    // completion (-o default), which quotes names with spaces as it always does.
    expect(complete('sbx', 'run', '--', 'ech').filter((w) => w === 'echo')).toEqual(['echo']);
    expect(complete('sbx', 'run', '--', 'cat', '/etc/passw')).toEqual([]);
    expect(complete('sbx', 'verify', 'my')).toEqual([]);
    expect(spawnSync('bash', ['-c', `source <(${sq(SBX_BIN)} completion bash) && complete -p sbx`], { encoding: 'utf8' }).stdout).toBe(
      'complete -o default -F _sbx sbx\n',
    );
  });

  it('zsh gets a #compdef script from the same tree; another shell is INVALID_ARGUMENT, 125', () => {
    const zsh = spawnSync(SBX_BIN, ['completion', 'zsh'], { encoding: 'utf8' });
    expect(zsh.status).toBe(0);
    expect(zsh.stdout.startsWith('#compdef sbx\n')).toBe(true);
    expect(zsh.stdout).toContain("'--no-trunc[do not cut any column]'");
    expect(zsh.stdout).toContain("\n    'completion:print a shell completion script'\n");
    const fish = spawnSync(SBX_BIN, ['completion', 'fish'], { encoding: 'utf8' });
    expect([fish.status, fish.stdout, fish.stderr]).toEqual([125, '', 'sbx: INVALID_ARGUMENT: completion: no script for "fish" (bash or zsh)\n']);
  });

  it('knows the remote options --url and --token-file (global and per command): their values are not taken for the subcommand', () => {
    expect(complete('sbx', '--u')).toEqual(['--url']);
    expect(complete('sbx', '--to')).toEqual(['--token-file']);
    expect(complete('sbx', 'ps', '--to')).toEqual(['--token-file']);
    expect(complete('sbx', '--url', 'ws://h:1', '--token-file', '/t', 'p')).toEqual(['ps']);
    expect(complete('sbx', 'logs', '--url', 'ws://h:1', '--st')).toEqual(['--stream']);
    const zsh = spawnSync(SBX_BIN, ['completion', 'zsh'], { encoding: 'utf8' }).stdout;
    expect(zsh).toContain("'--token-file[its bearer token]:path:_files'");
    expect(zsh).toContain("'--url[the remote listener of a supervisor, ws\\://HOST\\:PORT or wss\\://HOST\\:PORT]:value:'");
  });

  it('zsh, on a terminal (zpty), completes `sbx c<Tab>` to the subcommands with their descriptions, no _describe errors', (ctx) => {
    if (spawnSync('zsh', ['-fc', 'true']).error) return ctx.skip(); // zsh is not installed here (.ci/run installs it)
    const dir = mkdtempSync(join(tmpdir(), 'sbx-zsh-'));
    try {
      writeFileSync(join(dir, '_sbx'), spawnSync(SBX_BIN, ['completion', 'zsh'], { encoding: 'utf8' }).stdout);
      // An interactive zsh on a pty: compinit with the script on $fpath, then "sbx c" and a Tab;
      // what it draws is read back until the listing's last subcommand has come (compinit alone
      // can take over a second on a loaded machine; 20 s at most), then until a second of quiet.
      const driver = [
        'zmodload zsh/zpty',
        "zpty -b z 'zsh -f -i'",
        `zpty -w z 'PS1="> "; fpath=(${dir} $fpath); autoload -Uz compinit; compinit -u -d ${dir}/.zcompdump; sbx() { :; }'`,
        "zpty -n -w z $'sbx c\\t'",
        'all=""; quiet=0; deadline=$(( SECONDS + 20 ))',
        'while (( SECONDS < deadline )) && [[ $all != *"completion "* ]]; do if zpty -r -t z chunk; then all+=$chunk; else sleep 0.1; fi; done',
        'while (( quiet < 10 )); do if zpty -r -t z chunk; then all+=$chunk; quiet=0; else sleep 0.1; (( quiet++ )); fi; done',
        'print -r -- "$all"',
        'zpty -d z',
      ].join('\n');
      const r = spawnSync('zsh', ['-fc', driver], { encoding: 'utf8', timeout: 30_000 });
      const shown = r.stdout.replace(/\x1b\[[0-9;?]*[a-zA-Z]/g, '');
      expect(shown).not.toMatch(/bad option|not enough arguments|no tags registered/);
      for (const name of ['cancel', 'changes', 'checkpoint', 'checkpoints', 'close', 'completion']) expect(shown).toMatch(new RegExp(`\\b${name} +-- `));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
