// The workspace journal: per watched workspace, the paths that had events (any writer, attributed
// or not) with the sequence of the last one, bounded; a checkpoint's capture reads what changed
// since its seed's boundary first, so that one walk proves a still instant (passes.ts hints).
// Only a hint: a path missing here costs a second walk, never a wrong checkpoint.

/** What a capture is handed: the journal of the workspace holding its root, paths relative to that root. */
export interface JournalHints {
  /** The watcher's epoch (a sequence means nothing in another). */
  epoch: string;
  /** Events up to this sequence may be missing (the bound was reached, an overflow, an unnamed directory): a seed's boundary must be at or past it. */
  incompleteThrough: number;
  /** [path relative to the capture's root (fsDecode text; "" for the root), sequence of its last event]. */
  entries: [string, number][];
}

/** Paths kept per workspace at most; past it the journal starts again, incomplete through the last sequence. */
const JOURNAL_MAX_PATHS = 4096;

export class ChangeJournal {
  private readonly paths: Map<string, number>[];
  private readonly incomplete: number[];

  constructor(workspaces: number) {
    this.paths = Array.from({ length: workspaces }, () => new Map());
    this.incomplete = Array.from({ length: workspaces }, () => 0);
  }

  /** An event at seq on path (relative to workspace ws, fsDecode text). */
  record(ws: number, seq: number, path: string): void {
    const m = this.paths[ws];
    if (!m.has(path) && m.size >= JOURNAL_MAX_PATHS) {
      m.clear();
      this.incomplete[ws] = Math.max(this.incomplete[ws], seq);
    }
    m.set(path, seq);
  }

  /** Events of workspace ws (every workspace when ws is null) through seq may be missing. */
  lost(ws: number | null, seq: number): void {
    for (let i = 0; i < this.paths.length; i++) if (ws === null || ws === i) this.incomplete[i] = Math.max(this.incomplete[i], seq);
  }

  /**
   * Workspace ws's journal for a capture of its directory sub ("" for the workspace itself, else
   * relative, no leading or trailing slash): the paths under it, relative to it.
   */
  hints(epoch: string, ws: number, sub: string): JournalHints {
    const entries: [string, number][] = [];
    const prefix = sub === '' ? '' : `${sub}/`;
    for (const [path, seq] of this.paths[ws]) {
      if (prefix === '') entries.push([path, seq]);
      else if (path === sub) entries.push(['', seq]);
      else if (path.startsWith(prefix)) entries.push([path.slice(prefix.length), seq]);
    }
    return { epoch, incompleteThrough: this.incomplete[ws], entries };
  }
}
