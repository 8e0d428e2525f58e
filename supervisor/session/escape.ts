// The cgroup escape watch (docs/guide/escapes.md): a root process can move a pid out of its session's leaf
// (another cgroup's cgroup.procs), and `populated 0` then proves nothing about it. One fanotify group marks
// cgroup2 for writes; each escaping write is kept for its session's receipt, and at each death a walk of our
// live descendants proves it independently of events. Owns the group, its timer and the tracked leaves.
import { closeSync, constants, existsSync, openSync, readdirSync, readFileSync, statSync } from 'node:fs';
import type { Logger } from 'pino';
import type { CgroupEscape } from '../../ipc/protocol.js';
import { native } from '../../core/fs/native.js';
import { systemError } from '../../ipc/errno.js';
import { testHooks } from '../../core/test-hooks.js';

/** How often queued writes are read while sessions are tracked (a read of an empty queue is one syscall). */
const POLL_MS = 50;
/** How long after the first read at a root session's death the queue is read again. */
const SETTLE_AGAIN_MS = 1;
/** fanotify's queue overflow event (FAN_Q_OVERFLOW): writes were lost. */
const FAN_Q_OVERFLOW = 0x4000;
/** How far up /proc's PPid chain a writer is followed (a longer chain is unattributable: possible, never none). */
const MAX_ANCESTRY = 1024;
/** The walk at a death: repeated until two walks in a row find nothing new, at most this many times. */
const WALK_ROUNDS_MAX = 6;
/** A receipt lists at most this many escapes, each destination cut at PATH_BYTES_MAX (the receipt's reserved space counts them: ESCAPES_RESERVE_BYTES). */
export const ESCAPES_MAX = 8;
const PATH_BYTES_MAX = 1024;
/** Room the receipt's escapes may take, reserved at admission. */
export const ESCAPES_RESERVE_BYTES = ESCAPES_MAX * (2 * PATH_BYTES_MAX + 160);

/** A session as the watch attributes writes to it. */
export interface TrackedLeaf {
  id: string;
  /** Its leaf (absolute path under the cgroup2 mount) and that directory's inode (the cgroup id). */
  leafPath: string;
  leafIno: bigint;
  /** The exec shim's pid: the supervisor's child, the leader (or, with a pty, the leader's parent). */
  shimPid: number;
  uid: number;
  /** The shim's start (/proc/<pid>/stat starttime, clock ticks since boot); 0 when unread (every stray counts). */
  startTicks: number;
}

/** Whose write it was: nobody's we run; a session's (an escape unless it stayed in its leaf); or maybe ours, unattributable. */
export type Attribution = { kind: 'none' } | { kind: 'session'; id: string } | { kind: 'possible' };

/**
 * Who wrote: the shim itself (it joins its leaf by cgroup.procs); else, while the writer lives,
 * its PPid chain (ancestry, writer first): a session's processes stay below the shim, the
 * supervisor being their subreaper; reaching the supervisor through no shim (an orphan) is
 * ours: the session whose leaf it is still in, else unattributable; not reaching it is not ours. A writer gone before the read: its
 * cgroup at the read if that is a leaf (0n: none), else unattributable.
 */
export function attributeWrite(
  w: { pid: number; cgroupId: bigint; ancestry: number[] | null; truncated?: boolean },
  sessions: readonly TrackedLeaf[],
  selfPid: number,
): Attribution {
  const byShim = sessions.find((s) => s.shimPid === w.pid);
  if (byShim) return { kind: 'session', id: byShim.id };
  const byCgroup = w.cgroupId !== 0n ? sessions.find((s) => s.leafIno === w.cgroupId) : undefined;
  if (w.ancestry) {
    const at = w.ancestry.indexOf(selfPid);
    // A chain cut at MAX_ANCESTRY may go on to us: its leaf's if it is in one, else possible.
    if (at < 0 && w.truncated) return byCgroup ? { kind: 'session', id: byCgroup.id } : { kind: 'possible' };
    if (at < 0) return { kind: 'none' };
    const top = at > 0 ? w.ancestry[at - 1] : -1;
    const s = (top >= 0 ? sessions.find((x) => x.shimPid === top) : undefined) ?? byCgroup;
    return s ? { kind: 'session', id: s.id } : { kind: 'possible' };
  }
  return byCgroup ? { kind: 'session', id: byCgroup.id } : { kind: 'possible' };
}

