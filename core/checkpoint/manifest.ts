// The checkpoint manifest (docs/guide/checkpoints.md "Checkpoints"): version 1 lists its entries,
// version 2 names its root tree (tree.ts); its canonical bytes (RFC 8785 JCS), id (their SHA-256),
// scan digest, the published record, and the checks any reader makes (id, JCS round trip,
// signature, digest, counts, the entries from the trees). Not the scan (capture-worker.ts), the store
// or the restore. Signed as a receipt is (docs/reference/contract.md): Ed25519 over the JCS of all but `signature`.
import { createHash } from 'node:crypto';
import { isUtf8 } from 'node:buffer';
import type { Receipt } from '../../ipc/protocol.js';
import { jcs, verifySignature, verifySignatureOver } from '../receipts/signature.js';
import { fsDecode, nameText } from '../fs/names.js';
import type { EntryType } from '../fs/walk.js';
import { expandAsync, expandSync, type Expanded } from './tree.js';

/**
 * One entry. `path` is the relative path ('/'-separated) when its bytes are UTF-8, else
 * `path_b64` (base64 of the bytes); a symlink's `target` / `target_b64` the same. A regular
 * file has `sha256` (one object holding all its bytes) or, in a later writer, `chunks` (objects
 * whose concatenation is the file); a reader takes either. `mode` is the permission bits with
 * set-user-ID, set-group-ID and sticky (st_mode & 07777); `size` the file's bytes (a symlink: its
 * target's length; others 0); `mtime_ns` decimal nanoseconds; `rdev` for char/block devices;
 * `mount` (true) on a directory another file system was mounted on: not entered, so nothing
 * under it is listed (a writer before it never said; a reader takes its absence as false).
 */
export interface ManifestEntry {
  path?: string;
  path_b64?: string;
  type: Exclude<EntryType, 'unknown'>;
  mode: number;
  uid: number;
  gid: number;
  size: number;
  mtime_ns: string;
  sha256?: string;
  chunks?: { sha256: string; size: number }[];
  target?: string;
  target_b64?: string;
  rdev?: number;
  mount?: true;
}

/** The mutation boundary a checkpoint covers: the barrier's (epoch, seq) written before the scan, or a gap and why. */
export interface CheckpointBoundary {
  epoch: string | null;
  seq: number | null;
  gap: null | 'not_watched' | 'unsupported' | 'listener_restart' | 'barrier_timeout';
}

/** The runtime fence: which supervisor run wrote it. */
export interface RuntimeFence {
  instance: string;
  generation: number;
  boot_id: string;
  mode: string;
}

export interface Manifest {
  /** 1: `entries` listed in the manifest; 2: the entries are in tree objects in the store (tree.ts), the manifest names the root's (`tree`), and a reader expands them into `entries`. */
  version: 1 | 2;
  kind: 'checkpoint';
  /** The workspace directory, absolute (as given, resolved). */
  workspace: string;
  task: string | null;
  /** Present when a task's close took it: which close attempt (docs/guide/tasks.md "Tasks: complete(task)"). */
  close_attempt?: number;
  /** When the boundary was taken (ISO-8601 UTC, ms) and when the manifest was made. */
  started_at: string;
  created_at: string;
  boundary: CheckpointBoundary;
  scan: {
    /** Version 1: "sha256:" + hex SHA-256 of the JCS of `entries`; version 2: "sha256:" + the root tree's id (`tree`). Either names the tree's whole content. */
    digest: string;
    entries: number;
    files: number;
    /** Sum of the regular files' sizes. */
    bytes: number;
    /** Walks made: the first hashes, each later one compares (type, size, mode, owner, mtime, ctime) and re-hashes what moved. */
    passes: number;
  };
  /** False when `unstable` is not empty: those paths changed in every pass, so no pass saw the whole tree still. */
  consistent: boolean;
  unstable: string[];
  /** Present (true) when the last pass ran with the workspace's file system frozen (FIFREEZE). */
  frozen?: true;
  supervisor: RuntimeFence;
  /** The workspace directory itself (a restore gives DIR these). */
  root: { mode: number; uid: number; gid: number; mtime_ns: string };
  /** Version 2: the hex SHA-256 of the root tree object (the workspace directory's entries). */
  tree?: string;
  /** Version 1: stored here. Version 2: not stored; filled in by checkManifest from the trees (never written back: manifestBytes leaves it out). */
  entries: ManifestEntry[];
  signature?: { alg: 'ed25519'; key_id: string; value: string };
}

