// The retention policy (config retention.*; `sbx gc` runs it now): which ended sessions lose their output
// (chunk files and index) and which lose their receipt too. Pure: the plan is computed from a list of
// candidates, the supervisor applies it. Running and unknown sessions are never candidates, and keys are
// never removed (keys are forever).

export interface RetentionPolicy {
  /** Output of sessions ended longer ago than this goes; 0: no age limit. */
  outputMaxAgeMs: number;
  /** Then the oldest ended sessions' output goes while all output holds more than this; 0: no limit. */
  outputMaxTotalBytes: number;
  /** Receipts of sessions ended longer ago than this go too; 0 keeps them forever. */
  receiptMaxAgeMs: number;
}

export interface RetentionCandidate {
  sessionId: string;
  /** Ended sessions only can lose anything; the others only count towards the total. */
  ended: boolean;
  endedAtMs: number;
  /** Bytes of chunk files and index on disk; 0 once removed. */
  outputBytes: number;
  outputRemoved: boolean;
}

export interface RetentionPlan {
  /** Sessions whose output (chunk files, index) is removed; their receipts stay. */
  removeOutput: string[];
  /** Sessions removed whole (receipt and admission record; a tombstone keeps the key's answer). */
  retire: string[];
}

/**
 * Free space now and the keep-free target, in bytes: like journald's SystemKeepFree=, the oldest ended output is
 * removed while the file system has less than that free (receipts stay).
 */
export interface SpaceTarget {
  freeBytes: number;
  keepFreeBytes: number;
}

/**
 * The plan: whole sessions past receiptMaxAgeMs; then, oldest ended first, output past its
 * age, while all output is over outputMaxTotalBytes, or while free space (plus what the plan
 * frees) is under the keep-free target.
 */
export function planRetention(candidates: RetentionCandidate[], policy: RetentionPolicy, nowMs: number, space: SpaceTarget | null = null): RetentionPlan {
  const ended = candidates.filter((c) => c.ended).sort((a, b) => a.endedAtMs - b.endedAtMs || (a.sessionId < b.sessionId ? -1 : 1));
  const retire = policy.receiptMaxAgeMs > 0 ? ended.filter((c) => nowMs - c.endedAtMs > policy.receiptMaxAgeMs).map((c) => c.sessionId) : [];
  const retired = new Set(retire);
  const removeOutput: string[] = [];
  let total = candidates.reduce((n, c) => n + (c.outputRemoved || retired.has(c.sessionId) ? 0 : c.outputBytes), 0);
  let freed = ended.reduce((n, c) => n + (retired.has(c.sessionId) && !c.outputRemoved ? c.outputBytes : 0), 0);
  for (const c of ended) {
    if (c.outputRemoved || retired.has(c.sessionId)) continue;
    const tooOld = policy.outputMaxAgeMs > 0 && nowMs - c.endedAtMs > policy.outputMaxAgeMs;
    const overTotal = policy.outputMaxTotalBytes > 0 && total > policy.outputMaxTotalBytes;
    const underKeepFree = space !== null && space.freeBytes + freed < space.keepFreeBytes;
    if (tooOld || overTotal || underKeepFree) {
      removeOutput.push(c.sessionId);
      total -= c.outputBytes;
      freed += c.outputBytes;
    }
  }
  return { removeOutput, retire };
}
