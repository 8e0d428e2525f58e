// Reconciliation after a restart: each session a crash left unknown is settled with evidence where
// there is some (RecoveredSession.reconcile: owner_lost receipts), never relaunched. Owns whether
// admission waits for it (deciding) and each session's reconciliation while it runs, for a task
// close to wait for its own sessions' only and for shutdown to settle.
import type { Logger } from 'pino';
import type { SupervisorMetrics } from './metrics/registry.js';
import { RecoveredSession } from './session/recovered.js';
import type { Session } from './session/session.js';

export class Reconciliation {
  /** True from a restore that found unknown sessions until begin() has decided the course of each: admission waits. */
  deciding = false;
  /** Each recovered session's reconciliation while it runs, by session id. */
  private readonly running = new Map<string, Promise<void>>();
  /** The background part (escalations of recovered sessions), for shutdown to settle. */
  private all: Promise<void> = Promise.resolve();

  constructor(
    private readonly log: Logger,
    private readonly metrics: SupervisorMetrics | null,
  ) {}

  /**
   * Settles every unknown session among sessions. Each session's course is decided at once
   * (RecoveredSession.reconcile decides before its first await) and `deciding` turns false
   * right after, in the same tick: ending a TERM-ignoring leaf takes its grace (up to 30 days),
   * and runs on in the background while retries of its key answer with the session, unknown
   * until its receipt is written. Resolves once every one of them is settled.
   */
  begin(sessions: Iterable<Session>): Promise<void> {
    const unknown = [...sessions].filter((s): s is RecoveredSession => s instanceof RecoveredSession && s.state === 'unknown');
    const settling = unknown.map((s) => {
      const done = s
        .reconcile()
        .then(
          () => this.metrics?.reconciled(s.state === 'ended' ? 'ended' : 'unknown'),
          (err: Error) => {
            this.metrics?.reconciled('failed');
            this.log.error({ err, session_id: s.id }, 'reconciliation failed; the session stays unknown');
          },
        )
        .finally(() => this.running.delete(s.id));
      this.running.set(s.id, done);
      return done;
    });
    this.deciding = false;
    this.log.info({ sessions: unknown.length, being_ended: unknown.filter((s) => s.state === 'unknown').length }, 'reconciliation decided; admission open');
    this.all = Promise.all(settling).then(() => {
      const left = unknown.filter((s) => s.state === 'unknown').length;
      this.log.info({ reconciled: unknown.length - left, still_unknown: left }, 'reconciliation done');
    });
    return this.all;
  }

  /** Resolves once the reconciliation of these sessions (those a restart left) is done: receipts written, or stuck unknown. Others' are not waited for. */
  of(sessions: Session[]): Promise<void> {
    return Promise.all(sessions.map((s) => this.running.get(s.id))).then(() => {});
  }

  /** Resolves once every reconciliation begun is done. */
  settled(): Promise<void> {
    return this.all;
  }
}
