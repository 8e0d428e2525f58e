// The leader's report pipe as spawn.ts reads it (supervisor/session/spawn.ts LeaderProcess), with
// the real exec shim: a signal asked of a shim that has said "done" is answered, not left waiting.
import { closeSync, existsSync } from 'node:fs';
import { constants } from 'node:os';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { native } from '../../../../core/fs/native.js';
import { Reaper } from '../../../../supervisor/reaper.js';
import { LeaderProcess, type LeaderSpec } from '../../../../supervisor/session/spawn.js';
import { until, within } from '../../../helpers/daemon.js';

/** Resolves once the shim's pid is reaped (no zombie of the test's left behind). */
const reaped = (pid: number) => until(() => !existsSync(`/proc/${pid}`), `shim ${pid} reaped`);

const spec = (argv: string[], ptySlaveFd: number | null): LeaderSpec => ({
  argv,
  cwd: '/',
  env: { PATH: process.env.PATH ?? '/usr/bin:/bin' },
  cgroupProcsPath: null,
  subreaper: true,
  ptySlaveFd,
  stdinPipe: false,
  user: null,
  pipeBytes: 65536,
});

describe('LeaderProcess in subreaper mode', () => {
  const reaper = new Reaper();
  beforeAll(() => reaper.start());
  afterAll(() => reaper.stop());

  it('a pty session: a signal asked after "done" (the shim holds the tty, reading no signals) resolves 0 at once', async () => {
    const pty = native().openPty(80, 24);
    try {
      const leader = new LeaderProcess(spec(['sh', '-c', 'exit 0'], pty.slave), reaper);
      expect(await leader.exec).toBeNull();
      expect(await within(leader.allReaped, 'done')).toEqual({ reaped: 0 });
      // The shim still stands (--hold) until release(): before the fix it took the byte and never answered.
      expect(await within(leader.signalViaShim(constants.signals.SIGTERM), 'the signal answered', 5000)).toBe(0);
      leader.release();
      expect(await within(leader.leaderExit, 'the leader exit')).toMatchObject({ code: 0, signal: null });
      await reaped(leader.pid);
    } finally {
      closeSync(pty.master);
      closeSync(pty.slave);
    }
  });

  it('a pipe session: a signal still waiting when the shim says "done" resolves 0; one asked after, at once', async () => {
    // The leader's child lives past it: the control byte is written while the shim runs.
    const leader = new LeaderProcess(spec(['sh', '-c', 'sleep 0.3 & exit 0'], null), reaper);
    expect(await leader.exec).toBeNull();
    for (const fd of [leader.stdoutFd, leader.stderrFd]) closeSync(fd);
    // SIGCONT reaches sh (alive, or a zombie not yet reaped) or the sleep it forks before it exits.
    expect(await within(leader.signalViaShim(constants.signals.SIGCONT), 'the signal answered', 5000)).toBeGreaterThanOrEqual(1);
    expect(await within(leader.allReaped, 'done')).toEqual({ reaped: 1 });
    expect(await within(leader.signalViaShim(constants.signals.SIGTERM), 'the signal after done', 1000)).toBe(0);
    leader.release();
    await reaped(leader.pid);
  });
});
