// A real systemd 252 booted as PID 1 in systemd-nspawn (the recipe of docs/design/facts.md, "Testing the
// systemd unit for real"), shared by test/nspawn.test.ts, test/nspawn-remote.test.ts and the
// peer bench: the host root bind-mounted privately and booted with --volatile=overlay from a
// fresh child cgroup of the cgroup2 mount, this checkout bound read-only and installed as the
// unit (scripts/install.sh); commands run inside by nsenter into every namespace of its PID 1.
import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmdirSync } from 'node:fs';
import { join } from 'node:path';
import { cgroupMount, removeCgroupTree, SYSTEMD_V1_MOUNT } from './cgroup-cleanup.js';
import { ROOT, until } from './daemon.js';

export const NSPAWN_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
/** The checkout, bound read-only into the container (the container mounts its own /tmp). */
export const CHECKOUT = '/mnt/sandbox-supervisor-checkout';

/** Why a container cannot be booted here (no systemd-nspawn, not root, no cgroup2), or null. */
export function nspawnUnavailable(): string | null {
  if (spawnSync('sh', ['-c', 'command -v systemd-nspawn']).status !== 0) return 'systemd-nspawn is not installed; apt-get install systemd-container';
  if (process.getuid?.() !== 0) return 'systemd-nspawn needs root';
  if (!cgroupMount()) return 'no cgroup2 mount';
  return null;
}

export interface ContainerOptions {
  /** Machine name (-M), also the hostname inside. */
  machine: string;
  /** Where the host root is bind-mounted (an empty dir made and removed here, never rm -rf'ed). */
  rootfs: string;
  /** Name of the container's cgroup under the cgroup2 mount (made fresh; killed and removed by cleanUp). */
  cgroupName: string;
  /**
   * --private-network (default true): the container has its own loopback only. false: it
   * shares the host's network namespace, so a listener on 127.0.0.1 inside is reached from
   * the host (loopback only: no bridge, no veth).
   */
  privateNetwork?: boolean;
  /** systemd.unit= to boot to (e.g. basic.target: the host's enabled services stay down); default: the default target. */
  bootUnit?: string;
  /** Default deadline of run() and bash() (default 60 s). */
  commandTimeoutMs?: number;
}

export interface InsideResult {
  status: number | null;
  stdout: string;
  stderr: string;
}

export class NspawnContainer {
  private child: ChildProcess | null = null;
  /** The container's PID 1 (systemd) as the host sees it; 0 before boot(). */
  pid1 = 0;
  readonly cgroup: string;

  constructor(private readonly options: ContainerOptions) {
    this.cgroup = join(cgroupMount() ?? '/sys/fs/cgroup', options.cgroupName);
  }

  private mounted(): boolean {
    return spawnSync('mountpoint', ['-q', this.options.rootfs]).status === 0;
  }

