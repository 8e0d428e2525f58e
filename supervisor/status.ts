// `sbx status`: the supervisor's health in one answer (StatusResult, ipc/protocol.ts): version, identity,
// mode, enforceable limits (limits.ts), sessions by state, admission and why it is closed, the state dir's
// size and free space, the machine (systeminformation) and the supervisor's uptime. Owns the state dir's
// size cache and the metrics and WebSocket addresses main sets once they listen; reads everything else.
import { cpus, freemem, loadavg, totalmem, uptime } from 'node:os';
import { lstatSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import si from 'systeminformation';
import { PROTOCOL_VERSION, type SessionState, type StatusResult } from '../ipc/protocol.js';
import { STATE } from '../core/state/names.js';
import { VERSION } from '../ipc/version.js';
import { limitHost, limitsStatus } from './limits.js';
import type { SessionContext } from './session/context.js';

/** How long the state dir's size (a walk of every file) is reused. */
const STATE_DIR_BYTES_TTL_MS = 5_000;

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

  constructor(private readonly source: StatusSource) {
    void si.currentLoad().catch(() => {}); // primes the CPU load sample (see status())
  }

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
    // systeminformation's first currentLoad() samples for about 0.5 s: it is primed at start,
    // and a status asked before that says null rather than waiting.
    const load = await Promise.race([si.currentLoad().catch(() => null), new Promise<null>((r) => setTimeout(() => r(null), 50))]);
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
        cpu_load_percent: load ? Math.round(load.currentLoad * 10) / 10 : null,
        mem_total_bytes: mem.total,
        mem_available_bytes: mem.available,
        uptime_s: Math.round(uptime()),
      },
    };
  }
}
