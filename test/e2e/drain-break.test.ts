// Adversarial cases of the drain (issue 20): reads copied into shared write buffers, written
// on the threadpool one write at a time per stream, hashed from the same memory. Many streams
// at once, every write pattern, followers, a quota and a full state dir while writes wait, a
// SIGKILL of the supervisor mid-stream, a pty flood: every stored byte is the producer's, in
// order, once; receipts, reads and followers agree; the reserve holds; no fd is left.
import { randomBytes } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, rmSync, statfsSync, writeFileSync } from 'node:fs';
import { spawn, spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EndEvent, Receipt } from '../../ipc/protocol.js';
import { decodeIndex } from '../../core/state/stream-files.js';
import { verifyStoredOutput } from '../../core/receipts/verify.js';
import { sha256, TestDaemon, until, zombieChildren } from '../helpers/daemon.js';
import { HAVE_FREEZABLE_IMAGE, mountState, mountStateImage, unmountState } from '../helpers/state-tmpfs.js';

const MiB = 1 << 20;
const fdCount = (pid: number) => readdirSync(`/proc/${pid}/fd`).length;

/** Bytes the index of a stream covers, and whether its records are contiguous from 0. */
function indexCoverage(stateDir: string, sessionId: string, stream: string): { bytes: number; contiguous: boolean } {
  let bytes = 0;
  let contiguous = true;
  for (const r of decodeIndex(readFileSync(join(stateDir, 'sessions', sessionId, stream, 'index.bin')))) {
    if (r.cursor !== bytes) contiguous = false;
    bytes += r.length;
  }
  return { bytes, contiguous };
}

