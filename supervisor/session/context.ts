// What every session shares (SessionContext: configuration, identity, the cgroup subtree, the
// reaper, the signer, the state dir's storage guard and hashing threads, the workspace watcher, the escape watch) and what one session
// was asked to run (SessionRequest). Types only.
import type { Logger } from 'pino';
import type { LingerPolicy, ServiceFacts, SessionLimits, SupervisorMode } from '../../ipc/protocol.js';
import type { CgroupTree } from '../cgroup.js';
import type { Config } from '../config.js';
import type { Reaper } from '../reaper.js';
import type { ReceiptSigner } from '../signing.js';
import type { HashPool } from '../store/hasher.js';
import type { StorageGuard } from '../store/storage.js';
import type { SessionUser } from '../users.js';
import type { WorkspaceWatcher } from '../workspace/watcher.js';
import type { EscapeWatch } from './escape.js';
import type { LiveSession } from './live.js';

export interface SessionContext {
  config: Config;
  log: Logger;
  reaper: Reaper;
  tree: CgroupTree | null;
  identity: { instance: string; generation: number; bootId: string; mode: SupervisorMode; pid: number };
  sessionsDir: string;
  signer: ReceiptSigner;
  /** Free space of the state dir (chunk writes stop at the reserve). */
  storage: StorageGuard;
  /** The threads that hash stored streams (never the event loop). */
  hashPool: HashPool;
  /** The workspace clock: attribution, barriers, gaps (workspace/watcher.ts). */
  watcher: WorkspaceWatcher;
  /** Writes moving processes out of session leaves (escape.ts). */
  escapes: EscapeWatch;
  /**
   * Admits the service a command's leftovers go on as (linger handoff: live.ts): its record,
   * key record and frozen leaf durable, registered, not started. Throws when it cannot be
   * (the command then ends them: kill). The supervisor's registry sets it (supervisor.ts).
   */
  admitHandoff: (origin: { id: string; req: SessionRequest }) => LiveSession;
}

export interface SessionRequest {
  argv: string[];
  cwd: string;
  /** Only what the request set (covered by the digest). */
  env: Record<string, string>;
  /** The environment the leader gets: the clean base plus the request's. */
  leaderEnv: Record<string, string>;
  invocationKey: string;
  commandDigest: string;
  timeoutMs: number;
  graceMs: number;
  linger: LingerPolicy;
  chunkBytes: number;
  /** The user as requested (name or uid; covered by the digest), null: the supervisor's. */
  user: string | null;
  /** That user resolved (null for recovered sessions, which never spawn again). */
  sessionUser: SessionUser | null;
  /** A pseudo-terminal of that size as 0, 1 and 2 (one stream, "pty"); null: pipes. */
  pty: { cols: number; rows: number } | null;
  /** "stream": stdin is written by clients (write); "null": /dev/null, or a pty nobody types in. */
  stdin: 'null' | 'stream';
  /** The task it belongs to (`--task`, default `default`); null: unknown (its admission record cannot be read). */
  task: string | null;
  /** A service (started with --service, or a command's handed-off leftovers); null: a command. */
  service: ServiceFacts | null;
  /** Its cgroup limits (the launch's, else session.defaultLimits; docs/guide/limits.md), written to its leaf at admission; absent or {}: none. Recovered sessions: their admission record's. */
  limits?: SessionLimits;
}

/** An operator's word that ends an unknown session (sbx resolve --as-operator). */
export interface OperatorAttestation {
  uid: number;
  /** 0 for a WebSocket peer (no SO_PEERCRED): then `remote` names its address (logged; the receipt keeps uid and pid). */
  pid: number;
  remote?: string;
  reason: string;
  /** An escape is attested even while a destination cgroup the receipt names still holds processes. */
  force?: boolean;
}
