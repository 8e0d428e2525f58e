// Attacks on checkpoints (issue 18) that the implementation does not withstand yet: each test
// states what docs/guide/checkpoints.md "Checkpoints" promises and fails on the code as it is. A link planted
// during a restore is chmod'ed through; a store directory moved while the supervisor runs
// splits a "published" checkpoint across two directories; a directory in the store's tmp/
// stops the supervisor from starting; a failed checkpoint keeps the state dir full (sessions
// lose output, admission is refused); the scan deadline does not bound a big file; a file
// written through mmap is claimed consistent with bytes it no longer holds; a link swapped for
// a file fails the whole checkpoint (readlink EINVAL); the capture's object-directory fds make
// it fail EMFILE under a modest fd limit. Helpers in C (inotify, mmap) are compiled here with cc.
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chmodSync, chownSync, existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { CheckpointResult } from '../../ipc/protocol.js';
import { sha256, TestDaemon, until } from '../helpers/daemon.js';
import { json } from '../helpers/workspace.js';
import { Helper } from '../helpers/child.js';
import { storedManifest } from '../helpers/manifest.js';

const NOBODY = 65534;
const HAVE_CC = spawnSync('cc', ['--version']).status === 0;
const HAVE_SETPRIV = spawnSync('setpriv', ['--version']).status === 0;

/** A scratch directory every test's helpers and files go in (0755, so `nobody` can reach into it). */
const scratch = mkdtempSync(join(tmpdir(), 'sbx-ck-break-'));
chmodSync(scratch, 0o755);

const SWAP_C = String.raw`
#include <sys/inotify.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <limits.h>
// swap DIR LNKDIR VICTIM PREFIX: for each name created in DIR starting with PREFIX, rename a
// fresh symlink to VICTIM over it (atomically). Prints "ready" once watching.
int main(int argc, char **argv) {
  const char *dir = argv[1], *lnkdir = argv[2], *victim = argv[3], *prefix = argv[4];
  int in = inotify_init();
  if (in < 0 || inotify_add_watch(in, dir, IN_CREATE) < 0) { perror("inotify"); return 1; }
  printf("ready\n"); fflush(stdout);
  char buf[65536] __attribute__((aligned(8)));
  unsigned long n = 0;
  for (;;) {
    ssize_t len = read(in, buf, sizeof buf);
    if (len <= 0) return 0;
    for (char *p = buf; p < buf + len;) {
      struct inotify_event *ev = (struct inotify_event *)p;
      if (ev->len && strncmp(ev->name, prefix, strlen(prefix)) == 0) {
        char l[PATH_MAX], t[PATH_MAX];
        snprintf(l, sizeof l, "%s/l%lu", lnkdir, n++);
        snprintf(t, sizeof t, "%s/%s", dir, ev->name);
        if (symlink(victim, l) != 0 || rename(l, t) != 0) unlink(l);
      }
      p += sizeof *ev + ev->len;
    }
  }
}`;

const MMAPW_C = String.raw`
#include <sys/inotify.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
// mmapw FILE SIZE: FILE := SIZE bytes of 'A' through a shared mapping; at the first read of it
// by anyone (IN_ACCESS) overwrite it with 'B' through the same mapping (no write(2), no new
// page fault: no timestamp changes), print "swapped", then wait for stdin to close.
int main(int argc, char **argv) {
  size_t size = strtoul(argv[2], 0, 10);
  int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || ftruncate(fd, size) < 0) { perror("open"); return 1; }
  char *m = mmap(0, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) { perror("mmap"); return 1; }
  memset(m, 'A', size);
  int in = inotify_init();
  if (in < 0 || inotify_add_watch(in, argv[1], IN_ACCESS) < 0) { perror("inotify"); return 1; }
  printf("ready\n"); fflush(stdout);
  char buf[4096];
  if (read(in, buf, sizeof buf) <= 0) return 1;
  memset(m, 'B', size);
  printf("swapped\n"); fflush(stdout);
  while (read(0, buf, sizeof buf) > 0) {}
  return 0;
}`;

function compile(name: string, source: string): string {
  const src = join(scratch, `${name}.c`);
  const bin = join(scratch, name);
  writeFileSync(src, source);
  const r = spawnSync('cc', ['-O2', '-o', bin, src]);
  if (r.status !== 0) throw new Error(`cc ${name}: ${r.stderr}`);
  return bin;
}

