// sbx run and the supervisor going away or saying "not now": a launch survives a drop before
// its answer and a supervisor that refuses connections for a while (it holds an invocation
// key, so the resend finds the same session), says once on stderr that it waits, and
// --detach never waits on a refusal. A retry never changes how an existing session ends.
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { constants as osConstants } from 'node:os';
import { afterEach, describe, expect, it } from 'vitest';
import { SupervisorClient } from '../../ipc/client.js';
import { exitStatusOf, type Receipt, type SessionSummary } from '../../ipc/protocol.js';
import { pidsWithMarker, SBX, TestDaemon, until } from '../helpers/daemon.js';

const daemons: TestDaemon[] = [];
const children: ChildProcess[] = [];
afterEach(async () => {
  for (const c of children.splice(0)) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  for (const d of daemons.splice(0)) await d.stop();
});

async function daemon(options: ConstructorParameters<typeof TestDaemon>[0] = {}): Promise<TestDaemon> {
  const d = new TestDaemon({ ...options, config: { session: { defaultGraceMs: 300 }, ...options.config } });
  daemons.push(d);
  return d.start();
}

const marker = () => `4${randomBytes(2).readUInt16BE(0) % 100}.${randomBytes(3).readUIntBE(0, 3)}`;
const signalNumber = (name: string) => osConstants.signals[name as keyof typeof osConstants.signals] ?? 0;

