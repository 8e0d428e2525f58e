// The workspace walker (supervisor/workspace/): directory fds at any depth, symlinks recorded
// and never followed, names as bytes, the close digest as python3's os.fwalk computes it (and
// byte for byte as before for trees without symlinks), unambiguous, a deadline, every fd closed, and the scan off the
// event loop. Needs the compiled worker (npm run build / npx tsc).
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  chmodSync,
  closeSync,
  constants,
  lchownSync,
  lstatSync,
  lutimesSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  symlinkSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { closeDigest } from '../../../../supervisor/workspace/digest.js';
import { fsDecode, fsEncode } from '../../../../core/fs/names.js';
import { scanInWorker } from '../../../../supervisor/workspace/scan.js';
import { openDirAt, ScanError, walkTree, type WalkEntry } from '../../../../core/fs/walk.js';
import { until } from '../../../helpers/daemon.js';
import { makeDeepTree, makeMixedTree, NON_UTF8_NAMES, pythonCloseDigest, removeTree } from '../../../helpers/workspace-trees.js';

const DEPTH = 2100;
let base: string;
let deep: string;
let mixed: string;
let mixedUtf8: string;

beforeAll(() => {
  base = mkdtempSync(join(tmpdir(), 'sbx-scan-'));
  deep = join(base, 'deep');
  mixed = join(base, 'mixed');
  mixedUtf8 = join(base, 'mixed-utf8');
  makeDeepTree(deep, DEPTH);
  makeMixedTree(mixed, { nonUtf8: true });
  makeMixedTree(mixedUtf8);
});
afterAll(() => removeTree(base));

const openFds = () => readdirSync('/proc/self/fd').length;

function walkError(root: string, options = {}): ScanError {
  try {
    for (const _ of walkTree(root, options));
  } catch (err) {
    return err as ScanError;
  }
  throw new Error('the walk did not fail');
}

/**
 * The close scan run in a child node under a wrapper (prlimit): its reply. With `asUid`, the
 * child drops to that uid/gid (no groups) once the scan module is loaded, so the checkout need
 * not be readable by that user (a 0700 home such as /root/project) while the walk is still its.
 */
