// Who wrote what, with writers that exit at once (issue 33): the reader held (test hook) while
// each edit runs and exits, so its events are read only after it exited; kept a zombie by the
// supervisor (workspace.holdExited) its pidfd still names its cgroup, so each session's events
// are its own; off, they are unattributed (counted, never guessed). And every event counted
// whatever became of its directory: a tree deleted before any of its events is read is named by
// its deletes (FAN_REPORT_TARGET_FID), nothing unplaced.
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import type { ChangesResult, Receipt, StatusResult } from '../../ipc/protocol.js';
import { until, zombieChildren } from '../helpers/daemon.js';
import { json, WorkspaceRig } from '../helpers/workspace.js';

const rig = new WorkspaceRig();
afterEach(() => rig.cleanup());

/** The edits agents make most, each run as its session's leader (sh execs it), with the path its changes must name. */
const EDITS: { script: string; setup?: string; path: string }[] = [
  { setup: 'a\n', script: 'exec sed -i s/a/b/ f', path: 'f' },
  { setup: 'm\n', script: 'exec mv f g', path: 'g' },
  { setup: 'c\n', script: 'exec cp f h', path: 'h' },
  { script: 'echo x >> f', path: 'f' },
  { script: 'echo y > f', path: 'f' },
  { script: `exec python3 -c "open('f', 'w').write('p')"`, path: 'f' },
  { script: 'exec touch f', path: 'f' },
  { setup: 'r\n', script: 'exec rm f', path: 'f' },
  { script: 'exec mkdir d', path: 'd' },
  { script: 'exec ln -s target f', path: 'f' },
];

/** A daemon watching <dir>/ws whose reader the test can hold, and the held-reader helpers. */
async function held(config: Record<string, unknown> = {}) {
  const pause = rig.removeLater(join('/tmp', `sbx-test-attr-pause-${process.pid}-${Date.now()}`));
  // The receipts wait for their barrier while the reader is held: long enough for the test.
  // The workspace on a tmpfs of its own (with room beside it for a directory moved out): the
  // watcher marks whole file systems (fanotify FAN_MARK_FILESYSTEM), and on the shared one
  // another test file's directories, made and removed while this reader is held, would be
  // counted unplaced here (4 in a CI run of stop 69).
  let fs = '';
  const { d, paths } = await rig.daemon(
    (dir) => {
      fs = join(dir, 'fs');
      rig.mount(['-t', 'tmpfs', '-o', 'size=64m,mode=0755', 'tmpfs'], fs);
      mkdirSync(join(fs, 'ws'));
      return [join(fs, 'ws')];
    },
    { env: { SBX_TEST_WATCH_PAUSE_FILE: pause }, config: { barrierTimeoutMs: 60_000, ...config } },
  );
  const c = await d.client();
  const health = async () => (await c.status()).workspaces[0].health;
  return {
    d,
    c,
    ws: paths[0],
    /** The workspace's file system's root: a directory there is outside the workspace, on its file system. */
    fs,
    hold: async () => {
      writeFileSync(pause, '');
      await until(async () => (await health()).includes('paused'), 'the reader to be held');
    },
    release: async () => {
      rmSync(pause);
      await until(async () => !(await health()).includes('paused'), 'the reader to read again');
    },
  };
}

/** Launches each edit in a directory of its own (made and set up before the reader is held), returns their session ids. */
async function launchEdits(
  h: Awaited<ReturnType<typeof held>>,
  rounds: number,
): Promise<{ edits: { id: string; dir: string; path: string }[]; unattributedBefore: number }> {
  const out: { id: string; dir: string; path: string }[] = [];
  for (let r = 0; r < rounds; r++) {
    for (const [i, e] of EDITS.entries()) {
      const dir = join(h.ws, `e${r}-${i}`);
      mkdirSync(dir);
      if (e.setup !== undefined) writeFileSync(join(dir, 'f'), e.setup);
      out.push({ id: '', dir, path: `e${r}-${i}/${e.path}` });
    }
  }
  // The setup's own events are read before the reader is held (a session's barrier orders them).
  await h.c.wait({ session_id: (await h.c.launch({ argv: ['true'], cwd: '/' })).session_id });
  const unattributedBefore = (await h.c.status()).workspaces[0].unattributed_events;
  await h.hold();
  for (const [k, o] of out.entries()) {
    const e = EDITS[k % EDITS.length];
    o.id = (await h.c.launch({ argv: ['sh', '-c', e.script], cwd: o.dir, linger: 'kill' })).session_id;
  }
  return { edits: out, unattributedBefore };
}