async function checkpointJson(d: TestDaemon, ws: string): Promise<{ status: number | null; result: CheckpointResult | null; stderr: string }> {
  const r = await d.sbx(['checkpoint', '--workspace', ws, '--json']);
  return { status: r.status, result: r.status === 0 || r.status === 1 ? json<CheckpointResult>(r) : null, stderr: r.stderr.toString() };
}

function mountTmpfs(dir: string, size: string): void {
  mkdirSync(dir, { recursive: true });
  const r = spawnSync('mount', ['-t', 'tmpfs', '-o', `size=${size},mode=0700`, 'tmpfs', dir]);
  if (r.status !== 0) throw new Error(`mount tmpfs ${dir}: ${r.stderr}`);
}

function umount(dir: string): void {
  if (spawnSync('mountpoint', ['-q', dir]).status === 0) spawnSync('umount', [dir]);
}

afterAll(() => {
  rmSync(scratch, { recursive: true, force: true });
});

describe.skipIf(!HAVE_CC || !HAVE_SETPRIV)('restore: a link planted over a fifo just made is never followed', () => {
  let d: TestDaemon;
  let swap: Helper | null = null;

  beforeAll(async () => {
    d = await new TestDaemon().start();
  });

  afterAll(async () => {
    await swap?.stop();
    await d.stop();
  });

  it('root restoring into a directory another user can write never chmods the file a planted link names', async () => {
    // The workspace: 200 fifos, the first set-user-ID and set-group-ID, mode 06777.
    const ws = join(d.dir, 'ws');
    mkdirSync(ws);
    for (let i = 0; i < 200; i++) expect(spawnSync('mkfifo', ['-m', '666', join(ws, `p${String(i).padStart(3, '0')}`)]).status).toBe(0);
    chmodSync(join(ws, 'p000'), 0o6777);
    const ck = await checkpointJson(d, ws);
    expect(ck.status).toBe(0);
    // An empty target owned by nobody (as `mktemp -d` by another user would leave it), and
    // nobody's process planting, by rename(2), a link to a root-owned file over each fifo as
    // soon as it appears.
    const bin = compile('swap', SWAP_C);
    const links = join(scratch, 'links');
    const victim = join(scratch, 'victim');
    mkdirSync(links);
    chownSync(links, NOBODY, NOBODY);
    writeFileSync(victim, 'root only\n', { mode: 0o600 });
    chmodSync(victim, 0o600);
    // The race is the planter's to win or lose: up to 10 restores, each into a fresh target.
    let st = statSync(victim);
    for (let attempt = 0; attempt < 10 && (st.mode & 0o7777) === 0o600; attempt++) {
      const target = join(scratch, `target${attempt}`);
      mkdirSync(target);
      chownSync(target, NOBODY, NOBODY);
      swap = new Helper(['setpriv', `--reuid=${NOBODY}`, `--regid=${NOBODY}`, '--clear-groups', bin, target, links, victim, 'p']);
      await until(() => swap!.out.includes('ready'), 'the planting process');
      await d.sbx(['restore', ck.result!.checkpoint_id, target, '--state-dir', d.stateDir]);
      await swap.stop();
      st = statSync(victim);
    }
    // docs/guide/checkpoints.md: "so a link planted in DIR is never followed". The victim keeps root's 0600
    // (today: 6777 or 666, the fifos' modes, chmod(2) by name after mknod follows the link).
    expect({ mode: (st.mode & 0o7777).toString(8), uid: st.uid }).toEqual({ mode: '600', uid: 0 });
  });
});

