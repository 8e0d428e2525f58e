// The `sbx` bin is a launcher (cli/sbx-launcher.sh) that starts the CLI from a V8 startup
// snapshot (scripts/build/sbx-snapshot.mjs) when the node that made it is there, else from
// sbx.js. Both paths, as users reach them (directly, through a symlink as npx does, a stale
// snapshot), give the same bytes and statuses; signals reach the session; the commands the
// snapshot leaves out (verify) start from sbx.js.
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { generateKeyPairSync } from 'node:crypto';
import {
  chmodSync,
  copyFileSync,
  cpSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  symlinkSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VERSION } from '../../ipc/version.js';
import { ROOT, SBX_BIN, TestDaemon, until } from '../helpers/daemon.js';

let daemon: TestDaemon;
let tmp: string;
beforeAll(async () => {
  daemon = await new TestDaemon().start();
  tmp = mkdtempSync(join(tmpdir(), 'sbx-launcher-'));
});
afterAll(async () => {
  rmSync(tmp, { recursive: true, force: true });
  expect(await daemon.stop()).toEqual({ code: 0, signal: null });
});

const env = () => ({ ...process.env, SBX_SOCKET: daemon.socketPath });

/** Starts `bin run -- sleep 30`, returns it once the session runs, with what its process runs (/proc/PID/cmdline). */
async function running(bin: string, extraEnv: NodeJS.ProcessEnv = {}): Promise<{ child: ReturnType<typeof spawn>; cmdline: string[]; sessionId: string }> {
  const key = `launcher-${Math.random().toString(36).slice(2)}`;
  const child = spawn(bin, ['run', '--key', key, '--', 'sleep', '30'], { env: { ...env(), ...extraEnv }, stdio: ['ignore', 'pipe', 'pipe'] });
  const client = await daemon.client();
  const row = await until(async () => (await client.ps(true)).sessions.find((s) => s.invocation_key === key && s.state === 'running'), 'the session to run');
  const cmdline = readFileSync(`/proc/${child.pid}/cmdline`, 'utf8').split('\0').filter(Boolean);
  client.close();
  return { child, cmdline, sessionId: row.session_id };
}

/** A copy of the build in tmp/name (dist and package.json copied, node_modules linked); returns its root. */
function copyOfBuild(name: string): string {
  const copy = join(tmp, name);
  mkdirSync(copy);
  cpSync(join(ROOT, 'dist'), join(copy, 'dist'), { recursive: true });
  copyFileSync(join(ROOT, 'package.json'), join(copy, 'package.json'));
  symlinkSync(join(ROOT, 'node_modules'), join(copy, 'node_modules'));
  return copy;
}

