// Where complete(task) is decided (docs/reference/contract.md "Workspaces, checkpoints and tasks";
// docs/guide/tasks.md "Tasks: complete(task)"): a pure function from the durable facts a close gathered to
// the verdict: each condition, and the obligations that name which authority must settle which missing fact.
// No I/O, no clock: the same facts give the same verdict, so a close re-run after a crash answers as the
// first would have (test/unit/core/task/join.test.ts).
import type { Receipt, TaskCheckpointEntry, TaskConditions, TaskObligation } from '../../ipc/protocol.js';

/** A session of the task as the join sees it. */
export interface JoinSession {
  sessionId: string;
  /** Its state, or retired: removed whole by the retention policy (only its tombstone is left). */
  state: string;
  receipt: Receipt | null;
  /** Why it is unknown (its summary's reason), when it is. */
  unknownReason: string | null;
  /** Unknown while its receipt, its evidence in hand, waits to be written (the state dir's disk full): not an operator's to resolve. */
  receiptPending?: boolean;
  /** The uid it ran as (its receipt's, else its admission's; null: not recorded). */
  uid?: number | null;
  /** An operator's word that the processes its receipt says left its cgroup (death evidence cgroup_escaped) are gone (sbx resolve). */
  escapeAttested?: boolean;
}

/** A workspace of the close: its path and the watched workspace holding it (null: not watched). */
export interface JoinWorkspace {
  path: string;
  root: string | null;
}

/**
 * The durable facts a close gathered: the task's seal, each session's receipt or why it has none, each
 * workspace's checkpoint or why it has none, the runtime fence.
 */
export interface JoinFacts {
  sealed: boolean;
  sessions: JoinSession[];
  workspaces: JoinWorkspace[];
  /** One per workspace, in the same order. */
  checkpoints: TaskCheckpointEntry[];
  /** The generation the task was sealed at (a checkpoint from before it is not this close's). */
  sealGeneration: number | null;
  /** This supervisor run. */
  fence: { instance: string; generation: number; boot_id: string };
  /** What supervisor.json names now (null: unreadable): another generation there means this run no longer owns the state dir. */
  fenceOnDisk: { instance: string; generation: number } | null;
}

export interface JoinVerdict {
  complete: boolean;
  conditions: TaskConditions;
  obligations: TaskObligation[];
  /** The sessions that ran as root: a note (their proof rests on root not interfering); undefined when none did. */
  trust?: { root_sessions: string[]; reason: string };
}

/** Why a root session's death proof is weaker: said in every task receipt that has one. */
export const ROOT_TRUST_REASON =
  'their death proof rests on root not interfering: a root process can leave its cgroup, signal or trace any process; run one non-root uid per task for isolation';

/** The trust note of a join: the sessions that ran as uid 0, and whose escape watch was unavailable. */
export function trustNote(sessions: readonly JoinSession[]): JoinVerdict['trust'] {
  const root = sessions.filter((s) => s.uid === 0);
  if (root.length === 0) return undefined;
  const unwatched = root.filter((s) => s.receipt?.death?.escape_watch === 'unavailable').map((s) => s.sessionId);
  const reason = unwatched.length ? `${ROOT_TRUST_REASON}; escape detection was unavailable for ${unwatched.join(', ')}` : ROOT_TRUST_REASON;
  return { root_sessions: root.map((s) => s.sessionId).sort(), reason };
}

/** Death evidence that proves the end (operator_attested is an operator's word, shown as such in the task receipt). */
const DEATH_EVIDENCE = new Set(['cgroup_empty', 'subreaper_reaped', 'boot_changed', 'operator_attested']);

/** The session's workspace entry for a watched root, if its receipt has one. */
function entryFor(receipt: Receipt, root: string) {
  return receipt.workspace?.find((e) => e.path === root) ?? null;
}

/** Whether the session's end in this workspace is known: its barrier's sequence, or a gap with the scan that stands in. */
export function terminalMutationKnown(receipt: Receipt, root: string): boolean {
  const e = entryFor(receipt, root);
  return e !== null && (e.terminal_mutation !== null || (e.gap !== null && e.scan !== null));
}

