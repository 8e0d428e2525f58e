// Operations that never lose evidence: a per-stream output quota, and a state dir that fills
// up (a 64 MiB tmpfs mounted for the test): the session keeps draining and ends, the receipt
// says what was dropped, every receipt on disk still verifies, and launches are refused
// (retryable) while space is low.
import { closeSync, existsSync, openSync, readdirSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SupervisorError } from '../../ipc/errors.js';
import type { Receipt, SessionSummary } from '../../ipc/protocol.js';
import { receiptDigest, verifyStoredOutput } from '../../core/receipts/verify.js';
import { PROGRAMS, TestDaemon, until } from '../helpers/daemon.js';
import { mountState, unmountState } from '../helpers/state-tmpfs.js';

const MiB = 1 << 20;

describe('output quota', () => {
  let daemon: TestDaemon;
  beforeAll(async () => {
    daemon = await new TestDaemon({ config: { drain: { quotaBytes: MiB, chunkBytes: 256 * 1024 } } }).start();
  });
  afterAll(async () => {
    expect(await daemon.stop()).toEqual({ code: 0, signal: null });
  });

  it('stores 1 MiB of 10, counts the other 9 MiB as dropped, and the producer exits normally', async () => {
    const client = await daemon.client();
    const { session_id } = await client.launch({ argv: ['sh', '-c', 'head -c 10485760 /dev/zero; echo done >&2'], cwd: '/' });
    const r = await client.wait({ session_id });
    expect(r.exit).toEqual({ code: 0, signal: null });
    expect(r.outcome).toBe('exited');
    expect(r.output.stdout).toMatchObject({ final_cursor: MiB, complete: false, reason: 'quota', dropped_bytes: 9 * MiB, drain_end: 'eof' });
    expect(r.output.stderr).toMatchObject({ final_cursor: 5, complete: true, reason: null, dropped_bytes: 0 });
    expect((await client.read({ session_id }, 'stdout')).equals(Buffer.alloc(MiB))).toBe(true);
    expect(verifyStoredOutput(r, daemon.stateDir)).toEqual([]);
    // sbx run exits with the command's status and says what was not stored.
    const run = await daemon.sbx(['run', '--', 'head', '-c', String(2 * MiB), '/dev/zero']);
    expect(run.status).toBe(0);
    expect(run.stdout.equals(Buffer.alloc(MiB))).toBe(true);
    expect(run.stderr.toString()).toMatch(/^sbx: stdout is incomplete: quota, 1048576 bytes not stored \(sbx receipt s-\S+\)\n$/);
  });
});

describe('a full state dir (64 MiB tmpfs)', () => {
  let daemon: TestDaemon;
  beforeAll(async () => {
    // keepFreeBytes 0: retention does not step in here (the keep-free rule has its own test).
    daemon = new TestDaemon({ config: { storage: { reserveBytes: 4 * MiB, minFreeBytes: 16 * MiB, keepFreeBytes: 0 } } });
    mountState(daemon, 64);
    await daemon.start();
  });
  afterAll(async () => {
    expect(await unmountState(daemon)).toEqual({ code: 0, signal: null });
  });

  it('a session writing 128 MiB ends, the supervisor stays up, the receipt says disk_full, nothing stored is corrupt', async () => {
    const client = await daemon.client();
    const small = await client.launch({ argv: ['sh', '-c', 'echo before'], cwd: '/' });
    const before = await client.wait({ session_id: small.session_id });
    const { session_id } = await client.launch({ argv: ['sh', '-c', 'head -c 134217728 /dev/zero; echo still-running >&2; exit 7'], cwd: '/' });
    const r = await client.wait({ session_id });
    expect(r.exit).toEqual({ code: 7, signal: null });
    const out = r.output.stdout!;
    expect(out).toMatchObject({ complete: false, reason: 'disk_full', drain_end: 'eof' });
    expect(out.final_cursor).toBeGreaterThan(0);
    expect(out.final_cursor).toBeLessThan(64 * MiB);
    expect(out.final_cursor + out.dropped_bytes).toBe(128 * MiB);
    // stderr came after the reserve was reached: dropped, counted, never half-written.
    expect(r.output.stderr!.final_cursor + r.output.stderr!.dropped_bytes).toBe('still-running\n'.length);
    for (const receipt of [before, r]) expect(verifyStoredOutput(receipt, daemon.stateDir)).toEqual([]);
    expect((await client.read({ session_id }, 'stdout')).equals(Buffer.alloc(out.final_cursor))).toBe(true);

    // Space is low now: a new launch is refused, retryably; the supervisor still serves.
    const refused = await client.launch({ argv: ['true'], cwd: '/' }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(SupervisorError);
    expect(refused).toMatchObject({ code: 'ADMISSION_DENIED', retryable: true });
    expect((await client.status()).pid).toBe(daemon.pid);
  });
});

/** Fills the file system at dir with a file until write(2) says ENOSPC; returns its path. */
function fillUp(dir: string): string {
  const path = join(dir, 'filler');
  const fd = openSync(path, 'a');
  try {
    for (const size of [MiB, 4096, 1]) {
      const buf = Buffer.alloc(size, 1);
      for (;;) {
        try {
          writeSync(fd, buf);
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code === 'ENOSPC') break;
          throw err;
        }
      }
    }
  } finally {
    closeSync(fd);
  }
  return path;
}