describe('writers that exit at once', () => {
  it('twenty edits (sed -i, mv, cp, echo >>, python3, touch, rm, mkdir, ln -s), read only after each exited: every event attributed to its own session, none to another, and changes names the file', async () => {
    const h = await held();
    const { edits, unattributedBefore } = await launchEdits(h, 2);
    // Every leader has exited: each is held a zombie by the supervisor until the reader reads past it.
    await until(() => zombieChildren(h.d.pid).length >= edits.length, `${edits.length} exited leaders held as zombies`, 20_000);
    await h.release();
    for (const e of edits) {
      const r = await h.c.wait({ session_id: e.id });
      expect(r.exit.code, `${e.path}: ${JSON.stringify(r.exit)}`).toBe(0);
      const w = r.workspace![0];
      expect(w.gap).toBeNull();
      expect(w.unattributed_events, `${e.path}: unattributed`).toBe(0);
      expect(w.attributed.events, `${e.path}: attributed`).toBeGreaterThan(0);
      const changes = (await h.c.request('changes', { session_id: e.id })) as ChangesResult;
      const paths = changes.workspaces[0].changes.map((ch) => ch.path);
      expect(paths, e.path).toContain(e.path);
      // Only its own directory: nothing of another session's.
      const own = e.path.split('/')[0];
      expect(
        paths.filter((p) => p.split('/')[0] !== own),
        e.path,
      ).toEqual([]);
    }
    expect(zombieChildren(h.d.pid)).toEqual([]);
    const status = (await h.c.status()) as StatusResult;
    // The test's own setup writes were unattributed before; nothing since.
    expect(status.workspaces[0].unattributed_events).toBe(unattributedBefore);
    expect(status.workspace_unplaced_events).toBe(0);
  });

  it('with workspace.holdExited off the same writers are reaped before the read: counted as unattributed, never guessed', async () => {
    const h = await held({ holdExited: false });
    const { edits, unattributedBefore } = await launchEdits(h, 1);
    // Reaped at once: no zombie; the cgroups empty, so the sessions wait only for their barrier.
    await until(
      async () =>
        (await h.c.request('ps', {})).sessions.filter((s) => edits.some((e) => e.id === s.session_id) && s.started_at !== null && s.live_pids === 0).length ===
        edits.length,
      'every leader to exit',
      20_000,
    );
    // A leader leaves its cgroup as it exits, before the supervisor's SIGCHLD reaps it: polled (CI saw one zombie between the two).
    await until(() => zombieChildren(h.d.pid).length === 0, 'no zombie: each leader reaped at once (holdExited off)', 5000);
    await h.release();
    const receipts = [];
    for (const e of edits) {
      const r = await h.c.wait({ session_id: e.id });
      expect(r.workspace![0].attributed.events, e.path).toBe(0);
      expect(((await h.c.request('changes', { session_id: e.id })) as ChangesResult).workspaces[0].changes).toEqual([]);
      receipts.push(r);
    }
    // Each was alive (waiting for its barrier) while all of them were read: each counts them all.
    const counted = ((await h.c.status()) as StatusResult).workspaces[0].unattributed_events - unattributedBefore;
    expect(counted).toBeGreaterThanOrEqual(edits.length);
    for (const r of receipts) expect(r.workspace![0].unattributed_events).toBe(counted);
  });

  it('sbx changes of a sed -i session names the file (the README example)', async () => {
    const h = await held();
    writeFileSync(join(h.ws, 'notes.txt'), 'draft\n');
    await h.c.wait({ session_id: (await h.c.launch({ argv: ['true'], cwd: '/' })).session_id });
    const r = await h.d.sbx(['run', '--key', 'sed', '-q', '--', 'sed', '-i', 's/draft/final/', join(h.ws, 'notes.txt')]);
    expect(r.status).toBe(0);
    const text = (await h.d.sbx(['changes', '--key', 'sed'])).stdout.toString();
    // sed -i writes a temporary file and renames it over the original.
    expect(text).toMatch(/ renamed +sed\S+ -> notes\.txt\n/);
  });

  it('a file written, then other changes, then renamed over: one rename in sbx changes, where it happened', async () => {
    const h = await held();
    const script = "import os\nf = open('x.tmp', 'w'); f.write('1'); f.close()\nos.mkdir('xdir'); open('xdir/y', 'w').close()\nos.rename('x.tmp', 'x')\n";
    const { session_id } = await h.c.launch({ argv: ['python3', '-c', script], cwd: h.ws, linger: 'kill' });
    await h.c.wait({ session_id });
    const changes = ((await h.c.request('changes', { session_id })) as ChangesResult).workspaces[0].changes;
    const renames = changes.filter((ch) => ch.kind.startsWith('renamed'));
    expect(renames.map((ch) => [ch.kind, ch.from ?? null, ch.path])).toEqual([['renamed', 'x.tmp', 'x']]);
    // After xdir/y: in the order it happened.
    expect(changes.findIndex((ch) => ch.kind === 'renamed')).toBeGreaterThan(changes.findIndex((ch) => ch.path === 'xdir/y'));
  });
});