/**
 * Whether a checkpoint covers a session's writes in a workspace: in the same listener epoch,
 * its boundary's sequence is at or past the session's terminal_mutation (every write of the
 * session is ordered before the barrier, so the capture that followed saw it). Otherwise
 * (another epoch, a gap on either side) by order of the two facts: the checkpoint's run came
 * after the run that wrote the receipt, or in the same run it started after the session ended.
 */
export function checkpointCovers(cp: TaskCheckpointEntry, receipt: Receipt, root: string): boolean {
  const e = entryFor(receipt, root);
  if (!e || !cp.boundary || !cp.fence || !cp.started_at) return false;
  if (e.terminal_mutation !== null && cp.boundary.seq !== null && e.epoch === cp.boundary.epoch) return cp.boundary.seq >= e.terminal_mutation;
  return takenAfterEnd(cp, receipt);
}

/** Whether a published checkpoint was taken after the session ended: by a later supervisor run, or in the same run started at or after its ended_at. */
function takenAfterEnd(cp: TaskCheckpointEntry, receipt: Receipt): boolean {
  if (cp.checkpoint_id === null || !cp.fence || !cp.started_at) return false;
  const receiptGeneration = receipt.supervisor.generation;
  if (cp.fence.generation !== receiptGeneration) return cp.fence.generation > receiptGeneration;
  return Date.parse(cp.started_at) >= Date.parse(receipt.ended_at);
}

/**
 * Whether a session whose receipt has no entry for a watched root (the workspace was not
 * watched while it ran: a receipt lists every workspace watched then) is ordered before the
 * checkpoint anyway: its death is proven (no process of it is left to write once the watch
 * began) and the checkpoint was taken after it ended (takenAfterEnd, the cross-epoch rule).
 */
export function endedBeforeWatch(cp: TaskCheckpointEntry | undefined, s: JoinSession, root: string): boolean {
  const r = s.receipt;
  if (!r || !cp || entryFor(r, root) !== null) return false;
  const proven = r.death ? DEATH_EVIDENCE.has(r.death.evidence) || (r.death.evidence === 'cgroup_escaped' && s.escapeAttested === true) : false;
  return proven && takenAfterEnd(cp, r);
}

/** Whether the checkpoint orders every write of the session in the watched root: by its terminal_mutation (checkpointCovers), or it ended before the root was watched (endedBeforeWatch). */
export function sessionCovered(cp: TaskCheckpointEntry, s: JoinSession, root: string): boolean {
  if (!s.receipt) return false;
  return terminalMutationKnown(s.receipt, root) ? checkpointCovers(cp, s.receipt, root) : endedBeforeWatch(cp, s, root);
}

/**
 * The generation no checkpoint of the close may be older than: the seal's. A seal from above
 * this run's generation was written by another instance (supervisor.json was lost, and the
 * generation recovered lower): its number says nothing of this run's, so this run's own.
 */
export function sealFloor(sealGeneration: number | null, fence: { generation: number }): number | null {
  return sealGeneration !== null && sealGeneration > fence.generation ? fence.generation : sealGeneration;
}

/**
 * Whether a session's receipt says it may have written in a workspace: events were
 * attributed to it or went unclaimed while it ran, or a gap hides what happened there. A
 * receipt lists every workspace watched while the session ran; one it did not touch needs no
 * checkpoint of this task.
 */
export function receiptTouched(e: NonNullable<Receipt['workspace']>[number]): boolean {
  return e.attributed.events > 0 || e.unattributed_events > 0 || e.gap !== null;
}

/**
 * The workspaces the task's own receipts name (touched: receiptTouched) that the close's set
 * does not cover (no workspace of the close is in them), split by whether this supervisor
 * watches them now: those it watches join the close's set (close.ts records them, so later
 * closes stay consistent); the others are obligations (evaluateTask), a checkpoint of an
 * unwatched tree proving no order.
 */
