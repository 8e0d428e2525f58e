// StdinWriter against a real pipe: a write after the session's stdin was released, or one
// waiting for room when it is, is refused with INVALID_ARGUMENT at once (it used to wait
// forever, or report bytes as handed over that never were); writer tokens tell a retry from
// another writer's bytes, with bounded memory (issue 31).
import { spawn, type ChildProcess } from 'node:child_process';
import type { Socket } from 'node:net';
import { afterEach, expect, it } from 'vitest';
import { isSupervisorError } from '../../ipc/errors.js';
import { StdinWriter } from '../../supervisor/session/stdin.js';

const children: ChildProcess[] = [];
afterEach(async () => {
  for (const c of children.splice(0)) {
    if (c.exitCode === null && c.signalCode === null) {
      const exited = new Promise((r) => c.once('exit', r));
      c.kill('SIGKILL');
      await exited;
    }
  }
});

/** A reader that never reads: `sleep`, its stdin a pipe we hold the write end of. */
function pipeNobodyReads() {
  const child = spawn('sleep', ['60'], { stdio: ['pipe', 'ignore', 'ignore'] });
  children.push(child);
  return child.stdin as Socket; // a pipe's end is a net.Socket (node:child_process)
}

const refusal = (p: Promise<unknown>) =>
  p.then(
    (v) => ({ resolved: v }),
    (err: unknown) => (isSupervisorError(err) ? { code: err.code, message: err.message } : { other: String(err) }),
  );

it('a write after release is refused, not left waiting', async () => {
  const writer = new StdinWriter('s-test', pipeNobodyReads(), false);
  expect(await writer.write(Buffer.from('before\n'), undefined, false)).toBe(7);
  writer.release();
  expect(await refusal(writer.write(Buffer.from('after\n'), undefined, false))).toEqual({ code: 'INVALID_ARGUMENT', message: 'stdin of session s-test is closed' });
});

it('a write waiting for room in the pipe when stdin is released is refused: the bytes were not taken', async () => {
  const writer = new StdinWriter('s-test', pipeNobodyReads(), false);
  const pending = refusal(writer.write(Buffer.alloc(1 << 20, 0x61), undefined, false)); // over the 64 KiB pipe
  await new Promise((r) => setImmediate(r));
  writer.release();
  expect(await pending).toMatchObject({ code: 'INVALID_ARGUMENT', message: expect.stringContaining('closed before it took the bytes') });
});

/** A reader that keeps every byte: `cat` into a buffer, for what reached the pipe exactly. */
function pipeToBuffer() {
  const child = spawn('cat', [], { stdio: ['pipe', 'pipe', 'ignore'] });
  children.push(child);
  const got: Buffer[] = [];
  child.stdout!.on('data', (b: Buffer) => got.push(b));
  const ended = new Promise<string>((r) => child.stdout!.on('end', () => r(Buffer.concat(got).toString())));
  return { socket: child.stdin as Socket, ended };
}

it("writer tokens: a retry is skipped, another token's bytes are a conflict, tokenless bytes are anyone's", async () => {
  const { socket, ended } = pipeToBuffer();
  const w = new StdinWriter('s-test', socket, false);
  const conflict = { code: 'INVALID_ARGUMENT', details: { stdin_conflict: true } };
  const failure = (p: Promise<unknown>) => p.then(() => null, (err: unknown) => (isSupervisorError(err) ? { code: err.code, details: { stdin_conflict: err.details?.stdin_conflict } } : String(err)));
  expect(await w.write(Buffer.from('aaaa'), 0, false, 'A')).toBe(4);
  expect(await w.write(Buffer.from('aaaa'), 0, false, 'A')).toBe(4); // A's retry
  expect(await w.write(Buffer.from('aaaaBB'), 0, false, 'A')).toBe(6); // A's retry with more: only the new bytes
  expect(await failure(w.write(Buffer.from('bb'), 5, false, 'B'))).toEqual(conflict); // A wrote offset 5
  expect(await w.write(Buffer.from('bb'), 6, false, 'B')).toBe(8);
  // A retry reaching into B's bytes: refused, even though most of it is A's.
  expect(await failure(w.write(Buffer.from('aaBBbb'), 2, false, 'A'))).toEqual(conflict);
  expect(await w.write(Buffer.from('--'), undefined, false)).toBe(10); // tokenless, appended
  // Tokenless bytes are anyone's: a token's retry over them is a retry.
  expect(await w.write(Buffer.from('b--!'), 7, false, 'B')).toBe(11);
  // Without a token, the single-writer rule: bytes before the cursor are skipped, whoever wrote them.
  expect(await w.write(Buffer.from('aaaaBBbb--!?'), 0, true)).toBe(12);
  expect(await ended).toBe('aaaaBBbb--!?');
});

it('writer tokens: ranges far behind the cursor are forgotten (bounded), and a retry that far back is a conflict', async () => {
  const { socket, ended } = pipeToBuffer();
  const w = new StdinWriter('s-test', socket, false);
  const MiB = 1024 * 1024;
  // Alternating writers: one range each, trimmed once 16 MiB behind.
  for (let i = 0; i < 40; i++) expect(await w.write(Buffer.alloc(MiB, i % 2 ? 'b' : 'a'), i * MiB, false, i % 2 ? 'B' : 'A')).toBe((i + 1) * MiB);
  expect((w as unknown as { segments: unknown[] }).segments.length).toBeLessThanOrEqual(18);
  await expect(w.write(Buffer.alloc(1, 'a'), 0, false, 'A')).rejects.toMatchObject({ details: { cursor: 40 * MiB, stdin_conflict: true } });
  expect(await w.write(Buffer.alloc(MiB, 'b'), 39 * MiB, false, 'B')).toBe(40 * MiB); // a recent retry still is one
  expect(await w.write(Buffer.alloc(0), undefined, true)).toBe(40 * MiB);
  expect((await ended).length).toBe(40 * MiB);
});