describe('the sbx launcher', () => {
  it('starts from the snapshot made by this node (named in sbx.blob.node), directly and through a symlink', async () => {
    expect(readFileSync(join(ROOT, 'dist/cli/sbx.blob.node'), 'utf8').split('\n')[0]).toBe(process.execPath);
    expect(execFileSync(SBX_BIN, ['--version'], { encoding: 'utf8' })).toBe(`${VERSION}\n`);
    const link = join(tmp, 'bin');
    mkdirSync(link);
    symlinkSync(SBX_BIN, join(link, 'sbx'));
    for (const bin of [SBX_BIN, join(link, 'sbx')]) {
      const { child, cmdline } = await running(bin);
      expect(cmdline.slice(0, 4)).toEqual([process.execPath, '--snapshot-blob', join(ROOT, 'dist/cli/sbx.blob'), '--']);
      child.kill('SIGKILL');
      await until(() => child.exitCode !== null || child.signalCode !== null, 'sbx to be gone');
    }
  });

  it('from the snapshot: exact bytes on both streams, the exit status, arguments with spaces and a second --', () => {
    const r = spawnSync(SBX_BIN, ['run', '--', 'sh', '-c', 'printf "%s|" "$@"; printf err >&2; exit 7', 'sh', 'a b', '--', '-x'], { env: env() });
    expect(r.stdout.toString()).toBe('a b|--|-x|');
    expect(r.stderr.toString()).toBe('err');
    expect(r.status).toBe(7);
  });

  it('from the snapshot: SIGTERM to sbx is sent on to the session, which ends by it', async () => {
    const { child, sessionId } = await running(SBX_BIN);
    child.kill('SIGTERM');
    await until(() => child.exitCode !== null, 'sbx to exit with the session');
    expect(child.exitCode).toBe(128 + 15);
    const receipt = await (await daemon.client()).wait({ session_id: sessionId });
    expect(receipt.exit).toEqual({ code: null, signal: 'SIGTERM' });
  });

  it('verify starts from sbx.js (the snapshot leaves its modules out) and checks a receipt', async () => {
    const file = join(tmp, 'receipt.json');
    const r = spawnSync(SBX_BIN, ['run', '--receipt', file, '--', 'true'], { env: env() });
    expect(r.status).toBe(0);
    const v = spawnSync(SBX_BIN, ['verify', file, '--state-dir', daemon.stateDir], { env: env(), encoding: 'utf8' });
    expect(v.stderr).toBe('');
    expect(v.stdout).toMatch(/^OK: signed by /);
    expect(v.status).toBe(0);
    // Against another state dir's key: MISMATCH, and which key file was taken.
    const other = join(tmp, 'other-state');
    mkdirSync(other);
    writeFileSync(join(other, 'receipt-key.pub'), generateKeyPairSync('ed25519').publicKey.export({ type: 'spki', format: 'pem' }));
    const w = spawnSync(SBX_BIN, ['verify', file, '--state-dir', other], { env: env(), encoding: 'utf8' });
    expect(w.stdout).toMatch(/^MISMATCH: signed by key sha256:[0-9a-f]+, but the key checked against is sha256:[0-9a-f]+\n/);
    expect(w.stderr).toBe(
      `sbx: the key checked against is ${join(other, 'receipt-key.pub')} (in --state-dir); a receipt from another supervisor needs its key: --public-key FILE or --state-dir DIR\n`,
    );
    expect(w.status).toBe(1);
  });

  it('NODE_OPTIONS set (a V8 flag would make node refuse the snapshot, exit 14): starts from sbx.js, same bytes and status', async () => {
    const opts = { NODE_OPTIONS: '--max-old-space-size=4096' };
    const { child, cmdline } = await running(SBX_BIN, opts);
    expect(cmdline.slice(1, 3)).toEqual([join(ROOT, 'dist/cli/sbx.js'), 'run']);
    child.kill('SIGKILL');
    await until(() => child.exitCode !== null || child.signalCode !== null, 'sbx to be gone');
    // --inherit-env passes NODE_OPTIONS on to the command unchanged.
    const r = spawnSync(SBX_BIN, ['run', '--inherit-env', '--', 'sh', '-c', 'printf "%s" "$NODE_OPTIONS"; printf err >&2; exit 4'], {
      env: { ...env(), ...opts },
    });
    expect(r.stderr.toString()).toBe('err');
    expect(r.stdout.toString()).toBe('--max-old-space-size=4096');
    expect(r.status).toBe(4);
    // An empty NODE_OPTIONS is none: the snapshot.
    const empty = await running(SBX_BIN, { NODE_OPTIONS: '' });
    expect(empty.cmdline.slice(1, 3)).toEqual(['--snapshot-blob', join(ROOT, 'dist/cli/sbx.blob')]);
    empty.child.kill('SIGKILL');
    await until(() => empty.child.exitCode !== null || empty.child.signalCode !== null, 'sbx to be gone');
  });

  it('the stamped node replaced in place (a new file renamed over it, as dpkg installs, whatever its mtime): starts from sbx.js, same bytes and status', async () => {
    const copy = copyOfBuild('replaced');
    const bin = join(copy, 'dist/cli/sbx');
    // The node the stamp names, at a path of the copy's own: this node, through a script.
    const node = join(copy, 'node');
    const upgraded = `#!/bin/sh\nexec ${process.execPath} --stack-size=900 "$@"\n`;
    const original = `#!/bin/sh\nexec ${process.execPath} "$@"\n`;
    // The same size as its replacement (a comment fills it): only the inode tells them apart.
    writeFileSync(node, original.replace('\n', `\n#${'x'.repeat(upgraded.length - original.length - 2)}\n`));
    chmodSync(node, 0o755);
    const mtime = new Date('2026-01-01T00:00:00Z');
    utimesSync(node, mtime, mtime);
    const st = statSync(node);
    writeFileSync(join(copy, 'dist/cli/sbx.blob.node'), `${node}\n${process.version}\n${st.dev}:${st.ino}:${st.size}:${Math.floor(st.mtimeMs / 1000)}\n`);
    const before = await running(bin);
    expect(before.cmdline.slice(0, 4)).toEqual([process.execPath, '--snapshot-blob', join(copy, 'dist/cli/sbx.blob'), '--']);
    before.child.kill('SIGKILL');
    await until(() => before.child.exitCode !== null || before.child.signalCode !== null, 'sbx to be gone');
    // Upgraded in place: a new file, same size and mtime, renamed over it. A V8 flag makes it
    // a node that refuses the old snapshot as another version's would (exit 14).
    writeFileSync(`${node}.new`, upgraded);
    expect(statSync(`${node}.new`).size).toBe(st.size);
    chmodSync(`${node}.new`, 0o755);
    utimesSync(`${node}.new`, mtime, mtime);
    renameSync(`${node}.new`, node);
    const r = spawnSync(bin, ['run', '--', 'sh', '-c', 'printf out; exit 4'], { env: env() });
    expect(r.stderr.toString()).toBe('');
    expect(r.stdout.toString()).toBe('out');
    expect(r.status).toBe(4);
    const after = await running(bin);
    expect(after.cmdline.slice(0, 3)).toEqual([process.execPath, '--stack-size=900', join(copy, 'dist/cli/sbx.js')]);
    after.child.kill('SIGKILL');
    await until(() => after.child.exitCode !== null || after.child.signalCode !== null, 'sbx to be gone');
  });

  it('a snapshot made by another node, or by a node file since replaced (an upgrade): starts from sbx.js, same bytes and status', async () => {
    // A copy of the build whose stamp no longer fits.
    const copy = copyOfBuild('copy');
    const bin = join(copy, 'dist/cli/sbx');
    const [, , identity] = readFileSync(join(ROOT, 'dist/cli/sbx.blob.node'), 'utf8').split('\n');
    for (const stale of ['another node', 'the node file replaced'] as const) {
      // (the identity is st_dev:st_ino:st_size:st_mtime; another inode stands for a replaced file)
      const [dev, ino, size, mtime] = identity!.split(':');
      const stamp =
        stale === 'another node'
          ? `/nonexistent/node\nv0.0.0\n${identity}\n`
          : `${process.execPath}\n${process.version}\n${dev}:${Number(ino) + 1}:${size}:${mtime}\n`;
      writeFileSync(join(copy, 'dist/cli/sbx.blob.node'), stamp);
      const { child, cmdline } = await running(bin);
      expect(cmdline.slice(1)).toEqual([join(copy, 'dist/cli/sbx.js'), 'run', '--key', expect.any(String), '--', 'sleep', '30']);
      child.kill('SIGKILL');
      await until(() => child.exitCode !== null || child.signalCode !== null, 'sbx to be gone');
      const r = spawnSync(bin, ['run', '--', 'sh', '-c', 'printf out; exit 4'], { env: env() });
      expect(r.stdout.toString()).toBe('out');
      expect(r.status).toBe(4);
    }
  });
});
