// StdinWriter against a real pipe: a write after the session's stdin was released, or one
// waiting for room when it is, is refused with INVALID_ARGUMENT at once (it used to wait
// forever, or report bytes as handed over that never were).
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
