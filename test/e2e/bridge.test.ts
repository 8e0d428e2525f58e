// `sbx bridge` (docs/guide/remote.md) as an exec channel would run it: a child whose stdin and
// stdout carry the protocol's frames (ipc/framing.ts) to a real supervisor, byte for byte. A
// launch read to its receipt; SIGKILL mid-stream (the supervisor sees the connection close,
// the session goes on); stdin EOF and the supervisor's end both end it with 0; no supervisor:
// 69; the installed `sbx` (its launcher and snapshot) bridges too; and 200 MB of output
// through a slowly read stdout in bounded memory (VmHWM).
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { request } from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { FrameDecoder } from '../../ipc/framing.js';
import type { Receipt, StatusResult } from '../../ipc/protocol.js';
import { SBX, SBX_BIN, TestDaemon, until, within } from '../helpers/daemon.js';
import { FramePeer, type Answer } from '../helpers/frame-peer.js';

const sha = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');
/** A bridge child and the protocol spoken over its stdin/stdout (requests routed by FramePeer). */
class BridgePeer extends FramePeer {
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  stderr = '';

  constructor(readonly child: ChildProcessWithoutNullStreams) {
    super();
    const decoder = new FrameDecoder(64 * 1024 * 1024);
    child.stdout.on('data', (b: Buffer) => decoder.push(b, (v) => this.onAnswer(v as Answer)));
    child.stderr.on('data', (b: Buffer) => (this.stderr += b.toString()));
    child.stdin.on('error', () => {});
    this.exited = new Promise((r) => child.on('exit', (code, signal) => r({ code, signal })));
  }

  static spawn(socketPath: string, bin = SBX, args: string[] = []): BridgePeer {
    const argv = bin === SBX ? [process.execPath, SBX] : [bin];
    const child = spawn(argv[0], [...argv.slice(1), ...args, 'bridge', '--socket', socketPath], { stdio: ['pipe', 'pipe', 'pipe'] });
    const peer = new BridgePeer(child);
    onTestFinished(() => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    });
    return peer;
  }

  protected sendFrame(frame: Buffer): void {
    this.child.stdin.write(frame);
  }

  hello(): Promise<unknown> {
    return this.request('hello', { versions: [1], client: 'bridge-test' });
  }
}

/** The peak resident set of pid (VmHWM, proc(5)), KiB. */
function vmHwmKiB(pid: number): number {
  return Number(/VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1]);
}

/** One sample of /metrics at addr (HOST:PORT). */
function metric(addr: string, series: string): Promise<number> {
  const [host, port] = addr.split(':');
  return new Promise((resolve, reject) => {
    const req = request({ host, port: Number(port), path: '/metrics', agent: false }, (res) => {
      let body = '';
      res.on('data', (d: Buffer) => (body += d.toString()));
      res.on('end', () => {
        const line = body.split('\n').find((l) => l.startsWith(`${series} `));
        if (line === undefined) reject(new Error(`no series ${series}`));
        else resolve(Number(line.slice(series.length + 1)));
      });
    });
    req.on('error', reject);
    req.end();
  });
}

