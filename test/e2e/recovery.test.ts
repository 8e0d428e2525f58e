// Identity outlives transport: invocation keys run once, admission is durable, a crashed
// supervisor's sessions become unknown and are settled with evidence (owner_lost) after a
// restart, never relaunched; torn state files stay local to their session.
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import type { Receipt, SessionSummary } from '../../ipc/protocol.js';
import { isSupervisorError } from '../../ipc/errors.js';
import { pidsWithMarker, sha256, TestDaemon, until } from '../helpers/daemon.js';

const daemons: TestDaemon[] = [];
afterEach(async () => {
  for (const d of daemons.splice(0)) await d.stop();
});
async function daemon(config: Record<string, unknown> = {}): Promise<TestDaemon> {
  const d = new TestDaemon({ config: { session: { defaultGraceMs: 300 }, ...config } });
  daemons.push(d);
  return d.start();
}
const marker = () => `6${randomBytes(2).readUInt16BE(0) % 100}.${randomBytes(3).readUIntBE(0, 3)}`;

describe('invocation keys', () => {
  it('runs a keyed command once: the retry attaches and prints the same bytes', async () => {
    const d = await daemon();
    const file = join(d.dir, 'runs.txt');
    const args = (r: string) => ['run', '--key', 'K-once', '--receipt', r, '--', 'sh', '-c', `echo run >> ${file}; echo hello`];
    const first = await d.sbx(args(join(d.dir, 'r1.json')));
    const second = await d.sbx(args(join(d.dir, 'r2.json')));
    expect(first.stdout.toString()).toBe('hello\n');
    expect(second.stdout.toString()).toBe('hello\n');
    expect(first.status).toBe(0);
    expect(second.status).toBe(0);
    expect(readFileSync(file, 'utf8')).toBe('run\n');
    const r1 = JSON.parse(readFileSync(join(d.dir, 'r1.json'), 'utf8')) as Receipt;
    const r2 = JSON.parse(readFileSync(join(d.dir, 'r2.json'), 'utf8')) as Receipt;
    expect(r2).toEqual(r1);
  });

  it('20 concurrent launches with one key: one execution', async () => {
    const d = await daemon();
    const file = join(d.dir, 'concurrent.txt');
    const clients = await Promise.all(Array.from({ length: 20 }, () => d.client()));
    const results = await Promise.all(clients.map((c) => c.launch({ argv: ['sh', '-c', `echo x >> ${file}`], cwd: '/', invocation_key: 'K-20' })));
    expect(new Set(results.map((r) => r.session_id)).size).toBe(1);
    expect(results.filter((r) => !r.existing)).toHaveLength(1);
    await clients[0].wait({ invocation_key: 'K-20' });
    expect(readFileSync(file, 'utf8')).toBe('x\n');
  });
});

