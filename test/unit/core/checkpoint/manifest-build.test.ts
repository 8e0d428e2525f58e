// The checkpoint thread's manifest builder (supervisor/checkpoint/capture-worker.ts, trees.ts),
// run in this process on a real tree: the manifest it stores is the canonical JCS that
// checkManifest accepts (id, digest, counts, signature) with its entries read from the tree
// objects, for names that are not UTF-8, need escapes or are not ASCII, first and when every
// entry comes from the stat cache (then every tree is kept, none built again: issue 34).
import { generateKeyPairSync } from 'node:crypto';
import { closeSync, lstatSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { runCheckpoint, runReadBack, type CheckpointRequest } from '../../../../supervisor/checkpoint/capture-worker.js';
import { checkManifest, entryPathBytes, manifestObjects } from '../../../../core/checkpoint/manifest.js';
import { storedManifest, threadRequest } from '../../../helpers/manifest.js';
import { racyMarginNs } from '../../../../core/fs/granule.js';
import { until } from '../../../helpers/daemon.js';

const dir = mkdtempSync(join(tmpdir(), 'sbx-manifest-build-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('the manifest the checkpoint thread builds', () => {
  it('is canonical, hashes to its id, and verifies (digest, counts, signature), first and from the stat cache', async () => {
    const ws = join(dir, 'ws');
    const store = join(dir, 'store');
    mkdirSync(join(ws, 'sub'), { recursive: true });
    mkdirSync(store);
    const names = ['plain', 'quote"back\\slash', 'ctl\u0001\u001f\ttab', 'née-日本', 'sub/inner'];
    for (const n of names) writeFileSync(join(ws, n), `content of ${n}`);
    writeFileSync(Buffer.concat([Buffer.from(`${ws}/`), Buffer.from([0x66, 0xff, 0xfe])]), 'not utf-8');
    symlinkSync('target "x"', join(ws, 'link'));
    const { privateKey, publicKey } = generateKeyPairSync('ed25519');
    const publicKeyPem = publicKey.export({ type: 'spki', format: 'pem' }) as string;
    const storeFd = openSync(store, 'r');
    try {
      const request = (): CheckpointRequest => threadRequest({ root: ws, storeDir: store, storeFd, privateKey, publicKey, task: 't' });
      const check = (id: string, manifestBytes: Uint8Array | undefined) => {
        const bytes = readFileSync(join(store, 'manifests', `${id}.json`));
        expect(Buffer.compare(bytes, Buffer.from(manifestBytes!))).toBe(0);
        expect(checkManifest(bytes, { expectId: id, publicKeyPem })).toMatchObject({ manifest: null }); // its entries are in the trees
        const m = storedManifest(store, id, publicKeyPem);
        expect(m.version).toBe(2);
        expect(m.scan.digest).toBe(`sha256:${m.tree}`);
        return m;
      };
      // Past every entry's racy margin (stat-cache.ts racyMarginNs) before the first capture
      // starts, so that the stat cache keeps every entry it reads and the next capture reads none.
      const ready = [...[...names, 'sub', 'link'].map((n) => join(ws, n)), Buffer.concat([Buffer.from(`${ws}/`), Buffer.from([0x66, 0xff, 0xfe])])]
        .map((p) => lstatSync(p, { bigint: true }).ctimeNs)
        .reduce((a, c) => (c + racyMarginNs(c) > a ? c + racyMarginNs(c) : a), 0n);
      await until(() => BigInt(Date.now()) * 1_000_000n > ready, 'the racy margin past');
      const first = runCheckpoint(request());
      const m1 = check(first.id, first.manifestBytes);
      const expected = [...[...names, 'sub', 'link'].map((n) => Buffer.from(n)), Buffer.from([0x66, 0xff, 0xfe])];
      expect(m1.entries.map((e) => entryPathBytes(e).toString('latin1')).sort()).toEqual(expected.map((p) => p.toString('latin1')).sort());
      expect(m1.scan.files).toBe(names.length + 1);
      // Two directories, two trees: the root's and sub's (a subdirectory by its tree's id).
      expect(first.trees).toEqual({ referenced: 2, written: 2, bytesWritten: expect.any(Number), built: 2 });
      expect(manifestObjects(m1).size).toBe(names.length + 1 + 2);
      expect(runReadBack({ kind: 'readback', storeDir: store, storeFd, id: first.id, publicKeyPem, rehash: 'changed' })).toMatchObject({
        manifestProblems: [],
        problems: [],
      });
      const again = runCheckpoint(request());
      expect(again.scan.passes).toBe(1);
      expect(again.objects.written).toBe(0);
      expect(again.trees).toMatchObject({ referenced: 2, written: 0, built: 0 });
      const m2 = check(again.id, again.manifestBytes);
      expect(m2.entries).toEqual(m1.entries);
      expect(m2.scan.digest).toBe(m1.scan.digest);
      expect(runReadBack({ kind: 'readback', storeDir: store, storeFd, id: again.id, publicKeyPem, rehash: 'changed' })).toMatchObject({
        manifestProblems: [],
        problems: [],
        rehashedObjects: 0,
      });
    } finally {
      closeSync(storeFd);
    }
  });
});
