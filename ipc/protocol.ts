// The wire protocol shared by the daemon and every client (sbx, the client library).
// Owns the version range, the shapes of results, events and the receipt (docs/reference/contract.md
// "Receipt"); params are derived from their zod schemas (schemas.ts), and methods.ts names
// each method's params and result. Not transport (framing.ts). Documented for humans in
// docs/reference/protocol.md. Only types come from schemas.ts here: importing this module loads no zod.
import type { z } from 'zod';
import type { ParamsSchemas } from './schemas.js';

/** Protocol versions this build speaks; the hello picks the highest both sides know. */
export const PROTOCOL_VERSIONS = [1] as const;
export const PROTOCOL_VERSION = 1;

export type StreamName = 'stdout' | 'stderr' | 'pty';

export type SessionState = 'admitted' | 'running' | 'leader_exited' | 'terminating' | 'ended' | 'unknown';
export type Outcome = 'exited' | 'signaled' | 'timed_out' | 'cancelled' | 'spawn_failed' | 'owner_lost';
/**
 * close: `sbx close` ended it after its settle timeout (outcome cancelled). oom_kill: the
 * kernel's OOM killer ended the leader at the session's memory.max (a SIGKILL the supervisor did
 * not send, with memory.events oom_kill > 0; outcome signaled; docs/guide/limits.md).
 */
export type TerminationCause = 'deadline' | 'cancel' | 'linger' | 'shutdown' | 'reconcile' | 'close' | 'oom_kill';
/** cgroup_escaped: the leaf emptied, but a process of the session moved something out of it first (death.escapes): no proof for what left. */
export type DeathEvidence = 'cgroup_empty' | 'cgroup_escaped' | 'subreaper_reaped' | 'boot_changed' | 'operator_attested';

/**
 * A write to another cgroup's cgroup.procs or cgroup.threads (only root can) seen while a
 * session ran: escape, by one of its processes (writer_pid); escape_possible, by a writer that
 * could not be attributed (gone before the read, an orphan of ours, a lost event: writer_pid
 * null), so charged to every root session; stray, found by the walk at a death (no event
 * needed): a live descendant of the supervisor in no live leaf, below the session or started
 * after it (writer_pid: the stray's pid). to: the destination cgroup's absolute path (null:
 * gone); at: when the write was read (within 50 ms of it) or the stray found.
 */
export interface CgroupEscape {
  kind: 'escape' | 'escape_possible' | 'stray';
  to: string | null;
  at: string;
  writer_pid: number | null;
}
export type SupervisorMode = 'cgroup' | 'subreaper';
/**
 * What becomes of descendants still running when the leader exits: handoff (the default where
 * the session has a cgroup leaf and no pty) moves them, frozen, into a new session of their own,
 * a service; kill ends them (TERM, grace, KILL); wait lets the session end with the last of them.
 */
export type LingerPolicy = 'kill' | 'wait' | 'handoff';

/**
 * A service: a session meant to keep running, started directly (`sbx run --service`, from: null)
 * or made of a command's leftovers at its leader's exit (from: that session's id). A task's close
 * ends its services at once (TERM, grace, KILL); one kept after close (keep_after_close) is not
 * the task's close's but the sandbox-wide close's.
 */
export interface ServiceFacts {
  handed_off_from: string | null;
  keep_after_close: boolean;
}

/** What a command's session handed off at its leader's exit: every process left in its leaf, moved (frozen) into that service's leaf. */
export interface HandoffFacts {
  service_id: string;
  /** Processes moved (cgroup.procs entries of the leaf, frozen). */
  pids: number;
  /** When the move was done (ISO-8601 UTC, ms): the command's streams end there, the service's begin. */
  at: string;
}

/**
 * A session's cgroup v2 limits (launch params, admission record, receipt `limits`;
 * docs/guide/limits.md): memory_max_bytes is written to memory.max (bytes; memory.swap.max
 * gets 0 where it exists: no swap past it), pids_max to pids.max (tasks: processes and
 * threads), cpus to cpu.max as `round(cpus * 100000) 100000` (CPUs' worth of time per 100 ms
 * period). Each is absent when not set; a launch asking for one whose controller this host
 * cannot enforce is refused (LIMIT_UNAVAILABLE), never run without it.
 */
export interface SessionLimits {
  memory_max_bytes?: number;
  pids_max?: number;
  cpus?: number;
}
/** The cgroup v2 controller each limit needs (cgroup-v2.rst "Controllers"). */
export type LimitController = 'memory' | 'pids' | 'cpu';