describe('the store: moved, or holding a directory where files go', () => {
  let d: TestDaemon;
  let ws: string;

  beforeAll(async () => {
    d = await new TestDaemon().start();
    ws = join(d.dir, 'ws');
    mkdirSync(ws);
    writeFileSync(join(ws, 'f'), 'hello\n');
  });

  afterAll(() => d.stop());

  it('sbx gc succeeds with a directory in the store tmp/', async () => {
    const tmp = join(d.stateDir, 'checkpoints', 'tmp');
    mkdirSync(join(tmp, 'a-dir'), { recursive: true });
    const r = await d.sbx(['gc']);
    rmSync(join(tmp, 'a-dir'), { recursive: true, force: true });
    expect(r.stderr.toString()).toBe(''); // today: INTERNAL: EISDIR ... unlink '/proc/self/fd/N/a-dir'
    expect(r.status).toBe(0);
  });

  it('the supervisor starts with a directory in the store tmp/ (sbx restore ID <store>/tmp/x leaves one)', async () => {
    const tmp = join(d.stateDir, 'checkpoints', 'tmp');
    await d.terminate();
    mkdirSync(join(tmp, 'restored-here'), { recursive: true });
    writeFileSync(join(tmp, 'restored-here', 'f'), 'x');
    let startError = '';
    try {
      // recover() runs before the socket listens: today it throws EISDIR and the process exits.
      await d.start().catch((err: Error) => (startError = err.message.split('\n').find((l) => l.includes('EISDIR')) ?? err.message));
    } finally {
      rmSync(join(tmp, 'restored-here'), { recursive: true, force: true });
    }
    expect(startError).toBe('');
    expect((await d.sbx(['status'])).status).toBe(0);
  });

  it('a checkpoint answered as published after the store directory was moved away is restorable from the store the supervisor names', async () => {
    const store = join(d.stateDir, 'checkpoints');
    if ((await d.sbx(['status'])).status !== 0) await d.start(); // the test before may leave it stopped
    expect((await checkpointJson(d, ws)).status).toBe(0); // the store is open now
    renameSync(store, `${store}.old`); // an operator moves it aside (to free space, to back it up)
    writeFileSync(join(ws, 'f'), 'changed\n');
    const ck = await checkpointJson(d, ws);
    if (ck.status === 0) {
      // Published: then it must be restorable (docs/guide/checkpoints.md: "the tree ... restorable byte for byte anywhere").
      // Today its objects went to the new checkpoints/ (the capture thread opens the path), its
      // manifest and published record to checkpoints.old/ (the main thread's cached fds).
      const r = await d.sbx(['restore', ck.result!.checkpoint_id, join(d.dir, 'restored'), '--state-dir', d.stateDir]);
      expect(r.stderr.toString()).toBe('');
      expect(r.status).toBe(0);
    }
  });
});

describe('a checkpoint bigger than the state dir has room for', () => {
  let d: TestDaemon;
  let ws: string;

  beforeAll(async () => {
    d = new TestDaemon();
    mountTmpfs(d.stateDir, '24m');
    await d.start();
    ws = join(d.dir, 'ws');
    mkdirSync(ws);
    // 40 MiB in 640 files of 64 KiB of random bytes: more than the 24 MiB state dir holds.
    for (let i = 0; i < 640; i++) writeFileSync(join(ws, `f${String(i).padStart(3, '0')}`), randomBytes(64 << 10));
  });

  afterAll(async () => {
    await d.terminate();
    umount(d.stateDir);
    await d.stop();
  });

  it('fails, and leaves the supervisor able to store a session output and admit the next session', async () => {
    const marker = join(d.dir, 'checkpoint-done');
    const c = await d.client();
    // A session writing a line every 20 ms until the checkpoint has ended, then 350 KB.
    const script = `i=0; while [ ! -e ${marker} ]; do i=$((i+1)); echo line $i; sleep 0.02; done; head -c 262144 /dev/urandom | base64`;
    const s = await c.launch({ argv: ['sh', '-c', script], cwd: '/', invocation_key: 'writer' });
    const ck = await d.sbx(['checkpoint', '--workspace', ws]);
    writeFileSync(marker, '');
    expect(ck.status).toBe(125); // it cannot fit: fine
    const waited = await d.sbx(['wait', s.session_id, '--json']);
    // The session's output is whole (today: incomplete, disk_full: the failed checkpoint's
    // objects fill the state dir and stay until someone runs sbx gc).
    const out = json<{ output: { stdout: { complete: boolean; reason: string | null; dropped_bytes: number } } }>(waited).output.stdout;
    expect({ complete: out.complete, reason: out.reason, dropped_bytes: out.dropped_bytes }).toEqual({ complete: true, reason: null, dropped_bytes: 0 });
    // And the next launch is admitted (today: ADMISSION_DENIED disk low).
    const next = await c.launch({ argv: ['true'], cwd: '/' }).then(
      () => 'admitted',
      (err: { code?: string; message?: string }) => `${err.code}: ${err.message}`,
    );
    expect(next).toBe('admitted');
  });
});

