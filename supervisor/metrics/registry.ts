// The supervisor's Prometheus metrics (prom-client, its own registry; text format:
// https://prometheus.io/docs/instrumenting/exposition_formats/): counters moved by hooks where state changes,
// and gauges and cumulative values read at scrape time (collect callbacks). Nothing here runs per read of a
// drain. Not the HTTP listener (http.ts). Loaded only when metrics are enabled.
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client';
import { isSupervisorError } from '../../ipc/errors.js';
import type { CheckpointResult, Outcome, Receipt, SessionState, StreamName, SupervisorMode, WorkspaceGap, WorkspaceStatus } from '../../ipc/protocol.js';
import { VERSION } from '../../ipc/version.js';
import { LiveSession } from '../session/live.js';
import type { Session } from '../session/session.js';

const P = 'sandbox_supervisor_';
const STATES: readonly SessionState[] = ['admitted', 'running', 'leader_exited', 'terminating', 'ended', 'unknown'];
const OUTCOMES: readonly Outcome[] = ['exited', 'signaled', 'timed_out', 'cancelled', 'spawn_failed', 'owner_lost'];
const STREAMS: readonly StreamName[] = ['stdout', 'stderr', 'pty'];
const GAPS: readonly WorkspaceGap[] = ['unsupported', 'overflow', 'listener_restart', 'barrier_timeout'];
/** The codes a launch can be refused with (Supervisor.launch, admission.ts), shown at 0 from the start. */
const REFUSAL_CODES = ['INVALID_ARGUMENT', 'KEY_CONFLICT', 'ADMISSION_SEALED', 'ADMISSION_DENIED', 'LIMIT_EXCEEDED', 'SHUTTING_DOWN', 'INTERNAL'] as const;

/** The IPC limits a request, frame or connection can be refused by (server.ts, connection.ts), shown at 0 from the start. */
export const IPC_LIMITS = ['in_flight', 'connections', 'pending_frame_bytes', 'frame_time', 'frame_bytes'] as const;

/** Why a WebSocket handshake failed (remote-auth.ts HandshakeFailure), shown at 0 from the start. */
const REMOTE_FAILURES = ['no_token', 'wrong_token', 'token_file_invalid', 'bad_upgrade', 'not_websocket', 'upgrade_timeout', 'connections'] as const;

/** The reasons output bytes are dropped (chunks.ts failure; docs/guide/running.md "Metrics"), shown at 0 from the start. */
const DROP_REASONS = ['quota', 'disk_full', 'io_error'] as const;

/** What a launch came to: a new session started, the key's session returned, or refused (with a code). */
export type LaunchOutcome = 'started' | 'existing' | 'refused';
/** A connection to the supervisor's socket: served, or refused (unauthorized peer, connection bound). */
export type ConnectionOutcome = 'accepted' | 'unauthorized' | 'limit_exceeded';
/** How one recovered session's reconciliation ended: a receipt, still unknown (no evidence), or an error. */
export type ReconciliationResult = 'ended' | 'unknown' | 'failed';

/** What the scrape reads from the running supervisor (Supervisor.observe wires it). */
export interface MetricsSources {
  /** Every session in the registry (ended ones included). */
  sessions: () => Iterable<Session>;
  /** Connections open on the supervisor's socket now. */
  connections: () => number;
  /** WebSocket connections open now (absent: no listener). */
  remoteConnections?: () => number;
  /** The workspace watcher's counts, per workspace (watcher.status()). */
  workspaces: () => WorkspaceStatus[];
  /** Events placed in no workspace (watcher.unplaced) and exited children held as zombies for the watcher (reaper.holds). */
  attribution?: () => { unplaced: number; dropped: number; own: number; held: number; unfenced: number };
  mode: SupervisorMode;
}

/**
 * Counters moved by hooks where state changes (a launch answered or refused, a session's state, a receipt made
 * durable, a reconciliation, a checkpoint, a connection), and gauges and cumulative values read at scrape time
 * from the registry of sessions, the drains' cursors, the workspace watcher and the server (MetricsSources).
 */
export class SupervisorMetrics {
  readonly registry = new Registry();
  private sources: MetricsSources | null = null;
  /** Output of sessions that ended in this process (receipts), added once each; live drains are added at scrape. */
  private readonly endedStoredBytes = new Map<StreamName, number>();
  private readonly endedDroppedBytes = new Map<string, number>();

  private readonly launches: Counter<'outcome'>;
  private readonly refusals: Counter<'code'>;
  private readonly receipts: Counter<'outcome'>;
  private readonly exitToReceipt: Histogram;
  private readonly unknown: Counter;
  private readonly reconciliations: Counter<'result'>;
  private readonly gaps: Counter<'workspace' | 'gap'>;
  private readonly checkpointSeconds: Histogram<'result'>;
  private readonly checkpointWritten: Counter;
  private readonly checkpointScanned: Counter;
  private readonly connectionsTotal: Counter<'outcome'>;
  private readonly ipcRefusals: Counter<'limit'>;
  private readonly remoteFailures: Counter<'reason'>;

