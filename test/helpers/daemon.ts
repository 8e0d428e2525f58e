// Boots a real supervisor (the compiled dist/, as users run it) in a temp dir with its own
// socket, state dir and cgroup subtree, and drives it through sbx or the client library.
// stop() settles it with SIGTERM and removes everything it made, also after a failure.
import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, openSync, readdirSync, readFileSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { SupervisorClient } from '../../ipc/client.js';
import { cgroupMount, removeCgroupTree, TEST_CGROUP_PREFIX } from './cgroup-cleanup.js';
import { SUPERVISOR_NODE_FLAGS } from '../../supervisor/node-flags.js';

export const ROOT = resolve(import.meta.dirname, '../..');
export const SBX = join(ROOT, 'dist/cli/sbx.js');
/** The `sbx` bin as users run it: the launcher (cli/sbx-launcher.sh), which starts its bundle. */
export const SBX_BIN = join(ROOT, 'dist/cli/sbx');
export const DAEMON = join(ROOT, 'dist/supervisor/main.js');
/** node's arguments before `serve`: the flags every start of the supervisor passes (supervisor/node-flags.ts), then DAEMON. */
export const DAEMON_ARGV: readonly string[] = [...SUPERVISOR_NODE_FLAGS, DAEMON];
/** Small programs the tests run, named for what they do (test/fixtures/programs/). */
export const PROGRAMS = join(ROOT, 'test/fixtures/programs');

export interface DaemonOptions {
  /** Extra config keys (merged over the test defaults). */
  config?: Record<string, unknown>;
  /** Where the socket goes (default: the daemon's private temp dir). */
  socketPath?: string;
  /**
   * Prefix of its cgroup parent (default "sbx-test-", which the test suite's teardown
   * sweeps: the probe and bench harnesses use their own so a concurrent `npm test` leaves
   * theirs alone).
   */
  cgroupPrefix?: string;
  /** Extra environment for the daemon (e.g. SBX_FAULT_POINT, core/fault.ts). */
  env?: NodeJS.ProcessEnv;
  /** A command the daemon is exec'ed through (e.g. setpriv dropping a capability); its pid is the daemon's. */
  wrap?: string[];
  /** node's flags before DAEMON (default SUPERVISOR_NODE_FLAGS, as every start passes them). */
  nodeFlags?: readonly string[];
}

export interface SbxResult {
  status: number | null;
  signal: NodeJS.Signals | null;
  stdout: Buffer;
  stderr: Buffer;
}

/** Polls cond every 20 ms until it is truthy or deadlineMs passes (then throws what); the monotonic clock. */
export async function until<T>(cond: () => T | Promise<T>, what: string, deadlineMs = 10_000): Promise<NonNullable<T>> {
  const end = performance.now() + deadlineMs;
  for (;;) {
    const v = await cond();
    if (v) return v as NonNullable<T>;
    if (performance.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** p, or an Error naming what once deadlineMs passed first (a supervisor that hangs fails the test, not the run). */
export async function within<T>(p: Promise<T>, what: string, deadlineMs = 10_000): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), deadlineMs)));
  try {
    return await Promise.race([p, late]);
  } finally {
    clearTimeout(timer);
  }
}

export const sha256 = (b: Uint8Array | string) => createHash('sha256').update(b).digest('hex');

/** Every process now with the fields of /proc/PID/stat after its (comm): [state, ppid, pgrp, ...] (proc(5)). */
function procStats(): { pid: number; fields: string[] }[] {
  const out: { pid: number; fields: string[] }[] = [];
  for (const name of readdirSafe('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
      out.push({ pid: Number(name), fields: stat.slice(stat.lastIndexOf(')') + 2).split(' ') });
    } catch {
      // gone
    }
  }
  return out;
}

/** Zombie children of pid right now. */
export function zombieChildren(pid: number): number[] {
  return procStats()
    .filter((p) => p.fields[0] === 'Z' && Number(p.fields[1]) === pid)
    .map((p) => p.pid);
}

/** Pids of the live (not zombie) processes whose process group is pgid. */
export function pidsInGroup(pgid: number): number[] {
  return procStats()
    .filter((p) => p.fields[0] !== 'Z' && Number(p.fields[2]) === pgid)
    .map((p) => p.pid);
}

/** The parent pid of pid (field 4 of /proc/<pid>/stat: proc(5)); for a leader, its exec shim. */
export function parentPid(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
}