/** Written after the read-back, never before: the claim that the checkpoint id reads back exactly. Signed. */
export interface PublishedRecord {
  version: 1;
  kind: 'checkpoint_published';
  checkpoint_id: string;
  workspace: string;
  task: string | null;
  close_attempt?: number;
  boundary: CheckpointBoundary;
  /** rehashed_*: of the objects checked, those re-read and re-hashed (the rest confirmed by their files' stat since their own re-hash); absent in records before issue 34 (every object re-hashed). */
  /** trees: the tree objects checked (not in `objects`), absent in records of version 1 manifests' checkpoints before them. */
  read_back: {
    at: string;
    objects: number;
    bytes: number;
    rehashed_objects?: number;
    rehashed_bytes?: number;
    /** Of `objects`, not looked at (only under trees checked by an earlier read-back: checkpoint.readBack "changed"); absent before manifest version 2. */
    trusted_objects?: number;
    trees?: { objects: number; rehashed_objects: number; trusted_objects: number };
    ms: number;
  };
  supervisor: RuntimeFence;
  signature?: { alg: 'ed25519'; key_id: string; value: string };
}

/** A path or link target for the manifest: text when UTF-8, else base64 under the *_b64 name. */
export function nameFields(bytes: Buffer, field: 'path' | 'target'): Partial<ManifestEntry> {
  return isUtf8(bytes) ? { [field]: bytes.toString('utf8') } : { [`${field}_b64`]: bytes.toString('base64') };
}

/** What an entry is made from (a captured entry, or one rescanned after a restore). */
export interface EntryFacts {
  path: Uint8Array;
  type: ManifestEntry['type'];
  mode: number;
  uid: number;
  gid: number;
  size: number;
  mtimeNs: bigint;
  sha256?: string;
  target?: Uint8Array;
  rdev?: number;
  mount?: true;
}

/** The manifest entry for facts (Uint8Arrays from a thread are taken as Buffers). */
export function toManifestEntry(c: EntryFacts): ManifestEntry {
  const asBuffer = (b: Uint8Array) => (Buffer.isBuffer(b) ? b : Buffer.from(b));
  const e = {
    ...nameFields(asBuffer(c.path), 'path'),
    type: c.type,
    mode: c.mode,
    uid: c.uid,
    gid: c.gid,
    size: c.size,
    mtime_ns: c.mtimeNs.toString(),
  } as ManifestEntry;
  if (c.sha256 !== undefined) e.sha256 = c.sha256;
  if (c.target !== undefined) Object.assign(e, nameFields(asBuffer(c.target), 'target'));
  if (c.rdev !== undefined) e.rdev = c.rdev;
  if (c.mount) e.mount = true;
  return e;
}

/** An entry's path as bytes. */
export function entryPathBytes(e: ManifestEntry): Buffer {
  if (e.path !== undefined) return Buffer.from(e.path, 'utf8');
  if (e.path_b64 !== undefined) return Buffer.from(e.path_b64, 'base64');
  throw new Error('a manifest entry has neither path nor path_b64');
}

/** A symlink entry's target as bytes. */
export function entryTargetBytes(e: ManifestEntry): Buffer {
  if (e.target !== undefined) return Buffer.from(e.target, 'utf8');
  if (e.target_b64 !== undefined) return Buffer.from(e.target_b64, 'base64');
  throw new Error('a symlink entry has neither target nor target_b64');
}

