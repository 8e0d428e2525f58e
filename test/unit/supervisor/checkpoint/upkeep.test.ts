// The checkpoint orchestration apart from a daemon: gc (supervisor/checkpoint/gc.ts), the
// published queries a task close makes (published.ts) and the store's upkeep they go through
// (core/checkpoint/local-store.ts), on a real local store in a temp dir with real objects,
// manifests and signed published records. Reachable before only through a supervisor.
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pino from 'pino';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { LocalStore } from '../../../../core/checkpoint/local-store.js';
import { manifestBytes, type Manifest, type ManifestEntry, type PublishedRecord } from '../../../../core/checkpoint/manifest.js';
import { jcs } from '../../../../core/receipts/signature.js';
import { Checkpoints } from '../../../../supervisor/checkpoint/checkpoint.js';
import { collectGarbage } from '../../../../supervisor/checkpoint/gc.js';
import { PublishedCheckpoints } from '../../../../supervisor/checkpoint/published.js';
import { parseConfig } from '../../../../supervisor/config.js';
import { ReceiptSigner } from '../../../../supervisor/signing.js';
import type { WorkspaceWatcher } from '../../../../supervisor/workspace/watcher.js';
import { manifestOf } from '../../../helpers/manifest.js';

const log = pino({ level: 'silent' });
let dir: string;
let store: LocalStore;
let signer: ReceiptSigner;

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'ck-upkeep-'));
  mkdirSync(join(dir, 'state'), { mode: 0o700 });
  signer = ReceiptSigner.loadOrCreate(join(dir, 'state'));
  store = new LocalStore(join(dir, 'store'), true, true);
});

afterEach(() => {
  store.close();
  rmSync(dir, { recursive: true, force: true });
});

const sha = (bytes: Buffer) => createHash('sha256').update(bytes).digest('hex');

/** Stores these contents as objects (committed, durable); their digests. */
function putObjects(...contents: string[]): string[] {
  const fs = store.fs;
  const out = contents.map((c) => {
    const bytes = Buffer.from(c);
    fs.createObject(sha(bytes), bytes);
    return sha(bytes);
  });
  fs.commitObjects();
  return out;
}

const file = (path: string, sha256: string, size: number): ManifestEntry => ({ path, type: 'file', mode: 0o644, uid: 0, gid: 0, size, mtime_ns: '1', sha256 });

/** A signed manifest naming these objects, stored; its id. published: also its signed published record. */
async function putCheckpoint(
  entries: ManifestEntry[],
  o: { createdAt?: string; published?: boolean; task?: string; closeAttempt?: number } = {},
): Promise<string> {
  const m: Manifest = signer.sign({
    ...manifestOf(entries, { createdAt: o.createdAt, task: o.task ?? null }),
    ...(o.closeAttempt !== undefined ? { close_attempt: o.closeAttempt } : {}),
  });
  const { bytes, id } = manifestBytes(m);
  await store.putManifest(id, bytes);
  if (o.published !== false) {
    const record = signer.sign<PublishedRecord>({
      version: 1,
      kind: 'checkpoint_published',
      checkpoint_id: id,
      workspace: m.workspace,
      task: m.task,
      ...(o.closeAttempt !== undefined ? { close_attempt: o.closeAttempt } : {}),
      boundary: m.boundary,
      read_back: { at: '2026-12-01T00:00:02.000Z', objects: entries.length, bytes: 0, ms: 1 },
      supervisor: m.supervisor,
    });
    await store.putPublished(id, Buffer.from(jcs(record)));
  }
  return id;
}

const objectsOnDisk = () =>
  readdirSync(join(store.dir, 'objects'))
    .flatMap((fan) => readdirSync(join(store.dir, 'objects', fan)))
    .sort();

