// `sbx status`: the supervisor's health in one answer (StatusResult, ipc/protocol.ts): version, identity,
// mode, enforceable limits (limits.ts), sessions by state, admission and why it is closed, the state dir's
// size and free space, the machine (CPU load from os.cpus(), memory from systeminformation) and the
// supervisor's uptime. Owns the state dir's size cache, the CPU load sample and the metrics and WebSocket
// addresses main sets once they listen; reads everything else.
import { cpus, freemem, loadavg, totalmem, uptime } from 'node:os';
import { lstatSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { PROTOCOL_VERSION, type SessionState, type StatusResult } from '../ipc/protocol.js';
import { STATE } from '../core/state/names.js';
import { VERSION } from '../ipc/version.js';
import { limitHost, limitsStatus } from './limits.js';
import type { SessionContext } from './session/context.js';

/** How long the state dir's size (a walk of every file) is reused. */
const STATE_DIR_BYTES_TTL_MS = 5_000;

/** The CPU time counters of every CPU summed (os.cpus(): /proc/stat's cpuN lines, in ms). */
function cpuTimesMs(): { busy: number; total: number } {
  let busy = 0;
  let total = 0;
  for (const { times } of cpus()) {
    busy += times.user + times.nice + times.sys + times.irq;
    total += times.user + times.nice + times.sys + times.irq + times.idle;
  }
  return { busy, total };
}

/**
 * The machine's CPU load (%, all CPUs) between two status calls, from os.cpus()'s counters
 * (proc(5) /proc/stat: user, nice, system, irq busy; idle not). The first call measures since
 * the supervisor started. A call within MIN_SAMPLE_MS of the last one gives the last value
 * (too few ticks to mean anything); null when no tick passed. systeminformation's
 * currentLoad() did this by running `cat /proc/stat | grep cpu` in a shell with execSync,
 * which blocked the event loop (~80 ms of it at every start).
 */
export class CpuLoad {
  static readonly MIN_SAMPLE_MS = 200;
  private last = { atMs: performance.now(), ...cpuTimesMs() };
  private percent: number | null = null;

  sample(): number | null {
    const now = performance.now();
    if (now - this.last.atMs < CpuLoad.MIN_SAMPLE_MS) return this.percent;
    const t = cpuTimesMs();
    const total = t.total - this.last.total;
    this.percent = total > 0 ? Math.round((1000 * (t.busy - this.last.busy)) / total) / 10 : null;
    this.last = { atMs: now, ...t };
    return this.percent;
  }
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
  private stateDirBytesCache: { atMs: number; bytes: number } | null = null;
  /** The metrics endpoint's bound address; null: metrics off. Set by main once it listens. */
  metricsAddress: string | null = null;
  /** The WebSocket listener's URL (ws://HOST:PORT/); null: off. Set by main once it listens. */
  remoteUrl: string | null = null;

  private readonly cpuLoad = new CpuLoad();

  constructor(private readonly source: StatusSource) {}

  /** Forgets the state dir's size (after retention freed some). */
  invalidate(): void {
    this.stateDirBytesCache = null;
  }

  /** Bytes held by the files under the state dir (lstat, not following links), cached briefly. */
  private stateDirBytes(dir: string): number {
    const now = performance.now();
    if (this.stateDirBytesCache && now - this.stateDirBytesCache.atMs < STATE_DIR_BYTES_TTL_MS) return this.stateDirBytesCache.bytes;
    let bytes = 0;
    const walk = (d: string) => {
      for (const e of readdirSync(d, { withFileTypes: true })) {
        const p = join(d, e.name);
        try {
          if (e.isDirectory()) walk(p);
          else if (e.isFile()) bytes += lstatSync(p).size;
        } catch {
          // removed meanwhile
        }
      }
    };
    try {
      walk(dir);
    } catch {
      // the dir itself went away meanwhile: what was counted
    }
    this.stateDirBytesCache = { atMs: now, bytes };
    return bytes;
  }

  async status(socketPath: string): Promise<StatusResult> {
    const { ctx } = this.source;
    const counts: Record<string, number> = {};
    for (const state of this.source.sessionStates()) counts[state] = (counts[state] ?? 0) + 1;
    const cpuLoadPercent = this.cpuLoad.sample();
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
        state_dir_bytes: this.stateDirBytes(ctx.config.stateDir),
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
