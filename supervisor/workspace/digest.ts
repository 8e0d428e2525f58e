// What a scan makes of the walked entries (walk.ts). Owns the close digest (version 1, the
// format close receipts have carried since issue 11): not the walk, not threads. Format:
// "<t> <relative path> <size> <mtime ns>" per entry, t = f (regular file), d, l (symlink) or
// o (fifo, socket, device), size 0 for all but files; lines sorted as JavaScript sorts strings
// (UTF-16 code units), joined with "\n", SHA-256. A path is its bytes: for a UTF-8 tree the
// lines and the digest are exactly those of the by-path scan before; a byte that is not UTF-8
// is carried through names.ts (sorted as U+DC00+byte, hashed as the byte itself).
import { createHash } from 'node:crypto';
import { fsDecode, fsEncode } from './names.js';
import type { WalkEntry } from './walk.js';

/** The close scan's numbers: regular files, their bytes, the newest mtime of any entry, the digest. */
export interface CloseDigest {
  files: number;
  total_bytes: number;
  newest_mtime: string | null;
  digest: string;
}

const LETTER: Record<WalkEntry['type'], string> = { file: 'f', dir: 'd', symlink: 'l', fifo: 'o', socket: 'o', char: 'o', block: 'o', unknown: 'o' };

/** Digests entries in the close format (version 1); newest_mtime is ISO-8601 to the ms, null when there are none. */
export function closeDigest(entries: Iterable<WalkEntry>): CloseDigest {
  const lines: string[] = [];
  let files = 0;
  let total = 0;
  let newest: bigint | null = null;
  for (const e of entries) {
    const size = e.type === 'file' ? e.size : 0n;
    lines.push(`${LETTER[e.type]} ${fsDecode(e.path)} ${size} ${e.mtimeNs}`);
    if (newest === null || e.mtimeNs > newest) newest = e.mtimeNs;
    if (e.type === 'file') {
      files++;
      total += Number(e.size);
    }
  }
  lines.sort();
  const hash = createHash('sha256');
  lines.forEach((line, i) => {
    if (i > 0) hash.update('\n');
    hash.update(fsEncode(line));
  });
  return {
    files,
    total_bytes: total,
    newest_mtime: newest === null ? null : new Date(Number(newest / 1_000_000n)).toISOString(),
    digest: `sha256:${hash.digest('hex')}`,
  };
}