/** Client → daemon: `{ id, method, params }`; `id` is the client's, echoed back. */
export interface RequestFrame {
  id: number;
  method: string;
  params?: Record<string, unknown>;
}

/** Daemon → client: a response `{ id, result }` or `{ id, error }`, or an event `{ id, event, ... }`. */
export interface ResponseFrame {
  id: number;
  result?: unknown;
  error?: import('./errors.js').WireError;
  event?: string;
  [field: string]: unknown;
}

/** The params a client sends for a method (schemas.ts is their one source). */
type ParamsFor<M extends keyof typeof ParamsSchemas> = z.input<(typeof ParamsSchemas)[M]>;

/** hello params/result: the first exchange on every connection. */
export type HelloParams = ParamsFor<'hello'>;
export interface HelloResult {
  version: number;
  server: string;
  instance: string;
  generation: number;
  /** The server's ipc.maxFrameBytes (a frame's body, bytes): clients size their stdin writes under it. Absent from older supervisors. */
  max_frame_bytes?: number;
}

/**
 * launch params (schemas.ts): argv (argv[0] is looked up in the session's PATH by the exec
 * shim), cwd, env (what the request sets), inherit_env, invocation_key, timeout_ms, grace_ms,
 * linger, memory_max_bytes, pids_max, cpus (SessionLimits; not in the command digest, as
 * timeout_ms is not; LIMIT_UNAVAILABLE where the controller is absent), user (run as that user; the supervisor must be root), pty {cols, rows} (one stream,
 * "pty"), stdin (clients write it: method write; else /dev/null), on_disconnect (cancel: the
 * session is cancelled when this connection closes before it ends; only for a new session: a
 * retry of an existing key never changes how that session ends).
 */
export type LaunchParams = ParamsFor<'launch'>;
export interface LaunchResult {
  session_id: string;
  invocation_key: string;
  existing: boolean;
  /** retired: the retention policy removed the session whole; its key is never run again. */
  state: SessionState | 'retired';
  command_digest: string;
  /** Sessions started with stdin: bytes of stdin accepted so far (where a reattaching terminal resumes). */
  stdin_cursor?: number;
}

/**
 * The file methods (docs/guide/files.md), each a session: write_file {path, mode?, size_bytes} (stdin:
 * exactly size_bytes, written with `write`), read_file {path} (the bytes on stdout), upload {dir}
 * (a tar on stdin), download {dir} (a tar on stdout); all take key (the invocation key), task and
 * user, and answer a LaunchResult.
 */
export type WriteFileParams = ParamsFor<'write_file'>;
export type ReadFileParams = ParamsFor<'read_file'>;
export type UploadParams = ParamsFor<'upload'>;
export type DownloadParams = ParamsFor<'download'>;

/** Selects one session by id or by invocation key (exactly one of them). */
export type SessionSelector = ParamsFor<'wait'>;

/** subscribe: stream one stream's bytes from a cursor; events follow the result. */
export type SubscribeParams = ParamsFor<'subscribe'>;
export interface SubscribeResult {
  session_id: string;
  stream: StreamName;
  from: number;
  cursor: number;
}
/** read_index: a stream's per-read index from a cursor (docs/reference/protocol.md "read_index"). */
export type ReadIndexParams = ParamsFor<'read_index'>;
/** One read of a stream: bytes [cursor, cursor + length), arrived at at_us (µs since the Unix epoch, the supervisor's clock). */
export interface IndexRecordWire {
  cursor: number;
  length: number;
  at_us: number;
}
export interface ReadIndexResult {
  session_id: string;
  stream: StreamName;
  from: number;
  /** In cursor order, tiling the stream: the first is the read holding byte `from` (it may start before it). */
  records: IndexRecordWire[];
  /** Where the next request starts: the end of the last record (from, when there is none). */
  next: number;
  /** More records are there now past `next` (the answer stopped at `limit`). */
  more: boolean;
  /** The stream's stored bytes now (subscribe reads up to it); past the index's end when the index ended short. */
  cursor: number;
  /** The index will never grow: the stream is final and this answer reaches the index's end. */
  final: boolean;
  /**
   * Every read of this stream that arrived at or before this time (µs since the epoch) is
   * among the records up to `next`: a merge may place any read of another stream arrived at
   * or before it. null when final.
   */
  through_us: number | null;
}
/** `output` event: bytes [cursor, cursor + data.length) of one stream. */
export interface OutputEvent {
  id: number;
  event: 'output';
  stream: StreamName;
  cursor: number;
  data: Uint8Array;
}
/** `end` event: the subscription is over; `final` says whether the stream will never grow. */
export interface EndEvent {
  id: number;
  event: 'end';
  stream: StreamName;
  cursor: number;
  final: boolean;
}

