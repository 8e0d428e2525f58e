// sbx's offline checkpoint commands (restore, checkpoints, diff, verify of a manifest), loaded by
// sbx.ts only when one runs: they read the store directly (the state dir's checkpoints/,
// another directory, or s3://), so they work with the supervisor stopped, and cost `sbx run`
// nothing. Owns their output and exit statuses (0 all holds, 1 restored or read but differs,
// 125 could not).
import { existsSync, readFileSync, realpathSync, statSync } from 'node:fs';
import { basename, join, resolve as resolvePath } from 'node:path';
import { STATE } from '../core/state/names.js';
import { LocalStore } from '../core/checkpoint/local-store.js';
import { STORE_DIRS } from '../core/state/names.js';
import { checkManifestHead, checkPublished, normaliseId, type PublishedRecord } from '../core/checkpoint/manifest.js';
import { removeRestoreTemp, restoreCheckpoint, showDifference } from '../core/checkpoint/restore.js';
import { type CheckpointStore, parseStoreUrl, type StoreUrl } from '../core/checkpoint/store.js';
import { verifyCheckpoint } from '../core/checkpoint/verify.js';
import { Progress } from './progress.js';
import { cleanupBeforeDying } from './signals.js';
import { escapeControls, warn } from './escape.js';
import { fail } from './fail.js';
import { errnoCode } from '../ipc/errno.js';

export interface StoreOptions {
  stateDir: string;
  /** Whether --state-dir was given (with --store it is refused: which store would be meant?). */
  stateDirGiven?: boolean;
  /** A directory or s3://bucket/prefix (default: <stateDir>/checkpoints). */
  store?: string;
  key?: string;
  json?: boolean;
}

const plural = (n: number, one: string, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;

/** The store named by the options; an S3 one takes endpoint and credentials from the AWS environment. */
export async function openStore(o: StoreOptions): Promise<CheckpointStore> {
  if (o.stateDirGiven && o.store) fail('INVALID_ARGUMENT: give --state-dir or --store, not both');
  let url: StoreUrl;
  try {
    url = parseStoreUrl(o.store ?? '', join(o.stateDir, STATE.checkpointsDir));
  } catch (err) {
    fail(`INVALID_ARGUMENT: --store: ${(err as Error).message}`);
  }
  if (url.kind === 'local') {
    try {
      statSync(join(url.dir, STORE_DIRS.objects));
    } catch (err) {
      const code = errnoCode(err);
      if (code === 'EACCES')
        fail(
          `PERMISSION_DENIED: cannot read the checkpoint store ${url.dir}: permission denied (a state dir is the supervisor's: run as its user, or give --store a copy you can read)`,
        );
      if (code !== 'ENOENT' && code !== 'ENOTDIR') fail(`INTERNAL: cannot read the checkpoint store ${url.dir}: ${(err as Error).message}`);
    }
    if (!existsSync(url.dir)) fail(`NOT_FOUND: no checkpoint store at ${url.dir} (give --state-dir DIR or --store DIR|s3://bucket/prefix)`);
    if (!existsSync(join(url.dir, STORE_DIRS.objects)) && existsSync(join(url.dir, STATE.checkpointsDir, STORE_DIRS.objects))) {
      fail(
        `INVALID_ARGUMENT: ${url.dir} is a state dir, not a checkpoint store: give --state-dir ${url.dir}, or --store ${join(url.dir, STATE.checkpointsDir)}`,
      );
    }
    if (!existsSync(join(url.dir, STORE_DIRS.objects)))
      fail(`INVALID_ARGUMENT: ${url.dir} is not a checkpoint store (it has no ${STORE_DIRS.objects}/: no checkpoint was ever stored there)`);
    return new LocalStore(url.dir, false);
  }
  const { S3Store } = await import('../core/checkpoint/s3-store.js');
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
    fail(`INTERNAL: cannot list the checkpoints in ${store.location}: ${(err as Error).message}`);
  }
  const matches = all.filter((m) => m.startsWith(id));
  if (matches.length === 1) return matches[0];
  fail(
    matches.length === 0
      ? `no checkpoint ${id}… in ${store.location} (sbx checkpoints lists them)`
      : `${id}… is ambiguous in ${store.location}: ${matches.join(', ')}`,
  );
}

