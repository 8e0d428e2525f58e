// The systemd unit for real: boot systemd 252 as PID 1 in systemd-nspawn (recipe in
// DESIGN.md, "Testing the systemd unit for real"): the host root bind-mounted privately and
// booted with --volatile=overlay to basic.target, from a fresh child cgroup of the cgroup2 mount. Inside:
// install.sh, socket activation, a session in its leaf under the service's delegated
// subtree, a crash (reconciliation after Restart=on-failure) and a stop (every session
// settled). Skips, saying why, where systemd-nspawn is not installed (.ci/run installs it).
import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, rmdirSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Receipt } from '../ipc/protocol.js';
import { ROOT, until } from './helpers/daemon.js';
import { cgroupMount, removeCgroupTree, TEST_CGROUP_PREFIX } from './helpers/cgroup-cleanup.js';

const nspawn = spawnSync('sh', ['-c', 'command -v systemd-nspawn']).status === 0;
const mount = cgroupMount();
const CG = mount ? join(mount, `${TEST_CGROUP_PREFIX}nspawn`) : '';
const ROOTFS = '/tmp/sbx-test-nspawn-root';
const PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
/** The checkout, bound read-only into the container (the container mounts its own /tmp). */
const CHECKOUT = '/mnt/sandbox-supervisor-checkout';
let container: ChildProcess | null = null;
let pid1 = 0;

const mounted = () => spawnSync('mountpoint', ['-q', ROOTFS]).status === 0;

/** Everything a run (this one, or an interrupted one before it) may have left. */
async function cleanUp(): Promise<void> {
  if (container && container.exitCode === null) {
    container.kill('SIGTERM'); // nspawn asks the container's systemd to power off
    await until(() => container!.exitCode !== null || container!.signalCode !== null, 'the container to power off', 30_000).catch(() => container!.kill('SIGKILL'));
  }
  if (CG && existsSync(CG)) await removeCgroupTree(CG); // kills what is left, by cgroup
  if (mounted()) execFileSync('umount', [ROOTFS]);
  if (existsSync(ROOTFS)) rmdirSync(ROOTFS); // an empty dir once unmounted: never rm -rf a bind of /
}

/** Runs a command inside the container (nsenter into every namespace of its PID 1). */
function inside(args: string[], opts: { allowFail?: boolean } = {}): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync('nsenter', ['-t', String(pid1), '-a', ...args], { env: { PATH, HOME: '/root' }, encoding: 'utf8', timeout: 60_000 });
  if (!opts.allowFail && r.status !== 0) throw new Error(`inside ${args.join(' ')}: exit ${r.status}\n${r.stdout}\n${r.stderr}`);
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

const sbx = (...args: string[]) => inside(['/usr/local/bin/sbx', ...args], { allowFail: true });

describe.skipIf(!nspawn || !mount)(nspawn ? 'under a real systemd (nspawn)' : 'under a real systemd (skipped: systemd-nspawn is not installed; apt-get install systemd-container)', () => {
  beforeAll(async () => {
    await cleanUp();
    mkdirSync(CG);
    mkdirSync(ROOTFS);
    execFileSync('mount', ['--bind', '/', ROOTFS]);
    execFileSync('mount', ['--make-private', ROOTFS]);
    container = spawn('sh', ['-c', `echo $$ > ${CG}/cgroup.procs && exec systemd-nspawn -D ${ROOTFS} --volatile=overlay --register=no --keep-unit --private-network --bind-ro=${ROOT}:${CHECKOUT} -b -M sbxtest systemd.unit=basic.target`], {
      env: { PATH, SYSTEMD_NSPAWN_UNIFIED_HIERARCHY: '1' },
      stdio: ['ignore', 'ignore', 'ignore'],
    });
    pid1 = await until(() => {
      const children = spawnSync('pgrep', ['-P', String(container!.pid)], { encoding: 'utf8' }).stdout.trim();
      return Number(children.split('\n')[0]) || 0;
    }, 'the container to start', 30_000);
    // Booted to basic.target, not the host's default: the host's enabled services (a database,
    // prometheus, ceph on a CI machine) would boot too, and one slow to start kept the boot
    // "starting" past a minute. What is still queued is said if it does not finish.
    await until(() => /^(running|degraded)$/m.test(inside(['systemctl', 'is-system-running'], { allowFail: true }).stdout), 'the container to boot', 60_000).catch((err: Error) => {
      throw new Error(`${err.message}; jobs still queued:\n${inside(['systemctl', 'list-jobs', '--no-pager'], { allowFail: true }).stdout}`);
    });
    inside(['bash', join(CHECKOUT, 'scripts/install.sh')]);
  }, 180_000);
  afterAll(cleanUp, 60_000);

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