export interface SessionSummary {
  session_id: string;
  invocation_key: string;
  /** Its task; null when its admission record cannot be read. */
  task: string | null;
  state: SessionState;
  argv: string[];
  pid: number | null;
  admitted_at: string;
  /** When the exec shim reported the exec (ISO-8601 UTC, ms); null before, or when it never started. */
  started_at: string | null;
  ended_at: string | null;
  outcome: Outcome | null;
  /** The receipt's exit (code or signal name) once ended; null before. */
  exit: { code: number | null; signal: string | null } | null;
  /** The receipt's termination cause once ended (deadline, cancel, linger, shutdown, ...); null before or when none. */
  termination_cause: string | null;
  /** The user it runs as, as requested (name or uid); null: the supervisor's own. */
  user: string | null;
  live_pids: number | null;
  cursors: Partial<Record<StreamName, number>>;
  /** Resource use from the session's cgroup: now while it runs, final once ended ({} without a cgroup). */
  usage: SessionUsage;
  /** Why the session is unknown, when it is. */
  reason?: string;
  /**
   * Unknown now, and its receipt is on its way: a recovered session reconciliation is ending
   * (TERM sent, KILL after its grace), or one whose receipt waits for disk space. Absent else.
   */
  receipt_pending?: true;
  /** A service (ServiceFacts): started with --service, or made of the leftovers of handed_off_from. */
  service?: ServiceFacts;
  /** The service this session's leftovers went on as (its receipt's handed_off), once handed off. */
  handed_off_to?: string;
  /**
   * Ended with processes moved out of its cgroup (its receipt's death evidence cgroup_escaped,
   * docs/guide/escapes.md): their end unproven, or attested by an operator (sbx resolve). Absent else.
   */
  escaped?: 'unproven' | 'attested';
}

export interface StatusResult {
  version: string;
  protocol: number;
  instance: string;
  generation: number;
  mode: SupervisorMode;
  boot_id: string;
  pid: number;
  /** Seconds since the supervisor process started (ms precision); the machine's is machine.uptime_s. */
  uptime_s: number;
  /** When the supervisor process started, RFC 3339 UTC. */
  started_at: string;
  socket: string;
  state_dir: string;
  cgroup: string | null;
  /** The cgroup escape watch (docs/guide/receipts.md "Receipts and the trust model"): on, or off and why (receipts then say escape_watch unavailable). */
  escape_watch?: { on: boolean; reason: string | null };
  /** The public key receipts are signed with (also <state>/receipt-key.pub). */
  receipt_key: { key_id: string; public_key_pem: string; path: string };
  sessions: Record<string, number>;
  load: { loadavg: number[]; cpus: number; free_mem_bytes: number; total_mem_bytes: number };
  /** Whether launches of new keys are taken: open, sealed (sbx seal/close), reconciling, stopping, or refused for disk_low. */
  admission: 'open' | 'sealed' | 'reconciling' | 'stopping' | 'disk_low';
  /** Why admission is not open (disk_low, reconciling), in words. */
  admission_reason?: string;
  sealed: { generation: number; sealed_at: string } | null;
  /** The state dir: bytes its files hold, free space and size of its file system, and the thresholds (config storage.*, scaled to that size when unset). */
  storage: {
    state_dir_bytes: number;
    free_bytes: number;
    total_bytes: number;
    reserve_bytes: number;
    min_free_bytes: number;
    keep_free_bytes: number;
    admits: boolean;
  };
  /** The machine: CPU load (%, all CPUs, since the last status or since start: /proc/stat, iowait counted idle), memory (systeminformation: /proc/meminfo), and its uptime since boot (os.uptime(); the supervisor's own is uptime_s). */
  machine: { cpu_load_percent: number | null; mem_total_bytes: number; mem_available_bytes: number; uptime_s: number };
  /** The watched workspaces (config workspace.paths, serve --workspace); [] when none. */
  workspaces: WorkspaceStatus[];
  /**
   * Events read whose directory was gone before it could be named, and that no later delete
   * named (a queue overflow, a kernel without FAN_REPORT_TARGET_FID): counted here, in no
   * workspace, never guessed into one. 0 without workspaces.
   */
  workspace_unplaced_events: number;
  /**
   * The supervisor's own writes on a watched file system read as events and dropped, since
   * start (its barriers apart; a checkpoint's store writes about four per object when the store
   * is on a workspace's file system). 0 without workspaces.
   */
  workspace_own_events: number;
  /** Where checkpoints are published: a directory, or s3://bucket/prefix (config checkpoint.store). */
  checkpoint_store?: string;
  /** Where the Prometheus endpoint listens (`HOST:PORT` with the port bound, or a socket path); absent when metrics are off. */
  metrics?: string;
  /** The WebSocket listener's URL (`ws://HOST:PORT/` or `wss://`, the port bound); absent when it is off (docs/guide/remote.md). */
  remote?: string;
  /**
   * Which session limits this host can enforce (docs/guide/limits.md): a controller is true when
   * the sessions cgroup has it in cgroup.subtree_control (so every leaf gets its files); reason,
   * when any is false, says why in words. Absent from older supervisors.
   */
  limits?: LimitsStatus;
}

