// Durations as the CLI takes them: "500ms", "30s", "5m", "1h", "2d", or a bare number of
// seconds as timeout(1) reads it. Pure; bounded so no timer can overflow into an immediate
// fire; a positive duration never rounds down to 0 (which would mean "no deadline").

/** Longest accepted duration: 30 days, in milliseconds. */
export const MAX_DURATION_MS = 30 * 24 * 3600 * 1000;

const UNIT_MS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/** Parses a duration to milliseconds; throws RangeError naming the input when it is not one. */
export function parseDurationMs(text: string): number {
  const match = /^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$/.exec(text.trim());
  if (!match) throw new RangeError(`not a duration: ${JSON.stringify(text)} (use e.g. 500ms, 30s, 5m, 1h; a bare number is seconds)`);
  const ms = Math.ceil(Number(match[1]) * UNIT_MS[match[2] ?? 's']);
  if (!Number.isSafeInteger(ms) || ms > MAX_DURATION_MS) {
    throw new RangeError(`duration ${JSON.stringify(text)} is over the limit of 30 days`);
  }
  return ms;
}
