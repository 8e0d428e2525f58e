// Close is a join: seal stops admission (durably), close settles every session, waits for
// every receipt, scans the workspaces and returns a signed close receipt listing every
// receipt's digest; calling it again, even after a restart, returns the same one.
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SupervisorError } from '../../ipc/errors.js';
import type { CloseReceipt, SessionSummary } from '../../ipc/protocol.js';
import { receiptDigest } from '../../core/receipts/verify.js';
import { pidsWithMarker, PROGRAMS, type SbxResult, TestDaemon, until } from '../helpers/daemon.js';
import { makeDeepTree, makeMixedTree, pythonCloseDigest, removeTree } from '../helpers/workspace-trees.js';

let daemon: TestDaemon;
beforeAll(async () => {
  daemon = await new TestDaemon({ config: { logLevel: 'warn' } }).start();
});
afterAll(async () => {
  expect(await daemon.stop()).toEqual({ code: 0, signal: null });
});

describe('seal and close', () => {
  it('seal refuses new keys, close settles both running sessions and signs what it saw', async () => {
    const workspace = join(daemon.dir, 'workspace');
    const client = await daemon.client();
    const quick = await client.launch({
      argv: ['sh', '-c', `sleep 0.3; mkdir -p ${workspace}/sub; printf 12345 > ${workspace}/a; printf 123 > ${workspace}/sub/b`],
      cwd: '/',
      invocation_key: 'quick',
    });
    const stuck = await client.launch({ argv: ['sleep', '60'], cwd: '/', invocation_key: 'stuck', grace_ms: 500 });

    const sealed = await daemon.sbx(['seal', '--all', '--json']);
    expect(sealed.status).toBe(0);
    const seal = JSON.parse(sealed.stdout.toString());
    expect(seal).toMatchObject({ already_sealed: false, generation: expect.any(Number) });
    const refused = await client.launch({ argv: ['true'], cwd: '/', invocation_key: 'new' }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(SupervisorError);
    expect(refused).toMatchObject({ code: 'ADMISSION_SEALED', retryable: false, details: { generation: seal.generation } });
    const retry = await client.launch({ argv: ['sleep', '60'], cwd: '/', invocation_key: 'stuck', grace_ms: 500 });
    expect(retry).toMatchObject({ session_id: stuck.session_id, existing: true });

    const closed = await daemon.sbx(['close', '--all', '--timeout', '2s', '--workspace', workspace]);
    expect(closed.status, closed.stderr.toString()).toBe(0);
    const close = JSON.parse(closed.stdout.toString()) as CloseReceipt;
    const quickReceipt = await client.wait({ session_id: quick.session_id });
    const stuckReceipt = await client.wait({ session_id: stuck.session_id });
    expect(quickReceipt.outcome).toBe('exited');
    expect(stuckReceipt).toMatchObject({ outcome: 'cancelled', termination: { cause: 'close' }, exit: { signal: 'SIGTERM' } });
    expect(close).toMatchObject({
      version: 1,
      kind: 'close',
      sealed: { generation: seal.generation, sealed_at: seal.sealed_at },
      settle: { timeout_ms: 2000, terminated: 1 },
      signature: { alg: 'ed25519' },
    });
    expect(close.sessions).toEqual(
      [
        {
          session_id: quick.session_id,
          invocation_key: 'quick',
          task: 'default',
          state: 'ended',
          outcome: 'exited',
          receipt_sha256: receiptDigest(quickReceipt),
        },
        {
          session_id: stuck.session_id,
          invocation_key: 'stuck',
          task: 'default',
          state: 'ended',
          outcome: 'cancelled',
          receipt_sha256: receiptDigest(stuckReceipt),
        },
      ].sort((a, b) => (a.session_id < b.session_id ? -1 : 1)),
    );
    // The join over every task: the task close ran for default, its receipt's digest listed.
    const taskReceipt = JSON.parse(readFileSync(join(daemon.stateDir, 'tasks', createHash('sha256').update('default').digest('hex'), 'receipt.json'), 'utf8'));
    expect(taskReceipt).toMatchObject({ kind: 'task', task: 'default', complete: true, settle: { timeout_ms: 2000, terminated: 1 } });
    expect(close).toMatchObject({
      complete: true,
      tasks: [{ task: 'default', attempt: 1, complete: true, receipt_sha256: receiptDigest(taskReceipt), obligations: [] }],
    });
    expect(close.workspaces).toEqual([
      { path: workspace, files: 2, total_bytes: 8, newest_mtime: expect.any(String), digest: expect.stringMatching(/^sha256:[0-9a-f]{64}$/) },
    ]);

    const path = join(daemon.dir, 'close.json');
    writeFileSync(path, closed.stdout);
    const verified = await daemon.sbx(['verify', path, '--state-dir', daemon.stateDir]);
    expect(verified.stdout.toString()).toMatch(/^OK: close receipt signed by sha256:[0-9a-f]{64}; the 2 session receipts it lists match\n$/);
    expect(verified.status).toBe(0);

    // A changed receipt on disk no longer matches the close receipt.
    const stuckPath = join(daemon.stateDir, 'sessions', stuck.session_id, 'receipt.json');
    const original = readFileSync(stuckPath);
    writeFileSync(stuckPath, original.toString().replace('"cancelled"', '"exited"'));
    const tampered = await daemon.sbx(['verify', path, '--state-dir', daemon.stateDir]);
    expect(tampered.status).toBe(1);
    expect(tampered.stdout.toString()).toContain(`MISMATCH: ${stuck.session_id}: receipt digest`);
    writeFileSync(stuckPath, original);
    // So does changed stored output of a listed session.
    const chunk = join(daemon.stateDir, 'sessions', quick.session_id, 'stderr', '0000000000000000.chunk');
    writeFileSync(chunk, 'planted');
    const changedOutput = await daemon.sbx(['verify', path, '--state-dir', daemon.stateDir]);
    expect(changedOutput.status).toBe(1);
    expect(changedOutput.stdout.toString()).toContain(`MISMATCH: ${quick.session_id}: stderr: 7 bytes on disk, the receipt says 0`);
    rmSync(chunk);
    // And a changed task receipt.
    const taskPath = join(daemon.stateDir, 'tasks', createHash('sha256').update('default').digest('hex'), 'receipt.json');
    const taskOriginal = readFileSync(taskPath);
    writeFileSync(taskPath, taskOriginal.toString().replace('"attempt": 1', '"attempt": 7'));
    const changedTask = await daemon.sbx(['verify', path, '--state-dir', daemon.stateDir]);
    expect(changedTask.status).toBe(1);
    expect(changedTask.stdout.toString()).toMatch(
      /^MISMATCH: task "default": task receipt digest sha256:[0-9a-f]{64}, the close receipt says sha256:[0-9a-f]{64}\n$/,
    );
    writeFileSync(taskPath, taskOriginal);
    // A closed state dir is an archive: retention leaves it alone.
    expect(JSON.parse((await daemon.sbx(['gc', '--json'])).stdout.toString())).toEqual({ removed_output: [], retired: [], freed_bytes: 0, closed: true });

    // Idempotent, and durable across a restart: still sealed, the same close receipt.
    mkdirSync(join(workspace, 'later'));
    expect(JSON.parse((await daemon.sbx(['close', '--all', '--timeout', '1s'])).stdout.toString())).toEqual(close);
    await daemon.terminate();
    await daemon.start();
    const after = await daemon.client();
    expect(await after.closeSupervisor()).toEqual(close);
    await expect(after.launch({ argv: ['true'], cwd: '/', invocation_key: 'after-restart' })).rejects.toMatchObject({ code: 'ADMISSION_SEALED' });
    expect((await after.status()).admission).toBe('sealed');
  });
});

describe('status and stats', () => {
  it('status shows admission, storage and the machine; ps and receipts carry the cgroup usage', async () => {
    const d = await new TestDaemon({ config: { logLevel: 'warn' } }).start();
    try {
      const st = JSON.parse((await d.sbx(['status', '--json'])).stdout.toString());
      expect(st).toMatchObject({ admission: 'open', sealed: null, mode: 'cgroup', generation: 1 });
      expect(st.storage.free_bytes).toBeGreaterThan(0);
      expect(st.storage.state_dir_bytes).toBeGreaterThan(0); // keys, identity
      expect(st.storage).toMatchObject({ reserve_bytes: 64 * 2 ** 20, min_free_bytes: 256 * 2 ** 20, admits: true });
      expect(st.machine.mem_total_bytes).toBeGreaterThan(st.machine.mem_available_bytes);
      expect(st.machine.uptime_s).toBeGreaterThan(0);
      // Null until the supervisor has lived 200 ms (CpuLoad.MIN_SAMPLE_MS: a sample over less says
      // nothing; an sbx start can be quicker than that), then a percentage.
      expect(st.machine.cpu_load_percent === null || typeof st.machine.cpu_load_percent === 'number').toBe(true);
      const load = await until(async () => {
        const v = (JSON.parse((await d.sbx(['status', '--json'])).stdout.toString()) as typeof st).machine.cpu_load_percent as number | null;
        return v === null ? null : { v };
      }, 'a cpu_load_percent');
      expect(load.v).toBeGreaterThanOrEqual(0);
      expect(load.v).toBeLessThanOrEqual(100);
      const text = (await d.sbx(['status'])).stdout.toString();
      expect(text).toMatch(/^admission +open$/m);
      expect(text).toMatch(/^storage +[\d.]+ MiB in the state dir, \d+ MiB free/m);

      const client = await d.client();
      // A shell busy loop (no forks) runs until cancelled, once ps shows 0.1 s of CPU time.
      const busy = await client.launch({ argv: ['sh', '-c', 'while :; do :; done'], cwd: '/' });
      await until(async () => ((await client.ps()).sessions[0]?.usage.cpu_usec ?? 0) > 100_000, 'cpu time shows in ps while it runs');
      await client.request('cancel', { session_id: busy.session_id });
      const receipt = await client.wait({ session_id: busy.session_id });
      expect(receipt.usage.cpu_usec).toBeGreaterThan(100_000);
      const memoryOffered = readFileSync(join(d.cgroupBase!, 'sessions', 'cgroup.controllers'), 'utf8')
        .split(/\s+/)
        .includes('memory');
      if (memoryOffered) expect(receipt.usage).toMatchObject({ memory_controller: true, memory_peak_bytes: expect.any(Number), oom_kills: 0 });
      else {
        // This host binds memory to cgroup v1: the fields are absent, and said to be.
        expect(receipt.usage.memory_controller).toBe(false);
        expect(receipt.usage).not.toHaveProperty('memory_peak_bytes');
      }
      const ps = (await d.sbx(['ps', '--all'])).stdout.toString().split('\n');
      expect(ps[0]).toMatch(/^SESSION +STATUS +STARTED +DURATION +USER +TASK +PID +LIVE +CPU +MEM PEAK +KEY +COMMAND$/);
      expect(ps[1]).toMatch(
        new RegExp(`^${busy.session_id} +cancelled \\(SIG[A-Z]+\\), \\d+ (ms|s) ago +\\d+ (ms|s) ago +\\S+ s +- +default +\\d+ +- +\\d+\\.\\d\\ds `),
      );
    } finally {
      expect(await d.stop()).toEqual({ code: 0, signal: null });
    }
  });
});

describe('close with a session that loses its evidence', () => {
  it('does not wait for a receipt that can never come, and is not final while the session is unknown: exit 1, no close receipt written, the next close runs again', async () => {
    const d = await new TestDaemon({ config: { logLevel: 'error' } }).start();
    try {
      const client = await d.client();
      const doomed = await client.launch({ argv: ['sleep', '60'], cwd: '/', invocation_key: 'doomed', grace_ms: 200 });
      // A file where its receipt must go: the receipt write fails (never written through), so
      // the session ends unknown.
      writeFileSync(join(d.stateDir, 'sessions', doomed.session_id, 'receipt.json'), 'planted');
      const close = await client.closeSupervisor({ timeout_ms: 300 });
      expect(close.sessions).toEqual([
        { session_id: doomed.session_id, invocation_key: 'doomed', task: 'default', state: 'unknown', outcome: null, receipt_sha256: null },
      ]);
      expect(close.settle).toEqual({ timeout_ms: 300, terminated: 1, terminated_ids: [doomed.session_id] });
      expect(close).toMatchObject({
        complete: false,
        tasks: [
          {
            task: 'default',
            attempt: 1,
            complete: false,
            obligations: [expect.objectContaining({ authority: 'operator', condition: 'sessions_settled', session_id: doomed.session_id })],
          },
        ],
      });
      expect(existsSync(join(d.stateDir, 'close-receipt.json'))).toBe(false);
      // sbx close --all: exit 1, the obligation and why nothing is final on stderr; the next close is a new attempt.
      const again = await d.sbx(['close', '--all', '--timeout', '300ms']);
      expect(again.status).toBe(1);
      expect(again.stderr.toString()).toContain(
        `sbx: task "default" incomplete: operator must settle sessions_settled: session ${doomed.session_id} is unknown`,
      );
      expect(again.stderr.toString()).toContain(`sbx: session ${doomed.session_id} is unknown: the close is not final (close again once it has ended)\n`);
      expect(JSON.parse(again.stdout.toString())).toMatchObject({
        complete: false,
        settle: { timeout_ms: 300, terminated: 0 },
        tasks: [{ task: 'default', attempt: 2, complete: false }],
      });
      expect(existsSync(join(d.stateDir, 'close-receipt.json'))).toBe(false);
    } finally {
      expect(await d.stop()).toEqual({ code: 0, signal: null });
    }
  });
});

describe('close scans workspaces through directory fds (issue 15)', () => {
  it('a 2,100-deep tree and a mixed one (symlinks to / and /etc, a fifo, non-UTF-8 names): exit 0, the digests python3 computes', async () => {
    const trees = mkdtempSync(join(tmpdir(), 'sbx-close-trees-'));
    const d = await new TestDaemon({ config: { logLevel: 'warn' } }).start();
    try {
      const deep = join(trees, 'deep');
      const mixed = join(trees, 'mixed');
      makeDeepTree(deep, 2100);
      makeMixedTree(mixed, { nonUtf8: true });
      const closed = await d.sbx(['close', '--all', '--timeout', '1s', '--workspace', deep, '--workspace', mixed]);
      expect(closed.stderr.toString()).toBe('');
      expect(closed.status).toBe(0);
      const close = JSON.parse(closed.stdout.toString()) as CloseReceipt;
      const pyDeep = pythonCloseDigest(deep);
      const pyMixed = pythonCloseDigest(mixed);
      expect(pyDeep).toMatchObject({ files: 1, total_bytes: 2, entries: 2101 });
      expect(pyMixed).toMatchObject({ files: 11, total_bytes: 12, entries: 22 }); // /etc's files are not among them
      expect(close.workspaces).toEqual([
        { path: deep, files: 1, total_bytes: 2, newest_mtime: expect.any(String), digest: pyDeep.digest },
        { path: mixed, files: 11, total_bytes: 12, newest_mtime: expect.any(String), digest: pyMixed.digest },
      ]);
    } finally {
      removeTree(trees);
      expect(await d.stop()).toEqual({ code: 0, signal: null });
    }
  });

  it('a workspace that cannot be scanned: error and digest null in the signed receipt, exit 1, the supervisor still serves', async () => {
    const d = await new TestDaemon({ config: { logLevel: 'error' } }).start();
    try {
      const good = join(d.dir, 'good');
      mkdirSync(good);
      writeFileSync(join(good, 'f'), 'abc');
      const closed = await d.sbx(['close', '--all', '--timeout', '1s', '--workspace', '/does/not/exist', '--workspace', good]);
      expect(closed.status).toBe(1);
      expect(closed.stderr.toString()).toBe('sbx: workspace /does/not/exist was not scanned: ENOENT: opening the workspace root /does/not/exist failed\n');
      const close = JSON.parse(closed.stdout.toString()) as CloseReceipt;
      expect(close.workspaces).toEqual([
        {
          path: '/does/not/exist',
          files: 0,
          total_bytes: 0,
          newest_mtime: null,
          digest: null,
          error: 'ENOENT',
          error_message: 'ENOENT: opening the workspace root /does/not/exist failed',
        },
        { path: good, files: 1, total_bytes: 3, newest_mtime: expect.any(String), digest: pythonCloseDigest(good).digest },
      ]);
      // Signed as any close receipt; the same receipt (and status) on the next close.
      const path = join(d.dir, 'close.json');
      writeFileSync(path, closed.stdout);
      const verified = await d.sbx(['verify', path, '--state-dir', d.stateDir]);
      expect(verified.stdout.toString()).toMatch(/^OK: close receipt signed by sha256:[0-9a-f]{64}; the 0 session receipts it lists match\n$/);
      const again = await d.sbx(['close', '--all']);
      expect(again.status).toBe(1);
      expect(JSON.parse(again.stdout.toString())).toEqual(close);
      // Still serving.
      const st = await d.sbx(['status', '--json']);
      expect(st.status).toBe(0);
      expect(JSON.parse(st.stdout.toString())).toMatchObject({ admission: 'sealed' });
    } finally {
      expect(await d.stop()).toEqual({ code: 0, signal: null });
    }
  });
});

describe('close with a long timeout', () => {
  it("--timeout 25d (past setTimeout's 24.8 days) waits for sessions to end by themselves, never ends them at once", async () => {
    const d = await new TestDaemon({ config: { logLevel: 'warn' } }).start();
    try {
      const go = join(d.dir, 'go');
      const c = await d.client();
      const s = await c.launch({ argv: ['sh', '-c', `while [ ! -e ${go} ]; do sleep 0.05; done`], cwd: '/' });
      const closing = d.sbx(['close', '--all', '--timeout', '25d']);
      await until(async () => (await c.status()).admission === 'sealed', 'the close to seal');
      writeFileSync(go, ''); // it ends by itself once told to (an overflowing timer ends it at once: cancelled)
      const r = await closing;
      expect(r.status).toBe(0);
      const receipt = JSON.parse(r.stdout.toString()) as CloseReceipt;
      expect(receipt.settle).toEqual({ timeout_ms: 25 * 86_400_000, terminated: 0, terminated_ids: [] });
      expect(receipt.sessions).toEqual([expect.objectContaining({ session_id: s.session_id, outcome: 'exited' })]);
    } finally {
      await d.stop();
    }
  });
});

describe('sbx close and sbx seal name their scope', () => {
  it('neither --task nor --all: exit 125 naming both, nothing sent (the sandbox is not sealed, sbx run --task fresh still works); both: a contradiction', async () => {
    const d = await new TestDaemon({ config: { logLevel: 'warn' } }).start();
    try {
      for (const command of ['close', 'seal']) {
        const r = await d.sbx([command]);
        expect(r.status).toBe(125);
        expect(r.stdout.toString()).toBe('');
        expect(r.stderr.toString()).toBe(
          `sbx: INVALID_ARGUMENT: ${command} needs --task T (that task only) or --all (every task, the whole sandbox, for good); nothing was sent\n`,
        );
        const both = await d.sbx([command, '--task', 'T', '--all']);
        expect(both.status).toBe(125);
        expect(both.stderr.toString()).toBe(`sbx: INVALID_ARGUMENT: ${command}: --task and --all contradict each other (one task, or every task)\n`);
      }
      expect(existsSync(join(d.stateDir, 'seal.json'))).toBe(false);
      expect(existsSync(join(d.stateDir, 'tasks'))).toBe(false);
      const fresh = await d.sbx(['run', '--task', 'fresh', '--', 'echo', 'still open']);
      expect(fresh.stdout.toString()).toBe('still open\n');
      expect(fresh.status).toBe(0);
      expect(JSON.parse((await d.sbx(['status', '--json'])).stdout.toString())).toMatchObject({ admission: 'open', sealed: null });
      // --all is the sandbox-wide form.
      const sealed = await d.sbx(['seal', '--all']);
      expect(sealed.status).toBe(0);
      expect(sealed.stdout.toString()).toMatch(/^sealed at generation 1 \(/);
      expect((await d.sbx(['run', '--task', 'later', '--', 'true'])).status).toBe(125);
    } finally {
      expect(await d.stop()).toEqual({ code: 0, signal: null });
    }
  });
});

describe('close after a crash, with a TERM-ignoring session reconciliation is ending', () => {
  it(
    'waits for it up to its timeout (no receipt written meanwhile), then KILLs it: exit 0, the cgroup empty, the receipt says ended and terminated 1',
    { timeout: 90_000 },
    async () => {
      const d = await new TestDaemon({ config: { logLevel: 'warn' } }).start();
      try {
        const mark = `7${Math.floor(Math.random() * 1000)}.${process.pid}`;
        const c = await d.client();
        const { session_id } = await c.launch({
          argv: [join(PROGRAMS, 'ignore-sigterm'), mark],
          cwd: '/',
          invocation_key: 'stubborn',
          task: 'T',
          grace_ms: 45_000,
        });
        const leaf = join(d.cgroupBase!, 'sessions', session_id);
        await until(
          () =>
            readFileSync(join(leaf, 'cgroup.procs'), 'utf8')
              .split('\n')
              .some((pid) => pid && pidsWithMarker(mark).includes(Number(pid))),
          'the command to run in its leaf',
        );
        await d.kill9();
        await d.start();
        // Reconciliation TERMs the leaf (ignored), then waits its 45 s grace.
        await until(
          async () =>
            (JSON.parse((await d.sbx(['ps', '--json'])).stdout.toString()) as SessionSummary[])
              .find((s) => s.session_id === session_id)
              ?.reason?.includes('being ended'),
          'reconciliation to be ending it',
        );
        const started = Date.now();
        let answer: SbxResult | null = null;
        void d.sbx(['close', '--all', '--timeout', '3s']).then((r) => (answer = r));
        // For 2 s (of its 3): no answer, no close receipt, the session unknown and its process alive.
        await until(() => answer !== null || Date.now() - started >= 2000, '2 s of the close');
        expect(answer).toBeNull();
        expect(existsSync(join(d.stateDir, 'close-receipt.json'))).toBe(false);
        expect(pidsWithMarker(mark)).toHaveLength(1);
        const r = await until(() => answer, 'the close to answer', 30_000);
        const tookMs = Date.now() - started;
        expect(r.stderr.toString()).toBe('');
        expect(r.status).toBe(0);
        expect(tookMs).toBeGreaterThanOrEqual(3000);
        expect(tookMs).toBeLessThan(20_000); // not the 45 s grace
        expect(pidsWithMarker(mark)).toEqual([]);
        expect(!existsSync(leaf) || readFileSync(join(leaf, 'cgroup.procs'), 'utf8') === '').toBe(true);
        const close = JSON.parse(r.stdout.toString()) as CloseReceipt;
        expect(close).toMatchObject({ complete: true, settle: { timeout_ms: 3000, terminated: 1 }, tasks: [{ task: 'T', complete: true, obligations: [] }] });
        expect(close.sessions).toEqual([expect.objectContaining({ session_id, task: 'T', state: 'ended', outcome: 'owner_lost' })]);
        const receipt = await (await d.client()).wait({ session_id });
        expect(receipt).toMatchObject({ outcome: 'owner_lost', death: { evidence: 'cgroup_empty' } });
        expect(receipt.termination.steps.map((s) => s.signal)).toEqual(['SIGTERM', 'SIGKILL']);
        // Final now: written once, returned unchanged.
        expect(readFileSync(join(d.stateDir, 'close-receipt.json'), 'utf8')).toBe(JSON.stringify(close, null, 2) + '\n');
        expect(JSON.parse((await d.sbx(['close', '--all'])).stdout.toString())).toEqual(close);
      } finally {
        expect(await d.stop()).toEqual({ code: 0, signal: null });
      }
    },
  );
});
