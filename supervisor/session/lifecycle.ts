// A session's lifecycle (docs/reference/contract.md "Session lifecycle") as one declared table: admitted →
// running → leader_exited → terminating → ended, and unknown when death cannot be proven
// (found so at start, or an end whose receipt could not be written) until evidence arrives.
// Lifecycle holds a session's state privately and refuses any move the table does not list.
// Pure but for the listener it calls; unit-tested without processes (test/unit/lifecycle).
import type { SessionState } from '../../ipc/protocol.js';

/** Every move a session's state may make, from each state. */
export const TRANSITIONS: Readonly<Record<SessionState, readonly SessionState[]>> = {
  // running: the shim was spawned; ended: the receipt of a spawn that failed; unknown: that
  // receipt could not be written.
  admitted: ['running', 'ended', 'unknown'],
  // unknown: no proof of death (the shim died before reporting, an internal error); ended: a
  // service of leftovers (no leader of its own) whose last process exited.
  running: ['leader_exited', 'terminating', 'ended', 'unknown'],
  leader_exited: ['terminating', 'ended', 'unknown'],
  terminating: ['ended', 'unknown'],
  // ended: evidence arrived (reconciliation, an operator's word, a receipt that waited for space).
  unknown: ['ended'],
  ended: [],
};

/** The states a session starts in: admitted (launched now), ended or unknown (found at start). */
export type InitialState = 'admitted' | 'ended' | 'unknown';

/** Whether the table lets a session move from `from` to `to`. */
export function canTransition(from: SessionState, to: SessionState): boolean {
  return TRANSITIONS[from].includes(to);
}

/** Settled: nothing more for the supervisor to drive; a receipt (ended), or unknown (none without evidence). */
export function isSettled(state: SessionState): boolean {
  return state === 'ended' || state === 'unknown';
}

/** Live: not settled; its processes may run and the supervisor owns their end. */
export function isLive(state: SessionState): boolean {
  return !isSettled(state);
}

/** The state of one session; every change goes through to(). */
export class Lifecycle {
  #state: SessionState;

  constructor(
    initial: InitialState,
    private readonly onChange: (from: SessionState, to: SessionState) => void,
  ) {
    this.#state = initial;
  }

  get state(): SessionState {
    return this.#state;
  }

  /** Moves to next; throws (a bug) when the table does not allow it. */
  to(next: SessionState): void {
    const from = this.#state;
    if (!canTransition(from, next)) throw new Error(`session state ${from} → ${next} is not a transition of the lifecycle`);
    this.#state = next;
    this.onChange(from, next);
  }
}
