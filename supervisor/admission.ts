// Where a launch is decided: a pure function from the request (its invocation key and command digest) and the
// supervisor's load (the key's session or tombstone, the seal, live sessions, reconciliation, the state dir's
// free space, the limits this host can enforce) to one decision: answer with the existing session, admit a new
// one, or refuse with a stable error code (docs/reference/contract.md "Error codes"); and the admission state
// status shows. No I/O: the registry gathers the load and carries the decision out.
import { SupervisorError } from '../ipc/errors.js';
import type { LingerPolicy, SessionState, StatusResult } from '../ipc/protocol.js';
import type { SessionRequest } from './session/context.js';

export interface AdmissionRequest {
  invocationKey: string;
  commandDigest: string;
  task: string;
  /** What the digest covers, to name what differs in a KEY_CONFLICT (absent: not named). */
  command?: CommandFields;
}

/** The fields the command digest covers (docs/reference/contract.md "Session environment and command digest"). */
export interface CommandFields {
  argv: string[];
  cwd: string;
  /** Only what the request set. */
  env: Record<string, string>;
  /** As requested (name or uid); null: the supervisor's. */
  user: string | null;
  pty: boolean;
  stdin: 'null' | 'stream';
}

/** A session request's command as admission compares it and the digest covers it (exactly these fields). */
export function commandOf(req: Pick<SessionRequest, 'argv' | 'cwd' | 'env' | 'user' | 'pty' | 'stdin'>): CommandFields {
  return { argv: req.argv, cwd: req.cwd, env: req.env, user: req.user, pty: req.pty !== null, stdin: req.stdin };
}

/** The digest's fields, in the contract's order, as KEY_CONFLICT's details.differs names them. */
export const COMMAND_FIELDS = ['argv', 'cwd', 'env', 'user', 'pty', 'stdin'] as const;
export type CommandField = (typeof COMMAND_FIELDS)[number];

/**
 * Which fields of two commands differ, and for env the names whose value or presence differs
 * (sorted; names only: values are never told, they may be secrets).
 */
export function commandDifferences(a: CommandFields, b: CommandFields): { fields: CommandField[]; envNames: string[] } {
  const envNames = [...new Set([...Object.keys(a.env), ...Object.keys(b.env)])].filter((n) => a.env[n] !== b.env[n]).sort();
  const fields = COMMAND_FIELDS.filter((f) => {
    if (f === 'argv') return a.argv.length !== b.argv.length || a.argv.some((x, i) => x !== b.argv[i]);
    if (f === 'env') return envNames.length > 0;
    return a[f] !== b[f];
  });
  return { fields, envNames };
}

export interface AdmissionLoad {
  /** The session that holds the key (commandDigest '' when its admission record is unreadable). */
  existing: { sessionId: string; commandDigest: string; state: SessionState; task: string | null; command?: CommandFields } | null;
  /** The tombstone of a session removed whole by retention that held the key (task null: unknown). */
  retired: { sessionId: string; commandDigest: string; task?: string | null } | null;
  /** The supervisor's seal (every task), else the request's task's own seal (task set). */
  sealed: { generation: number; sealed_at: string; task?: string } | null;
  /** Sessions not ended (unknown ones included: they may still run). */
  liveSessions: number;
  maxSessions: number;
  reconciling: boolean;
  disk: { admits: boolean; freeBytes: number; minFreeBytes: number };
  /** The refusal of the launch's limits on this host (limits.ts limitRefusal: LIMIT_UNAVAILABLE), or null: none asked for, or all enforceable. */
  limitRefusal?: SupervisorError | null;
  /** The supervisor is stopping (SIGTERM, SIGINT): it answers a key it holds, and takes no new one. */
  stopping?: boolean;
}

export type AdmissionDecision =
  { kind: 'existing'; sessionId: string; state: SessionState | 'retired' } | { kind: 'admit' } | { kind: 'refuse'; error: SupervisorError };

/**
 * The decision, in this order: a key is forever (its session, or its tombstone, answers, also
 * while the supervisor stops: a retry is told the session it has; another command under it is
 * KEY_CONFLICT; its limits are its admission's, as its deadline is); then a stopping supervisor
 * (SHUTTING_DOWN), a limit this host cannot enforce (LIMIT_UNAVAILABLE: never run without it), a sealed admission
 * (ADMISSION_SEALED), the session bound (LIMIT_EXCEEDED), reconciliation (ADMISSION_DENIED) and
 * disk space (ADMISSION_DENIED) refuse new keys only.
 */
