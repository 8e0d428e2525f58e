// The state dir's records (docs/reference/state-dir.md), shared by the supervisor that writes them
// and by `sbx verify`, which re-reads them with the supervisor stopped: the schema every record
// is parsed with (a torn or foreign file is an Error naming why, never a cast). Names are
// core/state/names.ts; reads only, writing is the supervisor's (supervisor/store/).
import { readFileSync } from 'node:fs';
import { z } from 'zod';
import type { CloseReceipt, Receipt, TaskCheckpointEntry, TaskReceipt } from '../../ipc/protocol.js';

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
  limits: z
    .object({
      memory_max_bytes: z.number().int().positive().optional(),
      pids_max: z.number().int().positive().optional(),
      cpus: z.number().positive().optional(),
    })
    .strict()
    .optional(),
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

const EscapeAttestedSchema = z.object({
  session_id: sessionId,
  receipt_sha256: z.string(),
  uid: z.number().int(),
  pid: z.number().int(),
  reason: z.string(),
  attested_at: z.string(),
});
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

const TaskCloseSchema = z.object({
  task: z.string().min(1),
  workspaces: z.array(z.string()),
  requested_at: z.string(),
  generation: z.number().int().min(0),
  added_workspaces: z.array(z.string()).optional(),
  defaulted: z.boolean().optional(),
});
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
  checkpoint_id: z
    .string()
    .regex(/^[0-9a-f]{64}$/)
    .nullable(),
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