/** `status.limits`: memory, pids, cpu enforceable here, and why not (reason, when any is false). */
export interface LimitsStatus {
  memory: boolean;
  pids: boolean;
  cpu: boolean;
  reason?: string;
}

/** One workspace as `sbx status` shows it (supervisor/workspace/watcher.ts). */
export interface WorkspaceStatus {
  path: string;
  /** The file system (statfs(2) f_type: ext4, tmpfs, overlay, ...). */
  fs: string;
  /** fanotify: events are attributed and ordered; scan: they cannot be (the reason is in health), sessions get a scan at death. */
  mode: 'fanotify' | 'scan';
  health: string;
  /** The listener epoch: boot id and the listener's start (ms); sequence numbers count within it. */
  epoch: string;
  events: number;
  last_seq: number | null;
  unattributed_events: number;
}

/** One change as `sbx changes` lists it (supervisor/workspace/changes.ts): a renamed_from then renamed_to of the session is one `renamed`. */
export interface WorkspaceChange {
  /** The event's sequence (of the last one coalesced into it). */
  seq: number;
  kind: 'created' | 'modified' | 'attrib' | 'deleted' | 'renamed' | 'renamed_from' | 'renamed_to';
  /** Relative to the workspace. */
  path: string;
  /** For renamed: the old path. */
  from?: string;
  /** Only for a name that is not UTF-8 (path/from then show each such byte as \xNN): its bytes, base64. */
  path_b64?: string;
  from_b64?: string;
  /** The entry is a directory. */
  dir?: true;
  at: string;
}

/** `changes`: what one session changed in each workspace, in order (attributed events only). */
export interface ChangesResult {
  session_id: string;
  state: SessionState | 'retired';
  workspaces: {
    path: string;
    epoch: string | null;
    changes: WorkspaceChange[];
    /** Changes past the log's bound (workspace.changesMaxEntries), counted, not listed. */
    dropped: number;
    /** Events no session claimed during this session's life (so far, while it runs). */
    unattributed_events: number | null;
    terminal_mutation: number | null;
    gap: WorkspaceGap | null;
  }[];
}

/** Why a workspace entry cannot vouch for the events (docs/reference/contract.md "Workspaces, checkpoints and tasks"): then `scan` stands in. */
export type WorkspaceGap = 'unsupported' | 'overflow' | 'listener_restart' | 'barrier_timeout';

/**
 * A receipt's evidence for one workspace (docs/reference/contract.md "Receipt", "Workspaces"). terminal_mutation:
 * the sequence of the barrier written after the session's cgroup emptied, every event of the
 * session is before it, attributed or not; null with a gap.
 */
export interface WorkspaceEntry {
  path: string;
  epoch: string;
  terminal_mutation: number | null;
  attributed: { events: number; last_seq: number | null; last_at: string | null; last_path: string | null };
  /** Events in the workspace during the session's life that no session's leaf claimed (writers reaped before the read, or outside any session). */
  unattributed_events: number;
  gap: WorkspaceGap | null;
  /** The scan at death, when gap is not null (null if the scan failed: see the log). */
  scan: { digest: string; entries: number; bytes: number; max_ctime: string | null } | null;
}

/**
 * One chunk file of a stream: [start_cursor, start_cursor + length). `sha256` (the chunk's
 * own digest) is in receipts written before 0.1.0's drain rework and in `owner_lost`
 * receipts; new receipts commit to the chunks through the stream's `sha256` only.
 */