/** Pids whose command line contains marker (a unique string the test put there). */
export function pidsWithMarker(marker: string): number[] {
  const out: number[] = [];
  for (const name of readdirSafe('/proc')) {
    if (!/^\d+$/.test(name) || Number(name) === process.pid) continue;
    try {
      const cmd = readFileSync(`/proc/${name}/cmdline`, 'utf8');
      const state = readFileSync(`/proc/${name}/stat`, 'utf8');
      if (cmd.includes(marker) && state.slice(state.lastIndexOf(')') + 2)[0] !== 'Z') out.push(Number(name));
    } catch {
      // gone
    }
  }
  return out;
}

/**
 * What a daemon that did not exit on SIGTERM was doing (read before its SIGKILL): every
 * process under it (state, wchan, argv, fds), its threads' wchan, and its log's last lines.
 * proc(5): /proc/PID/{stat,wchan,cmdline,fd}.
 */
export function hangReport(pid: number, logPath: string): string {
  const read = (path: string): string => {
    try {
      return readFileSync(path, 'utf8');
    } catch {
      return '?';
    }
  };
  const all = procStats();
  const tree: number[] = [pid];
  for (let i = 0; i < tree.length; i++) for (const p of all) if (Number(p.fields[1]) === tree[i]) tree.push(p.pid);
  const lines = tree.map((p) => {
    const stat = all.find((s) => s.pid === p)?.fields ?? [];
    const fds = readdirSafe(`/proc/${p}/fd`).map((fd) => {
      try {
        return `${fd}->${readlinkSync(`/proc/${p}/fd/${fd}`)}`;
      } catch {
        return fd;
      }
    });
    return `pid ${p} ppid ${stat[1]} state ${stat[0]} wchan ${read(`/proc/${p}/wchan`)} argv ${read(`/proc/${p}/cmdline`).split('\0').join(' ')}\n  fds ${fds.join(' ')}`;
  });
  const threads = readdirSafe(`/proc/${pid}/task`).map((t) => `${t}:${read(`/proc/${pid}/task/${t}/comm`).trim()}:${read(`/proc/${pid}/task/${t}/wchan`)}`);
  let log = '';
  try {
    log = readFileSync(logPath, 'utf8').split('\n').slice(-120).join('\n');
  } catch {
    // no log
  }
  return `${lines.join('\n')}\nthreads ${threads.join(' ')}\nlog (last 120 lines):\n${log}`;
}

function readdirSafe(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return [];
  }
}

