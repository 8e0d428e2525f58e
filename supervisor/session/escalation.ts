// How a session is ended, the one escalation for live sessions (deadline, cancel, linger, shutdown, close)
// and for sessions recovered after a restart (reconcile): SIGTERM to every process, up to the grace for them
// to go, then SIGKILL to what is left, each step recorded as it is taken. See kill(2),
// Documentation/admin-guide/cgroup-v2.rst (cgroup.kill, cgroup.events).

/** One escalation step for the receipt: the signal, when it was sent, how many pids it reached. */
export interface EscalationStep {
  signal: 'SIGTERM' | 'SIGKILL';
  at: Date;
  pids: number;
}

/** What an escalation acts on: how signals reach the session's processes and how their death is seen. */
export interface EscalationTarget {
  /** SIGTERM to every process of the session; how many pids it reached. */
  term(): number | Promise<number>;
  /** True once nothing of the session runs, false after timeoutMs. */
  waitDead(timeoutMs: number): Promise<boolean>;
  /**
   * SIGKILL to everything left (cgroup.kill, which takes setsid'ed and double-forked descendants
   * alike): calls killed(pids) as the KILL goes out, resolves once nothing of the session runs.
   */
  killAll(killed: (pids: number) => void): Promise<void>;
}

/**
 * TERM, then up to graceMs (graceMs 0: KILL at once) for the processes to go, ended early by
 * `cut` (an operator's cancel); then KILL. `onStep` hears each step as it is taken.
 */
export async function escalate(target: EscalationTarget, graceMs: number, onStep: (step: EscalationStep) => void, cut?: Promise<void>): Promise<void> {
  if (graceMs > 0) {
    const pids = await target.term();
    onStep({ signal: 'SIGTERM', at: new Date(), pids });
    const dead = cut ? await Promise.race([target.waitDead(graceMs), cut.then(() => false)]) : await target.waitDead(graceMs);
    if (dead) return;
  }
  await target.killAll((pids) => onStep({ signal: 'SIGKILL', at: new Date(), pids }));
}
