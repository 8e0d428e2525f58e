// complete(task) as a pure function (core/task/join.ts): each condition from its facts,
// each missing fact one obligation with its authority, and the same facts in any order give
// the same verdict (property: random facts, shuffled; the seed is logged).
import { describe, expect, it } from 'vitest';
import type { Receipt, TaskCheckpointEntry } from '../../../../ipc/protocol.js';
import { checkpointCovers, evaluateTask, receiptWorkspaces, sealFloor, sessionCovered, type JoinFacts, type JoinSession } from '../../../../core/task/join.js';

const EPOCH = 'boot:1000';
const fence = { instance: 'inst', generation: 3, boot_id: 'boot' };

function receipt(
  id: string,
  over: {
    tm?: number | null;
    gap?: string | null;
    scan?: boolean;
    epoch?: string;
    generation?: number;
    ended_at?: string;
    evidence?: string;
    cursor?: number;
  } = {},
): Receipt {
  return {
    session_id: id,
    supervisor: { instance: 'inst', generation: over.generation ?? 3, boot_id: 'boot', mode: 'cgroup', pid: 1 },
    ended_at: over.ended_at ?? '2026-12-01T10:00:00.000Z',
    death: { evidence: over.evidence ?? 'cgroup_empty', observed_at: '2026-12-01T10:00:00.000Z' },
    output: { stdout: { final_cursor: over.cursor ?? 5, complete: true, reason: null } },
    workspace: [
      {
        path: '/ws',
        epoch: over.epoch ?? EPOCH,
        terminal_mutation: over.tm === undefined ? 7 : over.tm,
        gap: over.gap ?? null,
        scan: over.scan ? { digest: 'sha256:s', entries: 1, bytes: 1, max_ctime: null } : null,
        attributed: { events: 0, last_seq: null, last_at: null, last_path: null },
        unattributed_events: 0,
      },
    ],
  } as unknown as Receipt;
}

function checkpoint(over: Partial<TaskCheckpointEntry> = {}): TaskCheckpointEntry {
  return {
    workspace: '/ws',
    checkpoint_id: 'a'.repeat(64),
    store: '/store',
    started_at: '2026-12-01T10:00:01.000Z',
    boundary: { epoch: EPOCH, seq: 9, gap: null },
    scan_digest: 'sha256:x',
    consistent: true,
    unstable: [],
    unstable_count: 0,
    read_back: { exact: true, objects: 1, bytes: 1, at: '2026-12-01T10:00:02.000Z' },
    fence: { instance: 'inst', generation: 3, boot_id: 'boot' },
    close_attempt: 1,
    error: null,
    ...over,
  };
}

const session = (id: string, r: Receipt | null, state = r ? 'ended' : 'unknown'): JoinSession => ({
  sessionId: id,
  state,
  receipt: r,
  unknownReason: r ? null : 'restarted',
});

function facts(over: Partial<JoinFacts> = {}): JoinFacts {
  return {
    sealed: true,
    sessions: [session('s-1', receipt('s-1'))],
    workspaces: [{ path: '/ws', root: '/ws' }],
    checkpoints: [checkpoint()],
    sealGeneration: 3,
    fence,
    fenceOnDisk: { instance: 'inst', generation: 3 },
    ...over,
  };
}

const failing = (v: ReturnType<typeof evaluateTask>) =>
  Object.entries(v.conditions)
    .filter(([, ok]) => !ok)
    .map(([k]) => k);