/** Whether a 4 KiB file can still be written at dir (the file system is not full). */
function hasRoom(dir: string): boolean {
  const probe = join(dir, 'probe');
  try {
    writeFileSync(probe, Buffer.alloc(4096));
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOSPC') return false;
    throw err;
  } finally {
    rmSync(probe, { force: true });
  }
}

describe('receipts on a full disk (16 MiB tmpfs)', () => {
  // keepFreeBytes 0: retention never frees space here; the test fills the disk itself.
  const config = { storage: { reserveBytes: 0, minFreeBytes: MiB, keepFreeBytes: 0 }, drain: { chunkBytes: 4096 } };
  const go = (d: TestDaemon, name: string) => join(d.dir, name);
  const waitForGo = (path: string, before = '') => ['sh', '-c', `${before}while [ ! -e ${path} ]; do sleep 0.02; done; exit 3`];

  it('ENOSPC when the receipt is written loses nothing: it goes into the space reserved at admission', async () => {
    const daemon = new TestDaemon({ config });
    mountState(daemon, 16);
    try {
      await daemon.start();
      const client = await daemon.client();
      const { session_id } = await client.launch({ argv: waitForGo(go(daemon, 'go')), cwd: '/', invocation_key: 'full' });
      fillUp(daemon.stateDir);
      expect(hasRoom(daemon.stateDir)).toBe(false); // the session ends on a full disk
      writeFileSync(go(daemon, 'go'), '');
      const r = await client.wait({ session_id });
      expect(r).toMatchObject({ outcome: 'exited', exit: { code: 3, signal: null }, death: { evidence: 'cgroup_empty' } });
      expect(verifyStoredOutput(r, daemon.stateDir)).toEqual([]);
      expect((await daemon.sbx(['wait', '--key', 'full'])).status).toBe(3);
    } finally {
      expect(await unmountState(daemon)).toEqual({ code: 0, signal: null });
    }
  });

  it('a crash after the receipt reached its reservation and before it was linked: the restart publishes it, exit 3 kept', async () => {
    const daemon = new TestDaemon({ config, env: { SBX_FAULT_POINT: 'durable:receipt.json:before-link' } });
    mountState(daemon, 16);
    try {
      await daemon.start();
      const client = await daemon.client();
      const { session_id } = await client.launch({ argv: waitForGo(go(daemon, 'go')), cwd: '/', invocation_key: 'crash' });
      const filler = fillUp(daemon.stateDir);
      writeFileSync(go(daemon, 'go'), '');
      expect(await daemon.exitedNow()).toEqual({ code: null, signal: 'SIGKILL' });
      rmSync(filler); // a start bumps the generation durably: it needs a few KiB
      await daemon.withEnv(undefined).start();
      const r = JSON.parse((await daemon.sbx(['receipt', session_id])).stdout.toString()) as Receipt;
      expect(r).toMatchObject({ session_id, outcome: 'exited', exit: { code: 3, signal: null }, death: { evidence: 'cgroup_empty' } });
      expect(r.supervisor.generation).toBe(1); // the receipt of the supervisor that saw the end
      expect(readdirSync(join(daemon.stateDir, 'sessions', session_id)).sort()).toEqual(['admission.json', 'receipt.json', 'started.json', 'stderr', 'stdout']);
      expect(verifyStoredOutput(r, daemon.stateDir)).toEqual([]);
    } finally {
      expect(await unmountState(daemon)).toEqual({ code: 0, signal: null });
    }
  });

  it('a receipt larger than its reservation: its facts go into the reservation; it waits for space, across a restart on the full disk too', async () => {
    const daemon = new TestDaemon({ config });
    mountState(daemon, 128);
    try {
      await daemon.start();
      const client = await daemon.client();
      // 64 MiB in 4 KiB chunks: the receipt lists 16,384 chunks (~650 KiB), past its reservation.
      const { session_id } = await client.launch({ argv: waitForGo(go(daemon, 'go'), `head -c ${64 * MiB} /dev/zero; `), cwd: '/', invocation_key: 'big' });
      await until(
        async () => (await client.ps()).sessions.find((s) => s.session_id === session_id)?.cursors.stdout === 64 * MiB,
        'the output to be stored',
        60_000,
      );
      // A wait with unknown "fail" (the clients' run()) never takes a receipt waiting for space for a stuck session.
      const failWait = client.wait({ session_id }, { unknown: 'fail' }).then(
        (r) => r,
        (e: unknown) => e,
      );
      const filler = fillUp(daemon.stateDir);
      writeFileSync(go(daemon, 'go'), '');
      const row = async () => (JSON.parse((await daemon.sbx(['ps', '--json'])).stdout.toString()) as SessionSummary[]).find((s) => s.session_id === session_id);
      const waiting = await until(async () => ((await row())?.state === 'unknown' ? row() : null), 'the session to wait for space');
      expect(waiting).toMatchObject({
        receipt_pending: true,
        reason: expect.stringMatching(/ENOSPC.*its facts are kept in its reservation and the write is retried until space returns/),
      });
      expect(await Promise.race([failWait, Promise.resolve('still waiting')])).toBe('still waiting');
      const resolve = await daemon.sbx(['resolve', session_id, '--as-operator', '--reason', 'no']);
      expect(resolve.status).toBe(125);
      expect(resolve.stderr.toString()).toContain('waits for space');
      // A crash now, and a start on the still full disk: the facts come back from the reservation.
      await daemon.kill9();
      expect(hasRoom(daemon.stateDir)).toBe(false);
      await daemon.start();
      expect(await row()).toMatchObject({
        state: 'unknown',
        receipt_pending: true,
        reason: expect.stringContaining('kept in its reservation across a restart'),
      });
      expect((await daemon.sbx(['status', '--json'])).stdout.toString()).toContain('"admission": "disk_low"');
      const receipt = (await daemon.client()).wait({ session_id }, { unknown: 'fail' });
      rmSync(filler);
      const r = await receipt;
      expect(r).toMatchObject({ outcome: 'exited', exit: { code: 3, signal: null }, death: { evidence: 'cgroup_empty' } });
      expect(r.supervisor.generation).toBe(1); // the supervisor that saw it end
      expect(r.output.stdout!.chunks).toHaveLength(16384);
      expect(verifyStoredOutput(r, daemon.stateDir)).toEqual([]);
    } finally {
      expect(await unmountState(daemon)).toEqual({ code: 0, signal: null });
    }
  }, 120_000);
});