function scanInChild(wrapper: string[], root: string, asUid?: number): unknown {
  const worker = new URL('../../../../dist/supervisor/workspace/scan-worker.js', import.meta.url).pathname;
  const drop = asUid === undefined ? '' : `process.setgroups([]); process.setgid(${asUid}); process.setuid(${asUid});`;
  const script = `import(${JSON.stringify(worker)}).then((m) => { ${drop} console.log(JSON.stringify(m.runScanHere({ root: process.argv[1], kind: 'close', startHrNs: 0n }))); })`;
  const argv = [...wrapper, process.execPath, '-e', script, root];
  const r = spawnSync(argv[0], argv.slice(1), { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`${argv[0]} node: exit ${r.status}: ${r.stderr}`);
  return JSON.parse(r.stdout);
}

/** The by-path scan of issue 11 (close.ts before directory fds), kept as the compatibility reference. */
function byPathDigest(root: string): string {
  const lines: string[] = [];
  const walk = (dir: string) => {
    for (const name of readdirSync(dir).sort()) {
      const path = join(dir, name);
      const st = lstatSync(path, { bigint: true });
      const type = st.isFile() ? 'f' : st.isDirectory() ? 'd' : st.isSymbolicLink() ? 'l' : 'o';
      lines.push(`${type} ${relative(root, path)} ${st.isFile() ? st.size : 0n} ${st.mtimeNs}`);
      if (type === 'd') walk(path);
    }
  };
  walk(root);
  lines.sort();
  return `sha256:${createHash('sha256').update(lines.join('\n')).digest('hex')}`;
}

describe('walkTree', () => {
  it('walks a 2,100-deep tree (paths past PATH_MAX) with one fd per level, and closes them all', () => {
    const before = openFds();
    let count = 0;
    let last: WalkEntry | undefined;
    for (const e of walkTree(deep)) {
      count++;
      last = e;
    }
    expect(count).toBe(DEPTH + 1);
    expect(last).toMatchObject({ type: 'file', depth: DEPTH + 1, size: 2n, linkTarget: null });
    expect(last!.path.toString()).toBe('d/'.repeat(DEPTH) + 'f');
    expect(last!.path.length).toBe(2 * DEPTH + 1); // 4,201 bytes: more than PATH_MAX (4,096)
    expect(openFds()).toBe(before);
  });

  it('closes every fd when the consumer stops early, mid-depth', () => {
    const before = openFds();
    let n = 0;
    for (const e of walkTree(deep)) if (++n === 1000 && e) break;
    expect(openFds()).toBe(before);
  });

  it('records symlinks with their targets and never walks one (to /, to /etc as a dir name, a loop, . and ..)', () => {
    const entries = [...walkTree(mixed)];
    const shown = entries.map((e) => [fsDecode(e.path), e.type, e.linkTarget?.toString() ?? null, e.depth]);
    expect(shown).toEqual(
      [
        ['a', 'file', null, 1],
        ['dangling', 'symlink', 'nowhere', 1],
        ['empty', 'file', null, 1],
        ['etc', 'symlink', '/etc', 1],
        ['loop', 'symlink', 'loop', 1],
        ['pipe', 'fifo', null, 1],
        ['root', 'symlink', '/', 1],
        ['sock', 'socket', null, 1],
        ['sp ace', 'file', null, 1],
        ['sub', 'dir', null, 1],
        ['sub/b', 'file', null, 2],
        ['sub/back', 'symlink', '..', 2],
        ['sub/deeper', 'dir', null, 2],
        ['sub/deeper/c', 'file', null, 3],
        ['up', 'symlink', '.', 1],
        ['\u00e9', 'file', null, 1],
        ['\ufffdA', 'file', null, 1],
        ['\uff21', 'file', null, 1],
        ['\u{1f600}', 'file', null, 1],
        ['\udc80', 'dir', null, 1],
        ['\udc80/inner', 'file', null, 2],
        ['\udcffA', 'file', null, 1],
      ].sort((x, y) => Buffer.compare(fsEncode(x[0] as string), fsEncode(y[0] as string))),
    );
    // Names are the bytes on disk; the lookalike "\uFFFDA" is its own entry.
    expect(entries.find((e) => e.name.equals(NON_UTF8_NAMES[0]))).toMatchObject({ type: 'file', size: 1n });
    const st = lstatSync(join(mixed, 'sub', 'b'), { bigint: true });
    expect(entries.find((e) => fsDecode(e.path) === 'sub/b')).toMatchObject({
      size: 3n,
      mode: Number(st.mode),
      uid: Number(st.uid),
      gid: Number(st.gid),
      ino: st.ino,
      dev: st.dev,
      mtimeNs: st.mtimeNs,
      ctimeNs: st.ctimeNs,
    });
  });

  it('opens a directory by name only when it is one: never through a symlink (O_NOFOLLOW), never a fifo', () => {
    const fd = openSync(mixed, 'r');
    try {
      // Without O_NOFOLLOW the same path reaches /etc and the tree itself: the flag is what stops it.
      closeSync(openSync(`/proc/self/fd/${fd}/etc`, constants.O_RDONLY | constants.O_DIRECTORY));
      closeSync(openSync(`/proc/self/fd/${fd}/up`, constants.O_RDONLY | constants.O_DIRECTORY));
      // With it, the lookup stops at the link, and O_DIRECTORY's check (ENOTDIR) comes before O_NOFOLLOW's ELOOP.
      for (const name of ['etc', 'up', 'root', 'loop', 'dangling', 'pipe', 'sock', 'a']) {
        expect(() => openDirAt(fd, Buffer.from(name)), name).toThrow(expect.objectContaining({ code: 'ENOTDIR' }));
      }
      closeSync(openDirAt(fd, Buffer.from('sub')));
    } finally {
      closeSync(fd);
    }
  });

  it('fails with a code and names the root: missing, not a directory, a symlink', () => {
    const before = openFds();
    expect(walkError(join(base, 'nope'))).toMatchObject({ code: 'ENOENT', message: `ENOENT: opening the workspace root ${join(base, 'nope')} failed` });
    expect(walkError(join(mixed, 'a'))).toMatchObject({ code: 'ENOTDIR' });
    expect(walkError(join(mixed, 'up'))).toMatchObject({ code: 'ELOOP', message: expect.stringContaining('is a symlink') });
    expect(walkError(join(mixed, 'etc'))).toMatchObject({ code: 'ELOOP' });
    expect(openFds()).toBe(before);
  });

  it('stops with scan_timeout past its deadline and closes its fds', () => {
    const before = openFds();
    expect(walkError(deep, { deadlineMs: 0 })).toMatchObject({
      code: 'scan_timeout',
      message: 'scan_timeout: the scan passed its 0 ms deadline after 0 entries',
    });
    // A deadline that passed mid-walk: the error comes from depth, fds held at every level.
    const startHrNs = process.hrtime.bigint() - 10_000_000_000n;
    expect(walkError(deep, { deadlineMs: 5_000, startHrNs })).toMatchObject({ code: 'scan_timeout' });
    expect(openFds()).toBe(before);
  });

  it('says EMFILE, and why, when the fd limit is below the depth', () => {
    const reply = scanInChild(['prlimit', '--nofile=100:100'], deep) as { message: string };
    expect(reply).toMatchObject({ ok: false, code: 'EMFILE' });
    expect(reply.message).toMatch(
      /^EMFILE: (opening|reading) (d\/)+d \(depth \d+\) in \/\S+\/deep failed: the walk holds one fd per directory level; raise the open-files limit \(LimitNOFILE, ulimit -n\)$/,
    );
  });

  it('says EACCES and names the entry it could not open (run as nobody: root passes every mode check)', () => {
    const tree = join(base, 'perm');
    mkdirSync(join(tree, 'open'), { recursive: true });
    mkdirSync(join(tree, 'locked'), { mode: 0o700 });
    writeFileSync(join(tree, 'locked', 'x'), '');
    chmodSync(base, 0o755);
    expect(scanInChild([], tree, 65534)).toEqual({ ok: false, code: 'EACCES', message: `EACCES: opening locked (depth 1) in ${tree} failed` });
  });
});

describe("walkTree's fields from the native listing", () => {
  it('are what lstat gives, for uid and gid past 2^31, a char device, a fifo, a link, names of 1 to 255 bytes of any byte, 1 to 3 levels down', () => {
    const root = join(base, 'fields');
    mkdirSync(root);
    const all = Buffer.from(Array.from({ length: 254 }, (_, i) => i + 1).filter((b) => b !== 0x2f));
    const names = [Buffer.from('a'), all.subarray(0, 200), Buffer.concat([all, Buffer.from('x')]).subarray(0, 255), Buffer.from([0xff, 0xfe, 0x80])];
    const dirs = [Buffer.alloc(0), Buffer.from('d'), Buffer.concat([Buffer.from('d/'), all.subarray(100, 180)])];
    for (const dir of dirs.slice(1)) mkdirSync(Buffer.concat([Buffer.from(`${root}/`), dir]));
    const at = (dir: Buffer, name: Buffer) => Buffer.concat([Buffer.from(`${root}/`), dir.length ? Buffer.concat([dir, Buffer.from('/')]) : dir, name]);
    for (const [k, dir] of dirs.entries()) {
      for (const [j, name] of names.entries()) {
        const p = at(dir, name);
        if (j === 0) writeFileSync(p, 'x'.repeat(k * 1000 + 1));
        else if (j === 1) symlinkSync(Buffer.concat([Buffer.from('target-'), name]), p);
        else {
          // Names of any bytes: python3 takes them as hex (node has no mknod).
          const make = j === 2 ? `os.mknod(p, 0o20644, os.makedev(1, ${3 + k}))` : 'os.mkfifo(p)';
          expect(spawnSync('python3', ['-c', `import os, sys; p = bytes.fromhex(sys.argv[1]); ${make}`, p.toString('hex')]).status).toBe(0);
        }
      }
      const p = at(dir, names[0]!);
      // Past 2^31 (a signed 32-bit read would turn them negative) and the largest that are ids.
      lchownSync(p, 4294967294 - k, 2147483648 + k);
    }
    const want: unknown[] = [];
    const walk = (rel: Buffer, depth: number) => {
      const abs = Buffer.concat([Buffer.from(root), rel.length ? Buffer.concat([Buffer.from('/'), rel]) : rel]);
      for (const name of readdirSync(abs, { encoding: 'buffer' }).sort(Buffer.compare)) {
        const path = rel.length ? Buffer.concat([rel, Buffer.from('/'), name]) : name;
        const st = lstatSync(Buffer.concat([abs, Buffer.from('/'), name]), { bigint: true });
        want.push([
          path.toString('hex'),
          name.toString('hex'),
          depth,
          Number(st.mode),
          Number(st.uid),
          Number(st.gid),
          st.nlink,
          st.dev,
          st.ino,
          st.size,
          st.blocks,
          st.rdev,
          st.mtimeNs,
          st.ctimeNs,
        ]);
        if (st.isDirectory()) walk(path, depth + 1);
      }
    };
    walk(Buffer.alloc(0), 1);
    const got = [...walkTree(root)].map((e) => [
      e.path.toString('hex'),
      e.name.toString('hex'),
      e.depth,
      e.mode,
      e.uid,
      e.gid,
      e.nlink,
      e.dev,
      e.ino,
      e.size,
      e.blocks,
      e.rdev,
      e.mtimeNs,
      e.ctimeNs,
    ]);
    expect(got).toEqual(want);
    expect(got.length).toBe(3 * 4 + 2);
    expect(got.filter((g) => g[4] === 4294967294 && g[5] === 2147483648)).toHaveLength(1);
  });
});

describe("walkTree's read-ahead (sibling directories opened and listed at once, on threads)", () => {
  it('walks a wide tree exactly as lstat sees it, a mount point among the siblings recorded and not entered, and holds no fd after, also when stopped early', () => {
    const root = join(base, 'wide');
    const rel = (p: string) => relative(root, p);
    mkdirSync(root);
    for (let d = 0; d < 150; d++) {
      const dir = join(root, `d${String(d).padStart(3, '0')}`);
      mkdirSync(dir);
      for (let f = 0; f < (d % 5) * 3; f++) writeFileSync(join(dir, `f${f}`), `${d}/${f}`);
      if (d % 10 === 0) for (let s = 0; s < 40; s++) mkdirSync(join(dir, `s${s}`));
      if (d % 25 === 0) symlinkSync('..', join(dir, 'up'));
    }
    const mountAt = join(root, 'd077');
    writeFileSync(join(mountAt, 'under-the-mount'), 'hidden');
    const mounted = spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'sbx-test-wide', mountAt]).status === 0;
    try {
      expect(mounted).toBe(true); // root, as the suite runs
      writeFileSync(join(mountAt, 'on-the-mount'), 'not walked');
      const rootDev = lstatSync(root, { bigint: true }).dev;
      const want: unknown[] = [];
      const walk = (dir: string) => {
        for (const name of readdirSync(dir, { encoding: 'buffer' }).sort(Buffer.compare)) {
          const path = join(dir, name.toString());
          const st = lstatSync(path, { bigint: true }); // a mount point: the root of what is mounted there
          const type = st.isFile() ? 'file' : st.isDirectory() ? 'dir' : 'symlink';
          want.push([rel(path), type, st.ino, st.mode, st.size, st.mtimeNs, st.ctimeNs, type === 'symlink' ? '..' : null, st.dev !== rootDev]);
          if (type === 'dir' && st.dev === rootDev) walk(path);
        }
      };
      walk(root);
      const before = openFds();
      const got = [...walkTree(root, { oneFileSystem: true })].map((e) => [
        fsDecode(e.path),
        e.type,
        e.ino,
        BigInt(e.mode),
        e.size,
        e.mtimeNs,
        e.ctimeNs,
        e.linkTarget?.toString() ?? null,
        e.mountPoint === true,
      ]);
      expect(got).toEqual(want);
      // 150 directories, 900 files, 15 x 40 subdirectories, 6 links; the mount hides d077's 6 files and one more.
      expect(got.length).toBe(1650);
      expect(openFds()).toBe(before);
      // Stopped just after the first read-ahead (the root's first directories held open ahead).
      let n = 0;
      for (const e of walkTree(root, { oneFileSystem: true })) if (++n === 3 && e) break;
      expect(openFds()).toBe(before);
    } finally {
      if (mounted) spawnSync('umount', [mountAt]);
    }
  });
});