/** Whether dest (a cgroup directory) is the leaf or below it: a move that stays in the session. */
export function withinLeaf(dest: string | null, leafPath: string): boolean {
  return dest !== null && (dest === leafPath || dest.startsWith(leafPath + '/'));
}

/** The writer's PPid chain from /proc (writer first), up to this process or pid 1 (truncated: cut at MAX_ANCESTRY); null when the writer is gone. */
export function ancestry(pid: number, selfPid = process.pid): { chain: number[]; truncated: boolean } | null {
  const chain: number[] = [];
  for (let p = pid; p > 0;) {
    if (chain.length >= MAX_ANCESTRY) return { chain, truncated: true };
    chain.push(p);
    if (p === 1 || p === selfPid) break;
    let status: string;
    try {
      status = readFileSync(`/proc/${p}/status`, 'latin1');
    } catch {
      return null;
    }
    p = Number(/^PPid:\s*(\d+)/m.exec(status)?.[1] ?? 0);
  }
  return { chain, truncated: false };
}

/** A live descendant as the walk saw it: its parent in the walk, its cgroup (absolute; null: unread) and start (clock ticks since boot). */
export interface ProcNode {
  pid: number;
  parent: number;
  cgroup: string | null;
  startTicks: number;
}

/** A process's state, threads and start from /proc/<pid>/stat (fields 3, 20 and 22); null when gone. */
function procStat(pid: number): { state: string; threads: number; startTicks: number } | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'latin1');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return { state: f[0]!, threads: Number(f[17]), startTicks: Number(f[19]) };
  } catch {
    return null;
  }
}

/** Clock ticks since boot at which pid started (/proc/<pid>/stat field 22); 0 when unreadable. */
export function startTicksOf(pid: number): number {
  return procStat(pid)?.startTicks ?? 0;
}

/**
 * Every live (not zombie) descendant of root, parents first: each thread's
 * /proc/<pid>/task/<tid>/children (proc(5)), recursively, and each one's cgroup2 path
 * (the "0::" line of /proc/<pid>/cgroup, under mountPoint).
 */
export function walkDescendants(root: number, mountPoint: string): ProcNode[] {
  const out: ProcNode[] = [];
  const seen = new Set<number>([root]);
  const queue: { pid: number; threads: number }[] = [{ pid: root, threads: 0 }];
  // Breadth first by index (shift() would copy the queue at every step: quadratic in descendants).
  for (let next = 0; next < queue.length; next++) {
    const { pid: parent, threads } = queue[next]!;
    let tids: string[];
    try {
      // One thread: its own task only (a thread made since is read by the next walk).
      tids = threads === 1 ? [String(parent)] : readdirSync(`/proc/${parent}/task`);
    } catch {
      continue; // gone
    }
    for (const tid of tids) {
      let children: string;
      try {
        children = readFileSync(`/proc/${parent}/task/${tid}/children`, 'latin1');
      } catch {
        continue;
      }
      for (const word of children.split(' ')) {
        const pid = Number(word);
        if (!word || seen.has(pid)) continue;
        seen.add(pid);
        const st = procStat(pid);
        if (!st || st.state === 'Z' || st.state === 'X') continue;
        let cgroup: string | null = null;
        try {
          const rel = /^0::(.*)$/m.exec(readFileSync(`/proc/${pid}/cgroup`, 'latin1'))?.[1];
          if (rel !== undefined) cgroup = rel === '/' ? mountPoint : mountPoint + rel;
        } catch {
          continue; // gone
        }
        out.push({ pid, parent, cgroup, startTicks: st.startTicks });
        queue.push({ pid, threads: st.threads });
      }
    }
  }
  return out;
}

