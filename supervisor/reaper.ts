// The supervisor as child subreaper (prctl(2) PR_SET_CHILD_SUBREAPER): orphans of every session are
// reparented to this process and must be reaped here, by pid, never with waitpid(-1), which would steal the
// statuses libuv waits for (docs/design/facts.md 6). Owns the reaping of our children: libuv's are tracked
// (track()), native ones adopted (adopt()), orphans reaped; with a fence, exited children are held as zombies
// until the watcher has read their events (setFence).
import { readdirSync, readFileSync } from 'node:fs';
import { native, type NativeHelpers } from '../core/fs/native.js';
import { testHooks } from '../core/test-hooks.js';

/** State letter of a process from /proc/<pid>/stat (proc(5)), or null when gone. */
function procState(pid: number): string | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
  } catch {
    return null;
  }
}

/** Our direct children across all threads of this process. */
export function ownChildren(): number[] {
  const out: number[] = [];
  for (const tid of readdirSync('/proc/self/task')) {
    try {
      for (const pid of readFileSync(`/proc/self/task/${tid}/children`, 'utf8').split(' ')) {
        if (pid.trim()) out.push(Number(pid));
      }
    } catch {
      // thread exited while listing
    }
  }
  return out;
}

/** The children of pid across its threads (proc(5) /proc/<pid>/task/<tid>/children); [] when gone. */
function childrenOf(pid: number): number[] {
  const out: number[] = [];
  let tids: string[];
  try {
    tids = readdirSync(`/proc/${pid}/task`);
  } catch {
    return out; // gone
  }
  for (const tid of tids) {
    try {
      for (const child of readFileSync(`/proc/${pid}/task/${tid}/children`, 'utf8').split(' ')) if (child.trim()) out.push(Number(child));
    } catch {
      // thread exited while listing
    }
  }
  return out;
}

/**
 * SIGKILLs every descendant of root, then root: walks from root's children again until a walk
 * reaches no pid not yet killed (16 walks at most: a killed process forks no more, and a fork
 * under way when the KILL lands is undone, fork(2)), each pid once. Returns how many pids the
 * KILL reached, root included.
 */
function killTree(root: number): number {
  const killed = new Set<number>();
  let reached = 0;
  for (let walk = 0; walk < 16; walk++) {
    const queue = childrenOf(root);
    let fresh = 0;
    for (let i = 0; i < queue.length; i++) {
      const pid = queue[i]!;
      for (const child of childrenOf(pid)) queue.push(child);
      if (killed.has(pid)) continue;
      killed.add(pid);
      fresh++;
      try {
        process.kill(pid, 'SIGKILL');
        reached++;
      } catch {
        // ESRCH: gone meanwhile
      }
    }
    if (fresh === 0) break;
  }
  try {
    process.kill(root, 'SIGKILL');
    reached++;
  } catch {
    // ESRCH: gone
  }
  return reached;
}

/** How an exited child ended (waitpid(2) status, split). */
export interface ChildExit {
  code: number | null;
  signal: number | null;
}

/**
 * Resolves once every event the workspace watcher's queue held at the call has been read (a
 * barrier round came back: true) or could not be (false: timed out, no listener). Never rejects.
 */
export type ReadFence = () => Promise<boolean>;

/** Zombies held for a fence at most: past it, exited children are reaped at once (pids are finite). */
export const MAX_HELD_ZOMBIES = 4096;

export class Reaper {
  /** Pids spawned through libuv (child_process): never ours to reap. */
  private readonly spawned = new Set<number>();
  /** Children spawned natively (spawnDetached): reaped here, their status handed on. */
  private readonly adopted = new Map<number, (exit: ChildExit) => void>();
  /** Adopted children that must never stay stopped (a session's shim that stays): continued on each SIGCHLD that finds them stopped. */
  private readonly keepRunning = new Set<number>();
  /** Exited children left zombies until the fence they wait for comes back: pid -> that batch's release. */
  private readonly held = new Map<number, Promise<void>>();
  private fence: ReadFence | null = null;
  private heldTotal = 0;
  private unfencedTotal = 0;
  private scheduled = false;
  private retryTimer: NodeJS.Timeout | null = null;
  private reapedTotal = 0;
  private readonly onSignal = () => this.schedule();

  /** Becomes the child subreaper and starts reaping on SIGCHLD. */
  start(): void {
    native().setChildSubreaper();
    process.on('SIGCHLD', this.onSignal);
    this.schedule();
  }

  stop(): void {
    process.off('SIGCHLD', this.onSignal);
    if (this.retryTimer) clearTimeout(this.retryTimer);
    this.retryTimer = null;
    this.fence = null;
    this.release([...this.held.keys()], false);
  }

  /**
   * From now on an exited child stays a zombie until fence() settles (null: reaped at once, as
   * without a watched workspace). The exit itself is reported when it happens (adopt's onExit).
   * The fence is the workspace watcher's read fence: an exited child is left a zombie until the watcher
   * has read every event queued before its exit: a fanotify event gets its writer's pidfd, and so its
   * cgroup, only while the writer's pid is not reaped (fanotify(7) FAN_NOPIDFD), so a writer that exits at
   * once is still attributed (docs/design/facts.md 33).
   */
  setFence(fence: ReadFence | null): void {
    this.fence = fence;
  }

  /** Resolves once every exited child held for a fence now is reaped (at once when none is). Never rejects. */
  async settled(): Promise<void> {
    await Promise.all(new Set(this.held.values()));
  }

  /** Children left zombies for a fence since start, and those reaped at once because MAX_HELD_ZOMBIES were held. */
  get holds(): { held: number; unfenced: number } {
    return { held: this.heldTotal, unfenced: this.unfencedTotal };
  }

