// Process ownership end to end: output drained while nobody reads, setsid and background
// descendants ended with cgroup proof, orphans reaped, and the two clocks (leader exit vs
// stream EOF) kept apart.
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Receipt } from '../../ipc/protocol.js';
import { pidsWithMarker, PROGRAMS, sha256, TestDaemon, until, zombieChildren } from '../helpers/daemon.js';

let daemon: TestDaemon;
beforeAll(async () => {
  daemon = await new TestDaemon().start();
});
afterAll(async () => {
  expect(await daemon.stop()).toEqual({ code: 0, signal: null });
});

/** A sleep duration nobody else on the machine uses, so its processes can be found. */
const marker = () => `3${randomBytes(3).readUIntBE(0, 3) % 100}.${randomBytes(3).readUIntBE(0, 3)}`;

describe('drain', () => {
  it('captures one 4 MiB line plus newline byte-exact while nobody reads', async () => {
    const client = await daemon.client();
    const launched = await client.launch({ argv: ['sh', '-c', 'head -c 4194304 /dev/zero | tr "\\0" a; echo'], cwd: '/' });
    const receipt = await client.wait({ session_id: launched.session_id });
    const expected = Buffer.concat([Buffer.alloc(4 * 1024 * 1024, 'a'), Buffer.from('\n')]);
    expect(receipt.exit.code).toBe(0);
    expect(receipt.output.stdout).toMatchObject({ final_cursor: expected.length, sha256: sha256(expected), complete: true });
    const stored = await client.read({ session_id: launched.session_id }, 'stdout');
    expect(stored.equals(expected)).toBe(true);
  });

  it('captures 32 MiB of /dev/urandom on stdout and 1 MiB on stderr at once, nobody reading', async () => {
    const client = await daemon.client();
    // tee keeps an independent copy of exactly what the command wrote.
    const copyOut = join(daemon.dir, 'urandom-out.bin');
    const copyErr = join(daemon.dir, 'urandom-err.bin');
    const launched = await client.launch({
      argv: ['sh', '-c', `head -c 1048576 /dev/urandom | tee ${copyErr} >&2 & head -c 33554432 /dev/urandom | tee ${copyOut}; wait`],
      cwd: '/',
    });
    const receipt = await client.wait({ session_id: launched.session_id });
    expect(receipt.exit.code).toBe(0);
    const out = readFileSync(copyOut);
    const err = readFileSync(copyErr);
    expect(out.length).toBe(32 * 1024 * 1024);
    expect(receipt.output.stdout).toMatchObject({ final_cursor: out.length, sha256: sha256(out), complete: true, dropped_bytes: 0 });
    expect(receipt.output.stderr).toMatchObject({ final_cursor: err.length, sha256: sha256(err), complete: true });
    // The stored log reads back to the same digest through the socket.
    const stored = await client.read({ session_id: launched.session_id }, 'stdout');
    expect(createHash('sha256').update(stored).digest('hex')).toBe(sha256(out));
  });

  it('records a per-read index whose reads tile the stream', async () => {
    const client = await daemon.client();
    const launched = await client.launch({ argv: ['sh', '-c', 'for i in 1 2 3; do echo chunk$i; sleep 0.05; done'], cwd: '/' });
    const receipt = await client.wait({ session_id: launched.session_id });
    const { decodeIndex } = await import('../../core/state/stream-files.js');
    const indexBytes = readFileSync(join(daemon.stateDir, 'sessions', launched.session_id, 'stdout', 'index.bin'));
    expect(sha256(indexBytes)).toBe(receipt.output.stdout!.index_sha256);
    const records = decodeIndex(indexBytes);
    let cursor = 0;
    for (const r of records) {
      expect(r.stream).toBe(0);
      expect(r.cursor).toBe(cursor);
      cursor += r.length;
    }
    expect(cursor).toBe(receipt.output.stdout!.final_cursor);
    expect(records.length).toBeGreaterThanOrEqual(3);
    const started = Date.parse(receipt.started_at!) * 1000;
    for (const r of records) expect(r.arrivalUs).toBeGreaterThanOrEqual(started - 1000);
  });
});

