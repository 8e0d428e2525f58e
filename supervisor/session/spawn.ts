// Starts a session's leader through the exec shim (native-helpers/src/exec-shim.c) with real pipes for
// stdout/stderr (pipe2, not Node's socketpair: docs/design/facts.md 13), stdin from /dev/null (a pipe with
// --stdin, the pty slave with --pty), the argv on a pipe of its own, and a report pipe for what the shim
// states. Owns the fds of one spawn; not the session's decisions (session.ts). See execve(2), pipe(2), and
// the shim's header comment.
import { closeSync, constants, openSync, writeSync } from 'node:fs';
import { dirname } from 'node:path';
import { Socket } from 'node:net';
import { constants as osConstants } from 'node:os';
import { execShimPath, native } from '../../core/fs/native.js';
import type { Reaper } from '../reaper.js';
import { errnoName, systemError } from '../../ipc/errno.js';
import { testHooks } from '../../core/test-hooks.js';

export interface LeaderSpec {
  argv: string[];
  cwd: string;
  env: Record<string, string>;
  /** cgroup mode: the leaf's cgroup.procs, joined before exec. */
  cgroupProcsPath: string | null;
  /** subreaper mode: the shim stays as the session's subreaper. */
  subreaper: boolean;
  /** A pty slave fd for 0, 1 and 2 (the caller keeps it and the master); null: pipes. */
  ptySlaveFd: number | null;
  /** A pipe for stdin that the supervisor writes (--stdin); false: /dev/null (pipe mode). */
  stdinPipe: boolean;
  /** Run as this user (the shim drops to it after joining the cgroup); null: as the supervisor. */
  user: { uid: number; gid: number; name: string | null } | null;
  pipeBytes: number;
}

export interface SpawnFailure {
  stage: string;
  errno: number;
  code: string;
}

export interface LeaderExit {
  code: number | null;
  signal: string | null;
  at: Date;
}

/** Name of a signal number (9 → "SIGKILL"), or "SIG<n>" if unnamed. */
export function signalName(sig: number): string {
  for (const [name, num] of Object.entries(osConstants.signals)) if (num === sig) return name;
  return `SIG${sig}`;
}

/** Number of a signal name ("SIGKILL" → 9); throws RangeError on an unknown one. */
export function signalNumber(name: string): number {
  const key = (name.startsWith('SIG') ? name : `SIG${name}`).toUpperCase() as keyof typeof osConstants.signals;
  const num = osConstants.signals[key];
  if (num === undefined) throw new RangeError(`unknown signal ${name}`);
  return num;
}

/**
 * A started leader: its pid, output read fds, and promises for what the shim reports on the report pipe
 * (exec failures and, in subreaper mode, the leader's status and "all reaped").
 */
export class LeaderProcess {
  readonly pid: number;
  /** Read ends of the output pipes (-1 in pty mode). */
  readonly stdoutFd: number;
  readonly stderrFd: number;
  /** Write end of the stdin pipe (-1 without one). */
  readonly stdinFd: number;
  /** Resolves null when the command exec'ed, else what failed before or at exec. */
  readonly exec: Promise<SpawnFailure | null>;
  /** Resolves when the leader has been reaped (by libuv, or in subreaper mode by the shim). */
  readonly leaderExit: Promise<LeaderExit>;
  /** Subreaper mode: resolves with the orphans reaped once no descendant is left, or null if the shim died first. */
  readonly allReaped: Promise<{ reaped: number } | null>;
  private controlFd = -1;
  /** The shim stays as the session leader until release() (pty sessions). */
  readonly holdsSession: boolean = false;
  /** The shim stays as the session's subreaper (subreaper mode, or a pty's session leader): it reports on its pipe and answers signals. */
  readonly staysAsSubreaper: boolean = false;
  /** The command's pid; the shim's own pid is `pid` (they differ when the shim stays). */
  leaderPid = -1;
  private readonly signaledWaiters: ((pids: number) => void)[] = [];
  /** The shim said "done" or is gone: it answers no signal any more (answerSignaledWaiters). */
  private shimDone = false;
  private readonly reaper: Reaper;

