// Fault injection: the supervisor is SIGKILLed at random points across 50 launches (during
// admission, spawn, drain, receipt writing) and restarted each time; the client retries
// every launch with its key, as a harness would. Invariants afterwards: no key executed
// twice, no receipt without evidence, every session ends with a receipt, and every receipt's
// cursors and digests match the bytes on disk.
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { SupervisorClient } from '../../ipc/client.js';
import { isSupervisorError } from '../../ipc/errors.js';
import type { LaunchParams, Receipt } from '../../ipc/protocol.js';
import { storedStream } from '../../ipc/state-layout.js';
import { pidsWithMarker, TestDaemon } from '../helpers/daemon.js';

const LAUNCHES = Number(process.env.FI_LAUNCHES ?? 50);
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
    daemon = new TestDaemon({ config: { session: { defaultGraceMs: 100 }, drain: { postDeathDrainMs: 500, chunkBytes: 65536 } } });
    const marker = `7${randomBytes(2).readUInt16BE(0) % 100}.${randomBytes(3).readUIntBE(0, 3)}`;
    const execLog = join(daemon.dir, 'executions.log');
    const params = (i: number): LaunchParams => ({
      argv: ['sh', '-c', `echo k${i} >> ${execLog}; head -c ${20000 + i * 3000} /dev/urandom | od -An -tx1; sleep 0.0${i % 10}; : ${marker}`],
      cwd: '/',
      invocation_key: `fi-${i}`,
    });
    for (let i = 0; i < LAUNCHES; i++) {
      await daemon.start();
      // One attempt now; the crash may cut it anywhere. Every key is retried at the end.
      const pending = SupervisorClient.connect({ socketPath: daemon.socketPath })
        .then((c) => c.launch(params(i)).finally(() => c.close()))
        .catch(() => null);
      const crashAfterMs = Math.floor(Math.random() * 60); // the point of the test: a random crash point
      await new Promise((r) => setTimeout(r, crashAfterMs));
      await daemon.kill9();
      await pending;
    }
    await daemon.start();
    const client = await daemon.client();
    const receipts: Receipt[] = [];
    for (let i = 0; i < LAUNCHES; i++) {
      const sessionId = await launchWithRetry(daemon, params(i));
      receipts.push(await client.wait({ session_id: sessionId }));
    }
    const executions = existsSync(execLog) ? readFileSync(execLog, 'utf8').split('\n').filter(Boolean) : [];
    const counts = new Map<string, number>();
    for (const k of executions) counts.set(k, (counts.get(k) ?? 0) + 1);
    expect([...counts.values()].every((n) => n === 1)).toBe(true);
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
    expect(pidsWithMarker(marker)).toEqual([]);
    const finished = receipts.filter((r) => r.outcome === 'exited').length;
    console.log(`fault injection: ${LAUNCHES} crashes, ${executions.length} executions, ${finished} exited, ${LAUNCHES - finished} owner_lost`);
  }, 120_000);
});
