// The S3 checkpoint store (`checkpoint.store: "s3://bucket/prefix"`): create-once PUTs (If-None-Match: *),
// manifests read back by version id and If-Match on the ETag. Owns the key layout and the mapping of S3
// errors to StoreError; not the hashing of what it reads (the caller re-hashes every byte: radosgw ignores
// checksums). The only module that imports the AWS SDK (others import this one dynamically, for s3:// only).
// Leans on: S3 API PutObject (conditional writes), GetObject, ListObjectsV2; RFC 1864 (Content-MD5).
import { createHash } from 'node:crypto';
import { constants as fsConstants } from 'node:fs';
import { open, type FileHandle } from 'node:fs/promises';
import type { Readable } from 'node:stream';
import {
  DeleteObjectCommand,
  GetObjectCommand,
  HeadObjectCommand,
  ListObjectsV2Command,
  PutObjectCommand,
  S3Client,
  type GetObjectCommandOutput,
  type PutObjectCommandInput,
  type PutObjectCommandOutput,
} from '@aws-sdk/client-s3';
import { isSha256Hex, StoreError, type CheckpointStore, type StoreUrl, type WrittenVersion } from './store.js';
import { systemError } from '../../ipc/errno.js';

/** How to reach the bucket; each unset one comes from the standard environment (see docs/guide/checkpoints.md, "S3 checkpoint store"). */
export interface S3StoreOptions {
  /** e.g. http://127.0.0.1:7480; default AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL, else AWS's own. */
  endpoint?: string;
  /** default AWS_REGION, else AWS_DEFAULT_REGION, else us-east-1. */
  region?: string;
  /** Path-style URLs (endpoint/bucket/key); default true when an endpoint is set (S3-compatible servers), else false. */
  forcePathStyle?: boolean;
  /** Explicit keys; default the SDK's standard chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, profile, web identity, instance role). */
  credentials?: { accessKeyId: string; secretAccessKey: string; sessionToken?: string };
  /** Connect timeout (default 10 s) and socket idle timeout (default 60 s) of each request. */
  connectTimeoutMs?: number;
  idleTimeoutMs?: number;
  /**
   * Look before creating (default true): a HEAD (a GET for a manifest) before each create-once
   * PUT, so what is there is not uploaded again, and so a server that ignores If-None-Match
   * (radosgw 16 on a versioned bucket adds a version) does not store it twice. false: PUT
   * straight away and rely on the server's 412 (AWS S3, MinIO, radosgw unversioned).
   */
  checkBeforePut?: boolean;
  /** Where the endpoint and region defaults are read (default process.env; the credential chain always reads process.env). */
  env?: NodeJS.ProcessEnv;
}

type S3Url = Extract<StoreUrl, { kind: 's3' }>;

const ATTEMPTS = 3;
const READ_BYTES = 1 << 20;

export class S3Store implements CheckpointStore {
  readonly location: string;
  readonly endpoint: string | undefined;
  private readonly client: S3Client;
  private readonly bucket: string;
  private readonly prefix: string;
  private readonly checkBeforePut: boolean;

  constructor(url: S3Url, opts: S3StoreOptions = {}) {
    const env = opts.env ?? process.env;
    // The pinned SDK warns on every client that its releases from 2027 need Node 22; this one
    // runs on Node 20 as pinned, and the warning filled every sbx command's stderr.
    process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= 'true';
    this.bucket = url.bucket;
    this.prefix = url.prefix;
    this.checkBeforePut = opts.checkBeforePut ?? true;
    this.location = `s3://${url.bucket}/${url.prefix}`;
    const ignoreEnvEndpoint = (env.AWS_IGNORE_CONFIGURED_ENDPOINT_URLS ?? '').toLowerCase() === 'true';
    this.endpoint = opts.endpoint || (ignoreEnvEndpoint ? undefined : env.AWS_ENDPOINT_URL_S3 || env.AWS_ENDPOINT_URL) || undefined;
    this.client = new S3Client({
      endpoint: this.endpoint,
      region: opts.region || env.AWS_REGION || env.AWS_DEFAULT_REGION || 'us-east-1',
      forcePathStyle: opts.forcePathStyle ?? this.endpoint !== undefined,
      credentials: opts.credentials,
      // Only what S3 requires: our own Content-MD5 and SHA-256 go on every PUT; the SDK's
      // default (a CRC32 trailer on streamed bodies) makes radosgw answer 411.
      requestChecksumCalculation: 'WHEN_REQUIRED',
      responseChecksumValidation: 'WHEN_REQUIRED',
      // Retries are ours (a file body must be reopened for each attempt).
      maxAttempts: 1,
      // Quiet: without a logger the SDK writes to the console (e.g. on every 412 of a streamed
      // PUT, an expected answer here); each failure reaches the caller as a StoreError.
      logger: { debug() {}, info() {}, warn() {}, error() {} },
      requestHandler: { connectionTimeout: opts.connectTimeoutMs ?? 10_000, socketTimeout: opts.idleTimeoutMs ?? 60_000 },
    });
  }