function publicKey(o: StoreOptions): string | undefined {
  const file = o.key ?? join(o.stateDir, 'receipt-key.pub');
  if (!o.key && !existsSync(file)) return undefined;
  try {
    return readFileSync(file, 'utf8');
  } catch (err) {
    fail(`INVALID_ARGUMENT: cannot read the public key ${file} (give --public-key FILE): ${(err as Error).message}`);
  }
}

/** The warnings for a checkpoint that is not consistent: paths it holds in one of their states, and paths it does not hold at all (notCaptured). */
function warnUnstable(unstable: string[], notCaptured: string[]): void {
  const missing = new Set(notCaptured);
  const held = unstable.filter((p) => !missing.has(p));
  const list = (ps: string[]) => `${ps.slice(0, 5).join(', ')}${ps.length > 5 ? ', ...' : ''}`;
  if (held.length)
    warn(
      `warning: this checkpoint is not consistent: ${plural(held.length, 'path')} kept changing while it was taken (${list(held)}); their content is one of their states, not proven current`,
    );
  if (notCaptured.length)
    warn(
      `warning: this checkpoint is not consistent: ${plural(notCaptured.length, 'path')} not captured (${list(notCaptured)}): held by another process's write lease, or gone, while it was taken; not in it, so not restored`,
    );
}

/** sbx restore ID DIR. */
export async function restoreCommand(idText: string, dir: string, o: StoreOptions & { sameOwner?: boolean }): Promise<void> {
  const store = await openStore(o);
  const id = await resolveId(store, idText);
  const key = publicKey(o);
  if (!key)
    fail(`INVALID_ARGUMENT: no public key to check the manifest's signature (${join(o.stateDir, 'receipt-key.pub')} is absent): give --public-key FILE`);
  let result;
  const progress = new Progress(`restore ${id.slice(0, 16)}`);
  // Ended by a signal, the restore's temp directory (a remote store's trees) goes first; then sbx dies of it, as before.
  cleanupBeforeDying(['SIGINT', 'SIGTERM', 'SIGHUP'], removeRestoreTemp);
  try {
    result = await restoreCheckpoint(store, id, resolvePath(dir), {
      publicKeyPem: key,
      sameOwner: o.sameOwner,
      remote: store.location.startsWith('s3://'),
      onProgress: (p) => progress.counts(p),
    });
  } catch (err) {
    progress.done();
    fail(`restore: ${(err as Error).message}`);
  }
  progress.done();
  if (o.json) process.stdout.write(JSON.stringify(result, null, 2) + '\n');
  else {
    process.stdout.write(
      `restored checkpoint ${id} into ${result.target}: ${plural(result.entries, 'entry', 'entries')}, ${plural(result.files, 'file')}, ${result.bytes} bytes in ${result.ms} ms\n`,
    );
    if (result.owners === 'not_given')
      warn(
        `owners not given (${process.getuid?.() === 0 ? '--no-same-owner' : 'not root'}): every entry is the restorer's, uid and gid not compared${result.setid_dropped.length ? `; set-user-ID/set-group-ID dropped on ${plural(result.setid_dropped.length, 'entry', 'entries')}: ${result.setid_dropped.slice(0, 5).join(', ')}` : ''}`,
      );
    warnUnstable(result.unstable, result.not_captured);
    if (result.mounts_skipped.length)
      warn(
        `warning: ${plural(result.mounts_skipped.length, 'mount point')} inside the workspace ${result.mounts_skipped.length === 1 ? 'was' : 'were'} not entered when it was taken, restored as empty directories (what was mounted there is not in the checkpoint): ${result.mounts_skipped.slice(0, 5).join(', ')}${result.mounts_skipped.length > 5 ? ', ...' : ''}`,
      );
    if (result.identical) process.stdout.write('OK: the restored tree is identical to the manifest\n');
    else {
      for (const d of result.differences.slice(0, 50)) process.stdout.write(`DIFFERS: ${showDifference(d)}\n`);
      if (result.differences.length > 50) process.stdout.write(`DIFFERS: and ${result.differences.length - 50} more (--json lists them all)\n`);
    }
  }
  process.exitCode = result.identical ? 0 : 1;
}

