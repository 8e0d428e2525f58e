// docker's CLI conventions in sbx (issue 31), through the sbx bin against one real supervisor:
// short flags (run -d -e -w -u -i -t, ps -a -q, logs -f -t -n) and their completion; session
// ids by unique prefix, resolved by the supervisor for every verb; ps newest first, --task and
// --filter; --since in local time without a zone (TZ set in the child's environment).
import { spawnSync } from 'node:child_process';
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

