// The supervisor as child subreaper (prctl(2) PR_SET_CHILD_SUBREAPER): orphans of every
// session are reparented to this process and must be reaped here, by pid, never with
// waitpid(-1), which would steal the statuses libuv waits for (docs/design/facts.md 6).
// So every child libuv spawns goes through track(); on SIGCHLD the reaper first reaps the
// children spawned natively (session shims, adopt(): their status is handed on), then lists
// our children (/proc/self/task/*/children) and reaps each zombie nobody else waits for.
import { readdirSync, readFileSync } from 'node:fs';
import { native, type NativeHelpers } from './native.js';

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

export class Reaper {
  /** Pids spawned through libuv (child_process): never ours to reap. */
  private readonly spawned = new Set<number>();
  /** Children spawned natively (spawnDetached): reaped here, their status handed on. */
  private readonly adopted = new Map<number, (exit: { code: number | null; signal: number | null }) => void>();
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
  }

  /** Records a child that libuv will wait for; call right after spawn returns. */
  track(pid: number): void {
    this.spawned.add(pid);
  }

  /**
   * A child spawned natively (native().spawnDetached: libuv does not wait for it): reaped
   * here on SIGCHLD, by pid, and onExit is called once with how it ended.
   */
  adopt(pid: number, onExit: (exit: { code: number | null; signal: number | null }) => void): void {
    this.adopted.set(pid, onExit);
    this.schedule(); // it may have ended already
  }

  /** Forgets a tracked child once its exit was observed. */
  untrack(pid: number): void {
    this.spawned.delete(pid);
  }

  /** Orphans reaped since start. */
  get reaped(): number {
    return this.reapedTotal;
  }

  /** Zombie children nobody has reaped yet (tracked ones excluded). */
  zombies(): number[] {
    return ownChildren().filter((pid) => !this.spawned.has(pid) && !this.adopted.has(pid) && procState(pid) === 'Z');
  }

  /**
   * Reaps every orphan that is a zombie now; returns how many. Never throws: when /proc cannot
   * be listed (EMFILE, ENFILE, ENOMEM: no fd for the directory), it tries again in 100 ms.
   */
  reapNow(): number {
    // Adopted children first, by pid (waitpid WNOHANG): no /proc walk on their path.
    for (const [pid, onExit] of this.adopted) {
      let exit: ReturnType<NativeHelpers['reapPid']> = null;
      try {
        exit = native().reapPid(pid);
      } catch {
        exit = { pid, code: null, signal: null }; // ECHILD: gone without a status we can know
      }
      if (!exit) continue;
      this.adopted.delete(pid);
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
      return 0;
    }
    for (const pid of zombies) {
      try {
        if (native().reapPid(pid)) n++;
      } catch {
        // ECHILD: someone else (never libuv: it only waits for its own) got it.
      }
    }
    this.reapedTotal += n;
    return n;
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