/** A path for people: text, bytes that are not UTF-8 as \xNN; past maxChars its tail after "...". */
export function showEntryPath(e: ManifestEntry, maxChars = 200): string {
  let out = '';
  if (e.path !== undefined) out = e.path;
  else {
    const b = entryPathBytes(e);
    for (let i = 0; i < b.length; i++) out += b[i] >= 0x20 && b[i] < 0x7f ? String.fromCharCode(b[i]) : `\\x${b[i].toString(16).padStart(2, '0')}`;
  }
  return out.length <= maxChars ? out : `...${out.slice(out.length - maxChars)}`;
}

/**
 * The order of entries: by path, component by component, each compared bytewise (a directory
 * right before what it holds: depth-first, as the walk yields them). Negative, 0, positive.
 */
export function comparePaths(a: Buffer, b: Buffer): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    if (a[i] === b[i]) continue;
    if (a[i] === 0x2f) return -1; // '/' ends a component: the shorter component first
    if (b[i] === 0x2f) return 1;
    return a[i] - b[i];
  }
  return a.length - b.length;
}

/** The mount points a manifest's capture did not enter (entries with `mount: true`), in its order, as text (bytes not UTF-8 as \xNN, as `unstable`). */
export function mountsSkipped(m: Manifest): string[] {
  return summaryOf(m).mountsSkipped;
}

/**
 * The unstable paths a manifest holds no entry for: not captured (gone in the last pass, or
 * held shut by another process's write lease, never opened); the others are in it as one of
 * the states they passed through.
 */
export function notCaptured(m: Manifest): string[] {
  return summaryOf(m).notCaptured;
}

function summaryOf(m: Manifest): EntriesSummary {
  const summary = new EntriesSummary(m.unstable ?? []);
  for (const e of m.entries) summary.add(e);
  return summary;
}

/**
 * mountsSkipped and notCaptured of entries that stream by (a walk of a manifest's trees, as
 * verify.ts and restore.ts do): memory grows with the mount points and unstable paths only.
 */
export class EntriesSummary {
  /** The mount points met, in order, as text (mountsSkipped). */
  readonly mountsSkipped: string[] = [];
  private readonly unstable: Set<string>;
  private readonly held = new Set<string>();

  constructor(private readonly unstableList: readonly string[] = []) {
    this.unstable = new Set(unstableList);
  }

  add(e: ManifestEntry): void {
    if (e.mount !== true && this.unstable.size === 0) return;
    let text: string;
    try {
      text = nameText(fsDecode(entryPathBytes(e)));
    } catch {
      return; // a path that cannot be decoded: EntriesCheck names it
    }
    if (e.mount === true) this.mountsSkipped.push(text);
    if (this.unstable.has(text)) this.held.add(text);
  }

  /** The unstable paths no entry added had (notCaptured). */
  get notCaptured(): string[] {
    return this.unstableList.filter((p) => !this.held.has(p));
  }
}

/** The tree objects a version 2 manifest's entries were read from (id and size; none for version 1). */
export function manifestTrees(m: Manifest): Map<string, number> {
  return new Map(treesOf.get(m) ?? []);
}

/** The objects a manifest names (each once), with their sizes: its files' and, version 2, its tree objects. */
export function manifestObjects(m: Manifest): Map<string, number> {
  const out = new Map<string, number>(treesOf.get(m) ?? []);
  for (const e of m.entries) {
    if (e.type !== 'file') continue;
    if (e.sha256 !== undefined) out.set(e.sha256, e.size);
    for (const c of e.chunks ?? []) out.set(c.sha256, c.size);
  }
  return out;
}

const TYPES = new Set(['file', 'dir', 'symlink', 'fifo', 'socket', 'char', 'block']);
const uint = (v: unknown, max = Number.MAX_SAFE_INTEGER) => Number.isSafeInteger(v) && (v as number) >= 0 && (v as number) <= max;
const hex64 = (v: unknown) => typeof v === 'string' && /^[0-9a-f]{64}$/.test(v);

