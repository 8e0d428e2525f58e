// The `sbx` bin is a launcher (cli/sbx-launcher.sh) that starts the CLI from its bundle
// (scripts/build/sbx-bundle.mjs) with the node that built it (dist/cli/sbx.node), else from
// sbx.js, else with the PATH's node. Every path, as users reach them (directly, through a
// symlink as npx does, a build without a bundle, a node since gone), gives the same bytes and
// statuses; signals reach the session; the commands whose modules stay outside the bundle
// (verify) import them from beside it.
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { generateKeyPairSync } from 'node:crypto';
import { chmodSync, copyFileSync, cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
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
  it('starts the bundle with the node that built it (named in sbx.node), directly and through a symlink', async () => {
    expect(readFileSync(join(ROOT, 'dist/cli/sbx.node'), 'utf8')).toBe(`${process.execPath}\n`);
    expect(execFileSync(SBX_BIN, ['--version'], { encoding: 'utf8' })).toBe(`${VERSION}\n`);
    const link = join(tmp, 'bin');
    mkdirSync(link);
    symlinkSync(SBX_BIN, join(link, 'sbx'));
    for (const bin of [SBX_BIN, join(link, 'sbx')]) {
      const { child, cmdline } = await running(bin);
      expect(cmdline.slice(0, 4)).toEqual([process.execPath, '--max-semi-space-size=2', join(ROOT, 'dist/cli/sbx.bundle.cjs'), 'run']);
      child.kill('SIGKILL');
      await until(() => child.exitCode !== null || child.signalCode !== null, 'sbx to be gone');
    }
  });

  it("a --max-semi-space-size in NODE_OPTIONS is the user's: the launcher gives none (node's command line would override it)", async () => {
    for (const options of ['--max-semi-space-size=8', '--trace-warnings "--max-semi-space-size=8"']) {
      const { child, cmdline } = await running(SBX_BIN, { NODE_OPTIONS: options });
      expect(cmdline.slice(0, 3), options).toEqual([process.execPath, join(ROOT, 'dist/cli/sbx.bundle.cjs'), 'run']);
      child.kill('SIGKILL');
      await until(() => child.exitCode !== null || child.signalCode !== null, 'sbx to be gone');
    }
    // Another flag there leaves the launcher's in place.
    const { child, cmdline } = await running(SBX_BIN, { NODE_OPTIONS: '--max-old-space-size=512' });
    expect(cmdline.slice(0, 4)).toEqual([process.execPath, '--max-semi-space-size=2', join(ROOT, 'dist/cli/sbx.bundle.cjs'), 'run']);
    child.kill('SIGKILL');
    await until(() => child.exitCode !== null || child.signalCode !== null, 'sbx to be gone');
  });

  it('from the bundle: exact bytes on both streams, the exit status, arguments with spaces and a second --', () => {
    const r = spawnSync(SBX_BIN, ['run', '--', 'sh', '-c', 'printf "%s|" "$@"; printf err >&2; exit 7', 'sh', 'a b', '--', '-x'], { env: env() });
    expect(r.stdout.toString()).toBe('a b|--|-x|');
    expect(r.stderr.toString()).toBe('err');
    expect(r.status).toBe(7);
  });

  it('from the bundle: SIGTERM to sbx is sent on to the session, which ends by it', async () => {
    const { child, sessionId } = await running(SBX_BIN);
    child.kill('SIGTERM');
    await until(() => child.exitCode !== null, 'sbx to exit with the session');
    expect(child.exitCode).toBe(128 + 15);
    const receipt = await (await daemon.client()).wait({ session_id: sessionId });
    expect(receipt.exit).toEqual({ code: null, signal: 'SIGTERM' });
  });

  it('verify, from the bundle, imports its modules from beside it and checks a receipt', async () => {
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
    // The checkpoint commands' module too (a missing checkpoint: its own error, not a failed import).
    const c = spawnSync(SBX_BIN, ['restore', '0'.repeat(64), join(tmp, 'restored'), '--state-dir', daemon.stateDir], { env: env(), encoding: 'utf8' });
    expect(c.stderr).not.toMatch(/Cannot find module|ERR_MODULE_NOT_FOUND/);
    expect(c.stderr).toMatch(/^sbx: /);
  });

  it('a build without a bundle (no esbuild): starts from sbx.js, same bytes and status', async () => {
    const copy = copyOfBuild('no-bundle');
    rmSync(join(copy, 'dist/cli/sbx.bundle.cjs'));
    const bin = join(copy, 'dist/cli/sbx');
    const { child, cmdline } = await running(bin);
    expect(cmdline.slice(0, 4)).toEqual([process.execPath, '--max-semi-space-size=2', join(copy, 'dist/cli/sbx.js'), 'run']);
    child.kill('SIGKILL');
    await until(() => child.exitCode !== null || child.signalCode !== null, 'sbx to be gone');
    const r = spawnSync(bin, ['run', '--', 'sh', '-c', 'printf out; printf err >&2; exit 4'], { env: env() });
    expect(r.stdout.toString()).toBe('out');
    expect(r.stderr.toString()).toBe('err');
    expect(r.status).toBe(4);
  });

  it("the node that built it gone (sbx.node names no file): the PATH's node, same bytes and status", async () => {
    const copy = copyOfBuild('no-node');
    const bin = join(copy, 'dist/cli/sbx');
    writeFileSync(join(copy, 'dist/cli/sbx.node'), '/nonexistent/node\n');
    // A PATH whose node is this one, through a script that marks the command line.
    const path = join(copy, 'path');
    mkdirSync(path);
    writeFileSync(join(path, 'node'), `#!/bin/sh\nexec ${process.execPath} --stack-size=900 "$@"\n`);
    chmodSync(join(path, 'node'), 0o755);
    const pathEnv = { PATH: `${path}:${process.env.PATH ?? ''}` };
    const { child, cmdline } = await running(bin, pathEnv);
    expect(cmdline.slice(0, 5)).toEqual([process.execPath, '--stack-size=900', '--max-semi-space-size=2', join(copy, 'dist/cli/sbx.bundle.cjs'), 'run']);
    child.kill('SIGKILL');
    await until(() => child.exitCode !== null || child.signalCode !== null, 'sbx to be gone');
    const r = spawnSync(bin, ['run', '--', 'sh', '-c', 'printf out; exit 4'], { env: { ...env(), ...pathEnv } });
    expect(r.stdout.toString()).toBe('out');
    expect(r.status).toBe(4);
  });
});
