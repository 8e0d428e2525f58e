// The state dir's layout (docs/reference/state-dir.md), shared by the supervisor that writes it and by
// `sbx verify`, which re-reads it with the supervisor stopped: every file and dir name, and
// the schema every record is parsed with (a torn or foreign file is an Error naming why,
// never a cast). A stream's chunk files and index are stream-files.ts. Reads only; writing
// is the supervisor's (supervisor/store/).
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { z } from 'zod';
import type { CloseReceipt, Receipt, TaskCheckpointEntry, TaskReceipt } from './protocol.js';

// --- Names.

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
  /** The local checkpoint store (unless checkpoint.store names another directory); its own layout is STORE_DIRS in supervisor/checkpoint/local-store.ts, which the checkpoint threads load without zod. */
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
// In a stream dir: chunk files (chunkFileName) and the index (INDEX_FILE), named in stream-files.ts,
// which the hashing threads load without the record schemas (zod: ~7 MiB per thread).
export { chunkFileName, INDEX_FILE } from './stream-files.js';

// Transient names: made, and cleared, by the supervisor around the records above.

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

// --- Records: every one is parsed with its schema.

const sessionId = z.string().regex(/^s-[0-9a-z]+-[0-9a-f]+$/);

const AdmissionSchema = z.object({
  session_id: sessionId,
  invocation_key: z.string().min(1),
  command_digest: z.string(),
  argv: z.array(z.string()).min(1),
  cwd: z.string(),
  env: z.record(z.string(), z.string()),
  timeout_ms: z.number().int().min(0),
  grace_ms: z.number().int().min(0),
  linger: z.enum(['kill', 'wait', 'handoff']),
  chunk_bytes: z.number().int().positive(),
  user: z.string().nullable().optional(),
  /** The uid and gid it runs as (absent in records written before they were recorded). */
  uid: z.number().int().min(0).optional(),
  gid: z.number().int().min(0).optional(),
  pty: z.object({ cols: z.number().int(), rows: z.number().int() }).nullable().optional(),
  stdin: z.enum(['null', 'stream']).optional(),
  cgroup: z.string().nullable(),
  mode: z.enum(['cgroup', 'subreaper']),
  boot_id: z.string(),
  generation: z.number().int(),
  instance: z.string(),
  admitted_at: z.string(),
  /** Absent in records written before tasks: the task `default`. */
  task: z.string().min(1).optional(),
  /** A service (protocol.ts ServiceFacts); absent for other sessions. */
  service: z.object({ handed_off_from: sessionId.nullable(), keep_after_close: z.boolean() }).optional(),
  /** The session's cgroup limits (SessionLimits, written to its leaf before this record); absent when none, and in records written before limits. */
  limits: z.object({ memory_max_bytes: z.number().int().positive().optional(), pids_max: z.number().int().positive().optional(), cpus: z.number().positive().optional() }).strict().optional(),
});
/** The durable admission record, written before spawn (admission.json). */
export type AdmissionRecord = z.infer<typeof AdmissionSchema>;

const StreamOutputSchema = z.looseObject({
  final_cursor: z.number().int().min(0),
  sha256: z.string(),
  complete: z.boolean(),
  dropped_bytes: z.number().int().min(0),
  chunks: z.array(z.looseObject({ start_cursor: z.number().int().min(0), length: z.number().int().min(0) })).optional(),
});

/** What every receipt read back must have (more fields may follow: docs/reference/contract.md "Receipt"). */
const ReceiptSchema = z.looseObject({
  version: z.literal(1),
  session_id: z.string(),
  invocation_key: z.string(),
  command_digest: z.string(),
  argv: z.array(z.string()),
  admitted_at: z.string(),
  started_at: z.string().nullable(),
  leader_exited_at: z.string().nullable(),
  ended_at: z.string(),
  exit: z.object({ code: z.number().int().nullable(), signal: z.string().nullable() }),
  outcome: z.enum(['exited', 'signaled', 'timed_out', 'cancelled', 'spawn_failed', 'owner_lost']),
  death: z.looseObject({ evidence: z.string(), observed_at: z.string() }),
  output: z.partialRecord(z.enum(['stdout', 'stderr', 'pty']), StreamOutputSchema),
  usage: z.looseObject({}),
  signature: z.object({ alg: z.literal('ed25519'), key_id: z.string(), value: z.string() }).optional(),
});