describe('descendants', () => {
  it('with --linger kill, ends setsid and background descendants when the leader exits, with cgroup proof', async () => {
    const a = marker();
    const b = marker();
    const t0 = performance.now();
    const receiptPath = join(daemon.dir, 'setsid-receipt.json');
    const r = await daemon.sbx(['run', '--linger', 'kill', '--receipt', receiptPath, '--', 'sh', '-c', `(setsid sleep ${a} &); (sleep ${b} &); echo started`]);
    const wallMs = performance.now() - t0;
    expect(r.status).toBe(0);
    expect(r.stdout.toString()).toBe('started\n');
    const receipt = JSON.parse(readFileSync(receiptPath, 'utf8')) as Receipt;
    expect(receipt.death.evidence).toBe('cgroup_empty');
    expect(receipt.descendants_terminated).toBeGreaterThanOrEqual(2);
    expect(receipt.termination.cause).toBe('linger');
    expect(receipt.termination.steps[0]).toMatchObject({ signal: 'SIGTERM' });
    expect(receipt.outcome).toBe('exited');
    expect(pidsWithMarker(a)).toEqual([]);
    expect(pidsWithMarker(b)).toEqual([]);
    // "well under a second" on a quiet machine; the bound leaves room for a loaded one.
    expect(Date.parse(receipt.ended_at) - Date.parse(receipt.admitted_at)).toBeLessThan(1000);
    expect(wallMs).toBeLessThan(3000);
    // The leaf is gone once the receipt is out.
    await until(() => !existsSync(join(daemon.cgroupBase!, 'sessions', receipt.session_id)), 'the session leaf to be removed');
  });

  it('reaps 100 orphans: no zombie is left under the supervisor', async () => {
    const r = await daemon.sbx(['run', '--', join(PROGRAMS, 'spawn-orphans'), '100']);
    expect(r.status).toBe(0);
    expect(r.stdout.toString()).toBe('done\n');
    await until(() => zombieChildren(daemon.pid).length === 0, 'zombies under the supervisor to be reaped', 5000);
  });

  it('records leader_exited_at when the leader is reaped, not when a grandchild closes stdout', async () => {
    const receiptPath = join(daemon.dir, 'grandchild-receipt.json');
    const r = await daemon.sbx(['run', '--linger', 'wait', '--receipt', receiptPath, '--', 'sh', '-c', '(sleep 1.5; echo late) & echo early']);
    expect(r.stdout.toString()).toBe('early\nlate\n');
    const receipt = JSON.parse(readFileSync(receiptPath, 'utf8')) as Receipt;
    const started = Date.parse(receipt.started_at!);
    const leaderExited = Date.parse(receipt.leader_exited_at!);
    const ended = Date.parse(receipt.ended_at);
    expect(leaderExited - started).toBeLessThan(1000);
    expect(ended - leaderExited).toBeGreaterThanOrEqual(1400);
    expect(receipt.termination.cause).toBeNull();
    expect(receipt.descendants_terminated).toBe(0);
  });

  it('ends a grandchild holding stdout with --linger kill, promptly', async () => {
    const m = marker();
    const receiptPath = join(daemon.dir, 'holder-receipt.json');
    const r = await daemon.sbx(['run', '--linger', 'kill', '--receipt', receiptPath, '--', 'sh', '-c', `sleep ${m} & echo output`]);
    expect(r.stdout.toString()).toBe('output\n');
    const receipt = JSON.parse(readFileSync(receiptPath, 'utf8')) as Receipt;
    expect(receipt.descendants_terminated).toBe(1);
    expect(receipt.output.stdout).toMatchObject({ complete: true, drain_end: 'eof' });
    expect(Date.parse(receipt.ended_at) - Date.parse(receipt.leader_exited_at!)).toBeLessThan(1000);
    expect(pidsWithMarker(m)).toEqual([]);
  });
});
