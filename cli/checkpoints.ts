// sbx's offline checkpoint commands (restore, verify of a manifest), loaded by sbx.ts only when
// one runs: they read the store directly (the state dir's checkpoints/, another directory, or
// s3://), so they work with the supervisor stopped, and cost `sbx run` nothing. Owns their
// output and exit statuses (0 all holds, 1 restored or read but differs, 125 could not).
import { existsSync, readFileSync } from 'node:fs';
import { basename, join, resolve as resolvePath } from 'node:path';
import { STATE } from '../ipc/state-layout.js';
import { LocalStore } from '../supervisor/checkpoint/local-store.js';
import { normaliseId } from '../supervisor/checkpoint/manifest.js';
import { RestoreError, restoreCheckpoint } from '../supervisor/checkpoint/restore.js';
import { type CheckpointStore, parseStoreUrl, type StoreUrl } from '../supervisor/checkpoint/store.js';
import { verifyCheckpoint } from '../supervisor/checkpoint/verify.js';

export interface StoreOptions {
  stateDir: string;
  /** A directory or s3://bucket/prefix (default: <stateDir>/checkpoints). */
  store?: string;
  key?: string;
  json?: boolean;
}

function fail(message: string): never {
  process.stderr.write(`sbx: ${message}\n`);
  process.exit(125);
}

/** The store named by the options; an S3 one takes endpoint and credentials from the AWS environment. */
export async function openStore(o: StoreOptions): Promise<CheckpointStore> {
  let url: StoreUrl;
  try {
    url = parseStoreUrl(o.store ?? '', join(o.stateDir, STATE.checkpointsDir));
  } catch (err) {
    fail(`INVALID_ARGUMENT: --store: ${(err as Error).message}`);
  }
  if (url.kind === 'local') {
    if (!existsSync(url.dir)) fail(`no checkpoint store at ${url.dir} (give --state-dir DIR or --store DIR|s3://bucket/prefix)`);
    return new LocalStore(url.dir, false);
  }
  const { S3Store } = await import('../supervisor/checkpoint/s3-store.js');
  return new S3Store(url, {});
}

/** The full id of a checkpoint given as hex (or sha256:hex), or a unique prefix of at least 8 digits. */
export async function resolveId(store: CheckpointStore, text: string): Promise<string> {
  const id = normaliseId(text);
  if (!id) fail(`INVALID_ARGUMENT: ${JSON.stringify(text)} is not a checkpoint id (64 hex digits, or a unique prefix of 8 or more)`);
  if (id.length === 64) return id;
  if (id.length < 8) fail(`INVALID_ARGUMENT: ${JSON.stringify(text)}: give at least 8 hex digits of the checkpoint id`);
  let all: string[];
  try {
    all = await store.listManifests();
  } catch (err) {
    fail(`cannot list the checkpoints in ${store.location}: ${(err as Error).message}`);
  }
  const matches = all.filter((m) => m.startsWith(id));
  if (matches.length === 1) return matches[0];
  fail(matches.length === 0 ? `no checkpoint ${id}… in ${store.location}` : `${id}… is ambiguous in ${store.location}: ${matches.join(', ')}`);
}

function publicKey(o: StoreOptions): string | undefined {
  const file = o.key ?? join(o.stateDir, 'receipt-key.pub');
  if (!o.key && !existsSync(file)) return undefined;
  try {
    return readFileSync(file, 'utf8');
  } catch (err) {
    fail(`INVALID_ARGUMENT: cannot read the public key ${file} (give --key FILE): ${(err as Error).message}`);
  }
}

/** sbx restore ID DIR. */
export async function restoreCommand(idText: string, dir: string, o: StoreOptions): Promise<void> {
  const store = await openStore(o);
  const id = await resolveId(store, idText);
  const key = publicKey(o);
  if (!key) fail(`no public key to check the manifest's signature (${join(o.stateDir, 'receipt-key.pub')} is absent): give --key FILE`);
  let result;
  try {
    result = await restoreCheckpoint(store, id, resolvePath(dir), { publicKeyPem: key });
  } catch (err) {
    if (err instanceof RestoreError) fail(`restore: ${err.message}`);
    throw err;
  }
  if (o.json) process.stdout.write(JSON.stringify(result, null, 2) + '\n');
  else {
    process.stdout.write(`restored checkpoint ${id} into ${result.target}: ${result.entries} entries, ${result.files} files, ${result.bytes} bytes in ${result.ms} ms\n`);
    if (result.owners_not_given) process.stderr.write(`sbx: ${result.owners_not_given} entries could not be given their recorded owner (not root)${result.setid_dropped.length ? `; set-user-ID/set-group-ID dropped on ${result.setid_dropped.length}: ${result.setid_dropped.slice(0, 5).join(', ')}` : ''}\n`);
    if (result.identical) process.stdout.write('OK: the restored tree is identical to the manifest\n');
    else for (const d of result.differences.slice(0, 50)) process.stdout.write(`DIFFERS: ${d}\n`);
  }
  process.exitCode = result.identical ? 0 : 1;
}

/** sbx verify of a checkpoint manifest: a file (MANIFEST.json) or an id in the store. */
export async function verifyManifestCommand(arg: string, bytes: Buffer | null, o: StoreOptions & { withStore: boolean }): Promise<void> {
  const store = o.withStore || !bytes ? await openStore(o) : undefined;
  let expectId: string | undefined;
  if (!bytes) {
    expectId = await resolveId(store!, arg);
    try {
      bytes = await store!.readManifest(expectId);
    } catch (err) {
      fail(`verify: ${(err as Error).message}`);
    }
  } else {
    const named = normaliseId(basename(arg).replace(/\.json$/, ''));
    if (named.length === 64) expectId = named;
  }
  const key = publicKey(o);
  if (!key) fail(`no public key to check the signature (${join(o.stateDir, 'receipt-key.pub')} is absent): give --key FILE`);
  const v = await verifyCheckpoint(bytes, key, store, expectId);
  if (o.json) process.stdout.write(JSON.stringify({ ok: v.problems.length === 0, checkpoint_id: v.id, objects: v.objects, bytes: v.bytes, problems: v.problems }, null, 2) + '\n');
  else if (v.problems.length === 0) {
    process.stdout.write(`OK: checkpoint ${v.id} signed by ${v.manifest!.signature!.key_id}${store ? `; published; ${v.objects} objects (${v.bytes} bytes) re-hashed from ${store.location}` : ''}\n`);
  } else for (const p of v.problems) process.stdout.write(`MISMATCH: ${p}\n`);
  process.exitCode = v.problems.length === 0 ? 0 : 1;
}
