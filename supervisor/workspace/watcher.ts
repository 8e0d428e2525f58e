// The workspace clock (docs/reference/contract.md "Workspaces, checkpoints and tasks"): where a session's
// workspace evidence is decided. Attributes each event to the session whose leaf its writer was in, never
// guesses; makes the barrier written after a session's death its terminal_mutation; turns every reason it
// cannot vouch for the events into a gap with a scan that stands in. Owns the barrier fds and the per-session
// change logs; not the walk (core/fs/walk.ts) or the reading thread (watch-worker.ts, which it runs).
import { closeSync, constants, existsSync, fstatSync, futimesSync, mkdirSync, openSync, realpathSync, statfsSync, statSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import type { Logger } from 'pino';
import type { WorkspaceEntry, WorkspaceGap, WorkspaceStatus } from '../../ipc/protocol.js';
import { STATE } from '../../core/state/names.js';
import { ChangeLog, changeKinds, CHANGES_FILE } from './changes.js';
import { ChangeJournal, type JournalHints } from './journal.js';
import type { MutationScan } from './digest.js';
import { nameText } from '../../core/fs/names.js';
import { scanInWorker } from './scan.js';
import { mountIdOf, type FsIdentity } from '../../core/fs/walk.js';
import { BARRIER_PREFIX, type BarrierId, FAN, WAKE_POSTED, type WatchEvent, type WatchMessage, type WatchWorkerInit } from './watch-worker.js';
import { errnoCode } from '../../ipc/errno.js';
import { testHooks } from '../../core/test-hooks.js';

export interface WatcherOptions {
  paths: string[];
  /** The supervisor's state dir: a barrier file goes there for a workspace without O_TMPFILE (same file system only). */
  stateDir: string;
  bootId: string;
  /** The cgroup2 mount point ("" without one: attribution only through PIDFD_GET_INFO). */
  cgroupMount: string;
  log: Logger;
  barrierTimeoutMs: number;
  scanDeadlineMs: number;
  changesMaxEntries: number;
  batchMs: number;
  /** workspace.maxQueuedEvents: events read and not yet handled, at most (watch-worker.ts); past it, dropped as an overflow. */
  maxQueuedEvents: number;
  /** workspace.reportModify: FAN_MODIFY too (live writes in `sbx changes`; ~2x the events of close-write alone). */
  reportModify: boolean;
}

/** open(2)'s O_TMPFILE on Linux (__O_TMPFILE | O_DIRECTORY; not in fs.constants). */
const O_TMPFILE = 0o20200000;

/** statfs(2) f_type names for the file systems a workspace is usually on. */
const FS_TYPES: Record<number, string> = {
  0xef53: 'ext4',
  0x01021994: 'tmpfs',
  0x794c7630: 'overlay',
  0x58465342: 'xfs',
  0x9123683e: 'btrfs',
  0x6969: 'nfs',
  0x65735546: 'fuse',
  0x2fc12fc1: 'zfs',
};

interface Workspace {
  path: string;
  fsType: string;
  /** Its root's st_dev and mount id at start: the file system the mark and the barrier are of (null: not a directory then). */
  fs: { dev: bigint; mntId: string | null } | null;
  /** Why events cannot be vouched for, from the start (null: watched). */
  unsupported: string | null;
  barrierFd: number;
  /** Its barrier events' directory and name (null: no barrier, unsupported). */
  barrier: BarrierId | null;
  /**
   * Barrier writes whose events have not come back (a round that timed out); skipped when they
   * do. At most 1: no barrier is written while one is out, since fanotify merges a write into
   * the same file's event still queued (fanotify(7)), which would come back once for two.
   */
  staleBarriers: number;
  events: number;
  lastSeq: number;
  unattributed: number;
  overflows: number;
}

interface Attributed {
  events: number;
  last_seq: number | null;
  last_at: string | null;
  last_path: string | null;
}

interface Tracked {
  sessionId: string;
  changes: ChangeLog;
  attributed: Attributed[];
  unattributedAtStart: number[];
  overflowsAtStart: number[];
}

type BarrierResult = { ok: true; seqs: (number | null)[] } | { ok: false };

interface Round {
  waiting: Set<number>;
  /** Workspaces whose barrier waits for a stale one to come back before it is written. */
  unwritten: Set<number>;
  /** The round's number: the barrier inode's times are set to it (seconds). */
  no: number;
  seqs: (number | null)[];
  done: (r: BarrierResult) => void;
  promise: Promise<BarrierResult>;
}

export class WorkspaceWatcher {
  readonly epoch: string;
  private readonly workspaces: Workspace[];
  private worker: Worker | null = null;
  private readonly wake = new SharedArrayBuffer(12);
  private readonly byCgroup = new Map<string, Tracked>();
  private readonly bySession = new Map<string, Tracked>();
  private listenerGap: string | null = null;
  private round: Round | null = null;
  private next: Promise<BarrierResult> | null = null;
  private roundNo = 0;
  /** Events whose directory was gone before it could be named, and no delete named it: counted in no workspace (never guessed into one). */
  private unplacedEvents = 0;
  /** The pause test hook holds the reader (said in status health, so a test knows it took hold). */
  private readerPaused = false;
  /** Every workspace's paths with events, for a checkpoint's capture to read first (journal.ts). */
  private readonly journal: ChangeJournal;

  /** Settles once every workspace is marked, or known unwatchable (never rejects). */
  readonly ready: Promise<void>;
  private pauseTimer: NodeJS.Timeout | null = null;

  constructor(private readonly options: WatcherOptions) {
    this.epoch = `${options.bootId}:${Date.now()}`;
    this.journal = new ChangeJournal(options.paths.length);
    this.workspaces = options.paths.map((path) => {
      let fsType = 'unknown';
      try {
        const t = Number(statfsSync(path).type);
        fsType = FS_TYPES[t] ?? `0x${t.toString(16)}`;
      } catch {
        // checked at start (config)
      }
      return {
        path,
        fsType,
        fs: rootIdentity(path),
        unsupported: null,
        barrierFd: -1,
        barrier: null,
        staleBarriers: 0,
        events: 0,
        lastSeq: 0,
        unattributed: 0,
        overflows: 0,
      };
    });
    this.ready = options.paths.length > 0 ? this.startWorker() : Promise.resolve();
    if (testHooks.watchPauseFile) {
      // Test hook: while the file exists the reading thread does not read (to force an overflow).
      const pauseFile = testHooks.watchPauseFile;
      const wake = new Int32Array(this.wake);
      this.pauseTimer = setInterval(() => Atomics.store(wake, 1, existsSync(pauseFile) ? 1 : 0), 20);
      this.pauseTimer.unref();
    }
  }

  /** The watched workspaces' paths (absolute, real), in config order. */
  get paths(): string[] {
    return this.workspaces.map((w) => w.path);
  }

  private async startWorker(): Promise<void> {
    const { log } = this.options;
    this.workspaces.forEach((ws, i) => {
      try {
        this.openBarrier(ws, i);
      } catch (err) {
        ws.unsupported = `no barrier: ${(err as Error).message}`;
      }
    });
    const path = workerPath();
    if (!path) {
      this.failAll('the watch worker (dist/supervisor/workspace/watch-worker.js) is missing; build with tsc');
      return;
    }
    const init: WatchWorkerInit = {
      watchWorker: true,
      paths: this.paths,
      barriers: this.workspaces.map((w) => w.barrier),
      selfPid: process.pid,
      cgroupMount: this.options.cgroupMount,
      unlimitedQueue: !testHooks.watchLimitedQueue,
      batchMs: this.options.batchMs,
      reportModify: this.options.reportModify,
      maxQueuedEvents: this.options.maxQueuedEvents,
      wake: this.wake,
    };
    const worker = new Worker(path, { workerData: init });
    this.worker = worker;
    await new Promise<void>((resolve) => {
      worker.on('message', (m: WatchMessage) => {
        if (m.type === 'ready') {
          m.marks.forEach((mark, i) => {
            if (!mark.ok && !this.workspaces[i].unsupported) this.workspaces[i].unsupported = `fanotify_mark: ${mark.message}`;
          });
          resolve();
        } else if (m.type === 'paused') {
          this.readerPaused = m.paused;
        } else if (m.type === 'failed') {
          this.failAll(`fanotify_init: ${m.message}`);
          resolve();
        } else this.onBatch(m);
      });
      worker.on('error', (err) => {
        log.error({ err }, 'the workspace watcher failed; workspaces are scanned instead');
        this.listenerGap = `the watcher failed: ${err.message}`;
        this.round?.done({ ok: false });
        resolve();
      });
      worker.on('exit', () => resolve());
    });
    worker.unref();
    for (const ws of this.workspaces) {
      log.info(
        { path: ws.path, fs: ws.fsType, mode: ws.unsupported ? 'scan' : 'fanotify', gap: ws.unsupported },
        ws.unsupported ? 'workspace not watchable: sessions get a scan at death' : 'workspace watched',
      );
    }
  }

  private failAll(reason: string): void {
    for (const ws of this.workspaces) ws.unsupported ??= reason;
  }

  /** Every workspace with its file system, mode and health (sbx status). */
  status(): WorkspaceStatus[] {
    return this.workspaces.map((ws) => ({
      path: ws.path,
      fs: ws.fsType,
      mode: ws.unsupported || this.listenerGap ? 'scan' : 'fanotify',
      health:
        ws.unsupported ??
        this.listenerGap ??
        (ws.overflows > 0 ? `ok (queue overflowed ${ws.overflows} times)` : this.readerPaused ? 'ok (reader paused: test hook)' : 'ok'),
      epoch: this.epoch,
      events: ws.events,
      last_seq: ws.lastSeq || null,
      unattributed_events: ws.unattributed,
    }));
  }

  /**
   * From now on, events whose writer is in the cgroup at leafPath are the session's (an event's cgroup id
   * is the leaf directory's inode: cgroups(7), pidfd info); an event of no tracked leaf is counted
   * unattributed, never guessed into a session.
   */
  track(sessionId: string, leafPath: string | null, sessionDir: string): void {
    if (this.workspaces.length === 0) return;
    const t: Tracked = {
      sessionId,
      changes: new ChangeLog(join(sessionDir, CHANGES_FILE), this.options.changesMaxEntries, this.epoch),
      attributed: this.workspaces.map(() => ({ events: 0, last_seq: null, last_at: null, last_path: null })),
      unattributedAtStart: this.workspaces.map((w) => w.unattributed),
      overflowsAtStart: this.workspaces.map((w) => w.overflows),
    };
    this.bySession.set(sessionId, t);
    if (leafPath) {
      try {
        this.byCgroup.set(String(statSync(leafPath).ino), t);
      } catch {
        // no leaf: nothing is attributed to it (subreaper mode); its events are unattributed
      }
    }
  }

  /** A live session's change log flushed, its dropped count and unattributed events so far, per workspace; null when not tracked. */
  liveChanges(sessionId: string): { dropped: number; unattributed: number[] } | null {
    const t = this.bySession.get(sessionId);
    if (!t) return null;
    t.changes.flush();
    return { dropped: t.changes.dropped, unattributed: this.workspaces.map((w, i) => w.unattributed - t.unattributedAtStart[i]) };
  }

  private onBatch(m: Extract<WatchMessage, { type: 'batch' }>): void {
    if (m.overflowSeq !== null) {
      for (const ws of this.workspaces) ws.overflows++;
      // Said once per run of drops (each read pass that drops says an overflow).
      if (m.dropped > 0 && !this.droppingBefore)
        this.options.log.warn(
          { seq: m.overflowSeq, max_queued_events: this.options.maxQueuedEvents },
          'workspace events over workspace.maxQueuedEvents: events are dropped until half of them are handled; sessions alive now get a scan',
        );
      else if (m.dropped === 0) this.options.log.warn({ seq: m.overflowSeq }, 'fanotify queue overflow: events were lost; sessions alive now get a scan');
    }
    this.droppingBefore = m.dropped > 0;
    this.droppedEvents += m.dropped;
    this.ownEvents += m.own;
    const touched = new Set<Tracked>();
    for (const e of m.events) this.onEvent(e, touched);
    // Events lost: the journal is incomplete through everything read so far (a later barrier is past it).
    if (m.overflowSeq !== null || m.dropped > 0)
      this.journal.lost(
        null,
        this.workspaces.reduce((n, w) => Math.max(n, w.lastSeq), m.overflowSeq ?? 0),
      );
    for (const t of touched) t.changes.flush();
    for (const b of m.barriers) this.onBarrier(b.ws, b.seq);
    Atomics.sub(new Int32Array(this.wake), WAKE_POSTED, m.events.length);
  }

  /** Events read that could be placed in no workspace (their directory gone unnamed), since start. */
  get unplaced(): number {
    return this.unplacedEvents;
  }

  /** Events read and dropped past workspace.maxQueuedEvents, since start (each run of them an overflow). */
  get dropped(): number {
    return this.droppedEvents;
  }

  /**
   * The supervisor's own events read and dropped (its barriers apart), since start: what its
   * writes on a watched file system (its checkpoint store's among them: about four per object
   * written) cost the watcher.
   */
  get own(): number {
    return this.ownEvents;
  }

  private droppedEvents = 0;
  private ownEvents = 0;
  private droppingBefore = false;

  private onEvent(e: WatchEvent, touched: Set<Tracked>): void {
    if (e.ws < 0) {
      this.unplacedEvents++;
      this.journal.lost(null, e.seq);
      return;
    }
    const ws = this.workspaces[e.ws];
    ws.events++;
    ws.lastSeq = Math.max(ws.lastSeq, e.seq);
    if (e.path === null) this.journal.lost(e.ws, e.seq);
    else this.journal.record(e.ws, e.seq, e.path);
    const t = e.cgroup !== '0' ? this.byCgroup.get(e.cgroup) : undefined;
    if (!t) {
      ws.unattributed++;
      return;
    }
    const a = t.attributed[e.ws];
    const at = new Date(e.atMs).toISOString();
    a.events++;
    a.last_seq = e.seq;
    a.last_at = at;
    if (e.path !== null) a.last_path = nameText(e.path); // the receipt's text: \xNN for a byte that is not UTF-8
    if (e.path === null || e.path === '') return;
    for (const kind of changeKinds(e.mask)) {
      const object = e.object && (kind === 'renamed_from' || kind === 'renamed_to') ? { object: e.object } : {};
      t.changes.add({ seq: e.seq, ws: e.ws, kind, path: e.path, ...(e.mask & FAN.ONDIR ? { dir: true as const } : {}), ...object, at });
    }
    touched.add(t);
  }

  private onBarrier(ws: number, seq: number): void {
    const w = this.workspaces[ws];
    w.lastSeq = seq;
    if (w.staleBarriers > 0) {
      w.staleBarriers--;
      // The round that waited for this one writes its own now (a write before would have merged).
      const r = this.round;
      if (r && r.unwritten.delete(ws)) {
        if (this.writeBarrier(ws, r.no)) this.wakeReader();
        else {
          r.waiting.delete(ws);
          if (r.waiting.size === 0) r.done({ ok: true, seqs: r.seqs });
        }
      }
      return;
    }
    const r = this.round;
    if (!r || !r.waiting.has(ws) || r.unwritten.has(ws)) return;
    r.waiting.delete(ws);
    r.seqs[ws] = seq;
    if (r.waiting.size === 0) r.done({ ok: true, seqs: r.seqs });
  }

  /**
   * Opens workspace i's barrier, by fds only (nothing a session can plant is opened by path): an
   * O_TMPFILE inode, O_EXCL, in its root (no name a session can reach or give it), whose events
   * name the root and `#<inode>`; where the file system has no O_TMPFILE, a file in the state
   * dir's barriers/ if that is on the same file system (the mark is the whole file system's).
   * Throws, saying why, when neither.
   */
  private openBarrier(ws: Workspace, i: number): void {
    try {
      if (testHooks.watchNoTmpfile) throw Object.assign(new Error('O_TMPFILE off (test hook)'), { code: 'EOPNOTSUPP' });
      // O_EXCL: the inode can never be linked into the file system (open(2)), not even via /proc/<pid>/fd by root.
      ws.barrierFd = openSync(ws.path, O_TMPFILE | constants.O_EXCL | constants.O_WRONLY, 0o600);
      ws.barrier = { dir: ws.path, name: `${BARRIER_PREFIX}${fstatSync(ws.barrierFd, { bigint: true }).ino}` };
      return;
    } catch (err) {
      const code = errnoCode(err);
      if (code !== 'EOPNOTSUPP' && code !== 'ENOTSUP' && code !== 'EISDIR' && code !== 'EINVAL') throw err;
    }
    const dir = join(this.options.stateDir, STATE.barriersDir);
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    const real = realpathSync(dir);
    if (statSync(real).dev !== statSync(ws.path).dev) {
      throw new Error(
        `its file system (${ws.fsType}) has no O_TMPFILE and the state dir ${this.options.stateDir} is on another file system (a barrier file there would not be seen)`,
      );
    }
    const name = `${BARRIER_PREFIX}${i}`;
    const fd = openSync(join(real, name), constants.O_WRONLY | constants.O_CREAT | constants.O_NOFOLLOW | constants.O_NONBLOCK, 0o600);
    if (!fstatSync(fd).isFile()) {
      closeSync(fd);
      throw new Error(`${join(real, name)} is not a regular file`);
    }
    ws.barrierFd = fd;
    ws.barrier = { dir: real, name };
  }

  /**
   * Writes workspace i's barrier: futimens(2) of the barrier fd, times set to the round's
   * number, in seconds (an ATTRIB event, in the mask whatever workspace.reportModify says; one event per
   * barrier). False (logged) when it fails.
   */
  private writeBarrier(i: number, roundNo: number): boolean {
    const ws = this.workspaces[i];
    try {
      futimesSync(ws.barrierFd, roundNo, roundNo);
      return true;
    } catch (err) {
      this.options.log.warn({ err, path: ws.path }, 'the barrier write failed');
      return false;
    }
  }

  /** Tells the reading thread to read now, not at the end of its batch. */
  private wakeReader(): void {
    const wake = new Int32Array(this.wake);
    Atomics.store(wake, 0, 1);
    Atomics.notify(wake, 0);
  }

  /** One barrier round for every watched workspace; requests while one is out join the next. */
  private barrier(): Promise<BarrierResult> {
    if (this.next) return this.next;
    const start = (): Promise<BarrierResult> => {
      this.next = null;
      let done!: (r: BarrierResult) => void;
      const promise = new Promise<BarrierResult>((r) => (done = r));
      const waiting = new Set<number>();
      const unwritten = new Set<number>();
      const seqs: (number | null)[] = this.workspaces.map(() => null);
      const round: Round = { waiting, unwritten, no: ++this.roundNo, seqs, done, promise };
      this.workspaces.forEach((ws, i) => {
        if (ws.unsupported) return;
        if (ws.staleBarriers > 0) {
          waiting.add(i);
          unwritten.add(i);
        } else if (this.writeBarrier(i, round.no)) waiting.add(i);
      });
      if (waiting.size === 0 || !this.worker || this.listenerGap) {
        done({ ok: waiting.size === 0 && !this.listenerGap, seqs });
        return promise;
      }
      this.round = round;
      this.wakeReader();
      const timer = setTimeout(() => {
        for (const i of waiting) if (!unwritten.has(i)) this.workspaces[i].staleBarriers++;
        done({ ok: false });
      }, this.options.barrierTimeoutMs);
      void promise.then(() => {
        clearTimeout(timer);
        if (this.round === round) this.round = null;
      });
      return promise;
    };
    if (!this.round) return start();
    const current = this.round.promise;
    this.next = current.then(start, start);
    return this.next;
  }

  /**
   * The reaper's read fence (reaper.ts ReadFence): resolves once every event queued before the
   * call has been read, its writer's cgroup found while the writer was still a zombie: true, or
   * false when it could not be vouched for (a barrier timed out, no listener). Joins the barrier
   * round a session's settle or a checkpoint's boundary starts, so it costs one more at most.
   */
  async readFence(): Promise<boolean> {
    await this.ready;
    return (await this.barrier()).ok;
  }

  /** Whether any workspace is watched by fanotify (else a read fence would have nothing to order). */
  get watching(): boolean {
    return this.workspaces.some((w) => !w.unsupported) && !this.listenerGap;
  }

  /**
   * A session's workspace entries once nothing of it can write (its cgroup empty): its
   * barrier's sequence (its terminal_mutation), what was attributed to it, the unattributed events
   * of its lifetime, and a gap with a scan where the events cannot be vouched for (no fanotify, a
   * queue overflow, a restart, a barrier that did not come back). [] without workspaces.
   */
  async settle(sessionId: string): Promise<WorkspaceEntry[]> {
    if (this.workspaces.length === 0) return [];
    await this.ready;
    const t = this.bySession.get(sessionId);
    const result = await this.barrier();
    t?.changes.close();
    const entries = await Promise.all(
      this.workspaces.map(async (ws, i): Promise<WorkspaceEntry> => {
        let gap: WorkspaceGap | null = null;
        if (ws.unsupported) gap = 'unsupported';
        else if (this.listenerGap) gap = 'listener_restart';
        else if (t && ws.overflows > t.overflowsAtStart[i]) gap = 'overflow';
        else if (!result.ok || result.seqs[i] === null) gap = 'barrier_timeout';
        return {
          path: ws.path,
          epoch: this.epoch,
          terminal_mutation: gap ? null : result.ok ? result.seqs[i] : null,
          attributed: t ? { ...t.attributed[i] } : { events: 0, last_seq: null, last_at: null, last_path: null },
          unattributed_events: t ? ws.unattributed - t.unattributedAtStart[i] : 0,
          gap,
          scan: gap ? await this.scan(ws.path) : null,
        };
      }),
    );
    if (t) {
      this.bySession.delete(sessionId);
      for (const [k, v] of this.byCgroup) if (v === t) this.byCgroup.delete(k);
    }
    return entries;
  }

  /**
   * The mutation boundary of a checkpoint of path, taken before its scan: a barrier round's
   * sequence for the workspace holding path (itself or a directory in it: every write closed
   * before now is ordered before it, so a scan started after sees it), or a gap and why:
   * not_watched (path is in no watched workspace),
   * unsupported, listener_restart, barrier_timeout. Never rejects.
   */
  async boundary(
    path: string,
  ): Promise<{ epoch: string | null; seq: number | null; gap: null | 'not_watched' | 'unsupported' | 'listener_restart' | 'barrier_timeout' }> {
    const i = this.indexOf(path);
    if (i < 0) return { epoch: null, seq: null, gap: 'not_watched' };
    await this.ready;
    const result = await this.barrier();
    const ws = this.workspaces[i];
    if (ws.unsupported) return { epoch: this.epoch, seq: null, gap: 'unsupported' };
    if (this.listenerGap) return { epoch: this.epoch, seq: null, gap: 'listener_restart' };
    if (!result.ok || result.seqs[i] === null) return { epoch: this.epoch, seq: null, gap: 'barrier_timeout' };
    return { epoch: this.epoch, seq: result.seqs[i], gap: null };
  }

  /**
   * The journal of the watched workspace holding path (a real path: itself or a directory in
   * it), its paths relative to path: what had events, for a checkpoint's capture of path to read
   * before its walk (journal.ts). Null when path is in no watched workspace, or it is not watched.
   * Take it after boundary(path): every event before that is in it.
   */
  hints(path: string): JournalHints | null {
    const i = this.indexOf(path);
    if (i < 0 || this.workspaces[i].unsupported || this.listenerGap) return null;
    const root = this.workspaces[i].path;
    return this.journal.hints(this.epoch, i, path === root ? '' : path.slice(root.endsWith('/') ? root.length : root.length + 1));
  }

  /** The watched workspace holding path (a real path): itself or a directory in it; -1: none. */
  private indexOf(path: string): number {
    // A directory inside a watched workspace is ordered by that workspace's barrier.
    return this.workspaces.findIndex((w) => path === w.path || path.startsWith(w.path.endsWith('/') ? w.path : `${w.path}/`));
  }

  /**
   * What a walk of path (a real path) must find to be of the watched file system: the holding
   * workspace's st_dev, and for the workspace itself its mount id too (core/fs/walk.ts checkFsIdentity);
   * null when path is in no watched workspace.
   */
  fsIdentity(path: string): FsIdentity | null {
    const i = this.indexOf(path);
    const ws = this.workspaces[i];
    if (i < 0 || !ws.fs) return null;
    return { workspace: ws.path, dev: ws.fs.dev, mntId: path === ws.path ? ws.fs.mntId : null };
  }

  /** The watched workspace (its path, as receipts name it) holding path (a real path), or null. */
  rootOf(path: string): string | null {
    const i = this.indexOf(path);
    return i < 0 ? null : this.workspaces[i].path;
  }

  /** Entries for a session settled after a restart: its events were another listener's. */
  async restartEntries(): Promise<WorkspaceEntry[]> {
    return Promise.all(
      this.workspaces.map(async (ws) => ({
        path: ws.path,
        epoch: this.epoch,
        terminal_mutation: null,
        attributed: { events: 0, last_seq: null, last_at: null, last_path: null },
        unattributed_events: 0,
        gap: 'listener_restart' as const,
        scan: await this.scan(ws.path),
      })),
    );
  }

  private async scan(root: string): Promise<MutationScan | null> {
    const reply = await scanInWorker<MutationScan>(root, 'mutation', { deadlineMs: this.options.scanDeadlineMs, expectFs: this.fsIdentity(root) ?? undefined });
    if (reply.ok) return reply.result;
    this.options.log.warn({ path: root, code: reply.code, message: reply.message }, 'workspace scan at death failed');
    return null;
  }

  async stop(): Promise<void> {
    if (this.pauseTimer) clearInterval(this.pauseTimer);
    await this.ready;
    const w = this.worker;
    this.worker = null;
    if (w) {
      const exited = new Promise((r) => w.once('exit', r));
      w.postMessage({ stop: true });
      await Promise.race([exited, new Promise((r) => setTimeout(r, 1000).unref())]);
      await w.terminate();
    }
    for (const ws of this.workspaces) if (ws.barrierFd >= 0) closeSync(ws.barrierFd);
  }
}

/** The root's st_dev and mount id (by an fd: the mount it resolves to now), null when it cannot be opened as a directory. */
function rootIdentity(path: string): Workspace['fs'] {
  let fd: number;
  try {
    fd = openSync(path, constants.O_RDONLY | constants.O_DIRECTORY);
  } catch {
    return null;
  }
  try {
    return { dev: fstatSync(fd, { bigint: true }).dev, mntId: mountIdOf(fd) };
  } finally {
    closeSync(fd);
  }
}

/** The compiled worker beside this module, also when run from sources (as scan.ts). */
function workerPath(): string | null {
  const here = dirname(fileURLToPath(import.meta.url));
  for (const p of [join(here, 'watch-worker.js'), join(here, '../../dist/supervisor/workspace/watch-worker.js')]) if (existsSync(p)) return p;
  return null;
}

/**
 * Checks the configured workspaces at start: absolute, existing directories (a path that
 * does not exist is refused: a watch that starts later would miss what came before), not
 * inside the state dir and not holding it, not inside one another. Returns their real paths;
 * throws with every problem.
 */
export function checkWorkspacePaths(paths: string[], stateDir: string): string[] {
  const problems: string[] = [];
  const out: string[] = [];
  let state = resolve(stateDir);
  try {
    state = realpathSync(stateDir);
  } catch {
    // not made yet: checked as given (made only once the workspaces pass)
  }
  for (const p of paths) {
    if (!p.startsWith('/')) {
      problems.push(`workspace ${JSON.stringify(p)} is not an absolute path`);
      continue;
    }
    let real: string;
    try {
      real = realpathSync(p);
      if (!statSync(real).isDirectory()) throw Object.assign(new Error('not a directory'), { code: 'ENOTDIR' });
    } catch (err) {
      problems.push(`workspace ${p}: ${errnoCode(err) === 'ENOENT' ? 'does not exist (create it before the supervisor starts)' : (err as Error).message}`);
      continue;
    }
    const inside = (a: string, b: string) => a === b || a.startsWith(b.endsWith('/') ? b : b + '/');
    if (inside(real, state)) problems.push(`workspace ${p} is inside the state dir ${stateDir}`);
    else if (inside(state, real)) problems.push(`the state dir ${stateDir} is inside workspace ${p}`);
    else if (!out.includes(real)) out.push(real);
  }
  // One event belongs to one workspace: nested workspaces would make that a guess.
  for (const a of out)
    for (const b of out) if (a !== b && b.startsWith(a.endsWith('/') ? a : a + '/')) problems.push(`workspace ${b} is inside workspace ${a}`);
  if (problems.length) throw new Error(problems.join('; '));
  return out;
}
