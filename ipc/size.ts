// The size syntax of `sbx run --memory` (docs/guide/limits.md): a number of bytes, or a number
// with a 1024-based unit, K M G T (as docker's --memory: k m g t too) or KiB MiB GiB TiB, and
// how sbx writes a size back ("64 MiB", "1.5 GiB"). Pure. "KB", "MB"... are refused: their
// meaning (1000 or 1024) differs between tools, and a limit must mean one thing.

const UNIT: Record<string, number> = { '': 1, b: 1, k: 2 ** 10, kib: 2 ** 10, m: 2 ** 20, mib: 2 ** 20, g: 2 ** 30, gib: 2 ** 30, t: 2 ** 40, tib: 2 ** 40 };
const SIZE = /^(\d+(?:\.\d+)?)\s*([a-z]*)$/i;

/**
 * Bytes from "67108864", "64M", "64MiB", "1.5G", "2g" (1024-based; a fraction rounds down to a
 * whole byte). Throws an Error naming the text for anything else, below 1 byte, or past 2^53 - 1.
 */
export function parseSizeBytes(text: string): number {
  const m = SIZE.exec(text.trim());
  const unit = m ? UNIT[m[2]!.toLowerCase()] : undefined;
  if (!m || unit === undefined) {
    throw new Error(
      `${JSON.stringify(text)} is not a size: give bytes, or a number with K, M, G, T (or KiB, MiB, GiB, TiB), all 1024-based, such as 64M or 1.5GiB`,
    );
  }
  const bytes = Math.floor(Number(m[1]) * unit);
  if (bytes < 1) throw new Error(`${JSON.stringify(text)} is less than one byte`);
  if (!Number.isSafeInteger(bytes)) throw new Error(`${JSON.stringify(text)} is too large (at most ${Number.MAX_SAFE_INTEGER} bytes)`);
  return bytes;
}

/** A size for people, in the largest 1024-based unit it reaches: "512 B", "64 MiB", "1.5 GiB" (one decimal when not whole). */
export function sizeText(bytes: number): string {
  const units: [string, number][] = [
    ['TiB', 2 ** 40],
    ['GiB', 2 ** 30],
    ['MiB', 2 ** 20],
    ['KiB', 2 ** 10],
  ];
  for (const [name, size] of units) {
    if (bytes < size) continue;
    const v = bytes / size;
    return `${Number.isInteger(v) ? v : v.toFixed(1)} ${name}`;
  }
  return `${bytes} B`;
}
