// Checkpoint trees (manifest version 2: core/checkpoint/tree.ts, supervisor/checkpoint/trees.ts):
// a tree's bytes are the JCS of its entries by name; a reader refuses a tree that does not
// hold; expansion gives the entries a version 1 manifest lists; the checkpoint thread builds
// only the trees of directories that changed; and a version 1 checkpoint of the same tree
// still restores, verifies and diffs as identical (readers of both versions).
import { createHash, createPrivateKey, generateKeyPairSync, sign } from 'node:crypto';
import { spawnSync } from 'node:child_process';
import {
  chmodSync,
  closeSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  symlinkSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { checkTree, expandSync, TreeCache, treeBytes, treeEntryJcs, treeId, walkTreeAsync, type TreeObject } from '../../../../core/checkpoint/tree.js';
import { checkManifest, manifestBytes, manifestTrees, scanDigest, type Manifest } from '../../../../core/checkpoint/manifest.js';
import { jcs, keyIdOf } from '../../../../core/receipts/signature.js';
import { LocalStore } from '../../../../core/checkpoint/local-store.js';
import { removeRestoreTemp, restoreCheckpoint } from '../../../../core/checkpoint/restore.js';
import { verifyCheckpoint } from '../../../../core/checkpoint/verify.js';
import { diffCheckpointIds } from '../../../../core/checkpoint/diff.js';
import { runCheckpoint, runReadBack, type CheckpointRequest } from '../../../../supervisor/checkpoint/capture-worker.js';
import { racyMarginNs } from '../../../../core/fs/granule.js';
import { until } from '../../../helpers/daemon.js';
import { EMPTY_FILE_FIELDS, storedManifest, threadRequest } from '../../../helpers/manifest.js';

const dir = mkdtempSync(join(tmpdir(), 'sbx-tree-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const FILE = EMPTY_FILE_FIELDS;
const DIR = { type: 'dir' as const, mode: 0o755, uid: 0, gid: 0, size: 0, mtime_ns: '1' };

/** A tree object's bytes, from entries given as objects (each canonicalised as the writer does). */
const tree = (entries: Record<string, unknown>[]) => Buffer.from(jcs({ entries, kind: 'checkpoint_tree', version: 2 }));

describe('tree objects', () => {
  it('are the JCS of their entries by name, a name that is not UTF-8 as name_b64', () => {
    const names = [Buffer.from('a'), Buffer.from([0x66, 0xff]), Buffer.from('quote"\\')];
    const bytes = treeBytes(names.map((n) => treeEntryJcs(FILE, n)));
    const parsed = JSON.parse(bytes.toString()) as TreeObject;
    expect(Buffer.from(jcs(parsed)).equals(bytes)).toBe(true);
    expect(parsed.entries.map((e) => e.name ?? `b64:${e.name_b64}`)).toEqual(['a', 'b64:Zv8=', 'quote"\\']);
    expect(checkTree(bytes, treeId(bytes)).problems).toEqual([]);
  });

  it('that do not hold are refused, each naming what', () => {
    const problem = (entries: Record<string, unknown>[]) => {
      const bytes = tree(entries);
      return checkTree(bytes, treeId(bytes)).problems.join('; ');
    };
    expect(
      problem([
        { ...FILE, name: 'b' },
        { ...FILE, name: 'a' },
      ]),
    ).toContain('entry "a" out of order or listed twice');
    expect(
      problem([
        { ...FILE, name: 'a' },
        { ...FILE, name: 'a' },
      ]),
    ).toContain('out of order or listed twice');
    expect(problem([{ ...DIR, name: 'd' }])).toContain('directory "d" names no tree');
    expect(problem([{ ...DIR, name: 'm', mount: true, tree: 'a'.repeat(64) }])).toContain('mount point "m" names a tree');
    expect(problem([{ ...FILE, name: 'f', tree: 'a'.repeat(64) }])).toContain('file "f" names a tree');
    expect(problem([{ ...FILE, name: 'x/y' }])).toContain('entry "x/y" is not one plain name');
    expect(problem([{ ...FILE, name: '..' }])).toContain('is not one plain name');
    expect(problem([{ ...FILE, name: 'p', path: 'elsewhere' }])).toContain('entry "p" has a path');
    expect(problem([{ ...FILE }])).toContain('an entry with no name');
    expect(problem([{ ...FILE, name: 'f', mode: 0o10000 }])).toContain('entry "f": mode');
    // Bytes that are not their id's, and bytes that are not canonical.
    const good = tree([{ ...FILE, name: 'a' }]);
    expect(checkTree(good, 'b'.repeat(64)).problems[0]).toContain(`reads back as ${treeId(good)}`);
    const pretty = Buffer.from(JSON.stringify(JSON.parse(good.toString()), null, 1));
    expect(checkTree(pretty, treeId(pretty)).problems).toEqual([`tree ${treeId(pretty)} is not in canonical form (RFC 8785)`]);
  });

  it('expand into the entries a version 1 manifest lists: paths, depth first, a shared subtree read once', () => {
    const sub = tree([{ ...FILE, name: 'f' }]);
    const subId = treeId(sub);
    const root = tree([
      { ...DIR, name: 'a', tree: subId },
      { ...DIR, name: 'b', tree: subId },
      { ...DIR, name: 'm', mount: true },
      { ...FILE, name_b64: Buffer.from([0xff]).toString('base64') },
    ]);
    const objects = new Map([
      [subId, sub],
      [treeId(root), root],
    ]);
    const reads: string[] = [];
    const out = expandSync(treeId(root), (id) => (reads.push(id), objects.get(id) ?? null));
    expect(out.problems).toEqual([]);
    expect(reads).toEqual([treeId(root), subId]);
    expect(out.entries.map((e) => e.path ?? `b64:${e.path_b64}`)).toEqual(['a', 'a/f', 'b', 'b/f', 'm', `b64:${Buffer.from([0xff]).toString('base64')}`]);
    expect(out.entries[0]).toEqual({ ...DIR, path: 'a' });
    expect(out.trees).toEqual(
      new Map([
        [treeId(root), root.length],
        [subId, sub.length],
      ]),
    );
    // A subtree missing from the store: named, with the directory, and no entries.
    const missing = expandSync(treeId(root), (id) => (id === subId ? null : (objects.get(id) ?? null)));
    expect(missing.entries).toEqual([]);
    expect(missing.problems).toEqual([`tree ${subId} (directory "a") is missing from the store`]);
  });
});

describe('a walk of the trees (walkTreeAsync: what sbx verify streams)', () => {
  it('gives the entries expansion gives, in order, each tree as it is checked, keeps no tree once done (a shared subtree read again), and stops at the first that does not hold', async () => {
    const sub = tree([{ ...FILE, name: 'f' }]);
    const subId = treeId(sub);
    const root = tree([
      { ...DIR, name: 'a', tree: subId },
      { ...DIR, name: 'b', tree: subId },
      { ...FILE, name: 'z' },
    ]);
    const objects = new Map([
      [subId, sub],
      [treeId(root), root],
    ]);
    const reads: string[] = [];
    const steps: string[] = [];
    const problem = await walkTreeAsync(
      treeId(root),
      async (id) => (reads.push(id), objects.get(id) ?? null),
      Infinity,
      (s) => void steps.push('tree' in s ? `tree ${s.tree} ${s.size}` : (s.entry.path ?? '?')),
    );
    expect(problem).toBeNull();
    expect(reads).toEqual([treeId(root), subId, subId]);
    // With a cache of recent trees (what sbx verify walks with): the shared one read once, the same entries.
    const cachedReads: string[] = [];
    const cachedPaths: string[] = [];
    const cache = new TreeCache(1 << 20);
    expect(
      await walkTreeAsync(
        treeId(root),
        async (id) => (cachedReads.push(id), objects.get(id) ?? null),
        Infinity,
        (s) => void ('entry' in s && cachedPaths.push(s.entry.path ?? '?')),
        cache,
      ),
    ).toBeNull();
    expect(cachedReads).toEqual([treeId(root), subId]);
    expect(cachedPaths).toEqual(['a', 'a/f', 'b', 'b/f', 'z']);
    // A cache too small for the root keeps only what fits: the subtree, read once.
    const small: string[] = [];
    await walkTreeAsync(
      treeId(root),
      async (id) => (small.push(id), objects.get(id) ?? null),
      Infinity,
      () => {},
      new TreeCache(sub.length),
    );
    expect(small).toEqual([treeId(root), subId]);
    const expanded = expandSync(treeId(root), (id) => objects.get(id) ?? null);
    expect(steps.filter((x) => !x.startsWith('tree '))).toEqual(expanded.entries.map((e) => e.path));
    expect(steps).toEqual([`tree ${treeId(root)} ${root.length}`, 'a', `tree ${subId} ${sub.length}`, 'a/f', 'b', `tree ${subId} ${sub.length}`, 'b/f', 'z']);
    // A subtree that changed in the store: the walk stops there, naming it.
    objects.set(subId, tree([{ ...FILE, name: 'g' }]));
    const seen: string[] = [];
    const changed = await walkTreeAsync(
      treeId(root),
      async (id) => objects.get(id) ?? null,
      Infinity,
      (s) => void ('entry' in s && seen.push(s.entry.path ?? '?')),
    );
    expect(changed).toMatch(new RegExp(`^tree ${subId} reads back as [0-9a-f]{64} \\(\\d+ bytes\\): its bytes changed in the store \\(directory "a"\\)$`));
    expect(seen).toEqual(['a']);
  });
});

describe('a manifest whose trees expand past what it says', () => {
  it('is read no further than its scan.entries, and with a key not at all unless its signature verifies', () => {
    // A chain of 40 trees, each with two names for the next: 2^41 entries from 40 small objects.
    const objects = new Map<string, Buffer>();
    let next = tree([{ ...FILE, name: 'f' }]);
    objects.set(treeId(next), next);
    for (let i = 0; i < 40; i++) {
      const id = treeId(next);
      next = tree([
        { ...DIR, name: 'a', tree: id },
        { ...DIR, name: 'b', tree: id },
      ]);
      objects.set(treeId(next), next);
    }
    const root = treeId(next);
    const { privateKey, publicKey } = generateKeyPairSync('ed25519');
    const other = generateKeyPairSync('ed25519');
    const unsigned = {
      version: 2,
      kind: 'checkpoint',
      workspace: '/w',
      task: null,
      started_at: '2026-12-01T00:00:00.000Z',
      created_at: '2026-12-01T00:00:00.000Z',
      boundary: { epoch: null, seq: null, gap: 'not_watched' },
      scan: { digest: `sha256:${root}`, entries: 10, files: 0, bytes: 0, passes: 1 },
      consistent: true,
      unstable: [],
      supervisor: { instance: 'i', generation: 1, boot_id: 'b', mode: 'test' },
      root: { mode: 0o755, uid: 0, gid: 0, mtime_ns: '1' },
      tree: root,
    };
    const signedBy = (key: typeof privateKey) =>
      Buffer.from(
        jcs({ ...unsigned, signature: { alg: 'ed25519', key_id: keyIdOf(publicKey), value: sign(null, Buffer.from(jcs(unsigned)), key).toString('base64') } }),
      );
    const readTree = (id: string) => objects.get(id) ?? null;
    const pem = publicKey.export({ type: 'spki', format: 'pem' }) as string;
    // Signed, but its trees hold more than the 10 entries it says: stopped there.
    const bounded = checkManifest(signedBy(privateKey), { publicKeyPem: pem, readTree });
    expect(bounded).toEqual({ manifest: null, problems: ['the trees hold more than the 10 entries the manifest says: not read further'] });
    // Signed by another key: its trees are not read at all.
    let reads = 0;
    const foreign = checkManifest(signedBy(other.privateKey), { publicKeyPem: pem, readTree: (id) => (reads++, readTree(id)) });
    expect(foreign.manifest).toBeNull();
    expect(foreign.problems.at(-1)).toBe('its trees were not read: its signature does not verify');
    expect(reads).toBe(0);
  });
});

describe('the trees the checkpoint thread builds', () => {
  const ws = join(dir, 'ws');
  const storeDir = join(dir, 'store');
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  const publicKeyPem = publicKey.export({ type: 'spki', format: 'pem' }) as string;
  const privateKeyPem = privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
  const request = (storeFd: number): CheckpointRequest => ({ ...threadRequest({ root: ws, storeDir, storeFd, privateKey, publicKey }), forRemote: false });
  /** Past every entry's racy margin (granule.ts), so the stat cache keeps what it read. */
  const settle = async () => {
    const ready = BigInt(Date.now()) * 1_000_000n;
    await until(() => BigInt(Date.now()) * 1_000_000n > ready + racyMarginNs(ready + 1n), 'the racy margin past');
  };

  /** Writes checkpoint id's published record (signed, as publish.ts writes it) with m's boundary and fence. */
  const publish = (id: string, m: Manifest, objects: number) => {
    const unsignedRecord = {
      version: 1,
      kind: 'checkpoint_published',
      checkpoint_id: id,
      workspace: ws,
      task: null,
      boundary: m.boundary,
      read_back: { at: new Date().toISOString(), objects, bytes: m.scan.bytes, ms: 1 },
      supervisor: m.supervisor,
    };
    const value = sign(null, Buffer.from(jcs(unsignedRecord)), createPrivateKey(privateKeyPem)).toString('base64');
    writeFileSync(join(storeDir, 'published', `${id}.json`), jcs({ ...unsignedRecord, signature: { alg: 'ed25519', key_id: keyIdOf(publicKey), value } }));
  };

  it('builds only the trees of directories that changed; the read-back looks only at them (changed), or at every object (stat)', async () => {
    mkdirSync(join(ws, 'a', 'deep'), { recursive: true });
    mkdirSync(join(ws, 'b'));
    mkdirSync(storeDir);
    for (const p of ['a/one', 'a/deep/two', 'b/three', 'top']) writeFileSync(join(ws, p), `content of ${p}`);
    symlinkSync('a/one', join(ws, 'link'));
    await settle();
    const storeFd = openSync(storeDir, 'r');
    try {
      const take = (rehash: 'changed' | 'stat' = 'changed') => {
        const c = runCheckpoint(request(storeFd));
        const rb = runReadBack({ kind: 'readback', storeDir, storeFd, id: c.id, publicKeyPem, rehash });
        expect(rb.problems).toEqual([]);
        expect(rb.manifestProblems).toEqual([]);
        return { c, rb, m: storedManifest(storeDir, c.id, publicKeyPem) };
      };
      const first = take();
      expect(first.c.trees).toMatchObject({ referenced: 4, written: 4, built: 4 }); // the root, a, a/deep, b
      expect(first.m.entries.map((e) => e.path)).toEqual(['a', 'a/deep', 'a/deep/two', 'a/one', 'b', 'b/three', 'link', 'top']);
      expect(first.rb).toMatchObject({ objects: 4, rehashedObjects: 4, trustedObjects: 0, trees: { objects: 4, rehashedObjects: 4, trustedObjects: 0 } });
      await settle();
      const same = take();
      expect(same.c.trees).toMatchObject({ referenced: 4, written: 0, built: 0 });
      expect(same.m.tree).toBe(first.m.tree);
      expect(same.rb).toMatchObject({ objects: 4, rehashedObjects: 0, trustedObjects: 4, trees: { objects: 4, trustedObjects: 4 } });
      // One file in a/deep changed (its size kept, its mtime put back): a/deep, a and the root
      // are built again; b's tree is kept, and only its object is not looked at.
      writeFileSync(join(ws, 'a/deep/two'), 'CONTENT of a/deep/two');
      utimesSync(join(ws, 'a/deep/two'), new Date(1_000), new Date(1_000));
      const changed = take();
      expect(changed.c.trees).toMatchObject({ referenced: 4, written: 3, built: 3 });
      expect(changed.m.tree).not.toBe(first.m.tree);
      expect(changed.rb).toMatchObject({ objects: 4, rehashedObjects: 1, trustedObjects: 1, trees: { objects: 4, rehashedObjects: 3, trustedObjects: 1 } });
      // 'stat': every object looked at (confirmed by its stat, none re-hashed).
      await settle();
      const statted = take('stat');
      expect(statted.rb).toMatchObject({ objects: 4, rehashedObjects: 0, trustedObjects: 0, trees: { objects: 4, rehashedObjects: 0, trustedObjects: 0 } });
    } finally {
      closeSync(storeFd);
    }
  });

  it('a copy of the store put at its path trusts no tree: the read-back looks at every object again and finds one damaged in the copy', async () => {
    await settle();
    let storeFd = openSync(storeDir, 'r');
    const take = () => {
      const c = runCheckpoint(request(storeFd));
      return { c, rb: runReadBack({ kind: 'readback', storeDir, storeFd, id: c.id, publicKeyPem, rehash: 'changed' }) };
    };
    try {
      expect(take().rb).toMatchObject({ problems: [], trustedObjects: 4 });
      // The store swapped for a copy (as an operator's restore from a backup would), one object in it truncated.
      closeSync(storeFd);
      renameSync(storeDir, `${storeDir}.old`);
      expect(spawnSync('cp', ['-a', `${storeDir}.old`, storeDir]).status).toBe(0);
      const sha = createHash('sha256').update('content of b/three').digest('hex');
      const copied = join(storeDir, 'objects', sha.slice(0, 2), sha);
      chmodSync(copied, 0o644);
      writeFileSync(copied, '');
      storeFd = openSync(storeDir, 'r');
      const after = take();
      expect(after.rb.trustedObjects).toBe(0);
      expect(after.rb.problems).toEqual([expect.objectContaining({ sha256: sha, paths: ['b/three'] })]);
    } finally {
      closeSync(storeFd);
      // The original back (the damaged copy gone) for the next test.
      rmSync(storeDir, { recursive: true, force: true });
      renameSync(`${storeDir}.old`, storeDir);
    }
  });

  it('a version 1 checkpoint of the same tree restores, verifies and diffs as identical to the version 2 one', async () => {
    const store = new LocalStore(storeDir, false);
    try {
      const v2Id = (await store.listManifests()).find((id) => storedManifest(storeDir, id).version === 2)!;
      const v2 = storedManifest(storeDir, v2Id) as Manifest;
      // The version 1 manifest a writer before trees made: the same entries, listed, signed.
      const { tree: _root, signature: _s, ...head } = v2;
      const unsigned: Manifest = { ...head, version: 1, scan: { ...v2.scan, digest: scanDigest(v2.entries) }, entries: v2.entries };
      const v1: Manifest = {
        ...unsigned,
        signature: {
          alg: 'ed25519',
          key_id: keyIdOf(publicKey),
          value: sign(null, Buffer.from(jcs(unsigned)), createPrivateKey(privateKeyPem)).toString('base64'),
        },
      };
      const { bytes, id: v1Id } = manifestBytes(v1);
      expect(checkManifest(bytes, { expectId: v1Id, publicKeyPem }).problems).toEqual([]);
      writeFileSync(join(storeDir, 'manifests', `${v1Id}.json`), bytes);
      // Published records for both (the thread's read-back above wrote none: publish.ts does).
      for (const id of [v1Id, v2Id]) publish(id, v2, 4);
      // Restored: the same tree either way.
      for (const id of [v1Id, v2Id]) {
        const r = await restoreCheckpoint(store, id, join(dir, `restored-${id.slice(0, 8)}`), { sameOwner: true, publicKeyPem });
        expect(r.differences).toEqual([]);
        expect(r.entries).toBe(v2.entries.length);
      }
      // Verified: its signature, its record, every object re-hashed.
      const verdict = await verifyCheckpoint(bytes, publicKeyPem, store, v1Id);
      expect(verdict.problems).toEqual([]);
      expect(verdict.objects).toBe(4);
      const v2Verdict = await verifyCheckpoint(readFileSync(join(storeDir, 'manifests', `${v2Id}.json`)), publicKeyPem, store, v2Id);
      expect(v2Verdict.problems).toEqual([]);
      expect(v2Verdict.objects).toBe(4 + 4); // its files' objects and its trees
      // Diffed: nothing differs.
      const diff = await diffCheckpointIds(store, v1Id, v2Id, publicKeyPem);
      expect(diff).toMatchObject({ added: [], removed: [], modified: [] });
    } finally {
      store.close();
    }
  });
  it('restores 60 files more, fetching objects ahead as from a remote store (at most 8 reads at once): the tree identical, each entry once', async () => {
    // 60 files in b/, 15 of them with the content of another (an object used twice); b/many-00 the first, b/many-59 past b/three.
    for (let i = 0; i < 60; i++) writeFileSync(join(ws, 'b', `many-${String(i).padStart(2, '0')}`), `many ${i % 45}`);
    await settle();
    const storeFd = openSync(storeDir, 'r');
    let id: string;
    try {
      const c = runCheckpoint(request(storeFd));
      expect(runReadBack({ kind: 'readback', storeDir, storeFd, id: c.id, publicKeyPem, rehash: 'changed' }).problems).toEqual([]);
      id = c.id;
    } finally {
      closeSync(storeFd);
    }
    const m = storedManifest(storeDir, id, publicKeyPem) as Manifest;
    publish(id, m, 45 + 4);
    const local = new LocalStore(storeDir, false);
    // Every read of an object counted while it runs (the walks' tree reads too), each taking 5 ms or more.
    let reading = 0;
    let most = 0;
    const objectReads = new Map<string, number>();
    async function* counted(sha: string): AsyncIterable<Uint8Array> {
      reading++;
      most = Math.max(most, reading);
      objectReads.set(sha, (objectReads.get(sha) ?? 0) + 1);
      try {
        await new Promise((r) => setTimeout(r, 5)); // a remote store's latency: reads begun meanwhile overlap
        yield* local.readObject(sha);
      } finally {
        reading--;
      }
    }
    const remote = new Proxy(local, {
      get: (target, key) =>
        key === 'readObject' ? counted : typeof Reflect.get(target, key) === 'function' ? Reflect.get(target, key).bind(target) : Reflect.get(target, key),
    });
    // Its temp dir (the trees kept for the later walks) in one of this test's own.
    const tmp = join(dir, 'tmp');
    mkdirSync(tmp);
    const savedTmp = process.env.TMPDIR;
    process.env.TMPDIR = tmp;
    try {
      const target = join(dir, 'restored-ahead');
      const r = await restoreCheckpoint(remote, id, target, { sameOwner: true, publicKeyPem, remote: true });
      expect(readdirSync(tmp)).toEqual([]); // removed
      // Each tree read from the store once, though walked three times (checked, restored, compared).
      const trees = [...manifestTrees(m).keys()];
      expect(trees.length).toBe(4); // the root, a, a/deep, b
      for (const t of trees) expect(objectReads.get(t)).toBe(1);
      // No usable $TMPDIR (missing), or $TMPDIR the restore's own DIR (which must stay empty): no temp dir, every walk reads the store.
      for (const [tmpGiven, into] of [
        [join(dir, 'no-such-dir'), join(dir, 'restored-no-tmp')],
        [join(dir, 'restored-into-tmp'), join(dir, 'restored-into-tmp')],
      ]) {
        mkdirSync(join(dir, 'restored-into-tmp'), { recursive: true });
        process.env.TMPDIR = tmpGiven;
        objectReads.clear();
        expect(await restoreCheckpoint(remote, id, into, { sameOwner: true, publicKeyPem, remote: true })).toMatchObject({ identical: true, differences: [] });
        for (const t of trees) expect(objectReads.get(t)).toBe(3);
      }
      // removeRestoreTemp (what sbx restore runs on a signal) removes a running restore's temp dir, at once; the restore goes on without it.
      process.env.TMPDIR = tmp;
      objectReads.clear();
      let removedAt = -1;
      const removing = new Proxy(remote, {
        get: (target, key) =>
          key === 'readObject'
            ? (sha: string) => {
                if (objectReads.size === 6 && removedAt < 0) {
                  expect(readdirSync(tmp)).toHaveLength(1); // the temp dir, made at the first tree
                  removeRestoreTemp();
                  removedAt = objectReads.size;
                  expect(readdirSync(tmp)).toEqual([]);
                }
                return target.readObject(sha);
              }
            : Reflect.get(target, key),
      });
      expect(await restoreCheckpoint(removing, id, join(dir, 'restored-removed'), { sameOwner: true, publicKeyPem, remote: true })).toMatchObject({
        identical: true,
      });
      expect(removedAt).toBe(6);
      expect(readdirSync(tmp)).toEqual([]);
      expect(r.differences).toEqual([]);
      expect(r).toMatchObject({ identical: true, entries: m.entries.length, files: 4 + 60 });
      expect(readFileSync(join(target, 'b', 'many-50'), 'utf8')).toBe('many 5');
      expect(most).toBeGreaterThan(1); // fetched ahead
      expect(most).toBeLessThanOrEqual(8 + 1); // PREFETCH_OBJECTS ahead, and the one a walk reads
      // A file object is read once per file using it (twice when two files use it, 10 or more files apart), never more.
      const uses = new Map<string, number>();
      for (const e of m.entries) if (e.type === 'file') uses.set(e.sha256!, (uses.get(e.sha256!) ?? 0) + 1);
      for (const [sha, n] of uses) expect(objectReads.get(sha) ?? 0).toBeLessThanOrEqual(n);
      expect([...uses.keys()].every((sha) => (objectReads.get(sha) ?? 0) >= 1)).toBe(true);
    } finally {
      if (savedTmp === undefined) delete process.env.TMPDIR;
      else process.env.TMPDIR = savedTmp;
      local.close();
    }
  });
});