export function receiptWorkspaces(
  sessions: JoinSession[],
  workspaces: JoinWorkspace[],
  watched: string[],
): { include: string[]; unwatched: { root: string; sessionIds: string[] }[] } {
  const covered = new Set(workspaces.map((w) => w.root).filter((r): r is string => r !== null));
  const named = new Map<string, string[]>();
  for (const s of sessions) {
    for (const e of s.receipt?.workspace ?? []) {
      if (covered.has(e.path) || !receiptTouched(e)) continue;
      const ids = named.get(e.path) ?? [];
      if (!ids.includes(s.sessionId)) ids.push(s.sessionId);
      named.set(e.path, ids);
    }
  }
  const roots = [...named.keys()].sort();
  return {
    include: roots.filter((r) => watched.includes(r)),
    unwatched: roots.filter((r) => !watched.includes(r)).map((root) => ({ root, sessionIds: named.get(root)!.sort() })),
  };
}

/**
 * The verdict over the facts:
 *
 *   complete(task) = sealed
 *     AND every session has (death proof, final output cursor, terminal_mutation)
 *     AND the checkpoint covers the final scan boundary (>= every terminal_mutation)
 *     AND the manifest reads back exactly AND the checkpoint carries the runtime fence
 *
 * A condition is true only when its fact is established. One missing fact is named once: a
 * session without a receipt is one obligation (sessions_settled), though its terminal
 * mutations and the checkpoint that waits for it are unknown too.
 */
