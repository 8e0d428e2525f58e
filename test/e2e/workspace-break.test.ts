// Breaking the workspace clock (issues 17, 29): the barrier after a round that timed out, FIFOs
// planted where the barrier used to be, and other edges found by trying. Real daemons, real
// fanotify; each test fails on the code before its fix.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import type { ChangesResult, StatusResult } from '../../ipc/protocol.js';
import { until, within } from '../helpers/daemon.js';
import { json, runScript, WorkspaceRig } from '../helpers/workspace.js';

const rig = new WorkspaceRig();
afterEach(() => rig.cleanup());
const daemonWith = rig.daemon.bind(rig);
const run = runScript;

describe('barrier rounds', () => {
  it('two rounds that time out while the reader is held: once it reads again, the next session has its terminal_mutation', async () => {
    const pause = join('/tmp', `sbx-test-ws-break-pause-${process.pid}-${Date.now()}`);
    rig.removeLater(pause);
    const { d, paths } = await daemonWith(
      (dir) => {
        mkdirSync(join(dir, 'ws'));
        return [join(dir, 'ws')];
      },
      { env: { SBX_TEST_WATCH_PAUSE_FILE: pause }, config: { barrierTimeoutMs: 300 } },
    );
    writeFileSync(pause, '');
    // Two rounds, each written while the previous one's barrier event is still queued.
    for (const key of ['held-1', 'held-2']) {
      const r = await run(d, key, `echo ${key} > ${paths[0]}/${key}`);
      expect(r.workspace![0]).toMatchObject({ gap: 'barrier_timeout', terminal_mutation: null });
    }
    rmSync(pause);
    const c = await d.client();
    await until(async () => (await c.status()).workspaces[0].events >= 2, 'the held events to be read');
    for (const key of ['after-1', 'after-2']) {
      const r = await run(d, key, `echo ${key} > ${paths[0]}/${key}; sleep 0.1`);
      const e = r.workspace![0];
      expect(e.gap).toBeNull();
      expect(e.terminal_mutation).toBeGreaterThan(e.attributed.last_seq!);
    }
    const status = json<StatusResult>(await d.sbx(['status', '--json']));
    expect(status.workspaces[0].health).toBe('ok');
  });
});

describe('a workspace root renamed away and back (issue 33)', () => {
  it('its barriers still come back, while renamed and after: no barrier_timeout, and writes after the return are attributed', async () => {
    const { d, paths } = await daemonWith((dir) => {
      mkdirSync(join(dir, 'ws'));
      return [join(dir, 'ws')];
    });
    const ws = paths[0];
    expect((await run(d, 'before', `echo 1 > ${ws}/a`)).workspace![0].gap).toBeNull();
    expect(spawnSync('mv', [ws, `${ws}_old`]).status).toBe(0);
    try {
      // While renamed: its writes are outside the watched path, but the barrier orders them all the same.
      const away = (await run(d, 'away', `echo 2 > ${ws}_old/b`)).workspace![0];
      expect(away.gap).toBeNull();
      expect(away.terminal_mutation).not.toBeNull();
    } finally {
      expect(spawnSync('mv', [`${ws}_old`, ws]).status).toBe(0);
    }
    for (const key of ['back-1', 'back-2']) {
      const e = (await run(d, key, `echo 3 > ${ws}/${key}; sleep 0.05`)).workspace![0];
      expect(e.gap).toBeNull();
      expect(e.attributed.last_path).toBe(key);
      expect(e.terminal_mutation).toBeGreaterThan(e.attributed.last_seq!);
    }
  });
});

describe("the barrier, out of any session's reach", () => {
  it('FIFOs planted where older versions kept the barrier (.sandbox-supervisor/barrier, barrier-1) and named #<n>: the receipt has its terminal_mutation, status and a restart answer, nothing hangs', async () => {
    const { d, paths } = await daemonWith(
      (dir) => {
        mkdirSync(join(dir, 'ws'));
        return [join(dir, 'ws')];
      },
      { config: { barrierTimeoutMs: 1000 } },
    );
    const ws = paths[0];
    const plant = `cd ${ws}; mv .sandbox-supervisor old 2>/dev/null; mkdir .sandbox-supervisor && mkfifo .sandbox-supervisor/barrier .sandbox-supervisor/barrier-1 .sandbox-supervisor/barrier-2 '#1' "#$(stat -c %i .)" && echo x > '#12' && sleep 0.2`;
    const c = await d.client();
    const { session_id } = await c.launch({ argv: ['sh', '-c', plant], cwd: '/', invocation_key: 'plant' });
    // Polled as a file: a supervisor blocked in open() of a FIFO would not answer.
    await until(() => existsSync(join(d.stateDir, 'sessions', session_id, 'receipt.json')), "the planting session's receipt", 20_000);
    const r = await within(c.wait({ session_id }), 'the receipt over the socket');
    expect(r.outcome).toBe('exited');
    expect(r.exit).toEqual({ code: 0, signal: null });
    const e = r.workspace![0];
    expect(e.gap).toBeNull();
    expect(e.attributed.last_path).toBe('#12'); // a session's file named #<n> is its event, never a barrier
    expect(e.terminal_mutation).toBeGreaterThan(e.attributed.last_seq!);
    expect((await within(c.status(), 'status')).workspaces[0]).toMatchObject({ mode: 'fanotify', health: 'ok' });
    await d.terminate();
    await within(d.start(), 'the restart');
    const status = await within(d.sbx(['status', '--json']), 'sbx status after the restart');
    expect(json<StatusResult>(status).workspaces[0]).toMatchObject({ mode: 'fanotify', health: 'ok' });
    const next = await within(run(d, 'next', `echo next > ${ws}/next; sleep 0.1`), 'the next session');
    expect(next.workspace![0]).toMatchObject({ gap: null, attributed: { last_path: 'next' } });
    expect(next.workspace![0].terminal_mutation).toBeGreaterThan(next.workspace![0].attributed.last_seq!);
    // What the session made is its own, left as it made it.
    expect(readdirSync(join(ws, '.sandbox-supervisor')).sort()).toEqual(['barrier', 'barrier-1', 'barrier-2']);
  });
});