/** What is wrong with one entry's fields (types, ranges, what its type needs; its path is not looked at), or null. */
export function entryProblem(e: ManifestEntry): string | null {
  if (!TYPES.has(e.type)) return `unknown type ${JSON.stringify(e.type)}`;
  if (!uint(e.mode, 0o7777)) return `mode ${JSON.stringify(e.mode)} is not permission bits (0..07777)`;
  if (!uint(e.uid, 0xfffffffe) || !uint(e.gid, 0xfffffffe)) return 'uid/gid is not a number 0..4294967294';
  if (!uint(e.size)) return `size ${JSON.stringify(e.size)} is not a byte count`;
  // Up to 28 digits: a file system's 64-bit seconds (tmpfs, btrfs: touch -d 6000-01-01 is 21) in nanoseconds.
  if (typeof e.mtime_ns !== 'string' || !/^-?\d{1,28}$/.test(e.mtime_ns)) return 'mtime_ns is not decimal nanoseconds';
  if (e.type === 'file') {
    if (e.chunks !== undefined) {
      if (!Array.isArray(e.chunks) || e.chunks.some((c) => !hex64(c?.sha256) || !uint(c?.size)) || e.chunks.reduce((a, c) => a + c.size, 0) !== e.size)
        return 'chunks are not {sha256, size} adding up to size';
    } else if (!hex64(e.sha256)) return 'a file with no sha256 (64 hex digits) or chunks';
  } else if (e.sha256 !== undefined || e.chunks !== undefined) return `a ${e.type} with content`;
  if (e.type === 'symlink' && e.target === undefined && e.target_b64 === undefined) return 'a symlink with no target';
  if (e.type !== 'symlink' && (e.target !== undefined || e.target_b64 !== undefined)) return `a ${e.type} with a link target`;
  if ((e.type === 'char' || e.type === 'block') !== (e.rdev !== undefined)) return e.rdev === undefined ? 'a device with no rdev' : `a ${e.type} with an rdev`;
  if (e.rdev !== undefined && !uint(e.rdev)) return 'rdev is not a device number';
  if (e.mount !== undefined && (e.mount !== true || e.type !== 'dir'))
    return `mount ${JSON.stringify(e.mount)} on a ${e.type}: only a directory is a mount point (true)`;
  return null;
}

/** Problems with a published record's bytes: JSON, kind, the checkpoint id it names, and with a key its signature. */
export function checkPublished(bytes: Buffer, id: string, publicKeyPem?: string): string[] {
  let record: PublishedRecord;
  try {
    record = JSON.parse(bytes.toString('utf8')) as PublishedRecord;
  } catch (err) {
    return [`not JSON: ${(err as Error).message}`];
  }
  if (record === null || typeof record !== 'object' || record.kind !== 'checkpoint_published') return ['not a published record (kind "checkpoint_published")'];
  const problems: string[] = [];
  if (record.checkpoint_id !== id) problems.push(`it names checkpoint ${JSON.stringify(record.checkpoint_id)}`);
  if (publicKeyPem !== undefined)
    for (const p of verifySignature(record as unknown as Receipt, publicKeyPem)) problems.push(p.replace('the receipt', 'the record'));
  return problems;
}

/** "sha256:" + hex of the JCS of the entries: the scan digest (entriesJcs: that JCS when known). */
export function scanDigest(entries: ManifestEntry[], entriesJcs: string | Buffer = jcs(entries)): string {
  return entriesDigest(entriesJcs);
}

/** scanDigest of entries whose JCS (text or its UTF-8 bytes) is already made. */
export function entriesDigest(entriesJcs: string | Buffer): string {
  return `sha256:${createHash('sha256').update(entriesJcs).digest('hex')}`;
}

/** A string no manifest member can hold (NUL is refused in every path, task and target): where the entries go. */
const ENTRIES_HOLE = '\u0000entries\u0000';
const ENTRIES_HOLE_JSON = JSON.stringify(ENTRIES_HOLE);

/**
 * JCS of a manifest whose entries' JCS is already known: the entries are canonicalised once
 * (a big tree's manifest is mostly them) and set into the JCS of the rest. The same text as
 * jcs(m) (JCS of an object is its members' JCS in key order; unit-tested against it).
 */
export function manifestJcs(m: Manifest | Omit<Manifest, 'signature'>, entriesJcs: string): string {
  const [head, tail] = aroundEntries(m);
  return head + entriesJcs + tail;
}