describe('checkpoint gc (collectGarbage)', () => {
  it('removes unpublished manifests, manifests past maxAgeMs unless pinned, then every object no kept manifest names, temps and quarantine', async () => {
    const [a, b, c, d] = putObjects('a', 'bb', 'ccc', 'dddd');
    const kept = await putCheckpoint([file('a', a, 1)], { createdAt: '2026-12-01T10:00:00.000Z' });
    const old = await putCheckpoint([file('b', b, 2)], { createdAt: '2026-11-01T00:00:00.000Z' });
    const oldPinned = await putCheckpoint([file('c', c, 3)], { createdAt: '2026-11-02T00:00:00.000Z' });
    const unpublished = await putCheckpoint([file('d', d, 4)], { published: false });
    writeFileSync(join(store.dir, 'tmp', 'left.tmp'), 'x');
    mkdirSync(join(store.dir, 'quarantine'));
    writeFileSync(join(store.dir, 'quarantine', `${a}.1`), 'bad!!');

    const result = await collectGarbage(store, {
      maxAgeMs: 7 * 24 * 3600 * 1000,
      pinned: new Set([oldPinned]),
      log,
      nowMs: Date.parse('2026-12-02T00:00:00.000Z'),
      publicKeyPem: signer.publicKeyPem,
    });

    expect(result.removed_manifests.sort()).toEqual([old, unpublished].sort());
    expect(result).toMatchObject({ removed_objects: 2, removed_quarantined: 1, freed_bytes: 2 + 4 + 5, kept_manifests: 2 });
    expect(store.manifestIds().sort()).toEqual([kept, oldPinned].sort());
    expect(store.publishedIds().sort()).toEqual([kept, oldPinned].sort());
    expect(objectsOnDisk()).toEqual([a, c].sort());
    expect(readdirSync(join(store.dir, 'tmp'))).toEqual([]);
    expect(readdirSync(join(store.dir, 'quarantine'))).toEqual([]);
  });

  it('with pinned unknown (null) removes nothing by age; an unreadable manifest keeps every object', async () => {
    const [a, b] = putObjects('a', 'bb');
    const old = await putCheckpoint([file('a', a, 1)], { createdAt: '2026-01-01T00:00:00.000Z' });
    let r = await collectGarbage(store, { maxAgeMs: 1000, pinned: null, log, nowMs: Date.now(), publicKeyPem: signer.publicKeyPem });
    expect(r).toMatchObject({ removed_manifests: [], removed_objects: 1, kept_manifests: 1 });
    expect(objectsOnDisk()).toEqual([a]);
    // A directory where a manifest should be: gc cannot tell what it names, so no object goes.
    store.close(); // the store's name cache still holds b: opened afresh, as each capture opens it
    putObjects('bb');
    mkdirSync(join(store.dir, 'manifests', `${'f'.repeat(64)}.json`));
    writeFileSync(join(store.dir, 'published', `${'f'.repeat(64)}.json`), '{}');
    r = await collectGarbage(store, { maxAgeMs: 0, pinned: null, log, nowMs: Date.now(), publicKeyPem: signer.publicKeyPem });
    expect(r).toMatchObject({ removed_objects: 0, kept_manifests: 1 });
    expect(objectsOnDisk()).toEqual([a, b].sort());
    expect(store.manifestIds()).toContain(old);
  });
});

describe('published checkpoints (the queries of a task close)', () => {
  it('finds the one a close attempt published, reads it back verified, and says whether it is still published', async () => {
    const [a] = putObjects('a');
    const other = await putCheckpoint([file('a', a, 1)], { task: 't1', closeAttempt: 1 });
    const id = await putCheckpoint([file('a', a, 1)], { task: 't1', closeAttempt: 2 });
    const published = new PublishedCheckpoints(store, signer.publicKeyPem, () => null);

    expect(published.findForClose('t1', 2, '/w')).toBe(id);
    expect(published.findForClose('t1', 1, '/w')).toBe(other);
    expect(published.findForClose('t1', 3, '/w')).toBeNull();
    expect(published.findForClose('t2', 2, '/w')).toBeNull();
    expect(published.findForClose('t1', 2, '/elsewhere')).toBeNull();

    const p = published.read(id);
    expect(p.id).toBe(id);
    expect(p.manifest.close_attempt).toBe(2);
    expect(p.record).toMatchObject({ kind: 'checkpoint_published', checkpoint_id: id, task: 't1', close_attempt: 2 });

    expect(published.isPublished(id)).toBe(true);
    store.removePublished(id);
    expect(published.isPublished(id)).toBe(false);
    expect(() => published.read(id)).toThrow(`checkpoint ${id} is not published in ${store.dir}`);
    // Putting to a remote store with none configured does nothing.
    await published.putRemote(other);
  });

  it('refuses a published checkpoint whose record or manifest does not verify', async () => {
    const [a] = putObjects('a');
    const id = await putCheckpoint([file('a', a, 1)]);
    const foreign = ReceiptSigner.loadOrCreate(mkdtempSync(join(dir, 'other-')));
    expect(() => new PublishedCheckpoints(store, foreign.publicKeyPem, () => null).read(id)).toThrow(/signed by key \S+, but the key checked against is/);
    // A published record edited after signing: its signature no longer holds.
    const recordPath = join(store.dir, 'published', `${id}.json`);
    const record = JSON.parse(store.publishedBytes(id)!.toString('utf8')) as PublishedRecord;
    rmSync(recordPath);
    writeFileSync(recordPath, jcs({ ...record, read_back: { ...record.read_back, objects: 99 } }));
    expect(() => new PublishedCheckpoints(store, signer.publicKeyPem, () => null).read(id)).toThrow(`checkpoint ${id}: its published record:`);
  });
});

