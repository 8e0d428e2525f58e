// The native helper and the reaper built on it, in processes of their own; and the pty
// master socket built on it (drain.ts).
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { once } from 'node:events';
import {
  closeSync,
  constants as fsConstants,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  readSync,
  rmSync,
  symlinkSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { constants as osConstants, tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { StreamDrain } from '../supervisor/session/drain.js';
import { HashPool } from '../supervisor/store/hasher.js';
import { native } from '../core/fs/native.js';
import { mountIdOf } from '../core/fs/walk.js';
import { ROOT, sha256, until } from './helpers/daemon.js';
import { cgroupMount, removeCgroupTree, TEST_CGROUP_PREFIX } from './helpers/cgroup-cleanup.js';

/** fileio.h FILEIO_FIELDS: the int64s of one fstat in readFileAt's and hashFilesAt's stats. */
const FIO_FIELDS = 14;

describe('native helper', () => {
  it('makes real O_CLOEXEC pipes and raises their capacity', () => {
    const [r, w] = native().makePipe();
    try {
      for (const fd of [r, w]) {
        const flags = parseInt(/^flags:\s+(\d+)$/m.exec(readFileSync(`/proc/self/fdinfo/${fd}`, 'utf8'))![1], 8);
        expect(flags & 0o2000000).toBe(0o2000000); // O_CLOEXEC
      }
      expect(native().setPipeSize(r, 1 << 20)).toBe(1 << 20);
    } finally {
      closeSync(r);
      closeSync(w);
    }
  });

  it('throws errors whose code is the errno name', () => {
    let caught: any;
    try {
      native().reapPid(1); // init is never our child
    } catch (err) {
      caught = err;
    }
    expect(caught).toMatchObject({ code: 'ECHILD', syscall: 'waitpid', errno: -10 });
    expect(() => native().setPipeSize(-1, 4096)).toThrow(expect.objectContaining({ code: 'EBADF' }));
  });

  it('sets and reads the child subreaper bit (in a process of its own)', () => {
    const out = execFileSync(
      process.execPath,
      [
        '--import',
        'tsx',
        '-e',
        `
      import('./core/fs/native.ts').then(({ native }) => {
        const before = native().isChildSubreaper();
        native().setChildSubreaper();
        console.log(JSON.stringify([before, native().isChildSubreaper()]));
      });`,
      ],
      { cwd: ROOT },
    ).toString();
    expect(JSON.parse(out)).toEqual([false, true]);
  });

  it('spawns into a cgroup leaf (clone3 CLONE_INTO_CGROUP, CLONE_VM on x86_64) while other threads run: fds, signals, session, env exact; exec failure named', async (ctx) => {
    const mount = cgroupMount();
    if (!mount || process.getuid?.() !== 0) return ctx.skip(); // a leaf of our own needs cgroup2 and root
    const base = join(mount, `${TEST_CGROUP_PREFIX}spawn-probe-${process.pid}`);
    mkdirSync(join(base, 'leaf'), { recursive: true });
    try {
      // A deadline of its own: a sync child the test timeout cannot interrupt must not stall the run.
      const out = execFileSync(process.execPath, ['--import', 'tsx', join(ROOT, 'test/fixtures/spawn-probe.ts'), join(base, 'leaf')], {
        cwd: ROOT,
        timeout: 120_000,
        killSignal: 'SIGKILL',
      }).toString();
      const result = JSON.parse(out) as { reports: string[]; failure: { code: string; syscall: string }; reapedOk: number; rounds: number[] };
      expect(result.reports).toHaveLength(100);
      result.reports.forEach((report, i) => {
        const lines = report.split('\n');
        expect(lines.filter((l) => l.startsWith('0::'))).toEqual([`0::/${TEST_CGROUP_PREFIX}spawn-probe-${process.pid}/leaf`]);
        expect(lines.filter((l) => l.startsWith('Sig'))).toEqual(['SigBlk:\t0000000000000000', 'SigIgn:\t0000000000000000']);
        expect(lines).toContain('SID=PID'); // setsid: its own session
        // 0-2 as given (stdout our pipe, the others /dev/null), and none of ours from 3 to 9.
        expect(
          lines.find((l) => l.startsWith('FDS')),
          report,
        ).toBe('FDS 0 1 2');
        expect(lines).toContain(`A=${i}`);
      });
      expect(result.failure).toEqual({ code: 'ENOENT', syscall: 'execve' });
      expect(result.reapedOk).toBe(100);
      expect(Math.min(...result.rounds)).toBeGreaterThan(0); // the other threads did run meanwhile
    } finally {
      await removeCgroupTree(base);
    }
  });

  it('continueStopped: a stopped child is continued (SIGCONT) and its stop signal told, once; a running one is left; not ours is ECHILD', async () => {
    const state = (pid: number) => {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
    };
    const child = spawn('sleep', ['100'], { stdio: 'ignore' });
    const exited = new Promise((r) => child.on('exit', r));
    try {
      const pid = child.pid!;
      expect(native().continueStopped(pid)).toBeNull();
      process.kill(pid, 'SIGSTOP');
      await until(() => state(pid) === 'T', 'the child to stop');
      expect(native().continueStopped(pid)).toEqual({ pid, code: null, signal: osConstants.signals.SIGSTOP });
      await until(() => state(pid) !== 'T', 'the child to run again');
      expect(native().continueStopped(pid)).toBeNull();
      expect(thrown(() => native().continueStopped(1))).toMatchObject({ code: 'ECHILD', syscall: 'waitid' });
    } finally {
      child.kill('SIGKILL');
      await exited;
    }
  });

  it('reaps 100 orphans by pid while every child_process exit event still fires', () => {
    const out = execFileSync(process.execPath, ['--import', 'tsx', join(ROOT, 'test/fixtures/reaper-probe.ts')], {
      cwd: ROOT,
      timeout: 120_000,
      killSignal: 'SIGKILL',
    }).toString();
    const result = JSON.parse(out) as { codes: number[]; reaped: number; zombies: number };
    expect(result.codes).toEqual([7, ...Array.from({ length: 20 }, (_, i) => i)]);
    expect(result.reaped).toBeGreaterThanOrEqual(100);
    expect(result.zombies).toBe(0);
  });

  it('with a read fence, keeps 50 exited orphans zombies (not reaped, not listed as unreaped) until the fence settles, then reaps every one', () => {
    const out = execFileSync(process.execPath, ['--import', 'tsx', join(ROOT, 'test/fixtures/reaper-fence-probe.ts')], {
      cwd: ROOT,
      timeout: 120_000,
      killSignal: 'SIGKILL',
    }).toString();
    expect(JSON.parse(out)).toEqual({ held: 50, listed: 0, reapedBefore: 0, reapedAfter: 50, left: 0, holds: { held: 50, unfenced: 0 }, fencesAsked: true });
  });
});

/** What fn throws (it must throw). */
function thrown(fn: () => unknown): any {
  try {
    fn();
  } catch (err) {
    return err;
  }
  throw new Error('expected a throw');
}

/** sdNotify with $NOTIFY_SOCKET set to path for the call (the C library reads the real environ). */
function notifyAt(path: string): unknown {
  const before = process.env.NOTIFY_SOCKET;
  process.env.NOTIFY_SOCKET = path;
  try {
    return thrown(() => native().sdNotify('READY=1'));
  } finally {
    if (before === undefined) delete process.env.NOTIFY_SOCKET;
    else process.env.NOTIFY_SOCKET = before;
  }
}

describe('native helper errors, named as node:fs names them', () => {
  it('gives every errno its name, errno and syscall, not only a table of 19 (ENOTDIR, ELOOP were EUNKNOWN)', () => {
    const dir = mkdtempSync(join(tmpdir(), 'sbx-native-err-'));
    const file = openSync(join(dir, 'file'), 'w');
    const [r, w] = native().makePipe();
    try {
      symlinkSync('loop', join(dir, 'loop'));
      expect(notifyAt('/etc/passwd/sock')).toMatchObject({ code: 'ENOTDIR', errno: -20, syscall: 'sendto', message: 'ENOTDIR: not a directory, sendto' });
      expect(notifyAt(join(dir, 'loop'))).toMatchObject({ code: 'ELOOP', errno: -40, syscall: 'sendto' });
      expect(notifyAt(join(dir, 'missing'))).toMatchObject({ code: 'ENOENT', errno: -2, syscall: 'sendto' });
      expect(notifyAt(`/${'x'.repeat(200)}`)).toMatchObject({ code: 'EINVAL', errno: -22, syscall: 'sd_notify' });
      expect(thrown(() => native().setPipeSize(file, 1 << 16))).toMatchObject({
        code: 'EBADF',
        errno: -9,
        syscall: 'fcntl',
        message: 'EBADF: bad file descriptor, fcntl',
      });
      expect(thrown(() => native().peerCred(r))).toMatchObject({ code: 'ENOTSOCK', errno: -88, syscall: 'getsockopt' });
      expect(thrown(() => native().setWindowSize(w, 80, 24))).toMatchObject({ code: 'ENOTTY', errno: -25, syscall: 'ioctl' });
      // An errno libuv has no name for is named by the C library.
      expect(thrown(() => native().reapPid(1))).toMatchObject({
        code: 'ECHILD',
        errno: -10,
        syscall: 'waitpid',
        message: 'ECHILD: No child processes, waitpid',
      });
      expect(thrown(() => native().openPty(0, 24))).toMatchObject({ name: 'TypeError', code: 'EINVAL' });
    } finally {
      for (const fd of [file, r, w]) closeSync(fd);
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('looks users and groups up through NSS (as getent does); a missing one is ENOENT', () => {
    const entry = (db: string, key: string) => execFileSync('getent', [db, key]).toString().trim().split(':');
    const [name, , uid, gid, , home] = entry('passwd', 'nobody');
    const nobody = { name, uid: Number(uid), gid: Number(gid), home };
    expect(native().userByName('nobody')).toEqual(nobody);
    expect(native().userById(nobody.uid)).toEqual(nobody);
    expect(native().userByName('root')).toEqual({ name: 'root', uid: 0, gid: 0, home: entry('passwd', 'root')[5] });
    expect(native().groupByName('root')).toBe(0);
    expect(native().groupByName(entry('group', String(nobody.gid))[0])).toBe(nobody.gid);
    let free = 4_000_000_123;
    while (spawnSync('getent', ['passwd', String(free)]).status !== 2) free++;
    expect(thrown(() => native().userByName('no-such-user-here'))).toMatchObject({ code: 'ENOENT', errno: -2, syscall: 'getpwnam_r' });
    expect(thrown(() => native().userById(free))).toMatchObject({ code: 'ENOENT', errno: -2, syscall: 'getpwuid_r' });
    expect(thrown(() => native().groupByName('no-such-group-here'))).toMatchObject({ code: 'ENOENT', errno: -2, syscall: 'getgrnam_r' });
    for (const bad of [
      () => native().userByName('root\0x'),
      () => native().userById(-1),
      () => native().userById(2 ** 32 - 1),
      () => native().groupByName(7 as unknown as string),
    ]) {
      expect(thrown(bad)).toMatchObject({ name: 'TypeError', code: 'EINVAL' });
    }
  });
});

/** A fd's file status flags (fdinfo's octal `flags`). */
const fdFlags = (fd: number) => parseInt(/^flags:\s+(\d+)$/m.exec(readFileSync(`/proc/self/fdinfo/${fd}`, 'utf8'))![1], 8);

/** Open fds of this process on the pty master numbered index (/dev/ptmx, fdinfo tty-index). */
function masterFds(index: number): number {
  let n = 0;
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      if (!readlinkSync(`/proc/self/fd/${fd}`).endsWith('ptmx')) continue;
      if (new RegExp(`^tty-index:\\s+${index}$`, 'm').test(readFileSync(`/proc/self/fdinfo/${fd}`, 'utf8'))) n++;
    } catch {
      // closed meanwhile (readdir's own fd)
    }
  }
  return n;
}

/** Writes into the master until the pty takes nothing more, even after its queue moved on. */
async function fillMaster(master: number): Promise<number> {
  expect(fdFlags(master) & 0o4000).toBe(0o4000); // O_NONBLOCK, else the fill would block
  const chunk = Buffer.alloc(1 << 16, 'x');
  let total = 0;
  await until(async () => {
    let added = 0;
    for (;;) {
      try {
        added += writeSync(master, chunk);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EAGAIN') throw err;
        break;
      }
    }
    total += added;
    await new Promise((r) => setTimeout(r, 20)); // the tty layer moves bytes on in a worker
    return added === 0;
  }, 'the pty input queue to be full');
  return total;
}

/** Reads n bytes from a (blocking) slave fd. */
function readSlave(slave: number, n: number): void {
  const buf = Buffer.alloc(1 << 16);
  for (let got = 0; got < n;) got += readSync(slave, buf, 0, Math.min(buf.length, n - got), null);
}

describe('pty', () => {
  it('opens a pty: the master O_NONBLOCK (the event loop reads it), both O_CLOEXEC, the size set', () => {
    const pty = native().openPty(123, 45);
    try {
      expect(fdFlags(pty.master) & 0o2004000).toBe(0o2004000); // O_CLOEXEC | O_NONBLOCK
      expect(fdFlags(pty.slave) & 0o2004000).toBe(0o2000000); // O_CLOEXEC, blocking
      expect(pty.path).toMatch(/^\/dev\/pts\/\d+$/);
      expect(execFileSync('stty', ['size'], { stdio: [pty.slave, 'pipe', 'inherit'] }).toString()).toBe('45 123\n');
    } finally {
      closeSync(pty.master);
      closeSync(pty.slave);
    }
  });

  it('waitWritable calls back once the slave has read, not before; cancel stops it; its dup of the fd is closed', async () => {
    const pty = native().openPty(80, 24);
    const index = Number(pty.path.slice('/dev/pts/'.length));
    try {
      execFileSync('stty', ['raw', '-echo'], { stdio: [pty.slave, 'ignore', 'inherit'] });
      let fired = 0;
      let queued = await fillMaster(pty.master);
      expect(masterFds(index)).toBe(1);
      const cancel = native().waitWritable(pty.master, () => fired++);
      expect(masterFds(index)).toBe(2); // the dup it watches
      await new Promise((r) => setTimeout(r, 50));
      expect(fired).toBe(0); // still full: nobody has read
      readSlave(pty.slave, queued);
      await until(() => fired === 1, 'the wait to fire once there is room');
      await until(() => masterFds(index) === 1, 'the dup to be closed after firing');
      cancel(); // after firing: nothing happens

      queued = await fillMaster(pty.master);
      const cancelEarly = native().waitWritable(pty.master, () => fired++);
      expect(masterFds(index)).toBe(2);
      cancelEarly();
      cancelEarly();
      await until(() => masterFds(index) === 1, 'the dup to be closed on cancel');
      readSlave(pty.slave, queued);
      await new Promise((r) => setTimeout(r, 50));
      expect(fired).toBe(1);
    } finally {
      closeSync(pty.master);
      closeSync(pty.slave);
    }
  });

  it("the drain's pty socket: stdin waits for the reader while the loop runs, every byte is read, then EIO", async () => {
    const dir = mkdtempSync(join(tmpdir(), 'sbx-native-pty-'));
    const pty = native().openPty(80, 24);
    let slave = pty.slave;
    const hashPool = new HashPool();
    const drain = new StreamDrain(dir, 'pty', pty.master, { chunkBytes: 1 << 20, hashPool, quotaBytes: Number.MAX_SAFE_INTEGER, guard: null }, true);
    const go = join(dir, 'go');
    const input = randomBytes(1 << 20);
    const child = spawn(
      'sh',
      [
        '-c',
        `stty raw -echo; echo ready; while [ ! -e ${go} ]; do sleep 0.01; done; head -c ${input.length} | sha256sum; head -c 300000 /dev/zero | base64 -w0`,
      ],
      {
        stdio: [slave, slave, slave],
      },
    );
    const exited = once(child, 'exit');
    const out: Buffer[] = [];
    drain.socket.on('data', (b: Buffer) => out.push(b));
    const text = () => Buffer.concat(out).toString();
    let finalized = false;
    try {
      await until(() => text() === 'ready\n', 'the child to set raw mode');
      expect(drain.socket.write(input)).toBe(false); // over the high-water mark: backpressure
      const drained = once(drain.socket, 'drain');
      await new Promise((r) => setTimeout(r, 50)); // the loop runs while the write waits
      expect(drain.socket.writableLength).toBeGreaterThan(0); // nobody reads stdin yet
      writeFileSync(go, '');
      await drained;
      await exited;
      const expected = `ready\n${createHash('sha256').update(input).digest('hex')}  -\n${Buffer.alloc(300000).toString('base64')}`;
      await until(() => text().length === expected.length, 'every byte of the output');
      closeSync(slave);
      slave = -1;
      expect(await drain.done).toBe('eio');
      expect(text()).toBe(expected);
      expect(drain.cursor).toBe(expected.length);
      const result = await drain.finalize();
      finalized = true;
      expect(result).toMatchObject({
        final_cursor: expected.length,
        complete: true,
        drain_end: 'eio',
        sha256: createHash('sha256').update(expected).digest('hex'),
      });
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      if (slave >= 0) closeSync(slave);
      drain.cut();
      if (!finalized) await drain.finalize().catch(() => {});
      await hashPool.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

/** The shim's argv protocol, written independently of spawn.ts: count and bytes (u64 LE), then the NUL-terminated strings. */
function argvPayload(argv: string[], header: { count?: number; bytes?: number } = {}): Buffer {
  const strings = Buffer.concat(argv.map((a) => Buffer.from(`${a}\0`)));
  const head = Buffer.alloc(16);
  head.writeBigUInt64LE(BigInt(header.count ?? argv.length), 0);
  head.writeBigUInt64LE(BigInt(header.bytes ?? strings.length), 8);
  return Buffer.concat([head, strings]);
}

/** Runs the exec shim (no cgroup; exec mode, or subreaper mode) with payload on its argv fd, then EOF. */
async function runShim(
  payload: Buffer,
  mode: 'exec' | 'subreaper' = 'exec',
): Promise<{ status: number | null; stdout: string; stderr: string; report: string }> {
  const [r, w] = native().makePipe();
  const [controlR, controlW] = native().makePipe();
  const args = ['--report-fd', '3', '--argv-fd', '4', ...(mode === 'subreaper' ? ['--subreaper', '--control-fd', '5'] : [])];
  const child = spawn(join(ROOT, 'native-helpers/build/Release/sbx-exec-shim'), args, { stdio: ['ignore', 'pipe', 'pipe', 'pipe', r, controlR] });
  closeSync(r);
  closeSync(controlR);
  writeSync(w, payload); // well under a pipe's capacity: never blocks
  closeSync(w);
  closeSync(controlW);
  const chunks = { stdout: [] as Buffer[], stderr: [] as Buffer[], report: [] as Buffer[] };
  child.stdout!.on('data', (d: Buffer) => chunks.stdout.push(d));
  child.stderr!.on('data', (d: Buffer) => chunks.stderr.push(d));
  (child.stdio[3] as NodeJS.ReadableStream).on('data', (d: Buffer) => chunks.report.push(d));
  const [status] = (await once(child, 'close')) as [number | null];
  const text = (b: Buffer[]) => Buffer.concat(b).toString();
  return { status, stdout: text(chunks.stdout), stderr: text(chunks.stderr), report: text(chunks.report) };
}

describe('statDir: a directory listed with its lstats in one call', () => {
  it('names sorted by bytes (also not UTF-8, 255 bytes), each lstat as node:fs gives it, a link\'s target, no "." or ".."; the fd\'s offset untouched', () => {
    const dir = mkdtempSync(join(tmpdir(), 'sbx-statdir-'));
    try {
      const names = [
        Buffer.from('b'),
        Buffer.from('a'),
        Buffer.from([0x66, 0xff, 0x2e]),
        Buffer.from('x'.repeat(255)),
        Buffer.from('ab'),
        Buffer.from('link'),
        Buffer.from('sub'),
      ];
      const at = (n: Buffer) => Buffer.concat([Buffer.from(`${dir}/`), n]);
      for (const n of names.slice(0, 5)) writeFileSync(at(n), randomBytes(Math.floor(Math.random() * 4096)));
      symlinkSync('../some/where\u00e9', join(dir, 'link'));
      mkdirSync(join(dir, 'sub'));
      const fd = openSync(dir, 'r');
      try {
        const r = native().statDir(fd);
        const again = native().statDir(fd); // a listing reads a dup: the fd is not left at its end
        expect(again.count).toBe(r.count);
        expect(r.count).toBe(names.length);
        let pos = 0;
        const got: Buffer[] = [];
        for (let i = 0; i < r.count; i++) {
          const len = r.names.readUInt16LE(pos);
          const name = Buffer.from(r.names.subarray(pos + 2, pos + 2 + len));
          pos += 2 + len;
          got.push(name);
          const b = i * r.fields;
          const st = lstatSync(at(name), { bigint: true });
          expect(r.stats[b]).toBe(0n);
          expect([r.stats[b + 1], r.stats[b + 5], r.stats[b + 6], r.stats[b + 7], r.stats[b + 8], r.stats[b + 10], r.stats[b + 11]]).toEqual([
            st.mode,
            st.dev,
            st.ino,
            st.size,
            st.blocks,
            st.mtimeNs,
            st.ctimeNs,
          ]);
          const tlen = Number(r.stats[b + 12]);
          if (name.toString() === 'link') {
            expect(Buffer.from(r.names.subarray(pos, pos + tlen))).toEqual(readlinkSync(at(name), { encoding: 'buffer' }));
            pos += tlen;
          } else expect(tlen).toBe(-1);
        }
        expect(pos).toBe(r.names.length);
        expect(got).toEqual([...names].sort(Buffer.compare));
      } finally {
        closeSync(fd);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("throws the listing's errno (ENOTDIR for a file's fd, EBADF for a number never opened)", () => {
    const dir = mkdtempSync(join(tmpdir(), 'sbx-statdir-'));
    try {
      writeFileSync(join(dir, 'f'), '');
      const fd = openSync(join(dir, 'f'), 'r');
      expect(() => native().statDir(fd)).toThrow(expect.objectContaining({ code: 'ENOTDIR' }));
      closeSync(fd);
      // A number past any fs.nr_open: a closed fd's number could be reused by another thread.
      expect(() => native().statDir(0x7fffffff)).toThrow(expect.objectContaining({ code: 'EBADF' }));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('statDirs: several directories listed at once on threads', () => {
  it("gives each fd statDir's exact listing on 1, 2 and 8 threads, and a failed one's errno in its place (ENOTDIR, EBADF for a number never opened); bad arguments EINVAL", () => {
    const dir = mkdtempSync(join(tmpdir(), 'sbx-statdirs-'));
    const fds: number[] = [];
    try {
      for (let d = 0; d < 40; d++) {
        mkdirSync(join(dir, `d${d}`));
        for (let f = 0; f < d; f++) writeFileSync(join(dir, `d${d}`, `f${f}`), randomBytes(f));
        if (d % 7 === 0) symlinkSync(`target-${d}`, join(dir, `d${d}`, 'link'));
        fds.push(openSync(join(dir, `d${d}`), 'r'));
      }
      writeFileSync(join(dir, 'file'), 'x');
      const fileFd = openSync(join(dir, 'file'), 'r');
      // Not a closed fd: its number can be taken by another thread's openat meanwhile (the
      // call's own included; CI saw one listed as d19). No fd is ever given this number: it
      // is past the kernel's largest nr_open (fs.nr_open ≤ 2^30 - 64, see proc_sys_fs(5)).
      const neverOpenFd = 0x7fffffff;
      const all = Int32Array.from([...fds.slice(0, 20), fileFd, neverOpenFd, ...fds.slice(20)]);
      const want = [...all].map((fd) => {
        try {
          return native().statDir(fd);
        } catch (err) {
          return { errno: -1, code: (err as NodeJS.ErrnoException).code };
        }
      });
      for (const threads of [1, 2, 8]) {
        const got = native().statDirs(all, threads);
        expect(got.length).toBe(all.length);
        got.forEach((r, i) => {
          const w = want[i]!;
          if ('code' in w) expect(r).toEqual({ errno: w.code === 'ENOTDIR' ? osConstants.errno.ENOTDIR : osConstants.errno.EBADF });
          else expect(r).toEqual(w);
        });
      }
      closeSync(fileFd);
      expect(native().statDirs(new Int32Array(0), 2)).toEqual([]);
      expect(() => native().statDirs([fds[0]!] as unknown as Int32Array, 2)).toThrow(expect.objectContaining({ code: 'EINVAL' }));
      expect(() => native().statDirs(Int32Array.from(fds), 0)).toThrow(expect.objectContaining({ code: 'EINVAL' }));
    } finally {
      for (const fd of fds) closeSync(fd);
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('renameAtNoReplace: renameat2(2) RENAME_NOREPLACE between directory fds', () => {
  it('moves a file to a free name (same inode, bytes kept), never over a taken one (false, both left as they were), and refuses bad names', () => {
    const dir = mkdtempSync(join(tmpdir(), 'sbx-rename-'));
    const fds: number[] = [];
    try {
      mkdirSync(join(dir, 'a'));
      mkdirSync(join(dir, 'b'));
      const a = openSync(join(dir, 'a'), 'r');
      const b = openSync(join(dir, 'b'), 'r');
      fds.push(a, b);
      writeFileSync(join(dir, 'a', 'x'), 'moved');
      const ino = lstatSync(join(dir, 'a', 'x')).ino;
      expect(native().renameAtNoReplace(a, Buffer.from('x'), b, Buffer.from('y'))).toBe(true);
      expect(existsSync(join(dir, 'a', 'x'))).toBe(false);
      expect(lstatSync(join(dir, 'b', 'y')).ino).toBe(ino);
      expect(readFileSync(join(dir, 'b', 'y'), 'utf8')).toBe('moved');
      // The name is taken (here by a symlink, never followed): nothing moves, nothing is replaced.
      writeFileSync(join(dir, 'a', 'z'), 'other');
      symlinkSync('/etc/passwd', join(dir, 'b', 'link'));
      expect(native().renameAtNoReplace(a, Buffer.from('z'), b, Buffer.from('y'))).toBe(false);
      expect(native().renameAtNoReplace(a, Buffer.from('z'), b, Buffer.from('link'))).toBe(false);
      expect(readFileSync(join(dir, 'a', 'z'), 'utf8')).toBe('other');
      expect(readFileSync(join(dir, 'b', 'y'), 'utf8')).toBe('moved');
      expect(readlinkSync(join(dir, 'b', 'link'))).toBe('/etc/passwd');
      expect(() => native().renameAtNoReplace(a, Buffer.from('gone'), b, Buffer.from('w'))).toThrow(
        expect.objectContaining({ code: 'ENOENT', syscall: 'renameat2' }),
      );
      expect(() => native().renameAtNoReplace(a, Buffer.from('z/..'), b, Buffer.from('w'))).toThrow(expect.objectContaining({ code: 'EINVAL' }));
      expect(() => native().renameAtNoReplace(a, Buffer.from(''), b, Buffer.from('w'))).toThrow(expect.objectContaining({ code: 'EINVAL' }));
    } finally {
      for (const fd of fds) closeSync(fd);
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('readFileAt and writeFileNewAt: a small file read whole, a new file written, at a directory fd', () => {
  it('reads exact bytes with the fstat before and after as node:fs gives it; a fifo unread; a link refused; a file longer than the buffer fills it', () => {
    const dir = mkdtempSync(join(tmpdir(), 'sbx-fileio-'));
    const dirFd = openSync(dir, 'r');
    try {
      const seed = randomBytes(4).readUInt32BE();
      process.stdout.write(`readFileAt: seed ${seed}\n`);
      const bytes = createHash('sha256').update(`fileio:${seed}`).digest();
      const content = Buffer.concat(Array.from({ length: 400 }, () => bytes)); // 12,800 bytes
      writeFileSync(join(dir, 'f'), content);
      const st = lstatSync(join(dir, 'f'), { bigint: true });
      const buf = Buffer.alloc(20_000);
      const slots = new BigInt64Array(2 * FIO_FIELDS);
      const n = native().readFileAt(dirFd, Buffer.from('f'), 0, buf, slots);
      expect(n).toBe(content.length);
      expect(buf.subarray(0, n).equals(content)).toBe(true);
      // fileio.h's order: size, mode, uid, gid, mtime ns, ctime ns, ino, rdev, dev, blocks, then mtime and ctime as
      // seconds and nanoseconds (timens.h: what stands in for a time past int64 ns); before, then after.
      const secNsec = (ns: bigint) => [ns / 1_000_000_000n, ns % 1_000_000_000n];
      const fields = [
        st.size,
        BigInt(st.mode),
        st.uid,
        st.gid,
        st.mtimeNs,
        st.ctimeNs,
        st.ino,
        st.rdev,
        st.dev,
        st.blocks,
        ...secNsec(st.mtimeNs),
        ...secNsec(st.ctimeNs),
      ];
      expect([...slots.subarray(0, FIO_FIELDS)]).toEqual(fields);
      expect([...slots.subarray(FIO_FIELDS, 2 * FIO_FIELDS)]).toEqual(fields);
      // Longer than the buffer: the buffer's length read (the caller reads it another way).
      const short = Buffer.alloc(1000);
      expect(native().readFileAt(dirFd, Buffer.from('f'), 0, short, slots)).toBe(1000);
      expect(short.equals(content.subarray(0, 1000))).toBe(true);
      // A fifo (O_NONBLOCK: the open does not wait for a writer): 0, unread, its mode says what it is.
      expect(spawnSync('mkfifo', [join(dir, 'p')]).status).toBe(0);
      slots.fill(0n);
      expect(native().readFileAt(dirFd, Buffer.from('p'), fsConstants.O_NONBLOCK, buf, slots)).toBe(0);
      expect(Number(slots[1]) & 0o170000).toBe(0o010000);
      expect(slots[FIO_FIELDS]).toBe(0n); // no fstat after: nothing was read
      symlinkSync('f', join(dir, 'l'));
      expect(() => native().readFileAt(dirFd, Buffer.from('l'), 0, buf, slots)).toThrow(expect.objectContaining({ code: 'ELOOP', syscall: 'open' }));
      expect(() => native().readFileAt(dirFd, Buffer.from('gone'), 0, buf, slots)).toThrow(expect.objectContaining({ code: 'ENOENT', syscall: 'open' }));
      expect(() => native().readFileAt(dirFd, Buffer.from('a/f'), 0, buf, slots)).toThrow(expect.objectContaining({ code: 'EINVAL' }));
      expect(() => native().readFileAt(dirFd, Buffer.from('f'), 0, buf, new BigInt64Array(2 * FIO_FIELDS - 1))).toThrow(
        expect.objectContaining({ code: 'EINVAL' }),
      );
    } finally {
      closeSync(dirFd);
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('writes a new file with its mode, never over a name taken (a planted link not followed); out of room, the file is removed', () => {
    const dir = mkdtempSync(join(tmpdir(), 'sbx-fileio-'));
    const small = join(dir, 'small');
    mkdirSync(small);
    let mounted = false;
    const fds: number[] = [];
    try {
      const dirFd = openSync(dir, 'r');
      fds.push(dirFd);
      const bytes = randomBytes(5000);
      native().writeFileNewAt(dirFd, Buffer.from('o'), 0o444, bytes);
      expect(readFileSync(join(dir, 'o')).equals(bytes)).toBe(true);
      expect(lstatSync(join(dir, 'o')).mode & 0o7777).toBe(0o444 & ~process.umask());
      expect(() => native().writeFileNewAt(dirFd, Buffer.from('o'), 0o444, Buffer.from('other'))).toThrow(
        expect.objectContaining({ code: 'EEXIST', syscall: 'open' }),
      );
      expect(readFileSync(join(dir, 'o')).equals(bytes)).toBe(true);
      symlinkSync(join(dir, 'target'), join(dir, 'planted'));
      expect(() => native().writeFileNewAt(dirFd, Buffer.from('planted'), 0o444, Buffer.from('x'))).toThrow(expect.objectContaining({ code: 'EEXIST' }));
      expect(existsSync(join(dir, 'target'))).toBe(false);
      // A 64 KiB tmpfs: a 1 MiB write fails ENOSPC and leaves no file.
      expect(spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=64k', 'tmpfs', small]).status).toBe(0);
      mounted = true;
      const smallFd = openSync(small, 'r');
      fds.push(smallFd);
      expect(() => native().writeFileNewAt(smallFd, Buffer.from('big'), 0o444, randomBytes(1 << 20))).toThrow(
        expect.objectContaining({ code: 'ENOSPC', syscall: 'write' }),
      );
      expect(readdirSync(small)).toEqual([]);
    } finally {
      for (const fd of fds) closeSync(fd);
      if (mounted) expect(spawnSync('umount', [small]).status).toBe(0);
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

/**
 * The shim's report records, one per write(2): its report fd is a SOCK_SEQPACKET socket (unix(7):
 * record boundaries kept), made by python3, which runs the shim in subreaper mode on argv.
 */
function shimReportWrites(argv: string[]): string[] {
  const script = [
    'import json, socket, subprocess, sys',
    'a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)',
    'shim = sys.argv[1]',
    'p = subprocess.Popen([shim, "--report-fd", str(b.fileno()), "--subreaper", "--", *sys.argv[2:]], pass_fds=[b.fileno()], stdin=subprocess.DEVNULL)',
    'b.close()',
    'records = []',
    'while True:',
    '    r = a.recv(4096)',
    '    if not r: break',
    '    records.append(r.decode())',
    'p.wait()',
    'print(json.dumps(records))',
  ].join('\n');
  const out = execFileSync('/usr/bin/python3', ['-c', script, join(ROOT, 'native-helpers/build/Release/sbx-exec-shim'), ...argv], { encoding: 'utf8' });
  return JSON.parse(out) as string[];
}

describe('exec shim: the subreaper report', () => {
  it('says "leader ..." and "done" in one write when the leader\'s reaping found nothing left, apart when a descendant lived on', () => {
    // 20 runs: the two lines were two writes, read apart whenever the shim was preempted between them.
    for (let i = 0; i < 20; i++) {
      const records = shimReportWrites(['sh', '-c', 'exit 3']);
      expect(records.slice(1)).toEqual(['leader exit 3\ndone 0\n']);
      expect(records[0]).toMatch(/^started \d+\n$/);
    }
    const signaled = shimReportWrites(['sh', '-c', 'kill -9 $$']);
    expect(signaled.slice(1)).toEqual(['leader signal 9\ndone 0\n']);
    // A child that outlives the leader: the leader's line goes out alone, "done" once the child is reaped.
    expect(shimReportWrites(['sh', '-c', 'sleep 0.3 & exit 0']).slice(1)).toEqual(['leader exit 0\n', 'done 1\n']);
  });

  it('says "forwarded", not "signaled" (the answer to a control byte), for a signal sent to the shim itself', () => {
    // sh ignores USR1 and sends it to the shim, which passes it on to sh (and its sleep, once forked).
    const records = shimReportWrites(['sh', '-c', 'trap "" USR1; kill -USR1 $PPID; sleep 0.3; exit 0']);
    expect(records.length).toBe(3);
    expect(records[1]).toMatch(new RegExp(`^forwarded ${osConstants.signals.SIGUSR1} [12]\n$`));
    expect(records[2]).toBe('leader exit 0\ndone 0\n');
  });
});

describe('exec shim: argv on a fd (--argv-fd)', () => {
  it('runs the argv it reads, byte for byte, empty strings included', async () => {
    const r = await runShim(argvPayload(['sh', '-c', 'printf "[%s]" "$@"', 'sh', 'a b', '', 'ü\n']));
    expect(r).toEqual({ status: 0, stdout: '[a b][][ü\n]', stderr: '', report: '' });
    const tini = await runShim(argvPayload(['sh', '-c', 'printf "[%s]" "$@"; exit 3', 'sh', 'x y', '']), 'subreaper');
    expect(tini).toMatchObject({ status: 3, stdout: '[x y][]', stderr: '' });
    expect(tini.report).toMatch(/^started \d+\nleader exit 3\ndone 0\n$/);
  });

  it('refuses a short or garbled argv with "error argv <errno>" and 125, running nothing', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'sbx-shim-argv-'));
    try {
      const marker = join(dir, 'ran');
      const touch = argvPayload(['touch', marker]);
      const cases: [string, Buffer, number][] = [
        ['empty', Buffer.alloc(0), 5],
        ['header cut short', touch.subarray(0, 11), 5],
        ['strings cut short', touch.subarray(0, touch.length - 3), 5],
        ['fewer strings than announced', argvPayload(['touch', marker], { count: 3 }), 71],
        ['more strings than announced', argvPayload(['touch', marker, 'x'], { count: 2, bytes: 6 + marker.length + 1 + 2 }), 71],
        ['bytes after the end', Buffer.concat([touch, Buffer.from('extra\0')]), 71],
        [
          'no NUL at the end',
          Buffer.concat([argvPayload(['touch'], { count: 2, bytes: 6 + marker.length + 1 }).subarray(0, 16 + 6), Buffer.from(`${marker}x`)]),
          71,
        ],
        ['count 0', argvPayload([], { count: 0 }), 71],
        ['absurd size', argvPayload(['touch', marker], { bytes: 2 ** 52 }), 71],
      ];
      for (const [what, payload, errno] of cases) {
        const r = await runShim(payload);
        expect({ what, ...r }).toEqual({ what, status: 125, stdout: '', stderr: '', report: `error argv ${errno}\n` });
        expect(existsSync(marker)).toBe(false);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('hashFilesAt: files read whole and hashed on threads (the read-back of a fan directory)', () => {
  it("gives each name readFileAt's bytes and stats and the SHA-256 of the whole file on 1, 2 and 8 threads; a file of cap bytes or more no digest; a missing one ENOENT, a link ELOOP; bad arguments EINVAL", () => {
    const dir = mkdtempSync(join(tmpdir(), 'sbx-hashfiles-'));
    const fd = openSync(dir, 'r');
    try {
      const CAP = 8192;
      const sizes = [0, 1, 4095, CAP - 1, CAP, CAP + 1, 100_000];
      const files = sizes.map((size, i) => ({ name: `f${i}`, bytes: randomBytes(size) }));
      for (const f of files) writeFileSync(join(dir, f.name), f.bytes);
      mkdirSync(join(dir, 'sub'));
      symlinkSync('f1', join(dir, 'link'));
      const names = [...files.map((f) => f.name), 'missing', 'link', 'sub'];
      const packed = Buffer.from(names.map((n) => `${n}\0`).join(''));
      const stats1 = new BigInt64Array(2 * FIO_FIELDS);
      for (const threads of [1, 2, 8]) {
        const rc = new Float64Array(names.length);
        const stats = new BigInt64Array(names.length * 2 * FIO_FIELDS);
        const digests = Buffer.alloc(names.length * 32, 0xee);
        native().hashFilesAt(fd, packed, fsConstants.O_NONBLOCK, CAP, threads, rc, stats, digests);
        files.forEach((f, i) => {
          const whole = f.bytes.length < CAP;
          expect(rc[i]).toBe(Math.min(f.bytes.length, CAP));
          // readFileAt of the same file fills the same stats, before and after.
          const buf = Buffer.alloc(CAP);
          native().readFileAt(fd, Buffer.from(f.name), 0, buf, stats1);
          expect(stats.subarray(i * 2 * FIO_FIELDS, (i + 1) * 2 * FIO_FIELDS)).toEqual(stats1);
          expect(digests.toString('hex', i * 32, i * 32 + 32)).toBe(whole ? sha256(f.bytes) : 'ee'.repeat(32));
        });
        const at = (name: string) => names.indexOf(name);
        expect(rc[at('missing')]).toBe(-osConstants.errno.ENOENT);
        expect(rc[at('link')]).toBe(-osConstants.errno.ELOOP);
        // A directory: not read (0 bytes), its mode in the stat before, no digest.
        expect(rc[at('sub')]).toBe(0);
        expect(Number(stats[at('sub') * 2 * FIO_FIELDS + 1]) & 0o170000).toBe(0o040000);
        expect(digests.toString('hex', at('sub') * 32, at('sub') * 32 + 32)).toBe('ee'.repeat(32));
      }
      const ok = () => [new Float64Array(1), new BigInt64Array(2 * FIO_FIELDS), Buffer.alloc(32)] as const;
      const bad =
        (names: Buffer, cap = CAP, threads = 2) =>
        () =>
          native().hashFilesAt(fd, names, 0, cap, threads, ...ok());
      for (const names of [Buffer.from('f0'), Buffer.from('\0'), Buffer.from('a/b\0'), Buffer.from(`${'x'.repeat(256)}\0`), Buffer.from('f0\0f1\0')])
        expect(bad(names)).toThrow(expect.objectContaining({ code: 'EINVAL' }));
      expect(bad(Buffer.from('f0\0'), 0)).toThrow(expect.objectContaining({ code: 'EINVAL' }));
      expect(bad(Buffer.from('f0\0'), CAP, 0)).toThrow(expect.objectContaining({ code: 'EINVAL' }));
      expect(() => native().hashFilesAt(fd, Buffer.alloc(0), 0, CAP, 2, new Float64Array(0), new BigInt64Array(0), Buffer.alloc(0))).not.toThrow();
      // A fifo under a name, with no O_NONBLOCK asked: opened non-blocking all the same (not
      // read, not waited on for a writer). In a child with a deadline: a regression hangs there.
      expect(spawnSync('mkfifo', [join(dir, 'p')]).status).toBe(0);
      const script = `const n = require(${JSON.stringify(join(ROOT, 'native-helpers/build/Release/sbx_native.node'))});
        const fd = require('node:fs').openSync(${JSON.stringify(dir)}, 'r');
        const rc = new Float64Array(1), st = new BigInt64Array(${2 * FIO_FIELDS});
        n.hashFilesAt(fd, Buffer.from('p\\0'), 0, 64, 2, rc, st, Buffer.alloc(32));
        console.log(rc[0], (Number(st[1]) & 0o170000).toString(8));`;
      const child = spawnSync(process.execPath, ['-e', script], { timeout: 10_000, encoding: 'utf8' });
      expect({ status: child.status, stdout: child.stdout.trim(), stderr: child.stderr }).toEqual({ status: 0, stdout: '0 10000', stderr: '' });
    } finally {
      closeSync(fd);
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('mountIdUnique and mountIdOf: the id of the mount an fd is on', () => {
  const unique = (() => {
    const fd = openSync('/', fsConstants.O_RDONLY | fsConstants.O_DIRECTORY);
    try {
      return native().mountIdUnique(fd) !== null;
    } finally {
      closeSync(fd);
    }
  })();
  it.skipIf(!unique)(
    unique
      ? 'is one for two fds on one mount, and another once the same path is mounted again (where /proc mnt_id may come back the same)'
      : 'needs statx STATX_MNT_ID_UNIQUE (Linux 6.8; absent here)',
    () => {
      const at = mkdtempSync(join(tmpdir(), 'sbx-mntid-'));
      let mounted = false;
      const idsAt = () => {
        const fds = [0, 1].map(() => openSync(at, fsConstants.O_RDONLY | fsConstants.O_DIRECTORY));
        try {
          const proc = /^mnt_id:\s*(\d+)$/m.exec(readFileSync(`/proc/self/fdinfo/${fds[0]}`, 'utf8'))![1];
          return { of: fds.map((fd) => mountIdOf(fd)), raw: native().mountIdUnique(fds[0]!), proc };
        } finally {
          for (const fd of fds) closeSync(fd);
        }
      };
      try {
        execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'sbx-test-mntid', at]);
        mounted = true;
        const first = idsAt();
        expect(first.of[0]).toBe(`u${first.raw}`);
        expect(first.of[1]).toBe(first.of[0]);
        execFileSync('umount', [at]);
        mounted = false;
        execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'sbx-test-mntid', at]);
        mounted = true;
        const second = idsAt();
        console.log(`/proc mnt_id ${first.proc} then ${second.proc}; unique ${first.raw} then ${second.raw}`);
        expect(second.of[0]).not.toBe(first.of[0]);
      } finally {
        if (mounted) spawnSync('umount', [at]);
        rmSync(at, { recursive: true, force: true });
      }
    },
  );
});