/** The JCS of m before and after its entries (the rest of a manifest is small). */
function aroundEntries(m: Manifest | Omit<Manifest, 'signature'>): [string, string] {
  const text = jcs({ ...m, entries: ENTRIES_HOLE });
  const at = text.indexOf(ENTRIES_HOLE_JSON);
  return [text.slice(0, at), text.slice(at + ENTRIES_HOLE_JSON.length)];
}

/** manifestJcs as UTF-8 bytes, the entries' already encoded (a big tree's 20 MB are encoded once, not once per use). */
function manifestJcsBytes(m: Manifest | Omit<Manifest, 'signature'>, entriesJcsBytes: Buffer): Buffer {
  const [head, tail] = aroundEntries(m);
  return Buffer.concat([Buffer.from(head), entriesJcsBytes, Buffer.from(tail)]);
}

/** The canonical bytes of a signed manifest (what is stored: version 2 without its entries, which are in its trees) and its id. */
export function manifestBytes(m: Manifest): { bytes: Buffer; id: string } {
  let bytes: Buffer;
  if (m.version === 2) {
    const { entries: _inTrees, ...stored } = m;
    bytes = Buffer.from(jcs(stored));
  } else bytes = manifestJcsBytes(m, Buffer.from(jcs(m.entries)));
  return { bytes, id: createHash('sha256').update(bytes).digest('hex') };
}

/** A checkpoint id as given by people: bare hex or "sha256:"-prefixed, any case; '' if it is neither. */
export function normaliseId(text: string): string {
  const t = text
    .trim()
    .toLowerCase()
    .replace(/^sha256:/, '');
  return /^[0-9a-f]{1,64}$/.test(t) ? t : '';
}

/** How checkManifest reads a version 2 manifest's trees: a tree object's bytes by id, null when missing (the store's objects). */
export type ReadTree = (id: string) => Buffer | null;

/**
 * Problems with a manifest's own bytes: parsed from `bytes`, its JCS must be those bytes (no
 * other encoding is ever stored), their SHA-256 `expectId` (when given), the scan digest and
 * counts must match its entries, entries in order, no path twice; and with a public key, the
 * signature. A version 2 manifest's entries are read from its trees through readTree (tree.ts
 * checkTree for each), once its signature verifies when a key is given, and never past
 * maxEntries (default: the manifest's own scan.entries); without a store, or when a tree is
 * missing or does not hold, the manifest is null (its entries unknown: never taken as none).
 * Returns the manifest (null when it cannot be parsed or expanded) and what is wrong ([] = fine).
 */
export function checkManifest(
  bytes: Buffer,
  options: { expectId?: string; publicKeyPem?: string; readTree?: ReadTree; maxEntries?: number } = {},
): { manifest: Manifest | null; problems: string[] } {
  const head = checkManifestHead(bytes, options);
  const refused = beforeTrees(head, options.readTree !== undefined, options.publicKeyPem !== undefined);
  if (refused) return refused;
  return withTrees(head, expandSync(head.manifest!.tree!, options.readTree!, entriesBound(head.manifest!, options.maxEntries)));
}

/** checkManifest reading the trees through an async read (a remote store). */
export async function checkManifestAsync(
  bytes: Buffer,
  options: { expectId?: string; publicKeyPem?: string; readTree?: (id: string) => Promise<Buffer | null>; maxEntries?: number } = {},
): Promise<{ manifest: Manifest | null; problems: string[] }> {
  const head = checkManifestHead(bytes, options);
  const refused = beforeTrees(head, options.readTree !== undefined, options.publicKeyPem !== undefined);
  if (refused) return refused;
  return withTrees(head, await expandAsync(head.manifest!.tree!, options.readTree!, entriesBound(head.manifest!, options.maxEntries)));
}

/**
 * Whether a manifest's trees are read: version 1 has none (its head check is all); a version 2
 * one needs a store, and with a key its signature must verify first (an unsigned manifest's
 * trees could be anything: a chain of shared subtrees expands past any memory). The answer
 * when they are not read, else null.
 */