const KeyRecordSchema = z.object({ invocation_key: z.string().min(1), session_id: sessionId, command_digest: z.string(), admitted_at: z.string() });
/** keys/<sha256(key)>.json: the key belongs to that session, for ever. */
export type KeyRecord = z.infer<typeof KeyRecordSchema>;

const TombstoneSchema = z.object({
  session_id: sessionId,
  invocation_key: z.string().min(1),
  command_digest: z.string(),
  outcome: z.string(),
  ended_at: z.string(),
  receipt_sha256: z.string(),
  retired_at: z.string(),
  /** The session's task (null: unknown); absent in tombstones written before tasks: the task `default`. */
  task: z.string().min(1).nullable().optional(),
});
/** retired/<session_id>.json: a session the retention policy removed whole; its key still answers. */
export type TombstoneRecord = z.infer<typeof TombstoneSchema>;

const SealSchema = z.object({ generation: z.number().int().min(0), sealed_at: z.string() });
/** seal.json: admission sealed for good, at that generation. */
export type SealRecord = z.infer<typeof SealSchema>;

const IdentitySchema = z.object({ instance: z.string().min(1), generation: z.number().int().min(0) });
/** supervisor.json: this state dir's supervisor instance and its last generation. */
export type IdentityRecord = z.infer<typeof IdentitySchema>;

const StartedSchema = z.object({ started_at: z.string().refine((s) => Number.isFinite(Date.parse(s)), 'an ISO-8601 time'), pid: z.number().int() });
/** started.json: the exec was reported then (not fsync'ed: its presence is the evidence). */
export type StartedRecord = z.infer<typeof StartedSchema>;

const EscapeAttestedSchema = z.object({ session_id: sessionId, receipt_sha256: z.string(), uid: z.number().int(), pid: z.number().int(), reason: z.string(), attested_at: z.string() });
/** escape-attested.json: an operator said the processes the receipt names as escaped are ended. */
export type EscapeAttestedRecord = z.infer<typeof EscapeAttestedSchema>;

const OutputRemovedSchema = z.object({ removed_at: z.string(), bytes: z.number().int().min(0).nullable() });
/** output-removed.json: retention removed the session's chunk files and index then. */
export type OutputRemovedRecord = z.infer<typeof OutputRemovedSchema>;

/** What a close receipt read back must have (close-receipt.json; more fields may follow). */
const CloseReceiptSchema = z.looseObject({
  version: z.literal(1),
  kind: z.literal('close'),
  sessions: z.array(z.looseObject({ session_id: z.string(), receipt_sha256: z.string().nullable() })),
  workspaces: z.array(z.looseObject({ path: z.string() })),
});

const TaskSealSchema = z.object({ task: z.string().min(1), generation: z.number().int().min(0), sealed_at: z.string() });
/** tasks/<h>/seal.json: the task's admission sealed for good, at that generation. */
export type TaskSealRecord = z.infer<typeof TaskSealSchema>;

const TaskCloseSchema = z.object({ task: z.string().min(1), workspaces: z.array(z.string()), requested_at: z.string(), generation: z.number().int().min(0), added_workspaces: z.array(z.string()).optional(), defaulted: z.boolean().optional() });
/**
 * tasks/<h>/close.json: the task's close was asked for, naming these workspaces (every later
 * close must name the same); added_workspaces: watched ones the task's receipts named that the
 * close added to its set (every later close covers them too); defaulted: no close named them
 * (every watched workspace, the default): until the task is complete, the first close that
 * names workspaces replaces them.
 */
export type TaskCloseRecord = z.infer<typeof TaskCloseSchema>;

