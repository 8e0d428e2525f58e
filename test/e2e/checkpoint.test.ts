// Checkpoints (docs/guide/checkpoints.md "Checkpoints"): a real tree (binary, empty and 100 MiB files, symlinks
// dangling and absolute, a fifo, modes, set-user-ID, a 2,000-deep path, names with a newline and
// not UTF-8) checkpointed by the daemon and restored by sbx with the daemon stopped, compared
// entry by entry with what python3 lists (independently of the supervisor); planted links in
// the target and the store; tampering; crashes mid-checkpoint; the boundary against a
// session's terminal_mutation; unstable paths; gc.
import { createCipheriv, createHash, randomInt } from 'node:crypto';
import {
  chmodSync,
  closeSync,
  existsSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
  unlinkSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { spawn, spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { CheckpointResult, Receipt } from '../../ipc/protocol.js';
import { jcs } from '../../core/receipts/signature.js';
import { manifestObjects, type Manifest } from '../../core/checkpoint/manifest.js';
import { PROGRAMS, sha256, TestDaemon, until, within } from '../helpers/daemon.js';
import { json, WorkspaceRig } from '../helpers/workspace.js';
import { storedManifest } from '../helpers/manifest.js';
import { makeDeepTree, pythonTreeListing, removeTree, type ListedEntry } from '../helpers/workspace-trees.js';

const MiB = 1024 * 1024;
const SEED = Number(process.env.CK_SEED ?? randomInt(1, 2 ** 31));
console.log(`checkpoint.test.ts: CK_SEED=${SEED} (set it to replay the same file contents)`);

/** n bytes from the seed (AES-256-CTR keystream): reproducible, incompressible. */
function seededBytes(n: number, salt: string): Buffer {
  const key = createHash('sha256').update(`${SEED}:${salt}`).digest();
  return createCipheriv('aes-256-ctr', key, Buffer.alloc(16)).update(Buffer.alloc(n));
}

const DEEP = 2000;

/** The tree, in ws. Returns the names made at the top. */
function makeTree(ws: string): void {
  writeFileSync(join(ws, 'binary.bin'), seededBytes(70_001, 'binary'));
  writeFileSync(join(ws, 'empty'), '');
  writeFileSync(join(ws, 'big.bin'), seededBytes(100 * MiB, 'big'));
  symlinkSync('no/such/target', join(ws, 'dangling'));
  symlinkSync('/etc/passwd', join(ws, 'absolute'));
  expect(spawnSync('mkfifo', [join(ws, 'fifo')]).status).toBe(0);
  mkdirSync(join(ws, 'private'), { mode: 0o700 });
  chmodSync(join(ws, 'private'), 0o700);
  writeFileSync(join(ws, 'private', 'key'), 'secret\n');
  chmodSync(join(ws, 'private', 'key'), 0o644);
  writeFileSync(join(ws, 'tool'), '#!/bin/sh\necho hi\n');
  chmodSync(join(ws, 'tool'), 0o755);
  writeFileSync(join(ws, 'setuid-tool'), '#!/bin/sh\n');
  chmodSync(join(ws, 'setuid-tool'), 0o4755);
  writeFileSync(join(ws, 'new\nline'), 'newline in the name\n');
  writeFileSync(Buffer.concat([Buffer.from(ws + '/'), Buffer.from([0x6e, 0xff, 0xfe, 0x2e, 0x62])]), seededBytes(333, 'latin'));
  mkdirSync(join(ws, 'a-b'));
  mkdirSync(join(ws, 'a'));
  writeFileSync(join(ws, 'a', 'b'), 'component order: a/b after a-b bytewise, before it by component\n');
  // 2,000 levels of "deep/" (10,000 bytes of path: past PATH_MAX), made without a long path.
  makeDeepTree(ws, DEEP, { name: 'deep', content: 'bottom' });
}

/** Listing without mtimes (a manifest-to-listing comparison; restored trees compare mtimes too). */
const shape = (l: ListedEntry[]) => l.map(({ mtime_ns: _m, ...rest }) => rest);

/** A manifest entry in the listing's form. */
function listed(e: Record<string, unknown>): Omit<ListedEntry, 'mtime_ns'> {
  const path = e.path !== undefined ? Buffer.from(e.path as string, 'utf8') : Buffer.from(e.path_b64 as string, 'base64');
  const out: Record<string, unknown> = { path: path.toString('hex'), type: e.type, mode: e.mode, uid: e.uid, gid: e.gid, size: e.size };
  if (e.sha256 !== undefined) out.sha256 = e.sha256;
  if (e.target !== undefined) out.target = Buffer.from(e.target as string, 'utf8').toString('hex');
  if (e.target_b64 !== undefined) out.target = Buffer.from(e.target_b64 as string, 'base64').toString('hex');
  if (e.rdev !== undefined) out.rdev = e.rdev;
  return out as Omit<ListedEntry, 'mtime_ns'>;
}

const byPath = <T extends { path: string }>(a: T[]) => [...a].sort((x, y) => (x.path < y.path ? -1 : x.path > y.path ? 1 : 0));

function storeDir(d: TestDaemon): string {
  return join(d.stateDir, 'checkpoints');
}

function manifestFile(d: TestDaemon, id: string): string {
  return join(storeDir(d), 'manifests', `${id}.json`);
}

function objectFile(d: TestDaemon, sha: string): string {
  return join(storeDir(d), 'objects', sha.slice(0, 2), sha);
}

async function checkpoint(d: TestDaemon, ws: string, extra: string[] = []): Promise<CheckpointResult> {
  const r = await d.sbx(['checkpoint', '--workspace', ws, '--json', ...extra]);
  expect(r.stderr.toString()).toBe('');
  expect(r.status).toBe(0);
  return json<CheckpointResult>(r);
}

describe('checkpoint and restore: byte for byte', () => {
  const rig = new WorkspaceRig();
  let d: TestDaemon;
  let ws: string;
  let first: CheckpointResult;
  let source: ListedEntry[];

  beforeAll(async () => {
    ({
      d,
      paths: [ws],
    } = await rig.daemon((dir) => {
      const w = join(dir, 'ws');
      mkdirSync(w);
      makeTree(w);
      return [w];
    }));
    source = pythonTreeListing(ws);
    first = await checkpoint(d, ws);
  }, 120_000);

  afterAll(async () => {
    // A beforeAll that timed out left d unset: the rig still stops what it started.
    try {
      for (const p of d ? [ws, join(d.dir, 'restored'), join(d.dir, 'restored2')] : []) if (existsSync(p)) removeTree(p);
    } finally {
      await rig.cleanup();
    }
  });

  it('records every entry as python3 lists it: content digests, modes, owners, link targets, the fifo, the deep path', () => {
    expect(first.consistent).toBe(true);
    expect(first.unstable).toEqual([]);
    expect(first.boundary.gap).toBeNull();
    expect(first.boundary.seq).toBeGreaterThanOrEqual(1);
    const files = source.filter((e) => e.type === 'file');
    expect(first.scan.entries).toBe(source.length);
    expect(first.scan.files).toBe(files.length);
    expect(first.scan.bytes).toBe(files.reduce((a, e) => a + e.size, 0));
    const manifest = storedManifest(storeDir(d), first.checkpoint_id);
    expect(byPath(manifest.entries.map(listed))).toEqual(byPath(shape(source)));
    // Its id is the SHA-256 of the stored bytes; the deep file is there, 2,000 levels down.
    expect(sha256(readFileSync(manifestFile(d, first.checkpoint_id)))).toBe(first.checkpoint_id);
    expect(manifest.entries.some((e: { path?: string }) => e.path === `${'deep/'.repeat(DEEP)}f`)).toBe(true);
    expect(manifest.entries.find((e: { path?: string }) => e.path === 'setuid-tool').mode).toBe(0o4755);
    expect(manifest.supervisor.generation).toBe(1);
    // The objects: one per distinct content, each holding exactly it.
    const distinct = new Set(files.map((e) => e.sha256));
    expect(first.objects.referenced).toBe(distinct.size);
    for (const sha of distinct) expect(sha256(readFileSync(objectFile(d, sha!)))).toBe(sha);
    expect(first.read_back.objects).toBe(distinct.size);
  });

  it('an unchanged workspace checkpoints again without writing an object', async () => {
    const again = await checkpoint(d, ws);
    expect(again.scan.digest).toBe(first.scan.digest);
    expect(again.objects.written).toBe(0);
    expect(again.objects.bytes_written).toBe(0);
    expect(again.checkpoint_id).not.toBe(first.checkpoint_id); // another time, another boundary
    expect(again.boundary.seq).toBeGreaterThan(first.boundary.seq!);
  });

  it('sbx restore, with the supervisor stopped, materialises it byte for byte and says so', async () => {
    await d.terminate();
    const target = join(d.dir, 'restored');
    const r = await d.sbx(['restore', first.checkpoint_id, target, '--state-dir', d.stateDir, '--json']);
    expect(r.stderr.toString()).toBe('');
    const result = json<{ identical: boolean; differences: unknown[]; entries: number; owners: string }>(r);
    expect(result.differences).toEqual([]);
    expect(r.status).toBe(0);
    expect(result).toMatchObject({ identical: true, entries: source.length, owners: 'same', consistent: true });
    // The directory itself too: its mode, owner and mtime as the workspace had them.
    const [a, b] = [lstatSync(ws, { bigint: true }), lstatSync(target, { bigint: true })];
    expect([b.mode, b.uid, b.gid, b.mtimeNs]).toEqual([a.mode, a.uid, a.gid, a.mtimeNs]);
    // Exactly what python3 lists of the source, mtimes to the ns included.
    expect(byPath(pythonTreeListing(target))).toEqual(byPath(source));
    // A unique prefix names it too; the human output says OK.
    const again = await d.sbx(['restore', first.checkpoint_id.slice(0, 12), join(d.dir, 'restored2'), '--state-dir', d.stateDir]);
    expect(again.status).toBe(0);
    expect(again.stdout.toString()).toContain('OK: the restored tree is identical to the manifest');
    await d.start();
  });
});

describe('checkpoint: what is refused, tampered with or crashed', () => {
  const rig = new WorkspaceRig();
  let d: TestDaemon;
  let ws: string;

  beforeAll(async () => {
    ({
      d,
      paths: [ws],
    } = await rig.daemon((dir) => {
      const w = join(dir, 'ws');
      mkdirSync(w);
      return [w];
    }));
  });

  afterEach(() => {
    d.withEnv(undefined);
  });

  afterAll(() => rig.cleanup());

  function fill(files: Record<string, string>): void {
    for (const name of readdirSync(ws)) rmSync(join(ws, name), { recursive: true, force: true });
    for (const [name, data] of Object.entries(files)) writeFileSync(join(ws, name), data);
  }

  it('the boundary is past the terminal_mutation of a session that ended before it, and the checkpoint holds its write', async () => {
    fill({});
    const r = await d.sbx(['run', '--key', 'writer', '--', 'sh', '-c', `printf written > ${ws}/out`]);
    expect(r.status).toBe(0);
    const receipt = json<Receipt>(await d.sbx(['receipt', '--key', 'writer']));
    const tm = receipt.workspace![0];
    expect(tm.gap).toBeNull();
    const ck = await checkpoint(d, ws, ['--task', 'task-1']);
    expect(ck.boundary.epoch).toBe(tm.epoch);
    expect(ck.boundary.seq).toBeGreaterThan(tm.terminal_mutation!);
    expect(ck.task).toBe('task-1');
    const manifest = storedManifest(storeDir(d), ck.checkpoint_id);
    expect(manifest.entries).toEqual([expect.objectContaining({ path: 'out', sha256: sha256('written'), size: 7 })]);
  });

  it('a directory that is not watched checkpoints with the gap said; a missing one or one holding the state dir is refused', async () => {
    const other = join(d.dir, 'unwatched');
    mkdirSync(other, { recursive: true });
    writeFileSync(join(other, 'f'), 'x');
    const ck = await checkpoint(d, other);
    expect(ck.boundary).toEqual({ epoch: null, seq: null, gap: 'not_watched' });
    const missing = await d.sbx(['checkpoint', '--workspace', join(d.dir, 'nope')]);
    expect(missing.status).toBe(125);
    expect(missing.stderr.toString()).toMatch(/^sbx: INVALID_ARGUMENT: checkpoint: workspace .*nope: does not exist\n$/);
    const holder = await d.sbx(['checkpoint', '--workspace', d.dir]);
    expect(holder.status).toBe(125);
    expect(holder.stderr.toString()).toContain(`checkpoint: the directory ${d.dir} holds the state dir `);
  });

  it('a link planted in the restore target, or the target being a link, is never followed', async () => {
    fill({ f: 'content' });
    const ck = await checkpoint(d, ws);
    const victim = join(d.dir, 'victim');
    writeFileSync(victim, 'untouched');
    const target = join(d.dir, 'planted');
    mkdirSync(target);
    symlinkSync(victim, join(target, 'f'));
    chmodSync(target, 0o777);
    expect(spawnSync('chown', ['1000:1000', target]).status).toBe(0);
    const r = await d.sbx(['restore', ck.checkpoint_id, target, '--state-dir', d.stateDir]);
    expect(r.status).toBe(125);
    expect(r.stderr.toString()).toContain('is not empty (1 entry, e.g. "f")');
    // Refused, it changed nothing: not even the directory's owner or mode.
    expect(lstatSync(target)).toMatchObject({ uid: 1000, gid: 1000, mode: 0o40777 });
    // A name that is not UTF-8 is shown with \xNN, as sbx shows names everywhere.
    const bytesNamed = join(d.dir, 'bytes-named');
    mkdirSync(bytesNamed);
    writeFileSync(Buffer.concat([Buffer.from(`${bytesNamed}/bad`), Buffer.from([0xff, 0xfe]), Buffer.from('.bin')]), 'x');
    const rb = await d.sbx(['restore', ck.checkpoint_id, bytesNamed, '--state-dir', d.stateDir]);
    expect([rb.status, rb.stderr.toString()]).toEqual([125, expect.stringContaining('is not empty (1 entry, e.g. "bad\\xff\\xfe.bin")')]);
    const linkTarget = join(d.dir, 'link-target');
    mkdirSync(linkTarget);
    symlinkSync(linkTarget, join(d.dir, 'as-link'));
    const r2 = await d.sbx(['restore', ck.checkpoint_id, join(d.dir, 'as-link'), '--state-dir', d.stateDir]);
    expect(r2.status).toBe(125);
    expect(r2.stderr.toString()).toContain('is a symlink (never followed)');
    expect(readdirSync(linkTarget)).toEqual([]);
    expect(readFileSync(victim, 'utf8')).toBe('untouched');
  });

  it('a link planted in the store is never followed: verify and restore name the object, a new checkpoint sets it aside', async () => {
    fill({ f: 'planted-store' });
    const ck = await checkpoint(d, ws);
    const sha = sha256('planted-store');
    // A file elsewhere with the very same bytes: following the link would "verify".
    const decoy = join(d.dir, 'decoy');
    writeFileSync(decoy, 'planted-store');
    unlinkSync(objectFile(d, sha));
    symlinkSync(decoy, objectFile(d, sha));
    const v = await d.sbx(['verify', manifestFile(d, ck.checkpoint_id), '--state-dir', d.stateDir]);
    expect(v.status).toBe(1);
    expect(v.stdout.toString()).toContain(`MISMATCH: object ${sha} (f):`);
    expect(v.stdout.toString()).toContain('is a symlink (planted; never followed)');
    const r = await d.sbx(['restore', ck.checkpoint_id, join(d.dir, 'from-planted-store'), '--state-dir', d.stateDir]);
    expect(r.status).toBe(125);
    expect(r.stderr.toString()).toContain(`"f": object ${sha}`);
    // The next checkpoint of the same content finds the name taken, reads it back, refuses it and sets it aside...
    const c = await d.sbx(['checkpoint', '--workspace', ws]);
    expect(c.status).toBe(125);
    expect(c.stderr.toString()).toMatch(/^sbx: CHECKPOINT_FAILED: checkpoint [0-9a-f]{64} not published: .*symlink.*\(used by f\)/);
    expect(lstatSync(decoy).isFile()).toBe(true);
    // ...so the retry stores it again, and publishes.
    const retry = await checkpoint(d, ws);
    expect(retry.objects.written).toBe(1);
    expect(lstatSync(objectFile(d, sha)).isFile()).toBe(true);
  });

  it('sbx verify of a published record, a checkpoint result or other JSON says what it is (INVALID_ARGUMENT, exit 125), never a MISMATCH or a crash', async () => {
    fill({ one: 'first file' });
    const ck = await checkpoint(d, ws);
    const result = join(d.dir, 'result.json');
    writeFileSync(result, JSON.stringify(ck));
    const other = join(d.dir, 'other.json');
    writeFileSync(other, '{"a":1}');
    const nothing = join(d.dir, 'null.json');
    writeFileSync(nothing, 'null');
    const published = join(storeDir(d), 'published', `${ck.checkpoint_id}.json`);
    const said = async (file: string) => {
      const v = await d.sbx(['verify', file, '--state-dir', d.stateDir]);
      return [v.status, v.stdout.toString(), v.stderr.toString()];
    };
    expect(await said(published)).toEqual([
      125,
      '',
      `sbx: INVALID_ARGUMENT: ${published} is a checkpoint's published record, not its manifest: verify checkpoint ${ck.checkpoint_id} by its id (sbx verify ${ck.checkpoint_id} --state-dir DIR) or its manifest (<state>/checkpoints/manifests/${ck.checkpoint_id}.json)\n`,
    ]);
    expect(await said(result)).toEqual([
      125,
      '',
      `sbx: INVALID_ARGUMENT: ${result} is a checkpoint result (sbx checkpoint --json), which is not signed: verify the checkpoint itself: sbx verify ${ck.checkpoint_id}\n`,
    ]);
    for (const f of [other, nothing])
      expect(await said(f)).toEqual([
        125,
        '',
        `sbx: INVALID_ARGUMENT: ${f} is not a receipt, close receipt, task receipt or checkpoint manifest (sbx verify --help says what each is)\n`,
      ]);
  });

  it('a flipped byte in an object, a missing object, an edited manifest: verify and restore fail naming it', async () => {
    // "two"'s content in three more files: one object, named by its first three paths when missing.
    fill({ one: 'first file', two: 'second file', three: 'second file', four: 'second file', five: 'second file' });
    const ck = await checkpoint(d, ws);
    const m = manifestFile(d, ck.checkpoint_id);
    const good = await d.sbx(['verify', m, '--state-dir', d.stateDir]);
    // Two files' objects (21 bytes) and the root tree's.
    const treeBytes = readFileSync(objectFile(d, storedManifest(storeDir(d), ck.checkpoint_id).tree!)).length;
    expect(good.stdout.toString()).toBe(
      `OK: checkpoint ${ck.checkpoint_id} signed by ${JSON.parse(readFileSync(m, 'utf8')).signature.key_id}; published; 3 objects (${21 + treeBytes} bytes) re-hashed from ${storeDir(d)}\n`,
    );
    expect(good.status).toBe(0);
    // One byte flipped in the object of "one".
    const one = objectFile(d, sha256('first file'));
    chmodSync(one, 0o644);
    const fd = openSync(one, 'r+');
    writeSync(fd, Buffer.from('F'), 0, 1, 0);
    closeSync(fd);
    const flipped = await d.sbx(['verify', m, '--state-dir', d.stateDir]);
    expect(flipped.status).toBe(1);
    expect(flipped.stdout.toString()).toBe(`MISMATCH: object ${sha256('first file')} (one): its bytes hash to ${sha256('First file')}: changed in the store\n`);
    const r = await d.sbx(['restore', ck.checkpoint_id, join(d.dir, 'from-flipped'), '--state-dir', d.stateDir]);
    expect(r.status).toBe(125);
    expect(r.stderr.toString()).toContain(`"one": object ${sha256('first file')} in ${storeDir(d)} reads as ${sha256('First file')}`);
    // The object of "two" removed.
    unlinkSync(objectFile(d, sha256('second file')));
    const missing = await d.sbx(['verify', m, '--state-dir', d.stateDir]);
    expect(missing.stdout.toString()).toContain(`MISMATCH: object ${sha256('second file')} (five, four, three): missing from ${storeDir(d)}\n`);
    // A copy of the manifest whose root tree says one mode otherwise (the edited tree planted in
    // the store under its own hash): the signature fails, and the path is named.
    const stored = JSON.parse(readFileSync(m, 'utf8'));
    const rootTree = JSON.parse(readFileSync(objectFile(d, stored.tree), 'utf8'));
    rootTree.entries.find((e: { name: string }) => e.name === 'two').mode = 0o4777;
    const plantedTree = Buffer.from(jcs(rootTree));
    mkdirSync(dirname(objectFile(d, sha256(plantedTree))), { recursive: true });
    writeFileSync(objectFile(d, sha256(plantedTree)), plantedTree);
    const edited = { ...stored, tree: sha256(plantedTree), scan: { ...stored.scan, digest: `sha256:${sha256(plantedTree)}` } };
    const copy = join(d.dir, 'edited.json');
    writeFileSync(copy, JSON.stringify(edited, null, 2));
    const e = await d.sbx(['verify', copy, '--state-dir', d.stateDir]);
    expect(e.status).toBe(1);
    expect(e.stdout.toString()).toContain('MISMATCH: the signature does not match the manifest');
    expect(e.stdout.toString()).toContain(`MISMATCH: two: mode edited after signing (the stored checkpoint ${ck.checkpoint_id} says otherwise)`);
    // Without the store, the signature alone still catches it.
    const alone = await d.sbx(['verify', copy, '--public-key', join(d.stateDir, 'receipt-key.pub')]);
    expect(alone.status).toBe(1);
  });

  for (const point of ['checkpoint:object@2', 'checkpoint:before-manifest', 'checkpoint:after-manifest', 'checkpoint:after-read-back']) {
    it(`a crash at ${point} leaves no manifest that claims anything; the next checkpoint completes`, async () => {
      fill({ a: `a ${point}`, b: `b ${point}`, c: `c ${point}` });
      const publishedBefore = readdirSync(join(storeDir(d), 'published'));
      await d.terminate();
      d.withEnv({ SBX_FAULT_POINT: point });
      await d.start();
      const r = await d.sbx(['checkpoint', '--workspace', ws]);
      expect(r.status).toBe(125);
      expect((await d.exitedNow()).signal).toBe('SIGKILL');
      const manifests = readdirSync(join(storeDir(d), 'manifests'));
      d.withEnv(undefined);
      await d.start();
      // Published records did not change; a manifest left by the crash is gone; tmp/ is empty.
      expect(readdirSync(join(storeDir(d), 'published'))).toEqual(publishedBefore);
      expect(readdirSync(join(storeDir(d), 'manifests')).sort()).toEqual(publishedBefore.sort());
      expect(readdirSync(join(storeDir(d), 'tmp'))).toEqual([]);
      for (const name of manifests.filter((n) => !publishedBefore.includes(n))) {
        const id = name.slice(0, 64);
        const restore = await d.sbx(['restore', id, join(d.dir, `crash-${id}`), '--state-dir', d.stateDir]);
        expect(restore.status).toBe(125);
        // The restart removed it (it claimed nothing): no such checkpoint.
        expect(restore.stderr.toString()).toContain(`no checkpoint ${id} in ${storeDir(d)}`);
      }
      const ck = await checkpoint(d, ws);
      expect(ck.scan.files).toBe(3);
    });
  }

  it('a file that changes between passes is checked again; one that never stops changing is reported unstable (exit 1)', async () => {
    fill({ busy: '', calm: 'calm' });
    await d.terminate();
    d.withEnv({ SBX_TEST_CHECKPOINT_TOUCH: 'busy@1' });
    await d.start();
    const once = await checkpoint(d, ws);
    expect(once).toMatchObject({ consistent: true, unstable: [], scan: { passes: 3 } });
    const manifest = storedManifest(storeDir(d), once.checkpoint_id);
    expect(manifest.entries.find((e: { path: string }) => e.path === 'busy')).toMatchObject({ size: 1, sha256: sha256('x') });
    await d.terminate();
    d.withEnv({ SBX_TEST_CHECKPOINT_TOUCH: 'busy' });
    await d.start();
    const r = await d.sbx(['checkpoint', '--workspace', ws, '--json']);
    expect(r.status).toBe(1);
    const never = json<CheckpointResult>(r);
    expect(never).toMatchObject({ consistent: false, unstable: ['busy'], unstable_count: 1, scan: { passes: 4 } });
    const m2 = storedManifest(storeDir(d), never.checkpoint_id);
    expect(m2).toMatchObject({ consistent: false, unstable: ['busy'] });
    // What it holds for busy is exactly what its object holds.
    const busy = m2.entries.find((e: { path: string }) => e.path === 'busy');
    expect(sha256(readFileSync(objectFile(d, busy.sha256)))).toBe(busy.sha256);
    const human = await d.sbx(['checkpoint', '--workspace', ws]);
    expect(human.status).toBe(1);
    expect(human.stderr.toString()).toContain('sbx: not consistent: 1 path changed in every pass (4): busy');
    await d.terminate();
    d.withEnv(undefined);
    await d.start();
  });

  it('a file another process holds a write lease on (taken again at every break) is unstable, never a failed checkpoint; a read lease does not block', async () => {
    fill({ leased: 'leased bytes\n', calm: 'calm' });
    /** hold-lease on ws/leased; resolves once it holds the lease, with what it printed so far. */
    const hold = async (kind: 'wr' | 'rd') => {
      const child = spawn(join(PROGRAMS, 'hold-lease'), [join(ws, 'leased'), kind], { stdio: ['ignore', 'pipe', 'inherit'] });
      let out = '';
      child.stdout!.on('data', (b: Buffer) => (out += b.toString()));
      const exited = new Promise((r) => child.on('exit', r));
      await until(() => out.includes('held\n'), `the ${kind} lease`);
      return { out: () => out, end: async () => (child.kill('SIGTERM'), await exited) };
    };
    const writer = await hold('wr');
    try {
      const r = await d.sbx(['checkpoint', '--workspace', ws, '--json']);
      expect(r.status, r.stderr.toString()).toBe(1);
      const ck = json<CheckpointResult>(r);
      expect(ck).toMatchObject({ consistent: false, unstable: ['leased'], unstable_count: 1, leased: ['leased'], leased_count: 1, scan: { passes: 4 } });
      // Said as what happened: a lease held it shut (it never changed), so it is not captured.
      const human = await d.sbx(['checkpoint', '--workspace', ws]);
      expect(human.status).toBe(1);
      expect(human.stderr.toString()).toContain("sbx: not consistent: 1 path held by another process's write lease: not captured: leased\n");
      expect(human.stderr.toString()).not.toContain('changed in every pass');
      const back = await d.sbx(['restore', ck.checkpoint_id, join(d.dir, 'leased-back'), '--state-dir', d.stateDir]);
      expect(back.status, back.stderr.toString()).toBe(0);
      expect(back.stderr.toString()).toContain(
        "1 path not captured (leased): held by another process's write lease, or gone, while it was taken; not in it, so not restored",
      );
      expect(back.stderr.toString()).not.toContain('kept changing');
      expect(readdirSync(join(d.dir, 'leased-back'))).toEqual(['calm']);
      // Never opened: left out of the entries (nothing invented for it), named unstable.
      const m = storedManifest(storeDir(d), ck.checkpoint_id);
      expect(m).toMatchObject({ consistent: false, unstable: ['leased'] });
      expect(m.entries.map((e: { path: string }) => e.path)).toEqual(['calm']);
      // Each pass's open broke the lease, and the holder took it again each time.
      expect(writer.out()).toMatch(/broken [4-9]/);
    } finally {
      await writer.end();
    }
    const after = await checkpoint(d, ws);
    expect(after).toMatchObject({ consistent: true, unstable: [] });
    const m = storedManifest(storeDir(d), after.checkpoint_id);
    expect(m.entries.find((e: { path: string }) => e.path === 'leased')).toMatchObject({ size: 13, sha256: sha256('leased bytes\n') });
    // A read lease is broken only by an open for writing: the capture reads past it.
    const reader = await hold('rd');
    try {
      expect(await checkpoint(d, ws)).toMatchObject({ consistent: true, unstable: [] });
      expect(reader.out()).toBe('held\n');
    } finally {
      await reader.end();
    }
  });

  it('200 files under write leases: the lease wait is a budget per pass, so the checkpoint ends within passes x budget (not 100 ms per file per pass), every one of them unstable', async () => {
    const names = Array.from({ length: 200 }, (_, i) => `l${String(i).padStart(3, '0')}`);
    fill(Object.fromEntries([...names.map((n) => [n, `${n}\n`]), ['calm', 'calm']]));
    const child = spawn(join(PROGRAMS, 'hold-lease'), [...names.map((n) => join(ws, n)), 'wr'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout!.on('data', (b: Buffer) => (out += b.toString()));
    child.stderr!.on('data', (b: Buffer) => (err += b.toString()));
    const exited = new Promise((r) => child.on('exit', r));
    try {
      await until(() => out.includes('held\n'), 'the 200 leases');
      // 4 passes x a 100 ms budget, plus the walks: far under 10 s (it took 200 x 100 ms x 4 = 80 s).
      const r = await within(d.sbx(['checkpoint', '--workspace', ws, '--json']), 'a checkpoint of 200 leased files', 10_000);
      expect(r.status, `${r.stderr.toString()}; hold-lease: ${err}`).toBe(1);
      const ck = json<CheckpointResult>(r);
      expect(ck).toMatchObject({ consistent: false, unstable_count: 200, scan: { passes: 4 } });
      const m = storedManifest(storeDir(d), ck.checkpoint_id);
      expect([...m.unstable].sort()).toEqual(names);
      expect(m.entries.map((e: { path: string }) => e.path)).toEqual(['calm']);
    } finally {
      child.kill('SIGTERM');
      await exited;
    }
  });

  it('a file system mounted inside the workspace is not entered, and said so: the manifest marks it, sbx checkpoint and sbx restore name it', async () => {
    fill({ top: 'top' });
    const mnt = join(ws, 'mnt');
    mkdirSync(mnt);
    const m = spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=1m,mode=0755', 'sbx-test-mount', mnt]);
    expect(m.status, m.stderr.toString()).toBe(0);
    try {
      writeFileSync(join(mnt, 'inside'), 'on the tmpfs');
      const r = await d.sbx(['checkpoint', '--workspace', ws, '--json']);
      expect(r.status, r.stderr.toString()).toBe(0);
      const ck = json<CheckpointResult>(r);
      expect(ck).toMatchObject({ consistent: true, mounts_skipped: ['mnt'] });
      // The mount point as a directory marked `mount`, nothing under it (mnt/inside is not there).
      const manifest = storedManifest(storeDir(d), ck.checkpoint_id);
      expect(manifest.entries.map((e: { path: string; type: string; mount?: boolean }) => [e.path, e.type, e.mount ?? null])).toEqual([
        ['mnt', 'dir', true],
        ['top', 'file', null],
      ]);
      const human = await d.sbx(['checkpoint', '--workspace', ws]);
      expect(human.status).toBe(0);
      expect(human.stderr.toString()).toContain(
        'sbx: 1 mount point not entered (recorded as empty directories; what is mounted there is not in the checkpoint): mnt\n',
      );
      expect((await d.sbx(['verify', ck.checkpoint_id, '--state-dir', d.stateDir])).status).toBe(0);
      const target = join(d.dir, 'restored-mount');
      const rs = await d.sbx(['restore', ck.checkpoint_id, target, '--state-dir', d.stateDir]);
      expect(rs.status, rs.stdout.toString()).toBe(0);
      expect(rs.stderr.toString()).toContain(
        'warning: 1 mount point inside the workspace was not entered when it was taken, restored as empty directories (what was mounted there is not in the checkpoint): mnt\n',
      );
      expect(readdirSync(join(target, 'mnt'))).toEqual([]);
      const asJson = json<{ mounts_skipped: string[] }>(
        await d.sbx(['restore', ck.checkpoint_id, join(d.dir, 'restored-mount2'), '--state-dir', d.stateDir, '--json']),
      );
      expect(asJson.mounts_skipped).toEqual(['mnt']);
      for (const t of [target, join(d.dir, 'restored-mount2')]) rmSync(t, { recursive: true, force: true });
      // The task receipt's checkpoint entry names it too, and sbx verify checks that against the manifest.
      const closed = await d.sbx(['close', '--task', 'with-mount', '--workspace', ws]);
      expect(closed.status, closed.stderr.toString()).toBe(0);
      const receipt = json<Receipt & { checkpoints: { mounts_skipped?: string[] }[] }>(closed);
      expect(receipt.checkpoints.map((c) => c.mounts_skipped)).toEqual([['mnt']]);
      const receiptFile = join(d.dir, 'task-with-mount.json');
      writeFileSync(receiptFile, closed.stdout);
      const v = await d.sbx(['verify', receiptFile, '--state-dir', d.stateDir]);
      expect(v.status, v.stdout.toString()).toBe(0);
    } finally {
      expect(spawnSync('umount', [mnt]).status).toBe(0);
      rmSync(mnt, { recursive: true, force: true });
    }
  });

  it('a directory inside the watched workspace gets its boundary; sbx checkpoints lists what was published', async () => {
    fill({});
    mkdirSync(join(ws, 'sub'));
    writeFileSync(join(ws, 'sub', 'f'), 'in sub');
    const ck = await checkpoint(d, join(ws, 'sub'));
    expect(ck.boundary.gap).toBeNull();
    expect(ck.boundary.seq).toBeGreaterThan(0);
    const list = json<{ checkpoint_id: string; workspace: string; entries: number }[]>(
      await d.sbx(['checkpoints', '--state-dir', d.stateDir, '--workspace', join(ws, 'sub'), '--json']),
    );
    expect(list).toEqual([expect.objectContaining({ checkpoint_id: ck.checkpoint_id, workspace: join(ws, 'sub'), entries: 1 })]);
    // Named through a symlink: the same workspace (its real path is what the manifest records).
    symlinkSync(join(ws, 'sub'), join(d.dir, 'sub-link'));
    const viaLink = json<{ checkpoint_id: string }[]>(
      await d.sbx(['checkpoints', '--state-dir', d.stateDir, '--workspace', join(d.dir, 'sub-link'), '--json']),
    );
    expect(viaLink.map((c) => c.checkpoint_id)).toEqual([ck.checkpoint_id]);
    rmSync(join(d.dir, 'sub-link'));
    // sbx verify of the manifest's file takes $SBX_STATE_DIR's store as every command does: the objects are re-hashed too.
    const byEnv = await d.sbx(['verify', manifestFile(d, ck.checkpoint_id)], { env: { ...process.env, SBX_STATE_DIR: d.stateDir } });
    expect(byEnv.stdout.toString()).toMatch(
      new RegExp(`^OK: checkpoint ${ck.checkpoint_id} signed by \\S+; published; 2 objects \\(\\d+ bytes\\) re-hashed from ${storeDir(d)}\\n$`),
    );
    const human = await d.sbx(['checkpoints', '--state-dir', d.stateDir]);
    expect(human.status).toBe(0);
    expect(human.stdout.toString()).toContain(ck.checkpoint_id.slice(0, 16));
    // A forged one (a copy of the record and of an edited manifest under another id) is not listed.
    const fake = 'e'.repeat(64);
    writeFileSync(join(storeDir(d), 'published', `${fake}.json`), readFileSync(join(storeDir(d), 'published', `${ck.checkpoint_id}.json`)));
    writeFileSync(manifestFile(d, fake), readFileSync(manifestFile(d, ck.checkpoint_id), 'utf8').replace(join(ws, 'sub'), '/forged'));
    const forged = await d.sbx(['checkpoints', '--state-dir', d.stateDir, '--json']);
    expect(json<{ checkpoint_id: string }[]>(forged).map((c) => c.checkpoint_id)).not.toContain(fake);
    expect(forged.stderr.toString()).toContain(`sbx: not listed: 1 id whose manifest or published record does not verify (sbx verify ID says why): ${fake}`);
    rmSync(join(storeDir(d), 'published', `${fake}.json`));
    rmSync(manifestFile(d, fake));
  });

  it('restores into the watched workspace itself, emptied (the supervisor keeps nothing there): the rollback', async () => {
    fill({ keep: 'version 1' });
    const ck = await checkpoint(d, ws);
    writeFileSync(join(ws, 'keep'), 'version 2, to be rolled back');
    for (const name of readdirSync(ws)) rmSync(join(ws, name), { recursive: true });
    expect(readdirSync(ws)).toEqual([]);
    const r = await d.sbx(['restore', ck.checkpoint_id, ws, '--state-dir', d.stateDir]);
    expect(r.stderr.toString()).toBe('');
    expect(r.status).toBe(0);
    expect(readFileSync(join(ws, 'keep'), 'utf8')).toBe('version 1');
    expect(readdirSync(ws)).toEqual(['keep']);
    // A session still gets its barrier there afterwards.
    const after = await d.sbx(['run', '--key', 'after-rollback', '--', 'sh', '-c', `printf x > ${ws}/new`]);
    expect(after.status).toBe(0);
    expect(json<Receipt>(await d.sbx(['receipt', '--key', 'after-rollback'])).workspace![0].gap).toBeNull();
  });

  it("--no-same-owner: every entry the restorer's, set-user-ID dropped where its owner was someone else, owners not compared (exit 0)", async () => {
    fill({ mine: 'root owned', theirs: 'uid 1000' });
    chmodSync(join(ws, 'mine'), 0o4755);
    chmodSync(join(ws, 'theirs'), 0o4755);
    expect(spawnSync('chown', ['1000:1000', join(ws, 'theirs')]).status).toBe(0);
    chmodSync(join(ws, 'theirs'), 0o4755); // chown cleared it
    const ck = await checkpoint(d, ws);
    const target = join(d.dir, 'not-same-owner');
    const r = await d.sbx(['restore', ck.checkpoint_id, target, '--state-dir', d.stateDir, '--no-same-owner', '--json']);
    expect(r.status).toBe(0);
    expect(json<{ owners: string; setid_dropped: string[]; identical: boolean }>(r)).toMatchObject({
      owners: 'not_given',
      setid_dropped: ['theirs'],
      identical: true,
    });
    expect(lstatSync(join(target, 'theirs'))).toMatchObject({ uid: 0, gid: 0, mode: 0o100755 });
    expect(lstatSync(join(target, 'mine')).mode).toBe(0o104755); // its recorded owner is the restorer: kept
    // As root, the default gives the owner, and set-user-ID with it.
    const same = join(d.dir, 'same-owner');
    expect((await d.sbx(['restore', ck.checkpoint_id, same, '--state-dir', d.stateDir])).status).toBe(0);
    expect(lstatSync(join(same, 'theirs'))).toMatchObject({ uid: 1000, gid: 1000, mode: 0o104755 });
  });

  it('sbx gc removes objects no manifest names (left by a crash) and keeps every referenced one', async () => {
    fill({ kept: 'kept content' });
    const ck = await checkpoint(d, ws);
    fill({ orphan1: 'orphan one', orphan2: 'orphan two' });
    await d.terminate();
    d.withEnv({ SBX_FAULT_POINT: 'checkpoint:before-manifest' });
    await d.start();
    await d.sbx(['checkpoint', '--workspace', ws]);
    await d.exitedNow();
    expect(existsSync(objectFile(d, sha256('orphan one')))).toBe(true);
    d.withEnv(undefined);
    await d.start();
    // What gc must remove: every object that no published manifest names (the crash's two, and
    // earlier tests' intermediate versions of files re-hashed between passes).
    const all = readdirSync(join(storeDir(d), 'objects')).flatMap((fan) => readdirSync(join(storeDir(d), 'objects', fan)));
    const referenced = new Set<string>();
    for (const name of readdirSync(join(storeDir(d), 'published')))
      for (const sha of manifestObjects(storedManifest(storeDir(d), name.replace(/\.json$/, '')) as Manifest).keys()) referenced.add(sha);
    const garbage = all.filter((sha) => !referenced.has(sha));
    expect(garbage).toEqual(expect.arrayContaining([sha256('orphan one'), sha256('orphan two')]));
    // And what quarantine/ holds (the planted link an earlier test set aside).
    const qdir = join(storeDir(d), 'quarantine');
    const quarantined = existsSync(qdir) ? readdirSync(qdir) : [];
    expect(quarantined.length).toBeGreaterThan(0);
    const garbageBytes =
      garbage.reduce((a, sha) => a + lstatSync(objectFile(d, sha)).size, 0) + quarantined.reduce((a, n) => a + lstatSync(join(qdir, n)).size, 0);
    const r = await d.sbx(['gc', '--json']);
    expect(r.status).toBe(0);
    const gc = json<{ checkpoints: { removed_objects: number; removed_quarantined: number; freed_bytes: number } }>(r);
    expect(gc.checkpoints).toMatchObject({ removed_objects: garbage.length, removed_quarantined: quarantined.length, freed_bytes: garbageBytes });
    expect(readdirSync(qdir)).toEqual([]);
    for (const sha of garbage) expect(existsSync(objectFile(d, sha))).toBe(false);
    for (const sha of referenced) if (all.includes(sha)) expect(existsSync(objectFile(d, sha))).toBe(true); // (an earlier test removed one)
    const v = await d.sbx(['verify', ck.checkpoint_id, '--state-dir', d.stateDir]);
    expect(v.status).toBe(0);
  });
});

const HAVE_LOOP = existsSync('/dev/loop-control') && spawnSync('sh', ['-c', 'command -v mkfs.ext4 && command -v fsfreeze']).status === 0;

describe.skipIf(!HAVE_LOOP)(
  HAVE_LOOP
    ? 'checkpoint.freeze: the last pass with the workspace file system frozen'
    : 'checkpoint.freeze (skipped: no loop devices or no mkfs.ext4/fsfreeze to make a file system of its own)',
  () => {
    let d: TestDaemon;
    let ws: string;
    let mounted = false;

    beforeAll(async () => {
      d = new TestDaemon({ cgroupPrefix: 'sbx-test-ws-' });
      ws = join(d.dir, 'ws');
      const img = join(d.dir, 'ws.img');
      expect(spawnSync('truncate', ['-s', '32M', img]).status).toBe(0);
      expect(spawnSync('mkfs.ext4', ['-q', '-F', img]).status).toBe(0);
      mkdirSync(ws);
      const m = spawnSync('mount', ['-o', 'loop', img, ws]);
      expect(m.status, m.stderr.toString()).toBe(0);
      mounted = true;
      rmSync(join(ws, 'lost+found'), { recursive: true, force: true });
      writeFileSync(join(ws, 'busy'), '');
      mkdirSync(join(ws, 'sub'));
      writeFileSync(join(ws, 'sub', 'calm'), 'calm');
      d.withConfig({ workspace: { paths: [ws] }, checkpoint: { freeze: true } });
      d.withEnv({ SBX_TEST_CHECKPOINT_TOUCH: 'busy' });
      await d.start();
    });

    afterEach(() => {
      if (mounted) spawnSync('fsfreeze', ['-u', ws]); // whatever a failed test left (a blocked writer goes on)
    });

    afterAll(async () => {
      if (mounted) spawnSync('fsfreeze', ['-u', ws]); // whatever a failed test left
      await d.terminate();
      if (mounted) expect(spawnSync('umount', [ws]).status).toBe(0);
      await d.stop();
    });

    it('a file changed before every pass: the frozen pass pins it (consistent, frozen), where without it the checkpoint says unstable', async () => {
      const ck = await checkpoint(d, ws);
      expect(ck).toMatchObject({ consistent: true, unstable: [], freeze: { frozen: true, reason: null }, scan: { passes: 5 } });
      const manifest = storedManifest(storeDir(d), ck.checkpoint_id);
      expect(manifest.frozen).toBe(true);
      // The bytes it holds for busy are what busy held when frozen: 3 touches (passes 2-4), none in the frozen pass.
      expect(manifest.entries.find((e: { path: string }) => e.path === 'busy')).toMatchObject({ size: 3, sha256: sha256('xxx') });
      // Thawed: a write goes through at once.
      writeFileSync(join(ws, 'after'), 'thawed');
      rmSync(join(ws, 'after'));
    });

    it('a directory that is not its own mount is not frozen, and says why', async () => {
      // (The touch hook makes sub/busy change in every pass: unstable, exit 1, as without a freeze.)
      const r = await d.sbx(['checkpoint', '--workspace', join(ws, 'sub'), '--json']);
      expect(r.status).toBe(1);
      const ck = json<CheckpointResult>(r);
      expect(ck).toMatchObject({ consistent: false, unstable: ['busy'] });
      expect(ck.freeze).toEqual({ frozen: false, ms: 0, reason: expect.stringContaining('not its own mount') });
    });

    it('a supervisor killed while the workspace is frozen: it stays frozen (fsfreeze says busy) until the next start thaws it', async () => {
      await d.terminate();
      d.withEnv({ SBX_TEST_CHECKPOINT_TOUCH: 'busy', SBX_FAULT_POINT: 'checkpoint:frozen' });
      await d.start();
      const r = await d.sbx(['checkpoint', '--workspace', ws]);
      expect(r.status).toBe(125);
      expect((await d.exitedNow()).signal).toBe('SIGKILL');
      const busy = spawnSync('fsfreeze', ['-f', ws]);
      expect(busy.status).not.toBe(0); // EBUSY: frozen already
      expect(busy.stderr.toString()).toMatch(/busy/i);
      d.withEnv(undefined);
      await d.start();
      const writer = spawn('sh', ['-c', `printf x > ${ws}/probe`]);
      const done = await until(() => (writer.exitCode !== null ? { code: writer.exitCode } : null), 'a write to the workspace after the restart', 10_000);
      expect(done.code).toBe(0);
      expect(d.log()).toContain('a checkpoint was stopped while its workspace was frozen: thawed');
    });

    /** A write into the workspace, in a child: its exit status once it completes (within the deadline), never blocking this process. */
    async function writeCompletes(name: string): Promise<number | null> {
      const writer = spawn('sh', ['-c', `printf x > ${ws}/${name}`]);
      const done = await until(() => (writer.exitCode !== null ? { code: writer.exitCode } : null), `a write to ${ws}/${name}`, 10_000);
      return done.code;
    }

    it('SIGTERM to the supervisor during the frozen pass: thawed before it exits (the thread it terminates never thaws)', async () => {
      await d.terminate();
      d.withEnv({ SBX_FAULT_POINT: 'checkpoint:frozen-hold' }); // the frozen pass waits 60 s
      const from = d.log().length; // this run's lines only
      await d.start();
      const ck = d.sbx(['checkpoint', '--workspace', ws]);
      // The thread's own line, past its check for a stopping supervisor: a SIGTERM between the freeze and that
      // check (the supervisor's "frozen" line is before it) skips the pass instead, and the checkpoint may complete.
      await until(() => d.log().slice(from).includes('checkpoint:frozen-hold: the frozen pass holds'), 'the frozen pass held');
      expect(await d.terminate()).toEqual({ code: 0, signal: null });
      expect(await writeCompletes('after-sigterm')).toBe(0);
      expect((await ck).status).toBe(125);
      expect(d.log().slice(from)).toContain('thawed by the supervisor');
      expect(existsSync(join(storeDir(d), 'frozen'))).toBe(false);
      d.withEnv(undefined);
      await d.start();
    });

    it('a frozen pass that does not thaw by freezeMaxMs + 2 s: the watchdog thaws it, and the pass counts as an ordinary one', async () => {
      await d.terminate();
      d.withConfig({ checkpoint: { freeze: true, freezeMaxMs: 200 } });
      d.withEnv({ SBX_FAULT_POINT: 'checkpoint:frozen-hold', SBX_TEST_FROZEN_HOLD_MS: '6000' }); // the thread holds it 6 s
      const from = d.log().length;
      await d.start();
      try {
        const t0 = performance.now();
        const ck = d.sbx(['checkpoint', '--workspace', ws, '--json']);
        await until(() => d.log().slice(from).includes('checkpoint: the workspace is frozen for the last pass'), 'the frozen pass');
        // Thawed by the watchdog (at 2.2 s), while the thread still holds: the write completes before the checkpoint does.
        expect(await writeCompletes('during-hold')).toBe(0);
        const writtenMs = performance.now() - t0;
        const r = await ck;
        expect(performance.now() - t0).toBeGreaterThan(writtenMs);
        // An ordinary pass: it saw the write made under it (frozen, it would have claimed none could be).
        expect(r.status).toBe(1);
        expect(json<CheckpointResult>(r)).toMatchObject({
          consistent: false,
          unstable: ['.', 'during-hold'],
          freeze: { frozen: false, reason: expect.stringContaining('thawed before the frozen pass ended') },
        });
        expect(d.log().slice(from)).toContain('the frozen pass ran past checkpoint.freezeMaxMs (200 ms) + 2000 ms without thawing');
        const manifest = JSON.parse(readFileSync(manifestFile(d, json<CheckpointResult>(r).checkpoint_id), 'utf8'));
        expect(manifest.frozen).toBeUndefined();
      } finally {
        await d.terminate();
        d.withConfig({ checkpoint: { freeze: true } });
        d.withEnv(undefined);
        await d.start();
      }
    });

    it.each([
      ['exits', 'checkpoint:frozen-thread-exit', 'the checkpoint thread exited (70)'], // process.exit(70) in the thread
      [
        'runs out of memory',
        'checkpoint:frozen-thread-oom',
        'the checkpoint thread failed: Worker terminated due to reaching memory limit: JS heap out of memory',
      ],
    ])('the checkpoint thread that %s during the frozen pass: thawed, CHECKPOINT_FAILED, the supervisor goes on', async (_how, point, message) => {
      await d.terminate();
      d.withEnv({ SBX_FAULT_POINT: point }).withConfig({ checkpoint: { freeze: true, workerHeapMiB: 64 } }); // the thread's heap cap, 1024 MiB otherwise
      const from = d.log().length;
      await d.start();
      const r = await d.sbx(['checkpoint', '--workspace', ws, '--json']);
      expect(r.status).toBe(125);
      expect(JSON.parse(r.stdout.toString()).error).toMatchObject({ code: 'CHECKPOINT_FAILED', message: expect.stringContaining(message) });
      expect(await writeCompletes('after-exit')).toBe(0);
      expect(d.log().slice(from)).toContain('thawed by the supervisor');
      // Still serving: a checkpoint of a directory not frozen (a new thread) completes.
      expect(await checkpoint(d, join(ws, 'sub'))).toMatchObject({ consistent: true, freeze: { frozen: false } });
      await d.terminate();
      d.withEnv(undefined).withConfig({ checkpoint: { freeze: true } });
      await d.start();
    });
  },
);