export interface ChunkDigest {
  start_cursor: number;
  length: number;
  sha256?: string;
}

export interface StreamOutput {
  final_cursor: number;
  sha256: string;
  complete: boolean;
  /** io_error: a write refused for another reason than space (e.g. a planted link, EEXIST). */
  /** pty_hangup: the pty was hung up (its master read EOF instead of EIO, or the command hung up its own tty, vhangup(2)); bytes in flight may be lost. */
  reason: null | 'quota' | 'disk_full' | 'drain_timeout' | 'owner_lost' | 'io_error' | 'pty_hangup';
  dropped_bytes: number;
  /** How the drain ended; "lost": the supervisor that drained it died (owner_lost). */
  /** handoff: the stream was handed on at the leader's exit with the processes holding it (HandoffFacts): every byte written before is here, every byte after is the service's. */
  drain_end: 'eof' | 'eio' | 'timeout' | 'lost' | 'handoff';
  index_sha256: string;
  /** Every chunk file, in order; covered by the signature with the rest. */
  chunks: ChunkDigest[];
}

/** The receipt (docs/reference/contract.md "Receipt"): signed (Ed25519 over its JCS encoding without `signature`). */
export interface Receipt {
  version: 1;
  session_id: string;
  invocation_key: string;
  command_digest: string;
  argv: string[];
  cwd: string;
  /** The user the session ran as (name or uid), null: the supervisor's own. */
  user?: string | null;
  /** The uid and gid it ran as (absent in older receipts and where the admission did not record them). */
  uid?: number;
  gid?: number;
  /** The task the session was launched in (`--task`; `default` when none was named). Absent in receipts of sessions admitted before tasks. */
  task?: string;
  supervisor: { instance: string; generation: number; boot_id: string; mode: SupervisorMode; pid: number };
  admitted_at: string;
  started_at: string | null;
  leader_exited_at: string | null;
  ended_at: string;
  exit: { code: number | null; signal: string | null };
  termination: {
    cause: TerminationCause | null;
    steps: { signal: string; at: string; pids: number }[];
    /** With exit.signal: whether the supervisor had sent that signal (not_supervisor: another process, the OOM killer, the session itself). Here, not in exit, so readers that know only {code, signal} keep it. */
    signal_source?: 'supervisor' | 'not_supervisor';
  };
  outcome: Outcome;
  /** escape_watch: whether writes moving processes out of the leaf were watched (cgroup deaths); escapes: those seen (evidence cgroup_escaped). */
  death: {
    evidence: DeathEvidence;
    observed_at: string;
    cgroup?: string;
    reaped?: number;
    escape_watch?: 'fanotify' | 'unavailable';
    escapes?: CgroupEscape[];
  };
  output: Partial<Record<StreamName, StreamOutput>>;
  usage: SessionUsage;
  /** The limits the session ran under (its admission's; docs/guide/limits.md); absent when none was set, and in receipts written before limits. */
  limits?: SessionLimits;
  descendants_terminated: number;
  /** One entry per watched workspace (absent when the supervisor watches none). */
  workspace?: WorkspaceEntry[];
  spawn_error?: { stage: string; errno: number; code: string };
  /** Only with death.evidence "operator_attested": who said so, and why. */
  operator?: { uid: number; pid: number; reason: string; unknown_reason: string | null };
  /** The processes left at the leader's exit went on as a service (linger handoff): none of them ran outside it. */
  handed_off?: HandoffFacts;
  /** This session is a service (ServiceFacts). */
  service?: ServiceFacts;
  signature?: { alg: 'ed25519'; key_id: string; value: string };
}

/** sh/timeout(1)/docker conventions: the status `sbx run` and `sbx wait` exit with. */
export function exitStatusOf(receipt: Pick<Receipt, 'outcome' | 'exit' | 'service'>, signalNumber: (name: string) => number): number {
  // A service of leftovers has no leader, so no exit status of its own: 0 once it ended with proof.
  if (
    receipt.service?.handed_off_from &&
    receipt.exit.code === null &&
    receipt.exit.signal === null &&
    (receipt.outcome === 'exited' || receipt.outcome === 'cancelled')
  )
    return 0;
  switch (receipt.outcome) {
    case 'exited':
    case 'spawn_failed':
      return receipt.exit.code ?? 125;
    case 'timed_out':
      return 124;
    case 'owner_lost':
      return 125;
    case 'signaled':
    case 'cancelled':
      if (receipt.exit.signal) return 128 + signalNumber(receipt.exit.signal);
      return receipt.exit.code ?? 125;
  }
}

