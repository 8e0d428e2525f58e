// Issue 31's CLI conventions, against a real supervisor through the sbx bin: sbx attach
// (output from a cursor, by id prefix or key, stdin beside other writers, exit status,
// Ctrl-C detaching), sbx logs showing both streams by default, the first Ctrl-C of sbx run on
// a command that ignores SIGINT, sbx status's uptime, and close --task naming what it cancelled.
import { spawn } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { SupervisorClient } from '../../ipc/client.js';
import type { StatusResult, TaskReceipt } from '../../ipc/protocol.js';
import { SBX_BIN, TestDaemon, until } from '../helpers/daemon.js';

let daemon: TestDaemon;
let client: SupervisorClient;

beforeAll(async () => {
  daemon = await new TestDaemon().start();
  client = await daemon.client();
});
afterAll(async () => {
  const exit = await daemon.stop();
  expect(exit).toEqual({ code: 0, signal: null });
});

const machineUptimeS = () => Number(readFileSync('/proc/uptime', 'utf8').split(' ')[0]);

describe('sbx status', () => {
  it("reports the supervisor's uptime, not the machine's: smaller than /proc/uptime, and growing", async () => {
    const status = async () => JSON.parse((await daemon.sbx(['status', '--json'])).stdout.toString()) as StatusResult;
    const first = await status();
    expect(first.uptime_s).toBeGreaterThan(0);
    // A supervisor started by this test file: far younger than the machine.
    expect(first.uptime_s).toBeLessThan(machineUptimeS() - 1);
    expect(first.machine.uptime_s).toBeGreaterThan(first.uptime_s);
    expect(Date.parse(first.started_at)).toBeLessThanOrEqual(Date.now());
    await until(async () => (await status()).uptime_s > first.uptime_s, 'uptime_s to grow');
    const text = (await daemon.sbx(['status'])).stdout.toString();
    expect(text).toMatch(/^uptime {5}\d+ s \(since \d{4}-\d\d-\d\dT[^;]+; machine up [\d.]+ (s|min|h|days)\)$/m);
  });
});

describe('sbx logs ID on its own', () => {
  it('shows stdout on fd 1 and stderr on fd 2, byte-exact (as docker logs); --stream still selects one', async () => {
    const r = await daemon.sbx(['run', '--', 'sh', '-c', 'printf "out \\001\\377\\n"; printf "err one\\n" >&2; printf "out two"; printf "err two" >&2']);
    expect(r.status).toBe(0);
    const id = JSON.parse((await daemon.sbx(['ps', '--all', '--json'])).stdout.toString())[0].session_id as string;
    const both = await daemon.sbx(['logs', id]);
    expect(both.status).toBe(0);
    expect(both.stdout.equals(Buffer.from('out \x01\xff\nout two', 'latin1'))).toBe(true);
    expect(both.stderr.toString()).toBe('err one\nerr two');
    // Through the index (--tail, --timestamps): still each stream to its own fd.
    const tail = await daemon.sbx(['logs', id, '--tail', 'all']);
    expect([tail.stdout.equals(both.stdout), tail.stderr.toString()]).toEqual([true, 'err one\nerr two']);
    const stamped = await daemon.sbx(['logs', id, '--timestamps']);
    expect(stamped.stdout.toString('latin1')).toMatch(/^\S+Z out \x01\xff\n\S+Z out two$/);
    expect(stamped.stderr.toString()).toMatch(/^\S+Z err one\n\S+Z err two$/);
    const out = await daemon.sbx(['logs', id, '--stream', 'stdout']);
    expect([out.stdout.equals(both.stdout), out.stderr.length]).toEqual([true, 0]);
    // One stream selected is printed on stdout, stderr's too (a selection, as before).
    const err = await daemon.sbx(['logs', id, '--stream', 'stderr']);
    expect([err.stdout.toString(), err.stderr.length]).toEqual(['err one\nerr two', 0]);
    // --from is one stream's cursor: without --stream, stdout's (as before).
    const from = await daemon.sbx(['logs', id, '--from', '7']);
    expect([from.stdout.toString(), from.stderr.length]).toEqual(['out two', 0]);
  });
});

/** sbx (the bin) in the background, its bytes collected; exited resolves with its status. */
function background(args: string[], stdin: 'ignore' | 'pipe' = 'ignore') {
  const child = spawn(SBX_BIN, args, { env: { ...process.env, SBX_SOCKET: daemon.socketPath }, cwd: daemon.dir, stdio: [stdin, 'pipe', 'pipe'] });
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  child.stdout!.on('data', (b: Buffer) => out.push(b));
  child.stderr!.on('data', (b: Buffer) => err.push(b));
  const exited = new Promise<number | null>((r) => child.on('exit', (code, signal) => r(code ?? (signal ? -1 : null))));
  return { child, stdout: () => Buffer.concat(out), stderr: () => Buffer.concat(err).toString(), exited };
}

