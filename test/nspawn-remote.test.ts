// The harness on the host, the supervisor the unit in systemd-nspawn (test/helpers/nspawn.ts):
// over WebSocket on loopback (the container shares the host's network namespace; token read by
// nsenter cat) and over `nsenter -t PID1 -a sbx bridge` (a command endpoint), with the TS and
// Python clients, `sbx --url` and files. Runs docs/guide/remote.md's "Driving a remote supervisor" shell
// blocks as written. Skips, saying why, without nspawn.
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SupervisorClient, type ConnectOptions } from '../ipc/client.js';
import { readFile, writeFile } from '../ipc/files.js';
import type { Receipt } from '../ipc/protocol.js';
import { TEST_CGROUP_PREFIX } from './helpers/cgroup-cleanup.js';
import { ROOT, SBX_BIN, until } from './helpers/daemon.js';
import { NspawnContainer, nspawnUnavailable } from './helpers/nspawn.js';
import { freeLoopbackPort } from './helpers/tcp-proxy.js';

const why = nspawnUnavailable();
const container = new NspawnContainer({
  machine: 'sbxremote',
  rootfs: '/tmp/sbx-test-nspawn-remote-root',
  cgroupName: `${TEST_CGROUP_PREFIX}nspawn-remote`,
  privateNetwork: false,
  bootUnit: 'basic.target',
});
const TOKEN_IN_CONTAINER = '/var/lib/sandbox-supervisor/remote-token';
const PYTHON_FIXTURE = join(ROOT, 'test/fixtures/remote-client.py');
let port = 0;
let hostDir = '';
let tokenFile = '';

const url = () => `ws://127.0.0.1:${port}`;

/**
 * The n-th ```sh block of docs/guide/remote.md's "Driving a remote supervisor", with its port
 * (7443) replaced by this run's: the test runs the guide's commands as written.
 */
function readmeBlock(n: number): string {
  const guide = readFileSync(join(ROOT, 'docs/guide/remote.md'), 'utf8');
  const at = guide.indexOf('\n## Driving a remote supervisor\n');
  if (at < 0) throw new Error('docs/guide/remote.md has no "## Driving a remote supervisor"');
  const section = guide.slice(at + 1);
  const blocks = [...section.slice(0, section.indexOf('\n## ', 5)).matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1]!);
  if (!blocks[n]) throw new Error(`docs/guide/remote.md "Driving a remote supervisor" has no sh block ${n}`);
  return blocks[n].replaceAll('7443', String(port));
}
/** The exec channel: every namespace of the container's PID 1, `sbx bridge` joined to its socket. */
const bridgeCommand = () => container.nsenter(['/usr/local/bin/sbx', 'bridge']);

/** Lines in the marker file inside the container (one per run of the command). */
const runs = (marker: string) => container.run(['cat', marker], { allowFail: true }).stdout.split('\n').filter(Boolean).length;

/**
 * One keyed command with stdin through the TypeScript client over endpoint: launched, its stdin
 * written and ended, stdout read by cursor, the receipt; then the same key again.
 */
async function driveTs(
  endpoint: ConnectOptions,
  key: string,
  marker: string,
): Promise<{ stdout: Buffer; receipt: Receipt; again: { session_id: string; existing: boolean } }> {
  const client = await SupervisorClient.connect({ ...endpoint, clientName: 'nspawn-remote' });
  try {
    const pong = await client.request('ping', {});
    expect(typeof pong.now_ms).toBe('number');
    const argv = ['sh', '-c', `echo ran >> ${marker}; printf "ts over %s: " "$0"; cat`, key];
    const launched = await client.launch({ argv, invocation_key: key, stdin: true, cwd: '/' });
    await client.request('write', { session_id: launched.session_id, data: Buffer.from('stdin from the host\n'), offset: 0, eof: true });
    const receipt = await client.wait({ session_id: launched.session_id });
    const stdout = await client.read({ session_id: launched.session_id }, 'stdout');
    const again = await client.launch({ argv, invocation_key: key, stdin: true, cwd: '/' });
    return { stdout, receipt, again };
  } finally {
    client.close();
  }
}