describe('the close digest', () => {
  it('is what python3 os.fwalk computes, and for a tree without symlinks the by-path digest of before', () => {
    const d = closeDigest(walkTree(mixedUtf8));
    expect(pythonCloseDigest(mixedUtf8)).toEqual({ digest: d.digest, files: 8, total_bytes: 10, entries: 18 });
    const plain = join(base, 'plain');
    mkdirSync(join(plain, 'sub', 'deeper'), { recursive: true });
    for (const [name, bytes] of [
      ['a', '12345'],
      ['sp ace', ''],
      ['\u00e9', 'e'],
      ['\uff21', 'y'],
      ['\u{1f600}', ''],
      ['sub/b', '123'],
      ['sub/deeper/c', 'x'],
    ])
      writeFileSync(join(plain, name), bytes);
    expect(closeDigest(walkTree(plain)).digest).toBe(byPathDigest(plain));
  });

  it('is unambiguous: a newline in a name, or another symlink target, gives another digest', () => {
    // One dir named "a 0 1000000000\nd b" against dirs a and b with those mtimes: the same lines before.
    const one = join(base, 'nl-one');
    const two = join(base, 'nl-two');
    mkdirSync(join(one, 'a 0 1000000000\nd b'), { recursive: true });
    mkdirSync(join(two, 'a'), { recursive: true });
    mkdirSync(join(two, 'b'));
    utimesSync(join(one, 'a 0 1000000000\nd b'), 2, 2);
    utimesSync(join(two, 'a'), 1, 1);
    utimesSync(join(two, 'b'), 2, 2);
    expect(closeDigest(walkTree(one)).digest).not.toBe(closeDigest(walkTree(two)).digest);
    expect(pythonCloseDigest(one).digest).toBe(closeDigest(walkTree(one)).digest);
    // Two trees that differ only in a symlink's target (same name, same mtime).
    const l1 = join(base, 'link-1');
    const l2 = join(base, 'link-2');
    for (const [dir, target] of [
      [l1, 'x y'],
      [l2, 'x'],
    ]) {
      mkdirSync(dir);
      symlinkSync(target, join(dir, 'l'));
      lutimesSync(join(dir, 'l'), 5, 5);
    }
    expect(closeDigest(walkTree(l1)).digest).not.toBe(closeDigest(walkTree(l2)).digest);
    expect(pythonCloseDigest(l1).digest).toBe(closeDigest(walkTree(l1)).digest);
  });

  it('carries non-UTF-8 names as their bytes: no crash, no collision, python3 agrees', () => {
    const d = closeDigest(walkTree(mixed));
    expect(pythonCloseDigest(mixed)).toEqual({ digest: d.digest, files: 11, total_bytes: 12, entries: 22 });
    expect(d).toMatchObject({ files: 11, total_bytes: 12 });
    // Renaming the byte 0xff to U+FFFD (what a lossy decode would see) changes the digest.
    const renamed = [...walkTree(mixed)].map((e) => (e.name.equals(NON_UTF8_NAMES[0]) ? { ...e, path: Buffer.from('\ufffdA') } : e));
    expect(closeDigest(renamed).digest).not.toBe(d.digest);
  });

  it('for the 2,100-deep tree is what python3 computes', () => {
    const d = closeDigest(walkTree(deep));
    expect(pythonCloseDigest(deep)).toEqual({ digest: d.digest, files: 1, total_bytes: 2, entries: DEPTH + 1 });
  });
});