function beforeTrees(head: Head, haveStore: boolean, keyGiven: boolean): { manifest: Manifest | null; problems: string[] } | null {
  if (head.manifest === null || head.manifest.version !== 2) return { manifest: head.manifest, problems: head.problems };
  if (!haveStore) return { manifest: null, problems: [...head.problems, "a version 2 manifest's entries are in the store's tree objects: no store was given"] };
  if (keyGiven && !head.signed) return { manifest: null, problems: [...head.problems, 'its trees were not read: its signature does not verify'] };
  return null;
}

/** How many entries a manifest's trees may expand to: maxEntries when given, else what it says (scan.entries; the expansion stops past it). */
export function entriesBound(m: Manifest, maxEntries?: number): number {
  if (maxEntries !== undefined) return maxEntries;
  return Number.isSafeInteger(m.scan?.entries) && m.scan.entries >= 0 ? m.scan.entries : 0;
}

/** checkManifestHead's answer: the manifest (null when it cannot be parsed), what is wrong, and whether a key was given and its signature verified. */
export interface Head {
  manifest: Manifest | null;
  problems: string[];
  signed?: boolean;
}

/** The tree objects each expanded manifest named (id and size): with its file objects, what it keeps in the store (manifestObjects). */
const treesOf = new WeakMap<Manifest, Map<string, number>>();

/** A version 2 manifest given its expanded entries, checked as version 1's are (order, paths, fields, counts). */
function withTrees(head: Head, expanded: Expanded): { manifest: Manifest | null; problems: string[] } {
  if (expanded.problems.length) return { manifest: null, problems: [...head.problems, ...expanded.problems] };
  const manifest = head.manifest!;
  manifest.entries = expanded.entries;
  treesOf.set(manifest, expanded.trees);
  const problems = [...head.problems, ...entriesProblems(manifest.entries)];
  if (manifest.scan?.entries !== manifest.entries.length)
    problems.push(`the manifest says ${manifest.scan?.entries} entries and its trees hold ${manifest.entries.length}`);
  return { manifest, problems };
}

/**
 * A manifest's own checks, before any tree is read: JSON, kind, version, canonical bytes, id,
 * the digest's form, and with a key the signature (version 1: all of checkManifest). A
 * version 2 manifest comes back with `entries` empty: they were not read (sbx verify FILE
 * with no store: the signature only).
 */