  /**
   * Boots the container (after removing what an interrupted run left), waits until systemd says
   * running or degraded (within bootMs), then installs this checkout as the unit and waits for
   * its socket. Throws naming the jobs still queued when the boot does not finish.
   */
  async boot(bootMs = 60_000): Promise<void> {
    const { rootfs, machine } = this.options;
    await this.cleanUp();
    mkdirSync(this.cgroup);
    mkdirSync(rootfs);
    execFileSync('mount', ['--bind', '/', rootfs]);
    execFileSync('mount', ['--make-private', rootfs]);
    const flags = [
      '-D',
      rootfs,
      '--volatile=overlay',
      '--register=no',
      '--keep-unit',
      ...(this.options.privateNetwork === false ? [] : ['--private-network']),
      `--bind-ro=${ROOT}:${CHECKOUT}`,
      '-b',
      '-M',
      machine,
    ];
    if (this.options.bootUnit) flags.push(`systemd.unit=${this.options.bootUnit}`);
    this.child = spawn('sh', ['-c', `echo $$ > ${this.cgroup}/cgroup.procs && exec systemd-nspawn ${flags.join(' ')}`], {
      env: { PATH: NSPAWN_PATH, SYSTEMD_NSPAWN_UNIFIED_HIERARCHY: '1' },
      stdio: ['ignore', 'ignore', 'ignore'],
    });
    // The container's PID 1: nspawn's child that is pid 1 of a new pid namespace (NSpid in
    // /proc/PID/status: "<host pid> 1"). nspawn forks an outer child first, which forks the
    // container's init and exits: taking the first child alone raced with that exit under load.
    this.pid1 = await until(
      () => {
        for (const word of spawnSync('pgrep', ['-P', String(this.child!.pid)], { encoding: 'utf8' })
          .stdout.trim()
          .split('\n')) {
          const pid = Number(word);
          if (!pid) continue;
          let status = '';
          try {
            status = readFileSync(`/proc/${pid}/status`, 'utf8');
          } catch {
            continue; // the outer child, gone meanwhile
          }
          const nspid = /^NSpid:\s*(.*)$/m.exec(status)?.[1]?.trim().split(/\s+/) ?? [];
          if (nspid.length > 1 && nspid[nspid.length - 1] === '1') return pid;
        }
        return 0;
      },
      'the container to start',
      30_000,
    );
    let state: InsideResult | null = null;
    await until(
      () => /^(running|degraded)$/m.test((state = this.run(['systemctl', 'is-system-running'], { allowFail: true })).stdout),
      'the container to boot',
      bootMs,
    ).catch((err: Error) => {
      const said = state ? `${state.stdout.trim()} ${state.stderr.trim()} (exit ${state.status})` : 'nothing';
      throw new Error(
        `${err.message} (systemctl is-system-running said ${said}); jobs still queued:\n${this.run(['systemctl', 'list-jobs', '--no-pager'], { allowFail: true }).stdout}`,
      );
    });
    this.run(['bash', join(CHECKOUT, 'scripts/install.sh')]);
    await until(
      () => this.run(['systemctl', 'is-active', 'sandbox-supervisor.socket'], { allowFail: true }).stdout.trim() === 'active',
      'the socket unit',
      30_000,
    );
  }

  /** The argv that runs args in every namespace of the container's PID 1 (what a harness would exec). */
  nsenter(args: string[]): string[] {
    return ['nsenter', '-t', String(this.pid1), '-a', ...args];
  }

  /** Runs a command inside (nsenter), within timeoutMs; throws on a non-zero exit unless allowFail. */
  run(args: string[], opts: { allowFail?: boolean; input?: string; timeoutMs?: number } = {}): InsideResult {
    const [cmd, ...rest] = this.nsenter(args);
    const r = spawnSync(cmd!, rest, {
      env: { PATH: NSPAWN_PATH, HOME: '/root' },
      encoding: 'utf8',
      input: opts.input,
      timeout: opts.timeoutMs ?? this.options.commandTimeoutMs ?? 60_000,
      maxBuffer: 64 << 20,
    });
    if (!opts.allowFail && r.status !== 0) throw new Error(`inside ${args.join(' ')}: exit ${r.status}\n${r.stdout}\n${r.stderr}`);
    return { status: r.status, stdout: r.stdout, stderr: r.stderr };
  }

  /** bash -c script inside; its stdout, trimmed. */
  bash(script: string, timeoutMs?: number): string {
    return this.run(['bash', '-c', script], { timeoutMs }).stdout.trim();
  }

  /** Powers the container off, kills what is left by its cgroup, unmounts (never rm -rf a bind of /). */
  async cleanUp(): Promise<void> {
    const c = this.child;
    if (c && c.exitCode === null && c.signalCode === null) {
      c.kill('SIGTERM'); // nspawn asks the container's systemd to power off
      await until(() => c.exitCode !== null || c.signalCode !== null, 'the container to power off', 30_000).catch(() => c.kill('SIGKILL'));
    }
    if (existsSync(this.cgroup)) await removeCgroupTree(this.cgroup);
    // On a hybrid host nspawn also places the container in the name=systemd v1 tree, at the same
    // path (empty once it is gone): removed too, or every run left one behind.
    const v1 = join(SYSTEMD_V1_MOUNT, this.options.cgroupName);
    if (existsSync(v1)) await removeCgroupTree(v1);
    if (this.mounted()) execFileSync('umount', [this.options.rootfs]);
    if (existsSync(this.options.rootfs)) rmdirSync(this.options.rootfs);
  }
}
