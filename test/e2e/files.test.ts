// Files over the transport, as sessions (docs/guide/files.md), against a real daemon: a 100 MB file
// byte-exact both ways, a tree with odd names, modes and symlinks through upload + download,
// writes through planted links refused (write_file and upload), FIFOs and devices refused, small frames, the size limit and the stream quota as errors, the
// file sessions in a task's receipt and in the workspace's changes, and the user option.
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chmodSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { createServer, connect as netConnect, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { download, readFile, upload, writeFile } from '../../ipc/files.js';
import { sha256, TestDaemon, until } from '../helpers/daemon.js';
import { WorkspaceRig } from '../helpers/workspace.js';

const MiB = 1024 * 1024;
let daemon: TestDaemon;
let small: TestDaemon; // drain.quotaBytes 1 MiB, files.maxBytes 4 MiB
const temps: string[] = [];
const tempDir = (tag: string) => {
  const d = mkdtempSync(join(tmpdir(), `sbx-files-${tag}-`));
  temps.push(d);
  return d;
};

beforeAll(async () => {
  daemon = await new TestDaemon().start();
  small = await new TestDaemon({ config: { drain: { quotaBytes: MiB, postDeathDrainMs: 2000 }, files: { maxBytes: 4 * MiB } } }).start();
});
afterAll(async () => {
  expect(await daemon.stop()).toEqual({ code: 0, signal: null });
  expect(await small.stop()).toEqual({ code: 0, signal: null });
  for (const d of temps) rmSync(d, { recursive: true, force: true });
});

/** The file tool: the build's, or its copy (laid out as under dist/) in a 0755 temp dir when the checkout is not readable by others (supervisor/files/sessions.ts). */
const TOOL = expect.stringMatching(/(\/dist|\/sandbox-supervisor-file-tool-[^/]+)\/supervisor\/files\/file-tool\.js$/);

describe('writeFile and readFile', () => {
  it('a 100 MB file round-trips byte-exact (sha256), with its mode, as honest sessions', async () => {
    const seed = randomBytes(8).toString('hex');
    console.log(`files.test seed ${seed}`);
    const data = Buffer.alloc(100 * 1000 * 1000);
    // Random-looking but cheap: 1 MiB of random bytes repeated with the block index mixed in.
    const block = randomBytes(MiB);
    for (let at = 0, i = 0; at < data.length; at += MiB, i++) {
      block.copy(data, at);
      data.writeUInt32BE(i, at);
    }
    const dir = tempDir('big');
    const path = join(dir, 'big.bin');
    const t0 = performance.now();
    const w = await writeFile({ socketPath: daemon.socketPath }, path, data, { mode: 0o600 });
    const t1 = performance.now();
    expect(w.receipt.exit.code).toBe(0);
    expect(w.receipt.argv).toEqual([process.execPath, TOOL, 'write', path, '--mode', '0600', '--size', String(data.length)]);
    expect(w.invocation_key).toMatch(/^file-write-[0-9a-f]{24}$/);
    expect(sha256(readFileSync(path))).toBe(sha256(data));
    expect(statSync(path).mode & 0o7777).toBe(0o600);
    expect(readdirSync(dir)).toEqual(['big.bin']); // no temp file left
    const back = await readFile({ socketPath: daemon.socketPath }, path);
    const t2 = performance.now();
    console.log(`files.test 100 MB: writeFile ${Math.round(t1 - t0)} ms, readFile ${Math.round(t2 - t1)} ms`);
    expect(back.length).toBe(data.length);
    expect(sha256(back)).toBe(sha256(data));
    expect(back.result.receipt.output.stdout!.sha256).toBe(sha256(data));
    expect(back.result.receipt.argv.slice(2)).toEqual(['read', path]);
  }, 120_000);

  it('a key makes the call exactly once: the same key answers the same session and receipt', async () => {
    const dir = tempDir('key');
    const path = join(dir, 'k.txt');
    const key = `files-key-${randomBytes(4).toString('hex')}`;
    const first = await writeFile({ socketPath: daemon.socketPath }, path, Buffer.from('one'), { key });
    const again = await writeFile({ socketPath: daemon.socketPath }, path, Buffer.from('one'), { key });
    expect(again.session_id).toBe(first.session_id);
    expect(again.receipt.session_id).toBe(first.receipt.session_id);
    await expect(writeFile({ socketPath: daemon.socketPath }, path, Buffer.from('two!'), { key })).rejects.toMatchObject({ code: 'KEY_CONFLICT' });
    expect(readFileSync(path, 'utf8')).toBe('one');
  });

  it('a write through a planted symlink (the final name, a parent) is refused and the target is unchanged', async () => {
    const dir = tempDir('link');
    const outside = tempDir('outside');
    writeFileSync(join(outside, 'victim'), 'original');
    symlinkSync(join(outside, 'victim'), join(dir, 'final-link'));
    symlinkSync(outside, join(dir, 'dir-link'));
    const target = { socketPath: daemon.socketPath };
    await expect(writeFile(target, join(dir, 'final-link'), Buffer.from('evil'))).rejects.toMatchObject({ code: 'SYMLINK_REFUSED' });
    await expect(writeFile(target, join(dir, 'dir-link', 'victim'), Buffer.from('evil'))).rejects.toMatchObject({ code: 'SYMLINK_REFUSED' });
    await expect(writeFile(target, join(dir, 'dir-link', 'new'), Buffer.from('evil'))).rejects.toMatchObject({ code: 'SYMLINK_REFUSED' });
    await expect(readFile(target, join(dir, 'final-link'))).rejects.toMatchObject({ code: 'SYMLINK_REFUSED' });
    expect(readFileSync(join(outside, 'victim'), 'utf8')).toBe('original');
    expect(readdirSync(outside)).toEqual(['victim']);
    expect(lstatSync(join(dir, 'final-link')).isSymbolicLink()).toBe(true);
    expect(readdirSync(dir).sort()).toEqual(['dir-link', 'final-link']); // no temp file left
    // The other errors of the tool, by code.
    await expect(writeFile(target, join(dir, 'missing', 'x'), Buffer.from('x'))).rejects.toMatchObject({ code: 'NOT_FOUND' });
    writeFileSync(join(dir, 'plain'), 'p');
    await expect(writeFile(target, join(dir, 'plain', 'x'), Buffer.from('x'))).rejects.toMatchObject({ code: 'NOT_A_DIRECTORY' });
    await expect(readFile(target, dir)).rejects.toMatchObject({ code: 'IS_A_DIRECTORY' });
    await expect(readFile(target, join(dir, 'nope'))).rejects.toMatchObject({ code: 'NOT_FOUND' });
    // Fewer bytes than size_bytes (a client that gave up): SIZE_MISMATCH on stderr, exit 1, no file, no temp file.
    const c = await daemon.client();
    const short = await c.request('write_file', { path: join(dir, 'short'), size_bytes: 10 });
    await c.request('write', { session_id: short.session_id, data: Buffer.from('12345'), offset: 0, eof: true });
    const receipt = await c.wait({ session_id: short.session_id });
    expect(receipt.exit.code).toBe(1);
    expect(JSON.parse((await c.read({ session_id: short.session_id }, 'stderr')).toString())).toMatchObject({
      code: 'SIZE_MISMATCH',
      expected: 10,
      received: 5,
    });
    expect(readdirSync(dir).sort()).toEqual(['dir-link', 'final-link', 'plain']);
  });

  it('a write_file whose client never finishes: its deadline (timeout_ms) ends it with no file and no temp file left', async () => {
    const dir = tempDir('deadline');
    const c = await daemon.client();
    const s = await c.request('write_file', { path: join(dir, 'never'), size_bytes: 10, timeout_ms: 300 });
    await c.request('write', { session_id: s.session_id, data: Buffer.from('123'), offset: 0 });
    const receipt = await c.wait({ session_id: s.session_id });
    expect([receipt.outcome, receipt.termination.cause, receipt.exit.signal]).toEqual(['timed_out', 'deadline', 'SIGTERM']);
    expect(JSON.parse((await c.read({ session_id: s.session_id }, 'stderr')).toString())).toMatchObject({ code: 'FILE_ERROR', signal: 'SIGTERM' });
    expect(readdirSync(dir)).toEqual([]);
  });

  it('a size over files.maxBytes is LIMIT_EXCEEDED up front; a file over the stream quota is OUTPUT_QUOTA_EXCEEDED, never a tail', async () => {
    const dir = tempDir('quota');
    const path = join(dir, 'q.bin');
    const target = { socketPath: small.socketPath };
    const c = await small.client();
    await expect(c.request('write_file', { path, size_bytes: 4 * MiB + 1 })).rejects.toMatchObject({
      code: 'LIMIT_EXCEEDED',
      details: { limit: 'file_bytes', size_bytes: 4 * MiB + 1, max_bytes: 4 * MiB },
    });
    await expect(writeFile(target, path, Buffer.alloc(4 * MiB + 1))).rejects.toMatchObject({ code: 'LIMIT_EXCEEDED' });
    expect(readdirSync(dir)).toEqual([]);
    const data = randomBytes(3 * MiB);
    await writeFile(target, path, data);
    expect(sha256(readFileSync(path))).toBe(sha256(data));
    const err = await readFile(target, path).then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toMatchObject({ code: 'OUTPUT_QUOTA_EXCEEDED', details: { total_bytes: 3 * MiB, stored_bytes: MiB, dropped_bytes: 2 * MiB } });
    expect((err as Error).message).toContain(`${3 * MiB} bytes are past the session's stream quota`);
    // Within the quota it reads.
    writeFileSync(join(dir, 'fits'), data.subarray(0, MiB));
    expect(sha256(await readFile(target, join(dir, 'fits')))).toBe(sha256(data.subarray(0, MiB)));
  });

  it('a FIFO or device is never opened: read_file and write_file answer NOT_A_REGULAR_FILE at once', async () => {
    const dir = tempDir('fifo');
    const fifo = join(dir, 'fifo');
    expect(spawnSync('mkfifo', [fifo]).status).toBe(0);
    const target = { socketPath: daemon.socketPath };
    // timeoutMs: the old open() blocked on the FIFO until the deadline (then SIGKILL).
    await expect(readFile(target, fifo, { timeoutMs: 20_000 })).rejects.toMatchObject({ code: 'NOT_A_REGULAR_FILE' });
    await expect(readFile(target, '/dev/null')).rejects.toMatchObject({ code: 'NOT_A_REGULAR_FILE' });
    await expect(writeFile(target, fifo, Buffer.from('x'), { timeoutMs: 20_000 })).rejects.toMatchObject({ code: 'NOT_A_REGULAR_FILE' });
    expect(lstatSync(fifo).isFIFO()).toBe(true);
    expect(readdirSync(dir)).toEqual(['fifo']);
    await expect(writeFile(target, `${dir}/`, Buffer.from('x'))).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', details: { field: 'path' } });
  });

  it('a server with ipc.maxFrameBytes under 4 MiB: the hello says it, writeFile and upload size their writes to fit', async () => {
    const tiny = await new TestDaemon({ config: { ipc: { maxFrameBytes: 256 * 1024 } } }).start();
    try {
      const c = await tiny.client();
      expect(c.hello.max_frame_bytes).toBe(256 * 1024);
      const dir = tempDir('tinyframe');
      const data = randomBytes(3 * MiB + 5);
      await writeFile({ socketPath: tiny.socketPath }, join(dir, 'f'), data);
      expect(sha256(readFileSync(join(dir, 'f')))).toBe(sha256(data));
      const remote = tempDir('tinyframe-up');
      await upload({ socketPath: tiny.socketPath }, dir, remote);
      expect(sha256(readFileSync(join(remote, 'f')))).toBe(sha256(data));
    } finally {
      expect(await tiny.stop()).toEqual({ code: 0, signal: null });
    }
  }, 60_000);

  it('the user option: the file is made by and owned by that user', async () => {
    const nobody = spawnSync('id', ['-u', 'nobody']).stdout.toString().trim();
    expect(nobody).toMatch(/^\d+$/);
    const dir = tempDir('user');
    chmodSync(dir, 0o777);
    const path = join(dir, 'owned');
    const r = await writeFile({ socketPath: daemon.socketPath }, path, Buffer.from('mine'), { user: 'nobody', mode: 0o640 });
    expect(r.receipt.uid).toBe(Number(nobody));
    const st = statSync(path);
    expect([st.uid, st.mode & 0o7777]).toEqual([Number(nobody), 0o640]);
    // A directory nobody may not write into: PERMISSION_DENIED.
    const closed = tempDir('closed');
    chmodSync(closed, 0o755);
    await expect(writeFile({ socketPath: daemon.socketPath }, join(closed, 'x'), Buffer.from('x'), { user: 'nobody' })).rejects.toMatchObject({
      code: 'PERMISSION_DENIED',
    });
  });
});

/** Every entry under root (relative path -> type, mode, link target or sha256), lstat only. */
function tree(root: string): Record<string, string> {
  const out: Record<string, string> = {};
  const walk = (rel: string) => {
    for (const name of readdirSync(join(root, rel))) {
      const r = rel ? `${rel}/${name}` : name;
      const p = join(root, r);
      const st = lstatSync(p);
      const mode = (st.mode & 0o7777).toString(8);
      if (st.isSymbolicLink()) out[r] = `link ${readlinkSync(p)}`;
      else if (st.isDirectory()) {
        out[r] = `dir ${mode}`;
        walk(r);
      } else out[r] = `file ${mode} ${sha256(readFileSync(p))}`;
    }
  };
  walk('');
  return out;
}

/**
 * A Unix socket proxy to the daemon that cuts connection i (both sides destroyed) once it has
 * carried cuts[i] bytes, either way; later connections pass whole. Counts the connections.
 */
function cuttingProxy(upstream: string, path: string, cuts: number[]): Promise<{ server: Server; connections: () => number; close: () => Promise<void> }> {
  let n = 0;
  const open = new Set<Socket>();
  const server = createServer((client) => {
    const limit = cuts[n++] ?? Infinity;
    const up = netConnect(upstream);
    open.add(client).add(up);
    let carried = 0;
    const cut = () => {
      client.destroy();
      up.destroy();
    };
    const pass = (from: Socket, to: Socket) =>
      from.on('data', (d: Buffer) => {
        carried += d.length;
        if (carried > limit) return cut();
        if (!to.write(d)) {
          from.pause();
          to.once('drain', () => from.resume());
        }
      });
    pass(client, up);
    pass(up, client);
    for (const s of [client, up]) {
      s.on('error', cut);
      s.on('close', () => {
        open.delete(s);
        cut();
      });
    }
  });
  return new Promise((resolve) =>
    server.listen(path, () =>
      resolve({
        server,
        connections: () => n,
        close: () =>
          new Promise<void>((r) => {
            for (const s of open) s.destroy();
            server.close(() => r());
          }),
      }),
    ),
  );
}

describe('drops', () => {
  it('writeFile and readFile through a connection cut at random points: one session each, every byte once', async () => {
    const seed = randomBytes(4).readUInt32BE(0);
    console.log(`files.test drops seed ${seed}`);
    let x = seed || 1;
    const rand = (max: number) => {
      x ^= x << 13;
      x ^= x >>> 17;
      x ^= x << 5;
      return (x >>> 0) % max;
    };
    const size = 24 * MiB + rand(MiB);
    const data = randomBytes(size);
    const cuts = [1, 2, 3, 4, 5, 6, 7, 8].map(() => 4096 + rand(Math.floor(size / 3)));
    const dir = tempDir('drops');
    const proxy = await cuttingProxy(daemon.socketPath, join(dir, 'proxy.sock'), cuts);
    try {
      const target = { socketPath: join(dir, 'proxy.sock'), reconnectMs: 20_000 };
      const key = `drops-${seed}`;
      const w = await writeFile(target, join(dir, 'f'), data, { key });
      expect(proxy.connections()).toBeGreaterThan(1); // it was cut at least once
      expect(sha256(readFileSync(join(dir, 'f')))).toBe(sha256(data));
      const c = await daemon.client();
      const sessions = (await c.ps(true)).sessions.filter((s) => s.invocation_key === key);
      expect(sessions.map((s) => s.session_id)).toEqual([w.session_id]);
      // The read: its first connection (launch, wait) passes whole, its stream's are cut.
      const readCuts = [Infinity, ...[1, 2, 3, 4].map(() => 4096 + rand(Math.floor(size / 3)))];
      const readProxy = await cuttingProxy(daemon.socketPath, join(dir, 'read.sock'), readCuts);
      try {
        const back = await readFile({ socketPath: join(dir, 'read.sock'), reconnectMs: 20_000 }, join(dir, 'f'));
        expect(sha256(back)).toBe(sha256(data));
        expect(readProxy.connections()).toBeGreaterThan(2);
        console.log(
          `files.test drops: cuts ${cuts.join(', ')} / ${readCuts.join(', ')} of ${size} bytes; ${proxy.connections()} connections for the write, ${readProxy.connections()} for the read`,
        );
      } finally {
        await readProxy.close();
      }
    } finally {
      await proxy.close();
    }
  }, 120_000);
});

describe('upload and download', () => {
  it('a tree with odd names, modes and symlinks round-trips (lstat modes, link targets, bytes)', async () => {
    const local = tempDir('tree-src');
    const names = ['with space', 'new\nline', 'ütf-8 ✓ 名前', '-leading-dash', '--rf', 'tab\there'];
    for (const [i, n] of names.entries()) writeFileSync(join(local, n), randomBytes(1000 + i * 777));
    mkdirSync(join(local, 'sub dir'));
    writeFileSync(join(local, 'sub dir', 'secret'), 'secret\n');
    chmodSync(join(local, 'sub dir', 'secret'), 0o600);
    writeFileSync(join(local, 'sub dir', 'run.sh'), '#!/bin/sh\necho hi\n');
    chmodSync(join(local, 'sub dir', 'run.sh'), 0o755);
    mkdirSync(join(local, 'setgid'));
    chmodSync(join(local, 'setgid'), 0o2775);
    writeFileSync(join(local, 'setgid', 'empty'), '');
    symlinkSync('with space', join(local, 'rel-link'));
    symlinkSync('../ütf-8 ✓ 名前', join(local, 'sub dir', 'up-link'));
    symlinkSync('does/not/exist', join(local, 'dangling'));
    writeFileSync(join(local, 'big'), randomBytes(9 * MiB + 17)); // more than one 4 MiB write
    const want = tree(local);
    expect(Object.keys(want).length).toBe(names.length + 9);
    expect(want.setgid).toBe('dir 2775');

    const remote = tempDir('tree-remote');
    const up = await upload({ socketPath: daemon.socketPath }, local, remote);
    expect(up.receipt.argv).toEqual([process.execPath, TOOL, 'upload', remote]);
    expect(tree(remote)).toEqual(want);

    const back = tempDir('tree-back');
    const down = await download({ socketPath: daemon.socketPath }, remote, back);
    expect(down.receipt.argv).toEqual(['tar', '-c', '-f', '-', '-C', remote, '.']);
    expect(tree(back)).toEqual(want);
  }, 60_000);

  it('a download larger than the stream quota is OUTPUT_QUOTA_EXCEEDED and extracts nothing', async () => {
    const remote = tempDir('dq-remote');
    writeFileSync(join(remote, 'a'), randomBytes(2 * MiB));
    const local = tempDir('dq-local');
    await expect(download({ socketPath: small.socketPath }, remote, local)).rejects.toMatchObject({ code: 'OUTPUT_QUOTA_EXCEEDED' });
    expect(readdirSync(local)).toEqual([]);
  });

  it('an upload into a missing directory is NOT_FOUND (the walk of the file tool)', async () => {
    const local = tempDir('um');
    writeFileSync(join(local, 'a'), 'a');
    await expect(upload({ socketPath: daemon.socketPath }, local, join(local, 'no', 'such'))).rejects.toMatchObject({ code: 'NOT_FOUND' });
  });

  /** Runs an upload session with these raw tar bytes on stdin; its receipt and the tool's error line (if any). */
  async function rawUpload(dir: string, tarBytes: Buffer) {
    const c = await daemon.client();
    const s = await c.request('upload', { dir });
    await c.request('write', { session_id: s.session_id, data: tarBytes, offset: 0, eof: true });
    const receipt = await c.wait({ session_id: s.session_id });
    const stderr = (await c.read({ session_id: s.session_id }, 'stderr')).toString().trim().split('\n');
    let error: Record<string, unknown> | null = null;
    try {
      error = JSON.parse(stderr[stderr.length - 1]) as Record<string, unknown>;
    } catch {
      // no tool line
    }
    return { receipt, error };
  }

  it('an upload never writes through a link planted in DIR: a directory over a link is SYMLINK_REFUSED, a file replaces the link; no staging dir is left', async () => {
    const src = tempDir('plant-src');
    mkdirSync(join(src, 'sub'));
    writeFileSync(join(src, 'sub', 'planted'), 'evil');
    // Only the member sub/planted (no entry for sub/): the old tar -x -C DIR opened DIR/sub/planted through the link.
    const onlyFile = spawnSync('tar', ['-c', '-f', '-', '-C', src, '--no-recursion', 'sub/planted']).stdout;
    const remote = tempDir('plant-remote');
    const victim = tempDir('plant-victim');
    symlinkSync(victim, join(remote, 'sub'));
    const r = await rawUpload(remote, onlyFile);
    expect(r.receipt.exit.code).toBe(1);
    expect(r.error).toMatchObject({ code: 'SYMLINK_REFUSED', path: `${remote}/sub` });
    expect(readdirSync(victim)).toEqual([]);
    expect(readdirSync(remote)).toEqual(['sub']); // the link kept, no .sbx-upload-* left
    // The same through the client (a tree with sub/ a directory).
    await expect(upload({ socketPath: daemon.socketPath }, src, remote)).rejects.toMatchObject({ code: 'SYMLINK_REFUSED' });
    expect(readdirSync(victim)).toEqual([]);
    expect(readdirSync(remote)).toEqual(['sub']);
    // A file of the archive where DIR has a link: the link is replaced (rename), the victim untouched.
    const fileSrc = tempDir('plant-file');
    writeFileSync(join(fileSrc, 'sub'), 'a file now');
    writeFileSync(join(victim, 'keep'), 'keep');
    symlinkSync(join(victim, 'keep'), join(remote, 'flink'));
    writeFileSync(join(fileSrc, 'flink'), 'replaced');
    await upload({ socketPath: daemon.socketPath }, fileSrc, remote);
    expect(lstatSync(join(remote, 'sub')).isFile()).toBe(true);
    expect(readFileSync(join(remote, 'flink'), 'utf8')).toBe('replaced');
    expect(readFileSync(join(victim, 'keep'), 'utf8')).toBe('keep');
    expect(readdirSync(remote).sort()).toEqual(['flink', 'sub']);
    // What held still holds: a symlink then a file through it, absolute names, "..".
    const esc = tempDir('plant-esc');
    symlinkSync(victim, join(esc, 'l'));
    const src2 = tempDir('plant-src2');
    mkdirSync(join(src2, 'l'));
    writeFileSync(join(src2, 'l', 'planted'), 'evil');
    const linkThen = spawnSync('tar', ['-c', '-f', '-', '-C', esc, 'l', '-C', src2, '--no-recursion', 'l/planted']).stdout; // l -> victim, then l/planted
    const esc2 = tempDir('plant-remote2');
    const r2 = await rawUpload(esc2, linkThen);
    expect(r2.receipt.exit.code).not.toBe(0);
    expect(readdirSync(victim).sort()).toEqual(['keep']);
    expect(readdirSync(esc2).filter((n) => n.startsWith('.sbx-upload-'))).toEqual([]);
    const abs = spawnSync('tar', ['-c', '-P', '-f', '-', join(victim, 'keep')]).stdout;
    await rawUpload(esc2, abs);
    expect(readFileSync(join(victim, 'keep'), 'utf8')).toBe('keep');
    expect(readdirSync(esc2).filter((n) => n.startsWith('.sbx-upload-'))).toEqual([]);
  });

  it('an upload cancelled while its tar waits on stdin (SIGTERM) leaves no staging dir and merges nothing', async () => {
    const src = tempDir('cancel-src');
    writeFileSync(join(src, 'a'), randomBytes(64 * 1024));
    const whole = spawnSync('tar', ['-c', '-f', '-', '-C', src, '.']).stdout;
    const remote = tempDir('cancel-remote');
    const c = await daemon.client();
    const s = await c.request('upload', { dir: remote });
    await c.request('write', { session_id: s.session_id, data: whole.subarray(0, 10_000), offset: 0 });
    // Once the staging dir exists (tar is running), cancel: SIGTERM, then the tool cleans up.
    await until(() => readdirSync(remote).some((n) => n.startsWith('.sbx-upload-')), 'the staging dir', 10_000);
    await c.request('cancel', { session_id: s.session_id });
    const receipt = await c.wait({ session_id: s.session_id });
    expect(receipt.exit.signal).toBe('SIGTERM');
    expect(readdirSync(remote)).toEqual([]);
  });

  it('a download of a FIFO or device is refused (FILE_ERROR, as Python); a socket the remote tar skips is FILE_ERROR naming it', async () => {
    const remote = tempDir('special');
    writeFileSync(join(remote, 'a'), 'a');
    expect(spawnSync('mkfifo', [join(remote, 'fifo')]).status).toBe(0);
    const local = tempDir('special-local');
    await expect(download({ socketPath: daemon.socketPath }, remote, local)).rejects.toMatchObject({
      code: 'FILE_ERROR',
      details: { member: './fifo', type: 'fifo' },
    });
    expect(readdirSync(local).includes('fifo')).toBe(false);
    rmSync(join(remote, 'fifo'));
    const sock = spawnSync('python3', ['-c', `import socket; socket.socket(socket.AF_UNIX).bind(${JSON.stringify(join(remote, 'sock'))})`]);
    expect(sock.status).toBe(0);
    const local2 = tempDir('special-local2');
    await expect(download({ socketPath: daemon.socketPath }, remote, local2)).rejects.toMatchObject({ code: 'FILE_ERROR', details: { skipped: ['./sock'] } });
    expect(readdirSync(local2)).toEqual([]);
  });
});

describe('files in a task and a workspace', () => {
  const rig = new WorkspaceRig();
  afterAll(() => rig.cleanup());

  it('the file sessions appear in the task receipt, and their writes in changes attributed to them', async () => {
    const { d, paths } = await rig.daemon((dir) => {
      mkdirSync(join(dir, 'ws'));
      return [join(dir, 'ws')];
    });
    const ws = paths[0];
    const target = { socketPath: d.socketPath };
    const w = await writeFile(target, join(ws, 'out.txt'), Buffer.from('hello\n'), { task: 'files-task', key: 'fw' });
    const local = tempDir('task-up');
    writeFileSync(join(local, 'up.txt'), 'up\n');
    const u = await upload(target, local, ws, { task: 'files-task', key: 'fu' });
    const rd = await readFile(target, join(ws, 'out.txt'), { task: 'files-task', key: 'fr' });
    expect(rd.toString()).toBe('hello\n');

    const c = await d.client();
    // Attribution is by the writer's cgroup while its pidfd can be had (docs/guide/workspaces.md "Workspaces"): a
    // write just before the writer exits may be unattributed (counted, never guessed). So: each
    // file session's writes are in its own changes or counted unattributed in its receipt, and
    // never in another session's changes.
    const own: Record<string, (p: string) => boolean> = {
      fw: (p) => p === 'out.txt' || /^\.out\.txt\.sbx-[0-9a-f]{12}\.tmp$/.test(p),
      fu: (p) => p === 'up.txt' || p === '' || p === '.' || /^\.sbx-upload-[0-9a-f]{12}(\/.*)?$/.test(p), // its staging dir too
      fr: () => false,
    };
    let attributedPaths = 0;
    for (const [key, r] of [
      ['fw', w.receipt],
      ['fu', u.receipt],
      ['fr', rd.result.receipt],
    ] as const) {
      const ch = await c.changes({ invocation_key: key });
      const paths = ch.workspaces[0].changes.map((x) => x.path);
      expect(
        paths.filter((p) => !own[key](p)),
        JSON.stringify(ch),
      ).toEqual([]);
      const entry = r.workspace![0];
      expect(entry.gap).toBeNull();
      if (key !== 'fr') expect(entry.attributed.events + entry.unattributed_events, JSON.stringify(entry)).toBeGreaterThan(0);
      else expect(entry.attributed.events).toBe(0); // a read writes nothing
      attributedPaths += paths.length;
    }
    console.log(`files.test workspace: ${attributedPaths} changes attributed to the file sessions`);

    const receipt = await c.closeTask({ task: 'files-task' });
    expect(receipt).toMatchObject({ complete: true, workspaces: [ws] });
    expect(receipt.sessions.map((s) => s.invocation_key).sort()).toEqual(['fr', 'fu', 'fw']);
    expect(receipt.sessions.find((s) => s.invocation_key === 'fu')!.session_id).toBe(u.session_id);
  }, 60_000);
});
