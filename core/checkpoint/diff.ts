// What changed between two checkpoints, from their manifests alone (sbx diff, diffCheckpoints):
// the pure comparison of two entry lists by path bytes (diffEntries), its text form
// (diffLines), and, for the one case a manifest cannot decide (a file held as chunks on one side
// and one sha256 on the other), the whole-file digests read from the store (chunkedDigests).
// Owns the result shape; not the manifest checks (manifest.ts) nor the store (store.ts).
import { createHash } from 'node:crypto';
import {
  checkManifestAsync,
  checkPublished,
  entryPathBytes,
  entryTargetBytes,
  nameFields,
  normaliseId,
  type Manifest,
  type ManifestEntry,
} from './manifest.js';
import { treeReader, type CheckpointStore } from './store.js';
import { fsDecode, nameText } from '../fs/names.js';

/** A path as the manifest names it: `path` when its bytes are UTF-8, else `path_b64`. */
export type DiffPath = { path: string } | { path_b64: string };

/** An entry added or removed: its path, type, and for a file its size (bytes) and content. */
export type DiffEntry = DiffPath & {
  type: ManifestEntry['type'];
  size: number;
  mode: number;
  sha256?: string;
  chunks?: { sha256: string; size: number }[];
  target?: string;
  target_b64?: string;
};

/**
 * Same type, other content: a file's bytes (size or digest), a symlink's target, a device's
 * rdev. `old_*`/`new_*` give both sides of what matters (sizes in bytes, modes as numbers:
 * st_mode & 07777); a mode change along with it is in old_mode/new_mode, not in mode_changed.
 */
export type DiffModified = DiffPath & {
  type: ManifestEntry['type'];
  /** What differs: `content` (a file's bytes: its size or its digest), with `size` when the size differs too; `target`; `rdev`. */
  changed: ('content' | 'size' | 'target' | 'rdev')[];
  old_size: number;
  new_size: number;
  old_mode: number;
  new_mode: number;
  old_sha256?: string;
  new_sha256?: string;
  old_target?: string;
  new_target?: string;
  old_target_b64?: string;
  new_target_b64?: string;
};

/** Another type at the same path (file -> symlink, dir -> file, ...). What a dir held is in `removed`/`added`. */
export type DiffTypeChanged = DiffPath & {
  old_type: ManifestEntry['type'];
  new_type: ManifestEntry['type'];
  old_size: number;
  new_size: number;
  old_mode: number;
  new_mode: number;
};
/** Same type and content, other permission bits (st_mode & 07777, as numbers). */
export type DiffModeChanged = DiffPath & { type: ManifestEntry['type']; old_mode: number; new_mode: number };
/** Same type and content, other owner (uid, gid). A path can be in mode_changed too. */
export type DiffOwnerChanged = DiffPath & { type: ManifestEntry['type']; old_uid: number; new_uid: number; old_gid: number; new_gid: number };

/** The comparison of two entry lists; every list sorted by path bytes (Buffer.compare, as git). */
export interface EntriesDiff {
  added: DiffEntry[];
  removed: DiffEntry[];
  modified: DiffModified[];
  type_changed: DiffTypeChanged[];
  mode_changed: DiffModeChanged[];
  owner_changed: DiffOwnerChanged[];
  counts: { added: number; removed: number; modified: number; type_changed: number; mode_changed: number; owner_changed: number };
  /** True when no list holds anything (mtime-only changes never count). */
  identical: boolean;
}

/** One side of sbx diff: a checkpoint's id, workspace, task and created_at (ISO-8601 UTC). */
export interface DiffSide {
  checkpoint_id: string;
  workspace: string;
  task: string | null;
  created_at: string;
}

/** What `sbx diff --json` prints for one pair: `from` null when `to` has no checkpoint before it (then everything is `added`). */
export interface CheckpointDiff extends EntriesDiff {
  from: DiffSide | null;
  to: DiffSide;
}

/** The key a chunk list is known by in a `wholeDigests` map: its chunks' `sha256:size`, joined by ','. */
export function chunkListKey(chunks: { sha256: string; size: number }[]): string {
  return chunks.map((c) => `${c.sha256}:${c.size}`).join(',');
}

/**
 * A file's content as a comparable key: its whole-file SHA-256 when the manifest gives it (the
 * `sha256`, or a single chunk, which is the whole file), or `wholeDigests` knows it for its
 * chunk list; else the chunk list itself (equal lists are equal content; a list against a
 * sha256 is undecided: see contentEqual).
 */