/** A process of ours in no live session's leaf, and the session it is below (its nearest ancestor in a leaf, or a leader), if any. */
export interface Stray {
  pid: number;
  cgroup: string | null;
  startTicks: number;
  owner: string | null;
}

/** How many destinations (and writers) the watch remembers (EscapeWatch.named). */
const NAMED_MAX = 1024;

/** Sets key in a map kept to its last NAMED_MAX insertions. */
function remember(map: Map<string, string>, key: string, value: string): void {
  map.delete(key);
  map.set(key, value);
  if (map.size > NAMED_MAX) map.delete(map.keys().next().value!);
}

/** The strays of a walk: a descendant in no tracked leaf (the leaf or below it) that is no session's leader (its session handles it). */
export function findStrays(nodes: readonly ProcNode[], sessions: readonly TrackedLeaf[]): Stray[] {
  const byPid = new Map(nodes.map((n) => [n.pid, n]));
  // Indexed, not searched per node: a walk at 1,000 live sessions has ~4,000 nodes (a search
  // per node was 4M path comparisons a walk, several walks per death: the event loop held for
  // seconds). Session leaves are siblings, so at most one holds a cgroup.
  const byLeaf = new Map<string, TrackedLeaf>();
  const byShim = new Map<number, TrackedLeaf>();
  for (const s of sessions) {
    if (!byLeaf.has(s.leafPath)) byLeaf.set(s.leafPath, s);
    if (s.shimPid >= 0 && !byShim.has(s.shimPid)) byShim.set(s.shimPid, s);
  }
  /** The tracked leaf cgroup is in (withinLeaf: the leaf or below it): the cgroup and each of its parents looked up. */
  const leafHolding = (cgroup: string | null): TrackedLeaf | undefined => {
    if (cgroup === null) return undefined;
    for (let path = cgroup; path.length > 0; path = path.slice(0, Math.max(0, path.lastIndexOf('/')))) {
      const s = byLeaf.get(path);
      if (s) return s;
    }
    return undefined;
  };
  const leafOf = (n: ProcNode) => leafHolding(n.cgroup) ?? byShim.get(n.pid);
  const strays: Stray[] = [];
  for (const n of nodes) {
    if (byShim.has(n.pid) || leafHolding(n.cgroup) !== undefined) continue;
    let owner: string | null = null;
    for (let a = byPid.get(n.parent); a; a = byPid.get(a.parent)) {
      const s = leafOf(a);
      if (s) {
        owner = s.id;
        break;
      }
    }
    strays.push({ pid: n.pid, cgroup: n.cgroup, startTicks: n.startTicks, owner });
  }
  return strays;
}

/** Records one more escape of a session: the same (kind, destination, writer) once, at most ESCAPES_MAX, each destination at most PATH_BYTES_MAX. */
export function recordEscape(list: CgroupEscape[], e: CgroupEscape): void {
  const to = e.to !== null && e.to.length > PATH_BYTES_MAX ? e.to.slice(0, PATH_BYTES_MAX) : e.to;
  if (list.length >= ESCAPES_MAX || list.some((x) => x.kind === e.kind && x.to === to && x.writer_pid === e.writer_pid)) return;
  list.push({ ...e, to });
}

/** What an escaped receipt names that still runs: each destination cgroup still populated (its pids), each stray's pid still alive there. */
export function stillEscaped(escapes: readonly CgroupEscape[]): string[] {
  const live: string[] = [];
  for (const e of escapes) {
    if (e.to === null) continue;
    let procs: string;
    try {
      procs = readFileSync(`${e.to}/cgroup.procs`, 'latin1');
    } catch {
      continue; // the cgroup is gone: nothing can be in it
    }
    const pids = procs.split('\n').filter(Boolean);
    if (pids.length > 0) live.push(`${e.to} holds pid${pids.length > 1 ? 's' : ''} ${pids.slice(0, 8).join(', ')}${pids.length > 8 ? ', ...' : ''}`);
  }
  return [...new Set(live)];
}

