import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { exitStatusOf } from '../../../../ipc/protocol.js';
import { commandDigest, decideOutcome, spawnFailureExitCode } from '../../../../supervisor/session/receipt.js';
import { signalNumber } from '../../../../supervisor/session/spawn.js';

describe('outcome and exit status (docs/reference/exit-statuses.md)', () => {
  const exit = (code: number | null, signal: string | null = null) => ({ code, signal });
  it('exited and signaled come from the leader', () => {
    expect(decideOutcome({ spawnFailure: null, cause: null, exit: exit(3) })).toBe('exited');
    expect(decideOutcome({ spawnFailure: null, cause: 'linger', exit: exit(0) })).toBe('exited');
    expect(decideOutcome({ spawnFailure: null, cause: null, exit: exit(null, 'SIGKILL') })).toBe('signaled');
  });
  it('the first termination cause wins over how the leader died', () => {
    expect(decideOutcome({ spawnFailure: null, cause: 'deadline', exit: exit(null, 'SIGKILL') })).toBe('timed_out');
    expect(decideOutcome({ spawnFailure: null, cause: 'cancel', exit: exit(null, 'SIGTERM') })).toBe('cancelled');
    expect(decideOutcome({ spawnFailure: null, cause: 'shutdown', exit: exit(null, 'SIGTERM') })).toBe('cancelled');
  });
  it('spawn failures: 127 not found, 126 not executable', () => {
    expect(spawnFailureExitCode({ stage: 'exec', errno: 2, code: 'ENOENT' })).toBe(127);
    expect(spawnFailureExitCode({ stage: 'exec', errno: 20, code: 'ENOTDIR' })).toBe(127);
    expect(spawnFailureExitCode({ stage: 'exec', errno: 13, code: 'EACCES' })).toBe(126);
    expect(spawnFailureExitCode({ stage: 'exec', errno: 8, code: 'ENOEXEC' })).toBe(126);
    expect(decideOutcome({ spawnFailure: { stage: 'exec', errno: 2, code: 'ENOENT' }, cause: null, exit: exit(127) })).toBe('spawn_failed');
  });
  it('maps outcomes to sbx exit statuses', () => {
    expect(exitStatusOf({ outcome: 'exited', exit: exit(3) }, signalNumber)).toBe(3);
    expect(exitStatusOf({ outcome: 'signaled', exit: exit(null, 'SIGKILL') }, signalNumber)).toBe(137);
    expect(exitStatusOf({ outcome: 'timed_out', exit: exit(null, 'SIGKILL') }, signalNumber)).toBe(124);
    expect(exitStatusOf({ outcome: 'cancelled', exit: exit(null, 'SIGTERM') }, signalNumber)).toBe(143);
    expect(exitStatusOf({ outcome: 'spawn_failed', exit: exit(126) }, signalNumber)).toBe(126);
    expect(exitStatusOf({ outcome: 'owner_lost', exit: exit(null) }, signalNumber)).toBe(125);
  });
});

describe('command digest', () => {
  const base = { argv: ['echo', 'hi'], cwd: '/w', env: { B: '2', A: '1' }, pty: false, stdin: 'null' as const, user: null };
  it('is sha256 over RFC 8785 JCS: key order does not matter', () => {
    const d = commandDigest(base);
    expect(d).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(commandDigest({ ...base, env: { A: '1', B: '2' } })).toBe(d);
    // Pinned: JCS of this input is {"argv":["echo","hi"],"cwd":"/w","env":{"A":"1","B":"2"},"pty":false,"stdin":"null","user":null}
    expect(d).toBe(
      'sha256:' + createHash('sha256').update('{"argv":["echo","hi"],"cwd":"/w","env":{"A":"1","B":"2"},"pty":false,"stdin":"null","user":null}').digest('hex'),
    );
  });
  it('changes with any covered field', () => {
    const d = commandDigest(base);
    expect(commandDigest({ ...base, argv: ['echo', 'hi '] })).not.toBe(d);
    expect(commandDigest({ ...base, cwd: '/x' })).not.toBe(d);
    expect(commandDigest({ ...base, pty: true })).not.toBe(d);
  });
});