  constructor(spec: LeaderSpec, reaper: Reaper) {
    this.reaper = reaper;
    const n = native();
    const pty = spec.ptySlaveFd;
    // Every pipe or none: one that fails (EMFILE) closes the ones made before it.
    const made: number[] = [];
    const pipe = (): [number, number] => {
      try {
        const p = n.makePipe();
        made.push(p[0], p[1]);
        return p;
      } catch (err) {
        for (const fd of made) closeSync(fd);
        throw err;
      }
    };
    const [stdoutR, stdoutW] = pty === null ? pipe() : [-1, pty];
    const [stderrR, stderrW] = pty === null ? pipe() : [-1, pty];
    const [stdinR, stdinW] = spec.stdinPipe && pty === null ? pipe() : [-1, -1];
    const [reportR, reportW] = pipe();
    const [argvR, argvPipeW] = pipe();
    const argv = encodeArgv(spec.argv);
    // -1 once argv is all in the pipe (written before the spawn when it fits: see fillPipe).
    const argvW = fillPipe(argvPipeW, argv) ? -1 : argvPipeW;
    // Ours to close once the child has them (the pty slave is the caller's).
    const fds = [reportW, argvR, ...(pty === null ? [stdoutW, stderrW] : []), ...(stdinR >= 0 ? [stdinR] : [])];
    let controlR = -1;
    // A pty session's shim stays as the tty's session leader until released (see --hold).
    this.holdsSession = pty !== null;
    const tini = spec.subreaper || this.holdsSession;
    this.staysAsSubreaper = tini;
    if (tini) {
      [controlR, this.controlFd] = pipe();
      fds.push(controlR);
    }
    for (const fd of pty === null ? [stdoutR, stderrR] : []) {
      try {
        n.setPipeSize(fd, spec.pipeBytes);
      } catch {
        // EPERM above /proc/sys/fs/pipe-max-size: keep the default capacity.
      }
    }
    // The shim joins the cgroup itself (cgroup.procs) only when it could not be born there.
    const shimArgs = (join: boolean): string[] => [execShimPath(), ...(join && spec.cgroupProcsPath ? ['--cgroup-procs', spec.cgroupProcsPath] : []), ...args];
    const args = ['--parent-pid', String(process.pid), '--report-fd', '3', '--cwd', spec.cwd];
    if (spec.user) {
      args.push('--uid', String(spec.user.uid), '--gid', String(spec.user.gid));
      if (spec.user.name) args.push('--user', spec.user.name);
    }
    if (pty !== null) args.push('--setctty');
    if (tini) args.push('--subreaper', '--control-fd', '4');
    if (this.holdsSession) args.push('--hold');
    if (spec.cgroupProcsPath) args.push('--no-forward');
    args.push('--argv-fd', String(tini ? 5 : 4));
    const stdin = pty !== null ? pty : stdinR >= 0 ? stdinR : -1; // -1: /dev/null
    let pid: number | undefined;
    let failure: SpawnFailure | null = null; // the shim's own exec refused
    let spawnError: NodeJS.ErrnoException | null = null;
    try {
      // Spawned by the addon, not child_process. In cgroup mode the shim is born in its leaf
      // (clone3 CLONE_INTO_CGROUP|CLONE_VFORK, and CLONE_VM on x86_64: no page tables copied,
      // no migration through cgroup.procs, which waits for an RCU grace period: 2-20 ms here);
      // else posix_spawn, which shares the page tables until the exec (CLONE_VM|CLONE_VFORK)
      // where libuv forks. Detached (its own session and process group, like a systemd
      // service), cwd "/", every signal at its default, none blocked.
      const env = Object.entries(spec.env).map(([k, v]) => `${k}=${v}`);
      const childFds = [stdin, stdoutW, stderrW, reportW, ...(tini ? [controlR] : []), argvR];
      pid =
        (spec.cgroupProcsPath ? spawnInCgroup(dirname(spec.cgroupProcsPath), shimArgs(false), env, childFds) : undefined) ??
        native().spawnDetached(execShimPath(), shimArgs(true), env, childFds);
    } catch (err) {
      const e = systemError(err);
      if (typeof e.errno !== 'number') {
        for (const fd of [stdoutR, stderrR, stdinW, reportR, argvW, this.controlFd]) if (fd >= 0) closeSync(fd);
        throw err;
      }
      // E2BIG: the kernel refused the shim's own exec, its environment is over ARG_MAX or an
      // entry over MAX_ARG_STRLEN. The command's exec would meet the same: reported as its
      // exec failure, like the shim's "error exec 7". Any other (EAGAIN, ENOMEM, the shim
      // missing): the command never ran.
      if (e.code === 'E2BIG') failure = { stage: 'exec', errno: osConstants.errno.E2BIG, code: 'E2BIG' };
      else spawnError = e;
    } finally {
      for (const fd of fds) closeSync(fd);
    }
    this.stdoutFd = stdoutR;
    this.stderrFd = stderrR;
    this.stdinFd = stdinW;
    if (pid === undefined) {
      // libuv could not start the shim at all (EAGAIN, ENOMEM, E2BIG): the command never ran.
      closeSync(reportR);
      if (argvW >= 0) closeSync(argvW);
      if (this.controlFd >= 0) closeSync(this.controlFd);
      this.controlFd = -1;
      this.pid = -1;
      this.exec = new Promise((resolve) => setImmediate(() => resolve(failure ?? { stage: 'spawn', errno: 0, code: spawnError?.code ?? 'EAGAIN' })));
      this.leaderExit = Promise.resolve({ code: null, signal: null, at: new Date() });
      this.allReaped = Promise.resolve({ reaped: 0 });
      return;
    }
    this.pid = pid;
    this.leaderPid = pid;
    const shimExit = new Promise<{ code: number | null; signal: string | null; at: Date }>((resolve) => {
      // A shim that stays is never left stopped (a command's kill -STOP $PPID, or kill -STOP 0
      // while it shares the shim's process group): it reports the leader and answers signals.
      reaper.adopt(pid!, (exit) => resolve({ code: exit.code, signal: exit.signal === null ? null : signalName(exit.signal), at: new Date() }), tini);
    });
    if (argvW >= 0) writeAsync(argvW, argv);

    const lines = readLines(reportR);

    if (!tini) {
      // Exec mode: EOF on the report pipe with no "error" line means the exec succeeded.
      this.exec = lines.all.then((all) => parseFailure(all));
      this.leaderExit = shimExit;
      this.allReaped = Promise.resolve(null);
      return;
    }
    let execResolve!: (f: SpawnFailure | null) => void;
    let leaderResolve!: (e: LeaderExit) => void;
    let doneResolve!: (d: { reaped: number } | null) => void;
    this.exec = new Promise((r) => (execResolve = r));
    this.leaderExit = new Promise((r) => (leaderResolve = r));
    this.allReaped = new Promise((r) => (doneResolve = r));
    // The report's lines (exec-shim.c): started, error, leader, signaled (a control byte's
    // answer, in order), done; "forwarded" (a signal sent to the shim itself) answers no request.
    lines.onLine = (line) => {
      const [word, a, b] = line.split(' ');
      if (word === 'started') {
        if (testHooks.shimStartUnheard) return;
        this.leaderPid = Number(a);
        execResolve(null);
      } else if (word === 'error') {
        const failure = parseFailure([line]);
        execResolve(failure);
        leaderResolve({ code: null, signal: null, at: new Date() });
        doneResolve({ reaped: 0 });
      } else if (word === 'leader') {
        leaderResolve(a === 'exit' ? { code: Number(b), signal: null, at: new Date() } : { code: null, signal: signalName(Number(b)), at: new Date() });
      } else if (word === 'signaled') this.signaledWaiters.shift()?.(Number(b));
      else if (word === 'done') {
        doneResolve({ reaped: Number(a) });
        this.answerSignaledWaiters();
      }
    };
    void shimExit.then(async (shim) => {
      await lines.all;
      // The shim is gone without saying "done": there is no proof, say so. Nor, if it never
      // said "leader", an exit status: the leader's end is not known (no status is made up;
      // the session goes unknown), but it is not waited for any more.
      doneResolve(null);
      this.answerSignaledWaiters();
      execResolve({ stage: 'shim', errno: 0, code: 'ESRCH' });
      leaderResolve({ code: null, signal: null, at: shim.at });
    });
  }