describe('retention on a full disk (16 MiB tmpfs, filled from outside)', () => {
  it('frees ended output without a free block: rename first, files, then the marker', async () => {
    const daemon = new TestDaemon({ config: { retention: { intervalMs: 0 } } });
    mountState(daemon, 16);
    try {
      await daemon.start();
      const client = await daemon.client();
      const { session_id } = await client.launch({ argv: ['head', '-c', String(4 * MiB), '/dev/zero'], cwd: '/' });
      const r = await client.wait({ session_id });
      fillUp(daemon.stateDir);
      expect(hasRoom(daemon.stateDir)).toBe(false);
      const gc = await daemon.sbx(['gc', '--json']);
      expect(gc.stderr.toString()).toBe('');
      expect(gc.status).toBe(0);
      expect(JSON.parse(gc.stdout.toString())).toMatchObject({ removed_output: [session_id], freed_bytes: expect.any(Number) });
      await expect(client.read({ session_id }, 'stdout')).rejects.toMatchObject({ code: 'OUTPUT_REMOVED' });
      expect(readdirSync(join(daemon.stateDir, 'sessions', session_id)).sort()).toEqual([
        'admission.json',
        'output-removed.json',
        'receipt.json',
        'started.json',
      ]);
      expect((await client.receipt({ session_id })).receipt).toEqual(r);
      expect((await daemon.sbx(['run', '--', 'echo', 'admitted'])).stdout.toString()).toBe('admitted\n');
    } finally {
      expect(await unmountState(daemon)).toEqual({ code: 0, signal: null });
    }
  });
});

