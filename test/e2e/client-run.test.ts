// The TypeScript client's run (ipc/client.ts SupervisorClient.run) against a real supervisor:
// onStdout/onStderr get every byte in order (sha256 against the command's own digests) and
// the streams are not kept; inheritEnv as `sbx run --inherit-env`; kill() defaults to SIGKILL
// as `sbx kill`; readOutput({ stream: 'all' }) merges stdout and stderr in arrival order.
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readOutput, type OutputChunk } from '../../ipc/client.js';
import { TestDaemon, until } from '../helpers/daemon.js';

let daemon: TestDaemon;
beforeAll(async () => {
  daemon = await new TestDaemon().start();
});
afterAll(async () => {
  expect(await daemon.stop()).toEqual({ code: 0, signal: null });
});

const key = () => `ts-${Math.random().toString(16).slice(2, 10)}`;

// 4 MiB of each stream, written alternately in 64 KiB pieces; the digests are the command's own.
const GEN = `
const { createHash } = require('node:crypto'); const { writeSync, writeFileSync } = require('node:fs');
const h = { 1: createHash('sha256'), 2: createHash('sha256') };
for (let i = 0; i < 64; i++) for (const fd of [1, 2]) {
  const piece = Buffer.concat(Array.from({ length: 2048 }, (_, j) => createHash('sha256').update(fd + '.' + i + '.' + j).digest()));
  for (let off = 0; off < piece.length; ) off += writeSync(fd, piece, off);
  h[fd].update(piece);
}
writeFileSync(process.argv[1], h[1].digest('hex') + ' ' + h[2].digest('hex'));
`;

describe('SupervisorClient.run over the in-flight limit', () => {
  it('more run()s at once than ipc.maxInFlight allows on one connection: each finishes (a refused subscribe or wait is sent again), every session once', async () => {
    // Each run holds two subscriptions while its command runs: 6 runs need 12, the limit is 4.
    const d = await new TestDaemon({ config: { ipc: { maxInFlight: 4 } } }).start();
    try {
      const c = await d.client();
      const runs = await Promise.all(
        Array.from({ length: 6 }, (_, i) => c.run({ argv: ['sh', '-c', 'sleep 0.3; printf %s "$0"', `run-${i}`], cwd: '/', invocation_key: key() })),
      );
      expect(runs.map((r) => [r.stdout!.toString(), r.receipt.exit.code])).toEqual(Array.from({ length: 6 }, (_, i) => [`run-${i}`, 0]));
      const listed = JSON.parse((await d.sbx(['ps', '--all', '--json'])).stdout.toString()) as { session_id: string; state: string }[];
      expect(listed.map((s) => s.state).sort()).toEqual(Array(6).fill('ended'));
      expect(new Set(listed.map((s) => s.session_id))).toEqual(new Set(runs.map((r) => r.session.session_id)));
      c.close();
    } finally {
      expect(await d.stop()).toEqual({ code: 0, signal: null });
    }
  });
});

