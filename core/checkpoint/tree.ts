// Checkpoint trees (manifest version 2, docs/guide/checkpoints.md "The manifest"): each directory
// is an object in the store, the RFC 8785 JSON of its entries by name (a subdirectory by its
// tree's SHA-256), so an unchanged subtree is the same object and the signed manifest names
// only the root's. Owns the tree's bytes, their checks and the expansion into manifest entries
// (paths, in the manifest's order); as git's tree objects (git-cat-file(1), "tree").
import { createHash } from 'node:crypto';
import { isUtf8 } from 'node:buffer';
import { jcs } from '../receipts/signature.js';
import { entryProblem, type ManifestEntry } from './manifest.js';

/**
 * One entry of a tree: a manifest entry (manifest.ts ManifestEntry) with its name in the
 * directory (`name`, or `name_b64` when its bytes are not UTF-8) in place of its path, and for
 * a directory that is not a mount point `tree`, the hex SHA-256 of its own tree object.
 */
export type TreeEntry = Omit<ManifestEntry, 'path' | 'path_b64'> & { name?: string; name_b64?: string; tree?: string };

/** A tree object: JCS of {entries, kind: "checkpoint_tree", version: 2}, its entries in bytewise order of their names. */
export interface TreeObject {
  entries: TreeEntry[];
  kind: 'checkpoint_tree';
  version: 2;
}

/** The largest tree object a reader takes (about a million entries in one directory): the writer never stores a bigger one (trees.ts), a reader refuses one. */
export const MAX_TREE_BYTES = 256 << 20;

const HEAD = Buffer.from('{"entries":[');
const TAIL = Buffer.from('],"kind":"checkpoint_tree","version":2}');

/** A tree's bytes from its entries' JCS (each entry's made once: treeEntryJcs), in name order. The same as jcs(TreeObject). */
export function treeBytes(entriesJcs: readonly string[]): Buffer {
  return Buffer.from(`${HEAD.toString()}${entriesJcs.join(',')}${TAIL.toString()}`);
}

/** An entry's JCS in a tree: the manifest entry's fields but its path, with `name`/`name_b64` and a directory's `tree`. */
export function treeEntryJcs(e: Omit<ManifestEntry, 'path' | 'path_b64'>, name: Buffer, tree?: string): string {
  const out: TreeEntry = { ...e, ...(isUtf8(name) ? { name: name.toString('utf8') } : { name_b64: name.toString('base64') }) };
  if (tree !== undefined) out.tree = tree;
  return jcs(out);
}

/** The hex SHA-256 of bytes: a tree's id. */
export function treeId(bytes: Buffer): string {
  return createHash('sha256').update(bytes).digest('hex');
}

const hex64 = (v: unknown) => typeof v === 'string' && /^[0-9a-f]{64}$/.test(v);

/** An entry's name as bytes (null when it has neither field, or both). */
function nameBytes(e: TreeEntry): Buffer | null {
  if ((e.name === undefined) === (e.name_b64 === undefined)) return null;
  if (typeof e.name === 'string') return Buffer.from(e.name, 'utf8');
  if (typeof e.name_b64 === 'string') return Buffer.from(e.name_b64, 'base64');
  return null;
}

/**
 * Checks a tree object's bytes: they hash to id, parse as a tree, are its canonical JCS (no
 * other encoding is ever stored), every name is one plain name (no '/', NUL, '.', '..'),
 * names in strict bytewise order, each entry's fields as a manifest entry's, and `tree` on
 * exactly the directories that are not mount points, and no entry with a path. Returns the entries and what is wrong.
 */