/** What a session's receipt says of the watch: on (escapes, possibly none) or unavailable (why). */
export interface EscapeReport {
  watch: 'fanotify' | 'unavailable';
  escapes: CgroupEscape[];
}

/**
 * The supervisor-wide watch: track() a session at its start, settle() it at its death. One fanotify group
 * marks cgroup2 for writes (native watchMarkWrites); each write to a cgroup.procs/cgroup.threads is
 * attributed to a session and, if it left the leaf, kept for its receipt. At each death a walk of the
 * supervisor's live descendants proves it independently of events (strays: a process in no live leaf).
 */
export class EscapeWatch {
  private readonly tracked = new Map<string, TrackedLeaf & { escapes: CgroupEscape[] }>();
  /** Leaves of sessions forgotten without proof (unknown), while they stand: their processes are theirs, not strays. */
  private readonly unproven = new Map<string, string>();
  private timer: NodeJS.Timeout | null = null;
  /**
   * Destinations the watch saw sessions' writes move processes to (path -> session), and
   * `<writer pid>:<path>` -> session, the last NAMED_MAX of each: a stray a walk finds there
   * is explained by that session (its writer moved itself), or at most possibly the dying
   * session's (it could have cloned into it: no write), never a definite stray of another.
   */
  private readonly named = new Map<string, string>();
  private readonly namedWriters = new Map<string, string>();

  private constructor(
    private readonly fd: number,
    private readonly mountFd: number,
    /** Why the watch is off (null: on). */
    readonly unavailable: string | null,
    private readonly log: Logger,
    /** The cgroup2 mount the walk resolves /proc/<pid>/cgroup under (null: no cgroups, no walk). */
    private readonly mountPoint: string | null,
    private readonly selfPid = process.pid,
  ) {}

  /** A watch on the cgroup2 mount (null: no cgroups); unavailable, with the reason, where fanotify refuses it. */
  static open(mountPoint: string | null, log: Logger): EscapeWatch {
    if (!mountPoint) return new EscapeWatch(-1, -1, 'no cgroup2 mount (subreaper mode)', log, null);
    // Tests: the receipts of a supervisor without the watch.
    if (testHooks.escapeWatchOff) return new EscapeWatch(-1, -1, 'turned off (SBX_TEST_ESCAPE_WATCH_OFF)', log, mountPoint);
    let fd = -1;
    try {
      // A bounded queue (16384 events): between sessions nothing reads it, and an overflow
      // while sessions run is charged to the root ones (escape_possible), never lost silently.
      fd = native().watchInit(false);
      native().watchMarkWrites(fd, mountPoint);
      const mountFd = openSync(mountPoint, constants.O_RDONLY | constants.O_DIRECTORY);
      return new EscapeWatch(fd, mountFd, null, log, mountPoint);
    } catch (err) {
      if (fd >= 0) closeSync(fd);
      const e = systemError(err);
      log.warn({ code: e.code, mount: mountPoint }, 'cgroup escape watch unavailable: receipts say so');
      return new EscapeWatch(-1, -1, `${e.code ?? 'error'}: ${e.message}`, log, mountPoint);
    }
  }

  /**
   * Right before a session's spawn: what is queued now is written by none of its processes.
   * With no session tracked it is stale (theirs are reported already): dropped; else it is
   * attributed to the sessions tracked. Not in track(): a loaded machine runs the new command
   * (its first write to a cgroup.procs included) before the spawn's caller reaches track(),
   * and that write was dropped as stale.
   */
  beforeSpawn(): void {
    if (this.mountPoint === null || this.fd < 0) return;
    if (this.tracked.size === 0) this.read(true);
    else this.poll();
  }

