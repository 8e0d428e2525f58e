// `sbx status`: the supervisor's health in one answer (StatusResult, ipc/protocol.ts): version, identity,
// mode, enforceable limits (limits.ts), sessions by state, admission and why it is closed, the state dir's
// size and free space, the machine (CPU load from /proc/stat, memory from systeminformation) and the
// supervisor's uptime. Owns the state dir's size (walked off the event loop, cached), the CPU load
// sample and the metrics and WebSocket addresses main sets once they listen; reads everything else.
import { cpus, freemem, loadavg, totalmem, uptime } from 'node:os';
import { readFileSync } from 'node:fs';
import { lstat, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { PROTOCOL_VERSION, type SessionState, type StatusResult } from '../ipc/protocol.js';
import { STATE } from '../core/state/names.js';
import { VERSION } from '../ipc/version.js';
import { limitHost, limitsStatus } from './limits.js';
import type { SessionContext } from './session/context.js';

/** How long the state dir's size (a walk of every file) is reused. */
const STATE_DIR_BYTES_TTL_MS = 5_000;

/**
 * The machine's CPU time counters (proc(5) /proc/stat, its `cpu` line, in ticks): busy (user,
 * nice, system, irq, softirq, steal; guest is inside user) and in all, idle and iowait counted
 * idle as top(1) does. Null when /proc/stat cannot be read as that.
 */
function cpuTimes(): { busy: number; total: number } | null {
  try {
    const line = readFileSync('/proc/stat', 'latin1').split('\n', 1)[0];
    const f = line.split(/\s+/).slice(1, 9).map(Number);
    if (!line.startsWith('cpu ') || f.length !== 8 || !f.every(Number.isFinite)) return null;
    const [user, nice, system, idle, iowait, irq, softirq, steal] = f;
    const busy = user + nice + system + irq + softirq + steal;
    return { busy, total: busy + idle + iowait };
  } catch {
    return null;
  }
}

/**
 * The machine's CPU load (%, all CPUs) between two status calls, from /proc/stat's counters
 * (cpuTimes: iowait counts idle, as in top(1)). The first call measures since
 * the supervisor started. A call within MIN_SAMPLE_MS of the last one gives the last value
 * (too few ticks to mean anything); null when no tick passed or /proc/stat is unreadable. systeminformation's
 * currentLoad() did this by running `cat /proc/stat | grep cpu` in a shell with execSync,
 * which blocked the event loop (~80 ms of it at every start).
 */
export class CpuLoad {
  static readonly MIN_SAMPLE_MS = 200;
  private last = { atMs: performance.now(), times: cpuTimes() };
  private percent: number | null = null;

  sample(): number | null {
    const now = performance.now();
    if (now - this.last.atMs < CpuLoad.MIN_SAMPLE_MS) return this.percent;
    const times = cpuTimes();
    const was = this.last.times;
    const total = times && was ? times.total - was.total : 0;
    this.percent = times && was && total > 0 ? Math.round((1000 * (times.busy - was.busy)) / total) / 10 : null;
    this.last = { atMs: now, times };
    return this.percent;
  }
}

/** lstat(2)s in flight at once while a directory's files are counted. */
const LSTAT_BATCH = 64;

/** The bytes of the regular files under dir (lstat: links not followed), directory by directory; what went away meanwhile is not counted. */
export async function walkBytes(dir: string): Promise<number> {
  let bytes = 0;
  const dirs = [dir];
  for (let d = dirs.pop(); d !== undefined; d = dirs.pop()) {
    let entries;
    try {
      entries = await readdir(d, { withFileTypes: true });
    } catch {
      continue; // removed meanwhile
    }
    const files: string[] = [];
    for (const e of entries) {
      if (e.isDirectory()) dirs.push(join(d, e.name));
      else if (e.isFile()) files.push(join(d, e.name));
    }
    for (let i = 0; i < files.length; i += LSTAT_BATCH) {
      const sizes = await Promise.all(
        files.slice(i, i + LSTAT_BATCH).map((p) =>
          lstat(p).then(
            (st) => st.size,
            () => 0,
          ),
        ),
      );
      for (const size of sizes) bytes += size;
    }
  }
  return bytes;
}

/** What status reads from the registry. */
export interface StatusSource {
  ctx: SessionContext;
  /** Where checkpoints are published (a directory or s3://bucket/prefix). */
  checkpointStore: () => string;
  sessionStates(): Iterable<SessionState>;
  admissionState(): StatusResult['admission'];
  sealRecord(): StatusResult['sealed'];
}

export class StatusReporter {
  /** The state dir's size as last walked (when the walk began, monotonic ms), and the walk under way. */
  private stateDirBytesCache: { atMs: number; bytes: number } | null = null;
  private stateDirWalk: Promise<number> | null = null;
  /** The metrics endpoint's bound address; null: metrics off. Set by main once it listens. */
  metricsAddress: string | null = null;
  /** The WebSocket listener's URL (ws://HOST:PORT/); null: off. Set by main once it listens. */
  remoteUrl: string | null = null;
  private readonly cpuLoad = new CpuLoad();

  constructor(private readonly source: StatusSource) {
    // The first walk starts with the supervisor: a checkpoint store of many objects takes seconds.
    this.stateDirBytes(source.ctx.config.stateDir).catch(() => {});
  }

  /** The state dir's size is out of date (retention freed some): the next status starts a walk (and gives the last size meanwhile). */
  invalidate(): void {
    if (this.stateDirBytesCache) this.stateDirBytesCache.atMs = -Infinity;
  }

  /**
   * Bytes held by the files under the state dir (lstat, not following links). Walked with
   * node:fs/promises (libuv's threadpool), never on the event loop: a store of 300,000 objects
   * took 2.5-4.2 s with readdirSync and lstatSync, the supervisor deaf meanwhile. A value older
   * than STATE_DIR_BYTES_TTL_MS is given as it is while the next walk runs (one at a time); only
   * the first status waits for a walk.
   */
  private async stateDirBytes(dir: string): Promise<number> {
    const cached = this.stateDirBytesCache;
    if (cached && performance.now() - cached.atMs < STATE_DIR_BYTES_TTL_MS) return cached.bytes;
    if (!this.stateDirWalk) {
      const atMs = performance.now();
      this.stateDirWalk = walkBytes(dir)
        .then((bytes) => {
          this.stateDirBytesCache = { atMs, bytes };
          return bytes;
        })
        .finally(() => (this.stateDirWalk = null));
    }
    return cached ? cached.bytes : this.stateDirWalk;
  }

  async status(socketPath: string): Promise<StatusResult> {
    const { ctx } = this.source;
    const counts: Record<string, number> = {};
    for (const state of this.source.sessionStates()) counts[state] = (counts[state] ?? 0) + 1;
    const cpuLoadPercent = this.cpuLoad.sample();
    const stateDirBytes = await this.stateDirBytes(ctx.config.stateDir);
    // Loaded with the first status, not at start (its index loads every one of its ~50 modules).
    const { default: si } = await import('systeminformation');
    const mem = await si.mem();
    const storage = ctx.storage;
    const free = storage.freeBytes();
    const admission = this.source.admissionState();
    const metrics = this.metricsAddress;
    const remote = this.remoteUrl;
    return {
      version: VERSION,
      protocol: PROTOCOL_VERSION,
      instance: ctx.identity.instance,
      generation: ctx.identity.generation,
      mode: ctx.identity.mode,
      boot_id: ctx.identity.bootId,
      pid: process.pid,
      // The supervisor's, to the ms: a restarted supervisor starts again from 0.
      uptime_s: Math.round(process.uptime() * 1000) / 1000,
      started_at: new Date(Date.now() - process.uptime() * 1000).toISOString(),
      workspaces: ctx.watcher.status(),
      workspace_unplaced_events: ctx.watcher.unplaced,
      workspace_own_events: ctx.watcher.own,
      checkpoint_store: this.source.checkpointStore(),
      ...(metrics !== null ? { metrics } : {}),
      ...(remote !== null ? { remote } : {}),
      socket: socketPath,
      state_dir: ctx.config.stateDir,
      cgroup: ctx.tree ? ctx.tree.basePath : null,
      limits: limitsStatus(limitHost(ctx.tree)),
      escape_watch: { on: ctx.escapes.unavailable === null, reason: ctx.escapes.unavailable },
      receipt_key: { key_id: ctx.signer.keyId, public_key_pem: ctx.signer.publicKeyPem, path: join(ctx.config.stateDir, STATE.receiptKeyPub) },
      sessions: counts,
      load: { loadavg: loadavg(), cpus: cpus().length, free_mem_bytes: freemem(), total_mem_bytes: totalmem() },
      admission,
      ...(admission === 'disk_low'
        ? {
            admission_reason: `disk low: ${free} bytes free in the state dir, ${storage.minFreeBytes} needed; retention removes the oldest ended sessions' output while less than ${storage.keepFreeBytes} is free (sbx gc), and cannot touch running or unknown sessions`,
          }
        : admission === 'reconciling'
          ? { admission_reason: 'reconciling sessions left by a restart' }
          : {}),
      sealed: this.source.sealRecord(),
      storage: {
        state_dir_bytes: stateDirBytes,
        free_bytes: free,
        total_bytes: storage.totalBytes,
        reserve_bytes: storage.reserveBytes,
        min_free_bytes: storage.minFreeBytes,
        keep_free_bytes: storage.keepFreeBytes,
        admits: free >= storage.minFreeBytes,
      },
      machine: {
        cpu_load_percent: cpuLoadPercent,
        mem_total_bytes: mem.total,
        mem_available_bytes: mem.available,
        uptime_s: Math.round(uptime()),
      },
    };
  }
}