/** sbx checkpoints: the published checkpoints in the store, oldest first. */
export async function listCommand(o: StoreOptions & { workspace?: string }): Promise<void> {
  const store = await openStore(o);
  let ids: string[];
  try {
    ids = await store.listManifests();
  } catch (err) {
    fail(`INTERNAL: cannot list the checkpoints in ${store.location}: ${(err as Error).message}`);
  }
  const key = publicKey(o);
  if (!key) fail(`INVALID_ARGUMENT: no public key to check what the store holds (${join(o.stateDir, 'receipt-key.pub')} is absent): give --public-key FILE`);
  const rows: {
    checkpoint_id: string;
    created_at: string;
    workspace: string;
    task: string | null;
    entries: number;
    bytes: number;
    consistent: boolean;
    boundary: unknown;
  }[] = [];
  const invalid: string[] = [];
  // As sbx checkpoint records it: the real path (a symlink to the workspace names it too).
  const workspaceFilter = o.workspace ? realOrResolved(o.workspace) : null;
  for (const id of ids) {
    const published = await store.readPublished(id).catch(() => null);
    if (!published) continue; // never published: claims nothing
    // Listed only when its record and manifest verify: anyone who can write the store could plant either.
    const bytes = await store.readManifest(id).catch(() => null);
    // Its own bytes and signature (which covers a version 2 manifest's root tree): the list needs no entry.
    const check = bytes ? checkManifestHead(bytes, { expectId: id, publicKeyPem: key }) : null;
    if (!check?.manifest || check.problems.length || checkPublished(published, id, key).length) {
      invalid.push(id);
      continue;
    }
    const m = check.manifest;
    const record = JSON.parse(published.toString('utf8')) as PublishedRecord;
    if (o.workspace && m.workspace !== workspaceFilter) continue;
    rows.push({
      checkpoint_id: id,
      created_at: m.created_at,
      workspace: m.workspace,
      task: record.task,
      entries: m.scan.entries,
      bytes: m.scan.bytes,
      consistent: m.consistent,
      boundary: m.boundary,
    });
  }
  rows.sort((a, b) => (a.created_at < b.created_at ? -1 : a.created_at > b.created_at ? 1 : 0));
  if (invalid.length)
    warn(
      `not listed: ${plural(invalid.length, 'id')} whose manifest or published record does not verify (sbx verify ID says why): ${invalid.slice(0, 5).join(', ')}`,
    );
  if (o.json) return void process.stdout.write(JSON.stringify(rows, null, 2) + '\n');
  if (rows.length === 0) return void process.stdout.write(`no published checkpoints in ${store.location}\n`);
  const table = [
    ['CHECKPOINT', 'CREATED', 'WORKSPACE', 'TASK', 'ENTRIES', 'BYTES', 'CONSISTENT'],
    ...rows.map((r) => [
      r.checkpoint_id.slice(0, 16),
      r.created_at,
      r.workspace,
      r.task ?? '-',
      String(r.entries),
      String(r.bytes),
      r.consistent ? 'yes' : 'NO',
    ]),
  ];
  const widths = table[0].map((_, i) => table.reduce((m, row) => Math.max(m, row[i].length), -Infinity));
  for (const row of table)
    process.stdout.write(
      row
        .map((c, i) => c.padEnd(widths[i]))
        .join('  ')
        .trimEnd() + '\n',
    );
}