describe('evaluateTask', () => {
  it('complete when every fact holds', () => {
    expect(evaluateTask(facts())).toEqual({
      complete: true,
      conditions: { sealed: true, sessions_settled: true, terminal_mutations_known: true, checkpoint_covers: true, read_back_exact: true, fenced: true },
      obligations: [],
    });
  });

  it('not sealed: an operator obligation', () => {
    const v = evaluateTask(facts({ sealed: false }));
    expect(failing(v)).toEqual(['sealed']);
    expect(v.obligations).toEqual([{ authority: 'operator', condition: 'sealed', what: 'the task is not sealed' }]);
  });

  it('a session unknown: one operator obligation; the facts it holds back are false without obligations of their own', () => {
    const v = evaluateTask(
      facts({ sessions: [session('s-1', receipt('s-1')), session('s-2', null)], checkpoints: [checkpoint({ checkpoint_id: null, error: null })] }),
    );
    expect(v.complete).toBe(false);
    expect(failing(v)).toEqual(['sessions_settled', 'terminal_mutations_known', 'checkpoint_covers', 'read_back_exact', 'fenced']);
    expect(v.obligations).toEqual([
      { authority: 'operator', condition: 'sessions_settled', session_id: 's-2', what: expect.stringContaining('sbx resolve s-2 --as-operator') },
    ]);
  });

  it('a session whose receipt waits for disk space: an operator obligation to free space, not to resolve it', () => {
    const v = evaluateTask(
      facts({
        sessions: [{ sessionId: 's-4', state: 'unknown', receipt: null, unknownReason: 'disk full', receiptPending: true }],
        checkpoints: [checkpoint({ checkpoint_id: null, error: null })],
      }),
    );
    expect(v.obligations).toEqual([
      {
        authority: 'operator',
        condition: 'sessions_settled',
        session_id: 's-4',
        what: 'session s-4 ended, and its receipt waits to be written (disk full): free space in the state dir, then close again',
      },
    ]);
  });

  it('a session still running: a session obligation', () => {
    const v = evaluateTask(facts({ sessions: [session('s-3', null, 'terminating')] }));
    expect(v.obligations[0]).toEqual({ authority: 'session', condition: 'sessions_settled', session_id: 's-3', what: 'session s-3 is still terminating' });
  });

  it('operator_attested is death evidence; an unknown evidence string or no final cursor is not', () => {
    expect(evaluateTask(facts({ sessions: [session('s-1', receipt('s-1', { evidence: 'operator_attested' }))] })).complete).toBe(true);
    expect(failing(evaluateTask(facts({ sessions: [session('s-1', receipt('s-1', { evidence: 'hope' }))] })))).toEqual(['sessions_settled']);
    expect(failing(evaluateTask(facts({ sessions: [session('s-1', receipt('s-1', { cursor: -1 }))] })))).toEqual(['sessions_settled']);
  });

  it('a gap with a scan stands in for the terminal_mutation; a gap whose scan failed is a workspace obligation', () => {
    expect(
      evaluateTask(facts({ sessions: [session('s-1', receipt('s-1', { tm: null, gap: 'overflow', scan: true, ended_at: '2026-12-01T10:00:00.500Z' }))] }))
        .complete,
    ).toBe(true);
    const v = evaluateTask(facts({ sessions: [session('s-1', receipt('s-1', { tm: null, gap: 'overflow', scan: false }))] }));
    expect(failing(v)).toEqual(['terminal_mutations_known']);
    expect(v.obligations).toEqual([
      {
        authority: 'workspace',
        condition: 'terminal_mutations_known',
        session_id: 's-1',
        workspace: '/ws',
        what: "session s-1's end in /ws is unknown: the watcher had a gap (overflow) and the scan that stands in failed",
      },
    ]);
  });

  it('a workspace not watched: unknown terminal mutations when the task has sessions, vacuous without', () => {
    const ws = [{ path: '/elsewhere', root: null }];
    const cps = [checkpoint({ workspace: '/elsewhere', boundary: { epoch: null, seq: null, gap: 'not_watched' } })];
    expect(failing(evaluateTask(facts({ workspaces: ws, checkpoints: cps })))).toEqual(['terminal_mutations_known']);
    expect(evaluateTask(facts({ workspaces: ws, checkpoints: cps, sessions: [] })).complete).toBe(true);
  });

  it("a workspace the task's receipts name (written there) that the close does not cover: watched now, the close adds it; not watched, a workspace obligation naming the path and the session", () => {
    // s-1 wrote in /ws2 (an attributed event): a receipt from a run that watched it.
    const wrote = (id: string, over: { events?: number; unattributed?: number; gap?: string | null } = {}): Receipt => {
      const r = receipt(id);
      r.workspace!.push({
        ...r.workspace![0],
        path: '/ws2',
        terminal_mutation: over.gap ? null : 3,
        gap: (over.gap ?? null) as never,
        scan: over.gap ? { digest: 'sha256:s', entries: 1, bytes: 1, max_ctime: null } : null,
        attributed: { events: over.events ?? 0, last_seq: null, last_at: null, last_path: null },
        unattributed_events: over.unattributed ?? 0,
      });
      return r;
    };
    const sessions = [session('s-1', wrote('s-1', { events: 1 })), session('s-2', wrote('s-2', { unattributed: 2 })), session('s-3', wrote('s-3'))];
    const ws = [{ path: '/ws', root: '/ws' }];
    // Watched now: the close adds it (and so covers it); s-3 touched nothing there.
    expect(receiptWorkspaces(sessions, ws, ['/ws', '/ws2'])).toEqual({ include: ['/ws2'], unwatched: [] });
    // Not watched (a restart without it): each session that wrote there is an obligation.
    expect(receiptWorkspaces(sessions, ws, ['/ws'])).toEqual({ include: [], unwatched: [{ root: '/ws2', sessionIds: ['s-1', 's-2'] }] });
    const v = evaluateTask(facts({ sessions }));
    expect(v.complete).toBe(false);
    expect(failing(v)).toEqual(['checkpoint_covers']);
    expect(v.obligations).toEqual(
      ['s-1', 's-2'].map((id) => ({
        authority: 'workspace',
        condition: 'checkpoint_covers',
        session_id: id,
        workspace: '/ws2',
        what: `workspace /ws2 is named by session ${id}'s receipt (it may have written there) but is not a workspace of this close, nor watched by this supervisor: no checkpoint orders those writes (watch it again, workspace.paths or serve --workspace, and close again)`,
      })),
    );
    // A close of no workspace at all (restarted without --workspace): the same obligation, the task not complete.
    const none = evaluateTask(facts({ sessions: [session('s-1', wrote('s-1', { events: 1 }))], workspaces: [], checkpoints: [] }));
    expect(none.complete).toBe(false);
    expect(none.obligations.map((o) => o.workspace)).toEqual(['/ws2']); // s-1 wrote nothing in /ws
    // A gap hides what happened there: counted as written.
    expect(receiptWorkspaces([session('s-1', wrote('s-1', { gap: 'overflow' }))], ws, []).unwatched).toEqual([{ root: '/ws2', sessionIds: ['s-1'] }]);
    // Covered by a workspace of the close (a directory in it counts, as for checkpoints): complete.
    expect(
      evaluateTask(
        facts({
          sessions: [session('s-1', wrote('s-1', { events: 1 }))],
          workspaces: [...ws, { path: '/ws2', root: '/ws2' }],
          checkpoints: [checkpoint(), checkpoint({ workspace: '/ws2' })],
        }),
      ).complete,
    ).toBe(true);
  });

  it('a checkpoint older than a terminal_mutation in the same epoch does not cover it, even if it started later by the clock', () => {
    const r = receipt('s-1', { tm: 12, ended_at: '2026-12-01T09:00:00.000Z' });
    expect(checkpointCovers(checkpoint(), r, '/ws')).toBe(false);
    const v = evaluateTask(facts({ sessions: [session('s-1', r)] }));
    expect(failing(v)).toEqual(['checkpoint_covers']);
    expect(v.obligations[0]).toMatchObject({
      authority: 'workspace',
      condition: 'checkpoint_covers',
      session_id: 's-1',
      what: expect.stringContaining('is older than session s-1'),
    });
    expect(checkpointCovers(checkpoint({ boundary: { epoch: EPOCH, seq: 12, gap: null } }), r, '/ws')).toBe(true);
  });

  it('across epochs or gaps, by order: a later supervisor run covers; in one run, a checkpoint started after the session ended', () => {
    const other = receipt('s-1', { epoch: 'boot:500', generation: 2 });
    expect(checkpointCovers(checkpoint(), other, '/ws')).toBe(true);
    expect(checkpointCovers(checkpoint({ fence: { ...fence, generation: 1 } }), other, '/ws')).toBe(false);
    const gap = receipt('s-1', { tm: null, gap: 'listener_restart', scan: true, ended_at: '2026-12-01T10:00:05.000Z' });
    expect(checkpointCovers(checkpoint(), gap, '/ws')).toBe(false);
    expect(checkpointCovers(checkpoint({ started_at: '2026-12-01T10:00:05.000Z' }), gap, '/ws')).toBe(true);
  });

  it('a workspace first watched after a session ended (its receipt has no entry): ordered by a checkpoint taken after its proven end, else the obligation stays', () => {
    const ws2 = { path: '/ws2', root: '/ws2' };
    const cp2 = checkpoint({ workspace: '/ws2', boundary: { epoch: 'boot:2000', seq: 3, gap: null }, fence: { ...fence, generation: 4 } });
    const run4 = { ...fence, generation: 4 };
    const base = { workspaces: [{ path: '/ws', root: '/ws' }, ws2], fence: run4, fenceOnDisk: { instance: 'inst', generation: 4 }, sealGeneration: 4 };
    // Written by run 3, ws2 watched from run 4 on, checkpoints by run 4: complete.
    const later = evaluateTask(facts({ ...base, checkpoints: [checkpoint({ fence: run4 }), cp2] }));
    expect(later).toMatchObject({ complete: true, obligations: [] });
    // In the same run: a checkpoint started after the session ended orders it; one started before does not.
    const same = { ...base, fence, fenceOnDisk: { instance: 'inst', generation: 3 }, sealGeneration: 3 };
    const after = checkpoint({ workspace: '/ws2', boundary: { epoch: 'boot:2000', seq: 3, gap: null }, started_at: '2026-12-01T10:00:01.000Z' });
    expect(evaluateTask(facts({ ...same, checkpoints: [checkpoint(), after] })).complete).toBe(true);
    const before = evaluateTask(facts({ ...same, checkpoints: [checkpoint(), { ...after, started_at: '2026-12-01T09:59:59.000Z' }] }));
    expect(failing(before)).toEqual(['terminal_mutations_known']);
    expect(before.obligations).toEqual([
      {
        authority: 'workspace',
        condition: 'terminal_mutations_known',
        session_id: 's-1',
        workspace: '/ws2',
        what: `session s-1's receipt has no entry for /ws2 (the workspace was not watched while it ran), and checkpoint ${'a'.repeat(64)} cannot be shown to come after its proven end`,
      },
    ]);
    // No proven death (escaped, not attested): the order cannot be shown.
    const escaped = evaluateTask(
      facts({ ...base, sessions: [session('s-1', receipt('s-1', { evidence: 'cgroup_escaped' }))], checkpoints: [checkpoint({ fence: run4 }), cp2] }),
    );
    expect(escaped.obligations.filter((o) => o.condition === 'terminal_mutations_known').map((o) => o.workspace)).toEqual(['/ws2']);
    const attested = evaluateTask(
      facts({
        ...base,
        sessions: [{ ...session('s-1', receipt('s-1', { evidence: 'cgroup_escaped' })), escapeAttested: true }],
        checkpoints: [checkpoint({ fence: run4 }), cp2],
      }),
    );
    expect(attested).toMatchObject({ complete: true, obligations: [] });
    // No checkpoint of ws2 (it failed): both facts are missing, each named.
    const failed = evaluateTask(
      facts({
        ...base,
        checkpoints: [checkpoint({ fence: run4 }), { ...cp2, checkpoint_id: null, error: { code: 'CHECKPOINT_FAILED', stage: 'capture', message: 'boom' } }],
      }),
    );
    expect(failed.obligations.map((o) => [o.condition, o.workspace])).toEqual([
      ['terminal_mutations_known', '/ws2'],
      ['checkpoint_covers', '/ws2'],
    ]);
    expect(sessionCovered(cp2, session('s-1', receipt('s-1')), '/ws2')).toBe(true);
    expect(sessionCovered({ ...cp2, fence }, session('s-1', receipt('s-1', { ended_at: '2026-12-01T10:00:05.000Z' })), '/ws2')).toBe(false);
  });

  it('unstable, failed, read-back: each its own obligation', () => {
    const unstable = evaluateTask(facts({ checkpoints: [checkpoint({ consistent: false, unstable: ['a', 'b'], unstable_count: 2 })] }));
    expect(failing(unstable)).toEqual(['checkpoint_covers']);
    expect(unstable.obligations[0].what).toContain('2 paths of /ws changed in every pass');
    // A leased path never changed: its obligation says a lease kept it shut, not captured; the rest still changed.
    const leased = evaluateTask(
      facts({ checkpoints: [checkpoint({ consistent: false, unstable: ['a', 'held'], unstable_count: 2, leased: ['held'], leased_count: 1 })] }),
    );
    expect(leased.obligations.map((o) => o.what)).toEqual([
      expect.stringMatching(/^1 path of \/ws changed in every pass of checkpoint .* \(a\): stop what writes them and close again$/),
      expect.stringMatching(
        /^1 path of \/ws held by another process's write lease in checkpoint .*: not captured \(held\); end what holds the lease \(fcntl F_SETLEASE\) and close again$/,
      ),
    ]);
    const onlyLeased = evaluateTask(
      facts({ checkpoints: [checkpoint({ consistent: false, unstable: ['held'], unstable_count: 1, leased: ['held'], leased_count: 1 })] }),
    );
    expect(onlyLeased.obligations.map((o) => o.what)).toEqual([expect.not.stringContaining('changed in every pass')]);
    const failedScan = evaluateTask(
      facts({ checkpoints: [checkpoint({ checkpoint_id: null, error: { code: 'CHECKPOINT_FAILED', stage: 'scan', message: 'EIO' } })] }),
    );
    expect(failedScan.obligations).toEqual([
      {
        authority: 'workspace',
        condition: 'checkpoint_covers',
        workspace: '/ws',
        what: 'the checkpoint of /ws failed (CHECKPOINT_FAILED, scan): EIO; close again to retry',
      },
    ]);
    const readBack = evaluateTask(
      facts({ checkpoints: [checkpoint({ checkpoint_id: null, error: { code: 'CHECKPOINT_FAILED', stage: 'read_back', message: 'object x' } })] }),
    );
    expect(readBack.obligations.map((o) => o.condition)).toEqual(['read_back_exact']);
  });

  it("fenced: the checkpoint is this instance's, not newer than this run, not from before the seal; supervisor.json still names this run", () => {
    expect(failing(evaluateTask(facts({ checkpoints: [checkpoint({ fence: { ...fence, instance: 'other' } })] })))).toEqual(['fenced']);
    expect(failing(evaluateTask(facts({ checkpoints: [checkpoint({ fence: { ...fence, generation: 4 } })] })))).toEqual(['fenced']);
    expect(failing(evaluateTask(facts({ sealGeneration: 4, fence: { ...fence, generation: 4 }, fenceOnDisk: { instance: 'inst', generation: 4 } })))).toEqual([
      'fenced',
    ]);
    const taken = evaluateTask(facts({ fenceOnDisk: { instance: 'inst', generation: 5 } }));
    expect(taken.obligations).toEqual([{ authority: 'operator', condition: 'fenced', what: expect.stringContaining('another supervisor took the state dir') }]);
    expect(failing(evaluateTask(facts({ fenceOnDisk: null })))).toEqual(['fenced']);
  });

  it("a seal from above this run's generation (another instance's: supervisor.json lost, the generation recovered lower): this run's checkpoints are fenced, older ones not", () => {
    const now = { instance: 'inst', generation: 2, boot_id: 'boot' };
    const base = {
      sealGeneration: 5,
      fence: now,
      fenceOnDisk: { instance: 'inst', generation: 2 },
      sessions: [session('s-1', receipt('s-1', { generation: 2 }))],
    };
    expect(evaluateTask(facts({ ...base, checkpoints: [checkpoint({ fence: now })] })).complete).toBe(true);
    const older = evaluateTask(facts({ ...base, checkpoints: [checkpoint({ fence: { ...now, generation: 1 } })] }));
    expect(failing(older)).toEqual(['fenced']);
    expect(older.obligations[0].what).toContain(
      'carries generation 1, from before this run (generation 2; the task was sealed at generation 5 by another instance)',
    );
    expect(sealFloor(5, now)).toBe(2);
    expect(sealFloor(1, now)).toBe(1);
    expect(sealFloor(null, now)).toBeNull();
  });

  it('property: the verdict does not depend on the order of sessions; complete only when no obligation', () => {
    const seed = Number(process.env.TASK_JOIN_SEED ?? Date.now() % 1_000_000);
    console.log(`task-join property seed ${seed} (TASK_JOIN_SEED=${seed} to repeat)`);
    let x = seed || 1;
    const rand = () => (x = (x * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
    for (let round = 0; round < 500; round++) {
      const n = Math.floor(rand() * 5);
      const sessions: JoinSession[] = Array.from({ length: n }, (_, i) => {
        const pick = rand();
        if (pick < 0.1) return session(`s-${i}`, null);
        const gap = rand() < 0.3;
        return session(
          `s-${i}`,
          receipt(`s-${i}`, {
            tm: gap ? null : Math.floor(rand() * 12),
            gap: gap ? 'overflow' : null,
            scan: rand() < 0.8,
            ended_at: `2026-12-01T10:00:0${Math.floor(rand() * 3)}.000Z`,
          }),
        );
      });
      const f = facts({ sessions, checkpoints: [checkpoint({ consistent: rand() < 0.9 })] });
      const v = evaluateTask(f);
      const shuffled = evaluateTask({ ...f, sessions: [...sessions].reverse() });
      expect(shuffled.complete).toBe(v.complete);
      expect(shuffled.conditions).toEqual(v.conditions);
      expect(v.complete).toBe(v.obligations.length === 0);
      expect(v.complete).toBe(Object.values(v.conditions).every(Boolean));
    }
  });
});