  /**
   * Starts attributing writes to a session (after its spawn; beforeSpawn() read what came
   * before it). Writes queued since are read with it tracked.
   * A service of leftovers (no shim of its own: shimPid -1) names the session they came from
   * (`from`, still tracked at the hand-off): it starts when that one did, so a stray that started
   * before that is not charged to it.
   */
  track(id: string, leafPath: string, shimPid: number, uid: number, from?: string): void {
    if (this.mountPoint === null) return;
    // The session's first process: nothing started before it is below it (the shim is our unreaped child here).
    const startTicks = from !== undefined ? (this.tracked.get(from)?.startTicks ?? startTicksOf(process.pid)) : startTicksOf(shimPid);
    let leafIno = 0n;
    try {
      leafIno = statSync(leafPath, { bigint: true }).ino;
    } catch {
      // A leaf gone at once: its cgroup id is unknown (the shim's pid still attributes).
    }
    this.tracked.set(id, { id, leafPath, leafIno, shimPid, uid, startTicks, escapes: [] });
    this.poll();
    if (this.fd >= 0) this.timer ??= setInterval(() => this.poll(), POLL_MS).unref();
  }

  /**
   * The session's shim was reaped: its pid is free for any process to take (pid_max wraps; a
   * root process can even ask for one through ns_last_pid). What it wrote is queued already and
   * is read now, attributed by that pid; from here on the pid names nobody of the session, so a
   * later writer with it is attributed by its ancestry and cgroup, and a walk does not take it
   * for the session's leader.
   */
  shimReaped(id: string): void {
    const t = this.tracked.get(id);
    if (!t || t.shimPid < 0) return;
    this.poll();
    t.shimPid = -1;
  }

  /**
   * Reads every write queued until now (the session's last ones included), then its report; it
   * is no longer tracked. A write that empties the leaf (the last process moved out) is queued
   * only when that write(2) returns, after the leaf said populated 0: for a root session the
   * queue is read once more after SETTLE_AGAIN_MS. Then, whatever the events said, the
   * positive check: the walk of our descendants (walkStrays).
   */
  async settle(id: string): Promise<EscapeReport> {
    if (!this.tracked.has(id)) return { watch: 'unavailable', escapes: [] };
    this.poll();
    if (this.fd >= 0 && this.tracked.get(id)?.uid === 0) {
      await new Promise((r) => setTimeout(r, SETTLE_AGAIN_MS));
      this.poll();
    }
    // Strays that are still moving (a fork, a move under way) are found by a next walk.
    for (let round = 0, quiet = 0; round < WALK_ROUNDS_MAX && quiet < 2; round++) {
      quiet = this.walkStrays(id) ? 0 : quiet + 1;
      if (quiet < 2) await new Promise((r) => setImmediate(r));
    }
    this.poll();
    const t = this.tracked.get(id);
    this.drop(id);
    return { watch: this.fd >= 0 ? 'fanotify' : 'unavailable', escapes: t?.escapes ?? [] };
  }

  /**
   * The positive check at a death (the leaf is empty): every live descendant of the
   * supervisor in no live leaf is a stray. Below a live session (an ancestor in its leaf, or
   * its leader): that session's escape. Else, started at or after the dying session: charged
   * to it, kind stray (escape_possible when another live session started before it too).
   * Whether it recorded something new.
   */
  private walkStrays(id: string): boolean {
    const dying = this.tracked.get(id);
    if (!dying || this.mountPoint === null) return false;
    const at = new Date().toISOString();
    const sessions = [...this.tracked.values()];
    let added = false;
    const add = (s: (typeof sessions)[number], e: CgroupEscape) => {
      // The destination is named already (by the watch): the stray adds nothing.
      if (s.escapes.some((x) => x.to === e.to)) return;
      recordEscape(s.escapes, e);
      added = true;
    };
    for (const [sid, path] of this.unproven) if (!existsSync(path)) this.unproven.delete(sid);
    const leaves = [...sessions, ...[...this.unproven].map(([sid, leafPath]) => ({ id: sid, leafPath, leafIno: 0n, shimPid: -1, uid: -1, startTicks: 0 }))];
    for (const st of findStrays(walkDescendants(this.selfPid, this.mountPoint), leaves)) {
      if (st.owner !== null && this.unproven.has(st.owner)) continue;
      const owner = st.owner !== null ? this.tracked.get(st.owner) : undefined;
      if (owner) add(owner, { kind: 'stray', to: st.cgroup, at, writer_pid: st.pid });
      else if (st.startTicks >= dying.startTicks) {
        // Moved there by another session's own write (seen by the watch): that session's escape.
        const by = this.namedWriters.get(`${st.pid}:${st.cgroup}`);
        if (by !== undefined && by !== id) continue;
        const namedByOther = st.cgroup !== null && (this.named.get(st.cgroup) ?? id) !== id;
        const shared = namedByOther || sessions.some((s) => s.id !== id && s.startTicks <= st.startTicks);
        add(dying, { kind: shared ? 'escape_possible' : 'stray', to: st.cgroup, at, writer_pid: st.pid });
      }
    }
    return added;
  }