  /** Closes the client's kept-alive connections; the store is unusable afterwards. */
  close(): void {
    this.client.destroy();
  }

  /** Key of an object (`<prefix>objects/<first 2 hex>/<sha256>`), a manifest or a published record. */
  objectKey(sha256: string): string {
    return `${this.prefix}objects/${sha256.slice(0, 2)}/${sha256}`;
  }
  manifestKey(id: string): string {
    return `${this.prefix}manifests/${id}.json`;
  }
  publishedKey(id: string): string {
    return `${this.prefix}published/${id}.json`;
  }

  /**
   * PUTs the file (hashed first: it must hash to sha256 and hold size bytes, else StoreError io
   * and nothing is sent) with If-None-Match: *; there already (HEAD, or a 412) → stored: false.
   */
  async putObject(sha256: string, file: string, size: number): Promise<{ stored: boolean }> {
    const key = this.objectKey(checkSha(sha256, 'object'));
    if (this.checkBeforePut && (await this.exists(key))) return { stored: false };
    return this.upload(sha256, key, file, size, true);
  }

  /**
   * Uploads the object again over what its key holds (no If-None-Match): for an object whose
   * bytes in the bucket failed a read-back (damaged, or another version put there), from a local
   * file that hashes to its name (checked first, as for putObject). A versioned bucket keeps the
   * bad version too; the current one is good again.
   */
  async replaceObject(sha256: string, file: string, size: number): Promise<void> {
    await this.upload(sha256, this.objectKey(checkSha(sha256, 'object')), file, size, false);
  }

  /** Deletes a manifest that was never published (its read-back failed); a versioned bucket keeps it behind a delete marker. */
  async deleteManifest(id: string): Promise<void> {
    const key = this.manifestKey(checkSha(id, 'manifest'));
    await this.attempt('DeleteObject', key, () => this.client.send(new DeleteObjectCommand({ Bucket: this.bucket, Key: key })));
  }

  /** One PUT of the file, with Content-MD5 and x-amz-checksum-sha256; conditional: If-None-Match: * (create-once). */
  private async upload(sha256: string, key: string, file: string, size: number, conditional: boolean): Promise<{ stored: boolean }> {
    let fh: FileHandle;
    try {
      fh = await open(file, fsConstants.O_RDONLY | fsConstants.O_NOFOLLOW | fsConstants.O_NONBLOCK); // a fifo must not block the open
    } catch (err) {
      const e = systemError(err);
      throw new StoreError(e.code === 'ELOOP' ? 'refused' : 'io', `object ${sha256} for ${this.where(key)}: open ${file}: ${e.message}`, key);
    }
    try {
      const st = await fh.stat();
      if (!st.isFile()) throw new StoreError('refused', `object ${sha256} for ${this.where(key)}: ${file} is not a regular file`, key);
      const digest = await digestFile(fh);
      if (digest.bytes !== size || digest.sha256.toString('hex') !== sha256) {
        throw new StoreError(
          'io',
          `object ${sha256} for ${this.where(key)}: ${file} holds ${digest.bytes} bytes hashing to ${digest.sha256.toString('hex')}, not ${size} bytes hashing to ${sha256}; not uploaded`,
          key,
        );
      }
      const input = (): PutObjectCommandInput => ({
        Bucket: this.bucket,
        Key: key,
        ...(conditional ? { IfNoneMatch: '*' } : {}),
        ContentLength: size,
        ContentMD5: digest.md5.toString('base64'),
        ChecksumSHA256: digest.sha256.toString('base64'),
        ContentType: 'application/octet-stream',
        // A stream per attempt, from offset 0 of the file opened above (never re-opened by name).
        Body: size === 0 ? Buffer.alloc(0) : fh.createReadStream({ start: 0, end: size - 1, autoClose: false, highWaterMark: READ_BYTES }),
      });
      return { stored: (await this.createOnce(key, input)) !== null };
    } finally {
      await fh.close().catch(() => {});
    }
  }

