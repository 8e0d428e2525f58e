// The systemd unit for real: boot systemd 252 as PID 1 in systemd-nspawn (recipe in
// docs/design/facts.md, "Testing the systemd unit for real"): the host root bind-mounted privately and
// booted with --volatile=overlay to basic.target, from a fresh child cgroup of the cgroup2 mount. Inside:
// install.sh, socket activation, a session in its leaf under the service's delegated
// subtree, a crash (reconciliation after Restart=on-failure) and a stop (every session
// settled), and session limits where its cgroup v2 has the controllers (docs/guide/limits.md). Skips,
// saying why, where systemd-nspawn is not installed (.ci/run installs it).
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it, type TestContext } from 'vitest';
import type { Receipt, StatusResult } from '../ipc/protocol.js';
import { until } from './helpers/daemon.js';
import { cgroupMount, TEST_CGROUP_PREFIX } from './helpers/cgroup-cleanup.js';
import { NspawnContainer } from './helpers/nspawn.js';

const nspawn = spawnSync('sh', ['-c', 'command -v systemd-nspawn']).status === 0;
const mount = cgroupMount();
// Booted to basic.target, not the host's default: the host's enabled services (a database,
// prometheus, ceph on a CI machine) would boot too, and one slow to start kept the boot
// "starting" past a minute. What is still queued is said if it does not finish.
const container = new NspawnContainer({
  machine: 'sbxtest',
  rootfs: '/tmp/sbx-test-nspawn-root',
  cgroupName: `${TEST_CGROUP_PREFIX}nspawn`,
  bootUnit: 'basic.target',
});

/** Runs a command inside the container (nsenter into every namespace of its PID 1). */
const inside = (args: string[], opts: { allowFail?: boolean } = {}) => container.run(args, opts);

const sbx = (...args: string[]) => inside(['/usr/local/bin/sbx', ...args], { allowFail: true });

/** The delegated cgroup of the unit inside the container (Delegate=yes), where the supervisor enables controllers for its sessions. */
const SERVICE_CGROUP = '/sys/fs/cgroup/system.slice/sandbox-supervisor.service';

/**
 * Why a limit's controller cannot be tested in the container, read from the kernel (null: it
 * can): the unit's delegated cgroup.controllers inside lacks it; the reason names the host's
 * /proc/cgroups binding when the controller is bound to cgroup v1 (cgroups(7)), since a
 * controller is in one hierarchy only and the container's cgroup2 is a child of the host's.
 */
function controllerMissing(controller: string): string | null {
  sbx('status'); // socket-activates the service, so its cgroup is there
  const delegated = inside(['cat', `${SERVICE_CGROUP}/cgroup.controllers`]).stdout.trim();
  if (delegated.split(/\s+/).includes(controller)) return null;
  const hierarchy = Number(new RegExp(`^${controller}\\s+(\\d+)`, 'm').exec(readFileSync('/proc/cgroups', 'utf8'))?.[1] ?? 0);
  const root = inside(['cat', '/sys/fs/cgroup/cgroup.controllers']).stdout.trim() || 'none';
  if (hierarchy > 0)
    return `skipped: the ${controller} controller is bound to cgroup v1 on this host (/proc/cgroups hierarchy ${hierarchy}), so no cgroup v2 here, the container's included, has it (the container's cgroup.controllers: ${root}; its unit's: ${delegated || 'none'})`;
  return `skipped: the container's delegated cgroup has no ${controller} controller (cgroup.controllers of ${SERVICE_CGROUP}: ${delegated || 'none'}; of its root: ${root})`;
}

/** Skips the test (ctx.skip, with the kernel's reason) unless the controller is delegated in the container. */
function needsController(ctx: TestContext, controller: string): void {
  const missing = controllerMissing(controller);
  if (missing) ctx.skip(missing);
}

