// The systemd unit for real: boot systemd 252 as PID 1 in systemd-nspawn (recipe in
// docs/design/facts.md, "Testing the systemd unit for real"): the host root bind-mounted privately and
// booted with --volatile=overlay to basic.target, from a fresh child cgroup of the cgroup2 mount. Inside:
// install.sh, socket activation, a session in its leaf under the service's delegated
// subtree, a crash (reconciliation after Restart=on-failure) and a stop (every session
// settled). Skips, saying why, where systemd-nspawn is not installed (.ci/run installs it).
import { spawnSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Receipt } from '../ipc/protocol.js';
import { until } from './helpers/daemon.js';
import { cgroupMount, TEST_CGROUP_PREFIX } from './helpers/cgroup-cleanup.js';
import { NspawnContainer } from './helpers/nspawn.js';

const nspawn = spawnSync('sh', ['-c', 'command -v systemd-nspawn']).status === 0;
const mount = cgroupMount();
// Booted to basic.target, not the host's default: the host's enabled services (a database,
// prometheus, ceph on a CI machine) would boot too, and one slow to start kept the boot
// "starting" past a minute. What is still queued is said if it does not finish.
const container = new NspawnContainer({ machine: 'sbxtest', rootfs: '/tmp/sbx-test-nspawn-root', cgroupName: `${TEST_CGROUP_PREFIX}nspawn`, bootUnit: 'basic.target' });

/** Runs a command inside the container (nsenter into every namespace of its PID 1). */
const inside = (args: string[], opts: { allowFail?: boolean } = {}) => container.run(args, opts);

const sbx = (...args: string[]) => inside(['/usr/local/bin/sbx', ...args], { allowFail: true });

describe.skipIf(!nspawn || !mount)(nspawn ? 'under a real systemd (nspawn)' : 'under a real systemd (skipped: systemd-nspawn is not installed; apt-get install systemd-container)', () => {
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
    await until(() => {
      const now = inside(['systemctl', 'show', '-p', 'MainPID', '--value', 'sandbox-supervisor.service']).stdout.trim();
      return now !== before && now !== '0';
    }, 'the restart', 30_000);
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
});

