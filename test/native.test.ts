// The native helper and the reaper built on it, in processes of their own.
import { execFileSync, spawn } from 'node:child_process';
import { once } from 'node:events';
import { closeSync, existsSync, mkdtempSync, readFileSync, rmSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { native } from '../supervisor/native.js';
import { ROOT } from './helpers/daemon.js';

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
    const out = execFileSync(process.execPath, ['--import', 'tsx', '-e', `
      import('./supervisor/native.ts').then(({ native }) => {
        const before = native().isChildSubreaper();
        native().setChildSubreaper();
        console.log(JSON.stringify([before, native().isChildSubreaper()]));
      });`], { cwd: ROOT }).toString();
    expect(JSON.parse(out)).toEqual([false, true]);
  });

  it('reaps 100 orphans by pid while every child_process exit event still fires', () => {
    const out = execFileSync(process.execPath, ['--import', 'tsx', join(ROOT, 'test/fixtures/reaper-probe.ts')], { cwd: ROOT }).toString();
    const result = JSON.parse(out) as { codes: number[]; reaped: number; zombies: number };
    expect(result.codes).toEqual([7, ...Array.from({ length: 20 }, (_, i) => i)]);
    expect(result.reaped).toBeGreaterThanOrEqual(100);
    expect(result.zombies).toBe(0);
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
async function runShim(payload: Buffer, mode: 'exec' | 'subreaper' = 'exec'): Promise<{ status: number | null; stdout: string; stderr: string; report: string }> {
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
        ['no NUL at the end', Buffer.concat([argvPayload(['touch'], { count: 2, bytes: 6 + marker.length + 1 }).subarray(0, 16 + 6), Buffer.from(`${marker}x`)]), 71],
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