function contentKey(e: ManifestEntry, wholeDigests?: ReadonlyMap<string, string>): string {
  if (e.sha256 !== undefined) return `sha256:${e.sha256}`;
  const chunks = e.chunks ?? [];
  if (chunks.length === 1) return `sha256:${chunks[0].sha256}`;
  if (chunks.length === 0) return 'sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855'; // no bytes
  const key = chunkListKey(chunks);
  const whole = wholeDigests?.get(key);
  return whole !== undefined ? `sha256:${whole}` : `chunks:${key}`;
}

/**
 * Whether two files of the same size hold the same bytes: by whole-file digest when both are
 * known (sha256, a single chunk, or wholeDigests), by chunk list when both are chunk lists. A
 * chunk list (2+) against a sha256 with no digest for the list cannot be decided from the
 * manifests: it counts as modified (sbx diff computes the digest from the store first).
 */
function contentEqual(a: ManifestEntry, b: ManifestEntry, wholeDigests?: ReadonlyMap<string, string>): boolean {
  return contentKey(a, wholeDigests) === contentKey(b, wholeDigests);
}

const pathOf = (e: ManifestEntry): DiffPath => (e.path !== undefined ? { path: e.path } : { path_b64: e.path_b64! });

function described(e: ManifestEntry): DiffEntry {
  const out: DiffEntry = { ...pathOf(e), type: e.type, size: e.size, mode: e.mode };
  if (e.sha256 !== undefined) out.sha256 = e.sha256;
  if (e.chunks !== undefined) out.chunks = e.chunks;
  if (e.target !== undefined) out.target = e.target;
  if (e.target_b64 !== undefined) out.target_b64 = e.target_b64;
  return out;
}

const sha = (e: ManifestEntry) => e.sha256 ?? (e.chunks?.length === 1 ? e.chunks[0].sha256 : undefined);

/**
 * Compares two checkpoints' entries (a manifest's `entries`, any order; each path once) by path
 * bytes (`path`, or `path_b64` decoded). mtime_ns is never compared: a file touched but not
 * changed is not modified. A path of another type is type_changed only; of the same type,
 * modified when its content differs (size, digest; target; rdev), else mode_changed and/or
 * owner_changed. wholeDigests: whole-file SHA-256 (hex) by chunkListKey, for chunked files.
 */
export function diffEntries(from: readonly ManifestEntry[], to: readonly ManifestEntry[], wholeDigests?: ReadonlyMap<string, string>): EntriesDiff {
  const key = (e: ManifestEntry) => entryPathBytes(e).toString('latin1');
  const before = new Map<string, ManifestEntry>();
  for (const e of from) before.set(key(e), e);
  const d: Omit<EntriesDiff, 'counts' | 'identical'> = { added: [], removed: [], modified: [], type_changed: [], mode_changed: [], owner_changed: [] };
  for (const b of to) {
    const k = key(b);
    const a = before.get(k);
    if (!a) {
      d.added.push(described(b));
      continue;
    }
    before.delete(k);
    if (a.type !== b.type) {
      d.type_changed.push({ ...pathOf(b), old_type: a.type, new_type: b.type, old_size: a.size, new_size: b.size, old_mode: a.mode, new_mode: b.mode });
      continue;
    }
    const changed: DiffModified['changed'] = [];
    if (a.type === 'file') {
      // Bytes of another size are other bytes: 'content' is there whenever a file's bytes differ.
      if (a.size !== b.size) changed.push('content', 'size');
      else if (!contentEqual(a, b, wholeDigests)) changed.push('content');
    } else if (a.type === 'symlink') {
      if (!entryTargetBytes(a).equals(entryTargetBytes(b))) changed.push('target');
    } else if (a.type === 'char' || a.type === 'block') {
      if (a.rdev !== b.rdev) changed.push('rdev');
    }
    if (changed.length) {
      const m: DiffModified = { ...pathOf(b), type: b.type, changed, old_size: a.size, new_size: b.size, old_mode: a.mode, new_mode: b.mode };
      if (a.type === 'file') {
        const [x, y] = [sha(a), sha(b)];
        if (x !== undefined) m.old_sha256 = x;
        if (y !== undefined) m.new_sha256 = y;
      }
      if (a.type === 'symlink') {
        for (const [side, e] of [
          ['old', a],
          ['new', b],
        ] as const) {
          const t = nameFields(entryTargetBytes(e), 'target');
          if (t.target !== undefined) m[`${side}_target`] = t.target;
          else m[`${side}_target_b64`] = t.target_b64;
        }
      }
      d.modified.push(m);
      continue;
    }
    if (a.mode !== b.mode) d.mode_changed.push({ ...pathOf(b), type: b.type, old_mode: a.mode, new_mode: b.mode });
    if (a.uid !== b.uid || a.gid !== b.gid)
      d.owner_changed.push({ ...pathOf(b), type: b.type, old_uid: a.uid, new_uid: b.uid, old_gid: a.gid, new_gid: b.gid });
  }
  for (const a of before.values()) d.removed.push(described(a));
  const bytesOf = (p: DiffPath) => ('path' in p ? Buffer.from(p.path, 'utf8') : Buffer.from(p.path_b64, 'base64'));
  const byBytes = (x: DiffPath, y: DiffPath) => Buffer.compare(bytesOf(x), bytesOf(y));
  for (const list of Object.values(d)) (list as DiffPath[]).sort(byBytes);
  const counts = {
    added: d.added.length,
    removed: d.removed.length,
    modified: d.modified.length,
    type_changed: d.type_changed.length,
    mode_changed: d.mode_changed.length,
    owner_changed: d.owner_changed.length,
  };
  return { ...d, counts, identical: Object.values(counts).every((n) => n === 0) };
}

