// The post-death bound of supervisor/session/drain.ts when the event loop stalls: its timer runs
// before the loop's poll phase reads what came meanwhile, so the bound reads the pipe first and
// cuts only a pipe still held open and empty. And a pty master's end: libuv's EOF after a short
// read and a POLLHUP is not the kernel's, so the drain reads on to EIO.
import { createHash, randomBytes } from 'node:crypto';
import { closeSync, constants, mkdtempSync, openSync, rmSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { native } from '../../../../core/fs/native.js';
import { StreamDrain } from '../../../../supervisor/session/drain.js';
import { HashPool } from '../../../../supervisor/store/hasher.js';

/** Blocks the event loop for ms (the stall under test: a GC, a sync write, a loaded machine). */
function stall(ms: number): void {
  const end = performance.now() + ms;
  while (performance.now() < end);
}

/** A drain of fd (a pipe's read end, or a pty master with pty) into a temp dir, for body; cut, and everything removed, after. */
async function withStreamDrain(fd: number, pty: boolean, body: (drain: StreamDrain) => Promise<void>): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'sbx-drain-'));
  const hashPool = new HashPool();
  const drain = new StreamDrain(dir, pty ? 'pty' : 'stdout', fd, { chunkBytes: 1 << 20, hashPool, quotaBytes: Number.MAX_SAFE_INTEGER, guard: null }, pty);
  try {
    await body(drain);
  } finally {
    drain.cut();
    await drain.finalize().catch(() => {});
    await hashPool.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

/** A drain of a fresh pipe; body gets the write end and closeWriter (the last writer's death). */
async function withDrain(body: (drain: StreamDrain, writeFd: number, closeWriter: () => void) => Promise<void>): Promise<void> {
  const [r, w] = native().makePipe();
  let open = true;
  const closeWriter = () => {
    closeSync(w);
    open = false;
  };
  try {
    await withStreamDrain(r, false, (drain) => body(drain, w, closeWriter));
  } finally {
    if (open) closeSync(w);
  }
}

describe('the post-death bound after a stalled event loop', () => {
  it('reads the EOF waiting in the pipe: every byte, complete (not cut as drain_timeout)', async () => {
    await withDrain(async (drain, w, closeWriter) => {
      const data = randomBytes(60_000);
      expect(writeSync(w, data)).toBe(data.length);
      closeWriter(); // the last writer is gone: the pipe holds 60,000 bytes, then EOF
      drain.startBound(20, 65536);
      stall(150); // the loop wakes with the timer due and the pipe unread
      expect(await drain.done).toBe('eof');
      expect(await drain.finalize()).toMatchObject({
        final_cursor: data.length,
        complete: true,
        reason: null,
        drain_end: 'eof',
        sha256: createHash('sha256').update(data).digest('hex'),
      });
    });
  });

  it('cuts a pipe a writer still holds, once what it held is read: drain_timeout, the bytes read stored', async () => {
    await withDrain(async (drain, w) => {
      const data = randomBytes(1000);
      writeSync(w, data);
      drain.startBound(20, 65536);
      stall(150);
      expect(await drain.done).toBe('timeout');
      expect(await drain.finalize()).toMatchObject({
        final_cursor: 1000,
        complete: false,
        reason: 'drain_timeout',
        drain_end: 'timeout',
        sha256: createHash('sha256').update(data).digest('hex'),
      });
    });
  });
});

describe("a pty master's end", () => {
  it("every byte still in the tty layer when the last slave closes: read on past libuv's EOF to EIO, complete", async () => {
    const { master, slave, path } = native().openPty(80, 24);
    // Fill the tty layer from a non-blocking slave fd until it takes no more: n_tty's 4 KiB read
    // buffer, then the port's flip buffer behind it. Letters only: output processing (ONLCR) changes none.
    const writer = openSync(path, constants.O_WRONLY | constants.O_NONBLOCK | constants.O_NOCTTY);
    closeSync(slave);
    const chunk = Buffer.from(
      randomBytes(3 * 256)
        .toString('base64')
        .replace(/[^A-Za-z]/g, 'x'),
    );
    const written: Buffer[] = [];
    for (;;) {
      let n = 0;
      try {
        n = writeSync(writer, chunk);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EAGAIN') throw err;
      }
      if (n === 0) break;
      written.push(chunk.subarray(0, n));
    }
    const data = Buffer.concat(written);
    expect(data.length).toBeGreaterThan(4096); // more than one read of the master can return
    closeSync(writer); // the last slave: the master polls POLLHUP, with bytes still to read
    await withStreamDrain(master, true, async (drain) => {
      // libuv's first read returns n_tty's buffer (short of its 64 KiB), sees POLLHUP and
      // reports EOF without reading again: the flip buffer's bytes were dropped (pty_hangup).
      expect(await drain.done).toBe('eio');
      expect(await drain.finalize()).toMatchObject({
        final_cursor: data.length,
        complete: true,
        reason: null,
        drain_end: 'eio',
        sha256: createHash('sha256').update(data).digest('hex'),
      });
    });
  });
});