  /**
   * Delivers sig to every process of the session. Subreaper mode: through the shim, which
   * walks its descendants; resolves with how many pids it reached, or null when the shim did
   * not answer within SHIM_ANSWER_MS (it still may: its answer then fills this request's place in
   * the queue). A stopped shim is continued first (SIGCONT). Exec mode: not used (the cgroup
   * is the session; see CgroupLeaf.signalAll).
   */
  signalViaShim(sig: number): Promise<number | null> {
    if (this.controlFd < 0 || this.shimDone) return Promise.resolve(0);
    this.reaper.continueIfStopped(this.pid);
    return new Promise((resolve) => {
      const timer = setTimeout(() => resolve(null), SHIM_ANSWER_MS);
      this.signaledWaiters.push((pids) => {
        clearTimeout(timer);
        resolve(pids);
      });
      try {
        writeSync(this.controlFd, Buffer.from([sig]));
      } catch {
        this.signaledWaiters.pop();
        clearTimeout(timer);
        resolve(0);
      }
    });
  }

  /**
   * Resolves once exec is reported (or failed), or once SHIM_ANSWER_MS pass without it: a shim
   * that stays can be stopped by its command (kill -STOP $PPID right after exec) before it writes
   * "started"; the reaper continues it (Reaper.adopt keepRunning), but a shim stopped again and
   * again must not hold whoever waits past the bound. Exec mode: exec itself, unbounded (the
   * report is the pipe's EOF at exec, no command runs before it). True when exec was heard.
   */
  async execHeardWithin(): Promise<boolean> {
    if (!this.staysAsSubreaper) {
      await this.exec;
      return true;
    }
    let timer: NodeJS.Timeout | undefined;
    const heard = await Promise.race([this.exec.then(() => true), new Promise<boolean>((r) => (timer = setTimeout(() => r(false), SHIM_ANSWER_MS)))]);
    clearTimeout(timer);
    return heard;
  }

