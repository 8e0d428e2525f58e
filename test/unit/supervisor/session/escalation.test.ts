// The one escalation (supervisor/session/escalation.ts) against a target that records what it
// is asked: TERM, the grace, KILL; grace 0; death within the grace; an operator's cut.
import { describe, expect, it } from 'vitest';
import { escalate, type EscalationStep, type EscalationTarget } from '../../../../supervisor/session/escalation.js';

function target(diesOnTerm: boolean): EscalationTarget & { calls: string[] } {
  const calls: string[] = [];
  return {
    calls,
    term: () => {
      calls.push('term');
      return 3;
    },
    waitDead: async (ms) => {
      calls.push(`wait ${ms}`);
      return diesOnTerm;
    },
    killAll: async (killed) => {
      calls.push('kill');
      killed(2);
    },
  };
}

describe('escalate', () => {
  it('TERM, then waits the grace; processes that go then are not KILLed', async () => {
    const t = target(true);
    const steps: EscalationStep[] = [];
    await escalate(t, 500, (s) => steps.push(s));
    expect(t.calls).toEqual(['term', 'wait 500']);
    expect(steps.map((s) => [s.signal, s.pids])).toEqual([['SIGTERM', 3]]);
  });

  it('KILLs what is left after the grace, recording both steps', async () => {
    const t = target(false);
    const steps: EscalationStep[] = [];
    await escalate(t, 500, (s) => steps.push(s));
    expect(t.calls).toEqual(['term', 'wait 500', 'kill']);
    expect(steps.map((s) => [s.signal, s.pids])).toEqual([
      ['SIGTERM', 3],
      ['SIGKILL', 2],
    ]);
  });

  it('grace 0 is KILL at once', async () => {
    const t = target(true);
    const steps: EscalationStep[] = [];
    await escalate(t, 0, (s) => steps.push(s));
    expect(t.calls).toEqual(['kill']);
    expect(steps.map((s) => s.signal)).toEqual(['SIGKILL']);
  });

  it('a cut ends the grace early: KILL now', async () => {
    const t: EscalationTarget & { calls: string[] } = { ...target(false), waitDead: () => new Promise<boolean>(() => {}) };
    const steps: EscalationStep[] = [];
    await escalate(t, 45_000, (s) => steps.push(s), Promise.resolve());
    expect(steps.map((s) => s.signal)).toEqual(['SIGTERM', 'SIGKILL']);
  });
});
