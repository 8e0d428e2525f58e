// What a scan makes of the walked entries (core/fs/walk.ts): the close digest (closeDigest: its line format)
// and the mutation scan that stands in for a workspace's events (mutationDigest). Owns the digests: not the
// walk, not threads.
import { createHash } from 'node:crypto';
import { fsDecode, fsEncode } from '../../core/fs/names.js';
import type { WalkEntry } from '../../core/fs/walk.js';

/** The close scan's numbers: regular files, their bytes, the newest mtime of any entry, the digest. */
export interface CloseDigest {
  files: number;
  total_bytes: number;
  newest_mtime: string | null;
  digest: string;
}

const LETTER: Record<WalkEntry['type'], string> = { file: 'f', dir: 'd', symlink: 'l', fifo: 'o', socket: 'o', char: 'o', block: 'o', unknown: 'o' };

/** A path or target as written in a digest line (see closeDigest): %, newline (and for targets, space) escaped. */
export function digestField(text: string, escapeSpace: boolean): string {
  const escaped = text.replace(/%/g, '%25').replace(/\n/g, '%0A');
  return escapeSpace ? escaped.replace(/ /g, '%20') : escaped;
}

/**
 * Digests entries in the close format; newest_mtime is ISO-8601 to the ms, null when there are none.
 * Format: "<t> <relative path> <size> <mtime ns>" per entry, and for a symlink
 * " <target>" after it; t = f (regular file), d, l (symlink) or o (fifo, socket, device), size 0
 * for all but files; "%" and a newline in a path are written %25 and %0A, in a target also a
 * space (%20), so a line is one entry and its fields parse one way (the path is what lies
 * between the type and the last numbers); lines sorted as JavaScript sorts strings (UTF-16
 * code units), joined with "\n", SHA-256. A path is its bytes: a byte that is not UTF-8 is
 * carried through core/fs/names.ts (sorted as U+DC00+byte, hashed as the byte itself). For a tree
 * without symlinks or "%"/newline in its names, the digest is the one of issue 11's scan.
 */
export function closeDigest(entries: Iterable<WalkEntry>): CloseDigest {
  const lines: string[] = [];
  let files = 0;
  let total = 0;
  let newest: bigint | null = null;
  for (const e of entries) {
    const size = e.type === 'file' ? e.size : 0n;
    const target = e.type === 'symlink' && e.linkTarget ? ` ${digestField(fsDecode(e.linkTarget), true)}` : '';
    lines.push(`${LETTER[e.type]} ${digestField(fsDecode(e.path), false)} ${size} ${e.mtimeNs}${target}`);
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

/** The scan at a session's death when its workspace has a gap (docs/reference/contract.md "Workspaces, checkpoints and tasks"): what stands in for the events. */
export interface MutationScan {
  /** sha256: over the sorted lines "<t> <path> <size> <mode, octal> <ctime ns>" (+ " <target>" for a symlink), escaped as above. */
  digest: string;
  entries: number;
  /** Sum of the regular files' sizes. */
  bytes: number;
  /** ISO-8601 ctime of the newest entry (ms; ctime, not mtime: touch -d moves mtime back, never ctime), null when empty. */
  max_ctime: string | null;
}

/** Digests entries for a mutation scan (ctime and mode: what a change always moves). */
export function mutationDigest(entries: Iterable<WalkEntry>): MutationScan {
  const lines: string[] = [];
  let bytes = 0;
  let newest: bigint | null = null;
  for (const e of entries) {
    const size = e.type === 'file' ? e.size : 0n;
    const target = e.type === 'symlink' && e.linkTarget ? ` ${digestField(fsDecode(e.linkTarget), true)}` : '';
    lines.push(`${LETTER[e.type]} ${digestField(fsDecode(e.path), false)} ${size} ${(e.mode & 0o7777).toString(8)} ${e.ctimeNs}${target}`);
    if (newest === null || e.ctimeNs > newest) newest = e.ctimeNs;
    if (e.type === 'file') bytes += Number(e.size);
  }
  lines.sort();
  const hash = createHash('sha256');
  lines.forEach((line, i) => {
    if (i > 0) hash.update('\n');
    hash.update(fsEncode(line));
  });
  return {
    digest: `sha256:${hash.digest('hex')}`,
    entries: lines.length,
    bytes,
    max_ctime: newest === null ? null : new Date(Number(newest / 1_000_000n)).toISOString(),
  };
}