interface PythonResult {
  session_id: string;
  stdout_b64: string;
  stdout_sha256: string;
  receipt: Receipt;
  again_session_id: string;
  again_existing: boolean;
  ping_now_ms: number;
}

/** The same through the Python client (/usr/bin/python3, clients/python), as a harness process of its own. */
function drivePython(endpoint: Record<string, unknown>, key: string, marker: string): PythonResult {
  const r = spawnSync('/usr/bin/python3', [PYTHON_FIXTURE, JSON.stringify(endpoint), key, marker], {
    env: { PATH: process.env.PATH, PYTHONPATH: join(ROOT, 'clients/python') },
    encoding: 'utf8',
    timeout: 60_000,
  });
  if (r.status !== 0) throw new Error(`remote-client.py: exit ${r.status} ${r.signal ?? ''}\n${r.stdout}\n${r.stderr}`);
  return JSON.parse(r.stdout) as PythonResult;
}

function expectOnce(receipt: Receipt, stdout: Buffer, expected: string, marker: string): void {
  expect(stdout.toString()).toBe(expected);
  expect(receipt).toMatchObject({ outcome: 'exited', exit: { code: 0 }, death: { evidence: 'cgroup_empty' } });
  expect(receipt.output.stdout!.final_cursor).toBe(stdout.length);
  expect(receipt.output.stdout!.sha256).toBe(createHash('sha256').update(stdout).digest('hex'));
  expect(runs(marker)).toBe(1);
}