describe('the first Ctrl-C of sbx run', () => {
  it('on a command that ignores SIGINT: forwarded, then said once on stderr with what ends it; the session runs on', async () => {
    const go = join(daemon.dir, 'go-int');
    const run = background(['run', '--key', 'int-ignored', '--', 'sh', '-c', `trap "" INT; echo ready; while [ ! -e ${go} ]; do sleep 0.05; done; echo done`]);
    await until(() => run.stdout().toString() === 'ready\n', 'the command to be ready');
    run.child.kill('SIGINT');
    const id = (await client.ps(false)).sessions.find((s) => s.invocation_key === 'int-ignored')!.session_id;
    const line = `sbx: session ${id} is still running 2 s after SIGINT: the command ignores it. Ctrl-C again detaches (the session goes on: sbx wait ${id}); sbx kill ${id} (SIGKILL) or sbx cancel ${id} (SIGTERM, then SIGKILL after the grace) ends it\n`;
    await until(() => run.stderr() === line, 'the ignored-SIGINT line', 15_000);
    writeFileSync(go, '');
    expect(await run.exited).toBe(0); // it went on and ended by itself
    expect(run.stdout().toString()).toBe('ready\ndone\n');
    expect(run.stderr()).toBe(line); // once
  });

  it('on a command that ends on SIGINT: 130 and nothing said', async () => {
    const run = background(['run', '--', 'sh', '-c', 'echo ready; exec sleep 30']);
    await until(() => run.stdout().toString() === 'ready\n', 'the command to be ready');
    run.child.kill('SIGINT');
    expect(await run.exited).toBe(130);
    expect(run.stderr()).toBe('');
  });
});

describe('sbx close --task', () => {
  it('says on stderr, one line each, which running sessions it cancelled (id, argv), and lists them in settle.terminated_ids', async () => {
    const running = (await daemon.sbx(['run', '--detach', '--task', 'cancels', '--grace', '100ms', '--', 'sh', '-c', `echo "it's up"; exec sleep 300`])).stdout
      .toString()
      .trim();
    const ended = await daemon.sbx(['run', '--task', 'cancels', '--', 'true']);
    expect(ended.status).toBe(0);
    await until(async () => (await client.ps(false)).sessions.some((s) => s.session_id === running && s.cursors.stdout === 8), 'the running session to be up');
    const r = await daemon.sbx(['close', '--task', 'cancels', '--timeout', '200ms']);
    const receipt = JSON.parse(r.stdout.toString()) as TaskReceipt;
    expect(receipt.settle).toEqual({ timeout_ms: 200, terminated: 1, terminated_ids: [running] });
    const lines = r.stderr
      .toString()
      .split('\n')
      .filter((l) => l.startsWith('sbx: cancelled'));
    expect(lines).toEqual([`sbx: cancelled session ${running} (sh -c 'echo "it'\\''s up"; exec sleep 300'): it was still running after the 0.2 s timeout`]);
    const gone = receipt.sessions.find((s) => s.session_id === running)!;
    expect(gone.exit).toEqual({ code: null, signal: 'SIGTERM' });
  });

  it('a task whose sessions had all ended: nothing said, terminated_ids empty', async () => {
    expect((await daemon.sbx(['run', '--task', 'quiet', '--', 'true'])).status).toBe(0);
    const r = await daemon.sbx(['close', '--task', 'quiet']);
    expect(r.status).toBe(0);
    expect((JSON.parse(r.stdout.toString()) as TaskReceipt).settle).toEqual({ timeout_ms: 60_000, terminated: 0, terminated_ids: [] });
    expect(r.stderr.toString()).not.toContain('cancelled');
  });
});