export function checkManifestHead(bytes: Buffer, options: { expectId?: string; publicKeyPem?: string }): Head {
  const problems: string[] = [];
  let manifest: Manifest;
  try {
    manifest = JSON.parse(bytes.toString('utf8')) as Manifest;
  } catch (err) {
    return { manifest: null, problems: [`the manifest is not JSON: ${(err as Error).message}`] };
  }
  if (manifest === null || typeof manifest !== 'object' || manifest.kind !== 'checkpoint')
    return { manifest: null, problems: ['not a checkpoint manifest (kind "checkpoint")'] };
  if (manifest.version === 2) {
    if ((manifest as { entries?: unknown }).entries !== undefined || !/^[0-9a-f]{64}$/.test(String(manifest.tree)))
      return { manifest: null, problems: ['not a version 2 checkpoint manifest (a root `tree`, 64 hex digits, and no entries)'] };
    const id = createHash('sha256').update(bytes).digest('hex');
    let text: string;
    try {
      text = jcs(manifest);
    } catch (err) {
      return { manifest: null, problems: [`the manifest cannot be canonicalised: ${(err as Error).message}`] };
    }
    if (options.expectId !== undefined) {
      if (!Buffer.from(text).equals(bytes)) problems.push('the stored manifest is not in canonical form (RFC 8785): its bytes were edited');
      if (id !== options.expectId) problems.push(`the manifest's SHA-256 is ${id}, not its id ${options.expectId}`);
    }
    if (manifest.scan?.digest !== `sha256:${manifest.tree}`)
      problems.push(`the scan digest is ${manifest.scan?.digest}, the root tree is sha256:${manifest.tree}`);
    let signed = false;
    if (options.publicKeyPem !== undefined) {
      const { signature, ...unsigned } = manifest;
      const sigProblems = verifySignatureOver(signature, () => Buffer.from(jcs(unsigned)), options.publicKeyPem);
      for (const p of sigProblems) problems.push(p.replace('the receipt', 'the manifest'));
      signed = sigProblems.length === 0;
    }
    manifest.entries = [];
    return { manifest, problems, signed };
  }
  if (!Array.isArray(manifest.entries)) return { manifest: null, problems: ['not a checkpoint manifest (kind "checkpoint" with entries)'] };
  if (manifest.version !== 1) problems.push(`manifest version ${JSON.stringify(manifest.version)}: this sbx reads versions 1 and 2`);
  const id = createHash('sha256').update(bytes).digest('hex');
  let entriesJcs: string;
  try {
    entriesJcs = jcs(manifest.entries);
  } catch (err) {
    return { manifest: null, problems: [`the entries cannot be canonicalised: ${(err as Error).message}`] };
  }
  if (options.expectId !== undefined) {
    if (!Buffer.from(manifestJcs(manifest, entriesJcs)).equals(bytes))
      problems.push('the stored manifest is not in canonical form (RFC 8785): its bytes were edited');
    if (id !== options.expectId) problems.push(`the manifest's SHA-256 is ${id}, not its id ${options.expectId}`);
  }
  const digest = scanDigest(manifest.entries, entriesJcs);
  if (manifest.scan?.digest !== digest) problems.push(`the scan digest is ${manifest.scan?.digest}, the entries hash to ${digest}`);
  if (manifest.scan?.entries !== manifest.entries.length)
    problems.push(`the manifest says ${manifest.scan?.entries} entries and lists ${manifest.entries.length}`);
  for (const p of entriesProblems(manifest.entries)) problems.push(p); // one at a time: a spread of a million would overflow the stack
  let signed = false;
  if (options.publicKeyPem !== undefined) {
    const { signature, ...unsigned } = manifest;
    const covered = () => Buffer.from(manifestJcs(unsigned, entriesJcs));
    const sigProblems = verifySignatureOver(signature, covered, options.publicKeyPem);
    for (const p of sigProblems) problems.push(p.replace('the receipt', 'the manifest'));
    signed = sigProblems.length === 0;
  }
  return { manifest, problems, signed };
}

/** What is wrong with a manifest's entries: plain relative paths, in order, none twice, none under a mount point, each one's fields. */
function entriesProblems(entries: ManifestEntry[]): string[] {
  const check = new EntriesCheck();
  for (const e of entries) check.add(e);
  return check.problems;
}

/**
 * entriesProblems one entry at a time, for entries that stream by (a walk of a manifest's trees,
 * verify.ts): keeps the last path and mount point only. `problems` grows as they are found;
 * `count` is how many were added.
 */
export class EntriesCheck {
  readonly problems: string[] = [];
  count = 0;
  private prev: Buffer | null = null;
  /** The last mount point: nothing under it is walked. */
  private mount: Buffer | null = null;

  add(e: ManifestEntry): void {
    this.count++;
    let p: Buffer;
    try {
      p = entryPathBytes(e);
    } catch (err) {
      this.problems.push((err as Error).message);
      return;
    }
    if (
      p.length === 0 ||
      p[0] === 0x2f ||
      p.includes(0) ||
      p
        .toString('latin1')
        .split('/')
        .some((c) => c === '' || c === '.' || c === '..')
    ) {
      this.problems.push(`entry ${JSON.stringify(showEntryPath(e))}: not a relative path of plain names`);
    }
    if (this.prev && comparePaths(this.prev, p) >= 0) this.problems.push(`entry ${JSON.stringify(showEntryPath(e))}: out of order or listed twice`);
    this.prev = p;
    const mount = this.mount;
    if (mount && p.length > mount.length && p[mount.length] === 0x2f && p.subarray(0, mount.length).equals(mount))
      this.problems.push(`entry ${JSON.stringify(showEntryPath(e))}: under a mount point, which is never entered`);
    if (e.mount === true) this.mount = p;
    const bad = entryProblem(e);
    if (bad) this.problems.push(`entry ${JSON.stringify(showEntryPath(e))}: ${bad}`);
  }
}