  constructor() {
    const registers = [this.registry];
    collectDefaultMetrics({ register: this.registry });
    // prom-client's gauges named *_total break the naming rules (promtool check metrics says
    // so); their per-type siblings (nodejs_active_handles{type}, ...) carry the same counts.
    for (const name of ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total']) this.registry.removeSingleMetric(name);
    const self = this;
    new Gauge({
      name: `${P}info`,
      help: 'Always 1: the running supervisor, by version and mode (cgroup or subreaper).',
      labelNames: ['version', 'mode'],
      registers,
      collect() {
        this.reset();
        if (self.sources) this.set({ version: VERSION, mode: self.sources.mode }, 1);
      },
    });
    new Gauge({
      name: `${P}sessions`,
      help: 'Sessions in the registry now, by lifecycle state.',
      labelNames: ['state'],
      registers,
      collect() {
        const counts = new Map<SessionState, number>(STATES.map((s) => [s, 0]));
        for (const s of self.sources?.sessions() ?? []) counts.set(s.state, (counts.get(s.state) ?? 0) + 1);
        for (const [state, n] of counts) this.set({ state }, n);
      },
    });
    this.launches = new Counter({
      name: `${P}launches_total`,
      help: "launch requests with valid params (or refused by ipc.maxInFlight before their params were read), by outcome: started (a new session), existing (the invocation key's session returned), refused.",
      labelNames: ['outcome'],
      registers,
    });
    this.refusals = new Counter({
      name: `${P}admission_refusals_total`,
      help: 'Launches refused, by error code (KEY_CONFLICT, ADMISSION_SEALED, ADMISSION_DENIED, LIMIT_EXCEEDED, SHUTTING_DOWN, INVALID_ARGUMENT, INTERNAL); LIMIT_EXCEEDED includes the in_flight refusals of the socket.',
      labelNames: ['code'],
      registers,
    });
    this.ipcRefusals = new Counter({
      name: `${P}ipc_refusals_total`,
      help: 'Requests, frames and connections of any method refused by an IPC limit, by limit (in_flight, connections, pending_frame_bytes, frame_time, frame_bytes).',
      labelNames: ['limit'],
      registers,
    });
    this.receipts = new Counter({
      name: `${P}receipts_total`,
      help: 'Session receipts made durable by this process, by outcome.',
      labelNames: ['outcome'],
      registers,
    });
    this.exitToReceipt = new Histogram({
      name: `${P}exit_to_receipt_seconds`,
      help: 'From the leader reaped (leader_exited_at, ms resolution) to its receipt durable, for sessions this process ran.',
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
      registers,
    });
    new Counter({
      name: `${P}output_stored_bytes_total`,
      help: 'Output bytes stored in chunk files by the sessions this process ran, by stream (live sessions: their cursor now).',
      labelNames: ['stream'],
      registers,
      collect() {
        const live = self.liveOutput();
        this.reset();
        for (const stream of STREAMS) this.inc({ stream }, (self.endedStoredBytes.get(stream) ?? 0) + (live.stored.get(stream) ?? 0));
      },
    });
    new Counter({
      name: `${P}output_dropped_bytes_total`,
      help: 'Output bytes read but not stored, by stream and reason (quota, disk_full, io_error).',
      labelNames: ['stream', 'reason'],
      registers,
      collect() {
        const live = self.liveOutput();
        const all = new Map(self.endedDroppedBytes);
        for (const [k, v] of live.dropped) all.set(k, (all.get(k) ?? 0) + v);
        this.reset();
        for (const stream of STREAMS) for (const reason of DROP_REASONS) all.set(`${stream}\0${reason}`, all.get(`${stream}\0${reason}`) ?? 0);
        for (const [k, v] of all) {
          const [stream, reason] = k.split('\0');
          this.inc({ stream, reason }, v);
        }
      },
    });
    this.unknown = new Counter({
      name: `${P}sessions_unknown_total`,
      help: 'Sessions that became unknown: found without a receipt at start, or left without evidence (or with a receipt that could not be written yet) while running.',
      registers,
    });
    this.reconciliations = new Counter({
      name: `${P}reconciliations_total`,
      help: 'Reconciliations of sessions found unknown at start, by result: ended (a receipt), unknown (no evidence yet), failed.',
      labelNames: ['result'],
      registers,
    });
    new Counter({
      name: `${P}workspace_events_total`,
      help: 'fanotify events read in each watched workspace, by attribution: attributed (to a session by its cgroup) or unattributed.',
      labelNames: ['workspace', 'attribution'],
      registers,
      collect() {
        this.reset();
        for (const ws of self.sources?.workspaces() ?? []) {
          this.inc({ workspace: ws.path, attribution: 'attributed' }, Math.max(0, ws.events - ws.unattributed_events));
          this.inc({ workspace: ws.path, attribution: 'unattributed' }, ws.unattributed_events);
        }
      },
    });
    new Counter({
      name: `${P}workspace_events_unplaced_total`,
      help: 'fanotify events whose directory was gone before it could be named and that no delete named: counted in no workspace.',
      registers,
      collect() {
        this.reset();
        this.inc(self.sources?.attribution?.().unplaced ?? 0);
      },
    });
    new Counter({
      name: `${P}workspace_own_events_total`,
      help: "fanotify events of the supervisor's own writes read and dropped (its barriers apart): a checkpoint's store writes about four per object when the store is on a workspace's file system.",
      registers,
      collect() {
        this.reset();
        this.inc(self.sources?.attribution?.().own ?? 0);
      },
    });
    new Counter({
      name: `${P}workspace_events_dropped_total`,
      help: 'fanotify events read and dropped because workspace.maxQueuedEvents were read and not yet handled: each run of them is an overflow (sessions alive then get a scan).',
      registers,
      collect() {
        this.reset();
        this.inc(self.sources?.attribution?.().dropped ?? 0);
      },
    });
    new Counter({
      name: `${P}exited_held_total`,
      help: 'Exited children kept zombies until the workspace watcher read past their exit (so their writes are attributed), by result: held, or unfenced (reaped at once: the bound of held zombies was reached).',
      labelNames: ['result'],
      registers,
      collect() {
        this.reset();
        const a = self.sources?.attribution?.();
        this.inc({ result: 'held' }, a?.held ?? 0);
        this.inc({ result: 'unfenced' }, a?.unfenced ?? 0);
      },
    });
    this.gaps = new Counter({
      name: `${P}workspace_gaps_total`,
      help: 'Receipt workspace entries with a gap (a scan stands in), by workspace and gap (unsupported, overflow, listener_restart, barrier_timeout).',
      labelNames: ['workspace', 'gap'],
      registers,
    });
    this.checkpointSeconds = new Histogram({
      name: `${P}checkpoint_duration_seconds`,
      help: 'Checkpoints taken, from start to published (or failed), by result: published or failed.',
      labelNames: ['result'],
      buckets: [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600],
      registers,
    });
    this.checkpointWritten = new Counter({
      name: `${P}checkpoint_written_bytes_total`,
      help: 'Bytes of new objects written to the checkpoint store by published checkpoints.',
      registers,
    });
    this.checkpointScanned = new Counter({
      name: `${P}checkpoint_scanned_bytes_total`,
      help: 'Bytes of the files published checkpoints cover (their scans).',
      registers,
    });
    this.connectionsTotal = new Counter({
      name: `${P}connections_total`,
      help: 'Connections to the supervisor socket, by outcome: accepted, unauthorized, limit_exceeded.',
      labelNames: ['outcome'],
      registers,
    });
    new Gauge({
      name: `${P}connections`,
      help: 'Connections open on the supervisor socket now.',
      registers,
      collect() {
        this.set(self.sources?.connections() ?? 0);
      },
    });
    this.remoteFailures = new Counter({
      name: `${P}remote_handshake_failures_total`,
      help: 'Failed handshakes of the WebSocket listener, by reason: no_token, wrong_token, token_file_invalid (401: the token file fails its checks), bad_upgrade (400), not_websocket (426: a plain HTTP request), upgrade_timeout (no upgrade in time), connections (503: remote.maxConnections).',
      labelNames: ['reason'],
      registers,
    });
    new Gauge({
      name: `${P}remote_connections`,
      help: 'WebSocket connections open now.',
      registers,
      collect() {
        this.set(self.sources?.remoteConnections?.() ?? 0);
      },
    });
    for (const reason of REMOTE_FAILURES) this.remoteFailures.inc({ reason }, 0);
    // Known label values start at 0, so a first increase is a visible delta.
    for (const outcome of ['started', 'existing', 'refused']) this.launches.inc({ outcome }, 0);
    for (const code of REFUSAL_CODES) this.refusals.inc({ code }, 0);
    for (const outcome of OUTCOMES) this.receipts.inc({ outcome }, 0);
    for (const result of ['ended', 'unknown', 'failed']) this.reconciliations.inc({ result }, 0);
    for (const outcome of ['accepted', 'unauthorized', 'limit_exceeded']) this.connectionsTotal.inc({ outcome }, 0);
    for (const limit of IPC_LIMITS) this.ipcRefusals.inc({ limit }, 0);
    for (const result of ['published', 'failed']) this.checkpointSeconds.zero({ result });
  }

  /** Where the scrape reads gauges from; until then they read as empty. */
  observe(sources: MetricsSources): void {
    this.sources = sources;
    for (const ws of sources.workspaces()) for (const gap of GAPS) this.gaps.inc({ workspace: ws.path, gap }, 0);
  }

  /** The text exposition (Prometheus 0.0.4) and its content type. */
  async render(): Promise<{ contentType: string; body: string }> {
    return { contentType: this.registry.contentType, body: await this.registry.metrics() };
  }

  /** A launch answered with a session (started or existing). */
  launched(outcome: Exclude<LaunchOutcome, 'refused'>): void {
    this.launches.inc({ outcome });
  }

  /** A launch refused with err (a SupervisorError's code; anything else is INTERNAL). */
  launchRefused(err: unknown): void {
    this.launches.inc({ outcome: 'refused' });
    this.refusals.inc({ code: isSupervisorError(err) ? err.code : 'INTERNAL' });
  }

  /** A session moved to `state` (Session 'state' event): receipts, their output and latency at ended; unknown counted. */
  sessionState(session: Session, state: SessionState): void {
    if (state === 'unknown') this.unknown.inc();
    if (state !== 'ended' || !session.receipt) return;
    this.receiptWritten(session, session.receipt);
  }

  /** Sessions found unknown (no receipt) when the state dir was read back at start. */
  foundUnknown(count: number): void {
    if (count > 0) this.unknown.inc(count);
  }

  /** One recovered session's reconciliation is over. */
  reconciled(result: ReconciliationResult): void {
    this.reconciliations.inc({ result });
  }

  /** A checkpoint published (result) or failed (null), after `seconds`. */
  checkpointDone(result: CheckpointResult | null, seconds: number): void {
    this.checkpointSeconds.observe({ result: result ? 'published' : 'failed' }, seconds);
    if (!result) return;
    this.checkpointWritten.inc(result.objects.bytes_written);
    this.checkpointScanned.inc(result.scan.bytes);
  }

  /** A connection to the supervisor socket accepted or refused. */
  connection(outcome: ConnectionOutcome): void {
    this.connectionsTotal.inc({ outcome });
  }

  /** A failed handshake of the WebSocket listener (reason: remote-auth.ts HandshakeFailure). */
  remoteHandshakeFailed(reason: string): void {
    this.remoteFailures.inc({ reason });
  }

  /** A request, frame or connection refused by an IPC limit (a LIMIT_EXCEEDED's details.limit; frame_bytes: FRAME_TOO_LARGE). */
  ipcRefused(limit: string): void {
    this.ipcRefusals.inc({ limit });
  }

  private receiptWritten(session: Session, receipt: Receipt): void {
    this.receipts.inc({ outcome: receipt.outcome });
    for (const entry of receipt.workspace ?? []) if (entry.gap) this.gaps.inc({ workspace: entry.path, gap: entry.gap });
    // Output and latency only for what this process ran: a recovered session's bytes were stored by another.
    if (!(session instanceof LiveSession)) return;
    if (session.leaderExitedAt) this.exitToReceipt.observe(Math.max(0, Date.now() - session.leaderExitedAt.getTime()) / 1000);
    for (const [stream, out] of Object.entries(receipt.output) as [StreamName, NonNullable<Receipt['output'][StreamName]>][]) {
      this.endedStoredBytes.set(stream, (this.endedStoredBytes.get(stream) ?? 0) + out.final_cursor);
      if (out.dropped_bytes > 0) {
        const key = `${stream}\0${out.reason ?? 'unknown'}`;
        this.endedDroppedBytes.set(key, (this.endedDroppedBytes.get(key) ?? 0) + out.dropped_bytes);
      }
    }
  }

  /** Stored and dropped bytes of the drains of sessions not ended yet (their receipts add them once ended). */
  private liveOutput(): { stored: Map<StreamName, number>; dropped: Map<string, number> } {
    const stored = new Map<StreamName, number>();
    const dropped = new Map<string, number>();
    for (const s of this.sources?.sessions() ?? []) {
      if (s.state === 'ended' || !(s instanceof LiveSession)) continue;
      for (const [stream, drain] of s.drains) {
        stored.set(stream, (stored.get(stream) ?? 0) + drain.cursor);
        if (drain.log.droppedBytes > 0) {
          const key = `${stream}\0${drain.log.failure ?? 'unknown'}`;
          dropped.set(key, (dropped.get(key) ?? 0) + drain.log.droppedBytes);
        }
      }
    }
    return { stored, dropped };
  }
}