describe('sbx attach', () => {
  const ps = async (id: string) => (await client.ps(true)).sessions.find((s) => s.session_id === id)!;

  it('follows from where the session is now: later stdout on fd 1, stderr on fd 2, byte-exact; our stdin into its stdin; exits with its code', async () => {
    const id = (
      await daemon.sbx([
        'run',
        '--detach',
        '--stdin',
        '--',
        'sh',
        '-c',
        'echo before; echo before-err >&2; read line; printf "got %s\\001\\377\\n" "$line"; printf "err %s" "$line" >&2; exit 3',
      ])
    ).stdout
      .toString()
      .trim();
    await until(async () => (await ps(id)).cursors.stdout === 7 && (await ps(id)).cursors.stderr === 11, 'the first lines to be stored');
    // Our stdin is read only once attach follows (after it took the cursors): the bytes the
    // session prints after reading it come after the attach point, "before" is not replayed.
    const a = background(['attach', id], 'pipe');
    a.child.stdin!.end('hello\n');
    expect(await a.exited).toBe(3);
    expect(a.stdout().equals(Buffer.from('got hello\x01\xff\n', 'latin1'))).toBe(true);
    expect(a.stderr()).toBe('err hello');
  });

  it('--from-start replays, also a session that ended (its status); an ended session with nothing to replay: 1, said why', async () => {
    const r = await daemon.sbx(['run', '--', 'sh', '-c', 'printf "one\\n"; printf "two" >&2; kill -TERM $$']);
    expect(r.status).toBe(143);
    const id = (await client.ps(true)).sessions.find((s) => s.argv.join(' ').includes('kill -TERM'))!.session_id;
    const replay = await daemon.sbx(['attach', id, '--from-start']);
    expect([replay.status, replay.stdout.toString(), replay.stderr.toString()]).toEqual([143, 'one\n', 'two']);
    const from = await daemon.sbx(['attach', id, '--cursor', '2', '--stderr-cursor', '1']);
    expect([from.status, from.stdout.toString(), from.stderr.toString()]).toEqual([143, 'e\n', 'wo']);
    const ended = await daemon.sbx(['attach', id]);
    expect(ended.status).toBe(1);
    expect(ended.stdout.length).toBe(0);
    expect(ended.stderr.toString()).toMatch(new RegExp(`^sbx: session ${id} has ended: .*nothing to attach to \\(sbx logs ${id} shows its output`));
    const missing = await daemon.sbx(['attach', 's-0-nope']);
    expect(missing.status).toBe(125);
    expect(missing.stderr.toString()).toContain('SESSION_NOT_FOUND');
    // As sbx logs --from: a cursor past what is stored is refused, not waited on.
    const past = await daemon.sbx(['attach', id, '--cursor', '5']);
    expect([past.status, past.stdout.length, past.stderr.toString()]).toEqual([
      125,
      0,
      'sbx: CURSOR_OUT_OF_RANGE: --cursor 5 is past the end of stdout (4 bytes so far)\n',
    ]);
    const pastErr = await daemon.sbx(['attach', id, '--stderr-cursor', '4']);
    expect([pastErr.status, pastErr.stderr.toString()]).toEqual([
      125,
      'sbx: CURSOR_OUT_OF_RANGE: --stderr-cursor 4 is past the end of stderr (3 bytes so far)\n',
    ]);
  });

  it('takes a unique id prefix or --key, as the other verbs do', async () => {
    const r = await daemon.sbx(['run', '--key', 'attach-by-key', '--', 'sh', '-c', 'printf "by key\\n"; exit 4']);
    expect(r.status).toBe(4);
    const id = (await client.ps(true)).sessions.find((s) => s.invocation_key === 'attach-by-key')!.session_id;
    const byPrefix = await daemon.sbx(['attach', id.slice(0, -3), '--from-start']);
    expect([byPrefix.status, byPrefix.stdout.toString(), byPrefix.stderr.toString()]).toEqual([4, 'by key\n', '']);
    const byKey = await daemon.sbx(['attach', '--key', 'attach-by-key', '--from-start']);
    expect([byKey.status, byKey.stdout.toString(), byKey.stderr.toString()]).toEqual([4, 'by key\n', '']);
    const both = await daemon.sbx(['attach', id, '--key', 'attach-by-key']);
    expect([both.status, both.stderr.toString()]).toEqual([125, 'sbx: give a session ID or --key, not both\n']);
    // 's-' starts every id: a prefix that short names them all, and is refused as ambiguous.
    const ambiguous = await daemon.sbx(['attach', 's-']);
    expect(ambiguous.status).toBe(125);
  });

  it("writers side by side: attach's stdin, another token writer and a tokenless write interleave, none dropped or doubled", async () => {
    const go = join(daemon.dir, 'go-cat');
    const id = (await daemon.sbx(['run', '--detach', '--stdin', '--', 'sh', '-c', `until [ -e ${go} ]; do echo tick; sleep 0.1; done; exec cat`])).stdout
      .toString()
      .trim();
    const a = background(['attach', id], 'pipe');
    // It prints what came after it attached: it follows, and forwards its stdin, by then.
    await until(() => a.stdout().toString().includes('tick\n'), 'attach to follow');
    writeFileSync(go, '');
    const shown = (tail: string) => until(() => a.stdout().toString().endsWith(tail), `${JSON.stringify(tail)} through cat`);
    a.child.stdin!.write('one\n');
    await shown('one\n');
    // Another writer at offset 0 of its own stream, and a tokenless one (sbx write, the Python client).
    expect(await client.request('write', { session_id: id, data: Buffer.from('two\n'), offset: 0, writer: 'other' })).toEqual({ session_id: id, cursor: 4 });
    await shown('two\n');
    expect(await client.request('write', { session_id: id, data: Buffer.from('X\n'), offset: 0 })).toEqual({ session_id: id, cursor: 2 });
    await shown('X\n');
    // attach's next write is at offset 4 of its own stream: nothing of it is taken for a retry.
    a.child.stdin!.end('three\n');
    await shown('three\n');
    await client.request('write', { session_id: id, data: Buffer.alloc(0), offset: 2, eof: true });
    expect(await a.exited).toBe(0);
    expect(a.stdout().toString()).toMatch(/^(tick\n)+one\ntwo\nX\nthree\n$/);
    expect(a.stderr()).toBe('');
  });

  it("the write verb: each writer token's offsets are its own stream's, tokenless writes share one; a retry is skipped, a gap refused", async () => {
    const id = (await daemon.sbx(['run', '--detach', '--stdin', '--', 'cat'])).stdout.toString().trim();
    const write = (data: string, offset: number, writer?: string) =>
      client.request('write', { session_id: id, data: Buffer.from(data), offset, ...(writer ? { writer } : {}) });
    expect((await write('abcd', 0, 'A')).cursor).toBe(4);
    expect((await write('abcd', 0, 'A')).cursor).toBe(4); // A's retry: skipped
    expect((await write('xy', 0, 'B')).cursor).toBe(2); // B's own stream
    expect((await write('Q', 0)).cursor).toBe(1); // the tokenless stream
    expect((await write('cdef', 2, 'A')).cursor).toBe(6); // A's retry with more: only "ef" is new
    expect((await write('xy', 0, 'B')).cursor).toBe(2); // B's retry, after others wrote: still skipped
    await expect(write('zz', 7, 'A')).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', details: { cursor: 6 } });
    await client.request('write', { session_id: id, data: Buffer.alloc(0), offset: 1, eof: true });
    expect((await client.wait({ session_id: id })).outcome).toBe('exited');
    expect((await daemon.sbx(['logs', id])).stdout.toString()).toBe('abcdxyQef');
  });

  it('Ctrl-C detaches: 130, said on stderr, and the session goes on; a deadline while attached exits 124', async () => {
    const id = (await daemon.sbx(['run', '--detach', '--grace', '100ms', '--', 'sh', '-c', 'while :; do echo tick; sleep 0.1; done'])).stdout.toString().trim();
    const a = background(['attach', id]);
    await until(() => a.stdout().toString().includes('tick\n'), 'attach to follow');
    a.child.kill('SIGINT');
    expect(await a.exited).toBe(130);
    expect(a.stderr()).toBe(`sbx: detached from session ${id}; it goes on (sbx attach ${id} follows it again, sbx wait ${id} waits for its status)\n`);
    expect((await ps(id)).state).toBe('running');
    expect((await daemon.sbx(['cancel', id])).status).toBe(0);

    const late = (await daemon.sbx(['run', '--detach', '--timeout', '3s', '--', 'sh', '-c', 'echo up; exec sleep 30'])).stdout.toString().trim();
    const t = background(['attach', late, '--from-start']);
    expect(await t.exited).toBe(124);
    expect(t.stdout().toString()).toBe('up\n');
  });
  it('a pty session: its one stream on fd 1, our stdin into the pty', async () => {
    const id = (
      await daemon.sbx(['run', '--detach', '--pty', '--stdin', '--', 'sh', '-c', 'stty -echo; echo ready; read line; echo "pty $line"; exit 5'])
    ).stdout
      .toString()
      .trim();
    await until(async () => ((await ps(id)).cursors.pty ?? 0) >= 7, 'the pty session to be ready');
    const a = background(['attach', id], 'pipe');
    a.child.stdin!.end('hi\n');
    expect(await a.exited).toBe(5);
    expect(a.stdout().toString()).toBe('pty hi\r\n'); // the terminal's line discipline: CR LF
    expect(a.stderr()).toBe('');
  });
});