export function checkTree(bytes: Buffer, id: string): { entries: TreeEntry[]; names: Buffer[]; problems: string[] } {
  const none = { entries: [], names: [] };
  if (bytes.length > MAX_TREE_BYTES) return { ...none, problems: [`object ${id} is ${bytes.length} bytes, over the ${MAX_TREE_BYTES} of a tree`] };
  const got = treeId(bytes);
  if (got !== id) return { ...none, problems: [`tree ${id} reads back as ${got} (${bytes.length} bytes): its bytes changed in the store`] };
  let t: TreeObject;
  try {
    t = JSON.parse(bytes.toString('utf8')) as TreeObject;
  } catch (err) {
    return { ...none, problems: [`tree ${id} is not JSON: ${(err as Error).message}`] };
  }
  if (t === null || typeof t !== 'object' || t.kind !== 'checkpoint_tree' || t.version !== 2 || !Array.isArray(t.entries))
    return { ...none, problems: [`object ${id} is not a tree (kind "checkpoint_tree", version 2, with entries)`] };
  const problems: string[] = [];
  try {
    if (!Buffer.from(jcs(t)).equals(bytes)) problems.push(`tree ${id} is not in canonical form (RFC 8785)`);
  } catch (err) {
    return { ...none, problems: [`tree ${id} cannot be canonicalised: ${(err as Error).message}`] };
  }
  const names: Buffer[] = [];
  let prev: Buffer | null = null;
  for (const e of t.entries) {
    const name = e === null || typeof e !== 'object' ? null : nameBytes(e);
    if (name === null) {
      problems.push(`tree ${id}: an entry with no name (exactly one of name, name_b64)`);
      names.push(Buffer.alloc(0));
      continue;
    }
    names.push(name);
    const shown = JSON.stringify(name.toString('latin1'));
    if (name.length === 0 || name.includes(0x2f) || name.includes(0) || (name.length <= 2 && /^\.\.?$/.test(name.toString('latin1'))))
      problems.push(`tree ${id}: entry ${shown} is not one plain name`);
    if (prev !== null && Buffer.compare(prev, name) >= 0) problems.push(`tree ${id}: entry ${shown} out of order or listed twice`);
    prev = name;
    const { name: _n, name_b64: _b, tree, ...rest } = e;
    const bad = entryProblem(rest as ManifestEntry);
    if (bad) problems.push(`tree ${id}: entry ${shown}: ${bad}`);
    if ('path' in e || 'path_b64' in e) problems.push(`tree ${id}: entry ${shown} has a path (a tree entry has its name only)`);
    const wantsTree = e.type === 'dir' && e.mount !== true;
    if (wantsTree && !hex64(tree)) problems.push(`tree ${id}: directory ${shown} names no tree (64 hex digits)`);
    if (!wantsTree && tree !== undefined) problems.push(`tree ${id}: ${e.type === 'dir' ? 'mount point' : e.type} ${shown} names a tree`);
  }
  return { entries: t.entries, names, problems };
}

/** What expanding a root tree gave: the manifest entries (paths, in the manifest's order), each tree object named (id and size), and what is wrong. */
export interface Expanded {
  entries: ManifestEntry[];
  trees: Map<string, number>;
  problems: string[];
}

/** A tree object's entries and their names' bytes, as checkTree read them. */
type DecodedTree = { entries: TreeEntry[]; names: Buffer[] };

/**
 * Decoded trees a walk keeps so that a subtree met again (shared by two directories) is not
 * read again: the ones used most recently whose objects add up to at most maxBytes (a Map's
 * insertion order as the LRU list; Infinity: all). A walk of 60,000 directories sharing one
 * empty tree reads it once, and memory stays bounded (decoded, a tree takes a few times its bytes).
 */
export class TreeCache {
  private readonly byId = new Map<string, { tree: DecodedTree; bytes: number }>();
  private held = 0;

  constructor(private readonly maxBytes: number) {}

  get(id: string): DecodedTree | undefined {
    const v = this.byId.get(id);
    if (!v) return undefined;
    this.byId.delete(id);
    this.byId.set(id, v);
    return v.tree;
  }

  /** bytes: the tree object's size. */
  set(id: string, tree: DecodedTree, bytes: number): void {
    if (bytes > this.maxBytes || this.byId.has(id)) return;
    this.byId.set(id, { tree, bytes });
    this.held += bytes;
    for (const [oldest, v] of this.byId) {
      if (this.held <= this.maxBytes) break;
      this.byId.delete(oldest);
      this.held -= v.bytes;
    }
  }
}

/** Tree objects a walk of a store keeps decoded (TreeCache; the recent ones, by their bytes; decoded they take several times that): shared subtrees, an empty directory's say, are read once. 4 MiB raised sbx verify's peak RSS at 100,000 files from 162 to 185 MB. */
export const TREE_CACHE_BYTES = 1 << 20;

/** What walkTree yields: a tree object it needs (sent its bytes back, null when missing), an entry, or a tree it has checked (id and size). */
export type WalkStep = { read: string } | { entry: ManifestEntry } | { tree: string; size: number };

/**
 * Walks the tree rootId depth first, a directory before what it holds (the v1 manifest's order,
 * manifest.ts comparePaths), yielding each manifest entry (with its path) as it comes and
 * keeping only the directories above it: memory grows with the depth and the widest tree, not
 * with the entries. A generator: it yields each tree id it needs and is sent that object's
 * bytes (null: missing), so one walk serves a local store read in place and a remote one
 * awaited. A tree met again (an unchanged subtree shared by two directories) is not read again
 * while memo holds it (yielded as `tree` only when read); without memo, it is. Returns null, or
 * the first problem: a tree that is missing or does not hold, or more than maxEntries entries
 * (a manifest says how many: a planted chain of shared subtrees would expand past any memory).
 */
