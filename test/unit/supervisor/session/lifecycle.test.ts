// The session lifecycle table (supervisor/session/lifecycle.ts), without processes: every move
// it lists is taken, every other one refused, and the predicates used everywhere agree with it.
import { describe, expect, it } from 'vitest';
import type { SessionState } from '../../../../ipc/protocol.js';
import { canTransition, isLive, isSettled, Lifecycle, TRANSITIONS } from '../../../../supervisor/session/lifecycle.js';

const STATES: SessionState[] = ['admitted', 'running', 'leader_exited', 'terminating', 'ended', 'unknown'];

describe('the lifecycle table', () => {
  it('is the documented lifecycle: admitted → running → leader_exited → terminating → ended, unknown until evidence', () => {
    expect(TRANSITIONS).toEqual({
      admitted: ['running', 'ended', 'unknown'],
      running: ['leader_exited', 'terminating', 'ended', 'unknown'],
      leader_exited: ['terminating', 'ended', 'unknown'],
      terminating: ['ended', 'unknown'],
      unknown: ['ended'],
      ended: [],
    });
  });

  it('allows exactly the listed moves', () => {
    for (const from of STATES) {
      for (const to of STATES) expect(canTransition(from, to), `${from} → ${to}`).toBe(TRANSITIONS[from].includes(to));
    }
    // Never back from the end, never from ended to unknown, never skipping the spawn.
    expect(canTransition('ended', 'unknown')).toBe(false);
    expect(canTransition('unknown', 'running')).toBe(false);
    expect(canTransition('admitted', 'leader_exited')).toBe(false);
  });

  it('settled is ended or unknown; live is the rest', () => {
    expect(STATES.filter(isSettled)).toEqual(['ended', 'unknown']);
    expect(STATES.filter(isLive)).toEqual(['admitted', 'running', 'leader_exited', 'terminating']);
  });

  it('Lifecycle holds the state, tells each change, and refuses a move the table does not list', () => {
    const changes: string[] = [];
    const life = new Lifecycle('admitted', (from, to) => changes.push(`${from}>${to}`));
    life.to('running');
    life.to('leader_exited');
    life.to('terminating');
    life.to('ended');
    expect(life.state).toBe('ended');
    expect(changes).toEqual(['admitted>running', 'running>leader_exited', 'leader_exited>terminating', 'terminating>ended']);
    expect(() => life.to('unknown')).toThrow('session state ended → unknown is not a transition of the lifecycle');
    expect(life.state).toBe('ended');
    const recovered = new Lifecycle('unknown', () => {});
    expect(() => recovered.to('running')).toThrow(/unknown → running/);
    recovered.to('ended');
    expect(recovered.state).toBe('ended');
  });
});
