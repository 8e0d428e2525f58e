// The watcher's reading thread (worker_threads): one fanotify group for every workspace (native watch.c),
// read in batches, so a burst of small writes costs one wake-up and a file's create, write and close merge
// into one (docs/design/facts.md 25). Each event kept gets the next sequence number of this listener epoch in
// queue order (fanotify(7)), so a barrier's sequence orders it after every event queued before it. Owns the
// group fd and the mount fds; not attribution to sessions (watcher.ts: by each event's cgroup id).
import { createHash } from 'node:crypto';
import { closeSync, constants, openSync } from 'node:fs';
import { parentPort, workerData } from 'node:worker_threads';
import { native } from '../../core/fs/native.js';
import { fsDecode } from '../../core/fs/names.js';
import { systemError } from '../../ipc/errno.js';

/**
 * How every barrier's name begins: an O_TMPFILE inode's event names it `#<inode number>` (the
 * kernel's name for an unnamed file), the state-dir fallback's file is named so too. The C reader
 * drops the supervisor's own events but those with such a name.
 */
export const BARRIER_PREFIX = '#';

/** The wake buffer's slot counting events posted and not yet taken by the supervisor's thread (Int32Array index). */
export const WAKE_POSTED = 2;

/** Where a workspace's barrier events come from: the directory its event names (a real path) and the name. */
export interface BarrierId {
  dir: string;
  name: string;
}

export interface WatchWorkerInit {
  watchWorker: true;
  paths: string[];
  /** Each workspace's barrier (null: none, the workspace is unsupported). */
  barriers: (BarrierId | null)[];
  selfPid: number;
  cgroupMount: string;
  unlimitedQueue: boolean;
  batchMs: number;
  /** FAN_MODIFY too (an event per write(2), not only at close). */
  reportModify: boolean;
  /**
   * workspace.maxQueuedEvents: events read and not yet taken by the supervisor's thread (held
   * here and posted) at most; past it, events are read and dropped, said as an overflow (the
   * kernel's own queue is unlimited: a flood would grow it, or this process, without bound).
   */
  maxQueuedEvents: number;
  wake: SharedArrayBuffer;
}

/** fanotify event bits (linux/fanotify.h). */
export const FAN = {
  ACCESS: 0x1,
  MODIFY: 0x2,
  ATTRIB: 0x4,
  CLOSE_WRITE: 0x8,
  MOVED_FROM: 0x40,
  MOVED_TO: 0x80,
  CREATE: 0x100,
  DELETE: 0x200,
  DELETE_SELF: 0x400,
  MOVE_SELF: 0x800,
  Q_OVERFLOW: 0x4000,
  ONDIR: 0x40000000,
} as const;

/** One event as the main thread gets it. */
export interface WatchEvent {
  seq: number;
  /** Index into paths; -1: unplaced (its directory was gone and no delete named it: counted, in no workspace). */
  ws: number;
  mask: number;
  /** Path relative to the workspace ("" for the root itself), or null when its directory was gone. */
  path: string | null;
  /** The writer's cgroup id (decimal), "0" when unknown (reaped before the read: unattributed). */
  cgroup: string;
  /** ms since the epoch when read. */
  atMs: number;
  /** A move's (MOVED_FROM, MOVED_TO) moved entry: its file handle digested, 16 hex digits; both halves of a rename share it. */
  object?: string;
}

export type WatchMessage =
  | { type: 'ready'; marks: { path: string; ok: boolean; message: string | null }[] }
  | { type: 'failed'; code: string; message: string }
  /** The pause test hook took hold (true) or let go (false): reads stopped, or go on. */
  | { type: 'paused'; paused: boolean }
  | {
      type: 'batch';
      events: WatchEvent[];
      barriers: { ws: number; seq: number }[];
      overflowSeq: number | null;
      dropped: number;
      /** The supervisor's own events read (and dropped) since the last batch, its barriers apart. */
      own: number;
    };

/** A directory move changes the path of everything under it: the path cache is dropped (a delete does not: an old handle never names another directory). */
const DIR_MOVED = FAN.MOVED_FROM | FAN.MOVED_TO | FAN.MOVE_SELF;
/** The dirent events whose target fid names a directory in its parent (FAN_REPORT_TARGET_FID). */
const DIR_LINKED = FAN.CREATE | FAN.DELETE | FAN.MOVED_FROM | FAN.MOVED_TO;
/** How long an event whose directory is gone (and not yet named by its delete) may wait for that delete, in ms. */
export const PLACE_WAIT_MS = 200;
/** Events that may wait so at once; past it the oldest is counted unplaced. */
export const PLACE_WAIT_MAX = 100_000;
/** Events one read pass takes before they are placed and posted (the next tick reads on). */
const READ_PASS_MAX = 32_768;
/** Directories remembered by their delete or create (handle -> parent and name). */
const LINKS_MAX = 262_144;

