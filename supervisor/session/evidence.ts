// Where death evidence is decided (docs/reference/contract.md "Words": death evidence): pure functions from what
// was observed (a cgroup read, the shim's report, the boot id, an operator's word) to the
// receipt's `death` facts, and for a session found without a receipt after a restart, which
// evidence can be had at all. No I/O: the callers observe, these decide (test/unit/evidence).
import type { CgroupEscape } from '../../ipc/protocol.js';
import type { ReceiptFacts } from './receipt.js';

export type DeathFacts = ReceiptFacts['death'];

/** The leaf's cgroup.events said `populated 0` at observedAt; the receipt names the leaf inside the mount. */
export function cgroupEmpty(leafPath: string, mountPoint: string, observedAt: Date): DeathFacts {
  return { evidence: 'cgroup_empty', observedAt, cgroup: leafPath.startsWith(mountPoint) ? leafPath.slice(mountPoint.length) : leafPath };
}

/**
 * A cgroup death qualified by the escape watch (escape.ts): whether it watched, and, when a
 * process of the session moved something out of the leaf first, cgroup_escaped with where to
 * (the empty leaf proves nothing for what left). Other evidence is returned as it is.
 */
export function qualifyEscapes(death: DeathFacts, report: { watch: 'fanotify' | 'unavailable'; escapes: CgroupEscape[] }): DeathFacts {
  if (death.evidence !== 'cgroup_empty') return death;
  return {
    ...death,
    evidence: report.escapes.length ? 'cgroup_escaped' : 'cgroup_empty',
    escapeWatch: report.watch,
    ...(report.escapes.length ? { escapes: report.escapes } : {}),
  };
}

/** The session's own subreaper (the shim) reaped every descendant (`reaped` orphans besides the leader). */
export function subreaperReaped(reaped: number, observedAt: Date): DeathFacts {
  return { evidence: 'subreaper_reaped', observedAt, reaped };
}

/** The machine rebooted since admission (boot_id differs): nothing of that boot runs. */
export function bootChanged(observedAt: Date): DeathFacts {
  return { evidence: 'boot_changed', observedAt };
}

/** An operator attested the end (sbx resolve --as-operator): a person's word, marked so. */
export function operatorAttested(observedAt: Date): DeathFacts {
  return { evidence: 'operator_attested', observedAt };
}

/**
 * Whether a live session's end can still be proven once its shim is gone: where the shim's
 * report is needed (subreaper mode, where it is the proof; a pty, whose session leader the shim
 * stays) and it died without one, nothing proves the session dead: the reason, for unknown
 * (never failed). null: the end can be proven (liveDeath).
 */
export function missingShimReport(o: { reportNeeded: boolean; shimReport: { reaped: number } | null }): string | null {
  return o.reportNeeded && !o.shimReport ? "the exec shim (the session's subreaper) died before reporting all descendants reaped" : null;
}

/**
 * What a live session's end proves, once the leader is reaped and (with a leaf) the leaf read
 * `populated 0`: cgroup_empty with a leaf; without one (subreaper mode) subreaper_reaped when
 * the shim reported all reaped; null when it died without reporting (no proof: unknown).
 */
export function liveDeath(
  o: { leafPath: string | null; mountPoint: string | null; shimReport: { reaped: number } | null },
  observedAt: Date,
): DeathFacts | null {
  if (o.leafPath && o.mountPoint) return cgroupEmpty(o.leafPath, o.mountPoint, observedAt);
  return o.shimReport ? subreaperReaped(o.shimReport.reaped, observedAt) : null;
}

/** What reconciliation can do for a session found without a receipt. */
export type RecoveredCourse =
  | { kind: 'boot_changed' }
  /** Its leaf is in this supervisor's cgroup mount: end what runs there, then cgroup_empty. */
  | { kind: 'cgroup'; leafPath: string }
  /** No evidence to be had (subreaper mode, no leaf): unknown until an operator's word. */
  | { kind: 'no_evidence'; reason: string };

/**
 * The course for a recovered session: another boot is evidence by itself; else only a cgroup
 * leaf under this supervisor's mount can prove death; without one nothing can.
 */
export function recoveredCourse(o: { admittedBootId: string; bootId: string; leafPath: string | null; mountPoint: string | null }): RecoveredCourse {
  if (o.admittedBootId !== o.bootId) return { kind: 'boot_changed' };
  if (o.leafPath && o.mountPoint && o.leafPath.startsWith(o.mountPoint + '/')) return { kind: 'cgroup', leafPath: o.leafPath };
  return { kind: 'no_evidence', reason: 'owner lost in subreaper mode: no cgroup to prove the session dead (sbx resolve --as-operator)' };
}