describe('the barrier cannot be given a name', () => {
  it('root linking the O_TMPFILE barrier into the workspace through /proc/<pid>/fd (ln -L, linkat AT_SYMLINK_FOLLOW) is refused (O_EXCL): nothing appears, the barrier still orders', async () => {
    const { d, paths } = await daemonWith((dir) => {
      mkdirSync(join(dir, 'ws'));
      return [join(dir, 'ws')];
    });
    const ws = paths[0];
    // The supervisor's fd on the barrier: its /proc link names ws/#<inode> (deleted).
    const fds = readdirSync(`/proc/${d.pid}/fd`).filter((fd) => {
      try {
        return /^.*\/ws\/#\d+ \(deleted\)$/.test(readlinkSync(`/proc/${d.pid}/fd/${fd}`));
      } catch {
        return false;
      }
    });
    expect(fds.length).toBe(1);
    const ln = spawnSync('ln', ['-L', `/proc/${d.pid}/fd/${fds[0]}`, join(ws, 'planted')]);
    expect(ln.status, 'ln -L of the barrier must fail').not.toBe(0);
    expect(ln.stderr.toString()).toContain('No such file or directory'); // linkat(2): ENOENT for an O_TMPFILE opened O_EXCL
    expect(readdirSync(ws)).toEqual([]);
    const r = await run(d, 'after', `echo after > ${ws}/after; sleep 0.1`);
    expect(r.workspace![0]).toMatchObject({ gap: null, attributed: { last_path: 'after' } });
    expect(r.workspace![0].terminal_mutation).toBeGreaterThan(r.workspace![0].attributed.last_seq!);
  });
});

describe('names', () => {
  it('names that are not UTF-8, or hold a newline: shown as \\xNN with their bytes (base64) over the socket and in --json, one line each in the human form', async () => {
    const { d, paths } = await daemonWith((dir) => {
      mkdirSync(join(dir, 'ws'));
      return [join(dir, 'ws')];
    });
    await run(
      d,
      'names',
      `cd ${paths[0]}; printf 1 > "$(printf 'z\\377\\376')"; printf 2 > "$(printf 'z\\376\\377')"; printf 3 > "$(printf 'a\\n  9  created   b')"; sleep 0.2`,
    );
    const c = await d.client();
    // Each file: created, then written (the kernel merged the two into one event); the created ones here.
    const pick = (chs: ChangesResult['workspaces'][0]['changes']) => chs.filter((ch) => ch.kind === 'created').map((ch) => [ch.path, ch.path_b64 ?? null]);
    const expected = [
      ['z\\xff\\xfe', Buffer.from('z\xff\xfe', 'latin1').toString('base64')],
      ['z\\xfe\\xff', Buffer.from('z\xfe\xff', 'latin1').toString('base64')],
      ['a\n  9  created   b', null],
    ];
    expect(pick((await c.changes({ invocation_key: 'names' })).workspaces[0].changes)).toEqual(expected);
    expect(pick(json<ChangesResult>(await d.sbx(['changes', '--key', 'names', '--json'])).workspaces[0].changes)).toEqual(expected);
    const text = (await d.sbx(['changes', '--key', 'names'])).stdout.toString();
    const lines = text.split('\n').filter((l) => /^ +\d+ +created +/.test(l));
    expect(lines.map((l) => l.replace(/^ +\d+ +created +/, ''))).toEqual(['z\\xff\\xfe', 'z\\xfe\\xff', 'a\\n  9  created   b']);
  });
});

describe('names in receipts', () => {
  it('a session whose last write is to a name that is not UTF-8: its receipt, as sbx receipt prints it, verifies', async () => {
    const { d, paths } = await daemonWith((dir) => {
      mkdirSync(join(dir, 'ws'));
      return [join(dir, 'ws')];
    });
    // It used to be unsignable (RFC 8785 refuses a lone surrogate): the session became unknown, and sbx run hung.
    const r = await run(d, 'latin1', `cd ${paths[0]}; printf 1 > "$(printf 'caf\\351')"; sleep 0.2`);
    expect(r.workspace![0].attributed.last_path).toBe('caf\\xe9');
    const file = join(d.dir, 'r.json');
    writeFileSync(file, (await d.sbx(['receipt', '--key', 'latin1'])).stdout);
    const v = await d.sbx(['verify', file, '--public-key', join(d.stateDir, 'receipt-key.pub')]);
    expect(v.stdout.toString()).toMatch(/^OK: signed by /);
    expect(v.status).toBe(0);
  });
});