  /** Stops tracking a session (its end is not proven: no report is wanted); what is still in its leaf is no stray of another session's. */
  forget(id: string): void {
    const t = this.tracked.get(id);
    if (t) this.unproven.set(id, t.leafPath);
    this.drop(id);
  }

  private drop(id: string): void {
    this.tracked.delete(id);
    if (this.tracked.size === 0 && this.timer) {
      clearInterval(this.timer);
      this.timer = null;
    }
  }

  /** Reads and attributes what is queued. Never throws (a failed read is logged). */
  poll(): void {
    try {
      this.read(false);
    } catch (err) {
      this.log.error({ err }, 'cgroup escape watch: read failed');
    }
  }

  private read(discard: boolean): void {
    if (this.fd < 0) return;
    for (;;) {
      const events = native().watchRead(this.fd, this.selfPid, '', '');
      if (events.length === 0) return;
      if (discard) continue;
      for (const e of events) this.attribute(e);
    }
  }

  private attribute(e: { mask: number; pid: number; cgroup: bigint; handle: Buffer; name: Buffer }): void {
    const at = new Date().toISOString();
    const sessions = [...this.tracked.values()];
    if (e.mask & FAN_Q_OVERFLOW) {
      for (const s of sessions) if (s.uid === 0) recordEscape(s.escapes, { kind: 'escape_possible', to: null, at, writer_pid: null });
      return;
    }
    const name = e.name.toString();
    if (name !== 'cgroup.procs' && name !== 'cgroup.threads') return;
    // The supervisor's own writes are the hand-off of leftovers to a service (handoff.ts), said in both receipts.
    if (e.pid === this.selfPid) return;
    let to: string | null = null;
    try {
      to = native().watchHandlePath(this.mountFd, e.handle).toString();
    } catch {
      // The destination is gone already (ESTALE): named null.
    }
    const chain = ancestry(e.pid, this.selfPid);
    const who = attributeWrite({ pid: e.pid, cgroupId: e.cgroup, ancestry: chain?.chain ?? null, truncated: chain?.truncated }, sessions, this.selfPid);
    if (who.kind === 'session') {
      const s = this.tracked.get(who.id)!;
      if (!withinLeaf(to, s.leafPath)) {
        recordEscape(s.escapes, { kind: 'escape', to, at, writer_pid: e.pid });
        if (to !== null) {
          remember(this.named, to, s.id);
          remember(this.namedWriters, `${e.pid}:${to}`, s.id);
        }
      }
    } else if (who.kind === 'possible') {
      for (const s of sessions) if (s.uid === 0 && !withinLeaf(to, s.leafPath)) recordEscape(s.escapes, { kind: 'escape_possible', to, at, writer_pid: e.pid });
    }
  }

  /** Closes the group. */
  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    if (this.fd >= 0) closeSync(this.fd);
    if (this.mountFd >= 0) closeSync(this.mountFd);
  }
}