export function evaluateTask(f: JoinFacts): JoinVerdict {
  const obligations: TaskObligation[] = [];
  const c: TaskConditions = {
    sealed: f.sealed,
    sessions_settled: true,
    terminal_mutations_known: true,
    checkpoint_covers: true,
    read_back_exact: true,
    fenced: true,
  };
  if (!f.sealed) obligations.push({ authority: 'operator', condition: 'sealed', what: 'the task is not sealed' });

  // Sessions: a receipt with death evidence and a final cursor per stream.
  const ended: { id: string; receipt: Receipt; session: JoinSession }[] = [];
  for (const s of f.sessions) {
    const r = s.receipt;
    if (!r) {
      c.sessions_settled = false;
      c.terminal_mutations_known = false;
      if (s.state === 'retired') {
        obligations.push({
          authority: 'operator',
          condition: 'sessions_settled',
          session_id: s.sessionId,
          what: `session ${s.sessionId} was removed whole by the retention policy before the task closed: its receipt's facts (death proof, final cursors, terminal_mutation) are gone, so this task cannot be shown complete (close tasks before retention.receiptMaxAgeMs)`,
        });
      } else if (s.state === 'unknown' && s.receiptPending) {
        obligations.push({
          authority: 'operator',
          condition: 'sessions_settled',
          session_id: s.sessionId,
          what: `session ${s.sessionId} ended, and its receipt waits to be written${s.unknownReason ? ` (${s.unknownReason})` : ''}: free space in the state dir, then close again`,
        });
      } else if (s.state === 'unknown') {
        obligations.push({
          authority: 'operator',
          condition: 'sessions_settled',
          session_id: s.sessionId,
          what: `session ${s.sessionId} is unknown${s.unknownReason ? ` (${s.unknownReason})` : ''}: no proof it ended; once you know it did, sbx resolve ${s.sessionId} --as-operator --reason TEXT`,
        });
      } else {
        obligations.push({ authority: 'session', condition: 'sessions_settled', session_id: s.sessionId, what: `session ${s.sessionId} is still ${s.state}` });
      }
      continue;
    }
    if (r.death?.evidence === 'cgroup_escaped') {
      // Counted on an operator's word only (shown in the task receipt: death.escape_attested).
      if (!s.escapeAttested) {
        c.sessions_settled = false;
        const where = (r.death.escapes ?? []).map(
          (e) =>
            `${e.kind === 'escape_possible' ? 'possibly ' : ''}to ${e.to ?? 'a cgroup since removed'}${e.writer_pid !== null ? ` by pid ${e.writer_pid}` : ''}`,
        );
        obligations.push({
          authority: 'operator',
          condition: 'sessions_settled',
          session_id: s.sessionId,
          what: `session ${s.sessionId}'s processes were moved out of its cgroup before it emptied (${where.join('; ') || 'destination not recorded'}): its empty cgroup proves nothing for them; once they are ended, sbx resolve ${s.sessionId} --as-operator --reason TEXT`,
        });
      }
    } else if (!r.death || !DEATH_EVIDENCE.has(r.death.evidence)) {
      c.sessions_settled = false;
      obligations.push({
        authority: 'session',
        condition: 'sessions_settled',
        session_id: s.sessionId,
        what: `session ${s.sessionId}'s receipt has no death evidence`,
      });
    }
    const streams = Object.entries(r.output ?? {});
    if (streams.length === 0 || streams.some(([, o]) => !o || !Number.isSafeInteger(o.final_cursor) || o.final_cursor < 0)) {
      c.sessions_settled = false;
      obligations.push({
        authority: 'session',
        condition: 'sessions_settled',
        session_id: s.sessionId,
        what: `session ${s.sessionId}'s receipt has no final output cursor`,
      });
    }
    ended.push({ id: s.sessionId, receipt: r, session: s });
  }
  const waiting = ended.length < f.sessions.length;

  // Terminal mutations, per session and workspace of the close.
  for (const w of f.workspaces) {
    if (w.root === null) {
      if (f.sessions.length === 0) continue;
      c.terminal_mutations_known = false;
      obligations.push({
        authority: 'workspace',
        condition: 'terminal_mutations_known',
        workspace: w.path,
        what: `${w.path} is not a watched workspace: no session's writes there are ordered (add it to workspace.paths or serve --workspace, and run the task there)`,
      });
      continue;
    }
    const cp = f.checkpoints[f.workspaces.indexOf(w)];
    for (const s of ended) {
      if (terminalMutationKnown(s.receipt, w.root)) continue;
      // Not watched while it ran, and ended before this checkpoint: nothing of it to order.
      if (endedBeforeWatch(cp, s.session, w.root)) continue;
      c.terminal_mutations_known = false;
      const e = entryFor(s.receipt, w.root);
      obligations.push({
        authority: 'workspace',
        condition: 'terminal_mutations_known',
        session_id: s.id,
        workspace: w.path,
        what: e
          ? `session ${s.id}'s end in ${w.root} is unknown: the watcher had a gap (${e.gap}) and the scan that stands in failed`
          : `session ${s.id}'s receipt has no entry for ${w.root} (the workspace was not watched while it ran), and ${cp?.checkpoint_id ? `checkpoint ${cp.checkpoint_id} cannot be shown to come after its proven end` : 'no checkpoint was taken after its end'}`,
      });
    }
  }

  // A workspace the task's receipts name (the session wrote there) that no workspace of the
  // close covers: no checkpoint of the close holds those writes (close.ts adds the watched
  // ones to its set, so what is left here is not watched now).
  for (const { root, sessionIds } of receiptWorkspaces(f.sessions, f.workspaces, []).unwatched) {
    for (const id of sessionIds) {
      c.checkpoint_covers = false;
      obligations.push({
        authority: 'workspace',
        condition: 'checkpoint_covers',
        session_id: id,
        workspace: root,
        what: `workspace ${root} is named by session ${id}'s receipt (it may have written there) but is not a workspace of this close, nor watched by this supervisor: no checkpoint orders those writes (watch it again, workspace.paths or serve --workspace, and close again)`,
      });
    }
  }

  // Checkpoints: published, read back, consistent, past every terminal mutation, fenced.
  f.workspaces.forEach((w, i) => {
    const cp = f.checkpoints[i];
    if (!cp || cp.checkpoint_id === null) {
      c.checkpoint_covers = false;
      c.read_back_exact = false;
      c.fenced = false;
      const err = cp?.error ?? null;
      if (err && err.stage === 'read_back') {
        obligations.push({
          authority: 'workspace',
          condition: 'read_back_exact',
          workspace: w.path,
          what: `the checkpoint of ${w.path} did not read back exactly: ${err.message}; close again to take a new one`,
        });
      } else if (err) {
        obligations.push({
          authority: 'workspace',
          condition: 'checkpoint_covers',
          workspace: w.path,
          what: `the checkpoint of ${w.path} failed (${err.code}${err.stage ? `, ${err.stage}` : ''}): ${err.message}; close again to retry`,
        });
      } else if (!waiting) {
        obligations.push({ authority: 'workspace', condition: 'checkpoint_covers', workspace: w.path, what: `no checkpoint of ${w.path} was taken` });
      }
      // waiting: not taken while a session has no receipt (it may still write); that session's obligation says so.
      return;
    }
    if (!cp.read_back?.exact) {
      c.read_back_exact = false;
      obligations.push({
        authority: 'workspace',
        condition: 'read_back_exact',
        workspace: w.path,
        what: `checkpoint ${cp.checkpoint_id} of ${w.path} has no exact read-back`,
      });
    }
    if (cp.consistent !== true) {
      c.checkpoint_covers = false;
      // A leased path never changed: a lease kept it shut, so it was not captured.
      const leased = new Set(cp.leased ?? []);
      const leasedCount = cp.leased_count ?? 0;
      const changed = cp.unstable.filter((p) => !leased.has(p));
      const changedCount = cp.unstable_count - leasedCount;
      const some = (k: number) => `${k} ${k === 1 ? 'path' : 'paths'} of ${w.path}`;
      const list = (k: number, shown: string[]) => `(${shown.slice(0, 3).join(', ')}${k > 3 ? ', ...' : ''})`;
      if (changedCount > 0 || leasedCount === 0) {
        obligations.push({
          authority: 'workspace',
          condition: 'checkpoint_covers',
          workspace: w.path,
          what: `${some(changedCount)} changed in every pass of checkpoint ${cp.checkpoint_id} ${list(changedCount, changed)}: stop what writes them and close again`,
        });
      }
      if (leasedCount > 0) {
        obligations.push({
          authority: 'workspace',
          condition: 'checkpoint_covers',
          workspace: w.path,
          what: `${some(leasedCount)} held by another process's write lease in checkpoint ${cp.checkpoint_id}: not captured ${list(leasedCount, [...leased])}; end what holds the lease (fcntl F_SETLEASE) and close again`,
        });
      }
    }
    if (w.root !== null) {
      for (const s of ended) {
        if (!terminalMutationKnown(s.receipt, w.root) || checkpointCovers(cp, s.receipt, w.root)) continue;
        c.checkpoint_covers = false;
        const e = entryFor(s.receipt, w.root)!;
        const b = cp.boundary;
        obligations.push({
          authority: 'workspace',
          condition: 'checkpoint_covers',
          session_id: s.id,
          workspace: w.path,
          what: `checkpoint ${cp.checkpoint_id} of ${w.path} (boundary ${b?.epoch ?? '-'} seq ${b?.seq ?? b?.gap ?? '-'}) is older than session ${s.id}'s terminal_mutation (${e.epoch} seq ${e.terminal_mutation ?? `${e.gap}, scan at its end`}); close again to take one after it`,
        });
      }
    }
    const fe = cp.fence;
    const floor = sealFloor(f.sealGeneration, f.fence);
    const fenceProblem = !fe
      ? 'carries no runtime fence'
      : fe.instance !== f.fence.instance
        ? `was taken by supervisor instance ${fe.instance}, not this state dir's ${f.fence.instance}`
        : fe.generation > f.fence.generation
          ? `carries generation ${fe.generation}, newer than this supervisor's ${f.fence.generation}`
          : floor !== null && fe.generation < floor
            ? floor === f.sealGeneration
              ? `carries generation ${fe.generation}, from before the task was sealed (generation ${f.sealGeneration})`
              : `carries generation ${fe.generation}, from before this run (generation ${floor}; the task was sealed at generation ${f.sealGeneration} by another instance)`
            : null;
    if (fenceProblem) {
      c.fenced = false;
      obligations.push({ authority: 'operator', condition: 'fenced', workspace: w.path, what: `checkpoint ${cp.checkpoint_id} of ${w.path} ${fenceProblem}` });
    }
  });
  if (!f.fenceOnDisk || f.fenceOnDisk.instance !== f.fence.instance || f.fenceOnDisk.generation !== f.fence.generation) {
    c.fenced = false;
    obligations.push({
      authority: 'operator',
      condition: 'fenced',
      what: f.fenceOnDisk
        ? `supervisor.json names instance ${f.fenceOnDisk.instance} generation ${f.fenceOnDisk.generation}, not this run (${f.fence.instance} generation ${f.fence.generation}): another supervisor took the state dir`
        : 'supervisor.json cannot be read: this run cannot show it still owns the state dir',
    });
  }
  const complete = Object.values(c).every(Boolean);
  const trust = trustNote(f.sessions);
  return { complete, conditions: c, obligations, ...(trust ? { trust } : {}) };
}