/** path's real path when it exists, else path resolved (a workspace removed since keeps its name). */
function realOrResolved(path: string): string {
  try {
    return realpathSync(path);
  } catch {
    return resolvePath(path);
  }
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
  if (!key) fail(`INVALID_ARGUMENT: no public key to check the signature (${join(o.stateDir, 'receipt-key.pub')} is absent): give --public-key FILE`);
  const progress = new Progress(`verify ${(expectId ?? basename(arg)).slice(0, 16)}`);
  const v = await verifyCheckpoint(bytes, key, store, expectId, (p) => progress.counts(p));
  progress.done();
  if (o.json) {
    process.stdout.write(
      JSON.stringify(
        {
          ok: v.problems.length === 0,
          checkpoint_id: v.id,
          store: store?.location ?? null,
          objects: v.objects,
          bytes: v.bytes,
          consistent: v.manifest?.consistent ?? null,
          unstable: v.manifest?.unstable ?? [],
          problems: v.problems,
        },
        null,
        2,
      ) + '\n',
    );
  } else if (v.problems.length === 0) {
    process.stdout.write(
      `OK: checkpoint ${v.id} signed by ${v.manifest!.signature!.key_id}${store ? `; published; ${plural(v.objects, 'object')} (${v.bytes} bytes) re-hashed from ${store.location}` : '; the signature only: the objects were not checked (give --state-dir or --store)'}\n`,
    );
    // Without a store a version 2 manifest's entries were not read: which unstable paths it holds is unknown (none said).
    warnUnstable(v.manifest!.unstable ?? [], v.notCaptured);
  } else for (const p of v.problems) process.stdout.write(`MISMATCH: ${p}\n`);
  process.exitCode = v.problems.length === 0 ? 0 : 1;
}

/** sbx diff A B, or --task T: what changed between two checkpoints, from their manifests (core/checkpoint/diff.ts). Exit 0 identical, 1 differences, 125 could not. */
export async function diffCommand(a: string | undefined, b: string | undefined, o: StoreOptions & { task?: string }): Promise<void> {
  if (o.task !== undefined && (a !== undefined || b !== undefined)) fail('INVALID_ARGUMENT: diff: give two checkpoints (A B) or --task T, not both');
  if (o.task === undefined && (a === undefined || b === undefined)) fail('INVALID_ARGUMENT: diff needs two checkpoints (sbx diff A B) or --task T');
  const { DiffError, diffCheckpointIds, diffLines, diffSummary, diffTask } = await import('../core/checkpoint/diff.js');
  const store = await openStore(o);
  const key = publicKey(o);
  if (!key)
    fail(`INVALID_ARGUMENT: no public key to check the manifests' signatures (${join(o.stateDir, 'receipt-key.pub')} is absent): give --public-key FILE`);
  let diffs;
  try {
    if (o.task !== undefined) {
      const r = await diffTask(store, o.task, key);
      if (r.invalid.length)
        warn(
          `not compared: ${plural(r.invalid.length, 'id')} whose manifest or published record does not verify (sbx verify ID says why): ${r.invalid.slice(0, 5).join(', ')}`,
        );
      diffs = r.diffs;
    } else diffs = [await diffCheckpointIds(store, a!, b!, key)];
  } catch (err) {
    if (err instanceof DiffError) fail(`${err.code}: diff: ${err.message}`);
    fail(`INTERNAL: diff: ${(err as Error).message}`);
  }
  process.exitCode = diffs.every((d) => d.identical) ? 0 : 1;
  if (o.json) return void process.stdout.write(JSON.stringify(o.task !== undefined ? diffs : diffs[0], null, 2) + '\n');
  for (const d of diffs) {
    if (o.task !== undefined)
      process.stdout.write(`workspace: ${escapeControls(d.to.workspace)}\nfrom: ${d.from?.checkpoint_id ?? 'null'}\nto: ${d.to.checkpoint_id}\n`);
    for (const line of diffLines(d, escapeControls)) process.stdout.write(`${line}\n`);
    const pair = `${d.from ? d.from.checkpoint_id.slice(0, 16) : 'nothing'} -> ${d.to.checkpoint_id.slice(0, 16)}`;
    warn(`${pair}: ${d.identical ? 'identical; ' : ''}${diffSummary(d)}${d.from ? '' : ' (no checkpoint of this workspace before it: everything is added)'}`);
  }
}
