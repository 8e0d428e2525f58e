// What the probes observe of processes: by an environment marker every process of a run
// inherits (setsid, nohup and double-forks keep their environment), never by name.
import { readdirSync, readFileSync } from 'node:fs';

/** Name of the variable that marks every process a probe run starts. */
export const MARK_VAR = 'SBX_PROBE_MARK';

function state(pid: number): string | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat[stat.lastIndexOf(')') + 2] ?? null;
  } catch {
    return null;
  }
}

/** Live (not zombie) processes whose environment holds MARK_VAR=<marker...> (proc(5) environ); a prefix matches. */
export function pidsWithMark(marker: string): number[] {
  const needle = Buffer.from(`\0${MARK_VAR}=${marker}`);
  const out: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name) || Number(name) === process.pid) continue;
    try {
      if (Buffer.concat([Buffer.from([0]), readFileSync(`/proc/${name}/environ`)]).includes(needle) && state(Number(name)) !== 'Z') out.push(Number(name));
    } catch {
      // gone, or a kernel thread
    }
  }
  return out;
}

/** Peak resident set (VmHWM) of a live process, in KiB; 0 when gone. */
export function peakRssKb(pid: number): number {
  try {
    return Number(/VmHWM:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? 0);
  } catch {
    return 0;
  }
}

/** Current resident set (VmRSS) of a live process, in KiB; 0 when gone. */
export function rssKb(pid: number): number {
  try {
    return Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? 0);
  } catch {
    return 0;
  }
}

/**
 * SIGKILLs the marked processes (by the pids just listed) until none is left, calling
 * `reap` between rounds (orphans reparented to a subreaper harness become its zombies).
 * Throws when some survive 10 s.
 */
export async function killMarked(marker: string, reap: () => void = () => {}): Promise<number> {
  const killed = new Set<number>();
  const deadline = Date.now() + 10_000;
  for (;;) {
    const pids = pidsWithMark(marker);
    reap();
    if (pids.length === 0) return killed.size;
    if (Date.now() > deadline) throw new Error(`processes ${pids.join(', ')} (${MARK_VAR}=${marker}) survive SIGKILL`);
    for (const pid of pids) {
      try {
        process.kill(pid, 'SIGKILL');
        killed.add(pid);
      } catch {
        // exited meanwhile
      }
    }
    await new Promise((r) => setTimeout(r, 20)); // poll interval, bounded by the deadline
  }
}