/**
 * One workspace directory as `sbx close --workspace` scanned it (supervisor/close.ts), after
 * the last session died. The walk goes through directory fds (any depth) and never follows a
 * symlink (a symlink is an entry). A scan that failed says so: `error`, and `digest: null`.
 */
export interface WorkspaceScan {
  /** The directory as given (absolute). */
  path: string;
  /** Regular files (symlinks and other entries are digested too, but not counted here); 0 on error. */
  files: number;
  /** Sum of the regular files' sizes, bytes; 0 on error. */
  total_bytes: number;
  /** ISO-8601 mtime of the newest entry (ms), null for an empty directory or on error. */
  newest_mtime: string | null;
  /**
   * "sha256:" over the lines "<t> <relative path> <size> <mtime ns>", and " <target>" for a
   * symlink, of every entry below the directory (t: f file, d dir, l symlink, o other; size 0
   * but for files; "%" and newline in paths and targets written %25 and %0A, a space in a
   * target %20), sorted as strings (UTF-16 code units), joined with "\n". Paths are their bytes
   * (a byte that is not UTF-8 sorts as U+DC00+byte). null when the scan failed: no digest, not
   * the digest of nothing (supervisor/workspace/digest.ts).
   */
  digest: string | null;
  /**
   * Set when the scan failed: an errno name (ENOENT, ENOTDIR, ELOOP: the directory is a
   * symlink, EACCES, EMFILE: out of fds, one per directory level), scan_timeout or scan_failed.
   */
  error?: string;
  /** What failed and where (relative path, depth), for people. */
  error_message?: string;
}

export interface CloseSessionEntry {
  session_id: string;
  invocation_key: string;
  /** Its task (null: its admission record cannot be read; it is in every task's join). */
  task?: string | null;
  state: string;
  outcome: string | null;
  receipt_sha256: string | null;
}

export interface CloseReceipt {
  version: 1;
  kind: 'close';
  supervisor: { instance: string; generation: number; boot_id: string; mode: string };
  sealed: { generation: number; sealed_at: string };
  closed_at: string;
  /** terminated: how many sessions the close ended (TERM, grace, KILL; cause close) after timeout_ms; terminated_ids: which, sorted (absent in receipts written before issue 31). */
  settle: { timeout_ms: number; terminated: number; terminated_ids?: string[] };
  sessions: CloseSessionEntry[];
  workspaces: WorkspaceScan[];
  /** Each task's verdict: its close (supervisor/task/close.ts) ran as part of this one. */
  tasks?: CloseTaskEntry[];
  /** Every task complete and every session ended: then (only) the receipt is final (written). */
  complete?: boolean;
  signature?: { alg: 'ed25519'; key_id: string; value: string };
}

/** One task's verdict in a close receipt: its task receipt's attempt, complete, digest (`sha256:` of its JCS) and obligations. */
export interface CloseTaskEntry {
  task: string;
  attempt: number;
  complete: boolean;
  receipt_sha256: string;
  obligations: TaskObligation[];
}

/** The task a session belongs to when its launch named none (`--task`). */
export const DEFAULT_TASK = 'default';

/** `seal` with a task: that task's admission sealed for good (durable), and whether it already was. */
export interface TaskSealResult {
  task: string;
  generation: number;
  sealed_at: string;
  already_sealed: boolean;
}

/** Which authority must settle an obligation: the session (its own end), the workspace (its scan, checkpoint, store), an operator (a fact only a person can give). */
export type ObligationAuthority = 'session' | 'workspace' | 'operator';

/** One fact complete(task) lacks, and who must supply it (core/task/join.ts). */
export interface TaskObligation {
  authority: ObligationAuthority;
  /** The condition it holds false: sealed, sessions_settled, terminal_mutations_known, checkpoint_covers, read_back_exact, fenced. */
  condition: keyof TaskConditions;
  /** What is missing, for people (with the command that settles it where there is one). */
  what: string;
  session_id?: string;
  workspace?: string;
}

/** The conditions of complete(task) (docs/reference/contract.md "Workspaces, checkpoints and tasks"), each true or false. */
export interface TaskConditions {
  sealed: boolean;
  sessions_settled: boolean;
  terminal_mutations_known: boolean;
  checkpoint_covers: boolean;
  read_back_exact: boolean;
  fenced: boolean;
}

