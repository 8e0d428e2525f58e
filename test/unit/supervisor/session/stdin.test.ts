// StdinWriter against a real pipe: a write after the session's stdin was released, or one
// waiting for room when it is, is refused with INVALID_ARGUMENT at once (it used to wait
// forever, or report bytes as handed over that never were); writer tokens give each writer a
// stream of its own, so writers side by side never skip each other's bytes (issue 31).
import { spawn, type ChildProcess } from 'node:child_process';
import type { Socket } from 'node:net';
import { afterEach, expect, it } from 'vitest';
import { isSupervisorError } from '../../../../ipc/errors.js';
import { MAX_STDIN_WRITERS, StdinWriter } from '../../../../supervisor/session/stdin.js';

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
  expect(await refusal(writer.write(Buffer.from('after\n'), undefined, false))).toEqual({
    code: 'INVALID_ARGUMENT',
    message: 'stdin of session s-test is closed',
  });
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

it("writer tokens: each token's offsets are its own stream's, tokenless writes share one; retries skipped, gaps refused", async () => {
  const { socket, ended } = pipeToBuffer();
  const w = new StdinWriter('s-test', socket, false);
  expect(await w.write(Buffer.from('aaaa'), 0, false, 'A')).toBe(4);
  expect(await w.write(Buffer.from('aaaa'), 0, false, 'A')).toBe(4); // A's retry
  expect(await w.write(Buffer.from('bb'), 0, false, 'B')).toBe(2); // B from 0 of its own
  expect(await w.write(Buffer.from('--'), undefined, false)).toBe(2); // tokenless, appended to its stream
  expect(await w.write(Buffer.from('aaAA'), 2, false, 'A')).toBe(6); // A's retry with more: "AA" is new
  expect(await w.write(Buffer.from('-!'), 1, false)).toBe(3); // the tokenless stream's retry with more
  await expect(w.write(Buffer.from('b'), 3, false, 'B')).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', details: { cursor: 2 } });
  expect([w.cursorOf('A'), w.cursorOf('B'), w.cursorOf(), w.cursorOf('never')]).toEqual([6, 2, 3, 0]);
  expect(await w.write(Buffer.alloc(0), undefined, true, 'B')).toBe(2); // eof from any writer closes it for all
  expect(await w.write(Buffer.alloc(0), 2, true, 'B')).toBe(2); // a retried eof
  expect(await w.write(Buffer.from('aaAA'), 2, false, 'A')).toBe(6); // a resend of bytes written before the close
  // An empty write without eof asks whether stdin is open: it is not.
  await expect(w.write(Buffer.alloc(0), undefined, false, 'A')).rejects.toMatchObject({ details: { stdin_closed: true, cursor: 6 } });
  await expect(w.write(Buffer.alloc(0), undefined, false)).rejects.toMatchObject({ details: { stdin_closed: true, cursor: 3 } });
  await expect(w.write(Buffer.from('x'), 6, false, 'A')).rejects.toMatchObject({ details: { stdin_closed: true } });
  expect(await ended).toBe('aaaabb--AA!');
});

it('writer tokens: at most MAX_STDIN_WRITERS a session (LIMIT_EXCEEDED), the known ones still write', async () => {
  const { socket, ended } = pipeToBuffer();
  const w = new StdinWriter('s-test', socket, false);
  for (let i = 0; i < MAX_STDIN_WRITERS; i++) await w.write(Buffer.from('.'), 0, false, `w${i}`);
  await expect(w.write(Buffer.from('x'), 0, false, 'one-too-many')).rejects.toMatchObject({
    code: 'LIMIT_EXCEEDED',
    details: { limit: 'stdin_writers', max: MAX_STDIN_WRITERS },
  });
  expect(await w.write(Buffer.from('!'), 1, false, 'w0')).toBe(2);
  expect(await w.write(Buffer.from('?'), undefined, true)).toBe(1);
  expect(await ended).toBe('.'.repeat(MAX_STDIN_WRITERS) + '!?');
});
