// A capture's tree objects (manifest version 2, core/checkpoint/tree.ts), in the checkpoint
// thread: each directory's entries made into its tree object bottom-up as the walk order closes
// it, stored create-once with the capture's file objects; a directory whose entries are the
// same captured entries as at the last read-back checkpoint (and its subtrees the same trees)
// keeps its tree without it being built again. Owns that building and its cache; not the format.
import { toManifestEntry, type ManifestEntry } from '../../core/checkpoint/manifest.js';
import { heapTick } from './heap-bound.js';
import { MAX_TREE_BYTES, treeBytes, treeEntryJcs, treeId } from '../../core/checkpoint/tree.js';
import { ScanError } from '../../core/fs/walk.js';
import { showPath } from '../../core/fs/names.js';
import type { LocalStoreFiles } from '../../core/checkpoint/local-store.js';
import type { CapturedEntry } from './passes.js';

/** One directory's tree as last built: its captured entries (the same objects: an entry kept from the stat cache is), its subdirectories' tree ids in order, and its tree's id and size. */
export interface DirTree {
  members: CapturedEntry[];
  subtrees: string[];
  id: string;
  bytes: number;
}

/** What storeTrees made: the root tree's id, every tree of the capture (id and size, each once), the new trees written, and each directory's tree (by path, latin1; the root's is '') for the next capture. */
export interface CaptureTrees {
  rootId: string;
  trees: Map<string, number>;
  written: number;
  bytesWritten: number;
  built: number;
  dirs: Map<string, DirTree>;
}

const NO_PATH = Buffer.alloc(0);

/** The manifest entry's fields of a captured entry (manifest.ts toManifestEntry), but its path (the tree holds its name). */
function fields(c: CapturedEntry): Omit<ManifestEntry, 'path' | 'path_b64'> {
  const { path: _path, path_b64: _pathB64, ...rest } = toManifestEntry({ ...c, path: NO_PATH });
  return rest;
}

/** A captured entry's JCS in its tree (made only for a directory whose tree is built: not kept, 100,000 of them would hold ~18 MB). */
function entryJcs(c: CapturedEntry, subtree?: string): string {
  const at = c.key.lastIndexOf('/');
  return treeEntryJcs(fields(c), Buffer.from(at < 0 ? c.key : c.key.slice(at + 1), 'latin1'), subtree);
}

interface Frame {
  key: string;
  members: CapturedEntry[];
  subtrees: string[];
}

/**
 * Makes the tree objects of a capture's entries (in walk order: a directory right before what
 * it holds, names in bytewise order) and stores the new ones in store (create-once, committed
 * with the capture's objects). last: the directories' trees at the workspace's last read-back
 * checkpoint (stat-cache.ts): one whose members and subtrees are the same is kept (its object
 * still in the store), not built. Throws ScanError manifest_too_large for a tree past
 * MAX_TREE_BYTES (no reader would take it), Error on entries out of walk order (a bug).
 */
export function storeTrees(entries: readonly CapturedEntry[], store: LocalStoreFiles, last: Map<string, DirTree> | undefined): CaptureTrees {
  const dirs = new Map<string, DirTree>();
  const trees = new Map<string, number>();
  let written = 0;
  let bytesWritten = 0;
  let built = 0;
  const close = (f: Frame): string => {
    const before = last?.get(f.key);
    let tree: DirTree | null = null;
    if (
      before !== undefined &&
      before.members.length === f.members.length &&
      before.subtrees.length === f.subtrees.length &&
      before.members.every((m, i) => m === f.members[i]) &&
      before.subtrees.every((s, i) => s === f.subtrees[i]) &&
      store.hasObject(before.id)
    )
      tree = before;
    if (tree === null) {
      let sub = 0;
      const bytes = treeBytes(f.members.map((c) => entryJcs(c, c.type === 'dir' && !c.mount ? f.subtrees[sub++] : undefined)));
      if (bytes.length > MAX_TREE_BYTES)
        throw new ScanError(
          'manifest_too_large',
          `manifest_too_large: the tree of ${f.key === '' ? 'the workspace directory' : showPath(Buffer.from(f.key, 'latin1'), 80)} (${f.members.length} entries) would be ${bytes.length} bytes, over the ${MAX_TREE_BYTES} a reader takes: checkpoint a smaller directory`,
        );
      const id = treeId(bytes);
      built++;
      if (store.createObject(id, bytes)) {
        written++;
        bytesWritten += bytes.length;
      }
      tree = { members: f.members, subtrees: f.subtrees, id, bytes: bytes.length };
    }
    dirs.set(f.key, tree);
    trees.set(tree.id, tree.bytes);
    return tree.id;
  };
  const frames: Frame[] = [{ key: '', members: [], subtrees: [] }];
  for (const c of entries) {
    heapTick();
    const at = c.key.lastIndexOf('/');
    const parent = at < 0 ? '' : c.key.slice(0, at);
    while (frames[frames.length - 1].key !== parent) {
      const done = frames.pop()!;
      if (frames.length === 0) throw new Error(`checkpoint trees: entry ${JSON.stringify(c.key)} is not under the directory walked before it`);
      frames[frames.length - 1].subtrees.push(close(done));
    }
    frames[frames.length - 1].members.push(c);
    if (c.type === 'dir' && !c.mount) frames.push({ key: c.key, members: [], subtrees: [] });
  }
  while (frames.length > 1) {
    const done = frames.pop()!;
    frames[frames.length - 1].subtrees.push(close(done));
  }
  const rootId = close(frames[0]);
  return { rootId, trees, written, bytesWritten, built, dirs };
}
