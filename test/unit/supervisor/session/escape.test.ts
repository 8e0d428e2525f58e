// The escape watch's decisions as pure functions (supervisor/session/escape.ts, evidence.ts
// qualifyEscapes, core/task/join.ts): who wrote a cgroup.procs, whether the move stayed in the
// session's leaf, how a death is qualified, and what complete(task) makes of it.
import { describe, expect, it } from 'vitest';
import type { CgroupEscape, Receipt } from '../../../../ipc/protocol.js';
import { attributeWrite, ESCAPES_MAX, findStrays, recordEscape, withinLeaf, type TrackedLeaf } from '../../../../supervisor/session/escape.js';
import { cgroupEmpty, qualifyEscapes, subreaperReaped } from '../../../../supervisor/session/evidence.js';
import { evaluateTask, ROOT_TRUST_REASON } from '../../../../core/task/join.js';

const SELF = 100;
const leaf = (id: string, shimPid: number, ino: bigint, uid = 0): TrackedLeaf => ({
  id,
  leafPath: `/cg/sbx/sessions/${id}`,
  leafIno: ino,
  shimPid,
  uid,
  startTicks: 0,
});
const sessions = [leaf('a', 200, 11n), leaf('b', 300, 12n)];

describe('attributeWrite', () => {
  it('the shim itself, alive or gone', () => {
    expect(attributeWrite({ pid: 200, cgroupId: 0n, ancestry: null }, sessions, SELF)).toEqual({ kind: 'session', id: 'a' });
    expect(attributeWrite({ pid: 300, cgroupId: 99n, ancestry: [300, SELF] }, sessions, SELF)).toEqual({ kind: 'session', id: 'b' });
  });
  it('a descendant by its PPid chain, wherever its cgroup is now (it may have moved itself)', () => {
    expect(attributeWrite({ pid: 205, cgroupId: 99n, ancestry: [205, 201, 300, SELF] }, sessions, SELF)).toEqual({ kind: 'session', id: 'b' });
  });
  it('an orphan of ours (reparented to the supervisor): the session whose leaf it is in, else unattributable, possible', () => {
    expect(attributeWrite({ pid: 205, cgroupId: 11n, ancestry: [205, SELF] }, sessions, SELF)).toEqual({ kind: 'session', id: 'a' });
    expect(attributeWrite({ pid: 205, cgroupId: 99n, ancestry: [205, SELF] }, sessions, SELF)).toEqual({ kind: 'possible' });
  });
  it('a process outside our tree (systemd, PID 1): not ours', () => {
    expect(attributeWrite({ pid: 1, cgroupId: 5n, ancestry: [1] }, sessions, SELF)).toEqual({ kind: 'none' });
    expect(attributeWrite({ pid: 900, cgroupId: 5n, ancestry: [900, 1] }, sessions, SELF)).toEqual({ kind: 'none' });
  });
  it('a PPid chain cut short (deeper than followed): its leaf when in one, else possible, never none', () => {
    expect(attributeWrite({ pid: 900, cgroupId: 5n, ancestry: [900, 899], truncated: true }, sessions, SELF)).toEqual({ kind: 'possible' });
    expect(attributeWrite({ pid: 900, cgroupId: 11n, ancestry: [900, 899], truncated: true }, sessions, SELF)).toEqual({ kind: 'session', id: 'a' });
  });
  it('strays of a walk: in no leaf and no leader; owned by the nearest ancestor in a leaf or a leader, else nobody', () => {
    const nodes = [
      { pid: 200, parent: SELF, cgroup: '/elsewhere', startTicks: 1 }, // a's leader, moved out: its session's business
      { pid: 201, parent: 200, cgroup: '/cg/sbx/sessions/a', startTicks: 2 },
      { pid: 202, parent: 201, cgroup: '/x', startTicks: 3 }, // below a
      { pid: 203, parent: 202, cgroup: '/x', startTicks: 4 }, // below a, through a stray
      { pid: 204, parent: SELF, cgroup: '/y', startTicks: 5 }, // an orphan elsewhere
      { pid: 205, parent: SELF, cgroup: '/cg/sbx/sessions/b/sub', startTicks: 6 }, // in b's leaf
    ];
    expect(findStrays(nodes, sessions)).toEqual([
      { pid: 202, cgroup: '/x', startTicks: 3, owner: 'a' },
      { pid: 203, cgroup: '/x', startTicks: 4, owner: 'a' },
      { pid: 204, cgroup: '/y', startTicks: 5, owner: null },
    ]);
  });
  it('gone before the read: its cgroup at the read when a leaf, else possible', () => {
    expect(attributeWrite({ pid: 777, cgroupId: 12n, ancestry: null }, sessions, SELF)).toEqual({ kind: 'session', id: 'b' });
    expect(attributeWrite({ pid: 777, cgroupId: 0n, ancestry: null }, sessions, SELF)).toEqual({ kind: 'possible' });
  });
  it('within the leaf: the leaf or below it, never a sibling sharing its prefix', () => {
    expect(withinLeaf('/cg/sbx/sessions/a', '/cg/sbx/sessions/a')).toBe(true);
    expect(withinLeaf('/cg/sbx/sessions/a/sub', '/cg/sbx/sessions/a')).toBe(true);
    expect(withinLeaf('/cg/sbx/sessions/ab', '/cg/sbx/sessions/a')).toBe(false);
    expect(withinLeaf(null, '/cg/sbx/sessions/a')).toBe(false);
  });
  it('records each (kind, destination, writer) once, at most ESCAPES_MAX', () => {
    const list: CgroupEscape[] = [];
    for (let i = 0; i < 3; i++) recordEscape(list, { kind: 'escape', to: '/x', at: 't', writer_pid: 5 });
    expect(list).toHaveLength(1);
    for (let i = 0; i < 20; i++) recordEscape(list, { kind: 'escape', to: `/x${i}`, at: 't', writer_pid: 5 });
    expect(list).toHaveLength(ESCAPES_MAX);
  });
});

