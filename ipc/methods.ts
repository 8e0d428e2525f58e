// The method table: each method's params (derived from its zod schema, schemas.ts) and its
// result, so the client's request() and the server's handlers are typed from one source.
// Types only (no code): see docs/reference/protocol.md for what each method does.
import type {
  ChangesResult,
  CheckpointResult,
  CloseReceipt,
  HelloParams,
  HelloResult,
  LaunchParams,
  LaunchResult,
  Receipt,
  SessionSelector,
  SessionState,
  SessionSummary,
  StatusResult,
  ReadIndexParams,
  ReadIndexResult,
  SubscribeParams,
  SubscribeResult,
  TaskReceipt,
  TaskSealResult,
} from './protocol.js';
import type { z } from 'zod';
import type { ParamsSchemas } from './schemas.js';

type ParamsFor<M extends keyof typeof ParamsSchemas> = z.input<(typeof ParamsSchemas)[M]>;

/** What `gc` did: sessions whose output went, sessions removed whole, bytes freed; closed: nothing (an archive). */
export interface GcResult {
  removed_output: string[];
  retired: string[];
  freed_bytes: number;
  closed?: true;
  /** The local checkpoint store: unpublished and expired manifests removed, objects no kept manifest names removed, what quarantine/ held removed. */
  checkpoints?: { removed_manifests: string[]; removed_objects: number; removed_quarantined: number; freed_bytes: number; kept_manifests: number };
}

/** `seal`: the generation admission was sealed at, and whether it already was. */
export interface SealResult {
  generation: number;
  sealed_at: string;
  already_sealed: boolean;
}

export interface Methods {
  hello: { params: HelloParams; result: HelloResult };
  launch: { params: LaunchParams; result: LaunchResult };
  /** The result comes first, then `output` events and one `end` event (protocol.ts). */
  subscribe: { params: SubscribeParams; result: SubscribeResult };
  /** The per-read index of one stream from a cursor; with follow, waits for a record or the stream's end. */
  read_index: { params: ReadIndexParams; result: ReadIndexResult };
  /** unknown "fail": SESSION_UNKNOWN rather than waiting on for a session unknown with no receipt on its way. */
  wait: { params: ParamsFor<'wait'>; result: Receipt };
  receipt: {
    params: SessionSelector;
    result: {
      session_id: string;
      state: SessionState | 'retired';
      receipt: Receipt | null;
      escape_attested?: { uid: number; pid: number; reason: string; attested_at: string };
    };
  };
  cancel: { params: ParamsFor<'cancel'>; result: { session_id: string; state: SessionState } };
  kill: { params: ParamsFor<'kill'>; result: { session_id: string; signal: string; pids: number } };
  ps: { params: ParamsFor<'ps'>; result: { sessions: SessionSummary[] } };
  gc: { params: ParamsFor<'gc'>; result: GcResult };
  /** With `task`: a TaskSealResult. */
  seal: { params: ParamsFor<'seal'>; result: SealResult | TaskSealResult };
  /** With `task`: the task receipt. */
  close: { params: ParamsFor<'close'>; result: CloseReceipt | TaskReceipt };
  status: { params: ParamsFor<'status'>; result: StatusResult };
  /** Keepalive on any transport: the supervisor's wall clock, ms since the epoch. */
  ping: { params: ParamsFor<'ping'>; result: { now_ms: number } };
  write: { params: ParamsFor<'write'>; result: { session_id: string; cursor: number } };
  resize: { params: ParamsFor<'resize'>; result: { session_id: string; cols: number; rows: number } };
  resolve: { params: ParamsFor<'resolve'>; result: Receipt };
  changes: { params: SessionSelector; result: ChangesResult };
  checkpoint: { params: ParamsFor<'checkpoint'>; result: CheckpointResult };
  /** Files as sessions (docs/guide/files.md): each launches its session and answers as launch does. */
  write_file: { params: ParamsFor<'write_file'>; result: LaunchResult };
  read_file: { params: ParamsFor<'read_file'>; result: LaunchResult };
  upload: { params: ParamsFor<'upload'>; result: LaunchResult };
  download: { params: ParamsFor<'download'>; result: LaunchResult };
}

export type MethodName = keyof Methods;
export type ParamsOf<M extends MethodName> = Methods[M]['params'];
export type ResultOf<M extends MethodName> = Methods[M]['result'];
