// The test hooks, as fault.ts holds the crash points: behaviour only tests ask for, each set as
// SBX_TEST_<NAME> in the supervisor's environment, read once here (worker threads read the same
// copy), documented here, inert when unset. The one place production code learns of them.
const env = process.env;

/** Every test hook's value (grep `testHooks.<name>` for where each acts). */
export const testHooks = Object.freeze({
  /** SBX_TEST_WATCH_LIMITED_QUEUE=1: the workspace watcher's fanotify group keeps the kernel's bounded queue (16384 events), so a test can overflow it. */
  watchLimitedQueue: env.SBX_TEST_WATCH_LIMITED_QUEUE === '1',
  /** SBX_TEST_WATCH_PAUSE_FILE=PATH: the watcher's reading thread stops reading while PATH exists (a backlog a test controls). */
  watchPauseFile: env.SBX_TEST_WATCH_PAUSE_FILE || undefined,
  /** SBX_TEST_WATCH_NO_TMPFILE=1: barriers behave as on a file system without O_TMPFILE (the state dir's barriers/ instead). */
  watchNoTmpfile: env.SBX_TEST_WATCH_NO_TMPFILE === '1',
  /** SBX_TEST_ESCAPE_WATCH_OFF=1: no cgroup escape watch (receipts say why), as where fanotify refuses it. */
  escapeWatchOff: env.SBX_TEST_ESCAPE_WATCH_OFF === '1',
  /** SBX_TEST_FROZEN_HOLD_MS=N: how long the crash points `checkpoint:frozen-hold` (a frozen pass) and `checkpoint:pass-hold` (before the second pass) hold, ms (default 60 s). */
  frozenHoldMs: Number(env.SBX_TEST_FROZEN_HOLD_MS ?? 60_000),
  /** SBX_TEST_CHECKPOINT_TOUCH=NAME[@N]: one byte appended to <workspace>/NAME before passes 2..N+1 (default: every later pass): a file that changes between passes exactly. */
  checkpointTouch: env.SBX_TEST_CHECKPOINT_TOUCH || null,
  /** SBX_TEST_CHECKPOINT_FLIP=NAME: the first byte of NAME's stored object flipped between the manifest's write and the read-back, once per supervisor run. */
  checkpointFlip: env.SBX_TEST_CHECKPOINT_FLIP || null,
  /** SBX_TEST_TASK_EARLY_CHECKPOINT=1: a task close takes its checkpoints before the settle, out of order, so the join meets one older than a terminal_mutation. */
  taskEarlyCheckpoint: env.SBX_TEST_TASK_EARLY_CHECKPOINT === '1',
  /** SBX_TEST_SHIM_STAYS_STOPPED=1: a stopped shim is never continued (as if stopped again at once), so its kill bound is reached. */
  shimStaysStopped: env.SBX_TEST_SHIM_STAYS_STOPPED === '1',
  /** SBX_TEST_SHIM_KILL_GIVE_UP_MS=N: the kill bound of a shim that stays (supervisor/session/live.ts, default 10 s), so a test reaches it sooner. */
  shimKillGiveUpMs: Number(env.SBX_TEST_SHIM_KILL_GIVE_UP_MS ?? 10_000),
  /** SBX_TEST_SHIM_ANSWER_MS=N: how long a signal through a shim that stays waits for its answer (supervisor/session/spawn.ts, default 5 s). */
  shimAnswerMs: Number(env.SBX_TEST_SHIM_ANSWER_MS ?? 5_000),
  /** SBX_TEST_SHIM_START_UNHEARD=1: a shim that stays is not heard saying "started", as when the command stopped it (kill -STOP $PPID) before it wrote that line. */
  shimStartUnheard: env.SBX_TEST_SHIM_START_UNHEARD === '1',
  /** SBX_TEST_SPAWN_TO_TRACK_MS=N: the event loop held N ms between a session's spawn and its tracking by the watches, as a loaded machine may (the command runs meanwhile). */
  spawnToTrackMs: Number(env.SBX_TEST_SPAWN_TO_TRACK_MS ?? 0),
});
