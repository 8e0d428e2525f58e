// What a session changed in the workspaces: its attributed events as a bounded append-only record next to its
// output (<session>/changes.jsonl: {epoch} first, then one ChangeRecord per line), past the bound counted,
// never written. Owns the record's format and reading it back as `sbx changes` shows it (renames paired by
// their object); not attribution (watcher.ts).
import { appendFileSync, existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { FAN } from './watch-worker.js';

export { CHANGES_FILE } from '../../core/state/names.js';
import { CHANGES_FILE } from '../../core/state/names.js';

export type ChangeKind = 'created' | 'modified' | 'attrib' | 'deleted' | 'renamed_from' | 'renamed_to';

/** One line of the record (after the {epoch} line): seq, ws, kind, path, at, and a rename's moved object. */
export interface ChangeRecord {
  seq: number;
  /** Index of the workspace in the supervisor's list when it was written. */
  ws: number;
  kind: ChangeKind;
  path: string;
  dir?: true;
  /**
   * For renamed_from / renamed_to: the moved entry's file handle, digested (16 hex digits of its
   * SHA-256; FAN_REPORT_TARGET_FID): the two halves of one rename share it. Absent in older records.
   */
  object?: string;
  at: string;
}

/** What `sbx changes` prints per change: renamed_from + renamed_to of one writer paired as renamed. */
export interface Change {
  seq: number;
  kind: ChangeKind | 'renamed';
  path: string;
  /** For renamed: the old path. */
  from?: string;
  dir?: true;
  at: string;
}

/**
 * The kinds an event's mask means, in the order they can happen to one name: the kernel merges
 * events on a name still queued (fanotify(7)), so `create, write, rename away` arrives as one
 * event. A name arrives (created, renamed_to), is written (modified, attrib), leaves
 * (renamed_from, deleted). [] for none we record (self events of the root, overflow).
 */
export function changeKinds(mask: number): ChangeKind[] {
  const kinds: ChangeKind[] = [];
  if (mask & FAN.CREATE) kinds.push('created');
  if (mask & FAN.MOVED_TO) kinds.push('renamed_to');
  if (mask & (FAN.MODIFY | FAN.CLOSE_WRITE)) kinds.push('modified');
  if (mask & FAN.ATTRIB) kinds.push('attrib');
  if (mask & FAN.MOVED_FROM) kinds.push('renamed_from');
  if (mask & FAN.DELETE) kinds.push('deleted');
  return kinds;
}

/** The record of one session: appended in batches, bounded at maxEntries lines. */
export class ChangeLog {
  entries = 0;
  dropped = 0;
  private pending: ChangeRecord[] = [];
  private last: ChangeRecord | null = null;
  private failed = false;

  private headed = false;

  /** epoch: the listener's (its sequence numbers count within it); written as the first line. */
  constructor(
    readonly path: string,
    private readonly maxEntries: number,
    private readonly epoch: string,
  ) {}

  /**
   * Coalesced: an event on the path and of the kind of the previous line only moves that line's seq when
   * the next batch is written; past maxEntries an event is counted (dropped), never written.
   */
  add(rec: ChangeRecord): void {
    const last = this.last;
    if (last && last.ws === rec.ws && last.path === rec.path && last.kind === rec.kind && (rec.kind === 'modified' || rec.kind === 'attrib')) {
      last.seq = rec.seq;
      last.at = rec.at;
      return;
    }
    if (this.entries >= this.maxEntries) {
      this.dropped++;
      return;
    }
    this.entries++;
    this.pending.push(rec);
    this.last = rec;
  }

  /** The last line: {"summary": {entries, dropped}} (at the session's end), so a reader knows what was counted only. */
  close(): void {
    this.flush();
    if (this.failed || (this.entries === 0 && this.dropped === 0)) return;
    try {
      appendFileSync(this.path, JSON.stringify({ summary: { entries: this.entries, dropped: this.dropped } }) + '\n', { mode: 0o600 });
    } catch {
      this.failed = true;
    }
  }

  /** Appends what was added since the last flush (the last line stays open to coalescing until then). */
  flush(): void {
    if (this.pending.length === 0 || this.failed) return;
    const head = this.headed ? '' : JSON.stringify({ epoch: this.epoch }) + '\n';
    const text = head + this.pending.map((r) => JSON.stringify(r)).join('\n') + '\n';
    this.pending = [];
    this.headed = true;
    try {
      appendFileSync(this.path, text, { mode: 0o600 });
    } catch {
      // A full disk: the record stops here, and says so through `dropped` (never invented).
      this.failed = true;
    }
    this.last = null;
  }
}

/**
 * The record read back: its listener's epoch (null when nothing was written), the records, and
 * its summary's dropped count (0 before the end); a torn line (a crash mid-append) is left out.
 */
export function readChanges(sessionDir: string): { epoch: string | null; records: ChangeRecord[]; dropped: number } {
  const path = join(sessionDir, CHANGES_FILE);
  const records: ChangeRecord[] = [];
  let dropped = 0;
  let epoch: string | null = null;
  if (!existsSync(path)) return { epoch, records, dropped };
  for (const line of readFileSync(path, 'utf8').split('\n')) {
    if (!line) continue;
    try {
      const v = JSON.parse(line) as ChangeRecord | { summary: { dropped: number } } | { epoch: string };
      if ('summary' in v) dropped = v.summary.dropped;
      else if ('epoch' in v) epoch = v.epoch;
      else records.push(v);
    } catch {
      // torn
    }
  }
  return { epoch, records, dropped };
}

/**
 * Records of one workspace as changes: a renamed_from and a later renamed_to of the same moved
 * entry (`object`) are one rename, shown where the renamed_to is (the kernel may have merged the
 * renamed_from into an earlier event on that name still queued: create, write, rename away
 * arrive as one); without `object` (older records), a renamed_from directly followed by a
 * renamed_to is.
 */
export function pairRenames(records: ChangeRecord[]): Change[] {
  const fromOf = new Map<number, ChangeRecord>();
  const paired = new Set<number>();
  const open = new Map<string, number[]>();
  records.forEach((r, i) => {
    if (r.kind === 'renamed_from' && r.object) open.set(r.object, [...(open.get(r.object) ?? []), i]);
    else if (r.kind === 'renamed_to' && r.object) {
      const waiting = open.get(r.object);
      const j = waiting?.shift();
      if (j !== undefined) {
        fromOf.set(i, records[j]);
        paired.add(j);
      }
    }
  });
  const out: Change[] = [];
  for (let i = 0; i < records.length; i++) {
    const r = records[i];
    if (paired.has(i)) continue;
    const from = fromOf.get(i);
    if (from) {
      out.push({ seq: r.seq, kind: 'renamed', path: r.path, from: from.path, ...(from.dir ? { dir: true as const } : {}), at: r.at });
      continue;
    }
    const next = records[i + 1];
    if (r.kind === 'renamed_from' && !r.object && next && next.kind === 'renamed_to' && !next.object) {
      out.push({ seq: next.seq, kind: 'renamed', path: next.path, from: r.path, ...(r.dir ? { dir: true as const } : {}), at: next.at });
      i++;
      continue;
    }
    out.push({ seq: r.seq, kind: r.kind, path: r.path, ...(r.dir ? { dir: true as const } : {}), at: r.at });
  }
  return out;
}