  /**
   * The last resort for a shim that no longer answers (subreaper mode, past the kill bound):
   * the supervisor SIGKILLs the shim's descendants and the shim itself (Reaper.killTree).
   * The shim then reports nothing more: no proof, the session goes unknown. Returns how many
   * pids the KILL reached; 0 once the shim was reaped.
   */
  killShimTree(): number {
    return this.reaper.killTree(this.pid);
  }

  /**
   * Once the shim has said "done" (or is gone): it reads the control pipe no more, or only to
   * hold the tty (--hold), and answers no signal; nothing of the session is left to reach, so
   * each signal still waiting reached 0 pids, and later ones resolve 0 at once.
   */
  private answerSignaledWaiters(): void {
    this.shimDone = true;
    for (const waiter of this.signaledWaiters.splice(0)) waiter(0);
  }

  /** Closes the control pipe (subreaper mode) once the session is over. */
  release(): void {
    if (this.controlFd >= 0) {
      closeSync(this.controlFd);
      this.controlFd = -1;
    }
  }
}

/** Whether clone3(CLONE_INTO_CGROUP) works here; false once the kernel said it has none. */
let cloneIntoCgroup = true;

/**
 * The shim spawned born in the cgroup at dir (see native spawnDetached), or undefined when it
 * could not be (no clone3 or CLONE_INTO_CGROUP in this kernel, or the cgroup refused): the
 * caller then spawns it to join by cgroup.procs, which reports any refusal as before. Errors
 * of the spawn itself (EAGAIN, ENOMEM, the exec's) are thrown.
 */
function spawnInCgroup(dir: string, argv: string[], env: string[], fds: number[]): number | undefined {
  if (!cloneIntoCgroup) return undefined;
  let cgroupFd: number;
  try {
    cgroupFd = openSync(dir, constants.O_RDONLY | constants.O_DIRECTORY);
  } catch {
    return undefined;
  }
  try {
    return native().spawnDetached(argv[0]!, argv, env, fds, cgroupFd);
  } catch (err) {
    const e = systemError(err);
    if (e.syscall !== 'clone3' || !['ENOSYS', 'EINVAL', 'EBUSY', 'EOPNOTSUPP', 'EACCES', 'EPERM'].includes(e.code ?? '')) throw err;
    if (e.code === 'ENOSYS' || e.code === 'EINVAL') cloneIntoCgroup = false;
    return undefined;
  } finally {
    closeSync(cgroupFd);
  }
}

