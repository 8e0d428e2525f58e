// The workspace clock against the real kernel (fanotify, cgroups, tmpfs, overlayfs): each
// session's writes attributed to it or counted as unattributed, never to another; its barrier
// (terminal_mutation) after every write it made; and every reason the events cannot be vouched
// for (no fanotify, an overflow, a restart) a gap with a scan, never "no mutations".
import { spawnSync } from 'node:child_process';
import { mkdirSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import type { ChangesResult, Receipt, StatusResult, WorkspaceEntry } from '../../ipc/protocol.js';
import { TestDaemon, until } from '../helpers/daemon.js';
import { json, runScript, WorkspaceRig } from '../helpers/workspace.js';

const rig = new WorkspaceRig();
afterEach(() => rig.cleanup());
const daemonWith = rig.daemon.bind(rig);
const mount = rig.mount.bind(rig);
const run = runScript;

/**
 * Writes by the session's shell (alive when the reader looks: attributable) and by short-lived
 * children (touch, cp, /bin/echo, rm, mv: often reaped before the reader's batch, then counted
 * as unattributed). The shell stays 0.2 s after its last write so that write is attributable.
 */
const writer = (tag: string, dirs: string[]) =>
  dirs
    .map(
      (dir) =>
        `cd ${dir}; for i in 1 2 3 4 5 6 7 8 9 10; do echo $i > ${tag}-$i; sleep 0.01; done; /bin/echo x > ${tag}-echo; touch ${tag}-touch; cp ${tag}-1 ${tag}-cp; rm ${tag}-2; mv ${tag}-3 ${tag}-moved; echo last > ${tag}-last`,
    )
    .join('; ') + '; sleep 0.2';

describe('attribution', () => {
  it('two sessions writing at once into an ext4 and a tmpfs workspace: each sees only its own writes', async () => {
    const { d, paths } = await daemonWith((dir) => {
      mkdirSync(join(dir, 'ext4-ws'));
      mount(['-t', 'tmpfs', '-o', 'size=16m', 'tmpfs'], join(dir, 'tmpfs-ws'));
      return [join(dir, 'ext4-ws'), join(dir, 'tmpfs-ws')];
    });
    const status = json<StatusResult>(await d.sbx(['status', '--json']));
    expect(status.workspaces.map((w) => [w.fs, w.mode, w.health])).toEqual([
      ['ext4', 'fanotify', 'ok'],
      ['tmpfs', 'fanotify', 'ok'],
    ]);
    const c = await d.client();
    const [a, b] = await Promise.all(['A', 'B'].map((tag) => c.launch({ argv: ['sh', '-c', writer(tag, paths)], cwd: '/', invocation_key: `ws-${tag}` })));
    const [ra, rb] = await Promise.all([c.wait({ session_id: a.session_id }), c.wait({ session_id: b.session_id })]);
    for (const [tag, r] of [
      ['A', ra],
      ['B', rb],
    ] as const) {
      expect(r.outcome).toBe('exited');
      expect(r.workspace!.map((w) => w.path)).toEqual(paths);
      for (const w of r.workspace!) {
        expect(w.gap).toBeNull();
        expect(w.epoch).toBe(status.workspaces[0].epoch);
        expect(w.attributed.last_path).toBe(`${tag}-last`);
        expect(w.attributed.events).toBeGreaterThanOrEqual(11); // the shell's own: 10 files and the last
        expect(w.terminal_mutation).toBeGreaterThan(w.attributed.last_seq!);
      }
      const changes = json<ChangesResult>(await d.sbx(['changes', '--key', `ws-${tag}`, '--json']));
      for (const ws of changes.workspaces) {
        const other = tag === 'A' ? 'B-' : 'A-';
        expect(ws.changes.filter((ch) => ch.path.startsWith(other) || ch.from?.startsWith(other))).toEqual([]);
        // Every file the shell itself made is there, in order of sequence.
        const created = ws.changes.filter((ch) => ch.kind === 'created').map((ch) => ch.path);
        for (const i of [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]) expect(created).toContain(`${tag}-${i}`);
        expect(ws.changes.map((ch) => ch.seq)).toEqual([...ws.changes.map((ch) => ch.seq)].sort((x, y) => x - y));
        expect(ws.terminal_mutation).toBe(r.workspace![changes.workspaces.indexOf(ws)].terminal_mutation);
      }
    }
    // The human form lists the same.
    const text = (await d.sbx(['changes', '--key', 'ws-A'])).stdout.toString();
    expect(text).toContain(`${paths[0]} (terminal_mutation ${ra.workspace![0].terminal_mutation}`);
    expect(text).toMatch(/created +A-1\n/);
    expect(text).not.toContain('B-');
    // The barriers were O_TMPFILE inodes, in the tmpfs mount's root too: nothing but the sessions' files in either workspace.
    for (const p of paths) expect(readdirSync(p).filter((n) => !/^[AB]-/.test(n))).toEqual([]);
  });

  it('an atomic save (write a temp file, rename it over) whose events the kernel merged: created, then renamed', async () => {
    const { d, paths } = await daemonWith((dir) => {
      mkdirSync(join(dir, 'ws'));
      return [join(dir, 'ws')];
    });
    const py = `import os, time; os.chdir(${JSON.stringify(paths[0])}); f = open("t.tmp", "w"); f.write("a"); f.close(); os.rename("t.tmp", "out"); time.sleep(0.2)`;
    expect((await d.sbx(['run', '--key', 'save', '--', 'python3', '-c', py])).status).toBe(0);
    const ws = json<ChangesResult>(await d.sbx(['changes', '--key', 'save', '--json'])).workspaces[0];
    expect(ws.changes.map((c) => [c.kind, c.from ?? null, c.path])).toEqual([
      ['created', null, 't.tmp'],
      ['modified', null, 't.tmp'],
      ['renamed', 't.tmp', 'out'],
    ]);
  });

  it('background children writing until the leaf is killed: terminal_mutation is after their last write; the next session is after it', async () => {
    const { d, paths } = await daemonWith((dir) => {
      mkdirSync(join(dir, 'ws'));
      return [join(dir, 'ws')];
    });
    const ws = paths[0];
    const r1 = await run(d, 'bg', `cd ${ws}; (while :; do echo x >> bg; done) & (while :; do echo y >> bg2; done) & sleep 0.3; exit 0`);
    const e1 = r1.workspace![0];
    expect(r1.descendants_terminated).toBe(2);
    expect(e1.gap).toBeNull();
    expect(e1.attributed.events).toBeGreaterThan(0);
    expect(e1.terminal_mutation).toBeGreaterThan(e1.attributed.last_seq!);
    const r2 = await run(d, 'after', `cd ${ws}; echo z >> bg; echo z > after; sleep 0.2`);
    const changes = json<ChangesResult>(await d.sbx(['changes', '--key', 'after', '--json']));
    const seqs = changes.workspaces[0].changes.map((ch) => ch.seq);
    expect(seqs.length).toBeGreaterThan(0);
    expect(Math.min(...seqs)).toBeGreaterThan(e1.terminal_mutation!);
    expect(r2.workspace![0].terminal_mutation).toBeGreaterThan(Math.max(...seqs));
  });
});

describe('nothing of the supervisor in a workspace', () => {
  it('a watched git repository stays clean through sessions, a checkpoint, a task close, a restore, a restart and git clean -fdx', async () => {
    const { d, paths } = await daemonWith((dir) => {
      const ws = join(dir, 'ws');
      mkdirSync(ws);
      expect(spawnSync('git', ['init', '-q', ws]).status).toBe(0);
      return [ws];
    });
    const ws = paths[0];
    const git = (dir: string, ...args: string[]) => {
      const r = spawnSync('git', ['-C', dir, '-c', 'user.name=t', '-c', 'user.email=t@example.invalid', ...args], { encoding: 'utf8' });
      expect(r.stderr).toBe('');
      expect(r.status).toBe(0);
      return r.stdout;
    };
    const clean = (dir = ws) => expect(git(dir, 'status', '--porcelain', '--untracked-files=all', '--ignored')).toBe('');
    const session = async (key: string, line: string, task: string[] = []) => {
      const r = await d.sbx([
        'run',
        '--key',
        key,
        ...task,
        '--',
        'sh',
        '-c',
        `cd ${ws} && echo ${line} >> f && git add f && git -c user.name=t -c user.email=t@example.invalid commit -qm ${line}`,
      ]);
      expect(r.status).toBe(0);
      const e = json<Receipt>(await d.sbx(['receipt', '--key', key])).workspace![0];
      expect(e.gap).toBeNull();
      expect(e.terminal_mutation).toBeGreaterThan(e.attributed.last_seq!);
      clean();
    };
    await session('one', 'one', ['--task', 'T']);
    const ck = await d.sbx(['checkpoint', '--workspace', ws, '--json']);
    expect(ck.status).toBe(0);
    clean();
    const closed = await d.sbx(['close', '--task', 'T', '--workspace', ws]);
    expect(closed.stderr.toString()).toBe('');
    expect(json<{ complete: boolean }>(closed).complete).toBe(true);
    clean();
    const restored = join(d.dir, 'restored');
    const r = await d.sbx(['restore', json<{ checkpoint_id: string }>(ck).checkpoint_id, restored, '--state-dir', d.stateDir, '--json']);
    expect(json<{ identical: boolean }>(r).identical).toBe(true);
    expect(readdirSync(restored).sort()).toEqual(['.git', 'f']);
    clean(restored);
    clean();
    await d.terminate();
    await d.start();
    clean();
    expect(git(ws, 'clean', '-fdx')).toBe('');
    await session('two', 'two');
    expect(git(ws, 'clean', '-fdxn')).toBe('');
    expect(readdirSync(ws).sort()).toEqual(['.git', 'f']);
  });
});

describe('gaps', () => {
  const scanned = (e: WorkspaceEntry, gap: string) => {
    expect(e.gap).toBe(gap);
    expect(e.terminal_mutation).toBeNull();
    expect(e.scan).not.toBeNull();
    expect(e.scan!.digest).toMatch(/^sha256:[0-9a-f]{64}$/);
  };

  it('an overlayfs without nfs_export: unsupported, and a scan at death that sees what was written', async () => {
    const { d, paths } = await daemonWith((dir) => {
      for (const sub of ['lower', 'upper', 'work']) mkdirSync(join(dir, sub));
      writeFileSync(join(dir, 'lower', 'base'), 'from the lower layer\n');
      mount(
        ['-t', 'overlay', 'overlay', '-o', `lowerdir=${join(dir, 'lower')},upperdir=${join(dir, 'upper')},workdir=${join(dir, 'work')}`],
        join(dir, 'merged'),
      );
      return [join(dir, 'merged')];
    });
    const status = json<StatusResult>(await d.sbx(['status', '--json']));
    expect(status.workspaces[0]).toMatchObject({ fs: 'overlay', mode: 'scan' });
    expect(status.workspaces[0].health).toMatch(/fanotify_mark: E(NOTSUP|OPNOTSUPP|XDEV)/);
    const r = await run(d, 'overlay', `printf 12345 > ${paths[0]}/new`);
    scanned(r.workspace![0], 'unsupported');
    // base and new (the supervisor's own directory is not scanned).
    expect(r.workspace![0].scan).toMatchObject({ entries: 2, bytes: 'from the lower layer\n'.length + 5 });
  });

  it('a supervisor without CAP_SYS_ADMIN: unsupported, with a scan', async () => {
    const { d, paths } = await daemonWith(
      (dir) => {
        mkdirSync(join(dir, 'ws'));
        return [join(dir, 'ws')];
      },
      { wrap: ['setpriv', '--inh-caps=-sys_admin', '--bounding-set=-sys_admin', '--'] },
    );
    const status = json<StatusResult>(await d.sbx(['status', '--json']));
    expect(status.workspaces[0]).toMatchObject({ mode: 'scan', health: expect.stringContaining('fanotify_init: EPERM') });
    const r = await run(d, 'nocap', `echo hi > ${paths[0]}/f`);
    scanned(r.workspace![0], 'unsupported');
    expect(r.workspace![0].scan).toMatchObject({ entries: 1, bytes: 3 });
  });

  it('no O_TMPFILE (test hook: every file system here has it): a barrier file in the state dir on the same file system; a workspace on another (a tmpfs mount) unsupported, with a scan', async () => {
    const { d, paths } = await daemonWith(
      (dir) => {
        mkdirSync(join(dir, 'ws'));
        mount(['-t', 'tmpfs', '-o', 'size=16m', 'tmpfs'], join(dir, 'tmpfs-ws'));
        return [join(dir, 'ws'), join(dir, 'tmpfs-ws')];
      },
      { env: { SBX_TEST_WATCH_NO_TMPFILE: '1' } },
    );
    const status = json<StatusResult>(await d.sbx(['status', '--json']));
    expect(status.workspaces.map((w) => [w.fs, w.mode])).toEqual([
      ['ext4', 'fanotify'],
      ['tmpfs', 'scan'],
    ]);
    expect(status.workspaces[0].health).toBe('ok');
    expect(status.workspaces[1].health).toBe(
      `no barrier: its file system (tmpfs) has no O_TMPFILE and the state dir ${d.stateDir} is on another file system (a barrier file there would not be seen)`,
    );
    for (const key of ['one', 'two']) {
      const r = await run(d, key, `for w in ${paths.join(' ')}; do echo ${key} > $w/${key}; done; sleep 0.2`);
      const [ext4, tmpfs] = r.workspace!;
      expect(ext4.gap).toBeNull();
      expect(ext4.attributed.last_path).toBe(key);
      expect(ext4.terminal_mutation).toBeGreaterThan(ext4.attributed.last_seq!);
      scanned(tmpfs, 'unsupported');
    }
    expect(readdirSync(join(d.stateDir, 'barriers'))).toEqual(['#0']);
    for (const p of paths) expect(readdirSync(p).sort()).toEqual(['one', 'two']);
  });

  /**
   * A daemon whose reader is held (test hook) while a session makes 20,000 files, then let go:
   * once the overflow is read the session ends, and its receipt has gap overflow with a scan.
   */
  async function overflowWhileHeld(env: NodeJS.ProcessEnv, config: Record<string, unknown> = {}) {
    const pause = rig.removeLater(join('/tmp', `sbx-test-ws-pause-${process.pid}-${Date.now()}`));
    const { d, paths } = await daemonWith(
      (dir) => {
        // On a tmpfs of its own: fanotify marks a whole file system, and other test files' writes
        // on /tmp's would be events here too, past a bound of 1,024 an overflow of their own.
        rig.mount(['-t', 'tmpfs', '-o', 'size=64m,mode=0755', 'tmpfs'], join(dir, 'ws'));
        return [join(dir, 'ws')];
      },
      { env: { ...env, SBX_TEST_WATCH_PAUSE_FILE: pause }, config },
    );
    writeFileSync(pause, '');
    const go = join(d.dir, 'go');
    expect(spawnSync('mkfifo', [go]).status).toBe(0);
    const c = await d.client();
    // Held before the first file is made: on a loaded machine the hook takes a while to take hold,
    // and events read meanwhile would leave the queue short of its overflow.
    await until(async () => (await c.status()).workspaces[0].health.includes('reader paused'), 'the reader to be held');
    const { session_id } = await c.launch({
      argv: ['sh', '-c', `cd ${paths[0]}; i=0; while [ $i -lt 20000 ]; do : > f$i; i=$((i+1)); done; read x < ${go}`],
      cwd: '/',
    });
    await until(() => readdirSync(paths[0]).length >= 20000, 'the 20,000 files', 60_000);
    rmSync(pause);
    await until(async () => (await c.status()).workspaces[0].health.includes('overflowed'), 'the overflow to be read');
    writeFileSync(go, 'go\n');
    const r = await c.wait({ session_id });
    scanned(r.workspace![0], 'overflow');
    expect(r.workspace![0].scan!.entries).toBe(20000);
    return { d, c, paths };
  }

  it('a queue overflow (bounded queue, reader held): gap overflow with a scan', async () => {
    await overflowWhileHeld({ SBX_TEST_WATCH_LIMITED_QUEUE: '1' });
  });

  it('events past workspace.maxQueuedEvents (the kernel queue unlimited, the reader held then let go): read and dropped, gap overflow with a scan, counted; the next session has no gap', async () => {
    const { d, c, paths } = await overflowWhileHeld({}, { maxQueuedEvents: 1024 });
    // Said and counted: the supervisor's bound, not the kernel's queue.
    expect(d.log()).toContain('workspace.maxQueuedEvents');
    const status = await c.status();
    expect(status.workspaces[0].events).toBeLessThan(20_000); // handled: fewer than the files made, the rest dropped
    // Every event of the flood read (dropped or handled) before the session below: on a loaded
    // machine the reader may still be dropping the flood's tail when the first session's receipt
    // is out (an overflow's receipt does not wait for its barrier). Sessions are run until one's
    // barrier round comes back with no gap.
    let drains = 0;
    await until(async () => (await run(d, `drain-${drains++}`, 'true')).workspace![0].gap === null, 'a session with no gap once the flood is read', 60_000);
    // Handled down to the bound again: a session after it is ordered by its barrier, no gap.
    const after = await run(d, 'after', `echo after > ${paths[0]}/after; sleep 0.2`);
    expect(after.workspace![0].gap).toBeNull();
    expect(after.workspace![0].attributed.last_path).toBe('after');
  });

  it('a restart: a new epoch; a session reconciled after it has gap listener_restart and a scan', async () => {
    const { d, paths } = await daemonWith((dir) => {
      mkdirSync(join(dir, 'ws'));
      return [join(dir, 'ws')];
    });
    const before = json<StatusResult>(await d.sbx(['status', '--json'])).workspaces[0].epoch;
    const c = await d.client();
    const { session_id } = await c.launch({ argv: ['sh', '-c', `echo one > ${paths[0]}/one; sleep 60`], cwd: '/', grace_ms: 100 });
    await until(() => readdirSync(paths[0]).includes('one'), 'the first write');
    await d.kill9();
    await d.start();
    const after = json<StatusResult>(await d.sbx(['status', '--json'])).workspaces[0].epoch;
    expect(after).not.toBe(before);
    const r = json<Receipt>(await d.sbx(['wait', session_id]));
    expect(r.outcome).toBe('owner_lost');
    scanned(r.workspace![0], 'listener_restart');
    expect(r.workspace![0]).toMatchObject({ epoch: after, scan: { entries: 1, bytes: 4 } });
  });
});

describe('start-up checks', () => {
  it('refuses a workspace that does not exist, that holds the state dir, or inside another', async () => {
    const nest = join('/tmp', `sbx-test-ws-nest-${process.pid}`);
    mkdirSync(join(nest, 'inner'), { recursive: true });
    for (const [paths, message] of [
      [['/nonexistent-sbx-ws'], 'workspace /nonexistent-sbx-ws: does not exist'],
      [['/tmp'], 'is inside workspace /tmp'],
      [[nest, join(nest, 'inner')], `workspace ${join(nest, 'inner')} is inside workspace ${nest}`],
    ] as const) {
      const d = new TestDaemon({ cgroupPrefix: 'sbx-test-ws-', config: { workspace: { paths } } });
      rig.track(d);
      await expect(d.start()).rejects.toThrow(message);
    }
    rmSync(nest, { recursive: true });
  });
});