describe('the local store upkeep', () => {
  it('sets a bad object aside into quarantine/ (a retry stores it afresh), clears temps, lists only <64 hex>.json as ids', async () => {
    const [a] = putObjects('a');
    const q = store.setAside(a);
    expect(q).toBe(join(store.dir, 'quarantine'));
    expect(readdirSync(q)).toEqual([expect.stringMatching(new RegExp(`^${a}\\.\\d+$`))]);
    expect(existsSync(join(store.dir, 'objects', a.slice(0, 2), a))).toBe(false);
    expect(() => store.setAside(a)).toThrow(expect.objectContaining({ code: 'ENOENT' }));
    writeFileSync(join(store.dir, 'manifests', 'notes.txt'), 'x');
    writeFileSync(join(store.dir, 'tmp', 'x.tmp'), 'x');
    expect(store.manifestIds()).toEqual([]);
    store.clearTemp();
    expect(existsSync(join(store.dir, 'tmp', 'x.tmp'))).toBe(false);
    expect(store.unpublishedIds()).toEqual([]);
  });
});

describe('Checkpoints (the queue and the recovery at start)', () => {
  /** A Checkpoints over a store in the temp dir; no workspace is watched (nothing here reaches the watcher). */
  function checkpoints(): Checkpoints {
    const config = parseConfig({ checkpoint: { store: join(dir, 'store') } }, 'test', { SBX_STATE_DIR: join(dir, 'state'), SBX_SOCKET: join(dir, 'sock') });
    const watcher = {} as WorkspaceWatcher;
    return new Checkpoints({ config, log, identity: { instance: 'i', generation: 1, bootId: 'b', mode: 'cgroup' }, signer, watcher, reserveBytes: () => 0 });
  }

  it('recover() removes temps and manifests never published, and keeps the published ones', async () => {
    const [a] = putObjects('a');
    const published = await putCheckpoint([file('a', a, 1)]);
    const unpublished = await putCheckpoint([file('b', a, 1)], { published: false });
    writeFileSync(join(store.dir, 'tmp', 'half.tmp'), 'x');
    store.close(); // the Checkpoints holds the store's lock now
    const c = checkpoints();
    try {
      c.recover();
      expect(c.local.manifestIds()).toEqual([published]);
      expect(c.local.unpublishedIds()).toEqual([]);
      expect(readdirSync(join(c.local.dir, 'tmp'))).toEqual([]);
      expect(unpublished).not.toBe(published);
    } finally {
      await c.stop();
      c.local.close();
    }
  });

  it('runs gc and checkpoints one at a time, refusing the 17th waiting with LIMIT_EXCEEDED (retryable); a workspace that is not a directory is INVALID_ARGUMENT before anything runs', async () => {
    store.close();
    const c = checkpoints();
    try {
      const order: number[] = [];
      const calls = Array.from({ length: 17 }, (_, i) => c.gc().then(() => order.push(i)));
      const settled = await Promise.allSettled(calls);
      expect(settled.slice(0, 16).every((r) => r.status === 'fulfilled')).toBe(true);
      expect(settled[16]).toMatchObject({
        status: 'rejected',
        reason: { code: 'LIMIT_EXCEEDED', retryable: true, details: { limit: 'checkpoints_queued', max: 16 } },
      });
      expect(order).toEqual(Array.from({ length: 16 }, (_, i) => i));
      writeFileSync(join(dir, 'plain'), 'x');
      await expect(c.checkpoint(join(dir, 'plain'), null)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', details: { field: 'workspace' } });
      await expect(c.checkpoint(join(dir, 'store'), null)).rejects.toMatchObject({
        code: 'INVALID_ARGUMENT',
        message: expect.stringContaining('holds the checkpoint store'),
      });
    } finally {
      await c.stop();
      c.local.close();
    }
  });
});

describe('quarantine/ planted as a link', () => {
  it('is never followed: a set-aside is refused (the object stays), gc leaves what the link points at and says so', async () => {
    const [a] = putObjects('a');
    const outside = join(dir, 'outside');
    mkdirSync(join(outside, 'sub'), { recursive: true });
    writeFileSync(join(outside, 'keep'), 'p');
    writeFileSync(join(outside, 'sub', 'keep'), 'p');
    symlinkSync(outside, join(store.dir, 'quarantine'));
    expect(() => store.setAside(a)).toThrow(expect.objectContaining({ code: 'refused' }));
    expect(existsSync(join(store.dir, 'objects', a.slice(0, 2), a))).toBe(true);
    expect(readdirSync(outside).sort()).toEqual(['keep', 'sub']);
    const lines: string[] = [];
    const logged = pino({ level: 'error' }, { write: (l: string) => void lines.push(l) });
    const r = await collectGarbage(store, { maxAgeMs: 0, pinned: null, log: logged, nowMs: Date.now(), publicKeyPem: signer.publicKeyPem });
    expect(r).toMatchObject({ removed_quarantined: 0, freed_bytes: 1 });
    expect(readdirSync(outside).sort()).toEqual(['keep', 'sub']);
    expect(readdirSync(join(outside, 'sub'))).toEqual(['keep']);
    expect(lines.join('')).toContain('quarantine/ of the checkpoint store is not a directory');
  });
});
