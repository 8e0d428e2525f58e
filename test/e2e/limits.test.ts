// Session limits on this host (docs/guide/limits.md): each of --memory, --pids, --cpus refused
// with LIMIT_UNAVAILABLE naming its controller where the sessions cgroup lacks it (this hybrid
// host binds memory, pids, cpu to cgroup v1), through the client and sbx run, nothing admitted;
// where it is there, the value is in the leaf. Which holds is read from the kernel (the
// cgroup.controllers handed to the supervisor's subtree). Enforcement: test/nspawn.test.ts.
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SupervisorError } from '../../ipc/errors.js';
import type { LaunchParams, LimitController, StatusResult } from '../../ipc/protocol.js';
import { cgroupMount, removeCgroupTree, TEST_CGROUP_PREFIX } from '../helpers/cgroup-cleanup.js';
import { DAEMON_ARGV, TestDaemon } from '../helpers/daemon.js';

let daemon: TestDaemon;
beforeAll(async () => {
  daemon = await new TestDaemon().start();
});
afterAll(async () => {
  expect(await daemon.stop()).toEqual({ code: 0, signal: null });
});

/** Each limit: its launch param, a value, its sbx run flag and text, its controller and the file it writes. */
const LIMITS: {
  param: 'memory_max_bytes' | 'pids_max' | 'cpus';
  value: number;
  flag: string;
  text: string;
  controller: LimitController;
  file: string;
  written: string;
}[] = [
  { param: 'memory_max_bytes', value: 64 * 2 ** 20, flag: '--memory', text: '64M', controller: 'memory', file: 'memory.max', written: String(64 * 2 ** 20) },
  { param: 'pids_max', value: 64, flag: '--pids', text: '64', controller: 'pids', file: 'pids.max', written: '64' },
  { param: 'cpus', value: 0.5, flag: '--cpus', text: '0.5', controller: 'cpu', file: 'cpu.max', written: '50000 100000' },
];

/** Whether the kernel hands the controller to the supervisor's subtree (its base's cgroup.controllers: what the parent delegates). */
const offered = (controller: string) => readFileSync(join(daemon.cgroupBase!, 'cgroup.controllers'), 'utf8').split(/\s+/).includes(controller);
/** /proc/cgroups's hierarchy of a controller (cgroups(7)): > 0 when bound to cgroup v1. */
const v1Hierarchy = (controller: string) => Number(new RegExp(`^${controller}\\s+(\\d+)`, 'm').exec(readFileSync('/proc/cgroups', 'utf8'))?.[1] ?? 0);
const sessionDirs = () =>
  readdirSync(join(daemon.stateDir, 'sessions'))
    .filter((n) => n.startsWith('s-'))
    .sort();
/** A command printing a file of its own cgroup (the 0:: line of /proc/self/cgroup under the cgroup2 mount). */
const catOwn = (file: string) => ['sh', '-c', `cat "${cgroupMount()}$(sed -n 's/^0:://p' /proc/self/cgroup)/${file}"`];

describe.each(LIMITS)('$flag', (l) => {
  it(`is refused with LIMIT_UNAVAILABLE naming ${l.controller} through the client where the controller is absent, admitting nothing; else it is in the leaf`, async () => {
    const client = await daemon.client();
    const key = `limit-${l.param}-${randomBytes(4).toString('hex')}`;
    const params: LaunchParams = { argv: catOwn(l.file), cwd: '/', invocation_key: key, [l.param]: l.value };
    if (!offered(l.controller)) {
      const before = sessionDirs();
      const err = (await client.launch(params).catch((e: unknown) => e)) as SupervisorError;
      expect(err).toBeInstanceOf(SupervisorError);
      expect(err.code).toBe('LIMIT_UNAVAILABLE');
      expect(err.retryable).toBe(false);
      expect(err.details).toEqual({ controller: l.controller, limit: l.param, cgroup: join(daemon.cgroupBase!, 'sessions') });
      expect(err.message).toContain(
        `${l.flag} (${l.param}) needs the ${l.controller} controller in cgroup v2, and ${join(daemon.cgroupBase!, 'sessions')} does not have it (cgroup.controllers: `,
      );
      if (v1Hierarchy(l.controller) > 0)
        expect(err.message).toContain(`binds it to cgroup v1 (/proc/cgroups: hierarchy ${v1Hierarchy(l.controller)}; a hybrid host)`);
      expect(err.message).toMatch(/Nothing was run\.$/);
      // Nothing admitted: no session dir, no session in ps, no leaf; the key is free.
      expect(sessionDirs()).toEqual(before);
      expect((await client.ps(true)).sessions.filter((s) => s.invocation_key === key)).toEqual([]);
      expect(readdirSync(join(daemon.cgroupBase!, 'sessions'))).toEqual(expect.not.arrayContaining([expect.stringMatching(/^s-/)]));
      const { [l.param]: _dropped, ...without } = params;
      const run = await client.run({ ...without, argv: ['true'] });
      expect(run.receipt.outcome).toBe('exited');
      expect(run.receipt.invocation_key).toBe(key);
      expect(run.receipt.limits).toBeUndefined();
    } else {
      const run = await client.run(params);
      expect(run.stdout!.toString().trim()).toBe(l.written);
      expect(run.receipt.limits).toEqual({ [l.param]: l.value });
    }
  });

  it('through sbx run: exit 125 and one line naming the controller where absent; else the leaf has it', async () => {
    const r = await daemon.sbx(['run', l.flag, l.text, '--', ...catOwn(l.file)]);
    if (!offered(l.controller)) {
      expect(r.status).toBe(125);
      expect(r.stdout.toString()).toBe('');
      expect(r.stderr.toString()).toMatch(
        new RegExp(
          `^sbx: LIMIT_UNAVAILABLE: ${l.flag} \\(${l.param}\\) needs the ${l.controller} controller in cgroup v2, and \\S+ does not have it \\(cgroup\\.controllers: [^\\n]*\\); [^\\n]*Nothing was run\\.\\n$`,
        ),
      );
    } else {
      expect(r.status).toBe(0);
      expect(r.stdout.toString().trim()).toBe(l.written);
    }
  });
});