/** The chunk lists (2+ chunks) of files whose content diffEntries cannot decide without a whole-file digest: same path, both files, same size, one side chunked and the other not (or chunked otherwise). */
export function undecidedChunkLists(from: readonly ManifestEntry[], to: readonly ManifestEntry[]): { sha256: string; size: number }[][] {
  const before = new Map(from.map((e) => [entryPathBytes(e).toString('latin1'), e]));
  const out = new Map<string, { sha256: string; size: number }[]>();
  for (const b of to) {
    const a = before.get(entryPathBytes(b).toString('latin1'));
    if (!a || a.type !== 'file' || b.type !== 'file' || a.size !== b.size) continue;
    const [ka, kb] = [contentKey(a), contentKey(b)];
    if (ka === kb || (ka.startsWith('sha256:') && kb.startsWith('sha256:'))) continue;
    for (const e of [a, b]) if ((e.chunks?.length ?? 0) > 1) out.set(chunkListKey(e.chunks!), e.chunks!);
  }
  return [...out.values()];
}

/**
 * The whole-file SHA-256 (hex) of each chunk list, by chunkListKey: its objects read from the
 * store in order and hashed as one stream (the concatenation is the file). Only for the lists
 * undecidedChunkLists names (none in a store whose writer never chunks). Throws what the store throws.
 */
export async function chunkedDigests(store: CheckpointStore, lists: { sha256: string; size: number }[][]): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  for (const chunks of lists) {
    const hash = createHash('sha256');
    for (const c of chunks) for await (const part of store.readObject(c.sha256)) hash.update(part);
    out.set(chunkListKey(chunks), hash.digest('hex'));
  }
  return out;
}

/** Both sides of a pair and their comparison (from: null, everything added). */
export function diffManifests(
  from: { id: string; manifest: Manifest } | null,
  to: { id: string; manifest: Manifest },
  wholeDigests?: ReadonlyMap<string, string>,
): CheckpointDiff {
  const side = (s: { id: string; manifest: Manifest }): DiffSide => ({
    checkpoint_id: s.id,
    workspace: s.manifest.workspace,
    task: s.manifest.task,
    created_at: s.manifest.created_at,
  });
  return { from: from ? side(from) : null, to: side(to), ...diffEntries(from?.manifest.entries ?? [], to.manifest.entries, wholeDigests) };
}

/** A diff path for a terminal: text, bytes that are not UTF-8 as \xNN, control characters escaped by `escape` (cli/escape.ts's escapeControls). */
export function showDiffPath(p: DiffPath, escape: (s: string) => string): string {
  return escape('path' in p ? p.path : nameText(fsDecode(Buffer.from(p.path_b64, 'base64'))));
}

const octal = (mode: number) => mode.toString(8).padStart(4, '0');

/**
 * The lines of git's --name-status form, sorted by path bytes (a path in several lists: in the
 * order A, D, M, T, m, o): `A path`, `D path`, `M path`, `T path (file -> symlink)`,
 * `m path (0644 -> 0755)`, `o path (1000:1000 -> 0:0)` (uid:gid).
 */