  /** The object's bytes, streamed; StoreError missing (no such key) or io (anything else, a short body included). */
  async *readObject(sha256: string): AsyncIterable<Uint8Array> {
    const key = this.objectKey(checkSha(sha256, 'object'));
    const res = await this.get(key);
    const body = res.Body as Readable | undefined;
    if (!body) throw new StoreError('io', `GetObject ${this.where(key)}: HTTP ${res.$metadata.httpStatusCode} with no body`, key);
    let bytes = 0;
    try {
      for await (const chunk of body) {
        bytes += (chunk as Uint8Array).length;
        yield chunk as Uint8Array;
      }
    } catch (err) {
      if (err instanceof StoreError) throw err;
      throw new StoreError('io', `GetObject ${this.where(key)}: body failed after ${bytes} bytes: ${describe(err)}`, key);
    } finally {
      body.destroy();
    }
    if (res.ContentLength !== undefined && bytes !== res.ContentLength) {
      throw new StoreError('io', `GetObject ${this.where(key)}: ${bytes} bytes received of ${res.ContentLength}`, key);
    }
  }

  /** Creates manifests/<id>.json; there already with the same bytes → its version; with other bytes → StoreError conflict. */
  async putManifest(id: string, bytes: Buffer): Promise<WrittenVersion> {
    const key = this.manifestKey(checkSha(id, 'manifest'));
    const there = this.checkBeforePut
      ? await this.get(key).catch((err) => {
          if (err instanceof StoreError && err.code === 'missing') return null;
          throw err;
        })
      : null;
    if (there) return this.sameManifest(key, there, bytes);
    const put = await this.createOnceVersion(key, bytes, 'application/json');
    return put ?? this.sameManifest(key, await this.get(key), bytes);
  }

  /** The version of the manifest found at key when it holds exactly bytes, else StoreError conflict. */
  private async sameManifest(key: string, res: GetObjectCommandOutput, bytes: Buffer): Promise<WrittenVersion> {
    const existing = await bodyBytes(res, key, this.where(key));
    if (!existing.equals(bytes)) {
      throw new StoreError(
        'conflict',
        `PutObject ${this.where(key)}: a different manifest (${existing.length} bytes, sha256 ${sha256Hex(existing)}) holds this id`,
        key,
      );
    }
    return { etag: res.ETag ?? null, versionId: res.VersionId ?? null };
  }

  /** The manifest's bytes; with version: that version id and If-Match on its ETag (412 or another ETag → conflict); none → missing. */
  async readManifest(id: string, version?: WrittenVersion): Promise<Buffer> {
    const key = this.manifestKey(checkSha(id, 'manifest'));
    let res: GetObjectCommandOutput;
    try {
      res = await this.get(key, version);
    } catch (err) {
      if (err instanceof StoreError && err.code === 'conflict') {
        throw new StoreError(
          'conflict',
          `the manifest read back is not the version written (ETag ${version?.etag}, version ${version?.versionId ?? 'none'}): ${err.message}`,
          key,
        );
      }
      if (err instanceof StoreError && err.code === 'missing' && version?.versionId) {
        throw new StoreError('missing', `manifest ${id}, version ${version.versionId}: ${err.message}`, key);
      }
      throw err;
    }
    // A server that ignored If-Match (s3rver does) still cannot pass another version off as this one.
    if (version?.etag && res.ETag !== version.etag) {
      throw new StoreError(
        'conflict',
        `the manifest read back is not the version written: GetObject ${this.where(key)} returned ETag ${res.ETag}, written ${version.etag}`,
        key,
      );
    }
    if (version?.versionId && res.VersionId !== version.versionId) {
      throw new StoreError(
        'conflict',
        `the manifest read back is not the version written: GetObject ${this.where(key)} returned version ${res.VersionId}, written ${version.versionId}`,
        key,
      );
    }
    return bodyBytes(res, key, this.where(key));
  }