/**
 * argv as the shim's --argv-fd wants it: count and bytes (u64 little-endian), then each string UTF-8 and
 * NUL-terminated. On a pipe of its own, so only the command's exec can meet E2BIG, and the shim reports it.
 */
function encodeArgv(argv: string[]): Buffer {
  const strings = argv.join('\0') + '\0'; // no NUL inside an argument (ipc/schemas.ts)
  const bytes = Buffer.byteLength(strings);
  const payload = Buffer.allocUnsafe(16 + bytes);
  payload.writeBigUInt64LE(BigInt(argv.length), 0);
  payload.writeBigUInt64LE(BigInt(bytes), 8);
  payload.write(strings, 16, 'utf8');
  return payload;
}

/** An unprivileged supervisor's argv pipe can be raised this far: the default /proc/sys/fs/pipe-max-size. */
const PIPE_MAX_BYTES = 1024 * 1024;

/** How long a signal through the shim waits for its "signaled" answer before it is taken as unanswered (ms): 5 s (a test may set it: SBX_TEST_SHIM_ANSWER_MS). */
const SHIM_ANSWER_MS = testHooks.shimAnswerMs;

/**
 * Writes payload into the fresh, empty pipe whose write end is fd and closes fd, if it fits
 * the pipe's capacity. One page always does; for more the pipe is first raised to the
 * payload's size (F_SETPIPE_SZ: root may, CAP_SYS_RESOURCE), else to pipe-max-size. A write
 * that fits an empty pipe never blocks (its cost is a copy, as for any buffer), and the shim
 * then finds its argv and EOF at once, without waiting for the event loop. false (fd left
 * open, the pipe raised as far as it went): it does not fit; see writeAsync.
 */
function fillPipe(fd: number, payload: Buffer): boolean {
  let capacityBytes = 4096;
  for (const bytes of payload.length > capacityBytes ? [payload.length, PIPE_MAX_BYTES] : []) {
    try {
      capacityBytes = native().setPipeSize(fd, bytes);
      break;
    } catch {
      // EPERM: above pipe-max-size, or over the user's pipe quota; try less, else keep it.
    }
  }
  if (payload.length > capacityBytes) return false;
  for (let off = 0; off < payload.length;) off += writeSync(fd, payload, off);
  closeSync(fd);
  return true;
}

/**
 * Writes payload to fd (a pipe's write end, which this closes after the last byte) through
 * a net.Socket: asynchronous, so an argv of MiBs never blocks the event loop on a pipe that
 * holds less. A shim gone (EPIPE) is not an error here: its exit and report say what happened.
 */
function writeAsync(fd: number, payload: Buffer): void {
  const socket = new Socket({ fd, readable: false, writable: true });
  socket.on('error', () => {});
  socket.write(payload, () => socket.destroy());
}

function parseFailure(lines: string[]): SpawnFailure | null {
  for (const line of lines) {
    const m = /^error (\w+) (\d+)$/.exec(line);
    if (m) return { stage: m[1], errno: Number(m[2]), code: errnoName(Number(m[2])) ?? `E${m[2]}` };
  }
  return null;
}

/** Reads a pipe fd line by line until EOF. */
function readLines(fd: number): { all: Promise<string[]>; onLine: (line: string) => void } {
  const out = { all: Promise.resolve([] as string[]), onLine: (_line: string) => {} };
  const socket = new Socket({ fd, readable: true, writable: false, allowHalfOpen: true });
  const lines: string[] = [];
  let partial = '';
  out.all = new Promise((resolve) => {
    socket.on('data', (data: Buffer) => {
      partial += data.toString('utf8');
      let nl: number;
      while ((nl = partial.indexOf('\n')) >= 0) {
        const line = partial.slice(0, nl);
        partial = partial.slice(nl + 1);
        lines.push(line);
        out.onLine(line);
      }
    });
    const end = () => resolve(lines);
    socket.on('end', end);
    socket.on('error', end);
    socket.on('close', end);
  });
  return out;
}