describe('every event counted, whatever became of its directory', () => {
  it('a tree made and deleted (rm -rf) while the reader is held: each event named by its path, from the deletes that name its directories; nothing unplaced', async () => {
    const h = await held();
    await h.hold();
    // One process makes the tree and deletes it (rm -rf's order: each directory's entries, then it).
    const script =
      "import os, shutil\nos.makedirs('tree/a/b')\nfor i in range(1, 11):\n  open(f'tree/a/b/f{i}', 'w').write(str(i))\n  open(f'tree/a/g{i}', 'w').write(str(i))\nshutil.rmtree('tree')\n";
    const { session_id } = await h.c.launch({ argv: ['python3', '-c', script], cwd: h.ws, linger: 'kill' });
    await until(
      async () => (await h.c.request('ps', {})).sessions.some((s) => s.session_id === session_id && s.started_at !== null && s.live_pids === 0),
      'the script to exit',
      20_000,
    );
    await h.release();
    const r: Receipt = await h.c.wait({ session_id });
    expect(r.exit.code).toBe(0);
    expect(r.workspace![0].unattributed_events).toBe(0);
    const changes = ((await h.c.request('changes', { session_id })) as ChangesResult).workspaces[0].changes;
    const kinds = (path: string) => changes.filter((ch) => ch.path === path).map((ch) => ch.kind);
    for (let i = 1; i <= 10; i++) {
      for (const p of [`tree/a/b/f${i}`, `tree/a/g${i}`]) {
        expect(kinds(p), p).toContain('created');
        expect(kinds(p), p).toContain('deleted');
      }
    }
    for (const dir of ['tree', 'tree/a', 'tree/a/b']) expect(kinds(dir), dir).toEqual(expect.arrayContaining(['created', 'deleted']));
    expect(
      changes.every((ch) => ch.path.startsWith('tree')),
      JSON.stringify(changes.filter((ch) => !ch.path.startsWith('tree'))),
    ).toBe(true);
    expect(((await h.c.status()) as StatusResult).workspace_unplaced_events).toBe(0);
    expect(json<StatusResult>(await h.d.sbx(['status', '--json'])).workspace_unplaced_events).toBe(0);
  });

  it('directories moved before their events are read: each event where its directory was then (not where it went), also one moved out of the workspace', async () => {
    const h = await held();
    const outside = join(h.fs, 'outside');
    mkdirSync(outside);
    await h.hold();
    const script = [
      'import os',
      "os.makedirs('t2/a')",
      "for i in range(10): open(f't2/a/g{i}', 'w').write('g')",
      "os.rename('t2', 't3')",
      "os.mkdir('tree')",
      "for i in range(10): open(f'tree/f{i}', 'w').write('f')",
      `os.rename('tree', ${JSON.stringify(join(outside, 'tree'))})`,
      "open('t3/a/after', 'w').write('a')",
      '',
    ].join('\n');
    const { session_id } = await h.c.launch({ argv: ['python3', '-c', script], cwd: h.ws, linger: 'kill' });
    await until(
      async () => (await h.c.request('ps', {})).sessions.some((s) => s.session_id === session_id && s.started_at !== null && s.live_pids === 0),
      'the script to exit',
      20_000,
    );
    await h.release();
    expect((await h.c.wait({ session_id })).exit.code).toBe(0);
    const changes = ((await h.c.request('changes', { session_id })) as ChangesResult).workspaces[0].changes;
    const paths = (kind: string) => changes.filter((ch) => ch.kind === kind).map((ch) => ch.path);
    const created = paths('created');
    for (let i = 0; i < 10; i++) {
      expect(created, `t2/a/g${i}`).toContain(`t2/a/g${i}`);
      expect(created, `tree/f${i}`).toContain(`tree/f${i}`);
    }
    expect(created).toContain('t3/a/after');
    // Never a path that did not exist when its event was queued.
    expect(created.filter((p) => p.startsWith('t3/') && p !== 't3/a/after')).toEqual([]);
    expect(changes.filter((ch) => ch.kind === 'renamed').map((ch) => [ch.from, ch.path])).toEqual([['t2', 't3']]);
    expect(paths('renamed_from')).toEqual(['tree']);
    expect(((await h.c.status()) as StatusResult).workspace_unplaced_events).toBe(0);
  });
});
