// The native helper and the reaper built on it, in processes of their own.
import { execFileSync } from 'node:child_process';
import { closeSync, readFileSync } from 'node:fs';
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