describe('the scan deadline', () => {
  let d: TestDaemon;
  let ws: string;

  beforeAll(async () => {
    d = new TestDaemon({ config: { checkpoint: { deadlineMs: 1000 } } });
    // Room for the sparse file counted whole (a checkpoint counts a file at its size before it
    // reads it: issue 34), on a tmpfs so that nothing is written to the disk; the deadline ends
    // the read long before anything of it is stored.
    mountTmpfs(d.stateDir, '9g');
    await d.start();
    ws = join(d.dir, 'ws');
    mkdirSync(ws);
    // 8 GiB of holes: no disk used, seconds of reading and hashing.
    expect(spawnSync('truncate', ['-s', '8G', join(ws, 'sparse')]).status).toBe(0);
  });

  afterAll(async () => {
    await d.terminate();
    umount(d.stateDir);
    await d.stop();
  });

  it('bounds a checkpoint whose one file takes longer than checkpoint.deadlineMs to read: it fails scan_timeout', async () => {
    const ck = await d.sbx(['checkpoint', '--workspace', ws]);
    expect(ck.status).toBe(125);
    // Today: ENOSPC after the whole 8 GiB was hashed (the deadline is checked only between
    // entries of the walk), so one big or sparse file holds every other checkpoint and gc.
    expect(ck.stderr.toString()).toContain('scan_timeout');
  });
});

describe.skipIf(!HAVE_CC)('consistency: a file written through a shared mapping, with checkpoint.verifyContent', () => {
  let d: TestDaemon;
  let mm: Helper | null = null;

  beforeAll(async () => {
    // Without verifyContent the passes compare stats, which a store through a mapping (its
    // pages still dirty) does not move: docs/guide/checkpoints.md says so. With it, they compare content.
    d = await new TestDaemon({ config: { checkpoint: { verifyContent: true } } }).start();
  });

  afterAll(async () => {
    mm?.child.stdin?.end();
    await mm?.stop();
    await d.stop();
  });

  it('is never claimed consistent with bytes it did not hold at the instant between the passes', async () => {
    const ws = join(d.dir, 'ws');
    mkdirSync(join(ws, 'z'), { recursive: true });
    // 3,000 files after "a" in walk order: the second pass begins well after "a" was read.
    for (let i = 0; i < 3000; i++) writeFileSync(join(ws, 'z', `f${i}`), `${i}\n`);
    const size = 65536;
    mm = new Helper([compile('mmapw', MMAPW_C), join(ws, 'a'), String(size)]);
    await until(() => mm!.out.includes('ready'), 'the mapping writer');
    const ck = await checkpointJson(d, ws);
    expect(mm.out).toContain('swapped'); // it read 'A's, and right after, the file became 'B's
    const final = readFileSync(join(ws, 'a'));
    expect(final.equals(Buffer.alloc(size, 'B'))).toBe(true);
    const manifest = storedManifest(join(d.stateDir, 'checkpoints'), ck.result!.checkpoint_id);
    const a = manifest.entries.find((e: { path?: string }) => e.path === 'a');
    // docs/guide/checkpoints.md: "the tree was exactly what was captured at the instant between the last two
    // passes". The file held 'B's from before the second pass began; today the manifest says
    // consistent with the 'A's (mmap stores change no timestamp, so the stat pass sees nothing).
    const recorded = a.sha256 === sha256(final) ? 'final bytes' : a.sha256 === sha256(Buffer.alloc(size, 'A')) ? 'stale bytes' : 'other';
    expect(manifest.consistent && recorded === 'stale bytes' ? `consistent: ${manifest.consistent}, ${recorded} (the 'A's)` : 'ok').toBe('ok');
  });
});

describe('a workspace whose names keep changing type', () => {
  let d: TestDaemon;
  let flipper: Helper | null = null;

  beforeAll(async () => {
    d = await new TestDaemon().start();
  });

  afterAll(async () => {
    await flipper?.stop();
    await d.stop();
  });

  it('a symlink replaced by a file between lstat and readlink makes paths unstable, never a failed checkpoint', async () => {
    const ws = join(d.dir, 'ws');
    mkdirSync(join(ws, '.t'), { recursive: true });
    // 200 names, each replaced (rename(2)) by a symlink, then by a file, then a symlink...
    const py = `import os,sys
ws=sys.argv[1]; n=0
while True:
    t=f'{ws}/.t/{n}'
    if n//200%2==0: os.symlink('target', t)
    else: open(t,'w').close()
    os.rename(t, f'{ws}/l{n%200}'); n+=1`;
    flipper = new Helper(['python3', '-c', py, ws]);
    await until(() => existsSync(join(ws, 'l199')), 'the flipping names');
    const failures: string[] = [];
    for (let i = 0; i < 30 && failures.length === 0; i++) {
      const ck = await checkpointJson(d, ws);
      if (ck.status !== 0 && ck.status !== 1) failures.push(ck.stderr); // today: EINVAL: readlink of lNN ... failed
    }
    expect(failures).toEqual([]);
  }, 120_000);
});