/** One session of a task as its task receipt lists it (from its signed receipt). */
export interface TaskSessionEntry {
  session_id: string;
  invocation_key: string;
  /** The session's task; null: its admission record is unreadable, so it may be any task's (it is listed in every task's join). */
  task: string | null;
  /** retired: removed whole by the retention policy before the close (its tombstone gives outcome, receipt_sha256 and ended_at). */
  state: SessionState | 'retired';
  outcome: Outcome | null;
  /** The leader's exit as its receipt says (a complete task is not a successful one: check these). */
  exit: { code: number | null; signal: string | null } | null;
  /** `sha256:` of the session receipt's JCS (null: no receipt). */
  receipt_sha256: string | null;
  /** The uid it ran as (its receipt's; null: not recorded). */
  uid: number | null;
  /** The receipt's death evidence (operator_attested: an operator's word, shown as such; cgroup_escaped: with where its processes went). */
  death: {
    evidence: string;
    observed_at: string;
    escapes?: CgroupEscape[];
    escape_attested?: { uid: number; pid: number; reason: string; attested_at: string };
  } | null;
  ended_at: string | null;
  /** Each stream's final cursor, whether the stored log is whole, and why not. */
  output: Record<string, { final_cursor: number; complete: boolean; reason: string | null }>;
  /** A service of the task (ended by the close at once, not waited for); absent for other sessions. */
  service?: ServiceFacts;
  /** Per workspace of the close (the watched root holding it): the session's terminal_mutation, or its gap (not_watched: no watched root) and the digest of the scan that stands in. */
  workspace: { path: string; root: string | null; epoch: string | null; terminal_mutation: number | null; gap: string | null; scan_digest: string | null }[];
}

/** The checkpoint of one workspace of a task's close, or why there is none. */
export interface TaskCheckpointEntry {
  workspace: string;
  /** Null: not taken (error says why). */
  checkpoint_id: string | null;
  store: string | null;
  started_at: string | null;
  boundary: { epoch: string | null; seq: number | null; gap: string | null } | null;
  scan_digest: string | null;
  consistent: boolean | null;
  unstable: string[];
  unstable_count: number;
  /** Of `unstable`, the paths another process's write lease held shut (not captured), and how many; absent in receipts written before it was said. */
  leased?: string[];
  leased_count?: number;
  /** Mount points the checkpoint did not enter (its manifest's `mount: true` entries); absent in receipts written before it was said. */
  mounts_skipped?: string[];
  /** The read-back made before the checkpoint was published (objects re-hashed, bytes); null: none completed. */
  read_back: { exact: boolean; objects: number; bytes: number; at: string | null } | null;
  /** The runtime fence the manifest carries. */
  fence: { instance: string; generation: number; boot_id: string } | null;
  /** The close attempt that took it (a later attempt reuses a checkpoint that still covers). */
  close_attempt: number | null;
  /** Why there is no published checkpoint: { code, stage, message }. */
  error: { code: string; stage: string | null; message: string } | null;
}

/**
 * The task receipt (`sbx close --task T`): complete(task) evaluated over durable facts, signed
 * like a receipt (Ed25519 over its JCS without `signature`); its id is `sha256:` of that JCS.
 * A complete one is final: every later close of the task returns it unchanged.
 */
export interface TaskReceipt {
  version: 1;
  kind: 'task';
  task: string;
  /** Which close attempt wrote it: a close that found an incomplete receipt runs the join again as the next attempt. */
  attempt: number;
  supervisor: { instance: string; generation: number; boot_id: string; mode: string };
  /** The task's seal (its admission stopped for good then); generation and sealed_at null when the seal record cannot be read (the task is sealed; when is not known). */
  sealed: { generation: number | null; sealed_at: string | null } | null;
  closed_at: string;
  /** terminated: how many sessions the close ended (TERM, grace, KILL; cause close) after timeout_ms; terminated_ids: which, sorted (absent in receipts written before issue 31). */
  settle: { timeout_ms: number; terminated: number; terminated_ids?: string[] };
  sessions: TaskSessionEntry[];
  workspaces: string[];
  checkpoints: TaskCheckpointEntry[];
  /** The fence the join was evaluated under: this supervisor's instance, generation and boot id, as supervisor.json still names them. */
  fence: { instance: string; generation: number; boot_id: string };
  complete: boolean;
  conditions: TaskConditions;
  obligations: TaskObligation[];
  /** The sessions that ran as root (uid 0), whose death proof rests on root not interfering (a note; an escape seen is an obligation). Absent when none did. */
  trust?: { root_sessions: string[]; reason: string };
  signature?: { alg: 'ed25519'; key_id: string; value: string };
}

