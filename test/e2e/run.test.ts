// sbx run end to end against a real supervisor: exact bytes, exit statuses, real pipes,
// the leader's fds, cursors and the receipt's digests.
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { chmodSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Receipt } from '../../ipc/protocol.js';
import { SBX, SBX_BIN, type SbxResult, sha256, TestDaemon, until } from '../helpers/daemon.js';

let daemon: TestDaemon;
beforeAll(async () => {
  daemon = await new TestDaemon().start();
});
afterAll(async () => {
  const exit = await daemon.stop();
  expect(exit).toEqual({ code: 0, signal: null });
});

async function runWithReceipt(argv: string[], extra: string[] = []) {
  const receiptPath = join(daemon.dir, `receipt-${Math.random().toString(16).slice(2)}.json`);
  const r = await daemon.sbx(['run', '--receipt', receiptPath, ...extra, '--', ...argv]);
  const receipt = JSON.parse(readFileSync(receiptPath, 'utf8')) as Receipt;
  return { ...r, receipt };
}

describe('sbx run', () => {
  it('streams stdout and stderr byte-exact and exits 0', async () => {
    const { status, stdout, stderr, receipt } = await runWithReceipt(['sh', '-c', 'printf "hello\\n"; printf "warn" >&2']);
    expect(status).toBe(0);
    expect(stdout.toString()).toBe('hello\n');
    expect(stderr.toString()).toBe('warn');
    expect(receipt.outcome).toBe('exited');
    expect(receipt.exit).toEqual({ code: 0, signal: null });
    expect(receipt.output.stdout).toMatchObject({ final_cursor: 6, sha256: sha256('hello\n'), complete: true, drain_end: 'eof', dropped_bytes: 0 });
    expect(receipt.output.stderr).toMatchObject({ final_cursor: 4, sha256: sha256('warn'), complete: true });
    expect(receipt.death.evidence).toBe('cgroup_empty');
    expect(receipt.supervisor.mode).toBe('cgroup');
    expect(receipt.supervisor.generation).toBe(1);
    expect(receipt.supervisor.boot_id).toMatch(/^[0-9a-f-]{36}$/);
    expect(receipt.command_digest).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(Date.parse(receipt.leader_exited_at!)).toBeLessThanOrEqual(Date.parse(receipt.ended_at));
  });

  it('gives commands real pipes: /dev/stdout and tee /dev/stderr work as in a shell', async () => {
    const r = await daemon.sbx(['run', '--', 'sh', '-c', 'echo out > /dev/stdout; echo err | tee /dev/stderr >/dev/null']);
    expect(r.stderr.toString()).toBe('err\n');
    expect(r.stdout.toString()).toBe('out\n');
    expect(r.status).toBe(0);
  });

  it('exits with the command status: exit 3 → 3, SIGKILL → 137', async () => {
    expect((await daemon.sbx(['run', '--', 'sh', '-c', 'exit 3'])).status).toBe(3);
    const killed = await runWithReceipt(['sh', '-c', 'kill -9 $$']);
    expect(killed.status).toBe(137);
    expect(killed.receipt.outcome).toBe('signaled');
    expect(killed.receipt.exit).toEqual({ code: null, signal: 'SIGKILL' });
  });

  it('reports not found as 127 and not executable as 126 from the exec shim', async () => {
    const missing = await runWithReceipt(['/nonexistent/sbx-no-such-command']);
    expect(missing.status).toBe(127);
    expect(missing.receipt.outcome).toBe('spawn_failed');
    expect(missing.receipt.spawn_error).toEqual({ stage: 'exec', errno: 2, code: 'ENOENT' });
    const script = join(daemon.dir, 'not-executable.sh');
    writeFileSync(script, '#!/bin/sh\necho never\n');
    chmodSync(script, 0o644);
    const denied = await runWithReceipt([script]);
    expect(denied.status).toBe(126);
    expect(denied.stdout.length).toBe(0);
    expect(denied.receipt.outcome).toBe('spawn_failed');
    expect(denied.receipt.spawn_error?.code).toBe('EACCES');
  });

  it('resets SIGPIPE: yes | head ends quietly with exit 0', async () => {
    const r = await daemon.sbx(['run', '--', 'sh', '-c', 'yes | head -c 1000000']);
    expect(r.status).toBe(0);
    expect(r.stderr.length).toBe(0);
    expect(r.stdout.length).toBe(1_000_000);
    expect(sha256(r.stdout)).toBe(sha256(Buffer.from('y\n'.repeat(500_000))));
  });

  it('leaves the leader only fds 0-2, stdin /dev/null', async () => {
    const r = await daemon.sbx(['run', '--', 'sh', '-c', 'ls /proc/$$/fd; readlink /proc/$$/fd/0; cat; echo "cat-done"']);
    expect(r.stdout.toString()).toBe('0\n1\n2\n/dev/null\ncat-done\n');
    expect(r.status).toBe(0);
  });

  it('starts in the CLI cwd unless --cwd, with a clean environment plus --env', async () => {
    const r = await daemon.sbx(['run', '--env', 'FOO=bar baz', '--', 'sh', '-c', 'pwd; echo "$FOO"; echo "${SBX_SOCKET:-unset}"; echo "$PATH"']);
    expect(r.stdout.toString().split('\n').slice(0, 3)).toEqual([daemon.dir, 'bar baz', 'unset']);
    const other = await daemon.sbx(['run', '--cwd', '/tmp', '--', 'pwd']);
    expect(other.stdout.toString()).toBe('/tmp\n');
    const bad = await daemon.sbx(['run', '--cwd', '/nonexistent-dir', '--', 'pwd']);
    expect(bad.status).toBe(125);
    expect(bad.stderr.toString()).toContain('INVALID_ARGUMENT');
  });

  it('--detach --json prints the session id; logs, wait and receipt agree byte for byte', async () => {
    const body = Array.from({ length: 2000 }, (_, i) => `line ${i}\n`).join('');
    const detached = await daemon.sbx(['run', '--detach', '--json', '--', 'sh', '-c', 'i=0; while [ $i -lt 2000 ]; do echo "line $i"; i=$((i+1)); done']);
    expect(detached.status).toBe(0);
    const { session_id, existing } = JSON.parse(detached.stdout.toString()) as { session_id: string; existing: boolean };
    expect(existing).toBe(false);
    const waited = await daemon.sbx(['wait', session_id]);
    expect(waited.status).toBe(0);
    const receipt = JSON.parse(waited.stdout.toString()) as Receipt;
    expect(receipt.output.stdout!.final_cursor).toBe(Buffer.byteLength(body));
    expect(receipt.output.stdout!.sha256).toBe(sha256(body));
    const logs = await daemon.sbx(['logs', session_id]);
    expect(logs.stdout.toString()).toBe(body);
    for (const from of [0, 1, 4095, 12345, Buffer.byteLength(body)]) {
      const suffix = await daemon.sbx(['logs', session_id, '--from', String(from)]);
      expect(suffix.status).toBe(0);
      expect(suffix.stdout.equals(Buffer.from(body).subarray(from))).toBe(true);
    }
    const past = await daemon.sbx(['logs', session_id, '--from', String(Buffer.byteLength(body) + 1)]);
    expect(past.status).toBe(125);
    expect(past.stderr.toString()).toContain('CURSOR_OUT_OF_RANGE');
    const again = await daemon.sbx(['receipt', session_id]);
    expect(JSON.parse(again.stdout.toString())).toEqual(receipt);
    const ps = await daemon.sbx(['ps', '--all', '--json']);
    const row = (JSON.parse(ps.stdout.toString()) as { session_id: string; state: string; outcome: string }[]).find((s) => s.session_id === session_id);
    expect(row).toMatchObject({ state: 'ended', outcome: 'exited' });
  });

  it('selects sessions by --key and refuses a key reused for another command', async () => {
    const first = await daemon.sbx(['run', '--key', 'build-42', '--detach', '--json', '--', 'echo', 'keyed']);
    const { session_id } = JSON.parse(first.stdout.toString()) as { session_id: string };
    const retry = await daemon.sbx(['run', '--key', 'build-42', '--detach', '--json', '--', 'echo', 'keyed']);
    expect(JSON.parse(retry.stdout.toString())).toEqual({ session_id, existing: true, state: expect.stringMatching(/^(running|leader_exited|ended)$/) });
    const waited = await daemon.sbx(['wait', '--key', 'build-42']);
    expect((JSON.parse(waited.stdout.toString()) as Receipt).session_id).toBe(session_id);
    expect((await daemon.sbx(['logs', '--key', 'build-42'])).stdout.toString()).toBe('keyed\n');
    const conflict = await daemon.sbx(['run', '--key', 'build-42', '--', 'echo', 'other']);
    expect(conflict.status).toBe(125);
    expect(conflict.stderr.toString()).toContain('KEY_CONFLICT');
  });

  it('answers a missing session with SESSION_NOT_FOUND and exit 125', async () => {
    const r = await daemon.sbx(['wait', 's-nope']);
    expect(r.status).toBe(125);
    expect(r.stderr.toString()).toContain('SESSION_NOT_FOUND');
  });

  it('exits with the status after a reader that stalled until the session ended', async () => {
    const { spawn } = await import('node:child_process');
    const { SBX, until } = await import('../helpers/daemon.js');
    const key = `stalled-${Date.now()}`;
    const child = spawn(process.execPath, [SBX, 'run', '--key', key, '--', 'sh', '-c', 'head -c 20000000 /dev/zero; echo err >&2; exit 3'], {
      env: { ...process.env, SBX_SOCKET: daemon.socketPath },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
    child.stdout.pause();
    // Nobody reads sbx's stdout until the session has ended and its receipt is durable.
    await until(async () => (await daemon.sbx(['receipt', '--key', key])).status === 0, 'the session to end');
    let bytes = 0;
    child.stdout.on('data', (d: Buffer) => (bytes += d.length));
    child.stdout.resume();
    expect(await exited).toBe(3);
    expect(bytes).toBe(20_000_000);
  });

  it('ends quietly when its reader goes away (sbx status | head -1)', async () => {
    const { spawnSync } = await import('node:child_process');
    const { SBX } = await import('../helpers/daemon.js');
    const r = spawnSync('sh', ['-c', `"${process.execPath}" "${SBX}" status | head -1`], {
      env: { ...process.env, SBX_SOCKET: daemon.socketPath },
      encoding: 'utf8',
    });
    expect(r.stdout).toMatch(/^version /);
    expect(r.stderr).toBe('');
  });

  it("sbx run's reader going away (sbx run -- ... | head -1): one line says the session goes on", async () => {
    const key = 'K-reader-gone';
    const r = spawnSync('sh', ['-c', `${SBX_BIN} run --key ${key} -- sh -c 'while :; do echo y; sleep 0.01; done' | head -1`], {
      env: { ...process.env, SBX_SOCKET: daemon.socketPath },
      encoding: 'utf8',
    });
    const client = await daemon.client();
    const row = (await client.ps(true)).sessions.find((s) => s.invocation_key === key)!;
    expect(r.stdout).toBe('y\n');
    expect(r.stderr).toBe(`sbx: stdout was closed; session ${row.session_id} goes on (sbx cancel ${row.session_id} ends it)\n`);
    expect(row.state).toBe('running'); // --on-disconnect continue, the default
    expect((await daemon.sbx(['cancel', row.session_id])).status).toBe(0);
    await client.wait({ session_id: row.session_id });
  });

  it('says why a command could not start', async () => {
    const r = await daemon.sbx(['run', '--', 'sbx-no-such-command']);
    expect(r.status).toBe(127);
    expect(r.stderr.toString()).toBe('sbx: sbx-no-such-command: not found (exec failed: ENOENT)\n');
  });

  it('resolves a relative --cwd against the CLI working directory', async () => {
    const r = await daemon.sbx(['run', '--cwd', '.', '--', 'pwd']);
    expect(r.stdout.toString()).toBe(`${daemon.dir}\n`);
  });

  it('a --cwd that does not exist, and one that is a file, are refused naming which (125)', async () => {
    const missing = await daemon.sbx(['run', '--cwd', '/nonexistent-sbx-dir', '--', 'true']);
    expect(missing.status).toBe(125);
    expect(missing.stderr.toString()).toBe('sbx: INVALID_ARGUMENT: cwd does not exist: /nonexistent-sbx-dir\n');
    const file = await daemon.sbx(['run', '--cwd', '/etc/passwd', '--', 'true']);
    expect(file.status).toBe(125);
    expect(file.stderr.toString()).toBe('sbx: INVALID_ARGUMENT: cwd is not a directory: /etc/passwd\n');
  });

  it('--pty from a terminal that reports 0x0 (some consoles and CI ptys) gets 80x24, not a refusal', () => {
    // script(1) gives sbx a terminal; stty sets its size to 0x0 first.
    const r = spawnSync('script', ['-qec', `stty cols 0 rows 0; ${SBX_BIN} run --pty -- stty size`, '/dev/null'], {
      env: { ...process.env, SBX_SOCKET: daemon.socketPath },
      encoding: 'utf8',
    });
    expect(r.stdout.replace(/\r/g, '')).toBe('24 80\n');
    expect(r.status).toBe(0);
  });

  it('status reports version, generation, mode and sessions', async () => {
    const human = await daemon.sbx(['status']);
    expect(human.stdout.toString()).toMatch(/^version +\d+\.\d+\.\d+ \(protocol 1\)\n/);
    expect(human.stdout.toString()).toMatch(/\nmode +cgroup \(/);
    const r = await daemon.sbx(['status', '--json']);
    const status = JSON.parse(r.stdout.toString());
    expect(status).toMatchObject({ protocol: 1, generation: 1, mode: 'cgroup', pid: daemon.pid, socket: daemon.socketPath });
  });
});

/** sbx with an argv too large for sbx's own execve: node reads it from a file and sets process.argv before loading sbx. */
async function sbxArgvFromFile(args: string[]): Promise<SbxResult> {
  const file = join(daemon.dir, `argv-${Math.random().toString(16).slice(2)}.json`);
  writeFileSync(file, JSON.stringify(args));
  const script = `import { readFileSync } from 'node:fs';
    process.argv = [process.execPath, ${JSON.stringify(SBX)}, ...JSON.parse(readFileSync(process.argv[1], 'utf8'))];
    await import(${JSON.stringify(pathToFileURL(SBX).href)});`;
  const child = spawn(process.execPath, ['--input-type=module', '-e', script, file], {
    cwd: daemon.dir,
    env: { ...process.env, SBX_SOCKET: daemon.socketPath },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  child.stdout.on('data', (d: Buffer) => out.push(d));
  child.stderr.on('data', (d: Buffer) => err.push(d));
  const [status, signal] = (await once(child, 'close')) as [number | null, NodeJS.Signals | null];
  return { status, signal, stdout: Buffer.concat(out), stderr: Buffer.concat(err) };
}

describe('argv at the kernel limit (execve(2): ARG_MAX, MAX_ARG_STRLEN)', () => {
  it('runs 100,000 arguments: no count cap of its own', async () => {
    const argv = ['sh', '-c', 'echo $#', 'sh', ...Array.from({ length: 99_996 }, () => 'x')];
    expect(argv.length).toBe(100_000);
    const r = await daemon.sbx(['run', '--', ...argv]);
    expect(r.stderr.toString()).toBe('');
    expect(r.stdout.toString()).toBe('99996\n');
    expect(r.status).toBe(0);
  });

  it('takes 200,000 arguments through sbx itself (its option parser never sees them)', async () => {
    const argv = ['sh', '-c', 'echo $#', 'sh', ...Array.from({ length: 199_996 }, () => 'x')];
    const r = await daemon.sbx(['run', '--', ...argv]);
    expect(r.stderr.toString()).toBe('');
    expect(r.stdout.toString()).toBe('199996\n');
    expect(r.status).toBe(0);
  });

  it("refuses an argument that is not valid UTF-8 (the command's, --env, --cwd, --key) rather than send other bytes", async () => {
    const before = JSON.parse((await daemon.sbx(['ps', '--all', '--json'])).stdout.toString()).length;
    for (const args of ['run -- /bin/echo "$X"', 'run /bin/echo "$X"', 'run --env "Y=$X" -- true', 'run --cwd "/tmp/$X" -- true', 'run --key "k$X" -- true']) {
      const r = spawnSync('sh', ['-c', `X="$(printf 'a\\377b')"; exec "$0" "$1" ${args}`, process.execPath, SBX], {
        env: { ...process.env, SBX_SOCKET: daemon.socketPath },
      });
      expect(r.status, args).toBe(125);
      expect(r.stderr.toString(), args).toMatch(/^sbx: INVALID_ARGUMENT: argument \d+ \(".*"\) is not valid UTF-8/);
      expect(r.stdout.toString()).toBe('');
    }
    expect(JSON.parse((await daemon.sbx(['ps', '--all', '--json'])).stdout.toString()).length).toBe(before);
  });

  it('runs an argv of 1.5 MiB, more than the argv pipe holds at once, byte for byte', async () => {
    const args = Array.from({ length: 384 }, (_, i) => String(i % 10).repeat(4095));
    const r = await sbxArgvFromFile(['run', '--', 'sh', '-c', 'echo $#; printf %s "$@" | sha256sum', 'sh', ...args]);
    expect(r.stderr.toString()).toBe('');
    expect(r.stdout.toString()).toBe(`384\n${sha256(args.join(''))}  -\n`);
    expect(r.status).toBe(0);
  });

  it("hands the argv to a pty session's shim too (it stays as the session leader)", async () => {
    const r = await daemon.sbx(['run', '--pty', '--', 'sh', '-c', 'printf "[%s]" "$#" "$@"', 'sh', 'a  b', '', 'c']);
    expect(r.stdout.toString()).toBe('[3][a  b][][c]');
    expect(r.status).toBe(0);
  });

  it('reports an argv over ARG_MAX as E2BIG at exec, 126, one line, no stack; the supervisor serves on', async () => {
    const argMax = Number(execFileSync('getconf', ['ARG_MAX']).toString());
    // 768 strings of 4 KiB: 3 MiB, over ARG_MAX (2 MiB here) and well under the 16 MiB frame.
    const argv = ['true', ...Array.from({ length: 768 }, () => 'x'.repeat(4095))];
    expect(argv.reduce((n, a) => n + a.length + 1, 0)).toBeGreaterThan(argMax);
    const logFrom = daemon.log().length;
    const receiptPath = join(daemon.dir, 'receipt-e2big.json');
    const r = await sbxArgvFromFile(['run', '--receipt', receiptPath, '--', ...argv]);
    expect(r.stderr.toString()).toBe('sbx: true: argument list too long (exec failed: E2BIG)\n');
    expect(r.stdout.length).toBe(0);
    expect(r.status).toBe(126);
    const receipt = JSON.parse(readFileSync(receiptPath, 'utf8')) as Receipt;
    expect(receipt.outcome).toBe('spawn_failed');
    expect(receipt.spawn_error).toEqual({ stage: 'exec', errno: 7, code: 'E2BIG' });
    expect(receipt.exit).toEqual({ code: 126, signal: null });
    expect(receipt.argv).toEqual(argv);
    // The log is written asynchronously: wait for the session's last line.
    await until(() => daemon.log().slice(logFrom).includes(`"session_id":"${receipt.session_id}","outcome"`), 'the session ended line');
    const log = daemon.log().slice(logFrom);
    expect(log).not.toMatch(/ {4}at /);
    expect(log.split('\n').filter((l) => l.includes(receipt.session_id) && /"level":(40|50)/.test(l))).toEqual([]);
    expect(log.split('\n').filter((l) => l.includes(receipt.session_id) && l.includes('"session ended"')).length).toBe(1);
    const after = await daemon.sbx(['run', '--', 'echo', 'still serving']);
    expect(after.stdout.toString()).toBe('still serving\n');
    expect(after.status).toBe(0);
  });

  it('reports one argument over MAX_ARG_STRLEN (200 KiB) as E2BIG at exec, 126', async () => {
    const receiptPath = join(daemon.dir, 'receipt-strlen.json');
    const r = await sbxArgvFromFile(['run', '--receipt', receiptPath, '--', 'sh', '-c', 'echo never', 'sh', 'y'.repeat(200 * 1024)]);
    expect(r.stderr.toString()).toBe('sbx: sh: argument list too long (exec failed: E2BIG)\n');
    expect(r.stdout.length).toBe(0);
    expect(r.status).toBe(126);
    const receipt = JSON.parse(readFileSync(receiptPath, 'utf8')) as Receipt;
    expect(receipt).toMatchObject({ outcome: 'spawn_failed', spawn_error: { stage: 'exec', errno: 7, code: 'E2BIG' }, exit: { code: 126, signal: null } });
  });

  it("reports an environment too large for the shim's own exec the same way: E2BIG at exec, 126, no stack", async () => {
    const logFrom = daemon.log().length;
    const client = await daemon.client();
    // 24 values of 100 KiB: 2.4 MiB of environment, over ARG_MAX; each entry is valid.
    const env = Object.fromEntries(Array.from({ length: 24 }, (_, i) => [`BIG_${i}`, 'z'.repeat(100 * 1024)]));
    const launched = await client.launch({ argv: ['echo', 'never'], cwd: '/', env });
    const receipt = await client.wait({ session_id: launched.session_id });
    expect(receipt).toMatchObject({ outcome: 'spawn_failed', spawn_error: { stage: 'exec', code: 'E2BIG' }, exit: { code: 126, signal: null } });
    expect(receipt.output.stdout).toMatchObject({ final_cursor: 0, complete: true });
    const log = daemon.log().slice(logFrom);
    expect(log).not.toMatch(/ {4}at /);
    expect(log.split('\n').filter((l) => l.includes(launched.session_id) && /"level":50/.test(l)).length).toBeLessThanOrEqual(1);
    const after = await client.launch({ argv: ['echo', 'ok'], cwd: '/' });
    expect((await client.wait({ session_id: after.session_id })).exit).toEqual({ code: 0, signal: null });
  });
});