describe('sbx bridge', () => {
  const d = new TestDaemon({ config: { metrics: { listen: '127.0.0.1:0' } } });
  let metricsAddr = '';

  beforeAll(async () => {
    await d.start();
    metricsAddr = ((await (await d.client()).request('status', {})) as StatusResult).metrics!;
  });
  afterAll(async () => {
    await d.stop();
  });

  it('carries a launch, its output and its receipt byte for byte; stdin EOF ends it with 0 and nothing on stdout of its own', async () => {
    const b = BridgePeer.spawn(d.socketPath);
    await b.hello();
    expect((await b.request<{ now_ms: number }>('ping')).now_ms).toBeGreaterThan(0);
    const launched = await b.request<{ session_id: string }>('launch', { argv: ['sh', '-c', 'head -c 1000000 /dev/urandom'], cwd: '/' });
    const parts: Buffer[] = [];
    let ended!: () => void;
    const end = new Promise<void>((r) => (ended = r));
    await b.request('subscribe', { session_id: launched.session_id, stream: 'stdout', from: 0, follow: true }, (e) => {
      if (e.event === 'output') parts.push(Buffer.from(e.data as Uint8Array));
      if (e.event === 'end') ended();
    });
    await within(end, 'the end of the stream');
    const receipt = await b.request<Receipt>('wait', { session_id: launched.session_id });
    const out = Buffer.concat(parts);
    expect(out.length).toBe(1_000_000);
    expect(receipt.output.stdout!.sha256).toBe(sha(out));
    expect(receipt.exit).toEqual({ code: 0, signal: null });
    b.child.stdin.end();
    expect(await within(b.exited, 'the bridge to exit')).toEqual({ code: 0, signal: null });
    expect(b.stderr).toBe('');
  });

  it('killed mid-stream (SIGKILL): the supervisor sees the connection close, the session goes on', async () => {
    const b = BridgePeer.spawn(d.socketPath);
    await b.hello();
    const key = `bridge-kill-${process.pid}-${Date.now()}`;
    const launched = await b.request<{ session_id: string }>('launch', {
      argv: ['sh', '-c', 'for i in $(seq 1 20); do echo line $i; sleep 0.05; done'],
      cwd: '/',
      invocation_key: key,
    });
    let first!: () => void;
    const gotOne = new Promise<void>((r) => (first = r));
    await b.request('subscribe', { session_id: launched.session_id, stream: 'stdout', from: 0, follow: true }, (e) => e.event === 'output' && first());
    await within(gotOne, 'the first output');
    expect(await metric(metricsAddr, 'sandbox_supervisor_connections')).toBeGreaterThanOrEqual(2); // the bridge's and ours
    b.child.kill('SIGKILL');
    expect((await b.exited).signal).toBe('SIGKILL');
    await until(async () => (await metric(metricsAddr, 'sandbox_supervisor_connections')) === 1, 'the supervisor to see the bridge connection close');
    const client = await d.client();
    const receipt = await client.wait({ session_id: launched.session_id });
    expect(receipt.exit).toEqual({ code: 0, signal: null });
    const expected = Array.from({ length: 20 }, (_, i) => `line ${i + 1}\n`).join('');
    expect(receipt.output.stdout!.sha256).toBe(sha(Buffer.from(expected)));
  });

  it('exits 69 with a message on stderr, nothing on stdout, when there is no supervisor', async () => {
    const b = BridgePeer.spawn(join(d.dir, 'nobody-here.sock'));
    let stdout = 0;
    b.child.stdout.on('data', (x: Buffer) => (stdout += x.length));
    expect(await within(b.exited, 'the bridge to exit')).toEqual({ code: 69, signal: null });
    expect(stdout).toBe(0);
    expect(b.stderr).toMatch(/^sbx: bridge: cannot connect to the supervisor at .*nobody-here\.sock: ENOENT\n$/);
  });

  it('works as the installed sbx (its launcher and bundle)', async () => {
    const b = BridgePeer.spawn(d.socketPath, SBX_BIN);
    const hello = (await b.hello()) as { server: string };
    expect(hello.server).toMatch(/^sandbox-supervisor\//);
    b.child.stdin.end();
    expect(await within(b.exited, 'the bridge to exit')).toEqual({ code: 0, signal: null });
  });

  it('holds bounded memory: 200 MB of output through a slowly read stdout, VmHWM under 100 MB and within 24 MiB of an idle one', async () => {
    const TOTAL = 200 * 1024 * 1024;
    const client = await d.client();
    const launched = await client.launch({ argv: ['head', '-c', String(TOTAL), '/dev/zero'], cwd: '/' });
    await client.wait({ session_id: launched.session_id });
    const b = BridgePeer.spawn(d.socketPath);
    await b.hello();
    let bytes = 0;
    let ended!: () => void;
    const end = new Promise<void>((r) => (ended = r));
    // Slow reading: stdout paused for 20 ms after every 4 MiB read.
    let sincePause = 0;
    b.child.stdout.on('data', (x: Buffer) => {
      sincePause += x.length;
      if (sincePause >= 4 * 1024 * 1024) {
        sincePause = 0;
        b.child.stdout.pause();
        setTimeout(() => b.child.stdout.resume(), 20);
      }
    });
    await b.request('subscribe', { session_id: launched.session_id, stream: 'stdout', from: 0, follow: true }, (e) => {
      if (e.event === 'output') bytes += (e.data as Uint8Array).length;
      if (e.event === 'end') ended();
    });
    await within(end, 'the end of 200 MB', 120_000);
    expect(bytes).toBe(TOTAL);
    const hwmKiB = vmHwmKiB(b.child.pid!);
    // A bridge that only said hello: what node and the CLI take before any byte passes.
    const idle = BridgePeer.spawn(d.socketPath);
    await idle.hello();
    const idleKiB = vmHwmKiB(idle.child.pid!);
    idle.child.stdin.end();
    console.log(`bridge VmHWM after 200 MB: ${hwmKiB} KiB; an idle bridge's: ${idleKiB} KiB`);
    expect(hwmKiB).toBeLessThan(100 * 1024);
    expect(hwmKiB - idleKiB).toBeLessThan(24 * 1024);
    b.child.stdin.end();
    expect((await within(b.exited, 'the bridge to exit')).code).toBe(0);
  }, 180_000);

  it('exits 0 when the supervisor goes away', async () => {
    const b = BridgePeer.spawn(d.socketPath);
    await b.hello();
    await d.terminate();
    expect(await within(b.exited, 'the bridge to exit', 30_000)).toEqual({ code: 0, signal: null });
  });
});