type RawEvent = ReturnType<ReturnType<typeof native>['watchRead']>[number];

/** Where a directory entry is: its parent's handle (and its key) and its name. */
interface DirEnd {
  parentKey: string;
  parent: Buffer;
  name: string;
}

/** What was read, in queue order, until it is posted. */
type Pending =
  { kind: 'event'; seq: number; raw: RawEvent; key: string; atMs: number } | { kind: 'barrier'; seq: number; ws: number } | { kind: 'overflow'; seq: number };

/**
 * The thread's body. workerData: WatchWorkerInit. Messages out: WatchMessage. In: {stop: true}. Shared memory:
 * Int32Array(wake) [0] = a barrier wants a read now (Atomics.notify), [1] = pause (test hook),
 * [2] = events posted and not yet taken by the supervisor's thread (it subtracts what it took).
 */
function run(init: WatchWorkerInit): void {
  const port = parentPort!;
  const n = native();
  const wake = new Int32Array(init.wake);
  let fd: number;
  try {
    fd = n.watchInit(init.unlimitedQueue);
  } catch (err) {
    const e = systemError(err);
    port.postMessage({ type: 'failed', code: e.code ?? 'EINVAL', message: e.message } satisfies WatchMessage);
    return;
  }
  const mountFds: number[] = [];
  const marks = init.paths.map((path) => {
    try {
      n.watchMark(fd, path, init.reportModify);
      mountFds.push(openSync(path, constants.O_RDONLY | constants.O_DIRECTORY));
      return { path, ok: true, message: null };
    } catch (err) {
      const e = systemError(err);
      mountFds.push(-1);
      return { path, ok: false, message: e.message };
    }
  });
  // A barrier file in the state dir (no O_TMPFILE there) is on a workspace's file system but maybe
  // not under its mount: its directory resolves through an fd of its own too.
  for (const b of init.barriers) {
    if (!b || init.paths.includes(b.dir)) continue;
    try {
      mountFds.push(openSync(b.dir, constants.O_RDONLY | constants.O_DIRECTORY));
    } catch {
      // its barriers will time out: a gap, not a guess
    }
  }
  port.postMessage({ type: 'ready', marks } satisfies WatchMessage);
  let stopping = false;
  port.on('message', (m: { stop?: boolean }) => {
    if (m.stop) stopping = true;
  });
  const roots = init.paths.map((p) => (p.endsWith('/') ? p : p + '/'));
  const dirCache = new Map<string, string | null>();
  // A directory gone before its events were read is named by its delete (or create) in its
  // parent: the target fid of that event (Linux 5.17+; without it, such events are unplaced).
  const links = new Map<string, DirEnd>();
  let seq = 0;
  const selfPid = init.selfPid;
  const openByHandle = (key: string, handle: Buffer): string | null => {
    let path: string | null = null;
    for (const mfd of mountFds) {
      if (mfd < 0) continue;
      try {
        path = fsDecode(n.watchHandlePath(mfd, handle));
        break;
      } catch {
        // another file system's mount fd, or the directory is gone (ESTALE)
      }
    }
    if (dirCache.size > 65536) dirCache.clear();
    dirCache.set(key, path);
    return path;
  };
  /**
   * The directory's path now (the handle resolved, cached; the cache is dropped on any directory move), else where
   * its delete last named it (a directory already gone is named by its delete in its parent, the target fid);
   * null: not known (yet).
   */
  const resolveDir = (key: string, handle: Buffer, depth = 0): string | null => {
    const hit = dirCache.get(key);
    if (hit) return hit;
    if (hit === undefined) {
      const path = openByHandle(key, handle);
      if (path !== null) return path;
    }
    const link = links.get(key);
    if (!link || depth > 4096) return null;
    const parent = resolveDir(link.parentKey, link.parent, depth + 1);
    return parent === null ? null : parent === '/' ? `/${link.name}` : `${parent}/${link.name}`;
  };
  const pending: Pending[] = [];
  const events: WatchEvent[] = [];
  const barriers: { ws: number; seq: number }[] = [];
  let overflowSeq: number | null = null;
  /**
   * The directory moves among what is pending, in queue order (each at its later half's index):
   * a path found now is where a directory is after every move, so an event queued before a move
   * (read after it) is placed where its directory was then (place's atIndex).
   */
  const movesOf = (): { idx: number; from: DirEnd; to: DirEnd }[] => {
    const byTarget = new Map<string, { idx: number; from?: DirEnd; to?: DirEnd }>();
    pending.forEach((p, idx) => {
      if (p.kind !== 'event' || !(p.raw.mask & FAN.ONDIR) || !p.raw.target || !(p.raw.mask & (FAN.MOVED_FROM | FAN.MOVED_TO))) return;
      const tk = p.raw.target.toString('latin1');
      const m = byTarget.get(tk) ?? { idx };
      const end = { parentKey: p.key, parent: p.raw.handle, name: fsDecode(p.raw.name) };
      if (p.raw.mask & FAN.MOVED_FROM) m.from = end;
      if (p.raw.mask & FAN.MOVED_TO) m.to = end;
      m.idx = idx;
      byTarget.set(tk, m);
    });
    return [...byTarget.values()].flatMap((m) => (m.from && m.to ? [{ idx: m.idx, from: m.from, to: m.to }] : [])).sort((a, b) => a.idx - b.idx);
  };
  /**
   * Turns what was read into messages, in order, up to the first event still waiting for its directory's name;
   * an event it cannot place is counted unplaced (ws -1), one outside the workspaces is dropped.
   */
  const place = (now: number) => {
    let i = 0;
    const barrierBehind = pending.some((p) => p.kind === 'barrier');
    const moves = movesOf();
    // Each move's old and new path, memoised for this call.
    const ends = new Map<number, { old: string | null; now: string | null }>();
    /** path (a directory's path now) where it was just after the item at index k was queued: the moves after k undone, latest first. */
    const atIndex = (k: number, path: string | null): string | null => {
      if (path === null) return null;
      for (let m = moves.length - 1; m >= 0 && moves[m].idx > k; m--) {
        const e = endsOf(m);
        if (e.old === null || e.now === null) continue;
        if (path === e.now || path.startsWith(`${e.now}/`)) path = e.old + path.slice(e.now.length);
      }
      return path;
    };
    const join = (dir: string | null, name: string) => (dir === null ? null : dir === '/' ? `/${name}` : `${dir}/${name}`);
    const endsOf = (m: number) => {
      let e = ends.get(m);
      if (!e) {
        const mv = moves[m];
        e = {
          old: join(atIndex(mv.idx, resolveDir(mv.from.parentKey, mv.from.parent)), mv.from.name),
          now: join(atIndex(mv.idx, resolveDir(mv.to.parentKey, mv.to.parent)), mv.to.name),
        };
        ends.set(m, e);
      }
      return e;
    };
    for (; i < pending.length; i++) {
      const p = pending[i];
      if (p.kind === 'overflow') {
        overflowSeq = p.seq;
        continue;
      }
      if (p.kind === 'barrier') {
        barriers.push({ ws: p.ws, seq: p.seq });
        continue;
      }
      const r = p.raw;
      const dir = atIndex(i, resolveDir(p.key, r.handle));
      if (dir === null) {
        // Its directory is gone; its delete, later in the queue, names it. Wait for it a while,
        // unless a barrier is behind (everything before that barrier is read: no delete to come).
        if (!barrierBehind && now - p.atMs < PLACE_WAIT_MS && pending.length - i < PLACE_WAIT_MAX) break;
        events.push({ seq: p.seq, ws: -1, mask: r.mask, path: null, cgroup: r.cgroup.toString(), atMs: p.atMs });
        continue;
      }
      const name = fsDecode(r.name);
      const full = name === '' || name === '.' ? dir : `${dir}/${name}`;
      const ws = roots.findIndex((root, k) => full === init.paths[k] || full.startsWith(root));
      if (ws < 0) continue; // outside every workspace
      const object = r.target && r.mask & (FAN.MOVED_FROM | FAN.MOVED_TO) ? createHash('sha256').update(r.target).digest('hex').slice(0, 16) : undefined;
      events.push({
        seq: p.seq,
        ws,
        mask: r.mask,
        path: full === init.paths[ws] ? '' : full.slice(roots[ws].length),
        cgroup: r.cgroup.toString(),
        atMs: p.atMs,
        ...(object ? { object } : {}),
      });
    }
    pending.splice(0, i);
  };
  const post = () => {
    if (events.length || barriers.length || overflowSeq !== null || dropped > 0 || own > 0) {
      Atomics.add(wake, WAKE_POSTED, events.length);
      port.postMessage({ type: 'batch', events: events.splice(0), barriers: barriers.splice(0), overflowSeq, dropped, own } satisfies WatchMessage);
    }
    overflowSeq = null;
    dropped = 0;
    own = 0;
  };
  /**
   * The bound on what is held (workspace.maxQueuedEvents): once pending and posted events
   * reach it, events are dropped until they are down to half of it. Each read pass that drops
   * says an overflow where its first drop was, so a session tracked while drops go on (its
   * start taken after an earlier pass's overflow was handled) still sees one before its
   * barrier. A barrier is never dropped: the sequence still orders it after every event.
   */
  let dropping = false;
  let dropped = 0;
  let own = 0;
  let saidThisPass = false;
  const overBound = (): boolean => {
    const held = pending.length + Atomics.load(wake, WAKE_POSTED);
    if (dropping && held <= init.maxQueuedEvents / 2) dropping = false;
    else if (!dropping && held >= init.maxQueuedEvents) dropping = true;
    if (dropping && !saidThisPass) {
      saidThisPass = true;
      pending.push({ kind: 'overflow', seq: ++seq });
    }
    return dropping;
  };
  /**
   * Reads what is queued (pidfds made while their writers still exist) into pending, in order, up to READ_PASS_MAX.
   * Drops the supervisor's own writes but its barriers (each workspace's barrier inode, known by its name, its
   * directory only to tell two apart: BarrierId).
   */
  const readAll = (): void => {
    let readNow = 0;
    saidThisPass = false;
    for (;;) {
      const raw = n.watchRead(fd, selfPid, BARRIER_PREFIX, init.cgroupMount);
      own += raw.own;
      if (raw.length === 0 && raw.own === 0) break;
      const atMs = Date.now();
      for (const r of raw) {
        if (r.mask & FAN.Q_OVERFLOW) {
          pending.push({ kind: 'overflow', seq: ++seq });
          dirCache.clear();
          continue;
        }
        const key = r.handle.toString('latin1');
        if (r.mask & FAN.ONDIR && r.target && r.mask & DIR_LINKED) {
          if (links.size >= LINKS_MAX) links.delete(links.keys().next().value!);
          links.set(r.target.toString('latin1'), { parentKey: key, parent: r.handle, name: fsDecode(r.name) });
        }
        if (r.mask & FAN.ONDIR && r.mask & DIR_MOVED) dirCache.clear();
        // The supervisor's own writes are not events, but its barriers; a session's file named `#<n>` is an event.
        if (r.pid === selfPid) {
          // Known by its name (`#<inode>`: the supervisor makes nothing else so named), its
          // directory only to tell two apart: a workspace root renamed away and back still
          // gets its barriers (the path of the root while renamed is another's).
          const name = fsDecode(r.name);
          const named = init.barriers.flatMap((b, i) => (b !== null && b.name === name ? [i] : []));
          const ws = named.length === 1 ? named[0] : named.find((i) => init.barriers[i]!.dir === resolveDir(key, r.handle));
          if (ws !== undefined) pending.push({ kind: 'barrier', seq: ++seq, ws });
          else own++; // named like a barrier, no workspace's: our own all the same
          continue;
        }
        // Past the bound: read and dropped (the directory links and the path cache above are kept up to date).
        if (overBound()) {
          dropped++;
          continue;
        }
        // Placed now, while its directory most likely exists (a move read later is undone in place()).
        if (!dirCache.get(key)) resolveDir(key, r.handle);
        pending.push({ kind: 'event', seq: ++seq, raw: r, key, atMs });
      }
      // A burst of a million: placed and posted as it is read, not held whole.
      if ((readNow += raw.length + raw.own) >= READ_PASS_MAX) break;
    }
  };
  let wasPaused = false;
  const tick = () => {
    if (stopping) {
      closeSync(fd);
      for (const m of mountFds) if (m >= 0) closeSync(m);
      process.exit(0);
    }
    const paused = Atomics.load(wake, 1) !== 0;
    if (paused !== wasPaused) {
      wasPaused = paused;
      port.postMessage({ type: 'paused', paused } satisfies WatchMessage);
    }
    let ready = false;
    try {
      ready = !paused && n.watchPoll(fd, pending.length > 0 ? 10 : 50);
    } catch {
      ready = false;
    }
    if (paused) Atomics.wait(wake, 0, 0, 20);
    if (ready) {
      // Let a burst accumulate (the kernel merges a name's events still queued: create, write
      // and close of one file are read as one), unless a barrier is waiting. A leader or an
      // orphan that exits meanwhile is still attributed: the supervisor keeps it a zombie until
      // then; a process reaped by its own parent is, only if it still exists (batchMs 0: read at once).
      if (Atomics.load(wake, 0) === 0) Atomics.wait(wake, 0, 0, init.batchMs);
      Atomics.store(wake, 0, 0);
      readAll();
    }
    place(Date.now());
    post();
    setImmediate(tick);
  };
  tick();
}

if (parentPort && workerData && (workerData as { watchWorker?: boolean }).watchWorker) run(workerData as WatchWorkerInit);
