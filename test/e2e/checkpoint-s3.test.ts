// The S3 checkpoint store against a real S3 server: Ceph radosgw 16 started by
// scripts/s3/radosgw.sh in a temp dir (one mon, one memstore OSD), stopped after, with every
// daemon's pid checked gone. Create-once objects and manifests, byte-exact reads, If-Match on
// the ETag, errors naming bucket/key/status, and what the server itself checks (Content-MD5:
// yes; x-amz-checksum-sha256: no). Skips, saying why, where radosgw is not installed (.ci/run installs it).
import { execFile, execFileSync, spawnSync } from 'node:child_process';
import { createCipheriv, createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { promisify } from 'node:util';
import {
  CreateBucketCommand,
  GetObjectCommand,
  HeadObjectCommand,
  ListObjectsV2Command,
  ListObjectVersionsCommand,
  PutObjectCommand,
  S3Client,
} from '@aws-sdk/client-s3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { S3Store } from '../../core/checkpoint/s3-store.js';
import { StoreError } from '../../core/checkpoint/store.js';
import { ROOT, sha256, TestDaemon, until } from '../helpers/daemon.js';
import { pythonTreeListing } from '../helpers/workspace-trees.js';

const run = promisify(execFile);
const SCRIPT = join(ROOT, 'scripts/s3/radosgw.sh');
const APT = 'apt-get install -y --no-install-recommends ceph-mon ceph-osd radosgw';
const installed = ['radosgw', 'ceph-mon', 'ceph-osd'].every((b) => spawnSync('sh', ['-c', `command -v ${b}`]).status === 0);

/** n pseudo-random bytes from a seed (AES-256-CTR of zeros), so a failure can be replayed. */
function seeded(seedHex: string, n: number): Buffer {
  const key = createHash('sha256').update(seedHex).digest();
  return createCipheriv('aes-256-ctr', key, Buffer.alloc(16)).update(Buffer.alloc(n));
}

/** True once pid has exited (a zombie its reaper has not collected yet, or gone). */
function exited(pid: number): boolean {
  try {
    return /^State:\s+Z/m.test(readFileSync(`/proc/${pid}/status`, 'utf8'));
  } catch {
    return true;
  }
}

async function storeError(p: Promise<unknown> | (() => Promise<unknown>)): Promise<StoreError> {
  try {
    await (typeof p === 'function' ? p() : p);
  } catch (err) {
    if (err instanceof StoreError) return err;
    throw err;
  }
  throw new Error('expected a StoreError, the call succeeded');
}

async function drain(it: AsyncIterable<Uint8Array>): Promise<Buffer> {
  const parts: Uint8Array[] = [];
  for await (const c of it) parts.push(c);
  return Buffer.concat(parts);
}

describe.skipIf(!installed)(
  installed ? 'S3 checkpoint store against radosgw' : `S3 checkpoint store against radosgw (skipped: radosgw is not installed; ${APT})`,
  () => {
    let dir = '';
    let env: Record<string, string> = {};
    let daemonPids: number[] = [];
    const savedEnv: Record<string, string | undefined> = {};
    let raw: S3Client;
    let bucket = '';
    const UNVERSIONED = 'sbx-unversioned';
    const stores: S3Store[] = [];
    const tmpFiles: string[] = [];
    /** A store on the server (from the standard environment, as users configure it) under its own prefix. */
    const store = (prefix: string, opts: ConstructorParameters<typeof S3Store>[1] = {}, b = bucket) => {
      const s = new S3Store({ kind: 's3', bucket: b, prefix }, opts);
      stores.push(s);
      return s;
    };
    const file = (bytes: Buffer) => {
      const p = join(dir, `upload-${tmpFiles.length}`);
      writeFileSync(p, bytes);
      tmpFiles.push(p);
      return p;
    };

    beforeAll(async () => {
      dir = mkdtempSync('/tmp/sbx-test-rgw-');
      const { stdout } = await run(SCRIPT, ['start', dir], { timeout: 110_000 });
      env = Object.fromEntries(
        stdout
          .trim()
          .split('\n')
          .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
      );
      expect(Object.keys(env).sort()).toEqual(['AWS_ACCESS_KEY_ID', 'AWS_ENDPOINT_URL', 'AWS_REGION', 'AWS_SECRET_ACCESS_KEY', 'SBX_S3_BUCKET']);
      expect(readFileSync(join(dir, 'env'), 'utf8')).toBe(stdout);
      daemonPids = readFileSync(join(dir, 'pids'), 'utf8')
        .trim()
        .split('\n')
        .map((l) => Number(l.split(' ')[1]));
      expect(daemonPids).toHaveLength(3);
      for (const [k, v] of Object.entries({ ...env, AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true' })) {
        savedEnv[k] = process.env[k];
        process.env[k] = v;
      }
      bucket = env.SBX_S3_BUCKET;
      raw = new S3Client({ forcePathStyle: true, requestChecksumCalculation: 'WHEN_REQUIRED', responseChecksumValidation: 'WHEN_REQUIRED', maxAttempts: 1 });
      await raw.send(new CreateBucketCommand({ Bucket: UNVERSIONED }));
    }, 120_000);

    afterAll(async () => {
      for (const s of stores) s.close();
      raw?.destroy();
      for (const [k, v] of Object.entries(savedEnv)) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
      if (!dir) return;
      try {
        if (existsSync(join(dir, 'pids'))) await run(SCRIPT, ['stop', dir], { timeout: 60_000 });
        // stop returns once each has exited; the script's orphans are then reaped by PID 1.
        expect(daemonPids.filter((pid) => !exited(pid))).toEqual([]);
        await until(() => daemonPids.every((pid) => !existsSync(`/proc/${pid}`)), `pids ${daemonPids.join(' ')} (mon, osd, rgw) to be reaped by PID 1`, 30_000);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    }, 90_000);

    it('stores an object PUT twice once (stored, then not; one key, one version) and reads 5 MiB back byte for byte', async () => {
      const seed = randomBytes(8).toString('hex');
      console.log(`checkpoint-s3: 5 MiB object from seed ${seed}`);
      const bytes = seeded(seed, 5 << 20);
      const sha = sha256(bytes);
      const s = store('twice/');
      const path = file(bytes);
      expect(await s.putObject(sha, path, bytes.length)).toEqual({ stored: true });
      expect(await s.putObject(sha, path, bytes.length)).toEqual({ stored: false });
      const key = `twice/objects/${sha.slice(0, 2)}/${sha}`;
      const listed = await raw.send(new ListObjectsV2Command({ Bucket: bucket, Prefix: 'twice/' }));
      expect(listed.Contents?.map((o) => [o.Key, o.Size])).toEqual([[key, bytes.length]]);
      const versions = await raw.send(new ListObjectVersionsCommand({ Bucket: bucket, Prefix: 'twice/' }));
      expect(versions.Versions?.map((v) => v.Key)).toEqual([key]);
      expect(versions.Versions?.[0].VersionId).not.toBe('null'); // the bucket is versioned
      const back = await drain(s.readObject(sha));
      expect(back.length).toBe(bytes.length);
      expect(back.equals(bytes)).toBe(true);
    });

    it('stores and reads back an empty object', async () => {
      const s = store('empty/');
      const sha = sha256('');
      expect(await s.putObject(sha, file(Buffer.alloc(0)), 0)).toEqual({ stored: true });
      const head = await raw.send(new HeadObjectCommand({ Bucket: bucket, Key: `empty/objects/e3/${sha}` }));
      expect(head.ContentLength).toBe(0);
      expect((await drain(s.readObject(sha))).length).toBe(0);
    });

    it('where the server enforces If-None-Match (unversioned bucket, no HEAD first), a second PUT gets 412: stored false, one version', async () => {
      const s = store('race/', { checkBeforePut: false }, UNVERSIONED);
      const bytes = randomBytes(1000);
      const sha = sha256(bytes);
      expect(await s.putObject(sha, file(bytes), bytes.length)).toEqual({ stored: true });
      expect(await s.putObject(sha, file(bytes), bytes.length)).toEqual({ stored: false });
      const versions = await raw.send(new ListObjectVersionsCommand({ Bucket: UNVERSIONED, Prefix: 'race/' }));
      expect(versions.Versions?.map((v) => [v.Key, v.VersionId])).toEqual([[`race/objects/${sha.slice(0, 2)}/${sha}`, 'null']]);
      // A manifest: the same bytes again return the version there; other bytes under its id are refused.
      const m = Buffer.from('{"manifest":"race"}');
      const id = sha256(m);
      const v1 = await s.putManifest(id, m);
      expect(v1.etag).toBe(`"${createHash('md5').update(m).digest('hex')}"`);
      expect(await s.putManifest(id, m)).toEqual(v1);
      const e = await storeError(s.putManifest(id, Buffer.from('{"manifest":"other"}')));
      expect(e.code).toBe('conflict');
      expect(e.message).toContain(`s3://${UNVERSIONED}/race/manifests/${id}.json`);
      expect((await s.readManifest(id, v1)).equals(m)).toBe(true);
    });

    it('refuses to upload a file that does not hash to its key, a symlink or a fifo (nothing stored)', async () => {
      const s = store('mismatch/');
      const bytes = Buffer.from('these bytes');
      const claimed = sha256('other bytes');
      const e = await storeError(s.putObject(claimed, file(bytes), bytes.length));
      expect(e.code).toBe('io');
      expect(e.message).toContain(`hashing to ${sha256(bytes)}, not ${bytes.length} bytes hashing to ${claimed}; not uploaded`);
      expect((await storeError(drain(s.readObject(claimed)))).code).toBe('missing');
      // Not a regular file: a link is never followed, a fifo never opened for reading.
      const link = join(dir, 'link-to-upload');
      symlinkSync(file(bytes), link);
      const fifo = join(dir, 'fifo');
      execFileSync('mkfifo', [fifo]);
      for (const path of [link, fifo]) {
        const r = await storeError(s.putObject(sha256(bytes), path, bytes.length));
        expect([r.code, r.message]).toEqual(['refused', expect.stringContaining(path)]);
      }
      expect((await storeError(drain(s.readObject(sha256(bytes))))).code).toBe('missing');
    });

    it('writes a manifest and reads that version back; a wrong ETag or version fails; other bytes under its id conflict', async () => {
      const s = store('manifests/');
      const m = Buffer.from(JSON.stringify({ entries: [{ path: 'a', sha256: sha256('a') }] }));
      const id = sha256(m);
      const v = await s.putManifest(id, m);
      expect(v.etag).toBe(`"${createHash('md5').update(m).digest('hex')}"`);
      expect(v.versionId).toMatch(/^\S+$/);
      expect(v.versionId).not.toBe('null');
      expect((await s.readManifest(id, v)).equals(m)).toBe(true);
      expect((await s.readManifest(id)).equals(m)).toBe(true);
      // Written again with the same bytes: the version already there, not a new one.
      expect(await s.putManifest(id, m)).toEqual(v);
      const key = `manifests/manifests/${id}.json`;
      const versions = await raw.send(new ListObjectVersionsCommand({ Bucket: bucket, Prefix: key }));
      expect(versions.Versions?.map((x) => x.VersionId)).toEqual([v.versionId]);

      const wrongEtag = await storeError(s.readManifest(id, { etag: `"${'0'.repeat(32)}"`, versionId: v.versionId }));
      expect(wrongEtag.code).toBe('conflict');
      expect(wrongEtag.key).toBe(key);
      expect(wrongEtag.message).toMatch(/^the manifest read back is not the version written/);
      expect(wrongEtag.message).toContain(`s3://${bucket}/${key}`);
      expect(wrongEtag.message).toContain('HTTP 412');
      const wrongEtagOnly = await storeError(s.readManifest(id, { etag: '"abc"', versionId: null }));
      expect(wrongEtagOnly.code).toBe('conflict');
      const noSuchVersion = await storeError(s.readManifest(id, { etag: v.etag, versionId: 'no-such-version' }));
      expect(noSuchVersion.code).toBe('missing');
      expect(noSuchVersion.message).toContain('version no-such-version');

      const other = await storeError(s.putManifest(id, Buffer.from('{"entries":[]}')));
      expect(other.code).toBe('conflict');
      expect(other.message).toContain(`s3://${bucket}/${key}`);
      expect((await s.readManifest(id, v)).equals(m)).toBe(true);

      const absent = await storeError(s.readManifest(sha256('no such manifest')));
      expect(absent.code).toBe('missing');
      expect(absent.message).toContain('HTTP 404 NoSuchKey');
    });

    it('names the bucket, key and HTTP status of an absent object', async () => {
      const s = store('absent/');
      const sha = sha256('never stored');
      const e = await storeError(drain(s.readObject(sha)));
      expect(e.code).toBe('missing');
      expect(e.key).toBe(`absent/objects/${sha.slice(0, 2)}/${sha}`);
      expect(e.message).toBe(`GetObject s3://${bucket}/absent/objects/${sha.slice(0, 2)}/${sha} at ${env.AWS_ENDPOINT_URL}: HTTP 404 NoSuchKey`);
    });

    it('lists the manifests held (published or not), skipping keys that are not <sha256>.json', async () => {
      const s = store('list/');
      expect(await s.listManifests()).toEqual([]);
      const ids: string[] = [];
      for (let i = 0; i < 5; i++) {
        const m = Buffer.from(`{"n":${i}}`);
        ids.push(sha256(m));
        await s.putManifest(sha256(m), m);
      }
      await s.putPublished(ids[0], Buffer.from('{"published":true}'));
      await raw.send(new PutObjectCommand({ Bucket: bucket, Key: 'list/manifests/notes.txt', Body: 'x' }));
      expect((await s.listManifests()).sort()).toEqual([...ids].sort());
      expect(await store('list-other/').listManifests()).toEqual([]);
    });

    it('reads a published record back, null when absent; publishing again is a no-op', async () => {
      const s = store('published/');
      const id = sha256('a checkpoint');
      expect(await s.readPublished(id)).toBeNull();
      const rec = Buffer.from('{"published":1}');
      await s.putPublished(id, rec);
      await s.putPublished(id, Buffer.from('{"published":2}'));
      expect((await s.readPublished(id))?.equals(rec)).toBe(true);
      const versions = await raw.send(new ListObjectVersionsCommand({ Bucket: bucket, Prefix: `published/published/${id}.json` }));
      expect(versions.Versions).toHaveLength(1);
    });

    it('an unreachable endpoint, a missing bucket or wrong keys: StoreError io naming the bucket/key and what the server said', async () => {
      const port = await new Promise<number>((resolve) => {
        const srv = createServer().listen(0, '127.0.0.1', () => {
          const p = (srv.address() as { port: number }).port;
          srv.close(() => resolve(p));
        });
      });
      const id = sha256('x');
      const down = await storeError(store('', { endpoint: `http://127.0.0.1:${port}` }).readPublished(id));
      expect(down.code).toBe('io');
      expect(down.message).toContain(`GetObject s3://${bucket}/published/${id}.json at http://127.0.0.1:${port}: no HTTP response: `);
      expect(down.message).toContain('ECONNREFUSED');

      const noBucket = await storeError(store('', {}, 'sbx-no-such-bucket').listManifests());
      expect(noBucket.code).toBe('io');
      expect(noBucket.message).toBe(`ListObjectsV2 s3://sbx-no-such-bucket/manifests/ at ${env.AWS_ENDPOINT_URL}: HTTP 404 NoSuchBucket`);

      const badKeys = await storeError(store('', { credentials: { accessKeyId: env.AWS_ACCESS_KEY_ID, secretAccessKey: 'wrong' } }).readPublished(id));
      expect(badKeys.code).toBe('io');
      expect(badKeys.message).toContain(`GetObject s3://${bucket}/published/${id}.json at ${env.AWS_ENDPOINT_URL}: HTTP 403 SignatureDoesNotMatch`);
    });

    describe('what this server checks itself (why we send Content-MD5 and re-hash on our side)', () => {
      it('refuses a wrong Content-MD5 with 400 BadDigest and stores nothing', async () => {
        const Key = 'raw/bad-md5';
        const err = await raw
          .send(
            new PutObjectCommand({
              Bucket: bucket,
              Key,
              Body: Buffer.from('the bytes sent'),
              ContentMD5: createHash('md5').update('other bytes').digest('base64'),
            }),
          )
          .then(
            () => null,
            (e: { name: string; $metadata: { httpStatusCode: number } }) => e,
          );
        expect([err?.name, err?.$metadata.httpStatusCode]).toEqual(['BadDigest', 400]);
        const after = await raw.send(new GetObjectCommand({ Bucket: bucket, Key })).then(
          () => 200,
          (e: { $metadata: { httpStatusCode: number } }) => e.$metadata.httpStatusCode,
        );
        expect(after).toBe(404);
      });

      it('accepts a wrong x-amz-checksum-sha256 (radosgw 16 ignores it) and returns none', async () => {
        const Key = 'raw/bad-sha256';
        await raw.send(
          new PutObjectCommand({
            Bucket: bucket,
            Key,
            Body: Buffer.from('the bytes sent'),
            ChecksumSHA256: createHash('sha256').update('other bytes').digest('base64'),
          }),
        );
        const head = await raw.send(new HeadObjectCommand({ Bucket: bucket, Key, ChecksumMode: 'ENABLED' }));
        expect(head.ChecksumSHA256).toBeUndefined();
      });

      it('ignores If-None-Match: * on a versioned bucket (a second version; why S3Store looks first) and honours it unversioned (412)', async () => {
        const put = (Bucket: string) =>
          raw.send(new PutObjectCommand({ Bucket, Key: 'raw/inm', Body: 'x', IfNoneMatch: '*' })).then(
            () => 200,
            (e: { $metadata: { httpStatusCode: number } }) => e.$metadata.httpStatusCode,
          );
        expect([await put(bucket), await put(bucket)]).toEqual([200, 200]);
        const versions = await raw.send(new ListObjectVersionsCommand({ Bucket: bucket, Prefix: 'raw/inm' }));
        expect(versions.Versions).toHaveLength(2);
        expect([await put(UNVERSIONED), await put(UNVERSIONED)]).toEqual([200, 412]);
      });
    });

    it('a task close killed between the local and the remote published record: resumed, the remote record is put; one published checkpoint for the attempt in S3', async () => {
      const d = new TestDaemon({ cgroupPrefix: 'sbx-test-ws-' });
      try {
        const ws = join(d.dir, 'ws');
        mkdirSync(ws);
        d.withConfig({ workspace: { paths: [ws] }, checkpoint: { store: `s3://${bucket}/task-crash/` } }).withEnv({
          SBX_FAULT_POINT: 'checkpoint:after-local-published',
        });
        await d.start();
        expect((await d.sbx(['run', '--task', 'T', '--', 'sh', '-c', `echo s3 > ${ws}/f`])).status).toBe(0);
        expect((await d.sbx(['close', '--task', 'T', '--workspace', ws])).status).toBe(125);
        expect(await d.exitedNow()).toEqual({ code: null, signal: 'SIGKILL' });
        const published = async () =>
          ((await raw.send(new ListObjectsV2Command({ Bucket: bucket, Prefix: 'task-crash/published/' }))).Contents ?? []).map((o) => o.Key!);
        expect(await published()).toEqual([]); // killed before the remote record
        await d.withEnv(undefined).start();
        const r = await d.sbx(['close', '--task', 'T', '--workspace', ws]);
        expect(r.stderr.toString()).toBe('');
        expect(r.status).toBe(0);
        const receipt = JSON.parse(r.stdout.toString()) as { attempt: number; checkpoints: { checkpoint_id: string }[] };
        expect(receipt.attempt).toBe(1);
        expect(await published()).toEqual([`task-crash/published/${receipt.checkpoints[0].checkpoint_id}.json`]);
      } finally {
        await d.stop();
      }
    });

    it('a supervisor with checkpoint.store s3://: checkpoint, re-checkpoint without a PUT, restore elsewhere from S3 alone byte for byte, a tampered object caught', async () => {
      const d = new TestDaemon({ cgroupPrefix: 'sbx-test-ws-' });
      try {
        const ws = join(d.dir, 'ws');
        mkdirSync(ws);
        writeFileSync(join(ws, 'binary'), seeded('s3-roundtrip', 300_000));
        writeFileSync(join(ws, 'empty'), '');
        writeFileSync(join(ws, 'new\nline'), 'x');
        symlinkSync('/etc/passwd', join(ws, 'abs'));
        expect(spawnSync('mkfifo', [join(ws, 'fifo')]).status).toBe(0);
        d.withConfig({ workspace: { paths: [ws] }, checkpoint: { store: `s3://${bucket}/rt/` } });
        await d.start();
        const source = pythonTreeListing(ws);
        const r = await d.sbx(['checkpoint', '--workspace', ws, '--json']);
        expect(r.stderr.toString()).toBe('');
        expect(r.status).toBe(0);
        const ck = JSON.parse(r.stdout.toString());
        expect(ck).toMatchObject({
          store: `s3://${bucket}/rt/`,
          consistent: true,
          objects: { referenced: 3, written: 3 },
          read_back: { objects: 3, bytes: 300_001, trees: { objects: 1, rehashed_objects: 1 } },
        });
        const id = ck.checkpoint_id as string;
        const keys = async () => (await raw.send(new ListObjectVersionsCommand({ Bucket: bucket, Prefix: 'rt/' }))).Versions!.map((v) => v.Key!).sort();
        const first = await keys();
        expect(first).toEqual(
          [
            // The three files' objects and the root tree's (the manifest's scan digest names it).
            ...[sha256(seeded('s3-roundtrip', 300_000)), sha256(''), sha256('x'), ck.scan.digest.replace('sha256:', '')].map(
              (h: string) => `rt/objects/${h.slice(0, 2)}/${h}`,
            ),
            `rt/manifests/${id}.json`,
            `rt/published/${id}.json`,
          ].sort(),
        );
        // Unchanged: no object is PUT again (one version each); only the new manifest and its record.
        const again = JSON.parse((await d.sbx(['checkpoint', '--workspace', ws, '--json'])).stdout.toString());
        expect(again.objects.written).toBe(0);
        expect((await keys()).filter((k) => k.includes('/objects/'))).toEqual(first.filter((k) => k.includes('/objects/')));
        // Another machine: the supervisor stopped, its local store gone; only S3 and the public key.
        await d.terminate();
        const key = join(d.dir, 'receipt-key.pub');
        writeFileSync(key, readFileSync(join(d.stateDir, 'receipt-key.pub')));
        rmSync(join(d.stateDir, 'checkpoints'), { recursive: true });
        const target = join(d.dir, 'elsewhere');
        const rs = await d.sbx(['restore', id, target, '--store', `s3://${bucket}/rt/`, '--public-key', key]);
        expect(rs.stderr.toString()).toBe('');
        expect(rs.stdout.toString()).toContain('OK: the restored tree is identical to the manifest');
        expect(rs.status).toBe(0);
        expect(pythonTreeListing(target)).toEqual(source);
        // A new version of one object with other bytes (the bucket keeps both): our re-hash catches it.
        const sha = sha256('x');
        await raw.send(new PutObjectCommand({ Bucket: bucket, Key: `rt/objects/${sha.slice(0, 2)}/${sha}`, Body: 'y' }));
        const v = await d.sbx(['verify', id, '--store', `s3://${bucket}/rt/`, '--public-key', key]);
        expect(v.status).toBe(1);
        expect(v.stdout.toString()).toContain(`MISMATCH: object ${sha} (new\nline): its bytes hash to ${sha256('y')}: changed in the store`);
        const rs2 = await d.sbx(['restore', id, join(d.dir, 'elsewhere2'), '--store', `s3://${bucket}/rt/`, '--public-key', key]);
        expect(rs2.status).toBe(125);
        expect(rs2.stderr.toString()).toContain(`object ${sha}`);
        // The next checkpoint reads the bad version back, uploads the good bytes again (its local
        // store has them once more), and publishes; the old checkpoint verifies again too.
        await d.start();
        const repaired = await d.sbx(['checkpoint', '--workspace', ws, '--json']);
        expect(repaired.status).toBe(0);
        expect(JSON.parse(repaired.stdout.toString()).objects).toMatchObject({ written: 3, uploaded: 1, repaired: 1 }); // the local store was new; the bucket had them but one
        expect(d.log()).toContain('uploaded again from the local store');
        expect((await d.sbx(['verify', id, '--store', `s3://${bucket}/rt/`, '--public-key', key])).status).toBe(0);
      } finally {
        await d.stop();
      }
    });
  },
);