describe('a small state dir keeps itself usable (64 MiB tmpfs, default thresholds)', () => {
  let daemon: TestDaemon;
  beforeAll(async () => {
    daemon = new TestDaemon({ config: { retention: { intervalMs: 0 } } });
    mountState(daemon, 64);
    await daemon.start();
  });
  afterAll(async () => {
    expect(await unmountState(daemon)).toEqual({ code: 0, signal: null });
  });

  it('scales its thresholds to the file system, so launches are admitted at all', async () => {
    const status = JSON.parse((await daemon.sbx(['status', '--json'])).stdout.toString());
    expect(status.storage).toMatchObject({
      total_bytes: 64 * MiB,
      reserve_bytes: Math.floor(64 * MiB * 0.05),
      min_free_bytes: Math.floor(64 * MiB * 0.1),
      keep_free_bytes: Math.floor(64 * MiB * 0.15),
    });
    expect(status.admission).toBe('open');
    expect((await daemon.sbx(['run', '--', 'echo', 'ok'])).stdout.toString()).toBe('ok\n');
  });

  it('keep-free steps in while a stream is still storing, so it is not cut at the reserve', async () => {
    const client = await daemon.client();
    const a = await client.launch({ argv: ['head', '-c', String(30 * MiB), '/dev/zero'], cwd: '/' });
    expect((await client.wait({ session_id: a.session_id })).output.stdout).toMatchObject({ final_cursor: 30 * MiB, complete: true });
    expect((await client.read({ session_id: a.session_id }, 'stdout')).length).toBe(30 * MiB); // 34 MiB free: kept
    // 32 MiB more would leave 2 MiB, under the 3.2 MiB reserve: A's output goes on the way.
    const b = await client.launch({ argv: ['head', '-c', String(32 * MiB), '/dev/zero'], cwd: '/' });
    expect((await client.wait({ session_id: b.session_id })).output.stdout).toMatchObject({ final_cursor: 32 * MiB, complete: true, reason: null });
    await expect(client.read({ session_id: a.session_id }, 'stdout')).rejects.toMatchObject({ code: 'OUTPUT_REMOVED' });
  });

  it('after a flood fills it, the oldest ended output goes by itself and admission reopens; a running flood is never touched', async () => {
    const client = await daemon.client();
    const flood = await client.launch({ argv: [join(PROGRAMS, 'flood-stdout'), String(200 * MiB)], cwd: '/', invocation_key: 'flood-1' });
    const r = await client.wait({ session_id: flood.session_id });
    expect(r.output.stdout).toMatchObject({ complete: false, reason: 'disk_full' });
    // Its end left free space under the keep-free target: the oldest ended output goes (the
    // earlier test's, then this one's if need be) until it is above; receipts stay.
    await until(async () => {
      const st = (await client.status()).storage;
      return st.free_bytes >= st.keep_free_bytes;
    }, 'keep-free to bring free space back above its target');
    expect((await client.receipt({ session_id: flood.session_id })).receipt).toEqual(r);
    expect((await daemon.sbx(['run', '--', 'echo', 'admitted'])).stdout.toString()).toBe('admitted\n');

    // A running flood holding the space: admission is refused and status says why. It writes
    // at about 20 MiB/s, so that retention, which steps in at keep-free, removes the older
    // ended output while the flood still stores and the flood fills that space too: at full
    // speed it could be cut at the reserve first, and retention freeing space after the cut
    // reopened admission for good (a stored stream is never resumed: no gap in a log).
    const live = await client.launch({
      argv: ['sh', '-c', `i=0; while [ $i -lt 200 ]; do head -c ${MiB} /dev/zero; sleep 0.05; i=$((i+1)); done; exec sleep 60`],
      cwd: '/',
      invocation_key: 'flood-2',
    });
    const refused = await until(
      async () => {
        const s = JSON.parse((await daemon.sbx(['status', '--json'])).stdout.toString());
        return s.admission === 'disk_low' ? s : null;
        // The flood has to fill the state dir first, each poll is an sbx process: 30 s for a loaded machine.
      },
      'admission to close for disk low',
      30_000,
    );
    expect(refused.admission_reason).toMatch(
      /^disk low: \d+ bytes free in the state dir, \d+ needed; retention removes the oldest ended sessions' output while less than \d+ is free/,
    );
    // While the flood writes, retention removing older output can reopen admission for a moment
    // before the flood fills the space again: each of these is polled until it sees disk low.
    const text = await until(
      async () => {
        const out = (await daemon.sbx(['status'])).stdout.toString();
        return /admission\s+disk_low/.test(out) ? out : null;
      },
      'sbx status to say disk low',
      30_000,
    );
    expect(text).toMatch(/admission\s+disk_low: disk low/);
    const denied = await until(
      async () => {
        const e = await client.launch({ argv: ['true'], cwd: '/' }).catch((err: unknown) => err);
        return (e as { code?: string }).code === 'ADMISSION_DENIED' ? e : null;
      },
      'a launch refused for disk low',
      30_000,
    );
    expect(denied).toMatchObject({
      code: 'ADMISSION_DENIED',
      retryable: true,
      details: { reason: 'disk_low', free_bytes: expect.any(Number), min_free_bytes: refused.storage.min_free_bytes },
    });
    expect((await client.gc()).removed_output).not.toContain(live.session_id); // running output is never removed
    expect((await client.read({ session_id: live.session_id }, 'stdout')).length).toBeGreaterThan(0);
    await client.request('cancel', { session_id: live.session_id });
    await client.wait({ session_id: live.session_id });
    await until(async () => (await client.status()).admission === 'open', 'admission to reopen once the flood ended');
  });
});

