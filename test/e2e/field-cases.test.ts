// The field cases (../shared/cases, copied to test/fixtures) through the project's own
// harness, by the client library and by sbx (and with a pty for the pty kind).
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadCases, markdown, runCase } from '../../scripts/probes/field-cases.js';
import { ROOT, TestDaemon } from '../helpers/daemon.js';

const shared = resolve(ROOT, '../shared/cases/field-cases.jsonl');
const file = existsSync(shared) ? shared : join(ROOT, 'test/fixtures/field-cases.jsonl');
const cases = loadCases(file);

let daemon: TestDaemon;
beforeAll(async () => {
  daemon = await new TestDaemon({ config: { logLevel: 'warn' } }).start();
});
afterAll(async () => {
  expect(await daemon.stop()).toEqual({ code: 0, signal: null });
});

describe(`field cases (${file})`, () => {
  it('has the cases', () => {
    expect(cases.length).toBeGreaterThanOrEqual(12);
  });
  for (const c of cases) {
    it(`${c.id}: ${c.kind}`, async () => {
      const results = await runCase(daemon.socketPath, daemon.pid, c);
      expect(results.length).toBeGreaterThan(0);
      expect(results.filter((r) => !r.ok), markdown(results)).toEqual([]);
    });
  }
});