describe.skipIf(why !== null)(why ? `harness on the host, supervisor in nspawn (skipped: ${why})` : 'harness on the host, supervisor in nspawn', () => {
  beforeAll(async () => {
    port = await freeLoopbackPort(); // the container shares the host's network namespace
    await container.boot();
    hostDir = mkdtempSync(join(tmpdir(), 'sbx-test-remote-'));
    tokenFile = join(hostDir, 'token');
    // The guide's first block (docs/guide/remote.md), as written (its port replaced by a free one), inside; the
    // service starts now (socket activation would start it at the first local client only).
    container.bash(readmeBlock(0));
    await until(() => container.run(['test', '-s', TOKEN_IN_CONTAINER], { allowFail: true }).status === 0, 'the token file', 30_000);
  }, 180_000);
  afterAll(async () => {
    await container.cleanUp();
    if (hostDir) rmSync(hostDir, { recursive: true, force: true });
  }, 60_000);

  it("the remote guide's commands on the host: the token read through nsenter, sbx --url runs a keyed command", () => {
    // The guide's second block as written: sbx on PATH, $PID1 the container's, in a dir of the host's.
    const r = spawnSync('bash', ['-euc', readmeBlock(1)], {
      stdio: ['ignore', 'pipe', 'pipe'],
      cwd: hostDir,
      env: { PATH: `${dirname(SBX_BIN)}:${process.env.PATH}`, PID1: String(container.pid1) },
      encoding: 'utf8',
      timeout: 60_000,
    });
    expect(r.stderr).toBe('');
    expect([r.status, r.stdout]).toEqual([0, 'systemd-nspawn\n']); // run inside the container
    expect(statSync(tokenFile).mode & 0o777).toBe(0o600);
    expect(readFileSync(tokenFile, 'utf8')).toBe(container.run(['cat', TOKEN_IN_CONTAINER]).stdout);
    // The same key again: the stored output of the first run, not a second one.
    const again = spawnSync(SBX_BIN, ['--url', url(), '--token-file', tokenFile, 'wait', '--key', 'hello-1'], { encoding: 'utf8', timeout: 60_000 });
    expect((JSON.parse(again.stdout) as Receipt).outcome).toBe('exited');
  });

  it('the unit listens on loopback only, with a token file made 0600 at first start', () => {
    expect(container.run(['stat', '-c', '%a %U', TOKEN_IN_CONTAINER]).stdout.trim()).toBe('600 root');
    expect(container.run(['systemctl', 'is-active', 'sandbox-supervisor.service']).stdout.trim()).toBe('active');
    const listening = container.bash(`ss -Hltn 'sport = :${port}' | awk '{ print $4 }'`);
    expect(listening).toBe(`127.0.0.1:${port}`);
  });

  it('TypeScript client over WebSocket: a keyed command with stdin runs once, its bytes and receipt exact', async () => {
    const r = await driveTs({ url: url(), tokenFile }, 'ts-ws', '/tmp/ts-ws.marker');
    expectOnce(r.receipt, r.stdout, 'ts over ts-ws: stdin from the host\n', '/tmp/ts-ws.marker');
    expect(r.again).toMatchObject({ session_id: r.receipt.session_id, existing: true });
  });

  it('TypeScript client over `nsenter ... sbx bridge`: the same', async () => {
    const r = await driveTs({ command: bridgeCommand() }, 'ts-bridge', '/tmp/ts-bridge.marker');
    expectOnce(r.receipt, r.stdout, 'ts over ts-bridge: stdin from the host\n', '/tmp/ts-bridge.marker');
    expect(r.again).toMatchObject({ session_id: r.receipt.session_id, existing: true });
  });

  it('Python client over WebSocket: the same', () => {
    const r = drivePython({ url: url(), token_file: tokenFile }, 'py-ws', '/tmp/py-ws.marker');
    const stdout = Buffer.from(r.stdout_b64, 'base64');
    expect(r.stdout_sha256).toBe(r.receipt.output.stdout!.sha256);
    expectOnce(r.receipt, stdout, 'python over py-ws: stdin from the host\n', '/tmp/py-ws.marker');
    expect([r.again_session_id, r.again_existing]).toEqual([r.session_id, true]);
  });

  it('Python client over `nsenter ... sbx bridge`: the same', () => {
    const r = drivePython({ command: bridgeCommand() }, 'py-bridge', '/tmp/py-bridge.marker');
    const stdout = Buffer.from(r.stdout_b64, 'base64');
    expect(r.stdout_sha256).toBe(r.receipt.output.stdout!.sha256);
    expectOnce(r.receipt, stdout, 'python over py-bridge: stdin from the host\n', '/tmp/py-bridge.marker');
    expect([r.again_session_id, r.again_existing]).toEqual([r.session_id, true]);
  });

  it('files over both: written into the container over WebSocket, read back over the bridge, byte-exact, as sessions', async () => {
    const data = Buffer.from(Array.from({ length: 200_000 }, (_, i) => `line ${i}\n`).join(''));
    const written = await writeFile({ url: url(), tokenFile }, '/root/from-the-host.txt', data, { mode: 0o640, key: 'file-ws-1' });
    expect(written.receipt).toMatchObject({ outcome: 'exited', exit: { code: 0 } });
    expect(container.run(['stat', '-c', '%a %s', '/root/from-the-host.txt']).stdout.trim()).toBe(`640 ${data.length}`);
    expect(container.run(['sha256sum', '/root/from-the-host.txt']).stdout.split(' ')[0]).toBe(createHash('sha256').update(data).digest('hex'));
    const back = await readFile({ command: bridgeCommand() }, '/root/from-the-host.txt');
    expect(back.equals(data)).toBe(true);
    expect(back.result.receipt.output.stdout!.sha256).toBe(createHash('sha256').update(data).digest('hex'));
  });

  it('a wrong token is refused (UNAUTHORIZED), the right one still served', () => {
    const wrong = join(hostDir, 'wrong-token');
    writeFileSync(wrong, 'not-the-token-at-all-0123456789\n', { mode: 0o600 });
    const refused = spawnSync(SBX_BIN, ['--url', url(), '--token-file', wrong, 'ps'], { encoding: 'utf8', timeout: 60_000 });
    expect(refused.status).not.toBe(0);
    expect(refused.stderr).toMatch(/UNAUTHORIZED/);
    const ok = spawnSync(SBX_BIN, ['--url', url(), '--token-file', tokenFile, 'ps'], { encoding: 'utf8', timeout: 60_000 });
    expect([ok.status, ok.stderr]).toEqual([0, '']);
  });
});