describe.skipIf(!nspawn || !mount)(
  nspawn ? 'under a real systemd (nspawn)' : 'under a real systemd (skipped: systemd-nspawn is not installed; apt-get install systemd-container)',
  () => {
    beforeAll(() => container.boot(), 180_000);
    afterAll(() => container.cleanUp(), 60_000);

    it('socket-activates the service and puts each session in a leaf of its delegated subtree', () => {
      expect(inside(['systemctl', 'is-active', 'sandbox-supervisor.socket']).stdout.trim()).toBe('active');
      const r = sbx('run', '--cwd', '/', '--receipt', '/tmp/r.json', '--', 'sh', '-c', 'grep ^0:: /proc/self/cgroup; echo hi');
      expect(r.status).toBe(0);
      expect(r.stdout).toMatch(/^0::\/system\.slice\/sandbox-supervisor\.service\/sessions\/s-[0-9a-z]+-[0-9a-f]+\nhi\n$/);
      const receipt = JSON.parse(inside(['cat', '/tmp/r.json']).stdout) as Receipt;
      expect(receipt.death.evidence).toBe('cgroup_empty');
      expect(receipt.death.cgroup).toMatch(/^\/system\.slice\/sandbox-supervisor\.service\/sessions\//);
      expect(inside(['systemctl', 'show', '-p', 'Delegate', '-p', 'Type', 'sandbox-supervisor.service']).stdout).toBe('Type=notify\nDelegate=yes\n');
      // The supervisor itself sits in its own leaf beside the sessions (no internal processes).
      const mainPid = inside(['systemctl', 'show', '-p', 'MainPID', '--value', 'sandbox-supervisor.service']).stdout.trim();
      expect(inside(['grep', '^0::', `/proc/${mainPid}/cgroup`]).stdout.trim()).toBe('0::/system.slice/sandbox-supervisor.service/supervisor');
    });

    it('after a crash, systemd restarts it and the running session is settled: owner_lost, cgroup_empty', async () => {
      expect(sbx('run', '--detach', '--key', 'crash', '--cwd', '/', '--', 'sleep', '300').status).toBe(0);
      const before = inside(['systemctl', 'show', '-p', 'MainPID', '--value', 'sandbox-supervisor.service']).stdout.trim();
      inside(['systemctl', 'kill', '-s', 'KILL', '--kill-whom=main', 'sandbox-supervisor.service']);
      await until(
        () => {
          const now = inside(['systemctl', 'show', '-p', 'MainPID', '--value', 'sandbox-supervisor.service']).stdout.trim();
          return now !== before && now !== '0';
        },
        'the restart',
        30_000,
      );
      const waited = sbx('wait', '--key', 'crash');
      expect(waited.status).toBe(125);
      const receipt = JSON.parse(waited.stdout) as Receipt;
      expect(receipt).toMatchObject({ outcome: 'owner_lost', death: { evidence: 'cgroup_empty' } });
      expect(receipt.supervisor.generation).toBeGreaterThanOrEqual(2);
    });

    it('stopping the service settles every session with a receipt', () => {
      expect(sbx('run', '--detach', '--key', 'stopped', '--cwd', '/', '--', 'sleep', '300').status).toBe(0);
      inside(['systemctl', 'stop', 'sandbox-supervisor.service']);
      const waited = sbx('wait', '--key', 'stopped'); // the socket starts it again
      const receipt = JSON.parse(waited.stdout) as Receipt;
      expect(receipt).toMatchObject({ outcome: 'cancelled', termination: { cause: 'shutdown' }, death: { evidence: 'cgroup_empty' } });
      expect(waited.status).toBe(143);
    });

    it('limits: reports in status which it can enforce, and refuses those its delegated cgroup lacks, naming the controller', () => {
      const status = JSON.parse(sbx('status', '--json').stdout) as StatusResult;
      for (const [controller, flag, value] of [
        ['memory', '--memory', '64M'],
        ['pids', '--pids', '64'],
        ['cpu', '--cpus', '0.5'],
      ] as const) {
        const missing = controllerMissing(controller);
        expect(status.limits![controller], controller).toBe(missing === null);
        if (missing === null) continue;
        const r = sbx('run', flag, value, '--cwd', '/', '--', 'true');
        expect(r.status).toBe(125);
        expect(r.stderr).toMatch(
          new RegExp(
            `^sbx: LIMIT_UNAVAILABLE: ${flag} \\(\\w+\\) needs the ${controller} controller in cgroup v2, and ${SERVICE_CGROUP}/sessions does not have it .*Nothing was run\\.\\n$`,
          ),
        );
      }
    });

    it('limits: a command allocating past --memory 64M ends as an OOM kill, its peak recorded', (ctx) => {
      needsController(ctx, 'memory');
      // b'x' * n writes every page (a bytearray of zeros could stay unbacked).
      const r = sbx('run', '--memory', '64M', '--receipt', '/tmp/oom.json', '--cwd', '/', '--', 'python3', '-c', "x = b'x' * (256 << 20)");
      const receipt = JSON.parse(inside(['cat', '/tmp/oom.json']).stdout) as Receipt;
      expect(r.status).toBe(137);
      expect(receipt).toMatchObject({
        outcome: 'signaled',
        exit: { signal: 'SIGKILL' },
        termination: { cause: 'oom_kill', signal_source: 'not_supervisor' },
        limits: { memory_max_bytes: 64 << 20 },
      });
      expect(receipt.usage.oom_kills).toBeGreaterThanOrEqual(1);
      expect(receipt.usage.memory_peak_bytes).toBeGreaterThan(32 << 20);
      expect(receipt.usage.memory_peak_bytes).toBeLessThanOrEqual((64 << 20) + (1 << 20));
      expect(r.stderr).toMatch(
        new RegExp(`^sbx: killed by the OOM killer at memory\\.max 64 MiB \\(peak [0-9.]+ MiB; sbx receipt ${receipt.session_id}\\)\\n$`),
      );
    });

    it('limits: a fork bomb stops at --pids 64 and the supervisor stays responsive', (ctx) => {
      needsController(ctx, 'pids');
      // Every process forks on for ever (a shell would exit at its first failed fork); each says its first EAGAIN once.
      const bomb = 'my $said = 0; while (1) { next if defined fork; print STDERR "fork: $!\\n" unless $said++; select(undef, undef, undef, 0.01) }';
      expect(sbx('run', '--detach', '--key', 'bomb', '--pids', '64', '--timeout', '3s', '--cwd', '/', '--', 'perl', '-e', bomb).status).toBe(0);
      // While it forks against its bound, status answers, each within 2 s.
      for (let i = 0; i < 5; i++) {
        const t = performance.now();
        expect(sbx('status', '--json').status).toBe(0);
        expect(performance.now() - t).toBeLessThan(2000);
      }
      const waited = sbx('wait', '--key', 'bomb');
      const receipt = JSON.parse(waited.stdout) as Receipt;
      expect(waited.status).toBe(124); // its deadline ended it: the bomb never stopped trying
      expect(receipt.limits).toEqual({ pids_max: 64 });
      expect(receipt.usage.pids_peak).toBeLessThanOrEqual(64);
      expect(receipt.usage.pids_peak).toBeGreaterThanOrEqual(32);
      expect(sbx('logs', '--key', 'bomb').stderr).toContain('fork: Resource temporarily unavailable\n'); // EAGAIN at pids.max
    });

    it('limits: --cpus 0.5 holds a busy loop near half of one CPU (cpu.stat usage_usec over wall time)', (ctx) => {
      needsController(ctx, 'cpu');
      const r = sbx('run', '--cpus', '0.5', '--timeout', '3s', '--receipt', '/tmp/cpu.json', '--cwd', '/', '--', 'sh', '-c', 'while :; do :; done');
      expect(r.status).toBe(124);
      const receipt = JSON.parse(inside(['cat', '/tmp/cpu.json']).stdout) as Receipt;
      expect(receipt.limits).toEqual({ cpus: 0.5 });
      const wallUs = (Date.parse(receipt.leader_exited_at!) - Date.parse(receipt.started_at!)) * 1000;
      const share = receipt.usage.cpu_usec! / wallUs;
      expect(share).toBeGreaterThan(0.35);
      expect(share).toBeLessThan(0.65);
    });
  },
);