  /** Records a child that libuv will wait for; call right after spawn returns (every child libuv spawns goes through here). */
  track(pid: number): void {
    this.spawned.add(pid);
  }

  /**
   * A child spawned natively (native().spawnDetached: libuv does not wait for it): reaped
   * here on SIGCHLD, by pid, and onExit is called once with how it ended. keepRunning: the
   * child is one of ours that answers us (a session's shim that stays): a stop (SIGSTOP sent
   * by the command to its parent or its process group, kill(2)) is undone with SIGCONT at the
   * SIGCHLD that reports it (the kernel sends one on a child's stop, signal(7)), so no
   * supervisor request waits on a stopped shim.
   */
  adopt(pid: number, onExit: (exit: ChildExit) => void, keepRunning = false): void {
    this.adopted.set(pid, onExit);
    if (keepRunning) this.keepRunning.add(pid);
    this.schedule(); // it may have ended already
  }

  /**
   * Continues the adopted child pid if it is stopped (see adopt's keepRunning); true when it
   * was. False when it runs, exited or is not ours. Never throws.
   */
  continueIfStopped(pid: number): boolean {
    if (!this.adopted.has(pid) || testHooks.shimStaysStopped) return false;
    try {
      return native().continueStopped(pid) !== null;
    } catch {
      return false; // ECHILD: reaped meanwhile
    }
  }

  /**
   * The last resort for an adopted child that no longer answers (a session's shim past its
   * bound): SIGKILLs its descendants, then it (killTree). Only while it is ours and not reaped,
   * so its pid is no other process's; its killed descendants are reparented to us (the
   * subreaper) and reaped as orphans. Returns how many pids the KILL reached; 0 once reaped.
   */
  killTree(pid: number): number {
    return this.adopted.has(pid) ? killTree(pid) : 0;
  }

  /** Forgets a tracked child once its exit was observed. */
  untrack(pid: number): void {
    this.spawned.delete(pid);
  }

  /** Orphans reaped since start. */
  get reaped(): number {
    return this.reapedTotal;
  }

  /** Zombie children nobody has reaped yet (tracked and held ones excluded). */
  zombies(): number[] {
    return ownChildren().filter((pid) => !this.spawned.has(pid) && !this.adopted.has(pid) && !this.held.has(pid) && procState(pid) === 'Z');
  }

  /**
   * On SIGCHLD: first reaps the children spawned natively (session shims, adopt(): their status is handed
   * on), then lists our children (/proc/self/task/<tid>/children) and reaps each zombie nobody else waits for.
   * Reaps every orphan that is a zombie now (with a fence: holds it, and every exited adopted
   * child, until the fence comes back); returns how many were reaped now. Never throws: when /proc cannot
   * be listed (EMFILE, ENFILE, ENOMEM: no fd for the directory), it tries again in 100 ms.
   */
  reapNow(): number {
    const fence = this.fence;
    const leaders: number[] = [];
    // Adopted children first, by pid: no /proc walk on their path. With a fence, the exit is
    // seen without reaping (waitid WNOWAIT) and the zombie kept until the fence comes back.
    for (const [pid, onExit] of this.adopted) {
      let exit: ReturnType<NativeHelpers['reapPid']> = null;
      try {
        exit = fence ? native().peekExit(pid) : native().reapPid(pid);
      } catch {
        exit = { pid, code: null, signal: null }; // ECHILD: gone without a status we can know
      }
      if (!exit) {
        if (this.keepRunning.has(pid)) this.continueIfStopped(pid);
        continue;
      }
      this.adopted.delete(pid);
      this.keepRunning.delete(pid);
      if (fence) leaders.push(pid);
      onExit({ code: exit.code, signal: exit.signal });
    }
    let n = 0;
    let zombies: number[];
    try {
      zombies = this.zombies();
    } catch {
      if (!this.retryTimer) {
        this.retryTimer = setTimeout(() => {
          this.retryTimer = null;
          this.reapNow();
        }, 100);
        this.retryTimer.unref();
      }
      zombies = [];
    }
    if (fence) {
      this.hold(leaders, fence, false);
      this.hold(zombies, fence, true);
    } else {
      for (const pid of zombies) {
        try {
          if (native().reapPid(pid)) n++;
        } catch {
          // ECHILD: someone else (never libuv: it only waits for its own) got it.
        }
      }
    }
    this.reapedTotal += n;
    return n;
  }

  /** Keeps pids (exited children; orphans: not adopted ones) zombies until fence settles, then reaps them; past MAX_HELD_ZOMBIES, at once. */
  private hold(pids: number[], fence: ReadFence, orphans: boolean): void {
    if (pids.length === 0) return;
    const room = Math.max(0, MAX_HELD_ZOMBIES - this.held.size);
    const now = pids.slice(room);
    const later = pids.slice(0, room);
    this.heldTotal += later.length;
    this.unfencedTotal += now.length;
    this.release(now, orphans);
    if (later.length === 0) return;
    const released = fence().then(
      () => this.release(later, orphans),
      () => this.release(later, orphans),
    );
    for (const pid of later) this.held.set(pid, released);
  }

  /** Reaps held (or never held) zombies by pid; orphans count in reaped. */
  private release(pids: number[], orphans: boolean): void {
    for (const pid of pids) {
      this.held.delete(pid);
      try {
        if (native().reapPid(pid) && orphans) this.reapedTotal++;
      } catch {
        // ECHILD: already reaped
      }
    }
  }

  private schedule(): void {
    if (this.scheduled) return;
    this.scheduled = true;
    setImmediate(() => {
      this.scheduled = false;
      this.reapNow();
    });
  }
}