/**
 * `checkpoint`: a checkpoint published (its manifest and every object read back and re-hashed
 * first; docs/guide/checkpoints.md "Checkpoints"). The manifest itself is in the store, named by checkpoint_id.
 */
export interface CheckpointResult {
  /** Hex SHA-256 of the manifest's canonical bytes (RFC 8785). */
  checkpoint_id: string;
  workspace: string;
  task: string | null;
  /** The store published to: a directory, or s3://bucket/prefix. */
  store: string;
  started_at: string;
  created_at: string;
  /** The barrier taken before the scan, or a gap (not_watched, unsupported, listener_restart, barrier_timeout). */
  boundary: { epoch: string | null; seq: number | null; gap: string | null };
  scan: { digest: string; entries: number; files: number; bytes: number; passes: number };
  /** False when paths still changed in the last pass (`unstable`, at most 100 shown, `unstable_count` in all). */
  consistent: boolean;
  /** With checkpoint.freeze: whether the last pass ran with the workspace's file system frozen, how long, or why not; null when not asked. */
  freeze: { frozen: boolean; ms: number; reason: string | null } | null;
  unstable: string[];
  unstable_count: number;
  /** Of `unstable`, the paths another process's write lease held shut in the last pass: never changed, not captured (at most 100 shown, `leased_count` in all). */
  leased: string[];
  leased_count: number;
  /** Mount points inside the workspace: recorded as directories (`mount: true` in the manifest), what is mounted there not captured. */
  mounts_skipped: string[];
  /** Objects the manifest names; how many and how many bytes this checkpoint wrote to the local store (0 for an unchanged tree); with an S3 store, how many it uploaded, and of those how many were put over bytes that failed their read-back (repaired). */
  objects: { referenced: number; written: number; bytes_written: number; uploaded?: number; repaired?: number };
  /** The tree objects (manifest version 2: one per directory, its entries by name; an unchanged directory's is the same object): named by the manifest, new in the local store and their bytes, and built this time (the rest kept from the workspace's last read-back checkpoint without being made again). `uploaded` and `read_back` count them with the files' objects. */
  trees: { referenced: number; written: number; bytes_written: number; built: number };
  /**
   * What the capture read of the workspace: files opened and read in every pass (one read twice counts twice; 0 when every file was kept from the stat cache), and the bytes hashed.
   * hinted_paths: the paths the workspace watcher saw events on since the last read-back checkpoint, looked at (and their files read, counted in `files`) before the first walk, so that one walk can suffice (`scan.passes` 1); 0 when none were (nothing changed, no such checkpoint, the workspace not watched, or events lost).
   */
  read: { files: number; bytes: number; hinted_paths: number };
  /** at: when the read-back completed (ISO-8601 UTC, ms; the published record's time). */
  /** objects/bytes: what the read-back checked; rehashed_*: of those, re-read and re-hashed now (the rest confirmed by their files' stat: checkpoint.readBack "changed"). */
  /** trusted_objects: of `objects`, those not looked at now: only under directories whose trees a read-back of this supervisor checked, unchanged since (checkpoint.readBack "changed"); trees: the tree objects (not in `objects`), of those re-hashed, and not looked at. */
  read_back: {
    objects: number;
    bytes: number;
    rehashed_objects: number;
    rehashed_bytes: number;
    trusted_objects: number;
    trees: { objects: number; rehashed_objects: number; trusted_objects: number };
    ms: number;
    at: string;
  };
  supervisor: { instance: string; generation: number; boot_id: string; mode: string };
  duration_ms: number;
  /** Where the time went: the barrier, the checkpoint thread (hash, store, passes, the manifest built, signed and written), a remote store's uploads, the read-back. */
  phases_ms: { boundary: number; capture: number; store: number; read_back: number };
}

/** A session's resource use from its cgroup (receipt `usage`, ps `usage`). */
export interface SessionUsage {
  cpu_usec?: number;
  user_usec?: number;
  system_usec?: number;
  /** false: no memory controller in the leaf, so the memory fields are absent (not zero). */
  memory_controller?: boolean;
  memory_peak_bytes?: number;
  /** memory.events oom_kill: processes of the session the OOM killer ended (the leader or a descendant). */
  oom_kills?: number;
  /** pids.peak: the most tasks the leaf held at once (with the pids controller, Linux 6.1+). */
  pids_peak?: number;
}