export function diffLines(d: EntriesDiff, escape: (s: string) => string): string[] {
  const rows: { at: DiffPath; rank: number; line: string }[] = [];
  const show = (p: DiffPath) => showDiffPath(p, escape);
  for (const e of d.added) rows.push({ at: e, rank: 0, line: `A ${show(e)}` });
  for (const e of d.removed) rows.push({ at: e, rank: 1, line: `D ${show(e)}` });
  for (const e of d.modified) rows.push({ at: e, rank: 2, line: `M ${show(e)}` });
  for (const e of d.type_changed) rows.push({ at: e, rank: 3, line: `T ${show(e)} (${e.old_type} -> ${e.new_type})` });
  for (const e of d.mode_changed) rows.push({ at: e, rank: 4, line: `m ${show(e)} (${octal(e.old_mode)} -> ${octal(e.new_mode)})` });
  for (const e of d.owner_changed) rows.push({ at: e, rank: 5, line: `o ${show(e)} (${e.old_uid}:${e.old_gid} -> ${e.new_uid}:${e.new_gid})` });
  const bytesOf = (p: DiffPath) => ('path' in p ? Buffer.from(p.path, 'utf8') : Buffer.from(p.path_b64, 'base64'));
  rows.sort((x, y) => Buffer.compare(bytesOf(x.at), bytesOf(y.at)) || x.rank - y.rank);
  return rows.map((r) => r.line);
}

/** The summary line: `3 added, 1 removed, ...` (every category, zeros included). */
export function diffSummary(d: EntriesDiff): string {
  const c = d.counts;
  return `${c.added} added, ${c.removed} removed, ${c.modified} modified, ${c.type_changed} type changed, ${c.mode_changed} mode changed, ${c.owner_changed} owner changed`;
}

// --- Reading the two sides from a store (sbx diff, diffCheckpoints): the checks of sbx restore.

/** Why a diff could not be made: `code` an ERROR_CODES name (NOT_FOUND: no such checkpoint or none of the task; INVALID_ARGUMENT: a bad id, or a checkpoint not published or whose record or manifest does not verify). */
export class DiffError extends Error {
  constructor(
    readonly code: 'INVALID_ARGUMENT' | 'NOT_FOUND',
    message: string,
  ) {
    super(message);
    this.name = 'DiffError';
  }
}

/** A published checkpoint that verified: its id and manifest. */
export interface LoadedCheckpoint {
  id: string;
  manifest: Manifest;
}

/** The full id of a checkpoint given as hex (or sha256:hex, any case), or a unique prefix of at least 8 digits (as sbx restore takes it). DiffError otherwise. */
export async function resolveCheckpointId(store: CheckpointStore, text: string): Promise<string> {
  const id = normaliseId(text);
  if (!id) throw new DiffError('INVALID_ARGUMENT', `${JSON.stringify(text)} is not a checkpoint id (64 hex digits, or a unique prefix of 8 or more)`);
  if (id.length === 64) return id;
  if (id.length < 8) throw new DiffError('INVALID_ARGUMENT', `${JSON.stringify(text)}: give at least 8 hex digits of the checkpoint id`);
  const matches = (await store.listManifests()).filter((m) => m.startsWith(id));
  if (matches.length === 1) return matches[0];
  if (matches.length === 0) throw new DiffError('NOT_FOUND', `no checkpoint ${id}… in ${store.location} (sbx checkpoints lists them)`);
  throw new DiffError('INVALID_ARGUMENT', `${id}… is ambiguous in ${store.location}: ${matches.join(', ')}`);
}

/**
 * Reads checkpoint id as sbx restore does (loadCheckpoint): published, its record signed and
 * naming it, the manifest's bytes hashing to id, canonical, digest and counts holding, entries
 * well-formed, signed under publicKeyPem. DiffError NOT_FOUND / INVALID_ARGUMENT otherwise.
 */
