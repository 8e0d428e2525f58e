// The launch decision (supervisor/admission.ts) as a pure function: keys are forever, then
// stopping, seal, the session bound, reconciliation and disk space refuse new keys only.
import { describe, expect, it } from 'vitest';
import { admit, commandDifferences, type AdmissionLoad, type CommandFields } from '../../../supervisor/admission.js';

const request = { invocationKey: 'k', commandDigest: 'sha256:a', task: 'default' };
const open: AdmissionLoad = {
  existing: null,
  retired: null,
  sealed: null,
  liveSessions: 0,
  maxSessions: 10,
  reconciling: false,
  disk: { admits: true, freeBytes: 1 << 30, minFreeBytes: 1 << 20 },
};
const closedEverywhere: AdmissionLoad = {
  ...open,
  sealed: { generation: 3, sealed_at: '2026-12-01T00:00:00.000Z' },
  liveSessions: 10,
  reconciling: true,
  disk: { admits: false, freeBytes: 5, minFreeBytes: 9 },
};
const code = (d: ReturnType<typeof admit>) => (d.kind === 'refuse' ? d.error.code : d.kind);

describe('admit', () => {
  it('admits a new key when nothing refuses it', () => {
    expect(admit(request, open)).toEqual({ kind: 'admit' });
  });

  it('answers an existing key with its session, whatever else refuses new keys', () => {
    const existing = { sessionId: 's-1-aa', commandDigest: 'sha256:a', state: 'running' as const, task: 'default' };
    expect(admit(request, { ...closedEverywhere, existing })).toEqual({ kind: 'existing', sessionId: 's-1-aa', state: 'running' });
    // Unreadable admission record (digest ''): the key is blocked, the retry gets that session.
    expect(admit(request, { ...open, existing: { ...existing, commandDigest: '', state: 'unknown' } })).toEqual({
      kind: 'existing',
      sessionId: 's-1-aa',
      state: 'unknown',
    });
  });

  it('refuses another command under a used key: KEY_CONFLICT naming the session', () => {
    const d = admit(request, { ...open, existing: { sessionId: 's-1-aa', commandDigest: 'sha256:b', state: 'ended', task: 'default' } });
    expect(d.kind === 'refuse' && d.error.toWire()).toEqual({
      code: 'KEY_CONFLICT',
      retryable: false,
      message: 'invocation key "k" was used for another command by session s-1-aa',
      details: { invocation_key: 'k', session_id: 's-1-aa' },
    });
    expect(code(admit(request, { ...open, retired: { sessionId: 's-2-bb', commandDigest: 'sha256:b' } }))).toBe('KEY_CONFLICT');
  });

  it('KEY_CONFLICT names the fields that differ, env by names only (never values), when both commands are known', () => {
    const theirs: CommandFields = {
      argv: ['make', 'test'],
      cwd: '/src',
      env: { TOKEN: 'secret-a', SAME: '1', ONLY_THEIRS: 'x' },
      user: null,
      pty: false,
      stdin: 'null',
    };
    const ours: CommandFields = { ...theirs, argv: ['make', 'build'], env: { TOKEN: 'secret-b', SAME: '1', ONLY_OURS: 'y' }, stdin: 'stream' };
    expect(commandDifferences(theirs, ours)).toEqual({ fields: ['argv', 'env', 'stdin'], envNames: ['ONLY_OURS', 'ONLY_THEIRS', 'TOKEN'] });
    expect(commandDifferences(theirs, { ...theirs, cwd: '/', user: 'nobody', pty: true })).toEqual({ fields: ['cwd', 'user', 'pty'], envNames: [] });
    const d = admit(
      { ...request, command: ours },
      { ...open, existing: { sessionId: 's-1-aa', commandDigest: 'sha256:b', state: 'ended', task: 'default', command: theirs } },
    );
    const wire = d.kind === 'refuse' ? d.error.toWire() : null;
    expect(wire).toEqual({
      code: 'KEY_CONFLICT',
      retryable: false,
      message: 'invocation key "k" was used for another command by session s-1-aa: argv, env (ONLY_OURS, ONLY_THEIRS, TOKEN), stdin differ',
      details: { invocation_key: 'k', session_id: 's-1-aa', differs: ['argv', 'env', 'stdin'], env_names: ['ONLY_OURS', 'ONLY_THEIRS', 'TOKEN'] },
    });
    expect(JSON.stringify(wire)).not.toMatch(/secret/);
    // A retired session's tombstone keeps the digest only: the conflict says it cannot name the fields.
    const r = admit({ ...request, command: ours }, { ...open, retired: { sessionId: 's-2-bb', commandDigest: 'sha256:b' } });
    expect(r.kind === 'refuse' && r.error.toWire()).toEqual({
      code: 'KEY_CONFLICT',
      retryable: false,
      message:
        'invocation key "k" was used for another command by session s-2-bb (removed by the retention policy: its tombstone keeps the digest only, so what differs cannot be named)',
      details: { invocation_key: 'k', session_id: 's-2-bb', retired: true },
    });
  });

  it('a key is in one task: the same command asked for in another task is KEY_CONFLICT naming its task; a key whose task is unknown answers', () => {
    const existing = { sessionId: 's-1-aa', commandDigest: 'sha256:a', state: 'ended' as const, task: 'A' };
    const d = admit({ ...request, task: 'B' }, { ...open, existing });
    expect(d.kind === 'refuse' && d.error.toWire()).toEqual({
      code: 'KEY_CONFLICT',
      retryable: false,
      message: 'invocation key "k" was used in task "A", not "B"',
      details: { invocation_key: 'k', session_id: 's-1-aa', task: 'A' },
    });
    expect(admit({ ...request, task: 'A' }, { ...open, existing })).toEqual({ kind: 'existing', sessionId: 's-1-aa', state: 'ended' });
    expect(admit({ ...request, task: 'B' }, { ...open, existing: { ...existing, task: null, state: 'unknown' } })).toEqual({
      kind: 'existing',
      sessionId: 's-1-aa',
      state: 'unknown',
    });
  });

  it("a task's seal refuses new keys naming the task; retries of its keys still answer", () => {
    const sealed = { generation: 2, sealed_at: '2026-12-01T00:00:00.000Z', task: 'A' };
    const d = admit({ ...request, task: 'A' }, { ...open, sealed });
    expect(d.kind === 'refuse' && d.error.toWire()).toEqual({
      code: 'ADMISSION_SEALED',
      retryable: false,
      message: 'task "A" was sealed at generation 2 (2026-12-01T00:00:00.000Z)',
      details: { generation: 2, task: 'A' },
    });
    const existing = { sessionId: 's-1-aa', commandDigest: 'sha256:a', state: 'running' as const, task: 'A' };
    expect(admit({ ...request, task: 'A' }, { ...open, sealed, existing })).toEqual({ kind: 'existing', sessionId: 's-1-aa', state: 'running' });
  });

  it('a stopping supervisor refuses new keys (SHUTTING_DOWN, before any other refusal) and still answers its keys', () => {
    expect(code(admit(request, { ...open, stopping: true }))).toBe('SHUTTING_DOWN');
    expect(code(admit(request, { ...closedEverywhere, stopping: true }))).toBe('SHUTTING_DOWN');
    const existing = { sessionId: 's-1-aa', commandDigest: 'sha256:a', state: 'running' as const, task: 'default' };
    expect(admit(request, { ...open, stopping: true, existing })).toEqual({ kind: 'existing', sessionId: 's-1-aa', state: 'running' });
    expect(code(admit(request, { ...open, stopping: true, existing: { ...existing, commandDigest: 'sha256:b' } }))).toBe('KEY_CONFLICT');
    expect(admit(request, { ...open, stopping: true, retired: { sessionId: 's-2-bb', commandDigest: 'sha256:a' } })).toMatchObject({
      kind: 'existing',
      state: 'retired',
    });
  });

  it('answers a retired key as retired (never run again)', () => {
    expect(admit(request, { ...closedEverywhere, retired: { sessionId: 's-2-bb', commandDigest: 'sha256:a' } })).toEqual({
      kind: 'existing',
      sessionId: 's-2-bb',
      state: 'retired',
    });
  });

  it('refuses new keys in order: sealed, the session bound, reconciliation, disk low', () => {
    expect(code(admit(request, closedEverywhere))).toBe('ADMISSION_SEALED');
    expect(code(admit(request, { ...closedEverywhere, sealed: null }))).toBe('LIMIT_EXCEEDED');
    expect(code(admit(request, { ...closedEverywhere, sealed: null, liveSessions: 9 }))).toBe('ADMISSION_DENIED');
    const disk = admit(request, { ...open, disk: { admits: false, freeBytes: 5, minFreeBytes: 9 } });
    expect(disk.kind === 'refuse' && disk.error.toWire()).toEqual({
      code: 'ADMISSION_DENIED',
      retryable: true,
      message: 'disk low: 5 bytes free in the state dir, 9 needed; retry later',
      details: { retry_after_ms: 5000, reason: 'disk_low', free_bytes: 5, min_free_bytes: 9 },
    });
    const reconciling = admit(request, { ...open, reconciling: true });
    expect(reconciling.kind === 'refuse' && reconciling.error.details).toEqual({ retry_after_ms: 250, reason: 'reconciling' });
    const sealed = admit(request, { ...open, sealed: closedEverywhere.sealed });
    expect(sealed.kind === 'refuse' && sealed.error.details).toEqual({ generation: 3 });
  });
});
