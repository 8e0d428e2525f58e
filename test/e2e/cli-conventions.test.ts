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

describe('sbx logs ID on its own', () => {
  it('shows stdout on fd 1 and stderr on fd 2, byte-exact (as docker logs); --stream still selects one', async () => {
    const r = await daemon.sbx(['run', '--', 'sh', '-c', 'printf "out \\001\\377\\n"; printf "err one\\n" >&2; printf "out two"; printf "err two" >&2']);
    expect(r.status).toBe(0);
    const id = JSON.parse((await daemon.sbx(['ps', '--all', '--json'])).stdout.toString())[0].session_id as string;
    const both = await daemon.sbx(['logs', id]);
    expect(both.status).toBe(0);
    expect(both.stdout.equals(Buffer.from('out \x01\xff\nout two', 'latin1'))).toBe(true);
    expect(both.stderr.toString()).toBe('err one\nerr two');
    // Through the index (--tail, --timestamps): still each stream to its own fd.
    const tail = await daemon.sbx(['logs', id, '--tail', 'all']);
    expect([tail.stdout.equals(both.stdout), tail.stderr.toString()]).toEqual([true, 'err one\nerr two']);
    const stamped = await daemon.sbx(['logs', id, '--timestamps']);
    expect(stamped.stdout.toString('latin1')).toMatch(/^\S+Z out \x01\xff\n\S+Z out two$/);
    expect(stamped.stderr.toString()).toMatch(/^\S+Z err one\n\S+Z err two$/);
    const out = await daemon.sbx(['logs', id, '--stream', 'stdout']);
    expect([out.stdout.equals(both.stdout), out.stderr.length]).toEqual([true, 0]);
    // One stream selected is printed on stdout, stderr's too (a selection, as before).
    const err = await daemon.sbx(['logs', id, '--stream', 'stderr']);
    expect([err.stdout.toString(), err.stderr.length]).toEqual(['err one\nerr two', 0]);
    // --from is one stream's cursor: without --stream, stdout's (as before).
    const from = await daemon.sbx(['logs', id, '--from', '7']);
    expect([from.stdout.toString(), from.stderr.length]).toEqual(['out two', 0]);
  });
});