export function admit(request: AdmissionRequest, load: AdmissionLoad): AdmissionDecision {
  const key = request.invocationKey;
  // Names what differs when both commands are known (not for a retired session: its tombstone
  // keeps the digest only); env by names only.
  const conflict = (sessionId: string, theirs?: CommandFields, note = '', retired = false): AdmissionDecision => {
    const diff = theirs && request.command ? commandDifferences(theirs, request.command) : null;
    const named = diff
      ? `: ${diff.fields.length ? diff.fields.map((f) => (f === 'env' ? `env (${diff.envNames.join(', ')})` : f)).join(', ') : 'no field this supervisor can name'} ${diff.fields.length === 1 ? 'differs' : 'differ'}`
      : '';
    return {
      kind: 'refuse',
      error: new SupervisorError('KEY_CONFLICT', `invocation key ${JSON.stringify(key)} was used for another command by session ${sessionId}${named}${note}`, {
        invocation_key: key,
        session_id: sessionId,
        ...(diff ? { differs: diff.fields, env_names: diff.envNames } : {}),
        ...(retired ? { retired: true } : {}),
      }),
    };
  };
  if (load.existing) {
    // A session whose admission record is unreadable has no known digest: its key is
    // blocked, and a retry gets that session (unknown) rather than a conflict or a run.
    if (load.existing.commandDigest !== '' && load.existing.commandDigest !== request.commandDigest)
      return conflict(load.existing.sessionId, load.existing.command);
    // A key is in one task: the same command asked for in another task is not a retry of it.
    if (load.existing.task !== null && load.existing.task !== request.task) {
      return {
        kind: 'refuse',
        error: new SupervisorError(
          'KEY_CONFLICT',
          `invocation key ${JSON.stringify(key)} was used in task ${JSON.stringify(load.existing.task)}, not ${JSON.stringify(request.task)}`,
          {
            invocation_key: key,
            session_id: load.existing.sessionId,
            task: load.existing.task,
          },
        ),
      };
    }
    return { kind: 'existing', sessionId: load.existing.sessionId, state: load.existing.state };
  }
  if (load.retired) {
    // Keys are forever: a session removed by retention is never run again.
    if (load.retired.commandDigest !== request.commandDigest)
      return conflict(
        load.retired.sessionId,
        undefined,
        ' (removed by the retention policy: its tombstone keeps the digest only, so what differs cannot be named)',
        true,
      );
    // Its key is still in its task, as a live session's.
    const { task } = load.retired;
    if (task !== undefined && task !== null && task !== request.task) {
      return {
        kind: 'refuse',
        error: new SupervisorError(
          'KEY_CONFLICT',
          `invocation key ${JSON.stringify(key)} was used in task ${JSON.stringify(task)}, not ${JSON.stringify(request.task)}`,
          { invocation_key: key, session_id: load.retired.sessionId, task },
        ),
      };
    }
    return { kind: 'existing', sessionId: load.retired.sessionId, state: 'retired' };
  }
  if (load.stopping) return { kind: 'refuse', error: new SupervisorError('SHUTTING_DOWN', 'the supervisor is stopping') };
  if (load.limitRefusal) return { kind: 'refuse', error: load.limitRefusal };
  if (load.sealed) {
    const { generation, sealed_at, task } = load.sealed;
    if (task !== undefined) {
      return {
        kind: 'refuse',
        error: new SupervisorError('ADMISSION_SEALED', `task ${JSON.stringify(task)} was sealed at generation ${generation} (${sealed_at})`, {
          generation,
          task,
        }),
      };
    }
    return {
      kind: 'refuse',
      error: new SupervisorError('ADMISSION_SEALED', `admission was sealed at generation ${generation} (${sealed_at})`, { generation }),
    };
  }
  if (load.liveSessions >= load.maxSessions) {
    return {
      kind: 'refuse',
      error: new SupervisorError('LIMIT_EXCEEDED', `${load.liveSessions} sessions are running, the limit is ${load.maxSessions}`, {
        limit: 'sessions',
        max: load.maxSessions,
        retry_after_ms: 1000,
      }),
    };
  }
  if (load.reconciling) {
    return {
      kind: 'refuse',
      error: new SupervisorError('ADMISSION_DENIED', 'reconciling sessions left by a restart; retry shortly', { retry_after_ms: 250, reason: 'reconciling' }),
    };
  }
  if (!load.disk.admits) {
    const { freeBytes, minFreeBytes } = load.disk;
    return {
      kind: 'refuse',
      error: new SupervisorError('ADMISSION_DENIED', `disk low: ${freeBytes} bytes free in the state dir, ${minFreeBytes} needed; retry later`, {
        retry_after_ms: 5000,
        reason: 'disk_low',
        free_bytes: freeBytes,
        min_free_bytes: minFreeBytes,
      }),
    };
  }
  return { kind: 'admit' };
}

/**
 * The linger a launch runs with: the one it names, else the configured default
 * (session.defaultLinger). handoff needs a cgroup leaf to move the leftovers out of, and no
 * pty (the shim stays its session leader): where it cannot be had, a default of handoff is
 * kill, and a launch that names it is refused (INVALID_ARGUMENT, field linger).
 */
export function resolveLinger(asked: LingerPolicy | null, fallback: LingerPolicy, session: { cgroup: boolean; pty: boolean }): LingerPolicy {
  const policy = asked ?? fallback;
  if (policy !== 'handoff' || (session.cgroup && !session.pty)) return policy;
  if (asked === null) return 'kill';
  const why = session.pty
    ? 'a pty session (its exec shim stays the leader of the terminal, so its leftovers cannot be moved out)'
    : 'subreaper mode (no cgroup leaf to move the leftovers out of)';
  throw new SupervisorError('INVALID_ARGUMENT', `linger handoff is not available for ${why}: use kill or wait`, { field: 'linger' });
}

/**
 * Whether new launches are taken, and if not why, as status says it: stopping, then sealed
 * (the sandbox-wide seal), then reconciling (a restart's unknown sessions being decided), then
 * disk_low (the state dir below storage.minFreeBytes), else open.
 */
export function admissionState(load: { stopping: boolean; sealed: boolean; reconciling: boolean; diskAdmits: boolean }): StatusResult['admission'] {
  return load.stopping ? 'stopping' : load.sealed ? 'sealed' : load.reconciling ? 'reconciling' : load.diskAdmits ? 'open' : 'disk_low';
}
