// A supervisor out of file descriptors (RLIMIT_NOFILE lowered on the running daemon with
// prlimit(1)): every launch is refused or ends with a receipt (spawn_failed EMFILE), none is
// left unknown, and no fd is left behind. Before: a pipe made before the one that failed
// leaked, and a receipt write that hit EMFILE left its session unknown for good; the user
// lookup (getpwuid_r opens the user database) answered INTERNAL, "a bug", to a launch at the
// limit, not a retryable ADMISSION_DENIED.
import { spawnSync } from 'node:child_process';
import { readdirSync, readlinkSync } from 'node:fs';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { isSupervisorError } from '../../ipc/errors.js';
import { TestDaemon, until } from '../helpers/daemon.js';

let daemon: TestDaemon;
/** The same daemon's config with a session user (config session.user): each launch looks it up. */
let withUser: TestDaemon;
beforeAll(async () => {
  [daemon, withUser] = await Promise.all([new TestDaemon().start(), new TestDaemon({ config: { session: { user: 'root' } } }).start()]);
});
afterAll(async () => {
  for (const d of [daemon, withUser]) {
    spawnSync('prlimit', ['--pid', String(d.pid), '--nofile=1024:']);
    expect(await d.stop()).toEqual({ code: 0, signal: null });
  }
});

it('launches at the fd limit are refused or end with a receipt; nothing is left unknown or open', async () => {
  await atTheLimit(daemon);
});

it('likewise with a session user looked up at each launch (session.user)', async () => {
  await atTheLimit(withUser);
});

/** The RLIMIT_NOFILE soft limit that leaves exactly `free` fd numbers unused below it, in pid's table now. */
function limitLeaving(pid: number, free: number): number {
  const open = new Set(readdirSync(`/proc/${pid}/fd`).map(Number));
  let n = 0;
  for (let left = free; ; n++) {
    if (open.has(n)) continue;
    if (left === 0) return n;
    left--;
  }
}

async function atTheLimit(daemon: TestDaemon): Promise<void> {
  /** What each fd is (readlink of /proc/PID/fd/N). */
  const fdTable = () =>
    Object.fromEntries(
      readdirSync(`/proc/${daemon.pid}/fd`).map((n) => [
        n,
        (() => {
          try {
            return readlinkSync(`/proc/${daemon.pid}/fd/${n}`);
          } catch {
            return '?';
          }
        })(),
      ]),
    );
  // The fds the supervisor's code opens (pipes, files, sockets, the pty): an epoll instance
  // is only ever a libuv loop's (a thread's own, or spawnSync's), never one of ours. One was
  // seen left, twice in about 35 runs, after the session-user case; it is reported, not counted.
  const isEpoll = (what: string) => what === 'anon_inode:[eventpoll]';
  const fds = () => Object.values(fdTable()).filter((what) => !isEpoll(what)).length;
  const c = await daemon.client();
  // Warm: the hashing threads and every lazily opened file exist before the limit is lowered.
  await c.wait({ session_id: (await c.launch({ argv: ['true'], cwd: '/' })).session_id });
  const base = fds();
  const baseTable = fdTable();
  const seen: string[] = [];
  for (let extra = 0; extra <= 5; extra++) {
    // RLIMIT_NOFILE bounds fd numbers, not a count: the limit is the number below which
    // exactly `extra` fds are free (the daemon's fd table may have holes).
    expect(spawnSync('prlimit', ['--pid', String(daemon.pid), `--nofile=${limitLeaving(daemon.pid, extra)}:`]).status).toBe(0);
    let session_id: string | null = null;
    try {
      session_id = (await c.launch({ argv: ['sh', '-c', 'echo out; echo err >&2'], cwd: '/' })).session_id;
    } catch (err) {
      if (!isSupervisorError(err)) throw err;
      seen.push(`refused ${err.code}`);
    }
    if (session_id) {
      // The limit stays low until the session is settled one way or the other.
      const row = await until(
        async () =>
          (await c.ps(true)).sessions.find((s) => s.session_id === session_id && (s.state === 'ended' || (s.state === 'unknown' && !s.receipt_pending))),
        'the session to settle',
        20_000,
      );
      expect(spawnSync('prlimit', ['--pid', String(daemon.pid), '--nofile=1024:']).status).toBe(0);
      const receipt = await c.wait({ session_id });
      seen.push(`${row.state} ${receipt.outcome} ${receipt.spawn_error?.code ?? ''}`.trim());
    }
    expect(spawnSync('prlimit', ['--pid', String(daemon.pid), '--nofile=1024:']).status).toBe(0);
  }
  console.log(`fd exhaustion: base ${base} fds; outcomes ${JSON.stringify(seen)}`);
  for (const s of seen) expect(s).toMatch(/^(refused ADMISSION_DENIED|ended spawn_failed EMFILE|ended exited)$/);
  expect((await c.ps(true)).sessions.filter((s) => s.state === 'unknown')).toEqual([]);
  await until(() => fds() === base, `the daemon's fds back to ${base}`).then(
    () => {
      const epolls = Object.entries(fdTable()).filter(([n, what]) => isEpoll(what) && baseTable[n] !== what);
      if (epolls.length) console.log(`fd exhaustion: epoll instances not there before (a libuv loop's): ${JSON.stringify(epolls)}`);
    },
    (err: Error) => {
      const now = fdTable();
      const diff = Object.entries(now).filter(([n, what]) => baseTable[n] !== what);
      const log = daemon
        .log()
        .split('\n')
        .filter((l) => /"level":(40|50|60)/.test(l))
        .slice(-8)
        .join('\n');
      throw new Error(`${err.message}; fds not there before (or changed): ${JSON.stringify(diff)}; the daemon's last warnings:\n${log}`);
    },
  );
}