describe('thresholds that can never be met', () => {
  it('are named at start-up; status says admission is refused and why', async () => {
    const daemon = new TestDaemon({ config: { storage: { minFreeBytes: 2 ** 52 } } });
    try {
      await daemon.start();
      await until(() => daemon.log().includes('admission can never open'), 'the start-up warning in the log');
      const status = JSON.parse((await daemon.sbx(['status', '--json'])).stdout.toString());
      expect(status.admission).toBe('disk_low');
    } finally {
      await daemon.stop();
    }
  });
});

describe('retention', () => {
  let daemon: TestDaemon;
  const config = { retention: { outputMaxTotalBytes: 2.5 * MiB, outputMaxAgeMs: 24 * 3600 * 1000, receiptMaxAgeMs: 0, intervalMs: 0 } };
  beforeAll(async () => {
    daemon = await new TestDaemon({ config }).start();
  });
  afterAll(async () => {
    expect(await daemon.stop()).toEqual({ code: 0, signal: null });
  });

  it('removes the oldest finished output first, never a running one, keeps receipts, and keys stay used', async () => {
    let client = await daemon.client();
    const ended: string[] = [];
    for (const key of ['k1', 'k2', 'k3']) {
      const { session_id } = await client.launch({ argv: ['head', '-c', String(MiB), '/dev/zero'], cwd: '/', invocation_key: key });
      await client.wait({ session_id });
      ended.push(session_id);
    }
    const running = await client.launch({ argv: ['sh', '-c', 'head -c 1048576 /dev/zero; exec sleep 60'], cwd: '/', invocation_key: 'live' });
    await until(async () => (await client.read({ session_id: running.session_id }, 'stdout')).length === MiB, 'the running session wrote 1 MiB');

    const gc = await daemon.sbx(['gc', '--json']);
    expect(gc.status, gc.stderr.toString()).toBe(0);
    // 4 MiB stored, 2.5 MiB allowed: the two oldest finished sessions lose their output.
    expect(JSON.parse(gc.stdout.toString())).toMatchObject({ removed_output: [ended[0], ended[1]], retired: [], freed_bytes: expect.any(Number) });
    await expect(client.read({ session_id: ended[0] }, 'stdout')).rejects.toMatchObject({ code: 'OUTPUT_REMOVED' });
    expect((await client.receipt({ session_id: ended[0] })).receipt!.output.stdout!.final_cursor).toBe(MiB);
    expect((await client.read({ session_id: ended[2] }, 'stdout')).equals(Buffer.alloc(MiB))).toBe(true);
    expect((await client.read({ session_id: running.session_id }, 'stdout')).length).toBe(MiB);
    expect((await client.ps()).sessions.map((s) => s.session_id)).toEqual([running.session_id]);
    const again = await client.launch({ argv: ['head', '-c', String(MiB), '/dev/zero'], cwd: '/', invocation_key: 'k1' });
    expect(again).toMatchObject({ session_id: ended[0], existing: true });
    // Replaying it through sbx still ends with the recorded status, saying the output is gone.
    const replay = await daemon.sbx(['run', '--key', 'k1', '--cwd', '/', '--', 'head', '-c', String(MiB), '/dev/zero']);
    expect(replay.status).toBe(0);
    expect(replay.stdout.length).toBe(0);
    expect(replay.stderr.toString()).toMatch(/^sbx: session \S+: its output was removed by the retention policy/);
    const receiptPath = join(daemon.dir, 'k1.json');
    writeFileSync(receiptPath, JSON.stringify((await client.receipt({ session_id: ended[0] })).receipt));
    const verify = await daemon.sbx(['verify', receiptPath, '--state-dir', daemon.stateDir]);
    expect(verify.status).toBe(1);
    expect(verify.stdout.toString()).toContain('removed by the retention policy');

    // Receipts older than receiptMaxAgeMs go too, whole, after a restart; keys still answer.
    await client.request('cancel', { session_id: running.session_id });
    await client.wait({ session_id: running.session_id });
    await daemon.terminate();
    (daemon as unknown as { options: { config: typeof config } }).options.config = { retention: { ...config.retention, receiptMaxAgeMs: 1 } };
    await daemon.start();
    client = await daemon.client();
    const live = await client.launch({ argv: ['sleep', '60'], cwd: '/', invocation_key: 'live-2' });
    const retired = await client.gc();
    expect(retired.retired.sort()).toEqual([...ended, running.session_id].sort());
    expect((await client.ps()).sessions.map((s) => s.session_id)).toEqual([live.session_id]);
    await expect(client.receipt({ session_id: ended[2] })).rejects.toMatchObject({
      code: 'SESSION_NOT_FOUND',
      message: expect.stringContaining('removed by the retention policy'),
    });
    expect(await client.launch({ argv: ['head', '-c', String(MiB), '/dev/zero'], cwd: '/', invocation_key: 'k3' })).toMatchObject({
      session_id: ended[2],
      existing: true,
      state: 'retired',
    });
    expect(existsSync(join(daemon.stateDir, 'sessions', ended[2]))).toBe(false);
    expect(readdirSync(join(daemon.stateDir, 'keys')).filter((n) => n.endsWith('.json'))).toHaveLength(5); // k1, k2, k3, live, live-2: none removed
    // A retirement a crash interrupted after its tombstone: the restart finishes it.
    const k4 = await client.launch({ argv: ['true'], cwd: '/', invocation_key: 'k4' });
    const k4Receipt = await client.wait({ session_id: k4.session_id });
    writeFileSync(
      join(daemon.stateDir, 'retired', `${k4.session_id}.json`),
      JSON.stringify({
        session_id: k4.session_id,
        invocation_key: 'k4',
        command_digest: k4.command_digest,
        outcome: 'exited',
        ended_at: k4Receipt.ended_at,
        receipt_sha256: receiptDigest(k4Receipt),
        retired_at: new Date().toISOString(),
      }),
    );
    await daemon.kill9();
    await daemon.start(); // tombstones survive a restart: the keys still do not run again
    client = await daemon.client();
    expect(await client.launch({ argv: ['head', '-c', String(MiB), '/dev/zero'], cwd: '/', invocation_key: 'k3' })).toMatchObject({
      session_id: ended[2],
      existing: true,
      state: 'retired',
    });
    expect(await client.launch({ argv: ['true'], cwd: '/', invocation_key: 'k4' })).toMatchObject({
      session_id: k4.session_id,
      existing: true,
      state: 'retired',
    });
    expect(existsSync(join(daemon.stateDir, 'sessions', k4.session_id))).toBe(false);
    expect(readdirSync(join(daemon.stateDir, 'sessions')).filter((n) => n.startsWith('.retiring-'))).toEqual([]);
    // Retention goes on working: live-2, settled owner_lost by the restart, is past the age.
    expect((await client.wait({ session_id: live.session_id })).outcome).toBe('owner_lost');
    expect((await client.gc()).retired).toEqual([live.session_id]);
  });
});