/** A workspace's checkpoint as the attempt recorded it (a TaskCheckpointEntry: published, or the error that stopped it). */
const TaskCheckpointStepSchema = z.looseObject({
  workspace: z.string(),
  checkpoint_id: z.string().regex(/^[0-9a-f]{64}$/).nullable(),
  error: z.object({ code: z.string(), stage: z.string().nullable(), message: z.string() }).nullable(),
});
const TaskAttemptSchema = z.object({
  task: z.string().min(1),
  attempt: z.number().int().min(1),
  started_at: z.string(),
  generation: z.number().int().min(0),
  settle: z.object({ timeout_ms: z.number().int().min(0), terminated: z.number().int().min(0), terminated_ids: z.array(z.string()).optional() }).nullable(),
  /** Per workspace: the published checkpoint of this attempt, or why there is none. */
  checkpoints: z.record(z.string(), TaskCheckpointStepSchema),
});
/** tasks/<h>/attempt.json: the close attempt under way (or last made): what it settled and which checkpoints it published. */
export type TaskAttemptRecord = Omit<z.infer<typeof TaskAttemptSchema>, 'checkpoints'> & { checkpoints: Record<string, TaskCheckpointEntry> };

/** What a task receipt read back must have (tasks/<h>/receipt.json; more fields may follow). */
const TaskReceiptSchema = z.looseObject({
  version: z.literal(1),
  kind: z.literal('task'),
  task: z.string().min(1),
  attempt: z.number().int().min(1),
  complete: z.boolean(),
  workspaces: z.array(z.string()),
  sessions: z.array(z.looseObject({ session_id: z.string(), receipt_sha256: z.string().nullable() })),
  checkpoints: z.array(z.looseObject({ workspace: z.string(), checkpoint_id: z.string().nullable() })),
});

const RECORDS = {
  admission: AdmissionSchema,
  receipt: ReceiptSchema,
  key: KeyRecordSchema,
  tombstone: TombstoneSchema,
  seal: SealSchema,
  identity: IdentitySchema,
  started: StartedSchema,
  outputRemoved: OutputRemovedSchema,
  escapeAttested: EscapeAttestedSchema,
  closeReceipt: CloseReceiptSchema,
  taskSeal: TaskSealSchema,
  taskClose: TaskCloseSchema,
  taskAttempt: TaskAttemptSchema,
  taskReceipt: TaskReceiptSchema,
};
type RecordKinds = {
  admission: AdmissionRecord;
  receipt: Receipt;
  key: KeyRecord;
  tombstone: TombstoneRecord;
  seal: SealRecord;
  identity: IdentityRecord;
  started: StartedRecord;
  outputRemoved: OutputRemovedRecord;
  escapeAttested: EscapeAttestedRecord;
  closeReceipt: CloseReceipt;
  taskSeal: TaskSealRecord;
  taskClose: TaskCloseRecord;
  taskAttempt: TaskAttemptRecord;
  taskReceipt: TaskReceipt;
};
export type RecordKind = keyof RecordKinds;

/**
 * One record from its file's text, checked against its schema; throws an Error naming the
 * first problem ("not JSON: …", "not a key record: session_id: …"). Trailing whitespace and
 * NUL bytes (a receipt written into its reservation, not yet truncated) are ignored.
 */
export function parseRecord<K extends RecordKind>(kind: K, text: string): RecordKinds[K] {
  let raw: unknown;
  try {
    raw = JSON.parse(text.replace(/\0+$/, ''));
  } catch (err) {
    throw new Error(`not JSON: ${(err as Error).message}`);
  }
  const parsed = RECORDS[kind].safeParse(raw);
  if (!parsed.success) throw new Error(`not a ${kind} record: ${parsed.error.issues[0].path.join('.') || '(root)'}: ${parsed.error.issues[0].message}`);
  return parsed.data as unknown as RecordKinds[K];
}

/** A record read from path and parsed (parseRecord); throws with the reason, or ENOENT when absent. */
export function readRecord<K extends RecordKind>(kind: K, path: string): RecordKinds[K] {
  return parseRecord(kind, readFileSync(path, 'utf8'));
}