/** Runs sbx (the bin, as users do: SBX_BIN) with args against the supervisor at socketPath; resolves with its status and exact bytes. */
export function runSbx(socketPath: string, args: string[], opts: { input?: Buffer | string; cwd?: string; env?: NodeJS.ProcessEnv } = {}): Promise<SbxResult> {
  return new Promise((resolvePromise, reject) => {
    const child = spawn(SBX_BIN, args, {
      cwd: opts.cwd ?? '/',
      env: { ...process.env, SBX_SOCKET: socketPath, ...opts.env },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (d: Buffer) => out.push(d));
    child.stderr.on('data', (d: Buffer) => err.push(d));
    child.on('error', reject);
    child.on('close', (status, signal) => resolvePromise({ status, signal, stdout: Buffer.concat(out), stderr: Buffer.concat(err) }));
    child.stdin.end(opts.input ?? '');
  });
}

/**
 * rm -rf of dir, also a tree deeper than PATH_MAX (a test's workspace of 1,500 levels):
 * node's rmSync walks by path and recursion and fails there (ENAMETOOLONG, RangeError);
 * rm(1) walks by directory fd.
 */
export function removeTree(dir: string): void {
  try {
    rmSync(dir, { recursive: true, force: true });
  } catch (err) {
    // ENAMETOOLONG past PATH_MAX; RangeError (its recursion) thousands of levels down.
    if ((err as NodeJS.ErrnoException).code !== 'ENAMETOOLONG' && !(err instanceof RangeError)) throw err;
    execFileSync('rm', ['-rf', '--one-file-system', dir]);
  }
}

export class TestDaemon {
  readonly dir: string;
  readonly socketPath: string;
  readonly stateDir: string;
  readonly cgroupParent: string;
  readonly logPath: string;
  private child: ChildProcess | null = null;
  private exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }> | null = null;
  private readonly clients: SupervisorClient[] = [];

  constructor(private readonly options: DaemonOptions = {}) {
    this.dir = mkdtempSync(join(tmpdir(), options.cgroupPrefix ?? 'sbx-test-'));
    this.socketPath = options.socketPath ?? join(this.dir, 'supervisor.sock');
    this.stateDir = join(this.dir, 'state');
    this.cgroupParent = `/${options.cgroupPrefix ?? TEST_CGROUP_PREFIX}${process.pid}-${randomBytes(4).toString('hex')}`;
    this.logPath = join(this.dir, 'supervisor.log');
  }

  get pid(): number {
    return this.child?.pid ?? -1;
  }

  /** The daemon's extra environment from the next start() on (e.g. a fault point, or none). */
  withEnv(env: NodeJS.ProcessEnv | undefined): this {
    this.options.env = env;
    return this;
  }

  /** Config keys merged over the current ones from the next start() on (e.g. paths made in this.dir). */
  withConfig(config: Record<string, unknown>): this {
    this.options.config = { ...this.options.config, ...config };
    return this;
  }

  /** Resolves once the daemon process has exited (a fault point killed it, say). */
  async exitedNow(): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
    for (const c of this.clients.splice(0)) c.close();
    return this.exited!;
  }

  get cgroupBase(): string | null {
    const mount = cgroupMount();
    return mount ? join(mount, this.cgroupParent) : null;
  }

  /** Starts the daemon and waits until its socket answers. */
  async start(): Promise<this> {
    const config = {
      logLevel: 'debug',
      cgroup: { parent: this.cgroupParent },
      drain: { postDeathDrainMs: 2000 },
      ...this.options.config,
    };
    const configPath = join(this.dir, 'config.json');
    writeFileSync(configPath, JSON.stringify(config));
    const logFd = openSync(this.logPath, 'a');
    const argv = [
      ...(this.options.wrap ?? []),
      process.execPath,
      ...(this.options.nodeFlags ?? SUPERVISOR_NODE_FLAGS),
      DAEMON,
      'serve',
      '--config',
      configPath,
    ];
    this.child = spawn(argv[0], argv.slice(1), {
      env: { ...process.env, SBX_SOCKET: this.socketPath, SBX_STATE_DIR: this.stateDir, ...this.options.env },
      stdio: ['ignore', logFd, logFd],
    });
    this.exited = new Promise((r) => this.child!.on('exit', (code, signal) => r({ code, signal })));
    let exitedEarly = false;
    void this.exited.then(() => (exitedEarly = true));
    await until(async () => {
      if (exitedEarly) throw new Error(`supervisor exited at start-up:\n${this.log()}`);
      if (!existsSync(this.socketPath)) return false;
      try {
        (await SupervisorClient.connect({ socketPath: this.socketPath })).close();
        return true;
      } catch {
        return false;
      }
    }, 'the supervisor socket');
    return this;
  }

  log(): string {
    try {
      return readFileSync(this.logPath, 'utf8');
    } catch {
      return '';
    }
  }

  /** A connected client library instance (closed by stop()). */
  async client(): Promise<SupervisorClient> {
    const c = await SupervisorClient.connect({ socketPath: this.socketPath, clientName: 'test' });
    this.clients.push(c);
    return c;
  }

  /** Runs sbx with args against this daemon; resolves with its status and exact bytes. */
  sbx(args: string[], opts: { input?: Buffer | string; cwd?: string; env?: NodeJS.ProcessEnv } = {}): Promise<SbxResult> {
    return runSbx(this.socketPath, args, { ...opts, cwd: opts.cwd ?? this.dir });
  }

  /** sbx synchronously (for simple calls in assertions). */
  sbxSync(args: string[]): SbxResult {
    const r = spawnSync(SBX_BIN, args, { env: { ...process.env, SBX_SOCKET: this.socketPath }, cwd: this.dir });
    return { status: r.status, signal: r.signal, stdout: r.stdout, stderr: r.stderr };
  }

  /** SIGKILL to the daemon (by pid), as a crash: its sessions and state stay for a restart. */
  async kill9(): Promise<void> {
    for (const c of this.clients.splice(0)) c.close();
    if (!this.child || !this.exited) return;
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGKILL');
    await this.exited;
  }

  /**
   * SIGTERM to the daemon (by pid) and its exit status; files and cgroups stay for inspection.
   * Not gone within 30 s: SIGKILL, and the result carries `hung`, what it was doing (hangReport),
   * so an assertion on the exit status shows it.
   */
  async terminate(): Promise<{ code: number | null; signal: NodeJS.Signals | null; hung?: string } | null> {
    for (const c of this.clients.splice(0)) c.close();
    if (!this.child || !this.exited) return null;
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGTERM');
    let hung: string | undefined;
    const timer = setTimeout(() => {
      hung = hangReport(this.pid, this.logPath);
      this.child?.kill('SIGKILL');
    }, 30_000);
    const result = await this.exited;
    clearTimeout(timer);
    return hung === undefined ? result : { ...result, hung };
  }

  /** terminate(), then remove the cgroup subtree (killing leftovers) and the temp dir. */
  async stop(): Promise<{ code: number | null; signal: NodeJS.Signals | null; hung?: string } | null> {
    const result = await this.terminate();
    const base = this.cgroupBase;
    if (base) await removeCgroupTree(base);
    removeTree(this.dir);
    return result;
  }
}
