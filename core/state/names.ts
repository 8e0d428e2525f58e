// The state dir's names (docs/reference/state-dir.md): every file and dir the supervisor writes
// and `sbx verify` re-reads, and the checkpoint store's dirs. Names only, no schemas (no zod), so
// the hashing and checkpoint threads can load it; the records are core/state/records.ts.
import { createHash } from 'node:crypto';
import type { StreamName } from '../../ipc/protocol.js';

/** Files and dirs directly in the state dir. */
export const STATE = {
  identity: 'supervisor.json',
  lock: 'supervisor.lock',
  receiptKey: 'receipt-key',
  receiptKeyPub: 'receipt-key.pub',
  seal: 'seal.json',
  closeReceipt: 'close-receipt.json',
  keysDir: 'keys',
  sessionsDir: 'sessions',
  retiredDir: 'retired',
  /** One dir per task that was sealed or closed, named taskDirName(task) (the task id is never a path). */
  tasksDir: 'tasks',
  /** The local checkpoint store (unless checkpoint.store names another directory); its own layout is STORE_DIRS. */
  checkpointsDir: 'checkpoints',
  /** Barrier files (`#<workspace index>`) of workspaces whose file system has no O_TMPFILE (supervisor/workspace/watcher.ts). */
  barriersDir: 'barriers',
} as const;

/** In a session dir: the admission record, written once and fsync'ed before the spawn. */
export const ADMISSION_FILE = 'admission.json';
/** In a session dir: the receipt, written once (link(2) from its reservation). */
export const RECEIPT_FILE = 'receipt.json';
/** In a session dir: space reserved at admission for the receipt, so a full disk cannot lose it. */
export const RECEIPT_RESERVATION_FILE = 'receipt.reserved';
/** In a session dir: what the session changed in the workspaces (supervisor/workspace/changes.ts); not covered by the receipt. */
export const CHANGES_FILE = 'changes.jsonl';
/** In a session dir: {started_at, pid}, written once the exec is reported (positive evidence that it ran). */
export const STARTED_FILE = 'started.json';
/** In a session dir: an operator's word that what its receipt says left its cgroup (death cgroup_escaped) is ended (sbx resolve); written once. */
export const ESCAPE_ATTESTED_FILE = 'escape-attested.json';
/** In a session dir: the retention policy removed its output (chunk files and index). */
export const OUTPUT_REMOVED_FILE = 'output-removed.json';

/** In a stream dir: one record per read (INDEX_RECORD_BYTES each, core/state/stream-files.ts). */
export const INDEX_FILE = 'index.bin';

/** In a stream dir: the file name of the chunk that starts at cursor: 16 hex digits. */
export function chunkFileName(startCursor: number): string {
  return `${startCursor.toString(16).padStart(16, '0')}.chunk`;
}

// Transient names: made, and cleared, by the supervisor around the records above.

/** In a session dir: one dir per stream, named as the stream. */
export const ALL_STREAMS: readonly StreamName[] = ['stdout', 'stderr', 'pty'];

/** A stream dir retention is removing, first renamed to this (a restart finishes the removal). */
export function removedStreamDirName(stream: string): string {
  return `.removed-${stream}`;
}

/** A session dir being removed whole by retention, renamed to this in sessions/ first (a restart removes it). */
export function retiringDirName(sessionId: string): string {
  return `.retiring-${sessionId}`;
}

/** Whether a name in sessions/ is a session dir being removed (retiringDirName). */
export function isRetiringDirName(name: string): boolean {
  return name.startsWith('.retiring-');
}

/** Where an unreadable record (a torn receipt, supervisor.json) is kept aside, never replaced: name + time in ms. */
export function unreadableName(name: string, atMs: number): string {
  return name === RECEIPT_FILE ? `receipt.unreadable-${atMs}.json` : `${name}.unreadable-${atMs}`;
}

/** Whether a name in a session dir is a receipt kept aside as unreadable (unreadableName). */
export function isUnreadableReceiptName(name: string): boolean {
  return /^receipt\.unreadable-\d+\.json$/.test(name);
}

/** The temp file a durable write of `name` goes through, beside it: `.<name>.<random hex>.tmp`. */
export function tempFileName(name: string, randomHex: string): string {
  return `.${name}.${randomHex}.tmp`;
}

/** Whether a name is a durable write's temp file (tempFileName), of `of` when given. */
export function isTempFileName(name: string, of?: string): boolean {
  return name.startsWith(of === undefined ? '.' : `.${of}.`) && name.endsWith('.tmp');
}

/** The key record's file name in keys/: the key's SHA-256, never the key itself (a key is never a path). */
export function keyRecordName(invocationKey: string): string {
  return `${createHash('sha256').update(invocationKey).digest('hex')}.json`;
}

/** A task's dir name in tasks/: the task id's SHA-256, never the id itself. */
export function taskDirName(task: string): string {
  return createHash('sha256').update(task).digest('hex');
}

/** In a task dir (docs/reference/state-dir.md): the task's seal, its close (the workspaces it names), the close attempt under way, and the task receipt. */
export const TASK_FILES = { seal: 'seal.json', close: 'close.json', attempt: 'attempt.json', receipt: 'receipt.json' } as const;

/** A tombstone's file name in retired/. */
export function tombstoneName(sessionId: string): string {
  return `${sessionId}.json`;
}

/** The checkpoint store's directories (docs/reference/state-dir.md "Checkpoint store"); quarantine/ holds what failed a read-back, index/ the stat caches (supervisor/checkpoint/stat-cache-file.ts), each made when first needed. */
export const STORE_DIRS = { objects: 'objects', manifests: 'manifests', published: 'published', tmp: 'tmp', quarantine: 'quarantine', index: 'index' } as const;
