// Close as a join (issue 11): the workspace scan and the close receipt. The scan walks a
// directory without following symlinks (lstat) and digests every entry's relative path,
// type, size and mtime, after the last session died, so "nothing changed after close" is
// checkable. The close receipt lists every session's receipt digest and is signed like a
// receipt (Ed25519 over JCS without `signature`, SPEC "Receipt").
import { createHash } from 'node:crypto';
import { lstatSync, readdirSync } from 'node:fs';
import { join, relative } from 'node:path';
import type { WorkspaceScan } from '../ipc/protocol.js';

export type { CloseReceipt } from '../ipc/protocol.js';

/** Scans one directory tree (lstat: symlinks are entries, never followed). */
export function scanWorkspace(root: string): WorkspaceScan {
  const lines: string[] = [];
  let files = 0;
  let total = 0;
  let newest: bigint | null = null;
  const walk = (dir: string) => {
    for (const name of readdirSync(dir).sort()) {
      const path = join(dir, name);
      const st = lstatSync(path, { bigint: true });
      const type = st.isFile() ? 'f' : st.isDirectory() ? 'd' : st.isSymbolicLink() ? 'l' : 'o';
      lines.push(`${type} ${relative(root, path)} ${st.isFile() ? st.size : 0n} ${st.mtimeNs}`);
      if (newest === null || st.mtimeNs > newest) newest = st.mtimeNs;
      if (type === 'f') {
        files++;
        total += Number(st.size);
      }
      if (type === 'd') walk(path);
    }
  };
  try {
    if (!lstatSync(root).isDirectory()) throw new Error('not a directory');
    walk(root);
  } catch (err) {
    return { path: root, files: 0, total_bytes: 0, newest_mtime: null, digest: '', error: (err as Error).message };
  }
  lines.sort();
  const digest = `sha256:${createHash('sha256').update(lines.join('\n')).digest('hex')}`;
  const newestMs = newest === null ? null : new Date(Number((newest as bigint) / 1_000_000n)).toISOString();
  return { path: root, files, total_bytes: total, newest_mtime: newestMs, digest };
}
