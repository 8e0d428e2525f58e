// Published checkpoints in the local store, as a task close asks for them (docs/guide/tasks.md):
// the one a close attempt published, whether one is still published, one read back whole (its
// manifest and signed record, both verified), and its record put to the remote store. Queries
// return the checkpoint; what a task receipt says of it is the task's (task/close.ts).
import { verifySignature } from '../../core/receipts/verify.js';
import type { Receipt } from '../../ipc/protocol.js';
import type { LocalStore } from '../../core/checkpoint/local-store.js';
import { checkManifest, type Manifest, type PublishedRecord } from '../../core/checkpoint/manifest.js';
import type { CheckpointStore } from '../../core/checkpoint/store.js';
import { checkpointFailed } from './stages.js';

/** A published checkpoint read back: its id, its manifest and its published record (both signature-checked). */
export interface PublishedCheckpoint {
  id: string;
  manifest: Manifest;
  record: PublishedRecord;
}

export class PublishedCheckpoints {
  /** remote: the remote store (s3://), loaded on first use; null: checkpoints are published locally only. */
  constructor(
    private readonly local: LocalStore,
    private readonly publicKeyPem: string,
    private readonly remote: () => Promise<CheckpointStore> | null,
  ) {}

  /** The published checkpoint of a workspace (its real path) taken for a task's close attempt, if one is in the local store. */
  findForClose(task: string, closeAttempt: number, workspace: string): string | null {
    for (const id of this.local.publishedIds()) {
      let record: PublishedRecord | null;
      try {
        record = JSON.parse(this.local.publishedBytes(id)?.toString('utf8') ?? 'null') as PublishedRecord | null;
      } catch {
        continue; // not JSON (torn, planted): not a record of this close
      }
      if (record?.task === task && record.close_attempt === closeAttempt && record.workspace === workspace && record.checkpoint_id === id) return id;
    }
    return null;
  }

  /** Whether checkpoint id is published in the local store now (its published record is there: gc removes it first); false when the store cannot be read. */
  isPublished(id: string): boolean {
    try {
      return this.local.publishedBytes(id) !== null;
    } catch {
      return false;
    }
  }

  /**
   * With a remote store: puts the local published record of id there (create-once: a no-op
   * when it is there), for a checkpoint a crash stopped between the two records. Throws
   * CHECKPOINT_FAILED (stage store) when it cannot.
   */
  async putRemote(id: string): Promise<void> {
    const remote = this.remote();
    if (!remote) return;
    const bytes = this.local.publishedBytes(id);
    if (!bytes) throw checkpointFailed('store', `checkpoint ${id} is not published in ${this.local.dir}`);
    const store = await remote;
    try {
      await store.putPublished(id, bytes);
    } catch (err) {
      throw checkpointFailed('store', `checkpoint ${id}: the published record could not be written to ${store.location}: ${(err as Error).message}`);
    }
  }

  /** Checkpoint id read back from the local store: its manifest (id, canonical form, digest, signature) and published record (signature) checked; throws an Error naming what is missing or wrong. */
  read(id: string): PublishedCheckpoint {
    const recordBytes = this.local.publishedBytes(id);
    const manifestBytes = this.local.manifestBytes(id);
    if (!recordBytes || !manifestBytes) throw new Error(`checkpoint ${id} is not published in ${this.local.dir}`);
    const { manifest, problems } = checkManifest(manifestBytes, {
      expectId: id,
      publicKeyPem: this.publicKeyPem,
      readTree: (sha) => this.local.readObjectBytes(sha),
    });
    if (!manifest || problems.length) throw new Error(`checkpoint ${id}: ${problems.join('; ') || 'not a manifest'}`);
    const record = JSON.parse(recordBytes.toString('utf8')) as PublishedRecord;
    const sigProblems = verifySignature(record as unknown as Receipt, this.publicKeyPem);
    if (sigProblems.length) throw new Error(`checkpoint ${id}: its published record: ${sigProblems.join('; ')}`);
    return { id, manifest, record };
  }
}