  /** Creates published/<id>.json; there already: no-op. */
  async putPublished(id: string, bytes: Buffer): Promise<void> {
    const key = this.publishedKey(checkSha(id, 'checkpoint'));
    if (this.checkBeforePut && (await this.exists(key))) return;
    await this.createOnceVersion(key, bytes, 'application/json');
  }

  /** The published record's bytes, or null when there is none. */
  async readPublished(id: string): Promise<Buffer | null> {
    const key = this.publishedKey(checkSha(id, 'checkpoint'));
    try {
      const res = await this.get(key);
      return await bodyBytes(res, key, this.where(key));
    } catch (err) {
      if (err instanceof StoreError && err.code === 'missing') return null;
      throw err;
    }
  }

  /** Ids of the manifests under <prefix>manifests/ (keys not named <sha256>.json are skipped). */
  async listManifests(): Promise<string[]> {
    const dir = `${this.prefix}manifests/`;
    const ids: string[] = [];
    let token: string | undefined;
    do {
      const page = await this.attempt('ListObjectsV2', dir, () =>
        this.client.send(new ListObjectsV2Command({ Bucket: this.bucket, Prefix: dir, ContinuationToken: token })),
      );
      for (const o of page.Contents ?? []) {
        const m = /^([0-9a-f]{64})\.json$/.exec(o.Key?.slice(dir.length) ?? '');
        if (m && o.Key?.startsWith(dir)) ids.push(m[1]);
      }
      token = page.IsTruncated ? page.NextContinuationToken : undefined;
    } while (token);
    return ids;
  }

  /** PUT If-None-Match: * of small bytes; the version written, or null when the key was there already (412). */
  private async createOnceVersion(key: string, bytes: Buffer, contentType: string): Promise<WrittenVersion | null> {
    const res = await this.createOnce(key, () => ({
      Bucket: this.bucket,
      Key: key,
      IfNoneMatch: '*',
      ContentLength: bytes.length,
      ContentMD5: createHash('md5').update(bytes).digest('base64'),
      ChecksumSHA256: createHash('sha256').update(bytes).digest('base64'),
      ContentType: contentType,
      Body: bytes,
    }));
    return res && { etag: res.ETag ?? null, versionId: res.VersionId ?? null };
  }

  /** Sends a create-once PUT (fresh input per attempt); its response, or null on 412 (the key exists). */
  private async createOnce(key: string, input: () => PutObjectCommandInput): Promise<PutObjectCommandOutput | null> {
    try {
      return await this.attempt('PutObject', key, () => this.client.send(new PutObjectCommand(input())));
    } catch (err) {
      if (err instanceof StoreError && err.code === 'conflict') return null; // 412: present already
      throw err;
    }
  }

  /** HeadObject: true when the key has a current version, false on 404. */
  private async exists(key: string): Promise<boolean> {
    try {
      await this.attempt('HeadObject', key, () => this.client.send(new HeadObjectCommand({ Bucket: this.bucket, Key: key })));
      return true;
    } catch (err) {
      if (err instanceof StoreError && err.code === 'missing') return false;
      throw err;
    }
  }

  /** GetObject (with VersionId and If-Match when given); S3 errors as StoreError. */
  private get(key: string, version?: WrittenVersion): Promise<GetObjectCommandOutput> {
    return this.attempt('GetObject', key, () =>
      this.client.send(
        new GetObjectCommand({
          Bucket: this.bucket,
          Key: key,
          IfMatch: version?.etag ?? undefined,
          VersionId: version?.versionId ?? undefined,
          // Real S3 returns the SHA-256 sent on PUT and the SDK checks it; radosgw returns none.
          ChecksumMode: 'ENABLED',
        }),
      ),
    );
  }

