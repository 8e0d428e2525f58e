// stages: where the drain spends its CPU, per thread of the supervisor, from
// /proc/<pid>/task/<tid>/stat (utime, stime; proc(5)) before and after one run: the event
// loop (pipe reads, the copy into write buffers, bookkeeping), the hashing threads (named
// sbx-hash: SHA-256 from the shared write buffers, and read-back where they were not
// shown the bytes), and the rest (libuv's threadpool writing chunks and fsyncing them, V8's
// helpers).
import { readdirSync, readFileSync } from 'node:fs';

interface ThreadCpu {
  name: string;
  userMs: number;
  sysMs: number;
}

/** utime/stime (ms) of every thread of pid, keyed by tid (proc(5), USER_HZ = 100). */
export function threadCpu(pid: number): Map<number, ThreadCpu> {
  const out = new Map<number, ThreadCpu>();
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    try {
      const stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8');
      const name = stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')'));
      const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      out.set(Number(tid), { name, userMs: Number(f[11]) * 10, sysMs: Number(f[12]) * 10 });
    } catch {
      // the thread ended between readdir and read
    }
  }
  return out;
}

/** The thread groups, in the order printed: the rest is libuv's threadpool (chunk writes, fsyncs) and V8's helpers (GC, compiler). */
export const THREAD_GROUPS = ['event loop', 'hashing threads', 'threadpool and V8 helpers'] as const;

/** CPU each thread group spent between two samples (every group, 0 when idle; 10 ms resolution, USER_HZ). */
export function cpuDelta(before: Map<number, ThreadCpu>, after: Map<number, ThreadCpu>, mainTid: number): Record<string, { userMs: number; sysMs: number }> {
  const groups: Record<string, { userMs: number; sysMs: number }> = {};
  for (const [tid, a] of after) {
    const b = before.get(tid) ?? { userMs: 0, sysMs: 0 };
    const key = tid === mainTid ? 'event loop' : a.name === 'sbx-hash' ? 'hashing threads' : 'threadpool and V8 helpers';
    const g = (groups[key] ??= { userMs: 0, sysMs: 0 });
    g.userMs += a.userMs - b.userMs;
    g.sysMs += a.sysMs - b.sysMs;
  }
  for (const k of THREAD_GROUPS) groups[k] ??= { userMs: 0, sysMs: 0 };
  return groups;
}
