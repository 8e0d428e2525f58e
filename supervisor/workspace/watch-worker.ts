// The watcher's reading thread (worker_threads): one fanotify group for every workspace
// (native watch.c), read in batches so a burst of small writes costs one wake-up, not one per
// event (docs/design/facts.md 25). Each event kept gets the next sequence number of this listener epoch,
// in the order the kernel queued them (fanotify(7): events are read in order), so a barrier's
// sequence orders it after every event queued before it. Resolves the directory handle to a
// path (cached; dropped on any directory move or delete), drops events outside the
// workspaces and the supervisor's own writes but its barriers (each workspace's barrier inode,
// known by its directory and name: BarrierId), and posts each batch. Owns the group fd and the
// mount fds; not attribution to sessions (watcher.ts does that from the cgroup id of each event).
//
// workerData: WatchWorkerInit. Messages out: WatchMessage. In: {stop: true}. Shared memory:
// Int32Array(wake) [0] = a barrier wants a read now (Atomics.notify), [1] = pause (test hook).
import { closeSync, constants, openSync } from 'node:fs';
import { parentPort, workerData } from 'node:worker_threads';
import { native } from '../native.js';
import { fsDecode } from './names.js';

/**
 * How every barrier's name begins: an O_TMPFILE inode's event names it `#<inode number>` (the
 * kernel's name for an unnamed file), the state-dir fallback's file is named so too. The C reader
 * drops the supervisor's own events but those with such a name.
 */
export const BARRIER_PREFIX = '#';

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
  /** Index into paths. */
  ws: number;
  mask: number;
  /** Path relative to the workspace ("" for the root itself), or null when its directory was gone. */
  path: string | null;
  /** The writer's cgroup id (decimal), "0" when unknown (reaped before the read: unattributed). */
  cgroup: string;
  /** ms since the epoch when read. */
  atMs: number;
}

export type WatchMessage =
  | { type: 'ready'; marks: { path: string; ok: boolean; message: string | null }[] }
  | { type: 'failed'; code: string; message: string }
  | { type: 'batch'; events: WatchEvent[]; barriers: { ws: number; seq: number }[]; overflowSeq: number | null };

const DIR_CHANGED = FAN.MOVED_FROM | FAN.MOVED_TO | FAN.DELETE | FAN.DELETE_SELF | FAN.MOVE_SELF;

function run(init: WatchWorkerInit): void {
  const port = parentPort!;
  const n = native();
  const wake = new Int32Array(init.wake);
  let fd: number;
  try {
    fd = n.watchInit(init.unlimitedQueue);
  } catch (err) {
    const e = err as NodeJS.ErrnoException;
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
      const e = err as NodeJS.ErrnoException;
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
  let seq = 0;
  const selfPid = init.selfPid;
  const resolveDir = (handle: Buffer): string | null => {
    const key = handle.toString('latin1');
    const hit = dirCache.get(key);
    if (hit !== undefined) return hit;
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
  const tick = () => {
    if (stopping) {
      closeSync(fd);
      for (const m of mountFds) if (m >= 0) closeSync(m);
      process.exit(0);
    }
    let ready = false;
    try {
      ready = Atomics.load(wake, 1) === 0 && n.watchPoll(fd, 50);
    } catch {
      ready = false;
    }
    if (!ready) {
      if (Atomics.load(wake, 1) !== 0) Atomics.wait(wake, 0, 0, 20);
      setImmediate(tick);
      return;
    }
    // Let a burst accumulate, unless a barrier is waiting.
    if (Atomics.load(wake, 0) === 0) Atomics.wait(wake, 0, 0, init.batchMs);
    Atomics.store(wake, 0, 0);
    const events: WatchEvent[] = [];
    const barriers: { ws: number; seq: number }[] = [];
    let overflowSeq: number | null = null;
    for (;;) {
      const raw = n.watchRead(fd, selfPid, BARRIER_PREFIX, init.cgroupMount);
      if (raw.length === 0) break;
      const atMs = Date.now();
      for (const r of raw) {
        if (r.mask & FAN.Q_OVERFLOW) {
          overflowSeq = ++seq;
          dirCache.clear();
          continue;
        }
        const dir = resolveDir(r.handle);
        if (r.mask & FAN.ONDIR && r.mask & DIR_CHANGED) dirCache.clear();
        if (dir === null) continue; // its directory is gone: not placeable in any workspace
        const name = fsDecode(r.name);
        // The supervisor's own writes are not events, but its barriers; a session's file named `#<n>` is an event.
        if (r.pid === selfPid) {
          const ws = init.barriers.findIndex((b) => b !== null && b.dir === dir && b.name === name);
          if (ws >= 0) barriers.push({ ws, seq: ++seq });
          continue;
        }
        const full = name === '' || name === '.' ? dir : `${dir}/${name}`;
        const ws = roots.findIndex((root, i) => full === init.paths[i] || full.startsWith(root));
        if (ws < 0) continue;
        events.push({ seq: ++seq, ws, mask: r.mask, path: full === init.paths[ws] ? '' : full.slice(roots[ws].length), cgroup: r.cgroup.toString(), atMs });
      }
    }
    if (events.length || barriers.length || overflowSeq !== null) {
      port.postMessage({ type: 'batch', events, barriers, overflowSeq } satisfies WatchMessage);
    }
    setImmediate(tick);
  };
  tick();
}

if (parentPort && workerData && (workerData as { watchWorker?: boolean }).watchWorker) run(workerData as WatchWorkerInit);