describe('names swapped between types (renameat2 RENAME_EXCHANGE) while checkpoints run', () => {
  let plain: TestDaemon;
  let watched: TestDaemon;
  let swapper: Helper | null = null;
  const wsOf = (d: TestDaemon) => join(d.dir, 'ws');

  beforeAll(async () => {
    plain = await new TestDaemon().start();
    watched = new TestDaemon();
    mkdirSync(wsOf(watched));
    watched.withConfig({ workspace: { paths: [wsOf(watched)] } });
    await watched.start();
  });

  afterAll(async () => {
    await swapper?.stop();
    await plain.stop();
    await watched.stop();
  });

  // Each name is, by turns, a file, a directory, a fifo and a symlink, swapped in one step: the
  // walk's lstat and the capture's open (or readlink) may each see another type. Found by the
  // breaker of the workspace journal: EISDIR and ESPIPE (a file opened, a directory or fifo
  // read), ENOTDIR (a directory swapped out and back), EINVAL (a readlink in the journal's look).
  it.each([
    ['an unwatched directory (the walk alone)', () => plain],
    ['a watched workspace with a stat cache (the journal looks first)', () => watched],
  ])(
    '%s: never a failed checkpoint',
    async (_what, daemon) => {
      const d = daemon();
      const ws = wsOf(d);
      mkdirSync(ws, { recursive: true });
      const py = `import ctypes,os,sys
libc=ctypes.CDLL(None,use_errno=True)
ws=sys.argv[1]
for i in range(20):
    os.makedirs(f'{ws}/.alt{i}/d', exist_ok=True); open(f'{ws}/.alt{i}/d/x','w').write('x')
    open(f'{ws}/.alt{i}/f','w').write('file')
    os.mkfifo(f'{ws}/.alt{i}/p'); os.symlink('target', f'{ws}/.alt{i}/l')
    open(f'{ws}/s{i}','w').write('start')
kinds=['d','f','p','l']; n=0
print('ready', flush=True)
while True:
    i=n%20; k=kinds[(n//20)%4]
    libc.renameat2(-100, f'{ws}/s{i}'.encode(), -100, f'{ws}/.alt{i}/{k}'.encode(), 2)
    n+=1`;
      const c = await d.client();
      await c.checkpoint({ workspace: ws }); // the stat cache (watched: the journal's seed)
      const failures: string[] = [];
      const swap = (swapper = new Helper(['python3', '-c', py, ws]));
      try {
        await until(() => swap.out.includes('ready'), 'the swapping names');
        // Consistent or not (unstable names), never failed. Before the fix, the first or second failed.
        for (let i = 0; i < 6 && failures.length === 0; i++) await c.checkpoint({ workspace: ws }).catch((err: Error) => failures.push(err.message));
      } finally {
        c.close();
        await swap.stop();
      }
      expect(failures).toEqual([]);
    },
    120_000,
  );
});

describe('the open-files limit', () => {
  let d: TestDaemon;

  beforeAll(async () => {
    d = await new TestDaemon().start();
  });

  afterAll(async () => {
    spawnSync('prlimit', ['--pid', String(d.pid), '--nofile=1024:']);
    await d.stop();
  });

  it('a flat workspace of 2,000 files checkpoints with RLIMIT_NOFILE 200 (the walk needs one fd per level)', async () => {
    const ws = join(d.dir, 'ws');
    mkdirSync(ws);
    for (let i = 0; i < 2000; i++) writeFileSync(join(ws, `f${i}`), `content ${i}\n`);
    expect(spawnSync('prlimit', ['--pid', String(d.pid), '--nofile=200:']).status).toBe(0);
    const ck = await checkpointJson(d, ws);
    // Today: EMFILE: the capture keeps one fd open per object directory (up to 256), on top
    // of what the supervisor holds; while it runs, a launch fails EMFILE too.
    expect(ck.stderr).toBe('');
    expect(ck.status).toBe(0);
  });
});
