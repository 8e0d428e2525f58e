// The probes of scripts/probes (`npm run probes`) that run in seconds, against a real
// supervisor (cgroup mode as root), by the client library and by sbx; and the harness's own
// naive path, checked to see an escapee and to leave nothing behind.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadCases, markdown, parseCase, runCase } from '../../scripts/probes/field-cases.js';
import { runNaiveCase } from '../../scripts/probes/naive.js';
import { PROBES } from '../../scripts/probes/probes.js';
import { pidsWithMark } from '../../scripts/probes/procs.js';
import { TestDaemon } from '../helpers/daemon.js';

let daemon: TestDaemon;
beforeAll(async () => {
  daemon = await new TestDaemon({ config: { logLevel: 'warn' } }).start();
});
afterAll(async () => {
  expect(await daemon.stop()).toEqual({ code: 0, signal: null });
});

const fast = PROBES.filter((p) => p.fast);

describe('probes against sandbox-supervisor', () => {
  it('has the probes issue 9 lists', () => {
    expect(fast.length).toBeGreaterThanOrEqual(16);
  });
  for (const p of fast) {
    it(`${p.id}: ${p.title}`, async () => {
      const results = await runCase(daemon.socketPath, daemon.pid, p, { daemon });
      expect(results.length).toBeGreaterThan(0);
      expect(
        results.filter((r) => !r.ok),
        markdown(results),
      ).toEqual([]);
    });
  }
});

describe('the naive targets of the harness', () => {
  it('naive-node reports a nohup escapee, and the harness kills it', async () => {
    const probe = PROBES.find((p) => p.id === 'nohup-background')!;
    const r = await runNaiveCase('naive-node', probe, null);
    expect(r.ok).toBe(false);
    expect(r.failures).toEqual(['1 process left alive']);
    expect(r.observed).toContain('9 B out, exit 0');
    expect(pidsWithMark(`${probe.id}-`)).toEqual([]);
  });

  it('naive-python fails on one 4 MiB line (readline limit)', async () => {
    const probe = PROBES.find((p) => p.id === 'long-line-4mib')!;
    const r = await runNaiveCase('naive-python', probe, null);
    expect(r.ok).toBe(false);
    expect(r.failures[0]).toBe('ValueError: Separator is not found, and chunk exceed the limit');
  });
});

describe('the case format', () => {
  it('every built-in probe is a valid case', () => {
    for (const p of PROBES) expect(() => parseCase(p), p.id).not.toThrow();
  });

  it('refuses misspelled facts, a missing deadline and a zero one, naming the line', () => {
    const dir = mkdtempSync(join(tmpdir(), 'sbx-probe-cases-'));
    try {
      const file = join(dir, 'cases.jsonl');
      const good = { id: 'ok', kind: 'x', command: 'true', stdin: null, timeout_ms: 1000, expect: { exit_code: 0 } };
      writeFileSync(file, `${JSON.stringify(good)}\n${JSON.stringify({ ...good, expect: { stdout_byte: 3 } })}\n`);
      expect(() => loadCases(file)).toThrow(/cases.jsonl:2: expect: Unrecognized key: "stdout_byte"/);
      const { timeout_ms: _, ...noDeadline } = good;
      writeFileSync(file, `${JSON.stringify(noDeadline)}\n`);
      expect(() => loadCases(file)).toThrow(/:1: timeout_ms: /);
      writeFileSync(file, `${JSON.stringify({ ...good, timeout_ms: 0 })}\n`);
      expect(() => loadCases(file)).toThrow(/:1: timeout_ms: /);
      writeFileSync(file, `${JSON.stringify(good)}\n`);
      expect(loadCases(file)).toEqual([good]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
