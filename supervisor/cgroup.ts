// cgroup v2 for sessions: find the cgroup2 mount and our own cgroup, own a subtree, create one leaf per
// session, signal and kill everything in a leaf, and wait for `populated 0`
// (Documentation/admin-guide/cgroup-v2.rst, docs/design/facts.md 1, 2, 4, 15). Controllers (memory, pids,
// cpu) may be bound to v1 and are never required for correctness; a session's limits (docs/guide/limits.md)
// are written to its leaf before anything runs in it.
import type { LimitController, SessionLimits, SessionUsage } from '../ipc/protocol.js';
import { closeSync, constants as fsConstants, fstatSync, mkdirSync, openSync, readFileSync, rmdirSync, watch, writeFileSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { errnoCode } from '../ipc/errno.js';
import { native } from '../core/fs/native.js';

export interface CgroupMount {
  /** Where cgroup2 is mounted, e.g. /sys/fs/cgroup or /sys/fs/cgroup/unified. */
  mountPoint: string;
  /** The root of the mount within the hierarchy ("/" unless in a cgroup namespace bind). */
  root: string;
}

/** The first cgroup2 mount in /proc/self/mountinfo text (proc(5)), or null. */
export function parseCgroup2Mount(mountinfo: string): CgroupMount | null {
  for (const line of mountinfo.split('\n')) {
    const sep = line.indexOf(' - ');
    if (sep < 0) continue;
    const fields = line.slice(0, sep).split(' ');
    const fsType = line.slice(sep + 3).split(' ')[0];
    if (fsType === 'cgroup2' && fields.length >= 5) {
      return { mountPoint: unescapeMountPath(fields[4]), root: unescapeMountPath(fields[3]) };
    }
  }
  return null;
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
function unescapeMountPath(path: string): string {
  return path.replace(/\\([0-7]{3})/g, (_m, oct: string) => String.fromCharCode(parseInt(oct, 8)));
}

/** Our cgroup v2 path from /proc/self/cgroup text: the "0::" line (v1 lines are ignored). */
export function parseOwnCgroup(procCgroup: string): string | null {
  for (const line of procCgroup.split('\n')) {
    if (line.startsWith('0::')) return line.slice(3).trim() || '/';
  }
  return null;
}

/** Pids listed in a cgroup.procs file's text. */
export function parseProcs(text: string): number[] {
  return text.split('\n').filter(Boolean).map(Number);
}

/** True when cgroup.events text says "populated 1". */
export function parsePopulated(eventsText: string): boolean {
  return /^populated 1$/m.test(eventsText);
}

/** True when cgroup.events text says "frozen 1" (cgroup v2's freezer: every process of the cgroup is stopped). */
export function parseFrozen(eventsText: string): boolean {
  return /^frozen 1$/m.test(eventsText);
}

/** The controllers session limits use, in the order they are checked and enabled. */
export const LIMIT_CONTROLLERS: readonly LimitController[] = ['memory', 'pids', 'cpu'];

/** The controller names in a cgroup.controllers or cgroup.subtree_control file's text (space separated). */
export function parseControllers(text: string): string[] {
  return text.split(/\s+/).filter(Boolean);
}

/**
 * /proc/cgroups text (cgroups(7)) by controller: `hierarchy` is the cgroup v1 hierarchy it is
 * bound to (0: not bound to v1, so v2's or unmounted), `enabled` 0 when the kernel disabled it
 * (cgroup_disable= on its command line).
 */
export function parseProcCgroups(text: string): Map<string, { hierarchy: number; enabled: boolean }> {
  const out = new Map<string, { hierarchy: number; enabled: boolean }>();
  for (const line of text.split('\n')) {
    if (line.startsWith('#')) continue;
    const [name, hierarchy, , enabled] = line.trim().split(/\s+/);
    if (name && hierarchy !== undefined && enabled !== undefined) out.set(name, { hierarchy: Number(hierarchy), enabled: enabled === '1' });
  }
  return out;
}

/** cpu.max's content for `cpus` CPUs: `<quota> 100000`, quota = round(cpus * 100000) µs per 100 ms, at least 1000 (cgroup-v2.rst "cpu.max"). */
export function cpuMaxValue(cpus: number): string {
  return `${Math.max(1000, Math.round(cpus * 100_000))} 100000`;
}

/**
 * The files a session's limits write, in order, and what: memory.max (bytes), then
 * memory.swap.max 0 (no swap past memory.max, as `docker run --memory M --memory-swap M`; only
 * where the file exists: swap accounting), pids.max (tasks), cpu.max (cpuMaxValue).
 * `optional` writes are skipped when their file is absent.
 */
export function limitWrites(limits: SessionLimits): { file: string; value: string; optional?: true }[] {
  const writes: { file: string; value: string; optional?: true }[] = [];
  if (limits.memory_max_bytes !== undefined)
    writes.push({ file: 'memory.max', value: String(limits.memory_max_bytes) }, { file: 'memory.swap.max', value: '0', optional: true });
  if (limits.pids_max !== undefined) writes.push({ file: 'pids.max', value: String(limits.pids_max) });
  if (limits.cpus !== undefined) writes.push({ file: 'cpu.max', value: cpuMaxValue(limits.cpus) });
  return writes;
}

/**
 * Writes limits into the cgroup at `path` (limitWrites), for a session's leaf or any other
 * leaf of the sessions cgroup (a service of a command's leftovers is admitted with that
 * command's limits). Throws the write's error (ENOENT: the controller is not enabled above the leaf;
 * EINVAL: a value the kernel refuses), naming the file; nothing is undone (the caller removes
 * the leaf, which nothing runs in yet).
 */
export function applyLimits(path: string, limits: SessionLimits): void {
  for (const { file, value, optional } of limitWrites(limits)) {
    try {
      // Never O_CREAT: a file the leaf lacks is ENOENT (its controller is not there), not made.
      const fd = openSync(join(path, file), fsConstants.O_WRONLY | fsConstants.O_TRUNC);
      try {
        writeSync(fd, value);
      } finally {
        closeSync(fd);
      }
    } catch (err) {
      if (optional && errnoCode(err) === 'ENOENT') continue;
      throw Object.assign(new Error(`cannot write ${value} to ${join(path, file)}: ${(err as Error).message}`), { code: errnoCode(err) });
    }
  }
}

/**
 * SIGCONT to each pid, right after an escalation's SIGTERM reached them, as systemd does
 * (systemd.kill(5)): a stopped process (kill -STOP, a ^Z) acts on the TERM within the grace
 * instead of waiting for the KILL. A pid gone meanwhile (ESRCH: it ended of the TERM) is skipped.
 */
export function continuePids(pids: Iterable<number>): void {
  for (const pid of pids) {
    try {
      process.kill(pid, 'SIGCONT');
    } catch {
      // ESRCH: it ended of the TERM already
    }
  }
}

/** Another supervisor holds this cgroup parent: a start must fail, never fall back to subreaper mode. */
export class CgroupParentInUse extends Error {}

/** The cgroup parents this process holds locked, by path: their lock fds, open as long as it runs. */
const parentLocks = new Map<string, number>();

/**
 * One supervisor per cgroup parent: an exclusive flock(2) on the parent's directory in cgroupfs
 * (held while this process runs). Two sharing it would tear down each other's sessions dir and
 * see each other's leaves. Throws CgroupParentInUse naming the holder's pid (from /proc/locks,
 * proc(5)) when another process holds it.
 */
function lockParent(basePath: string, parent: string): void {
  if (parentLocks.has(basePath)) return; // set up again in this process (a test's second tree)
  const fd = openSync(basePath, fsConstants.O_RDONLY | fsConstants.O_DIRECTORY);
  if (native().tryLockExclusive(fd)) {
    parentLocks.set(basePath, fd);
    return;
  }
  const ino = fstatSync(fd).ino;
  closeSync(fd);
  let holder = 'unknown';
  try {
    // "1: FLOCK  ADVISORY  WRITE 1234 00:1b:5678 0 EOF": the pid, then major:minor:inode.
    const line = readFileSync('/proc/locks', 'utf8')
      .split('\n')
      .find((l) => l.includes(' FLOCK ') && l.split(/\s+/)[5]?.split(':')[2] === String(ino));
    holder = line?.split(/\s+/)[4] ?? holder;
  } catch {
    // no /proc/locks: the pid stays unknown
  }
  throw new CgroupParentInUse(
    `the cgroup parent ${parent} (${basePath}) is in use by another supervisor (pid ${holder}); stop it first, or give this one its own cgroup.parent`,
  );
}

/** The subtree this supervisor owns: sessions live at <base>/sessions/<sessionId>. */
export class CgroupTree {
  private constructor(
    readonly mount: CgroupMount,
    /** Absolute filesystem path of the owned subtree. */
    readonly basePath: string,
    /**
     * Whether basePath is ours to remove at shutdown: the subtree we own under the root cgroup
     * (config cgroup.parent), made now or left by an earlier run of ours that crashed; never
     * our own delegated cgroup (systemd's).
     */
    private readonly ownsBase: boolean,
  ) {}

  get sessionsPath(): string {
    return join(this.basePath, 'sessions');
  }

  /**
   * Sets up the owned subtree. In the root cgroup (no delegation) it is <mount><parent>;
   * in a delegated cgroup (systemd Delegate=yes) it is our own cgroup, and we move ourselves
   * into its leaf "supervisor" first (no internal processes: docs/design/facts.md 2).
   * Throws (EACCES, EROFS, ENOENT...) when no writable cgroup2 is there.
   */
  static setup(parent: string, pid = process.pid): CgroupTree {
    const mount = parseCgroup2Mount(readFileSync('/proc/self/mountinfo', 'utf8'));
    if (!mount) throw Object.assign(new Error('no cgroup2 filesystem is mounted'), { code: 'ENOENT' });
    const own = parseOwnCgroup(readFileSync('/proc/self/cgroup', 'utf8'));
    if (own === null) throw Object.assign(new Error('no cgroup v2 line in /proc/self/cgroup'), { code: 'ENOENT' });
    const ownPath = join(mount.mountPoint, own);
    let tree: CgroupTree;
    if (own === '/') {
      const basePath = join(mount.mountPoint, parent);
      try {
        mkdirSync(basePath);
      } catch (err) {
        if (errnoCode(err) !== 'EEXIST') throw err;
      }
      lockParent(basePath, parent);
      tree = new CgroupTree(mount, basePath, true);
    } else {
      const leaf = join(ownPath, 'supervisor');
      mkdirSync(leaf, { recursive: true });
      writeFileSync(join(leaf, 'cgroup.procs'), String(pid));
      tree = new CgroupTree(mount, ownPath, false);
    }
    mkdirSync(tree.sessionsPath, { recursive: true });
    tree.enableControllers();
    // Probe that leaves can be made here (EACCES/EROFS when not ours), then tidy up.
    const probe = join(tree.sessionsPath, `.probe-${pid}`);
    mkdirSync(probe);
    rmdirSync(probe);
    return tree;
  }

  /**
   * Enables the memory, pids and cpu controllers (never required for correctness) down to the
   * session leaves where the kernel offers them in v2 (each dir's cgroup.controllers; under
   * systemd, Delegate=yes), so leaves have memory.max, pids.max, cpu.max for limits and
   * memory.peak, memory.events for receipts.
   * Best effort, one controller at a time: on a host where they are bound to cgroup v1 (as this
   * hybrid one: docs/design/facts.md 1) none is there, and limitsAvailable() says so.
   * Returns the controllers the sessions dir now hands to its leaves.
   */
  enableControllers(): Set<LimitController> {
    for (const dir of [this.basePath, this.sessionsPath]) {
      let offered: string[];
      let enabled: string[];
      try {
        offered = parseControllers(readFileSync(join(dir, 'cgroup.controllers'), 'utf8'));
        enabled = parseControllers(readFileSync(join(dir, 'cgroup.subtree_control'), 'utf8'));
      } catch {
        break;
      }
      for (const c of LIMIT_CONTROLLERS) {
        if (!offered.includes(c) || enabled.includes(c)) continue;
        try {
          writeFileSync(join(dir, 'cgroup.subtree_control'), `+${c}`);
        } catch {
          // EBUSY (processes in dir), ENOENT, EOPNOTSUPP (cpu with realtime tasks): not here.
        }
      }
    }
    return this.enabledControllers();
  }

  /** The limit controllers in the sessions dir's cgroup.subtree_control now (each leaf has their files). */
  private enabledControllers(): Set<LimitController> {
    try {
      const enabled = parseControllers(readFileSync(join(this.sessionsPath, 'cgroup.subtree_control'), 'utf8'));
      return new Set(LIMIT_CONTROLLERS.filter((c) => enabled.includes(c)));
    } catch {
      return new Set();
    }
  }

  /**
   * Which limits a leaf made now can enforce: a controller is true when the sessions dir has it
   * in cgroup.subtree_control (read now). `controllers`: the sessions dir's cgroup.controllers
   * text, what its parent hands it (for messages).
   */
  limitsAvailable(): Record<LimitController, boolean> & { controllers: string } {
    const enabled = this.enabledControllers();
    let controllers = '';
    try {
      controllers = readFileSync(join(this.sessionsPath, 'cgroup.controllers'), 'utf8').trim();
    } catch {
      // gone: nothing is offered
    }
    return { memory: enabled.has('memory'), pids: enabled.has('pids'), cpu: enabled.has('cpu'), controllers };
  }

  /** Creates the leaf for a session; it must not exist yet. */
  createLeaf(sessionId: string): CgroupLeaf {
    const path = join(this.sessionsPath, sessionId);
    mkdirSync(path);
    return new CgroupLeaf(path);
  }

  /** Removes the sessions dir and, when it is ours, the base; leftovers (EBUSY, ENOTEMPTY) stay. */
  teardown(): void {
    try {
      rmdirSync(this.sessionsPath);
      if (this.ownsBase) rmdirSync(this.basePath);
    } catch {
      // A live session's leaf keeps it: not ours to force.
    }
  }
}

/** One session's leaf cgroup. */
export class CgroupLeaf {
  constructor(readonly path: string) {}

  get procsPath(): string {
    return join(this.path, 'cgroup.procs');
  }

  /** Pids in the leaf now (cgroup.procs; empty when the leaf is gone). */
  pids(): number[] {
    try {
      return parseProcs(readFileSync(this.procsPath, 'utf8'));
    } catch {
      return [];
    }
  }

  /** Whether any live process remains (cgroup.events "populated"); false once removed. */
  populated(): boolean {
    try {
      return parsePopulated(readFileSync(join(this.path, 'cgroup.events'), 'utf8'));
    } catch {
      return false;
    }
  }

  /**
   * Sends sig to every process in the leaf, re-reading cgroup.procs until no new pid
   * appears (a process may fork while we walk). Returns the distinct pids reached.
   */
  signalAll(sig: NodeJS.Signals | number, skip: ReadonlySet<number> = new Set()): Set<number> {
    const reached = new Set<number>();
    for (let round = 0; round < 64; round++) {
      let fresh = 0;
      for (const pid of this.pids()) {
        if (reached.has(pid) || skip.has(pid)) continue;
        fresh++;
        try {
          process.kill(pid, sig);
          reached.add(pid);
        } catch {
          // ESRCH: it exited between the read and the kill.
        }
      }
      if (fresh === 0) break;
    }
    return reached;
  }

  /**
   * cgroup.freeze: 1 stops every process of the leaf (none runs, forks or writes until thawed),
   * 0 thaws it. A process moved into a frozen cgroup is frozen, one moved out of it thaws
   * (cgroup-v2.rst, "Core Interface Files": cgroup.freeze). SIGKILL still kills a frozen process.
   */
  freeze(on: boolean): void {
    writeFileSync(join(this.path, 'cgroup.freeze'), on ? '1' : '0');
  }

  /** Resolves true once cgroup.events says "frozen 1", false after timeoutMs (a process in an uninterruptible sleep freezes only when it wakes). */
  waitFrozen(timeoutMs: number): Promise<boolean> {
    return this.waitEvents((text) => parseFrozen(text), timeoutMs);
  }

  /**
   * Moves every process of this leaf into `to` (each pid written to its cgroup.procs), reading
   * cgroup.procs again until it is empty (a process that forked meanwhile: its child is here
   * too; frozen, none can). Returns the distinct pids moved; a pid gone before its write
   * (ESRCH) is not counted. Throws on any other write error (the rest stay here).
   */
  moveAllTo(to: CgroupLeaf, maxRounds = 64): number[] {
    const moved = new Set<number>();
    for (let round = 0; round < maxRounds; round++) {
      const pids = this.pids();
      if (pids.length === 0) break;
      for (const pid of pids) {
        try {
          writeFileSync(to.procsPath, String(pid));
          moved.add(pid);
        } catch (err) {
          if (errnoCode(err) !== 'ESRCH') throw err;
        }
      }
    }
    return [...moved];
  }

  /** cgroup.kill: SIGKILL to the whole subtree at once (Linux 5.14+), setsid'ed and double-forked processes alike. */
  kill(): void {
    writeFileSync(join(this.path, 'cgroup.kill'), '1');
  }

  /**
   * Resolves true once cgroup.events says "populated 0", false after timeoutMs
   * (null: no bound). "populated 0" means no live process is left (zombies are not counted, so
   * reaping stays the subreaper's job); its notification can lag 10-20 ms behind the content, so
   * the file is read first and the inotify event is only waited for when it says 1.
   */
  waitEmpty(timeoutMs: number | null): Promise<boolean> {
    return this.waitEvents((text) => !parsePopulated(text), timeoutMs);
  }

  /**
   * Resolves true once cgroup.events satisfies `done` (read first; then on each of its inotify
   * events), false after timeoutMs (null: no bound). A leaf that is gone reads as "" (empty, not frozen).
   */
  private waitEvents(done: (eventsText: string) => boolean, timeoutMs: number | null): Promise<boolean> {
    const file = join(this.path, 'cgroup.events');
    const read = () => {
      try {
        return readFileSync(file, 'utf8');
      } catch {
        return '';
      }
    };
    if (done(read())) return Promise.resolve(true);
    return new Promise((resolve) => {
      let timer: NodeJS.Timeout | undefined;
      const watcher = watch(file, () => check());
      const finish = (result: boolean) => {
        watcher.close();
        if (timer) clearTimeout(timer);
        resolve(result);
      };
      const check = () => {
        if (done(read())) finish(true);
      };
      watcher.on('error', () => finish(done(read())));
      if (timeoutMs !== null) timer = setTimeout(() => finish(done(read())), timeoutMs);
      check(); // the event may have fired between the first read and the watch
    });
  }

  /**
   * CPU time from cpu.stat (present without controllers), in microseconds; with the memory
   * controller, peak memory (memory.peak, bytes) and OOM kills (memory.events oom_kill); with
   * the pids controller, the most tasks at once (pids.peak, Linux 6.1+).
   * `memory_controller: false` says the memory fields are absent, not zero.
   */
  usage(): SessionUsage {
    const field = (file: string, key: string) => {
      try {
        const m = new RegExp(`^${key} (\\d+)$`, 'm').exec(readFileSync(join(this.path, file), 'utf8'));
        return m ? Number(m[1]) : undefined;
      } catch {
        return undefined;
      }
    };
    const usage: SessionUsage = {
      cpu_usec: field('cpu.stat', 'usage_usec'),
      user_usec: field('cpu.stat', 'user_usec'),
      system_usec: field('cpu.stat', 'system_usec'),
      memory_controller: false,
    };
    try {
      usage.memory_peak_bytes = Number(readFileSync(join(this.path, 'memory.peak'), 'utf8').trim());
      usage.oom_kills = field('memory.events', 'oom_kill') ?? 0;
      usage.memory_controller = true;
    } catch {
      // no memory controller in this leaf
    }
    try {
      usage.pids_peak = Number(readFileSync(join(this.path, 'pids.peak'), 'utf8').trim());
    } catch {
      // no pids controller in this leaf, or a kernel without pids.peak
    }
    for (const k of Object.keys(usage) as (keyof SessionUsage)[]) if (usage[k] === undefined) delete usage[k];
    return usage;
  }

  /** rmdir the leaf; retries briefly while the kernel finishes releasing exited tasks (EBUSY). */
  async remove(): Promise<void> {
    for (let attempt = 0; ; attempt++) {
      try {
        rmdirSync(this.path);
        return;
      } catch (err) {
        const code = errnoCode(err);
        if (code === 'ENOENT') return;
        if (code !== 'EBUSY' || attempt >= 50) throw err;
        await new Promise((r) => setTimeout(r, 10));
      }
    }
  }
}