describe('limits', () => {
  it('sbx status says which limits this host can enforce, and why not', async () => {
    const status = JSON.parse((await daemon.sbx(['status', '--json'])).stdout.toString()) as StatusResult;
    const expected = { memory: offered('memory'), pids: offered('pids'), cpu: offered('cpu') };
    expect(status.limits).toMatchObject(expected);
    const human = (await daemon.sbx(['status'])).stdout.toString();
    if (Object.values(expected).every((v) => v)) {
      expect(status.limits!.reason).toBeUndefined();
      expect(human).toMatch(/^limits {5}memory, pids, cpu/m);
    } else {
      const missing = (['memory', 'pids', 'cpu'] as const).filter((c) => !expected[c]);
      expect(status.limits!.reason).toContain(`(${join(daemon.cgroupBase!, 'sessions')}: cgroup.controllers: `);
      if (missing.every((c) => v1Hierarchy(c) > 0)) expect(status.limits!.reason).toMatch(new RegExp(`^${missing.join(', ')} (is|are) bound to cgroup v1 \\(`));
      expect(human).toMatch(
        missing.length === 3 ? /^limits {5}none enforceable here \(.*bound to cgroup v1|^limits {5}none enforceable here \(/m : /^limits {5}only /m,
      );
    }
  });

  it('refuses bad values before anything is sent: --memory 64MB, --pids 0, --cpus 0.001', async () => {
    for (const [flag, value, what] of [
      ['--memory', '64MB', 'is not a size'],
      ['--pids', '0', 'a whole number of tasks'],
      ['--cpus', '0.001', 'at least 0.01'],
    ]) {
      const r = await daemon.sbx(['run', flag!, value!, '--', 'true']);
      expect(r.status, `${flag} ${value}`).toBe(125);
      expect(r.stderr.toString()).toContain(`INVALID_ARGUMENT: ${flag}: `);
      expect(r.stderr.toString()).toContain(what);
    }
    const client = await daemon.client();
    await expect(client.launch({ argv: ['true'], cwd: '/', cpus: 0.001 })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', details: { field: 'cpus' } });
    await expect(client.launch({ argv: ['true'], cwd: '/', memory_max_bytes: 0 })).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
      details: { field: 'memory_max_bytes' },
    });
  });

  it("a config default this host cannot enforce stops start-up with the reason; one it can is every session's", async () => {
    const parent = `/${TEST_CGROUP_PREFIX}limits-default-${process.pid}-${randomBytes(3).toString('hex')}`;
    const configPath = join(daemon.dir, 'default-limits.json');
    writeFileSync(configPath, JSON.stringify({ cgroup: { parent }, session: { defaultLimits: { memoryMaxBytes: 64 * 2 ** 20 } } }));
    const state = join(daemon.dir, 'default-limits-state');
    const base = join(cgroupMount()!, parent);
    try {
      if (!offered('memory')) {
        const r = spawnSync(process.execPath, [...DAEMON_ARGV, 'serve', '--config', configPath], {
          env: { ...process.env, SBX_SOCKET: join(daemon.dir, 'dl.sock'), SBX_STATE_DIR: state },
          timeout: 20_000,
          encoding: 'utf8',
        });
        expect(r.status).toBe(2);
        expect(r.stderr).toContain(
          'sandbox-supervisor: session.defaultLimits.memoryMaxBytes is set (67108864), but the memory controller is not available to sessions here: ',
        );
        expect(r.stderr).toContain('the supervisor will not run sessions without a limit it was told to apply');
        expect(existsSync(base)).toBe(false); // its cgroup subtree went with it
      } else {
        const d = await new TestDaemon({ config: { session: { defaultLimits: { memoryMaxBytes: 64 * 2 ** 20 } } } }).start();
        try {
          const run = await (await d.client()).run({ argv: catOwn('memory.max'), cwd: '/' });
          expect(run.stdout!.toString().trim()).toBe(String(64 * 2 ** 20));
          expect(run.receipt.limits).toEqual({ memory_max_bytes: 64 * 2 ** 20 });
        } finally {
          await d.stop();
        }
      }
    } finally {
      if (existsSync(base)) await removeCgroupTree(base);
    }
  });

  it('in subreaper mode (no cgroup) every limit is refused, naming the controller and the mode', async () => {
    const d = await new TestDaemon({ config: { cgroup: { mode: 'subreaper' } } }).start();
    try {
      const client = await d.client();
      for (const l of LIMITS) {
        await expect(client.launch({ argv: ['true'], cwd: '/', [l.param]: l.value })).rejects.toMatchObject({
          code: 'LIMIT_UNAVAILABLE',
          details: { controller: l.controller, limit: l.param, cgroup: null },
          message: expect.stringContaining('subreaper mode'),
        });
      }
      expect((await client.status()).limits).toEqual({
        memory: false,
        pids: false,
        cpu: false,
        reason: 'subreaper mode: no cgroup, so no limit can be enforced',
      });
    } finally {
      expect(await d.stop()).toEqual({ code: 0, signal: null });
    }
  });
});
