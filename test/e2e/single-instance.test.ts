// One supervisor per state dir, per socket and per cgroup parent: a second one refuses to start
// (it would reconcile the first one's live sessions as owner_lost, unlink its socket, or remove
// the sessions dir its leaves are in), and the first one keeps running its session untouched.
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DAEMON_ARGV, TestDaemon } from '../helpers/daemon.js';

let daemon: TestDaemon;
beforeAll(async () => {
  daemon = await new TestDaemon({ config: { logLevel: 'warn' } }).start();
});
afterAll(async () => {
  expect(await daemon.stop()).toEqual({ code: 0, signal: null });
});

/** Runs a second supervisor with this env (and its own cgroup parent unless one is given); resolves with its exit code and stderr. */
function second(env: Record<string, string>, cgroupParent = `${daemon.cgroupParent}-second`): Promise<{ code: number | null; stderr: string }> {
  const config = join(daemon.dir, 'second.json');
  writeFileSync(config, JSON.stringify({ logLevel: 'warn', cgroup: { parent: cgroupParent } }));
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [...DAEMON_ARGV, 'serve', '--config', config], {
      env: { ...process.env, ...env },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('close', (code) => resolve({ code, stderr }));
  });
}

describe('single instance', () => {
  it('a second supervisor on the same state dir, socket or cgroup parent exits 1 and touches nothing', async () => {
    const client = await daemon.client();
    const { session_id } = await client.launch({ argv: ['sleep', '30'], cwd: '/', invocation_key: 'live' });

    const sameState = await second({ SBX_SOCKET: join(daemon.dir, 'other.sock'), SBX_STATE_DIR: daemon.stateDir });
    expect(sameState.code).toBe(1);
    expect(sameState.stderr).toContain(`the state dir ${daemon.stateDir} is in use by another supervisor (pid ${daemon.pid})`);

    const sameSocket = await second({ SBX_SOCKET: daemon.socketPath, SBX_STATE_DIR: join(daemon.dir, 'other-state') });
    expect(sameSocket.code).toBe(1);
    expect(sameSocket.stderr).toContain(`the socket ${daemon.socketPath} is in use by a running supervisor`);

    // The same cgroup parent: refused, never a fallback to subreaper mode (before, it started, and
    // whichever stopped first removed the sessions dir the other made its leaves in).
    const sameParent = await second({ SBX_SOCKET: join(daemon.dir, 'third.sock'), SBX_STATE_DIR: join(daemon.dir, 'third-state') }, daemon.cgroupParent);
    if (daemon.cgroupBase) {
      expect(sameParent.code).toBe(1);
      expect(sameParent.stderr).toContain(
        `the cgroup parent ${daemon.cgroupParent} (${daemon.cgroupBase}) is in use by another supervisor (pid ${daemon.pid}); stop it first, or give this one its own cgroup.parent`,
      );
      expect(existsSync(join(daemon.cgroupBase, 'sessions', session_id))).toBe(true);
    }

    // The first one is untouched: its session still runs, its socket still answers.
    const ps = await client.ps();
    expect(ps.sessions).toMatchObject([{ session_id, state: 'running' }]);
    await client.request('cancel', { session_id });
    expect((await client.wait({ session_id })).outcome).toBe('cancelled');
  });

  it('a start that fails after its cgroup subtree was made (an unreadable receipt key) exits 1 naming why, and leaves no cgroup behind', async () => {
    const state = join(daemon.dir, 'bad-key-state');
    mkdirSync(state, { mode: 0o700 });
    writeFileSync(join(state, 'receipt-key'), 'garbage\n', { mode: 0o600 });
    const r = await second({ SBX_SOCKET: join(daemon.dir, 'bad-key.sock'), SBX_STATE_DIR: state });
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/^sandbox-supervisor: .+/);
    const base = daemon.cgroupBase;
    // Without a writable cgroup2 the start made no subtree; with one, the subtree it made is gone.
    if (base) expect(existsSync(`${base}-second`)).toBe(false);
  });
});