export function* walkTree(rootId: string, maxEntries = Infinity, memo: TreeCache | null = null): Generator<WalkStep, string | null, Buffer | null | undefined> {
  let count = 0;
  const load = function* (id: string, under: string): Generator<WalkStep, DecodedTree | string, Buffer | null | undefined> {
    const known = memo?.get(id);
    if (known) return known;
    const bytes = yield { read: id };
    if (!bytes) return `tree ${id} (${under}) is missing from the store`;
    const t = checkTree(bytes, id);
    if (t.problems.length) return `${t.problems.join('; ')} (${under})`;
    yield { tree: id, size: bytes.length };
    const kept = { entries: t.entries, names: t.names };
    memo?.set(id, kept, bytes.length);
    return kept;
  };
  const root = yield* load(rootId, 'the root');
  if (typeof root === 'string') return root;
  const stack: { prefix: Buffer | null; t: DecodedTree; i: number }[] = [{ prefix: null, t: root, i: 0 }];
  while (stack.length) {
    const top = stack[stack.length - 1];
    if (top.i >= top.t.entries.length) {
      stack.pop();
      continue;
    }
    if (count >= maxEntries) return `the trees hold more than the ${maxEntries} entries the manifest says: not read further`;
    count++;
    const i = top.i++;
    const { name: _n, name_b64: _b, tree, ...fields } = top.t.entries[i];
    const name = top.t.names[i];
    const path = top.prefix === null ? name : Buffer.concat([top.prefix, Buffer.of(0x2f), name]);
    yield { entry: { ...fields, ...(isUtf8(path) ? { path: path.toString('utf8') } : { path_b64: path.toString('base64') }) } as ManifestEntry };
    if (tree !== undefined) {
      const sub = yield* load(tree, `directory ${JSON.stringify(path.toString('latin1'))}`);
      if (typeof sub === 'string') return sub;
      stack.push({ prefix: path, t: sub, i: 0 });
    }
  }
  return null;
}

/**
 * walkTree with every entry collected, each tree read once (memo): the manifest entries (in the
 * manifest's order), each tree object named (id and size), and what is wrong (then entries []).
 * A generator that yields tree ids and is sent their bytes (expandSync, expandAsync).
 */
export function* expandTree(rootId: string, maxEntries = Infinity): Generator<string, Expanded, Buffer | null> {
  const trees = new Map<string, number>();
  const entries: ManifestEntry[] = [];
  const walk = walkTree(rootId, maxEntries, new TreeCache(Infinity));
  let step = walk.next(undefined);
  while (!step.done) {
    const s = step.value;
    if ('read' in s) {
      step = walk.next(yield s.read);
      continue;
    }
    if ('entry' in s) entries.push(s.entry);
    else trees.set(s.tree, s.size);
    step = walk.next(undefined);
  }
  return step.value === null ? { entries, trees, problems: [] } : { entries: [], trees, problems: [step.value] };
}

/**
 * walkTree through an async read (a store), each entry and checked tree given to visit as it
 * comes (awaited); no tree kept once its directory is done but what memo keeps (a TreeCache:
 * the recent ones, bounded): null, or the walk's problem.
 */
export async function walkTreeAsync(
  rootId: string,
  read: (id: string) => Promise<Buffer | null>,
  maxEntries: number,
  visit: (step: Exclude<WalkStep, { read: string }>) => void | Promise<void>,
  memo: TreeCache | null = null,
): Promise<string | null> {
  const steps = walkTreeSteps(rootId, read, maxEntries, memo);
  for (;;) {
    const s = await steps.next();
    if (s.done) return s.value;
    await visit(s.value);
  }
}

/**
 * walkTree through an async read (a store) as an async iterator of its entries and checked
 * trees, for a caller that looks ahead (restore fetches a remote store's objects a few entries
 * early); memory as walkTreeAsync's. Its return value (once done): null, or the walk's problem.
 */
export async function* walkTreeSteps(
  rootId: string,
  read: (id: string) => Promise<Buffer | null>,
  maxEntries: number,
  memo: TreeCache | null = null,
): AsyncGenerator<Exclude<WalkStep, { read: string }>, string | null, undefined> {
  const walk = walkTree(rootId, maxEntries, memo);
  let step = walk.next(undefined);
  while (!step.done) {
    const s = step.value;
    if ('read' in s) step = walk.next(await read(s.read));
    else {
      yield s;
      step = walk.next(undefined);
    }
  }
  return step.value;
}

/** expandTree read through read (a local store, in place). */
export function expandSync(rootId: string, read: (id: string) => Buffer | null, maxEntries?: number): Expanded {
  const walk = expandTree(rootId, maxEntries);
  let step = walk.next(null);
  while (!step.done) step = walk.next(read(step.value));
  return step.value;
}

/** expandTree read through an async read (a remote store). */
export async function expandAsync(rootId: string, read: (id: string) => Promise<Buffer | null>, maxEntries?: number): Promise<Expanded> {
  const walk = expandTree(rootId, maxEntries);
  let step = walk.next(null);
  while (!step.done) step = walk.next(await read(step.value));
  return step.value;
}