/** sbx with its stdout and stderr readable while it runs (runSbx only gives them at the end). */
function liveSbx(d: TestDaemon, args: string[]) {
  const child = spawn(process.execPath, [SBX, ...args], { cwd: d.dir, env: { ...process.env, SBX_SOCKET: d.socketPath }, stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  let out = '';
  let err = '';
  child.stdout!.on('data', (b: Buffer) => (out += b.toString()));
  child.stderr!.on('data', (b: Buffer) => (err += b.toString()));
  let done = false;
  const exited = new Promise<number | null>((r) => child.on('close', (code) => r(code))).finally(() => (done = true));
  /** Resolves once stderr has a line starting `sbx: waiting`; throws if sbx ended first. */
  const waitingLine = () =>
    until(
      () => {
        if (/^sbx: waiting/m.test(err)) return true;
        if (done) throw new Error(`sbx ended without waiting: ${err}`);
        return false;
      },
      'sbx to say that it waits',
      20_000,
    );
  return { child, exited, stdout: () => out, stderr: () => err, waitingLine };
}

/** Whether pid is a live process (not gone, not a zombie). */
function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
}

const waitingLines = (stderr: string) => stderr.split('\n').filter((l) => l.startsWith('sbx: waiting'));

describe('a retry never changes how an existing session ends', () => {
  it('a retry with --on-disconnect cancel whose connection closes leaves the running session alone', async () => {
    const d = await daemon();
    const keep = `keep-${randomBytes(4).toString('hex')}`;
    const control = `control-${randomBytes(4).toString('hex')}`;
    const [mKeep, mControl] = [marker(), marker()];
    const c = await d.client();
    await c.launch({ argv: ['sleep', mKeep], cwd: '/', invocation_key: keep }); // default: continue
    const retrying = await SupervisorClient.connect({ socketPath: d.socketPath });
    const retried = await retrying.launch({ argv: ['sleep', mKeep], cwd: '/', invocation_key: keep, on_disconnect: 'cancel' });
    expect(retried.existing).toBe(true);
    // Positive control: a new key launched with cancel on a connection closed in the same instant.
    const owning = await SupervisorClient.connect({ socketPath: d.socketPath });
    expect((await owning.launch({ argv: ['sleep', mControl], cwd: '/', invocation_key: control, on_disconnect: 'cancel' })).existing).toBe(false);
    retrying.close();
    owning.close();
    const cancelled = await c.wait({ invocation_key: control });
    expect(cancelled).toMatchObject({ outcome: 'cancelled', termination: { cause: 'cancel' } });
    const row = (await c.ps(true)).sessions.find((s) => s.invocation_key === keep) as SessionSummary;
    expect(row.state).toBe('running');
    expect(pidsWithMarker(mKeep)).toHaveLength(1);
    await c.request('cancel', { invocation_key: keep, grace_ms: 0 });
    expect((await c.wait({ invocation_key: keep })).termination.steps.map((s) => s.signal)).toEqual(['SIGKILL']);
  });

  it('--detach with --on-disconnect cancel is INVALID_ARGUMENT, exit 125, before any request', async () => {
    const d = await daemon();
    const r = await d.sbx(['run', '--detach', '--on-disconnect', 'cancel', '--', 'true']);
    expect(r.status).toBe(125);
    expect(r.stderr.toString()).toMatch(/^sbx: INVALID_ARGUMENT: --detach with --on-disconnect cancel: .*\n$/);
    // So is --detach --receipt: a detached sbx is gone before there is a receipt to write.
    const withReceipt = await d.sbx(['run', '--detach', '--receipt', join(d.dir, 'r.json'), '--', 'true']);
    expect(withReceipt.status).toBe(125);
    expect(withReceipt.stderr.toString()).toMatch(/^sbx: INVALID_ARGUMENT: --detach with --receipt: .*sbx wait ID.*\n$/);
    expect(JSON.parse((await d.sbx(['ps', '--all', '--json'])).stdout.toString())).toEqual([]);
  });
});

describe('sbx run outlives the supervisor going away before it answers', () => {
  it('ECONNREFUSED at start (a crashed supervisor left its socket): one waiting line, then it runs once', async () => {
    const d = await daemon();
    await d.kill9();
    expect(existsSync(d.socketPath)).toBe(true);
    const log = join(d.dir, 'LOG');
    const run = liveSbx(d, ['run', '--key', `refused-${randomBytes(4).toString('hex')}`, '--', 'sh', '-c', `echo ran >> ${log}; echo out`]);
    await run.waitingLine();
    expect(run.stderr()).toBe(`sbx: waiting for the supervisor at ${d.socketPath} (ECONNREFUSED); retrying for up to 60 s\n`);
    await d.start();
    expect(await run.exited).toBe(0);
    expect(run.stdout()).toBe('out\n');
    expect(run.stderr()).toBe(`sbx: waiting for the supervisor at ${d.socketPath} (ECONNREFUSED); retrying for up to 60 s\n`);
    expect(readFileSync(log, 'utf8')).toBe('ran\n');
  });

  it('SIGTERM while it waits for a supervisor that does not answer ends sbx (143), naming the key to find a launch that was admitted', async () => {
    const d = await daemon();
    await d.kill9();
    const key = `refused-term-${randomBytes(4).toString('hex')}`;
    const run = liveSbx(d, ['run', '--key', key, '--', 'true']);
    await run.waitingLine();
    run.child.kill('SIGTERM');
    expect(await run.exited).toBe(128 + signalNumber('SIGTERM'));
    expect(run.stderr()).toBe(
      `sbx: waiting for the supervisor at ${d.socketPath} (ECONNREFUSED); retrying for up to 60 s\nsbx: SIGTERM while waiting to launch; a launch that was admitted runs on (sbx run --key ${key} finds it)\n`,
    );
  });

  it('ENOENT at start (no socket file at all) fails at once with the message, no waiting', async () => {
    const d = await daemon();
    const r = await d.sbx(['run', '--socket', join(d.dir, 'no-such.sock'), '--', 'true']);
    expect(r.status).toBe(125);
    expect(r.stderr.toString()).toBe(
      `sbx: cannot reach the supervisor at ${join(d.dir, 'no-such.sock')} (ENOENT: no socket there); is it running? sbx status checks (start it with npm start or the systemd unit; --socket or SBX_SOCKET name another)\n`,
    );
  });

  for (const keyed of [true, false]) {
    it(`a drop after the session started, before the answer (${keyed ? '--key' : 'no key: sbx makes one'}): resends, gets that session, ends with its recorded status`, async () => {
      const env: NodeJS.ProcessEnv = { SBX_FAULT_POINT: 'launch:started' };
      const d = await daemon({ env });
      const crashedPid = d.pid;
      const log = join(d.dir, 'LOG');
      const key = `dropped-${randomBytes(4).toString('hex')}`;
      const run = liveSbx(d, ['run', ...(keyed ? ['--key', key] : []), '--', 'sh', '-c', `echo ran >> ${log}; sleep 0.3`]);
      await until(() => !alive(crashedPid), 'the supervisor to die at launch:started');
      await d.kill9(); // reaps it (already dead)
      await run.waitingLine();
      delete env.SBX_FAULT_POINT; // the next start runs without the crash point
      await d.start();
      const status = await run.exited;
      const sessions = JSON.parse((await d.sbx(['ps', '--all', '--json'])).stdout.toString()) as SessionSummary[];
      expect(sessions).toHaveLength(1);
      if (keyed) expect(sessions[0].invocation_key).toBe(key);
      else expect(sessions[0].invocation_key).toMatch(/^auto-[0-9a-f]{24}$/);
      const receipt = JSON.parse((await d.sbx(['receipt', '--key', sessions[0].invocation_key])).stdout.toString()) as Receipt;
      expect(receipt.outcome).toBe('owner_lost');
      expect(status).toBe(exitStatusOf(receipt, signalNumber));
      expect(status).toBe(125);
      // Never twice. Usually never (the receipt has started_at null): the exec shim dies with
      // the supervisor until it has joined its cgroup (PR_SET_PDEATHSIG), and the crash point
      // is right after the spawn. One session in ps --all: the resend created none.
      expect(['', 'ran\n']).toContain(existsSync(log) ? readFileSync(log, 'utf8') : '');
      expect(waitingLines(run.stderr())).toHaveLength(1);
      expect(run.stderr()).toMatch(
        new RegExp(
          `^sbx: waiting for the supervisor at ${d.socketPath} \\((ECONNRESET|EPIPE)\\); retrying for up to 60 s\\nsbx: session ${receipt.session_id}: owner lost .*\\n$`,
        ),
      );
    }, 40_000);
  }
});

describe('a retry while the restarted supervisor reconciles', () => {
  it("waits for the unknown session's owner_lost receipt (receipt_pending) instead of failing at once", async () => {
    const d = await daemon();
    const m = marker();
    const key = `reconciled-${randomBytes(4).toString('hex')}`;
    // TERM ignored (and inherited by sleep): reconciliation takes the whole 5 s grace.
    const args = ['run', '--key', key, '--grace', '5s', '--', 'sh', '-c', `trap "" TERM; echo up; sleep ${m}`];
    const first = liveSbx(d, args);
    await until(() => first.stdout() === 'up\n', 'the session to run');
    await d.kill9();
    first.child.kill('SIGKILL');
    await d.start();
    const retry = liveSbx(d, args);
    const status = await retry.exited;
    const receipt = JSON.parse((await d.sbx(['receipt', '--key', key])).stdout.toString()) as Receipt;
    expect(receipt).toMatchObject({ outcome: 'owner_lost', termination: { cause: 'reconcile' } });
    expect(receipt.termination.steps.map((s) => s.signal)).toEqual(['SIGTERM', 'SIGKILL']);
    expect(status).toBe(125);
    expect(retry.stdout()).toBe('up\n');
    expect(retry.stderr()).toMatch(
      new RegExp(
        `^sbx: waiting: session ${receipt.session_id} is unknown until its receipt is written: .*being ended: SIGTERM sent to \\d+ processes at \\S+, cgroup\\.kill after its grace of 5000 ms\nsbx: session ${receipt.session_id}: owner lost .*\n$`,
      ),
    );
    expect(pidsWithMarker(m)).toEqual([]);
  }, 30_000);
});

describe('retryable refusals', () => {
  it('--detach does not wait on LIMIT_EXCEEDED; without it one waiting line, and it runs once the slot frees', async () => {
    const d = await daemon({ config: { session: { maxSessions: 1 } } });
    const busy = `busy-${randomBytes(4).toString('hex')}`;
    const c = await d.client();
    await c.launch({ argv: ['sleep', marker()], cwd: '/', invocation_key: busy });
    const detached = await d.sbx(['run', '--detach', '--', 'true']);
    expect(detached.status).toBe(125);
    expect(detached.stderr.toString()).toBe('sbx: LIMIT_EXCEEDED: 1 sessions are running, the limit is 1\n');
    const run = liveSbx(d, ['run', '--', 'sh', '-c', 'echo second']);
    await run.waitingLine();
    expect(run.stderr()).toBe('sbx: waiting: the supervisor is at its limit of 1 sessions running (retrying for up to 60 s)\n');
    expect((await d.sbx(['cancel', '--key', busy, '--grace', '0'])).status).toBe(0);
    expect(await run.exited).toBe(0);
    expect(run.stdout()).toBe('second\n');
    expect(waitingLines(run.stderr())).toHaveLength(1);
    expect(run.stderr()).toBe('sbx: waiting: the supervisor is at its limit of 1 sessions running (retrying for up to 60 s)\n');
  }, 30_000);

  it('ADMISSION_DENIED disk low: the waiting line says how much is free and needed; --detach exits at once', async () => {
    const d = await daemon({ config: { storage: { minFreeBytes: 2 ** 50 } } });
    const detached = await d.sbx(['run', '--detach', '--', 'true']);
    expect(detached.status).toBe(125);
    expect(detached.stderr.toString()).toMatch(
      /^sbx: ADMISSION_DENIED: disk low: \d+ bytes free in the state dir, 1125899906842624 needed; retry later \(sbx status says why\)\n$/,
    );
    const run = liveSbx(d, ['run', '--', 'true']);
    await run.waitingLine();
    expect(run.stderr()).toMatch(/^sbx: waiting: disk low in the state dir, \d+ MiB free, 1073741824 MiB needed \(retrying for up to 60 s\)\n$/);
    run.child.kill('SIGKILL');
    await run.exited;
    expect(JSON.parse((await d.sbx(['ps', '--all', '--json'])).stdout.toString())).toEqual([]);
  }, 30_000);
});