  /** Runs one S3 call, retrying what S3 says to retry (no response, 5xx, SlowDown, 409 ConditionalRequestConflict); failures become StoreError. */
  private async attempt<T>(op: string, key: string, call: () => Promise<T>): Promise<T> {
    for (let n = 1; ; n++) {
      try {
        return await call();
      } catch (err) {
        const e = toStoreError(err, `${op} ${this.where(key)}`, key);
        if (n >= ATTEMPTS || !retryable(err)) throw e;
        await new Promise((r) => setTimeout(r, 100 * 4 ** (n - 1)));
      }
    }
  }

  private where(key: string): string {
    return `s3://${this.bucket}/${key}${this.endpoint ? ` at ${this.endpoint}` : ''}`;
  }
}

interface SdkError {
  name?: string;
  code?: string;
  message?: string;
  $metadata?: { httpStatusCode?: number };
  $response?: unknown;
}

/** An SDK failure as a StoreError: 404 NoSuchKey/NotFound/NoSuchVersion → missing, 412 → conflict, the rest → io; the message names the call, bucket/key and HTTP status. */
function toStoreError(err: unknown, what: string, key: string): StoreError {
  if (err instanceof StoreError) return err;
  const e = (err ?? {}) as SdkError;
  const status = e.$metadata?.httpStatusCode;
  const name = e.name ?? 'Error';
  if (status === undefined) return new StoreError('io', `${what}: no HTTP response: ${describe(err)}`, key);
  const text = `${what}: HTTP ${status} ${name}${e.message && e.message !== name && e.message !== 'UnknownError' ? `: ${e.message}` : ''}`;
  if (status === 412) return new StoreError('conflict', text, key);
  if (status === 404 && name !== 'NoSuchBucket') return new StoreError('missing', text, key);
  return new StoreError('io', text, key);
}

function retryable(err: unknown): boolean {
  const e = (err ?? {}) as SdkError;
  const status = e.$metadata?.httpStatusCode;
  if (err instanceof StoreError) return false;
  if (status === undefined) return e.name !== 'CredentialsProviderError' && e.name !== 'AbortError';
  return status >= 500 || status === 429 || e.name === 'SlowDown' || e.name === 'ConditionalRequestConflict';
}

function describe(err: unknown): string {
  const e = (err ?? {}) as SdkError;
  return e.code && !String(e.message).includes(e.code) ? `${e.code}: ${e.message}` : `${e.name ?? 'Error'}: ${e.message ?? String(err)}`;
}

function checkSha(s: string, what: string): string {
  if (!isSha256Hex(s)) throw new StoreError('io', `${what} id ${JSON.stringify(s)} is not a lowercase hex SHA-256`);
  return s;
}

function sha256Hex(b: Buffer): string {
  return createHash('sha256').update(b).digest('hex');
}

/** MD5 and SHA-256 of the whole file, read from offset 0 (pread: the handle's position is untouched). */
async function digestFile(fh: FileHandle): Promise<{ md5: Buffer; sha256: Buffer; bytes: number }> {
  const md5 = createHash('md5');
  const sha = createHash('sha256');
  const buf = Buffer.allocUnsafe(READ_BYTES);
  let bytes = 0;
  for (;;) {
    const { bytesRead } = await fh.read(buf, 0, buf.length, bytes);
    if (bytesRead === 0) break;
    md5.update(buf.subarray(0, bytesRead));
    sha.update(buf.subarray(0, bytesRead));
    bytes += bytesRead;
  }
  return { md5: md5.digest(), sha256: sha.digest(), bytes };
}

/** A small GetObject body as one Buffer (manifests, published records). */
async function bodyBytes(res: GetObjectCommandOutput, key: string, where: string): Promise<Buffer> {
  if (!res.Body) throw new StoreError('io', `GetObject ${where}: HTTP ${res.$metadata.httpStatusCode} with no body`, key);
  try {
    return Buffer.from(await res.Body.transformToByteArray());
  } catch (err) {
    throw new StoreError('io', `GetObject ${where}: body failed: ${describe(err)}`, key);
  }
}
