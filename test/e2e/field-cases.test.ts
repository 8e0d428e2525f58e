// The field cases (test/fixtures/field-cases.jsonl; format: docs/reference/field-cases.md)
// through the project's own harness, by the client library and by sbx (and with a pty for
// the pty kind).
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadCases, markdown, runCase } from '../../scripts/probes/field-cases.js';
import { ROOT, TestDaemon } from '../helpers/daemon.js';

const file = join(ROOT, 'test/fixtures/field-cases.jsonl');
const cases = loadCases(file);

let daemon: TestDaemon;
beforeAll(async () => {
  daemon = await new TestDaemon({ config: { logLevel: 'warn' } }).start();
});
afterAll(async () => {
  expect(await daemon.stop()).toEqual({ code: 0, signal: null });
});

describe('field cases (test/fixtures/field-cases.jsonl)', () => {
  it('has the cases, one of each kind a to l, each id once', () => {
    expect(cases.length).toBeGreaterThanOrEqual(12);
    expect(new Set(cases.map((c) => c.id)).size).toBe(cases.length);
    expect([...new Set(cases.map((c) => c.kind))].sort()).toEqual([...'abcdefghijkl']);
  });
  for (const c of cases) {
    it(`${c.id}: ${c.kind}`, async () => {
      const results = await runCase(daemon.socketPath, daemon.pid, c);
      expect(results.length).toBeGreaterThan(0);
      expect(
        results.filter((r) => !r.ok),
        markdown(results),
      ).toEqual([]);
    });
  }
});