describe('SupervisorClient.run', () => {
  it('hands every byte of each stream to its callback, in order, without keeping it', async () => {
    const c = await daemon.client();
    const digests = join(daemon.dir, `digests-${key()}`);
    const got = { stdout: createHash('sha256'), stderr: createHash('sha256') };
    const counts = { stdout: 0, stderr: 0 };
    const r = await c.run(
      { argv: [process.execPath, '-e', GEN, digests], cwd: '/', invocation_key: key(), timeout_ms: 60_000 },
      {
        onStdout: (b) => (got.stdout.update(b), (counts.stdout += b.length)),
        onStderr: (b) => (got.stderr.update(b), (counts.stderr += b.length)),
      },
    );
    expect([r.receipt.outcome, r.receipt.exit.code, r.stdout, r.stderr]).toEqual(['exited', 0, null, null]);
    expect(`${got.stdout.digest('hex')} ${got.stderr.digest('hex')}`).toBe(readFileSync(digests, 'utf8'));
    expect(counts).toEqual({ stdout: 64 * 65536, stderr: 64 * 65536 });
  });

  it('keeps a stream without a callback, and feeds stdin', async () => {
    const c = await daemon.client();
    const err: Buffer[] = [];
    const r = await c.run(
      { argv: ['sh', '-c', 'cat; printf err >&2'], cwd: '/', invocation_key: key() },
      { stdin: Buffer.from('in'), onStderr: (b) => void err.push(b) },
    );
    expect([r.stdout?.toString(), r.stderr, Buffer.concat(err).toString()]).toEqual(['in', null, 'err']);
  });

  it("with a pty, the terminal's one stream comes as stdout (stderr in it, \\n as \\r\\n), stderr empty; stdin then ^D", async () => {
    const c = await daemon.client();
    const r = await c.run({ argv: ['sh', '-c', "printf 'a\\nb'; printf err >&2"], cwd: '/', pty: { cols: 80, rows: 24 }, invocation_key: key() });
    expect([r.receipt.exit.code, r.stdout?.toString(), r.stderr?.toString()]).toEqual([0, 'a\r\nberr', '']);
    expect(r.receipt.output.pty).toMatchObject({ final_cursor: 7, complete: true });
    // The tty echoes the input, then cat writes it back; the end of stdin is ^D, never echoed.
    const got: Buffer[] = [];
    const fed = await c.run(
      { argv: ['cat'], cwd: '/', pty: { cols: 80, rows: 24 }, invocation_key: key() },
      { stdin: Buffer.from('in\n'), onStdout: (b) => void got.push(b) },
    );
    expect([fed.receipt.exit.code, fed.stdout, Buffer.concat(got).toString()]).toEqual([0, null, 'in\r\nin\r\n']);
  });

  it('inheritEnv passes this process environment, as launch inherit_env', async () => {
    const c = await daemon.client();
    const marker = key();
    process.env.SBX_TEST_INHERITED = marker;
    try {
      const argv = ['sh', '-c', 'printf "%s" "${SBX_TEST_INHERITED-unset}"'];
      const plain = await c.run({ argv, cwd: '/', invocation_key: key() });
      const inherited = await c.run({ argv, cwd: '/', invocation_key: key() }, { inheritEnv: true });
      expect([plain.stdout?.toString(), inherited.stdout?.toString()]).toEqual(['unset', marker]);
    } finally {
      delete process.env.SBX_TEST_INHERITED;
    }
  });

  it('kill() sends SIGKILL by default, as sbx kill', async () => {
    const c = await daemon.client();
    const s = await c.launch({ argv: ['sh', '-c', "trap 'exit 0' TERM; echo ready; while :; do sleep 0.05; done"], cwd: '/', invocation_key: key() });
    await until(async () => (await c.read({ session_id: s.session_id }, 'stdout')).toString() === 'ready\n', 'the trap installed');
    const answer = await c.kill({ session_id: s.session_id });
    const receipt = await c.wait({ session_id: s.session_id });
    expect(answer.signal).toBe('SIGKILL');
    expect([receipt.outcome, receipt.exit.signal]).toEqual(['signaled', 'SIGKILL']);
  });
});

describe("readOutput({ stream: 'all' })", () => {
  it('merges stdout and stderr in arrival order, live and after, as sbx logs --stream all', async () => {
    const c = await daemon.client();
    const plan = 'o e e o e o o o e e o e'.split(' ');
    const expected = plan.map((p, i) => [p === 'o' ? 'stdout' : 'stderr', p === 'o' ? `out ${i}\n` : `err ${i}\n`]);
    const s = await c.launch({
      argv: ['sh', '-c', 'while read s n; do if [ "$s" = o ]; then echo "out $n"; else echo "err $n" >&2; fi; done'],
      cwd: '/',
      invocation_key: key(),
      stdin: true,
    });
    const selector = { session_id: s.session_id };
    const collect = async (follow: boolean) => {
      const out: string[][] = [];
      for await (const ch of readOutput({ socketPath: daemon.socketPath, selector, stream: 'all', follow }) as AsyncGenerator<OutputChunk>)
        out.push([ch.stream, ch.data.toString()]);
      return out;
    };
    const live = collect(true);
    const sizes = { stdout: 0, stderr: 0 };
    for (const [i, [stream, line]] of expected.entries()) {
      await c.request('write', { ...selector, data: Buffer.from(`${plan[i]} ${i}\n`) });
      sizes[stream as 'stdout'] += line!.length;
      await until(async () => (await c.read(selector, stream as 'stdout')).length === sizes[stream as 'stdout'], `write ${i} stored`);
    }
    await c.request('write', { ...selector, data: Buffer.alloc(0), eof: true });
    await c.wait(selector);
    expect(await live).toEqual(expected);
    expect(await collect(false)).toEqual(expected);
  });

  it('stops the merge when the reader stops early', async () => {
    const c = await daemon.client();
    const s = await c.launch({ argv: ['sh', '-c', 'echo one; echo two >&2; exec sleep 30'], cwd: '/', invocation_key: key() });
    const selector = { session_id: s.session_id };
    await until(async () => (await c.read(selector, 'stderr')).length === 4, 'both lines stored');
    const first: string[] = [];
    for await (const ch of readOutput({ socketPath: daemon.socketPath, selector, stream: 'all', follow: true })) {
      first.push(ch.data.toString());
      if (first.length === 2) break; // the merge would wait for the session's end: it must return now
    }
    expect(first.sort()).toEqual(['one\n', 'two\n']); // written back to back: either may have been read first
    await c.kill(selector);
    await c.wait(selector);
  });
});
