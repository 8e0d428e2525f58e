// The one duration syntax of the CLI (every --timeout, --grace, --since, --until): Go's
// time.ParseDuration compounds ("1m30s", "1h2m3.5s", "500ms", "250us"; units ns us µs ms s m
// h, and d for days), or a bare number of seconds as timeout(1) reads it ("10", "1.5"). Pure;
// bounded so no timer can overflow into an immediate fire; a positive duration never rounds
// down to 0 ms (which would mean "no deadline"). The supervisor's config takes integers of ms.

/** Longest accepted duration: 30 days, in milliseconds. */
export const MAX_DURATION_MS = 30 * 24 * 3600 * 1000;

/** Each unit in nanoseconds (Go's set, plus d). */
const UNIT_NS: Record<string, number> = { ns: 1, us: 1e3, µs: 1e3, μs: 1e3, ms: 1e6, s: 1e9, m: 60e9, h: 3600e9, d: 86_400e9 };
const COMPOUND = /^(?:\d+(?:\.\d+)?(?:ns|us|µs|μs|ms|s|m|h|d))+$/;
const PART = /(\d+(?:\.\d+)?)(ns|us|µs|μs|ms|s|m|h|d)/g;
const BARE = /^\d+(?:\.\d+)?$/;

/** Whether text is written as a duration (a compound with units, or a bare number), without checking its bound. */
export function isDuration(text: string): boolean {
  return COMPOUND.test(text) || BARE.test(text);
}

/**
 * Parses a duration to microseconds (rounded to the nearest µs; a positive one is at least 1).
 * Throws RangeError naming the input when it is not a duration (`1x`, `-1s`, ``, ` 1s` (no
 * spaces, as Go), `1m30`: a number after a unit needs its own unit) or is over maxMs (default 30 days; --since passes
 * Infinity: an age has no timer to overflow).
 */
export function parseDurationUs(text: string, maxMs: number = MAX_DURATION_MS): number {
  let ns = 0;
  if (BARE.test(text)) ns = Number(text) * 1e9;
  else if (COMPOUND.test(text)) for (const m of text.matchAll(PART)) ns += Number(m[1]) * UNIT_NS[m[2]!]!;
  else {
    const hint = /\s/.test(text) ? '; no spaces' : COMPOUND.test(withoutTrailingNumber(text)) ? '; the last number needs a unit' : '';
    throw new RangeError(`not a duration: ${JSON.stringify(text)}${hint} (use e.g. 500ms, 30s, 1m30s, 1h2m3.5s; a bare number is seconds)`);
  }
  if (!Number.isFinite(ns) || ns > maxMs * 1e6)
    throw new RangeError(`duration ${JSON.stringify(text)} is over the limit of ${maxMs === MAX_DURATION_MS ? '30 days' : `${maxMs} ms`}`);
  return ns > 0 ? Math.max(1, Math.round(ns / 1e3)) : 0;
}

/** text less a trailing number (`1m30` → `1m`), by a scan from the end: linear, where a regex anchored at the end retries every start (quadratic on a long input). */
function withoutTrailingNumber(text: string): string {
  let i = text.length;
  while (i > 0 && /[\d.]/.test(text[i - 1]!)) i--;
  return i === text.length ? '' : text.slice(0, i);
}

/** Parses a duration to milliseconds, rounded up (a positive one never becomes 0); errors as parseDurationUs. */
export function parseDurationMs(text: string): number {
  return Math.ceil(parseDurationUs(text) / 1000);
}