describe('many streams at once', () => {
  let daemon: TestDaemon;
  beforeAll(async () => {
    daemon = await new TestDaemon({ config: { drain: { chunkBytes: 256 * 1024 + 4096 } } }).start();
  });
  afterAll(async () => {
    expect(await daemon.stop()).toEqual({ code: 0, signal: null });
  });

  it('50 sessions writing distinct data (1-byte, 4099-byte and pipe-sized writes, both streams at once): receipts, reads and followers have every byte', async () => {
    const client = await daemon.client();
    // The hashing threads start with the first stream: their fds are not a leak.
    await client.wait({ session_id: (await client.launch({ argv: ['echo', 'warm'], cwd: '/' })).session_id });
    const fdsBefore = fdCount(daemon.pid);
    const jobs = Array.from({ length: 50 }, (_, i) => {
      const out = randomBytes(i % 5 === 0 ? 100_000 + i : (1 + (i % 7)) * MiB + i * 13);
      const err = randomBytes(1000 + i);
      const outPath = join(daemon.dir, `out${i}`);
      const errPath = join(daemon.dir, `err${i}`);
      writeFileSync(outPath, out);
      writeFileSync(errPath, err);
      const script = [
        `dd if=${outPath} bs=1 status=none; cat ${errPath} >&2`,
        `dd if=${outPath} bs=4099 status=none; cat ${errPath} >&2`,
        `cat ${errPath} >&2; cat ${outPath}`,
        `cat ${outPath} & cat ${errPath} >&2; wait`,
        `cat ${outPath} & cat ${errPath} >&2; wait`,
      ][i % 5]!;
      return { out, err, script };
    });
    const followers = await Promise.all(jobs.map(() => daemon.client()));
    const results = await Promise.all(
      jobs.map(async (job, i) => {
        const { session_id } = await client.launch({ argv: ['sh', '-c', job.script], cwd: '/' });
        const parts: Buffer[] = [];
        let next = 0;
        let inOrder = true;
        const end = new Promise<EndEvent>((resolve) => {
          void followers[i]!.subscribe(
            { session_id, stream: 'stdout', follow: true },
            {
              onOutput: (ev) => {
                if (ev.cursor !== next) inOrder = false;
                next = ev.cursor + ev.data.length;
                parts.push(Buffer.from(ev.data));
              },
              onEnd: resolve,
            },
          );
        });
        const receipt = await client.wait({ session_id });
        const ended = await end;
        return { job, receipt, followed: Buffer.concat(parts), end: ended, inOrder };
      }),
    );
    for (const { job, receipt, followed, end, inOrder } of results) {
      expect(receipt.output.stdout).toMatchObject({ final_cursor: job.out.length, sha256: sha256(job.out), complete: true, dropped_bytes: 0 });
      expect(receipt.output.stderr).toMatchObject({ final_cursor: job.err.length, sha256: sha256(job.err), complete: true, dropped_bytes: 0 });
      expect(inOrder).toBe(true);
      expect(followed.equals(job.out)).toBe(true);
      expect(end).toMatchObject({ cursor: job.out.length, final: true });
      expect((await client.read({ session_id: receipt.session_id }, 'stdout')).equals(job.out)).toBe(true);
      expect(indexCoverage(daemon.stateDir, receipt.session_id, 'stdout')).toEqual({ bytes: job.out.length, contiguous: true });
      expect(verifyStoredOutput(receipt, daemon.stateDir)).toEqual([]);
    }
    for (const f of followers) f.close();
    await until(() => fdCount(daemon.pid) <= fdsBefore, `the supervisor's fds back to ${fdsBefore}`);
    expect(zombieChildren(daemon.pid)).toEqual([]);
  }, 60_000);

  it("the write buffers stay bounded across runs: three rounds of 8 streams x 64 MiB grow the supervisor's RSS by less than 64 MiB after the first", async () => {
    const client = await daemon.client();
    const rssMiB = () => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${daemon.pid}/status`, 'utf8'))![1]) / 1024;
    const round = async () => {
      const ids = await Promise.all(
        Array.from({ length: 8 }, async () => (await client.launch({ argv: ['head', '-c', String(64 * MiB), '/dev/zero'], cwd: '/' })).session_id),
      );
      for (const r of await Promise.all(ids.map((session_id) => client.wait({ session_id }))))
        expect(r.output.stdout).toMatchObject({ final_cursor: 64 * MiB, complete: true });
      for (const id of ids) rmSync(join(daemon.stateDir, 'sessions', id, 'stdout'), { recursive: true, force: true }); // 512 MiB a round
    };
    await round(); // the pool's 32 buffers and the threads' heaps are made here
    const after1 = rssMiB();
    for (let i = 0; i < 2; i++) await round();
    // The whole drain's memory across runs. Buffers left to the garbage collector (held by the
    // hashing threads' handles: +100-300 MiB a round of 8 x 256 MiB, 433227f) are checked
    // exactly by the pool's unit test (write-buffers.test.ts): with that fix undone, this test
    // passed here at 256 MiB too (stop 70), so it runs at 64 MiB: 4 s alone against 18 s.
    expect(rssMiB() - after1).toBeLessThan(64);
    // 1.5 GiB through the supervisor to disk: a run cut by a timeout would go on under the next test.
  }, 180_000);

  it('a pty flood: every byte of six 4 MiB sessions and a 1-byte writer at once, in order', async () => {
    const client = await daemon.client();
    const jobs = Array.from({ length: 6 }, (_, i) => {
      // base64 without newlines: the tty's output processing changes nothing.
      const data = Buffer.from(randomBytes(3 * MiB + i).toString('base64'));
      const path = join(daemon.dir, `pty${i}`);
      writeFileSync(path, data);
      return { data, path };
    });
    // And one writing 1 byte at a time (the first 200 kB of the first file).
    const tiny = jobs[0]!.data.subarray(0, 200_000);
    const argvs = [...jobs.map((j) => ['cat', j.path]), ['dd', `if=${jobs[0]!.path}`, 'bs=1', 'count=200000', 'status=none']];
    const expected = [...jobs.map((j) => j.data), tiny];
    const receipts = await Promise.all(
      argvs.map(async (argv) => client.wait({ session_id: (await client.launch({ argv, cwd: '/', pty: { cols: 80, rows: 24 } })).session_id })),
    );
    for (const [i, r] of receipts.entries()) {
      expect(r.output.pty).toMatchObject({ final_cursor: expected[i]!.length, sha256: sha256(expected[i]!), complete: true, reason: null, drain_end: 'eio' });
      expect((await client.read({ session_id: r.session_id }, 'pty')).equals(expected[i]!)).toBe(true);
    }
  }, 30_000);

  it('a SIGKILL of the supervisor mid-stream: after the restart each stored stream is a prefix of what was written, its index no longer than its chunks', async () => {
    const client = await daemon.client();
    const jobs = Array.from({ length: 6 }, (_, i) => {
      const data = randomBytes(48 * MiB);
      const path = join(daemon.dir, `crash${i}`);
      writeFileSync(path, data);
      return { data, script: i % 2 ? `dd if=${path} bs=7777 status=none; sleep 60` : `cat ${path}; sleep 60` };
    });
    const ids: string[] = [];
    for (const j of jobs) ids.push((await client.launch({ argv: ['sh', '-c', j.script], cwd: '/' })).session_id);
    await until(
      async () => (await client.ps()).sessions.filter((s) => ids.includes(s.session_id)).every((s) => (s.cursors.stdout ?? 0) > 2 * MiB),
      'every stream past 2 MiB',
      20_000,
    );
    await daemon.kill9();
    await daemon.start();
    const after = await daemon.client();
    for (const [i, id] of ids.entries()) {
      const r: Receipt = await after.wait({ session_id: id });
      expect(r.outcome).toBe('owner_lost');
      const stored = await after.read({ session_id: id }, 'stdout');
      expect(stored.length).toBe(r.output.stdout!.final_cursor);
      expect(stored.length).toBeGreaterThan(2 * MiB);
      expect(stored.equals(jobs[i]!.data.subarray(0, stored.length))).toBe(true);
      expect(r.output.stdout!.sha256).toBe(sha256(stored));
      const index = indexCoverage(daemon.stateDir, id, 'stdout');
      expect(index.contiguous).toBe(true);
      expect(index.bytes).toBeLessThanOrEqual(stored.length);
      expect(verifyStoredOutput(r, daemon.stateDir)).toEqual([]);
    }
  }, 60_000);
});

describe('a pipe held open outside the session after it died (post-death bound 300 ms)', () => {
  const boundMs = 300;
  let daemon: TestDaemon;
  beforeAll(async () => {
    daemon = await new TestDaemon({ config: { drain: { postDeathDrainMs: boundMs } } }).start();
  });
  afterAll(async () => {
    expect(await daemon.stop()).toEqual({ code: 0, signal: null });
  });

  // A process outside the session's cgroup gets the session's stdout over a Unix socket
  // (SCM_RIGHTS, unix(7)): killing the cgroup cannot close it, so only the bound ends the
  // drain, even while bytes keep arriving (4 KiB every 10 ms: progress does not reset it).
  const HOLDER = `
import os, socket, sys, time
path, mode = sys.argv[1], sys.argv[2]
srv = socket.socket(socket.AF_UNIX)
srv.bind(path)
srv.listen(1)
print("ready", flush=True)
conn, _ = srv.accept()
_, fds, _, _ = socket.recv_fds(conn, 1, 1)
print("held", flush=True)
if mode == "trickle":
    while True:
        os.write(fds[0], b"y" * 4096)
        time.sleep(0.01)
time.sleep(600)
`;
  for (const mode of ['silent', 'trickle'] as const) {
    it(`a ${mode} holder: the stream is cut at the bound, marked incomplete (drain_timeout), and the session ends`, async () => {
      const sock = join(daemon.dir, `holder-${mode}.sock`);
      const holder = spawn('python3', ['-c', HOLDER, sock, mode], { stdio: ['ignore', 'pipe', 'ignore'] }); // its EPIPE traceback is expected
      let said = '';
      holder.stdout!.on('data', (d: Buffer) => (said += d.toString()));
      try {
        await until(() => said.includes('ready'), 'the holder to listen');
        const client = await daemon.client();
        const send = `import socket; s = socket.socket(socket.AF_UNIX); s.connect(${JSON.stringify(sock)}); print("sent", flush=True); socket.send_fds(s, [b"x"], [1])`;
        const { session_id } = await client.launch({ argv: ['python3', '-c', send], cwd: '/' });
        const receipt = await client.wait({ session_id });
        expect(said).toContain('held');
        expect(receipt.outcome).toBe('exited');
        expect(receipt.output.stdout).toMatchObject({ complete: false, reason: 'drain_timeout', drain_end: 'timeout', dropped_bytes: 0 });
        const stored = await client.read({ session_id }, 'stdout');
        expect(stored.length).toBe(receipt.output.stdout!.final_cursor);
        expect(stored.subarray(0, 5).toString()).toBe('sent\n');
        console.log(`${mode} holder: ${stored.length} bytes stored before the cut`);
        if (mode === 'silent') expect(stored.length).toBe(5);
        else expect(stored.subarray(5).equals(Buffer.alloc(stored.length - 5, 'y'))).toBe(true);
        expect(verifyStoredOutput(receipt, daemon.stateDir)).toEqual([]);
        if (mode === 'trickle') {
          // Our read end closed with the cut: the holder's next write fails (EPIPE) and it exits.
          await until(() => holder.exitCode !== null, 'the trickling holder to exit on EPIPE');
          expect(holder.exitCode).not.toBe(0);
        }
      } finally {
        if (holder.exitCode === null && holder.signalCode === null) holder.kill('SIGKILL');
        await until(() => holder.exitCode !== null || holder.signalCode !== null, 'the holder to be gone');
      }
    }, 20_000);
  }
});

describe.skipIf(!HAVE_FREEZABLE_IMAGE)(
  HAVE_FREEZABLE_IMAGE
    ? 'a disk slower than the post-death bound'
    : 'a disk slower than the post-death bound (skipped: no loop devices or no mkfs.ext4/fsfreeze for a state dir that can freeze)',
  () => {
    const boundMs = 300;
    let daemon: TestDaemon;
    beforeAll(async () => {
      daemon = new TestDaemon({ config: { drain: { postDeathDrainMs: boundMs } } });
      mountStateImage(daemon, 64);
      await daemon.start();
    });
    afterAll(async () => {
      expect(await unmountState(daemon)).toEqual({ code: 0, signal: null });
    });

    // In CI, 50 sessions at once wrote so slowly that a drain paused on its full write
    // buffers (its pipe's EOF unread behind the bytes) outlived the bound: cut, "incomplete",
    // though every byte was there. The bound is for a pipe held open outside the session, not
    // for our own disk: time paused on the write buffers does not count.
    it('a stream paused on its write buffers while the state dir is frozen for 4 bounds after the last writer died: complete once it thaws', async () => {
      const client = await daemon.client();
      // 3.5 MiB: more than 3 of the stream's 4 write buffers (so the drain pauses), less than
      // those and the 1 MiB pipe together (so the producer gets every byte out and exits).
      const data = randomBytes(3.5 * MiB);
      const dataPath = join(daemon.dir, 'data');
      const go = join(daemon.dir, 'go');
      const wrote = join(daemon.dir, 'wrote');
      writeFileSync(dataPath, data);
      const script = `echo start; while [ ! -e ${go} ]; do sleep 0.01; done; cat ${dataPath}; touch ${wrote}`;
      const { session_id } = await client.launch({ argv: ['sh', '-c', script], cwd: '/' });
      // The first bytes and their index record on disk before the freeze: nothing of the
      // event loop's own (an index flush, a chunk file opened) waits on the frozen disk.
      await until(
        () =>
          existsSync(join(daemon.stateDir, 'sessions', session_id, 'stdout', 'index.bin')) && indexCoverage(daemon.stateDir, session_id, 'stdout').bytes === 6,
        'the first line written and indexed',
      );
      expect(spawnSync('fsfreeze', ['-f', daemon.stateDir]).status).toBe(0);
      try {
        writeFileSync(go, '');
        await until(() => existsSync(wrote), 'the producer to get every byte out');
        await until(
          async () => (await client.ps(true)).sessions.find((s) => s.session_id === session_id)?.live_pids === 0,
          'every process of the session to be gone',
        );
        // The bound would have run out four times over by now (a wait for time to pass, not for a race).
        await new Promise((r) => setTimeout(r, 4 * boundMs));
      } finally {
        expect(spawnSync('fsfreeze', ['-u', daemon.stateDir]).status).toBe(0);
      }
      const receipt = await client.wait({ session_id });
      const expected = Buffer.concat([Buffer.from('start\n'), data]);
      expect(receipt.output.stdout).toMatchObject({
        final_cursor: expected.length,
        sha256: sha256(expected),
        complete: true,
        reason: null,
        drain_end: 'eof',
        dropped_bytes: 0,
      });
      expect((await client.read({ session_id }, 'stdout')).equals(expected)).toBe(true);
      expect(verifyStoredOutput(receipt, daemon.stateDir)).toEqual([]);
    }, 30_000);
  },
);

describe('a quota reached while writes wait', () => {
  const quota = 3 * MiB + 123;
  let daemon: TestDaemon;
  beforeAll(async () => {
    daemon = await new TestDaemon({ config: { drain: { quotaBytes: quota, chunkBytes: MiB } } }).start();
  });
  afterAll(async () => {
    expect(await daemon.stop()).toEqual({ code: 0, signal: null });
  });

  it('stores exactly the quota of each of six 20 MiB floods, counts the rest as dropped, indexes exactly what is stored', async () => {
    const client = await daemon.client();
    const data = randomBytes(20 * MiB);
    const path = join(daemon.dir, 'flood');
    writeFileSync(path, data);
    const ids: string[] = [];
    for (let i = 0; i < 6; i++)
      ids.push(
        (await client.launch({ argv: ['sh', '-c', i % 2 ? `cat ${path}; cat ${path} >&2` : `dd if=${path} bs=65537 status=none`], cwd: '/' })).session_id,
      );
    for (const [i, id] of ids.entries()) {
      const r = await client.wait({ session_id: id });
      for (const stream of i % 2 ? (['stdout', 'stderr'] as const) : (['stdout'] as const)) {
        expect(r.output[stream]).toMatchObject({
          final_cursor: quota,
          dropped_bytes: 20 * MiB - quota,
          sha256: sha256(data.subarray(0, quota)),
          complete: false,
          reason: 'quota',
        });
        expect((await client.read({ session_id: id }, stream)).equals(data.subarray(0, quota))).toBe(true);
        expect(indexCoverage(daemon.stateDir, id, stream)).toEqual({ bytes: quota, contiguous: true });
      }
      expect(verifyStoredOutput(r, daemon.stateDir)).toEqual([]);
    }
  }, 30_000);
});

describe('a full state dir (64 MiB tmpfs, 4 MiB reserve) under ten streams at once', () => {
  let daemon: TestDaemon;
  const reserveBytes = 4 * MiB;
  beforeAll(async () => {
    daemon = new TestDaemon({ config: { storage: { reserveBytes, minFreeBytes: 16 * MiB, keepFreeBytes: 0 } } });
    mountState(daemon, 64);
    await daemon.start();
  });
  afterAll(async () => {
    expect(await unmountState(daemon)).toEqual({ code: 0, signal: null });
  });

  it('storing stops at the reserve, not at ENOSPC: bytes waiting for their write count as used', async () => {
    const client = await daemon.client();
    const ids: string[] = [];
    const lines = Array.from({ length: 20000 }, (_, i) => `${i}\n`).join('');
    const written = [...Array<number>(9).fill(16 * MiB), lines.length];
    // All admitted first (the sleep), then nine floods and one stream of short lines at once.
    for (let i = 0; i < 10; i++) {
      const script = i === 9 ? 'sleep 0.5; i=0; while [ $i -lt 20000 ]; do echo $i; i=$((i+1)); done' : 'sleep 0.5; head -c 16777216 /dev/zero';
      ids.push((await client.launch({ argv: ['sh', '-c', script], cwd: '/' })).session_id);
    }
    const receipts = await Promise.all(ids.map((session_id) => client.wait({ session_id })));
    for (const [i, r] of receipts.entries()) {
      const out = r.output.stdout!;
      expect(out.final_cursor + out.dropped_bytes).toBe(written[i]);
      expect(indexCoverage(daemon.stateDir, r.session_id, 'stdout')).toEqual({ bytes: out.final_cursor, contiguous: true });
      expect(verifyStoredOutput(r, daemon.stateDir)).toEqual([]);
    }
    expect(receipts.some((r) => r.output.stdout!.reason === 'disk_full')).toBe(true);
    // The reserve is left for index records and receipts (some of it they used).
    const s = statfsSync(daemon.stateDir);
    expect(s.bavail * s.bsize).toBeGreaterThan(reserveBytes / 2);
    await until(() => daemon.log().includes('the stream stopped storing'), 'the log');
    const stops = daemon
      .log()
      .split('\n')
      .filter((l) => l.includes('the stream stopped storing'));
    expect(stops.filter((l) => !l.includes('below the reserve'))).toEqual([]);
  }, 30_000);
});
