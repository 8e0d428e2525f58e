// Adversarial cases of the natively spawned exec shim (issue 20: posix_spawn, or clone3 into
// the session's leaf): the command starts as a fresh exec would, in both spawn paths. glibc's
// posix_spawn sets the two signals it reserves (32 and 33) to SIG_IGN in the child unless they
// are in the sigdefault set, and its sigaddset/sigfillset leave them out: an ignored signal
// stays ignored across execve(2), so every command of a subreaper-mode supervisor inherited it.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Receipt } from '../../ipc/protocol.js';
import { TestDaemon, zombieChildren } from '../helpers/daemon.js';

/** The Sig* lines of the command's /proc/self/status, as a map. */
function sigLines(status: string): Record<string, string> {
  return Object.fromEntries(
    status
      .split('\n')
      .filter((l) => /^Sig(Blk|Ign):/.test(l))
      .map((l) => l.split(/:\s+/) as [string, string]),
  );
}

const ZERO = '0000000000000000';

for (const mode of ['cgroup', 'subreaper'] as const) {
  describe(`the command's start (${mode} mode: ${mode === 'cgroup' ? 'clone3 into the leaf' : 'posix_spawn'})`, () => {
    let daemon: TestDaemon;
    beforeAll(async () => {
      daemon = await new TestDaemon(mode === 'subreaper' ? { config: { cgroup: { mode: 'subreaper' } } } : {}).start();
    });
    afterAll(async () => {
      expect(await daemon.stop()).toEqual({ code: 0, signal: null });
    });

    it('blocks and ignores no signal, in a pipe session and a pty one, and holds only fds 0-2', async () => {
      for (const pty of [[], ['--pty']]) {
        const r = await daemon.sbx(['run', ...pty, '--', 'sh', '-c', 'cat /proc/self/status; echo fds:; ls -1 /proc/self/fd']);
        expect(r.status).toBe(0);
        const out = r.stdout.toString().replace(/\r\n/g, '\n');
        expect(sigLines(out)).toEqual({ SigBlk: ZERO, SigIgn: ZERO });
        // ls's own directory fd is 3.
        expect(
          out
            .slice(out.indexOf('fds:\n') + 5)
            .split('\n')
            .filter(Boolean),
        ).toEqual(['0', '1', '2', '3']);
      }
    });

    // cgroup mode only (subreaper mode has no leaf): registered there, not skipped elsewhere.
    if (mode === 'cgroup')
      it('runs the command in its leaf from its first instruction: the shim is born there', async () => {
        const receiptPath = join(daemon.dir, 'leaf.json');
        // The shell's own cgroup ($$: the exec'ed shim), read by a child of it.
        const r = await daemon.sbx(['run', '--receipt', receiptPath, '--', 'sh', '-c', 'cat /proc/$$/cgroup']);
        const { session_id } = JSON.parse(readFileSync(receiptPath, 'utf8')) as Receipt;
        expect(
          r.stdout
            .toString()
            .split('\n')
            .filter((l) => l.startsWith('0::')),
        ).toEqual([`0::${daemon.cgroupParent}/sessions/${session_id}`]);
      });

    it('reports exit 3, SIGSEGV and SIGKILL exactly, and leaves no zombie', async () => {
      const cases: [string, Receipt['exit'], number][] = [
        ['exit 3', { code: 3, signal: null }, 3],
        ['kill -SEGV $$', { code: null, signal: 'SIGSEGV' }, 139],
        ['kill -9 $$', { code: null, signal: 'SIGKILL' }, 137],
      ];
      for (const [script, exit, status] of cases) {
        const receiptPath = join(daemon.dir, 'exit.json');
        const r = await daemon.sbx(['run', '--receipt', receiptPath, '--', 'sh', '-c', script]);
        expect(r.status).toBe(status);
        expect((JSON.parse(readFileSync(receiptPath, 'utf8')) as Receipt).exit).toEqual(exit);
      }
      expect(zombieChildren(daemon.pid)).toEqual([]);
    });
  });
}