describe('names', () => {
  it('fsDecode/fsEncode round-trip any bytes, and decode UTF-8 as UTF-8', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 24 }), (bytes) => {
        const b = Buffer.from(bytes);
        expect(fsEncode(fsDecode(b)).equals(b)).toBe(true);
        expect(fsDecode(b)).toBe(fsDecode(b)); // deterministic
      }),
      { numRuns: 2000 },
    );
    fc.assert(
      fc.property(fc.string({ unit: 'grapheme' }), (s) => {
        expect(fsDecode(Buffer.from(s, 'utf8'))).toBe(s);
      }),
    );
    expect(fsDecode(Buffer.from([0xed, 0xa0, 0x80]))).toBe('\udced\udca0\udc80'); // an encoded surrogate is not UTF-8
    expect(fsDecode(Buffer.from([0xe2, 0x82, 0x41]))).toBe('\udce2\udc82A');
    expect(fsDecode(Buffer.from([0xf0, 0x9f, 0x98, 0x80, 0xff]))).toBe('\u{1f600}\udcff');
  });
});

describe('scanInWorker', () => {
  it('scans off the event loop: timers run while the deep tree is walked, and the result is the in-thread one', async () => {
    let ticks = 0;
    const interval = setInterval(() => ticks++, 1);
    const before = openFds();
    try {
      const reply = await scanInWorker(deep, 'close');
      expect(ticks).toBeGreaterThan(0);
      expect(reply).toEqual({ ok: true, result: closeDigest(walkTree(deep)) });
    } finally {
      clearInterval(interval);
    }
    // The reply comes before the worker has exited: its own event loop's fds close as it ends
    // (4 still open once in CI under load), so no fd is left once it has.
    await until(() => openFds() === before, `the fds back to ${before} once the scan worker ended`);
  });

  it('replies with the walk error, and scan_timeout past the deadline', async () => {
    expect(await scanInWorker(join(base, 'nope'), 'close')).toEqual({
      ok: false,
      code: 'ENOENT',
      message: `ENOENT: opening the workspace root ${join(base, 'nope')} failed`,
    });
    expect(await scanInWorker(deep, 'close', { deadlineMs: 0 })).toMatchObject({ ok: false, code: 'scan_timeout' });
  });
});
