// Pure decisions about how a session ended: its outcome (first cause wins, docs/reference/exit-statuses.md
// table), the command digest, and the receipt assembled from recorded facts. No I/O here,
// so these are unit-tested without processes.
import { createHash } from 'node:crypto';
import type {
  CgroupEscape,
  DeathEvidence,
  HandoffFacts,
  Outcome,
  Receipt,
  ServiceFacts,
  SessionLimits,
  StreamName,
  StreamOutput,
  SupervisorMode,
  TerminationCause,
  WorkspaceEntry,
} from '../../ipc/protocol.js';
import type { CommandFields } from '../admission.js';
import { jcs } from '../../core/receipts/verify.js';

/**
 * "sha256:" + hex SHA-256 of the JCS encoding of the command (docs/reference/contract.md
 * "Session environment and command digest"): exactly argv, cwd, env (only what the request
 * set), pty, stdin and user, whatever else the object holds.
 */
export function commandDigest(c: CommandFields): string {
  const { argv, cwd, env, pty, stdin, user } = c;
  return `sha256:${createHash('sha256').update(jcs({ argv, cwd, env, pty, stdin, user })).digest('hex')}`;
}

export interface SpawnFailureFact {
  stage: string;
  errno: number;
  code: string;
}

/** Exit code sh reports for a failed exec: 127 not found, 126 found but not executable. */
export function spawnFailureExitCode(failure: SpawnFailureFact): number {
  if (failure.stage !== 'exec') return 125;
  return failure.code === 'ENOENT' || failure.code === 'ENOTDIR' ? 127 : 126;
}

/** The outcome: a spawn failure, else the first termination cause, else how the leader ended (oom_kill and linger: signaled or exited, as it ended). */
export function decideOutcome(facts: {
  spawnFailure: SpawnFailureFact | null;
  cause: TerminationCause | null;
  exit: { code: number | null; signal: string | null };
}): Outcome {
  if (facts.spawnFailure) return 'spawn_failed';
  if (facts.cause === 'deadline') return 'timed_out';
  if (facts.cause === 'cancel' || facts.cause === 'shutdown' || facts.cause === 'close') return 'cancelled';
  if (facts.cause === 'reconcile') return 'owner_lost';
  return facts.exit.signal ? 'signaled' : 'exited';
}

/**
 * The termination cause once the OOM killer is known to have struck: oom_kill when the leader
 * ended by a SIGKILL the supervisor had not sent and while no cause was set
 * (`leaderKilledUnasked`, decided at the leader's exit), and memory.events counted an OOM kill
 * by the session's death (cgroup-v2.rst "memory.events": oom_kill). It came before any linger
 * that followed, so it replaces that; any other cause stands. An OOM kill of a descendant only
 * leaves the cause as it was (usage.oom_kills says so).
 */
export function causeWithOom(cause: TerminationCause | null, facts: { leaderKilledUnasked: boolean; oomKills: number | undefined }): TerminationCause | null {
  if (!facts.leaderKilledUnasked || !((facts.oomKills ?? 0) > 0)) return cause;
  return cause === null || cause === 'linger' ? 'oom_kill' : cause;
}

export interface ReceiptFacts {
  sessionId: string;
  invocationKey: string;
  /** The session's task (null: unknown, its admission record unreadable; undefined: not recorded). */
  task?: string | null;
  commandDigest: string;
  argv: string[];
  cwd: string;
  user: string | null;
  /** The uid and gid it ran as (null: not recorded, an old admission). */
  uid?: number | null;
  gid?: number | null;
  supervisor: { instance: string; generation: number; bootId: string; mode: SupervisorMode; pid: number };
  admittedAt: Date;
  startedAt: Date | null;
  leaderExitedAt: Date | null;
  endedAt: Date;
  exit: { code: number | null; signal: string | null };
  spawnFailure: SpawnFailureFact | null;
  cause: TerminationCause | null;
  steps: { signal: string; at: Date; pids: number }[];
  /** Every signal the supervisor sent the session (escalation, sbx signal); undefined: not watched (owner lost). */
  signalsSent?: ReadonlySet<string>;
  death: { evidence: DeathEvidence; observedAt: Date; cgroup?: string; reaped?: number; escapeWatch?: 'fanotify' | 'unavailable'; escapes?: CgroupEscape[] };
  output: Partial<Record<StreamName, StreamOutput>>;
  usage: Receipt['usage'];
  /** The limits it ran under (its admission record's); absent or {}: none, and no `limits` in the receipt. */
  limits?: SessionLimits;
  descendantsTerminated: number;
  /** The workspace clock's entries (workspace/watcher.ts); absent or [] without workspaces. */
  workspace?: WorkspaceEntry[];
  /** What the leftovers went on as (linger handoff); null or absent: nothing was handed off. */
  handedOff?: HandoffFacts | null;
  /** The session is a service; null or absent: a command. */
  service?: ServiceFacts | null;
}

const iso = (d: Date | null): string | null => (d ? d.toISOString() : null);

/** Assembles the receipt (unsigned) from the facts recorded during the session. */
export function buildReceipt(f: ReceiptFacts): Receipt {
  const exit = f.spawnFailure ? { code: spawnFailureExitCode(f.spawnFailure), signal: null } : f.exit;
  const source = exit.signal && f.signalsSent ? { signal_source: f.signalsSent.has(exit.signal) ? ('supervisor' as const) : ('not_supervisor' as const) } : {};
  const receipt: Receipt = {
    version: 1,
    session_id: f.sessionId,
    invocation_key: f.invocationKey,
    command_digest: f.commandDigest,
    argv: f.argv,
    cwd: f.cwd,
    user: f.user,
    ...(typeof f.uid === 'number' ? { uid: f.uid } : {}),
    ...(typeof f.gid === 'number' ? { gid: f.gid } : {}),
    ...(f.task ? { task: f.task } : {}),
    supervisor: {
      instance: f.supervisor.instance,
      generation: f.supervisor.generation,
      boot_id: f.supervisor.bootId,
      mode: f.supervisor.mode,
      pid: f.supervisor.pid,
    },
    admitted_at: f.admittedAt.toISOString(),
    started_at: iso(f.startedAt),
    leader_exited_at: iso(f.leaderExitedAt),
    ended_at: f.endedAt.toISOString(),
    exit,
    termination: { cause: f.cause, steps: f.steps.map((s) => ({ signal: s.signal, at: s.at.toISOString(), pids: s.pids })), ...source },
    outcome: decideOutcome({ spawnFailure: f.spawnFailure, cause: f.cause, exit }),
    death: {
      evidence: f.death.evidence,
      observed_at: f.death.observedAt.toISOString(),
      ...(f.death.cgroup !== undefined ? { cgroup: f.death.cgroup } : {}),
      ...(f.death.reaped !== undefined ? { reaped: f.death.reaped } : {}),
      ...(f.death.escapeWatch !== undefined ? { escape_watch: f.death.escapeWatch } : {}),
      ...(f.death.escapes?.length ? { escapes: f.death.escapes } : {}),
    },
    output: f.output,
    usage: f.usage,
    ...(f.limits && Object.keys(f.limits).length ? { limits: { ...f.limits } } : {}),
    descendants_terminated: f.descendantsTerminated,
    ...(f.workspace?.length ? { workspace: f.workspace } : {}),
    ...(f.handedOff ? { handed_off: { ...f.handedOff } } : {}),
    ...(f.service ? { service: { ...f.service } } : {}),
  };
  if (f.spawnFailure) receipt.spawn_error = { ...f.spawnFailure };
  return receipt;
}