describe('qualifyEscapes', () => {
  const at = new Date('2026-12-01T10:00:00Z');
  const esc: CgroupEscape = { kind: 'escape', to: '/other', at: at.toISOString(), writer_pid: 7 };
  it('an escape turns cgroup_empty into cgroup_escaped with where to; none keeps cgroup_empty, watched', () => {
    expect(qualifyEscapes(cgroupEmpty('/m/s/x', '/m', at), { watch: 'fanotify', escapes: [esc] })).toEqual({
      evidence: 'cgroup_escaped',
      observedAt: at,
      cgroup: '/s/x',
      escapeWatch: 'fanotify',
      escapes: [esc],
    });
    expect(qualifyEscapes(cgroupEmpty('/m/s/x', '/m', at), { watch: 'unavailable', escapes: [] })).toEqual({
      evidence: 'cgroup_empty',
      observedAt: at,
      cgroup: '/s/x',
      escapeWatch: 'unavailable',
    });
    expect(qualifyEscapes(subreaperReaped(0, at), { watch: 'fanotify', escapes: [esc] })).toEqual(subreaperReaped(0, at));
  });
});

describe('complete(task) and root sessions', () => {
  const r = (id: string, death: Receipt['death']) =>
    ({ session_id: id, death, output: { stdout: { final_cursor: 1, complete: true, reason: null } } }) as unknown as Receipt;
  const facts = (sessions: Parameters<typeof evaluateTask>[0]['sessions']) => ({
    sealed: true,
    sessions,
    workspaces: [],
    checkpoints: [],
    sealGeneration: 1,
    fence: { instance: 'i', generation: 1, boot_id: 'b' },
    fenceOnDisk: { instance: 'i', generation: 1 },
  });
  it('an escaped session is an operator obligation naming where its processes went; root sessions are a note', () => {
    const escaped = r('s-1', {
      evidence: 'cgroup_escaped',
      observed_at: 't',
      escapes: [
        { kind: 'escape', to: '/elsewhere', at: 't', writer_pid: 42 },
        { kind: 'escape_possible', to: null, at: 't', writer_pid: null },
      ],
    });
    const v = evaluateTask(facts([{ sessionId: 's-1', state: 'ended', receipt: escaped, unknownReason: null, uid: 0 }]));
    expect(v.complete).toBe(false);
    expect(v.obligations).toEqual([
      {
        authority: 'operator',
        condition: 'sessions_settled',
        session_id: 's-1',
        what: expect.stringContaining('(to /elsewhere by pid 42; possibly to a cgroup since removed)'),
      },
    ]);
    expect(v.trust).toEqual({ root_sessions: ['s-1'], reason: ROOT_TRUST_REASON });
  });
  it('clean root and non-root sessions: complete; the note names the root ones and where escape detection was unavailable', () => {
    const v = evaluateTask(
      facts([
        {
          sessionId: 's-2',
          state: 'ended',
          receipt: r('s-2', { evidence: 'cgroup_empty', observed_at: 't', escape_watch: 'unavailable' }),
          unknownReason: null,
          uid: 0,
        },
        { sessionId: 's-3', state: 'ended', receipt: r('s-3', { evidence: 'cgroup_empty', observed_at: 't' }), unknownReason: null, uid: 65534 },
      ]),
    );
    expect(v.complete).toBe(true);
    expect(v.trust).toEqual({ root_sessions: ['s-2'], reason: `${ROOT_TRUST_REASON}; escape detection was unavailable for s-2` });
    expect(
      evaluateTask(
        facts([{ sessionId: 's-3', state: 'ended', receipt: r('s-3', { evidence: 'cgroup_empty', observed_at: 't' }), unknownReason: null, uid: 65534 }]),
      ).trust,
    ).toBeUndefined();
  });
});
