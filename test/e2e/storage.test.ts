// Operations that never lose evidence: a per-stream output quota, and a state dir that fills
// up (a 64 MiB tmpfs mounted for the test): the session keeps draining and ends, the receipt
// says what was dropped, every receipt on disk still verifies, and launches are refused
// (retryable) while space is low.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SupervisorError } from '../../ipc/errors.js';
import { verifyStoredOutput } from '../../ipc/verify.js';
import { TestDaemon, until } from '../helpers/daemon.js';

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
  });
});

describe('a full state dir (64 MiB tmpfs)', () => {
  let daemon: TestDaemon;
  let mounted = false;
  beforeAll(async () => {
    daemon = new TestDaemon({ config: { storage: { reserveBytes: 4 * MiB, minFreeBytes: 16 * MiB } } });
    mkdirSync(daemon.stateDir, { recursive: true });
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=64m,mode=0700', 'tmpfs', daemon.stateDir]);
    mounted = true;
    await daemon.start();
  });
  afterAll(async () => {
    const exit = await daemon.terminate();
    if (mounted) execFileSync('umount', [daemon.stateDir]);
    await daemon.stop();
    expect(exit).toEqual({ code: 0, signal: null });
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
    await expect(client.receipt({ session_id: ended[2] })).rejects.toMatchObject({ code: 'SESSION_NOT_FOUND', message: expect.stringContaining('removed by the retention policy') });
    expect(await client.launch({ argv: ['head', '-c', String(MiB), '/dev/zero'], cwd: '/', invocation_key: 'k3' })).toMatchObject({ session_id: ended[2], existing: true, state: 'retired' });
    expect(existsSync(join(daemon.stateDir, 'sessions', ended[2]))).toBe(false);
    expect(readdirSync(join(daemon.stateDir, 'keys')).filter((n) => n.endsWith('.json'))).toHaveLength(5); // k1, k2, k3, live, live-2: none removed
    // A retirement a crash interrupted after its tombstone: the restart finishes it.
    const k4 = await client.launch({ argv: ['true'], cwd: '/', invocation_key: 'k4' });
    const k4Receipt = await client.wait({ session_id: k4.session_id });
    writeFileSync(
      join(daemon.stateDir, 'retired', `${k4.session_id}.json`),
      JSON.stringify({ session_id: k4.session_id, invocation_key: 'k4', command_digest: k4.command_digest, outcome: 'exited', ended_at: k4Receipt.ended_at, receipt_sha256: 'sha256:x', retired_at: new Date().toISOString() }),
    );
    await daemon.kill9();
    await daemon.start(); // tombstones survive a restart: the keys still do not run again
    client = await daemon.client();
    expect(await client.launch({ argv: ['head', '-c', String(MiB), '/dev/zero'], cwd: '/', invocation_key: 'k3' })).toMatchObject({ session_id: ended[2], existing: true, state: 'retired' });
    expect(await client.launch({ argv: ['true'], cwd: '/', invocation_key: 'k4' })).toMatchObject({ session_id: k4.session_id, existing: true, state: 'retired' });
    expect(existsSync(join(daemon.stateDir, 'sessions', k4.session_id))).toBe(false);
    expect(readdirSync(join(daemon.stateDir, 'sessions')).filter((n) => n.startsWith('.retiring-'))).toEqual([]);
    // Retention goes on working: live-2, settled owner_lost by the restart, is past the age.
    expect((await client.gc()).retired).toEqual([live.session_id]);
  });
});