describe('restart', () => {
  it('a supervisor SIGKILLed mid-run: after restart the session is owner_lost with evidence, dead, and its key never reruns', async () => {
    const d = await daemon();
    const m = marker();
    const file = join(d.dir, 'runs.txt');
    const argv = ['sh', '-c', `echo run >> ${file}; echo partial; sleep ${m}`];
    const c = await d.client();
    const { session_id } = await c.launch({ argv, cwd: '/', invocation_key: 'K-crash' });
    await until(() => pidsWithMarker(m).length > 0, 'the command to run');
    await until(async () => (await c.ps()).sessions[0]?.cursors.stdout === 8, 'its output to be stored');
    await d.kill9();
    expect(pidsWithMarker(m).length).toBeGreaterThan(0); // a lost owner is not proof of death
    // A receipt's temp file the killed supervisor was writing (on a full disk, it retries):
    // the start sweeps it, though the session has no receipt yet.
    const sessionDir = join(d.stateDir, 'sessions', session_id);
    writeFileSync(join(sessionDir, '.receipt.json.0123456789ab.tmp'), '{"torn');
    await d.start();
    expect(readdirSync(sessionDir).filter((name) => name.endsWith('.tmp'))).toEqual([]);
    const waited = await d.sbx(['wait', session_id]);
    expect(waited.status).toBe(125);
    const receipt = JSON.parse(waited.stdout.toString()) as Receipt;
    expect(receipt).toMatchObject({ outcome: 'owner_lost', exit: { code: null, signal: null }, termination: { cause: 'reconcile' } });
    expect(receipt.death.evidence).toBe('cgroup_empty');
    expect(receipt.supervisor.generation).toBe(2);
    expect(receipt.termination.steps[0]).toMatchObject({ signal: 'SIGTERM' });
    expect(receipt.output.stdout).toMatchObject({ final_cursor: 8, sha256: sha256('partial\n'), complete: false, reason: 'owner_lost' });
    expect(pidsWithMarker(m)).toEqual([]);
    const again = await d.sbx(['run', '--key', 'K-crash', '--cwd', '/', '--', ...argv]);
    expect(again.status).toBe(125);
    expect(again.stderr.toString()).toBe(
      `sbx: session ${session_id}: owner lost (the supervisor that ran it stopped before it ended): its exit status is unknown, death evidence cgroup_empty (sbx receipt ${session_id})\n`,
    );
    expect(again.stdout.toString()).toBe('partial\n');
    expect(readFileSync(file, 'utf8')).toBe('run\n');
    // The cgroup subtree the crashed run left is this supervisor's: an orderly stop removes it.
    expect(await d.terminate()).toEqual({ code: 0, signal: null });
    expect(existsSync(d.cgroupBase!)).toBe(false);
  });

  it("the restart's escalation of a lost session sends SIGCONT after its TERM: a stopped process ends of the TERM, no KILL after the grace", async () => {
    const d = await daemon();
    const m = marker();
    const c = await d.client();
    // sh's sleep is stopped; sh waits for it. A 20 s grace: a KILL step would mean the TERM was not acted on.
    const { session_id } = await c.launch({ argv: ['sh', '-c', `sleep ${m} & kill -STOP $!; wait`], cwd: '/', invocation_key: 'K-stopped', grace_ms: 20_000 });
    const [sleeper] = await until(() => {
      const pids = pidsWithMarker(m).filter((pid) => readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.startsWith('T'));
      return pids.length === 1 ? pids : null;
    }, 'the sleep to be stopped');
    expect(sleeper).toBeGreaterThan(0);
    await d.kill9();
    await d.start();
    const receipt = (await (await d.client()).wait({ session_id })) as Receipt;
    expect(receipt).toMatchObject({ outcome: 'owner_lost', termination: { cause: 'reconcile' } });
    expect(receipt.termination.steps.map((s) => s.signal)).toEqual(['SIGTERM']);
    expect(pidsWithMarker(m)).toEqual([]);
    expect(await d.terminate()).toEqual({ code: 0, signal: null });
  });

  it('serves a finished session unchanged after a SIGKILL and restart', async () => {
    const d = await daemon();
    const body = randomBytes(300_000).toString('base64');
    const src = join(d.dir, 'body.txt');
    writeFileSync(src, body);
    const r = await d.sbx(['run', '--key', 'K-done', '--receipt', join(d.dir, 'before.json'), '--', 'cat', src]);
    expect(r.stdout.toString()).toBe(body);
    await d.kill9();
    await d.start();
    const receipt = await d.sbx(['receipt', '--key', 'K-done']);
    expect(JSON.parse(receipt.stdout.toString())).toEqual(JSON.parse(readFileSync(join(d.dir, 'before.json'), 'utf8')));
    const logs = await d.sbx(['logs', '--key', 'K-done']);
    expect(logs.stdout.toString()).toBe(body);
  });

  it('sbx run rides through a supervisor restart: exact bytes, then owner_lost (125)', async () => {
    const d = await daemon();
    const { spawn } = await import('node:child_process');
    const { SBX } = await import('../helpers/daemon.js');
    const child = spawn(process.execPath, [SBX, 'run', '--key', 'K-ride', '--', 'sh', '-c', 'i=0; while :; do echo "line $i"; i=$((i+1)); sleep 0.01; done'], {
      env: { ...process.env, SBX_SOCKET: d.socketPath },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const out: Buffer[] = [];
    child.stdout.on('data', (b: Buffer) => out.push(b));
    const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
    await until(() => Buffer.concat(out).toString().includes('line 20\n'), 'output to flow');
    await d.kill9();
    await d.start();
    expect(await exited).toBe(125);
    const got = Buffer.concat(out).toString();
    const receipt = JSON.parse((await d.sbx(['receipt', '--key', 'K-ride'])).stdout.toString()) as Receipt;
    const stored = (await d.sbx(['logs', '--key', 'K-ride'])).stdout.toString();
    expect(got).toBe(stored); // no gap, no duplicate across the reconnect
    expect(receipt.output.stdout!.sha256).toBe(sha256(got));
    const lines = got.split('\n').filter(Boolean);
    lines.forEach((l, i) => expect(l).toBe(`line ${i}`));
  });

  it('a follower that disconnects at byte 50 and resumes from 50 gets exactly the full log', async () => {
    const d = await daemon();
    const c1 = await d.client();
    const { session_id } = await c1.launch({ argv: ['sh', '-c', 'i=0; while [ $i -lt 200 ]; do echo "row $i"; i=$((i+1)); sleep 0.002; done'], cwd: '/' });
    const head: Buffer[] = [];
    await new Promise<void>((resolve) => {
      void c1.subscribe(
        { session_id, stream: 'stdout', from: 0, follow: true },
        {
          onOutput: (ev) => {
            head.push(Buffer.from(ev.data));
            if (Buffer.concat(head).length >= 50) {
              c1.close();
              resolve();
            }
          },
          onEnd: () => resolve(),
        },
      );
    });
    const first50 = Buffer.concat(head).subarray(0, 50);
    const c2 = await d.client();
    const rest: Buffer[] = [];
    await new Promise<void>((resolve) => {
      void c2.subscribe(
        { session_id, stream: 'stdout', from: 50, follow: true },
        { onOutput: (ev) => rest.push(Buffer.from(ev.data)), onEnd: () => resolve() },
      );
    });
    const whole = Buffer.concat([first50, ...rest]).toString();
    expect(whole).toBe(Array.from({ length: 200 }, (_, i) => `row ${i}\n`).join(''));
  });

  it('a torn admission record of a running session: its processes are ended, it stays unknown, its key never reruns', async () => {
    const d = await daemon();
    const m = marker();
    const c = await d.client();
    const { session_id } = await c.launch({ argv: ['sh', '-c', `sleep ${m}`], cwd: '/', invocation_key: 'K-torn-live' });
    // Running inside its leaf (before that, a supervisor crash takes the shim with it).
    const procs = join(d.cgroupBase!, 'sessions', session_id, 'cgroup.procs');
    await until(
      () =>
        readFileSync(procs, 'utf8')
          .split('\n')
          .some((pid) => pid && pidsWithMarker(m).includes(Number(pid))),
      'the command to run in its leaf',
    );
    await d.kill9();
    expect(pidsWithMarker(m).length).toBeGreaterThan(0); // still running, owner gone
    writeFileSync(join(d.stateDir, 'sessions', session_id, 'admission.json'), '{"sess');
    writeFileSync(join(d.stateDir, 'supervisor.json'), 'zz'); // a torn identity does not stop start-up
    await d.start();
    await until(async () => {
      const rows = JSON.parse((await d.sbx(['ps', '--json'])).stdout.toString()) as SessionSummary[];
      return rows.find((r) => r.session_id === session_id)?.reason?.includes('its processes were ended');
    }, 'reconciliation to end the processes');
    expect(pidsWithMarker(m)).toEqual([]);
    const again = await d.sbx(['run', '--key', 'K-torn-live', '--cwd', '/', '--', 'sh', '-c', `sleep ${m}`]);
    expect(again.status).toBe(125);
    expect(again.stderr.toString()).toContain('is unknown');
    expect(pidsWithMarker(m)).toEqual([]);
    const status = JSON.parse((await d.sbx(['status', '--json'])).stdout.toString());
    expect(status.generation).toBeGreaterThanOrEqual(1); // every admission record is torn here: nothing to recover it from
    const resolved = await d.sbx(['resolve', session_id, '--as-operator', '--reason', 'leaf empty, checked']);
    expect(resolved.status).toBe(0);
  });

  it('torn files make only their session unknown; an operator can resolve it', async () => {
    const d = await daemon();
    const ok = await d.sbx(['run', '--key', 'K-fine', '--', 'echo', 'fine']);
    expect(ok.status).toBe(0);
    const c = await d.client();
    const { session_id } = await c.launch({ argv: ['echo', 'to be torn'], cwd: '/', invocation_key: 'K-torn' });
    await c.wait({ session_id });
    await d.kill9();
    const dir = join(d.stateDir, 'sessions', session_id);
    writeFileSync(join(dir, 'admission.json'), '{"session_id": "s-');
    writeFileSync(join(dir, 'receipt.json'), '{ torn');
    // A session from another boot, never settled: boot_changed evidence.
    const other = join(d.stateDir, 'sessions', 's-0000000aa-0123456789ab');
    mkdirSync(other);
    writeFileSync(
      join(other, 'admission.json'),
      JSON.stringify({
        session_id: 's-0000000aa-0123456789ab',
        invocation_key: 'K-old-boot',
        command_digest: 'sha256:00',
        argv: ['true'],
        cwd: '/',
        env: {},
        timeout_ms: 0,
        grace_ms: 100,
        linger: 'kill',
        chunk_bytes: 4096,
        cgroup: null,
        mode: 'cgroup',
        boot_id: 'not-this-boot',
        generation: 1,
        instance: 'x',
        admitted_at: new Date().toISOString(),
      }),
    );
    await d.start();
    const oldBoot = JSON.parse((await d.sbx(['wait', '--key', 'K-old-boot'])).stdout.toString()) as Receipt;
    expect(oldBoot).toMatchObject({ outcome: 'owner_lost', death: { evidence: 'boot_changed' } });
    expect((await d.sbx(['logs', '--key', 'K-fine'])).stdout.toString()).toBe('fine\n');
    const ps = JSON.parse((await d.sbx(['ps', '--json'])).stdout.toString()) as SessionSummary[];
    const torn = ps.find((s) => s.session_id === session_id)!;
    expect(torn.state).toBe('unknown');
    expect(torn.reason).toContain('admission record');
    const retry = await d.sbx(['run', '--key', 'K-torn', '--cwd', '/', '--detach', '--json', '--', 'echo', 'to be torn']);
    expect(JSON.parse(retry.stdout.toString())).toEqual({ session_id, existing: true, state: 'unknown' });
    expect((await d.sbx(['run', '--', 'echo', 'new keys are admitted'])).stdout.toString()).toBe('new keys are admitted\n');
    // Nothing of it is being ended: cancel says so rather than exiting 0 with no effect.
    const cancel = await d.sbx(['cancel', session_id]);
    expect(cancel.status).toBe(125);
    expect(cancel.stderr.toString()).toContain('is unknown and nothing of it is being ended');
    const refused = await d.sbx(['resolve', session_id, '--reason', 'checked by hand']);
    expect(refused.status).toBe(125);
    const resolved = await d.sbx(['resolve', session_id, '--as-operator', '--reason', 'checked by hand']);
    expect(resolved.status).toBe(0);
    const receipt = JSON.parse(resolved.stdout.toString()) as Receipt;
    expect(receipt).toMatchObject({ outcome: 'owner_lost', death: { evidence: 'operator_attested' }, operator: { uid: 0, reason: 'checked by hand' } });
    expect(receipt.operator!.unknown_reason).toContain('admission record');
    expect((await d.sbx(['wait', session_id])).status).toBe(125);
  });

  it("an unreadable key record: rebuilt from its session's admission record (kept aside); one no session claims refuses its key at once", async () => {
    const d = await daemon();
    const c = await d.client();
    const { session_id } = await c.launch({ argv: ['echo', 'ran once'], cwd: '/', invocation_key: 'K-rebuilt' });
    await c.wait({ session_id });
    const orphan = await c.launch({ argv: ['echo', 'orphan'], cwd: '/', invocation_key: 'K-orphan' });
    await c.wait({ session_id: orphan.session_id });
    const lost = await c.launch({ argv: ['echo', 'lost'], cwd: '/', invocation_key: 'K-lost' });
    await c.wait({ session_id: lost.session_id });
    const emptied = await c.launch({ argv: ['echo', 'emptied'], cwd: '/', invocation_key: 'K-empty' });
    await c.wait({ session_id: emptied.session_id });
    const other = await c.launch({ argv: ['echo', 'other'], cwd: '/', invocation_key: 'K-other' });
    await c.wait({ session_id: other.session_id });
    await d.kill9();
    const keysDir = join(d.stateDir, 'keys');
    const keyFile = (k: string) => sha256(Buffer.from(k)) + '.json';
    // A key record is not fsync'ed (its admission record is): a crash may leave it empty, or
    // gone with only its temp left. Bytes that are not a record are corruption: kept aside.
    writeFileSync(join(keysDir, keyFile('K-rebuilt')), '{"invocation_key": "K-reb');
    writeFileSync(join(keysDir, keyFile('K-empty')), '');
    // A temp name that cannot be removed (a directory) does not stop the start.
    mkdirSync(join(keysDir, `.${keyFile('K-x')}.0123456789ab.tmp`));
    // A record naming a session of another key (corrupt: no crash writes one) leaves that session as it was.
    writeFileSync(
      join(keysDir, keyFile('K-corrupt')),
      JSON.stringify({
        invocation_key: 'K-corrupt',
        session_id: other.session_id,
        command_digest: 'sha256:' + '0'.repeat(64),
        admitted_at: new Date().toISOString(),
      }),
    );
    rmSync(join(keysDir, keyFile('K-lost')));
    const temp = `.${keyFile('K-lost')}.0123456789ab.tmp`;
    writeFileSync(join(keysDir, temp), '{"invocation_key"');
    // A key whose record is torn and whose session dir is gone: nothing says which session it was.
    writeFileSync(join(keysDir, keyFile('K-orphan')), '{"invocation_key": "K-or');
    rmSync(join(d.stateDir, 'sessions', orphan.session_id), { recursive: true });
    await d.start();
    const retry = await d.sbx(['run', '--key', 'K-rebuilt', '--cwd', '/', '--', 'echo', 'ran once']);
    expect({ status: retry.status, stdout: retry.stdout.toString() }).toEqual({ status: 0, stdout: 'ran once\n' });
    expect(JSON.parse(readFileSync(join(keysDir, keyFile('K-rebuilt')), 'utf8'))).toMatchObject({ invocation_key: 'K-rebuilt', session_id });
    expect(
      readdirSync(keysDir)
        .filter((n) => n.startsWith(keyFile('K-rebuilt') + '.unreadable-'))
        .map((n) => readFileSync(join(keysDir, n), 'utf8')),
    ).toEqual(['{"invocation_key": "K-reb']);
    // Empty (what a crash leaves): rebuilt in place, nothing kept aside, not logged as an error.
    expect((await d.sbx(['run', '--key', 'K-empty', '--cwd', '/', '--', 'echo', 'emptied'])).stdout.toString()).toBe('emptied\n');
    expect(JSON.parse(readFileSync(join(keysDir, keyFile('K-empty')), 'utf8'))).toMatchObject({ invocation_key: 'K-empty', session_id: emptied.session_id });
    expect(readdirSync(keysDir).filter((n) => n.startsWith(keyFile('K-empty') + '.unreadable-'))).toEqual([]);
    expect(d.log()).toContain('a key record a crash left empty');
    expect((await d.sbx(['logs', '--key', 'K-other'])).stdout.toString()).toBe('other\n');
    expect((await d.sbx(['receipt', other.session_id])).status).toBe(0);
    const again = await d.sbx(['run', '--key', 'K-lost', '--cwd', '/', '--', 'echo', 'lost']);
    expect({ status: again.status, stdout: again.stdout.toString() }).toEqual({ status: 0, stdout: 'lost\n' });
    expect(JSON.parse(readFileSync(join(keysDir, keyFile('K-lost')), 'utf8'))).toMatchObject({ invocation_key: 'K-lost', session_id: lost.session_id });
    expect(readdirSync(keysDir)).not.toContain(temp);
    expect(readdirSync(join(d.stateDir, 'sessions')).filter((n) => n.startsWith('s-'))).toHaveLength(4);
    const refused = await d.sbx(['run', '--key', 'K-orphan', '--cwd', '/', '--', 'echo', 'orphan']);
    expect(refused.status).toBe(125);
    expect(refused.stderr.toString()).toContain('KEY_CONFLICT');
    expect(refused.stderr.toString()).toContain('cannot be read');
    expect(readFileSync(join(keysDir, keyFile('K-orphan')), 'utf8')).toBe('{"invocation_key": "K-or');
    expect(await until(() => d.log().includes('unreadable key record'), 'the unreadable key record logged')).toBe(true);
  });
});

describe('a key record whose session directory is gone', () => {
  it('the key never runs again; the session is unknown until an operator resolves it, its receipt in a directory made for it', async () => {
    const d = await daemon();
    await d.kill9();
    // Readable, naming a session nothing else on disk knows (a state dir copied in part, say).
    const id = 's-0mxc3x000-0123456789ab';
    writeFileSync(
      join(d.stateDir, 'keys', sha256(Buffer.from('K-gone')) + '.json'),
      JSON.stringify({ invocation_key: 'K-gone', session_id: id, command_digest: 'sha256:' + '0'.repeat(64), admitted_at: new Date().toISOString() }) + '\n',
    );
    await d.start();
    const retry = await d.sbx(['run', '--key', 'K-gone', '--cwd', '/', '--', 'echo', 'again']);
    expect(retry.status).toBe(125);
    expect(retry.stdout.toString()).toBe('');
    expect(retry.stderr.toString()).toContain(`session ${id} (key K-gone) is unknown: the session's files are gone; its key stays used`);
    const resolved = await d.sbx(['resolve', id, '--as-operator', '--reason', 'copied state dir']);
    expect({ status: resolved.status, stderr: resolved.stderr.toString() }).toMatchObject({ status: 0 });
    const receipt = JSON.parse(resolved.stdout.toString()) as Receipt;
    expect(receipt).toMatchObject({ session_id: id, outcome: 'owner_lost', death: { evidence: 'operator_attested' } });
    expect(JSON.parse(readFileSync(join(d.stateDir, 'sessions', id, 'receipt.json'), 'utf8'))).toEqual(receipt);
    // Resolved, it still never runs.
    const again = await d.sbx(['run', '--key', 'K-gone', '--cwd', '/', '--', 'echo', 'again']);
    expect(again.stdout.toString()).toBe('');
    expect(again.status).not.toBe(0);
  });
});

describe('receipts read back at start', () => {
  it('a receipt.json that is not a receipt, or does not verify, makes only its session unknown; ps serves the rest', async () => {
    const d = await daemon();
    const c = await d.client();
    const ids: string[] = [];
    for (const key of ['K-fine', 'K-not-a-receipt', 'K-tampered']) {
      const { session_id } = await c.launch({ argv: ['sh', '-c', 'exit 3'], cwd: '/', invocation_key: key });
      await c.wait({ session_id });
      ids.push(session_id);
    }
    await d.kill9();
    writeFileSync(join(d.stateDir, 'sessions', ids[1], 'receipt.json'), '{"outcome":"exited"}\n');
    const tampered = join(d.stateDir, 'sessions', ids[2], 'receipt.json');
    writeFileSync(tampered, JSON.stringify({ ...JSON.parse(readFileSync(tampered, 'utf8')), exit: { code: 0, signal: null } }));
    await d.start();
    const ps = await d.sbx(['ps', '--all', '--json']);
    expect(ps.status).toBe(0);
    const rows = JSON.parse(ps.stdout.toString()) as SessionSummary[];
    expect(rows.find((r) => r.session_id === ids[0])).toMatchObject({ state: 'ended', outcome: 'exited' });
    expect(rows.find((r) => r.session_id === ids[1])).toMatchObject({
      state: 'unknown',
      reason: expect.stringContaining('receipt is unreadable: not a receipt'),
    });
    expect(rows.find((r) => r.session_id === ids[2])).toMatchObject({ state: 'unknown', reason: expect.stringContaining('receipt does not verify') });
    expect((await d.sbx(['run', '--key', 'K-fine', '--cwd', '/', '--', 'sh', '-c', 'exit 3'])).status).toBe(3);
  });
});

describe('crashes in the middle of writing a receipt or removing output', () => {
  it('a receipt written into its reservation but not yet truncated (zeros after it) is published at the next start', async () => {
    const d = await daemon();
    d.withEnv({ SBX_FAULT_POINT: 'receipt:written-in-place' });
    await d.terminate();
    await d.start();
    const cut = d.sbx(['run', '--key', 'K-in-place', '--cwd', '/', '--', 'sh', '-c', 'exit 3']);
    expect(await d.exitedNow()).toEqual({ code: null, signal: 'SIGKILL' });
    await d.withEnv(undefined).start();
    expect((await cut).status).toBe(3);
    const receipt = JSON.parse((await d.sbx(['receipt', '--key', 'K-in-place'])).stdout.toString()) as Receipt;
    expect(receipt).toMatchObject({ outcome: 'exited', exit: { code: 3, signal: null } });
  });

  it('a crash after retention emptied a stream and before its marker: the restart finishes it, reads say OUTPUT_REMOVED', async () => {
    const d = await daemon({ retention: { outputMaxAgeMs: 1, intervalMs: 0 } });
    const first = await d.sbx(['run', '--key', 'K-gone', '--cwd', '/', '--', 'echo', 'important']);
    expect(first.stdout.toString()).toBe('important\n');
    d.withEnv({ SBX_FAULT_POINT: 'retention:before-marker' });
    await d.terminate();
    await d.start();
    void d.sbx(['gc']);
    expect(await d.exitedNow()).toEqual({ code: null, signal: 'SIGKILL' });
    await d.withEnv(undefined).start();
    const replay = await d.sbx(['run', '--key', 'K-gone', '--cwd', '/', '--', 'echo', 'important']);
    expect(replay.status).toBe(0);
    expect(replay.stdout.toString()).toBe('');
    expect(replay.stderr.toString()).toMatch(/its output was removed by the retention policy/);
    const [id] = readdirSync(join(d.stateDir, 'sessions'));
    expect(readdirSync(join(d.stateDir, 'sessions', id)).sort()).toEqual(['admission.json', 'output-removed.json', 'receipt.json', 'started.json']);
  });

  it('a receipt that cannot be written during reconciliation settles as unknown for good: resolve is allowed', async () => {
    const d = await daemon();
    const m = marker();
    const c = await d.client();
    // It ignores SIGTERM: the restart's reconciliation ends it only after its 1.5 s grace, so a
    // wait sent at once finds its receipt on the way (pending) and then, the write refused, not.
    const { session_id } = await c.launch({ argv: ['sh', '-c', `trap '' TERM; exec sleep ${m}`], cwd: '/', invocation_key: 'K-planted', grace_ms: 1500 });
    await until(() => pidsWithMarker(m).length === 1, 'the session to run');
    await d.kill9();
    symlinkSync('/nonexistent', join(d.stateDir, 'sessions', session_id, 'receipt.json'));
    await d.start();
    const c2 = await d.client();
    const failing = c2.wait({ session_id }, { unknown: 'fail' }).catch((e: unknown) => e);
    expect((await c2.ps()).sessions.find((x) => x.session_id === session_id)).toMatchObject({ state: 'unknown', receipt_pending: true });
    const failed = await failing;
    expect(isSupervisorError(failed) && failed.code).toBe('SESSION_UNKNOWN');
    expect((failed as { details: { reason: string } }).details.reason).toMatch(/^the receipt could not be written/);
    const row = await until(async () => {
      const r = (JSON.parse((await d.sbx(['ps', '--json'])).stdout.toString()) as SessionSummary[]).find((x) => x.session_id === session_id);
      return r?.reason?.includes('the receipt could not be written') ? r : null;
    }, 'reconciliation to fail closed');
    expect(row.receipt_pending).toBeUndefined();
    expect(pidsWithMarker(m)).toEqual([]);
    const resolved = await d.sbx(['resolve', session_id, '--as-operator', '--reason', 'a link was planted']);
    expect(resolved.stderr.toString()).toBe('');
    expect(JSON.parse(resolved.stdout.toString())).toMatchObject({ outcome: 'owner_lost', death: { evidence: 'operator_attested' } });
  });
});

describe('tombstones read back at start', () => {
  it("a torn tombstone does not stop the start; one that is not of a session's receipt does not remove it", async () => {
    const d = await daemon();
    const ok = await d.sbx(['run', '--key', 'K-kept', '--cwd', '/', '--', 'echo', 'kept']);
    const [id] = readdirSync(join(d.stateDir, 'sessions'));
    await d.kill9();
    mkdirSync(join(d.stateDir, 'retired'), { recursive: true });
    writeFileSync(join(d.stateDir, 'retired', 's-0000-00.json'), 'null\n');
    writeFileSync(
      join(d.stateDir, 'retired', `${id}.json`),
      JSON.stringify({
        session_id: id,
        invocation_key: 'K-kept',
        command_digest: 'x',
        outcome: 'exited',
        ended_at: 'x',
        receipt_sha256: 'sha256:not-its',
        retired_at: 'x',
      }),
    );
    await d.start();
    expect(ok.status).toBe(0);
    expect((await d.sbx(['logs', '--key', 'K-kept'])).stdout.toString()).toBe('kept\n');
    expect(existsSync(join(d.stateDir, 'sessions', id, 'receipt.json'))).toBe(true);
    await until(() => d.log().includes('unreadable tombstone') && d.log().includes('a tombstone that is not of this session'), 'both in the log');
  });
});

describe('crashes at exact points (SBX_FAULT_POINT)', () => {
  it('admission is open at once after a restart while a TERM-ignoring orphan with a 45 s grace is being ended', async () => {
    const d = await daemon();
    const m = marker();
    const c = await d.client();
    const { session_id } = await c.launch({ argv: ['sh', '-c', `trap "" TERM; sleep ${m}`], cwd: '/', invocation_key: 'lg', grace_ms: 45_000 });
    const procs = join(d.cgroupBase!, 'sessions', session_id, 'cgroup.procs');
    await until(
      () =>
        readFileSync(procs, 'utf8')
          .split('\n')
          .some((pid) => pid && pidsWithMarker(m).includes(Number(pid))),
      'the orphan to run in its leaf',
    );
    await d.kill9();
    const restartedAt = performance.now();
    await d.start();
    const fresh = await d.sbx(['run', '--', 'echo', 'new']);
    const admittedMs = performance.now() - restartedAt;
    expect(fresh.stdout.toString()).toBe('new\n');
    expect(fresh.status).toBe(0);
    // The answer came while the orphan was still inside its grace: it is running, unknown,
    // and ps says it is being ended; its key answers with the session, never a new run.
    expect(pidsWithMarker(m).length).toBeGreaterThan(0);
    const row = (JSON.parse((await d.sbx(['ps', '--json'])).stdout.toString()) as SessionSummary[]).find((r) => r.session_id === session_id)!;
    expect(row.state).toBe('unknown');
    expect(row.reason).toMatch(/being ended: SIGTERM sent to \d+ processes at .*, cgroup\.kill after its grace of 45000 ms/);
    const status = JSON.parse((await d.sbx(['status', '--json'])).stdout.toString());
    expect(status.admission).toBe('open');
    expect((await d.sbx(['ps'])).stdout.toString()).toMatch(
      new RegExp(`\\n${session_id} is unknown \\(its receipt is on its way\\): .*being ended: SIGTERM sent to`),
    );
    const retry = await d.sbx(['run', '--key', 'lg', '--detach', '--json', '--cwd', '/', '--', 'sh', '-c', `trap "" TERM; sleep ${m}`]);
    expect(JSON.parse(retry.stdout.toString())).toEqual({ session_id, existing: true, state: 'unknown' });
    console.log(`restart → a new key's receipt: ${admittedMs.toFixed(0)} ms (sbx started twice), while the orphan's grace of 45 s runs`);
    // An operator need not wait out the grace: sbx cancel makes the KILL come now.
    expect((await d.sbx(['cancel', '--key', 'lg'])).status).toBe(0);
    const receipt = JSON.parse((await d.sbx(['wait', '--key', 'lg'])).stdout.toString()) as Receipt;
    expect(receipt).toMatchObject({ outcome: 'owner_lost', death: { evidence: 'cgroup_empty' }, termination: { cause: 'reconcile' } });
    expect(receipt.termination.steps.map((s) => s.signal)).toEqual(['SIGTERM', 'SIGKILL']);
    expect(pidsWithMarker(m)).toEqual([]);
  });

  it('a crash during admission (temp record written, not linked) leaves nothing: no phantom, no leaf; the resent launch runs once', async () => {
    const d = await daemon();
    d.withEnv({ SBX_FAULT_POINT: 'durable:admission.json:before-link' });
    await d.terminate();
    await d.start();
    const file = join(d.dir, 'runs.txt');
    const args = ['run', '--key', 'K-mid-admission', '--cwd', '/', '--', 'sh', '-c', `echo run >> ${file}`];
    const cut = d.sbx(args); // waits for the supervisor to come back, then resends
    expect(await d.exitedNow()).toEqual({ code: null, signal: 'SIGKILL' });
    const sessions = join(d.stateDir, 'sessions');
    const [phantom] = readdirSync(sessions);
    expect(readdirSync(join(sessions, phantom)).every((n) => /^\.admission\.json\.[0-9a-f]+\.tmp$/.test(n))).toBe(true);
    expect(existsSync(join(d.cgroupBase!, 'sessions', phantom))).toBe(true);
    expect(existsSync(file)).toBe(false);
    await d.withEnv(undefined).start();
    // Nothing ran and the key was never taken: the resend runs it, once; the half-made
    // admission, its dir and its empty leaf are gone.
    const r = await cut;
    expect(r.status).toBe(0);
    expect(readFileSync(file, 'utf8')).toBe('run\n');
    expect(existsSync(join(sessions, phantom))).toBe(false);
    expect(existsSync(join(d.cgroupBase!, 'sessions', phantom))).toBe(false);
    const all = JSON.parse((await d.sbx(['ps', '--all', '--json'])).stdout.toString()) as SessionSummary[];
    expect(all.map((x) => [x.invocation_key, x.state])).toEqual([['K-mid-admission', 'ended']]);
    expect(d.log()).not.toContain('torn or corrupt');
  });

  it('a key admitted but never spawned answers as owner_lost with empty streams; one that spawned says when', async () => {
    const d = await daemon();
    const file = join(d.dir, 'runs.txt');
    const args = (key: string) => ['run', '--key', key, '--cwd', '/', '--', 'sh', '-c', `echo ${key} >> ${file}; echo out`];
    for (const [point, key] of [
      ['launch:before-spawn', 'K-unspawned'],
      ['session:started-recorded', 'K-spawned'],
    ]) {
      d.withEnv({ SBX_FAULT_POINT: point });
      await d.terminate();
      await d.start();
      const admittedAt = Date.now();
      const cut = d.sbx(args(key)); // resends once the supervisor is back
      expect(await d.exitedNow()).toEqual({ code: null, signal: 'SIGKILL' });
      await d.withEnv(undefined).start();
      for (const r of [await cut, await d.sbx(args(key))]) {
        expect(r.stderr.toString()).not.toContain('INVALID_ARGUMENT');
        expect(r.stderr.toString()).toContain('owner lost');
        expect(r.status).toBe(125);
      }
      const receipt = JSON.parse((await d.sbx(['receipt', '--key', key])).stdout.toString()) as Receipt;
      expect(receipt.outcome).toBe('owner_lost');
      expect(Object.keys(receipt.output).sort()).toEqual(['stderr', 'stdout']);
      if (key === 'K-unspawned') {
        expect(receipt.started_at).toBeNull();
        expect(receipt.output.stdout).toMatchObject({ final_cursor: 0, complete: false, reason: 'owner_lost' });
      } else {
        expect(Date.parse(receipt.started_at!)).toBeGreaterThanOrEqual(admittedAt - 1000);
        expect(Date.parse(receipt.started_at!)).toBeGreaterThanOrEqual(Date.parse(receipt.admitted_at));
      }
    }
    // The one that never spawned never ran; the one whose start was recorded ran, once.
    await until(() => existsSync(file) && readFileSync(file, 'utf8').includes('K-spawned'), 'the spawned command to have run');
    expect(readFileSync(file, 'utf8')).toBe('K-spawned\n');
  });
});
