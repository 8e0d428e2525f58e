// diffCheckpoints: `sbx diff --json` in process, for TypeScript harnesses (offline: the store is
// read directly, no wire method). Apart from client.ts so that sbx's bundle, which
// takes in client.ts, never takes in the checkpoint modules or the AWS SDK they load for s3://.
// Owns the options and the mapping of refusals to SupervisorError; the comparison is
// core/checkpoint/diff.ts's.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { SupervisorError } from '../../ipc/errors.js';
import { defaultStateDir } from '../../ipc/paths.js';
import { STATE } from '../state/names.js';
import { DiffError, diffCheckpointIds, diffTask, type CheckpointDiff } from './diff.js';
import { parseStoreUrl, type CheckpointStore } from './store.js';
import { LocalStore } from './local-store.js';

export type { CheckpointDiff, DiffEntry, DiffModeChanged, DiffModified, DiffOwnerChanged, DiffSide, DiffTypeChanged } from './diff.js';

/** Where diffCheckpoints reads: a store (a directory or s3://bucket/prefix; S3 endpoint and keys from AWS_*), else `<stateDir>/checkpoints`. */
export interface DiffCheckpointsOptions {
  /** A directory or s3://bucket/prefix (default: <stateDir>/checkpoints). */
  store?: string;
  /** The state dir (default: $SBX_STATE_DIR or the default path): its checkpoints/ and receipt-key.pub. */
  stateDir?: string;
  /** The public key file, SPKI PEM (default: <stateDir>/receipt-key.pub): only what verifies is compared. */
  publicKeyPath?: string;
  /** Instead of two ids: the task's latest checkpoint against the one before it, per workspace (`sbx diff --task`). */
  task?: string;
}

/**
 * `sbx diff A B --json` in process, offline (the supervisor need not run; no wire method): what
 * changed from checkpoint a to b, from their manifests (core/checkpoint/diff.ts; an
 * s3:// store loads the AWS SDK on first use). With `task` (a and b null): the array `sbx diff
 * --task T --json` prints, one per workspace. Ids as sbx takes them (hex, sha256:hex, a unique prefix of 8+). A refusal is a
 * SupervisorError: NOT_FOUND (no such checkpoint, none of the task) or INVALID_ARGUMENT (a bad
 * id, not published, a record or manifest that does not verify, no key).
 */
export async function diffCheckpoints(a: string | null, b: string | null, options: DiffCheckpointsOptions & { task: string }): Promise<CheckpointDiff[]>;
export async function diffCheckpoints(a: string, b: string, options?: DiffCheckpointsOptions): Promise<CheckpointDiff>;
export async function diffCheckpoints(a: string | null, b: string | null, options: DiffCheckpointsOptions = {}): Promise<unknown> {
  const stateDir = options.stateDir ?? defaultStateDir();
  if ((options.task !== undefined) === (a !== null || b !== null) || (options.task === undefined && (a === null || b === null))) {
    throw new SupervisorError('INVALID_ARGUMENT', 'diffCheckpoints: give two checkpoints (a, b) or options.task with a and b null');
  }
  let keyPem: string;
  const keyFile = options.publicKeyPath ?? join(stateDir, STATE.receiptKeyPub);
  try {
    keyPem = readFileSync(keyFile, 'utf8');
  } catch (err) {
    throw new SupervisorError('INVALID_ARGUMENT', `diffCheckpoints: cannot read the public key ${keyFile} (give publicKeyPath): ${(err as Error).message}`);
  }
  let store: CheckpointStore & { close(): void };
  try {
    const url = parseStoreUrl(options.store ?? '', join(stateDir, STATE.checkpointsDir));
    if (url.kind === 'local') store = new LocalStore(url.dir, false);
    else store = new (await import('./s3-store.js')).S3Store(url, {});
  } catch (err) {
    throw new SupervisorError('INVALID_ARGUMENT', `diffCheckpoints: store: ${(err as Error).message}`);
  }
  try {
    if (options.task !== undefined) return (await diffTask(store, options.task, keyPem)).diffs;
    return await diffCheckpointIds(store, a!, b!, keyPem);
  } catch (err) {
    if (err instanceof DiffError) throw new SupervisorError(err.code, `diff: ${err.message}`);
    throw new SupervisorError('INTERNAL', `diff: ${(err as Error).message}`);
  } finally {
    store.close(); // its fds (local) or its client (S3)
  }
}
