// Fault injection: across 60 keyed launches the supervisor is SIGKILLed, each time at a point
// drawn from a seeded generator: after a random delay (during admission, spawn, drain or the
// receipt), or exactly at a named crash point (core/fault.ts: the temp admission record
// written but not linked, admitted but not spawned, spawned but not answered, running and its
// start recorded, the receipt in its reservation but not linked). It is restarted each time, and the client retries every
// key at the end, as a harness would. Invariants: no key executed twice, no phantom session,
// every key answered, every session ended with a receipt and evidence, every receipt's cursors
// and digests match the bytes on disk, nothing left running. FI_SEED=<n> replays a run.
import { randomBytes } from 'node:crypto';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { SupervisorClient } from '../../ipc/client.js';
import { isSupervisorError } from '../../ipc/errors.js';
import type { LaunchParams, Receipt, SessionSummary } from '../../ipc/protocol.js';
import { storedStream } from '../../core/state/stream-files.js';
import { pidsWithMarker, TestDaemon } from '../helpers/daemon.js';
import { seededRandom } from '../helpers/random.js';

const LAUNCHES = Number(process.env.FI_LAUNCHES ?? 60);
const SEED = Number(process.env.FI_SEED ?? randomBytes(4).readUInt32BE(0));
const CRASH_POINTS = [
  'durable:admission.json:before-link',
  'launch:before-spawn',
  'launch:started',
  'session:started-recorded',
  'durable:receipt.json:before-link',
];

let daemon: TestDaemon;
afterAll(async () => {
  await daemon?.stop();
});

/** launch with retries of retryable refusals and of lost connections, like a harness. */
async function launchWithRetry(d: TestDaemon, params: LaunchParams): Promise<string> {
  const until = Date.now() + 30_000;
  for (;;) {
    let client: SupervisorClient | null = null;
    try {
      client = await SupervisorClient.connect({ socketPath: d.socketPath });
      return (await client.launch(params)).session_id;
    } catch (err) {
      if (isSupervisorError(err) && !err.retryable) throw err;
      if (Date.now() > until) throw err;
      await new Promise((r) => setTimeout(r, 50));
    } finally {
      client?.close();
    }
  }
}

describe('fault injection', () => {
  it(`keeps every invariant across ${LAUNCHES} supervisor crashes`, async () => {
    console.log(`fault injection: seed ${SEED} (FI_SEED=${SEED} replays it)`);
    const random = seededRandom(SEED);
    daemon = new TestDaemon({ config: { session: { defaultGraceMs: 100 }, drain: { postDeathDrainMs: 500, chunkBytes: 65536 } } });
    const marker = `7${randomBytes(2).readUInt16BE(0) % 100}.${randomBytes(3).readUIntBE(0, 3)}`;
    const execLog = join(daemon.dir, 'executions.log');
    const params = (i: number): LaunchParams => ({
      argv: ['sh', '-c', `echo k${i} >> ${execLog}; head -c ${20000 + i * 3000} /dev/urandom | od -An -tx1; sleep 0.0${i % 10}; : ${marker}`],
      cwd: '/',
      invocation_key: `fi-${i}`,
    });
    const points = new Map<string, number>();
    for (let i = 0; i < LAUNCHES; i++) {
      // Half the crashes at a named point, half after a random delay.
      const point = random() < 0.5 ? CRASH_POINTS[Math.floor(random() * CRASH_POINTS.length)] : null;
      const delayMs = Math.floor(random() * 60);
      const where = point ?? `after ${delayMs} ms`;
      points.set(point ?? 'random delay', (points.get(point ?? 'random delay') ?? 0) + 1);
      try {
        await daemon.withEnv(point ? { SBX_FAULT_POINT: point } : undefined).start();
      } catch (err) {
        // The point can fire during the start's own reconciliation (a recovered session's
        // receipt: durable:receipt.json:before-link), before the daemon counts as up: that is
        // this round's crash, at the point armed.
        if (!point || !/exited at start-up/.test((err as Error).message)) throw err;
        if (process.env.FI_VERBOSE) console.log(`crash ${i}: ${where}, during the start`);
        continue;
      }
      // One attempt now; the crash may cut it anywhere. Every key is retried at the end.
      const pending = SupervisorClient.connect({ socketPath: daemon.socketPath })
        .then((c) => c.launch(params(i)).finally(() => c.close()))
        .catch(() => null);
      if (point) {
        // The point kills the supervisor itself; one that is not reached (the session is
        // still running when its receipt point would come) is crashed by hand after a bound.
        const crashed = await Promise.race([daemon.exitedNow().then(() => true), new Promise<boolean>((r) => setTimeout(() => r(false), 2000))]);
        if (!crashed) await daemon.kill9();
      } else {
        await new Promise((r) => setTimeout(r, delayMs));
        await daemon.kill9();
      }
      await pending;
      if (process.env.FI_VERBOSE) console.log(`crash ${i}: ${where}`);
    }
    await daemon.withEnv(undefined).start();
    const client = await daemon.client();
    const receipts: Receipt[] = [];
    for (let i = 0; i < LAUNCHES; i++) {
      const sessionId = await launchWithRetry(daemon, params(i));
      receipts.push(await client.wait({ session_id: sessionId }));
    }
    const executions = existsSync(execLog) ? readFileSync(execLog, 'utf8').split('\n').filter(Boolean) : [];
    const counts = new Map<string, number>();
    for (const k of executions) counts.set(k, (counts.get(k) ?? 0) + 1);
    expect([...counts.entries()].filter(([, n]) => n > 1)).toEqual([]);
    for (const [i, receipt] of receipts.entries()) {
      expect(receipt.invocation_key).toBe(`fi-${i}`);
      expect(['cgroup_empty', 'boot_changed']).toContain(receipt.death.evidence);
      expect(Date.parse(receipt.death.observed_at)).toBeGreaterThan(0);
      if (receipt.outcome === 'exited') expect(counts.get(`k${i}`)).toBe(1);
      else expect(receipt.outcome).toBe('owner_lost');
      const dir = join(daemon.stateDir, 'sessions', receipt.session_id);
      for (const [stream, out] of Object.entries(receipt.output)) {
        const disk = storedStream(dir, stream as 'stdout', 65536);
        expect(out!.final_cursor).toBe(disk.final_cursor);
        expect(out!.sha256).toBe(disk.sha256);
      }
    }
    // No phantom: exactly one session per key, every one ended; no dir without its admission.
    const all = (await client.ps(true)).sessions as SessionSummary[];
    expect(all.map((s) => s.invocation_key).sort()).toEqual(Array.from({ length: LAUNCHES }, (_, i) => `fi-${i}`).sort());
    expect(all.filter((s) => s.state !== 'ended')).toEqual([]);
    const sessionsDir = join(daemon.stateDir, 'sessions');
    expect(readdirSync(sessionsDir).filter((id) => !existsSync(join(sessionsDir, id, 'admission.json')))).toEqual([]);
    expect(readdirSync(join(daemon.cgroupBase!, 'sessions')).filter((n) => !n.startsWith('cgroup.') && !n.includes('.'))).toEqual([]);
    expect(daemon.log()).not.toContain('torn or corrupt');
    expect(pidsWithMarker(marker)).toEqual([]);
    const finished = receipts.filter((r) => r.outcome === 'exited').length;
    console.log(
      `fault injection: ${LAUNCHES} crashes (${[...points].map(([p, n]) => `${n} ${p}`).join(', ')}), ${executions.length} executions, ${finished} exited, ${LAUNCHES - finished} owner_lost, 0 duplicates, 0 phantoms`,
    );
  }, 180_000);
});