export async function loadPublished(store: CheckpointStore, id: string, publicKeyPem: string): Promise<LoadedCheckpoint> {
  const published = await store.readPublished(id);
  const bytes = await store.readManifest(id).catch(() => null);
  if (!published) {
    if (bytes)
      throw new DiffError('INVALID_ARGUMENT', `checkpoint ${id} in ${store.location} was never published (its read-back did not complete): it claims nothing`);
    throw new DiffError('NOT_FOUND', `no checkpoint ${id} in ${store.location} (never taken there, or removed by gc)`);
  }
  if (!bytes) throw new DiffError('INVALID_ARGUMENT', `checkpoint ${id}: its published record is there but its manifest is not`);
  const recordProblems = checkPublished(published, id, publicKeyPem);
  if (recordProblems.length) throw new DiffError('INVALID_ARGUMENT', `checkpoint ${id}: its published record does not hold: ${recordProblems.join('; ')}`);
  const { manifest, problems } = await checkManifestAsync(bytes, { expectId: id, publicKeyPem, readTree: treeReader(store) });
  if (!manifest || problems.length) throw new DiffError('INVALID_ARGUMENT', `checkpoint ${id}: its manifest does not verify: ${problems.join('; ')}`);
  return { id, manifest };
}

/** The comparison of two loaded checkpoints, undecided chunked files settled by hashing their objects in the store. */
export async function diffLoaded(store: CheckpointStore, from: LoadedCheckpoint | null, to: LoadedCheckpoint): Promise<CheckpointDiff> {
  const lists = from ? undecidedChunkLists(from.manifest.entries, to.manifest.entries) : [];
  return diffManifests(from, to, lists.length ? await chunkedDigests(store, lists) : undefined);
}

/** sbx diff A B: the ids (or prefixes) resolved and read (loadPublished), then compared. */
export async function diffCheckpointIds(store: CheckpointStore, a: string, b: string, publicKeyPem: string): Promise<CheckpointDiff> {
  const from = await loadPublished(store, await resolveCheckpointId(store, a), publicKeyPem);
  const to = await loadPublished(store, await resolveCheckpointId(store, b), publicKeyPem);
  return diffLoaded(store, from, to);
}

/** Every published checkpoint of the store that verifies (loadPublished), and the ids that do not (never published ones are neither). */
export async function publishedCheckpoints(store: CheckpointStore, publicKeyPem: string): Promise<{ checkpoints: LoadedCheckpoint[]; invalid: string[] }> {
  const checkpoints: LoadedCheckpoint[] = [];
  const invalid: string[] = [];
  for (const id of await store.listManifests()) {
    if (!(await store.readPublished(id).catch(() => null))) continue;
    try {
      checkpoints.push(await loadPublished(store, id, publicKeyPem));
    } catch {
      invalid.push(id);
    }
  }
  return { checkpoints, invalid };
}

/** Oldest first: by created_at (ISO-8601 UTC, ms), then started_at, then id. */
export function byCreation(a: LoadedCheckpoint, b: LoadedCheckpoint): number {
  const k = (c: LoadedCheckpoint) => [c.manifest.created_at, c.manifest.started_at, c.id];
  const [x, y] = [k(a), k(b)];
  for (let i = 0; i < 3; i++) if (x[i] !== y[i]) return x[i] < y[i] ? -1 : 1;
  return 0;
}

/**
 * sbx diff --task T: for each workspace with a published checkpoint whose manifest says task T,
 * its latest such checkpoint (byCreation) against the one right before it in that workspace,
 * whatever its task (from null, everything added, when there is none). Sorted by workspace.
 * DiffError NOT_FOUND when no checkpoint of T verifies. `invalid`: ids that did not verify (skipped).
 */
export async function diffTask(store: CheckpointStore, task: string, publicKeyPem: string): Promise<{ diffs: CheckpointDiff[]; invalid: string[] }> {
  const { checkpoints, invalid } = await publishedCheckpoints(store, publicKeyPem);
  const byWorkspace = new Map<string, LoadedCheckpoint[]>();
  for (const c of checkpoints.sort(byCreation)) {
    const list = byWorkspace.get(c.manifest.workspace) ?? [];
    list.push(c);
    byWorkspace.set(c.manifest.workspace, list);
  }
  const diffs: CheckpointDiff[] = [];
  for (const ws of [...byWorkspace.keys()].sort()) {
    const list = byWorkspace.get(ws)!;
    let at = -1;
    for (let i = 0; i < list.length; i++) if (list[i].manifest.task === task) at = i;
    if (at < 0) continue;
    diffs.push(await diffLoaded(store, at > 0 ? list[at - 1] : null, list[at]));
  }
  if (diffs.length === 0)
    throw new DiffError(
      'NOT_FOUND',
      `no published checkpoint of task ${JSON.stringify(task)} in ${store.location}${invalid.length ? ` that verifies (${invalid.length} did not)` : ''}`,
    );
  return { diffs, invalid };
}
