// The stat cache's file (supervisor/checkpoint/stat-cache-file.ts): every kind of entry and its
// directories' trees read back exactly as written (members the same entry objects, so a capture
// can keep a tree); a copy of another directory, signed by another key, damaged at any byte or
// cut short is no cache at all; a tree with a member that is not an entry is left out.
import { createHash, generateKeyPairSync, sign, verify } from 'node:crypto';
import {
  closeSync,
  constants,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statfsSync,
  statSync,
  symlinkSync,
  unlinkSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  decodeStatCache,
  encodeStatCache,
  loadStatCache,
  MAX_STAT_CACHE_FILES,
  saveStatCache,
  statCacheFileName,
  touchStatCache,
} from '../../../../supervisor/checkpoint/stat-cache-file.js';
import type { CapturedEntry } from '../../../../supervisor/checkpoint/passes.js';
import { StatCache, type CaptureSeed } from '../../../../supervisor/checkpoint/stat-cache.js';
import type { DirTree } from '../../../../supervisor/checkpoint/trees.js';

const sha = (s: string) => createHash('sha256').update(s).digest('hex');
// ino: an inode number of 2^63 or more as stat gives it, signed (overlayfs xino sets bit 63): read back wrapped positive, no entry matched after a restart.
const stat = { uid: 1000, gid: 1000, mtimeNs: 1_733_550_000_123_456_789n, ctimeNs: -5n, ino: -(2n ** 63n) + 1_526_877n, stRdev: 0, stDev: 2049 };

function entries(): CapturedEntry[] {
  return [
    { key: 'd', type: 'dir', mode: 0o755, size: 0, stMode: 0o40755, stSize: 4096, ...stat },
    // A name that is not UTF-8 (latin1 keys: a byte per char), a size past 2^32, an mtime before 1970.
    {
      key: 'd/caf\xe9\xff',
      type: 'file',
      mode: 0o4755,
      size: 2 ** 40 + 3,
      sha256: sha('big'),
      stMode: 0o104755,
      stSize: 2 ** 40 + 3,
      ...stat,
      mtimeNs: -1_000_000_001n,
      jsonBytes: 211,
    },
    { key: 'd/empty', type: 'file', mode: 0o600, size: 0, sha256: sha(''), stMode: 0o100600, stSize: 0, ...stat },
    { key: 'd/link', type: 'symlink', mode: 0o777, size: 3, target: Buffer.from([0x2e, 0xff, 0x0a]), stMode: 0o120777, stSize: 3, ...stat },
    { key: 'dev', type: 'char', mode: 0o666, size: 0, rdev: 259, stMode: 0o20666, stSize: 0, ...stat, stRdev: 259 },
    // Times past int64 nanoseconds (touch -d 2300; 6000 on tmpfs; 1600).
    {
      key: 'fifo',
      type: 'fifo',
      mode: 0o644,
      size: 0,
      stMode: 0o10644,
      stSize: 0,
      ...stat,
      mtimeNs: 10_413_792_000_123_456_789n,
      ctimeNs: -11_676_096_000_500_000_000n,
    },
    {
      key: 'far',
      type: 'file',
      mode: 0o644,
      size: 0,
      sha256: sha(''),
      stMode: 0o100644,
      stSize: 0,
      ...stat,
      mtimeNs: 126_227_808_000_000_000_000n,
      ctimeNs: -(2n ** 63n),
    },
    { key: 'mnt', type: 'dir', mode: 0o755, size: 0, mount: true, stMode: 0o40755, stSize: 4096, ...stat },
  ];
}

/** What a copy gives back of entries: all but their manifest bytes (jsonBytes: the walk counts those again). */
const asRead = (l: CapturedEntry[]) => l.map(({ jsonBytes: _countedAgain, ...e }) => e);

function seedOf(list: CapturedEntry[], trees?: Map<string, DirTree>): CaptureSeed {
  return { entries: new Map(list.map((e) => [e.key, e])), trees, rootSig: 'dir:4096:16877:0:0:1:2:3:0', rootFs: '2049:31', boundary: { epoch: 'e', seq: 9 } };
}

describe('the stat cache file', () => {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  const signed = (body: Buffer, key = privateKey) => Buffer.concat([body, sign(null, createHash('sha256').update(body).digest(), key)]);
  /** What loadStatCache says of these bytes as /work/ws's copy in a store of its own. */
  const loadFrom = (bytes: Buffer) => {
    const store = mkdtempSync(join(tmpdir(), 'sbx-stat-cache-'));
    const fd = openSync(store, constants.O_RDONLY | constants.O_DIRECTORY);
    try {
      mkdirSync(join(store, 'index'));
      writeFileSync(join(store, 'index', statCacheFileName('/work/ws')), bytes);
      return loadStatCache(fd, '/work/ws', privateKey.export({ type: 'pkcs8', format: 'pem' }).toString());
    } finally {
      closeSync(fd);
      rmSync(store, { recursive: true, force: true });
    }
  };

  it('reads back every kind of entry and the trees whose members are all entries, members as the same objects', () => {
    const list = entries();
    const trees = new Map<string, DirTree>([
      ['', { members: [list[0], list[4], list[5], list[6]], subtrees: [sha('tree d')], id: sha('tree root'), bytes: 900 }],
      ['d', { members: [list[1], list[2], list[3]], subtrees: [], id: sha('tree d'), bytes: 700 }],
      // A member that is not an entry (a racily clean file, left out of the cache): not written.
      ['x', { members: [{ ...list[2], key: 'x/racy' }], subtrees: [], id: sha('tree x'), bytes: 100 }],
    ]);
    const back = decodeStatCache(signed(encodeStatCache('/work/ws', seedOf(list, trees))), '/work/ws', publicKey);
    expect(back).not.toBeNull();
    // No boundary (the journal of another run), store id or presence: nothing a restart may not trust.
    expect(back!.boundary).toBeNull();
    expect(back!.storeId).toBeUndefined();
    expect(back!.presentIn).toBeUndefined();
    expect([back!.rootSig, back!.rootFs]).toEqual(['dir:4096:16877:0:0:1:2:3:0', '2049:31']);
    expect([...back!.entries.values()]).toEqual(asRead(list));
    expect(back!.entries.get('d/caf\xe9\xff')).not.toHaveProperty('jsonBytes');
    expect([...back!.trees!.keys()]).toEqual(['', 'd']);
    const d = back!.trees!.get('d')!;
    expect(d).toEqual({ ...trees.get('d'), members: asRead(trees.get('d')!.members) });
    expect(d.members.every((m) => back!.entries.get(m.key) === m)).toBe(true);
    expect(back!.trees!.get('')!.members[0]).toBe(back!.entries.get('d'));
  });

  it('is no cache when it is of another directory, signed by another key, damaged at any byte, or cut short', () => {
    const body = encodeStatCache('/work/ws', seedOf(entries()));
    const good = signed(body);
    expect(decodeStatCache(good, '/work/ws', publicKey)?.entries.size).toBe(8);
    expect(decodeStatCache(good, '/work/other', publicKey)).toBeNull();
    expect(decodeStatCache(signed(body, generateKeyPairSync('ed25519').privateKey), '/work/ws', publicKey)).toBeNull();
    for (let at = 0; at < good.length; at++) {
      const bad = Buffer.from(good);
      bad[at] ^= 0x40;
      expect(decodeStatCache(bad, '/work/ws', publicKey), `byte ${at} flipped`).toBeNull();
    }
    for (const n of [0, 8, 20, good.length - 65, good.length - 1]) expect(decodeStatCache(good.subarray(0, n), '/work/ws', publicKey), `${n} bytes`).toBeNull();
    // Signed but cut short inside (a torn write re-signed cannot happen; a bug in a reader must not take it).
    expect(decodeStatCache(signed(body.subarray(0, body.length - 5)), '/work/ws', publicKey)).toBeNull();
  });

  it('is no cache when a count is more than its bytes could hold, or not a count, even signed', () => {
    const list = entries();
    const trees = new Map<string, DirTree>([['d', { members: [list[1], list[2], list[3]], subtrees: [], id: sha('tree d'), bytes: 700 }]]);
    const body = encodeStatCache('/work/ws', seedOf(list, trees));
    // The header: MAGIC, then a u32 length and its JSON.
    const headerBytes = body.readUInt32LE(8);
    const header = JSON.parse(body.subarray(12, 12 + headerBytes).toString('utf8')) as Record<string, unknown>;
    const withHeader = (fields: Record<string, unknown>) => {
      const json = Buffer.from(JSON.stringify({ ...header, ...fields }));
      const length = Buffer.alloc(4);
      length.writeUInt32LE(json.length);
      return Buffer.concat([body.subarray(0, 8), length, json, body.subarray(12 + headerBytes)]);
    };
    expect(decodeStatCache(signed(withHeader({})), '/work/ws', publicKey)?.entries.size).toBe(8);
    for (const fields of [{ entries: 1e9 }, { entries: 2 ** 53 }, { entries: -1 }, { entries: 8.5 }, { entries: '8' }, { dirs: 1e9 }, { dirs: 2 }])
      expect(decodeStatCache(signed(withHeader(fields)), '/work/ws', publicKey), JSON.stringify(fields)).toBeNull();
    // The tree's member count (after its key, id and bytes: the body's last 4 + 3*4 + 4 bytes are the count, 3 members, 0 subtrees) set to 2^32 - 1.
    const members = Buffer.from(body);
    const at = members.length - (4 + 3 * 4 + 4);
    expect(members.readUInt32LE(at)).toBe(3);
    members.writeUInt32LE(0xffffffff, at);
    expect(decodeStatCache(signed(members), '/work/ws', publicKey)).toBeNull();
  });

  it('is no cache when signed but holding an entry no capture makes, or a header that is not one', () => {
    const list = entries();
    const decode = (l: CapturedEntry[], seed = seedOf(l)) => decodeStatCache(signed(encodeStatCache('/work/ws', seed)), '/work/ws', publicKey);
    expect(decode(list)?.entries.size).toBe(8);
    const bad = 'damaged: an entry that cannot be one (a file without its digest, a mode that is not its stat, a size that is no count)';
    const cases: [string, (e: CapturedEntry[]) => void][] = [
      ['a file without its digest', (l) => delete l[2]!.sha256],
      ['a link without its target', (l) => delete l[3]!.target],
      ['a device without its number', (l) => delete l[4]!.rdev],
      ['a size that is NaN', (l) => (l[2]!.size = NaN)],
      ['a size below 0', (l) => (l[2]!.size = -1)],
      ['a fractional st_size', (l) => (l[2]!.stSize = 0.5)],
      ['an infinite st_dev', (l) => (l[2]!.stDev = Infinity)],
      ['a mode past the permission bits', (l) => (l[2]!.mode = 0xffffffff)],
      ['a mode that is not its stat', (l) => (l[2]!.mode = 0o777)],
      ['a mount point that is a file', (l) => (l[2]!.mount = true)],
    ];
    for (const [what, spoil] of cases) {
      const l = entries();
      spoil(l);
      const body = encodeStatCache('/work/ws', seedOf(l));
      const got = loadFrom(signed(body));
      expect(got, what).toEqual({ rejected: bad });
    }
    expect(decode(list, { ...seedOf(list), rootSig: 7 as unknown as string })).toBeNull();
    // A tree's size that is no count.
    const trees = new Map<string, DirTree>([['d', { members: [list[1]!, list[2]!, list[3]!], subtrees: [], id: sha('tree d'), bytes: NaN }]]);
    expect(loadFrom(signed(encodeStatCache('/work/ws', seedOf(list, trees))))).toEqual({ rejected: 'damaged: a tree whose size is no count' });
    // Manifest bytes are never taken from a copy (NaN, 2^52: the walk counts them again).
    for (const jsonBytes of [NaN, 2 ** 52, 0]) {
      const l = entries();
      l[1]!.jsonBytes = jsonBytes;
      expect(decode(l)?.entries.get('d/caf\xe9\xff'), String(jsonBytes)).not.toHaveProperty('jsonBytes');
    }
    expect(loadFrom(signed(encodeStatCache('/work/ws', { ...seedOf(list), rootFs: {} as unknown as string })))).toEqual({
      rejected: 'damaged: its header is not one',
    });
  });

  it("is written when the thread is idle (flush), never after the next capture of its directory was offered or failed, and another directory's waiting write is done first", () => {
    const store = mkdtempSync(join(tmpdir(), 'sbx-stat-cache-'));
    const fd = openSync(store, constants.O_RDONLY | constants.O_DIRECTORY);
    try {
      const pem = privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
      const cache = new StatCache();
      let n = 0;
      /** One capture of root offered (its entries `list`; the seed's map updated in place when `update`) and its read-back answered. */
      const capture = (root: string, list: CapturedEntry[], passed: boolean, update?: Map<string, CapturedEntry>) => {
        const id = `m${++n}`;
        const changes = { hidden: [] as string[], set: new Map(list.map((e) => [e.key, e])) };
        cache.offer(
          id,
          root,
          list,
          { dirs: new Map(), storeId: 's' },
          {
            rootSig: 'dir:4096:16877:0:0:1:2:3:0',
            rootFs: '2049:u31:b',
            startedAtNs: 1n << 62n,
            vetted: new Set(),
            boundary: null,
            presentIn: { storeDir: store, gen: 0 },
            kept: null,
            update: update ? { seed: update, changes: changes as never } : null,
            objects: undefined,
            signingKeyPem: pem,
            reserveBytes: 0,
          },
        );
        cache.confirm(id, passed, fd);
      };
      const keysOnDisk = (root: string) => {
        const l = loadStatCache(fd, root, pem);
        return 'seed' in l ? [...l.seed.entries.keys()] : l;
      };
      const first = entries().slice(0, 4);
      capture('/ws/a', first, true);
      // Confirmed, not written until the thread is idle.
      expect(loadStatCache(fd, '/ws/a', pem)).toEqual({ absent: true });
      expect(cache.flush()).toBeGreaterThan(0);
      expect(keysOnDisk('/ws/a')).toEqual(first.map((e) => e.key));
      expect(cache.flush()).toBe(0);
      // A second capture confirmed and waiting; a third offered over the seed's map (updated in
      // place with an entry its read-back then refuses): the second's write is dropped, never
      // written with the third's entries, and the refusal removes the copy.
      capture('/ws/a', first, true);
      const seedMap = cache.seed('/ws/a').seed!.entries;
      capture('/ws/a', entries().slice(4, 6), false, seedMap);
      expect(seedMap.size).toBeGreaterThan(first.length); // the map the waiting write held was changed
      expect(cache.flush()).toBe(0);
      expect(loadStatCache(fd, '/ws/a', pem)).toEqual({ absent: true });
      // A capture of a failed directory (drop) takes its waiting write with it.
      capture('/ws/b', first, true);
      cache.drop('/ws/b', fd);
      expect(cache.flush()).toBe(0);
      expect(loadStatCache(fd, '/ws/b', pem)).toEqual({ absent: true });
      // Another directory's capture confirmed while one waits: the waiting one is written first.
      capture('/ws/c', first, true);
      capture('/ws/d', first.slice(0, 2), true);
      expect(keysOnDisk('/ws/c')).toEqual(first.map((e) => e.key));
      expect(cache.flush()).toBeGreaterThan(0);
      expect(keysOnDisk('/ws/d')).toEqual(first.slice(0, 2).map((e) => e.key));
    } finally {
      closeSync(fd);
      rmSync(store, { recursive: true, force: true });
    }
  });

  it('is dropped, memory and disk, by StatCache.drop (a capture that failed on it): the next capture of its directory has no seed', () => {
    const store = mkdtempSync(join(tmpdir(), 'sbx-stat-cache-'));
    const fd = openSync(store, constants.O_RDONLY | constants.O_DIRECTORY);
    try {
      const pem = privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
      expect(saveStatCache(fd, '/work/ws', seedOf(entries()), pem, 0)).toBeGreaterThan(0);
      const cache = new StatCache();
      expect(cache.seed('/work/ws', { storeFd: fd, signingKeyPem: pem }).seed?.entries.size).toBe(8);
      cache.drop('/work/ws', fd);
      expect(cache.seed('/work/ws', { storeFd: fd, signingKeyPem: pem })).toEqual({ seed: undefined });
      expect(loadStatCache(fd, '/work/ws', pem)).toEqual({ absent: true });
      // A new thread (a new StatCache) finds no copy either.
      expect(new StatCache().seed('/work/ws', { storeFd: fd, signingKeyPem: pem })).toEqual({});
    } finally {
      closeSync(fd);
      rmSync(store, { recursive: true, force: true });
    }
  });

  it('is written to index/ and read back with the signing key; kept to the most recently used copies; not written into the room to keep free', () => {
    const store = mkdtempSync(join(tmpdir(), 'sbx-stat-cache-'));
    const fd = openSync(store, constants.O_RDONLY | constants.O_DIRECTORY);
    try {
      const pem = privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
      const list = entries();
      expect(saveStatCache(fd, '/ws/0', seedOf(list), pem, 0)).toBeGreaterThan(0);
      const loaded = loadStatCache(fd, '/ws/0', pem);
      expect('seed' in loaded && [...loaded.seed.entries.values()]).toEqual(asRead(list));
      expect(loadStatCache(fd, '/ws/1', pem)).toEqual({ absent: true });
      const other = generateKeyPairSync('ed25519').privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
      expect(loadStatCache(fd, '/ws/0', other)).toEqual({ rejected: 'not signed by this key, or damaged' });
      // One copy per directory, the least recently used removed past MAX_STAT_CACHE_FILES (a touch is a use).
      const index = join(store, 'index');
      for (let i = 1; i < MAX_STAT_CACHE_FILES; i++) saveStatCache(fd, `/ws/${i}`, seedOf(list), pem, 0);
      for (let i = 0; i < MAX_STAT_CACHE_FILES; i++) utimesSync(join(index, statCacheFileName(`/ws/${i}`)), 1000 + i, 1000 + i);
      expect(touchStatCache(fd, '/ws/0')).toBe(true);
      saveStatCache(fd, `/ws/${MAX_STAT_CACHE_FILES}`, seedOf(list), pem, 0);
      const names = readdirSync(index);
      expect(names).toHaveLength(MAX_STAT_CACHE_FILES);
      expect(names).toContain(statCacheFileName('/ws/0'));
      expect(names).not.toContain(statCacheFileName('/ws/1'));
      expect(names).toContain(statCacheFileName(`/ws/${MAX_STAT_CACHE_FILES}`));
      expect(touchStatCache(fd, '/ws/1')).toBe(false);
      // Not a regular file: not used, never followed.
      symlinkSync(join(index, statCacheFileName('/ws/0')), join(index, statCacheFileName('/ws/1')));
      expect(loadStatCache(fd, '/ws/1', pem)).toEqual({ rejected: 'a symbolic link (never followed)' });
      expect(touchStatCache(fd, '/ws/1')).toBe(false);
      unlinkSync(join(index, statCacheFileName('/ws/1')));
      // Over the bound a copy is read under (the capture's checkpoint.maxManifestBytes): not read.
      const size = statSync(join(index, statCacheFileName('/ws/0'))).size;
      expect(loadStatCache(fd, '/ws/0', pem, size / 2)).not.toHaveProperty('rejected');
      expect(loadStatCache(fd, '/ws/0', pem, (size - 1) / 2)).toEqual({ rejected: `${size} bytes, over ${size - 1}` });
      // A write cut short left its temp file: the next write of any copy removes it.
      writeFileSync(join(index, `.${statCacheFileName('/ws/9')}.tmp`), 'cut short');
      saveStatCache(fd, '/ws/0', seedOf(list), pem, 0);
      expect(readdirSync(index).filter((n) => n.endsWith('.tmp'))).toEqual([]);
      // Past the room to keep free: not written, and the copy there removed (it would be older than memory).
      expect(saveStatCache(fd, '/ws/1', seedOf(list), pem, Number.MAX_SAFE_INTEGER)).toBe(0);
      expect(loadStatCache(fd, '/ws/1', pem)).toEqual({ absent: true });
      expect(readdirSync(index).filter((n) => n.endsWith('.tmp'))).toEqual([]);
    } finally {
      closeSync(fd);
      rmSync(store, { recursive: true, force: true });
    }
  });

  it('is written a chunk at a time: the same bytes as encoded whole, signed over their digest; past the room mid-file, no copy', () => {
    const store = mkdtempSync(join(tmpdir(), 'sbx-stat-cache-'));
    const fd = openSync(store, constants.O_RDONLY | constants.O_DIRECTORY);
    try {
      const pem = privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
      // 30,000 entries: about 3.5 MB, several of the writer's 1 MiB chunks.
      const [dir, file] = entries();
      const list: CapturedEntry[] = [dir!];
      for (let i = 0; i < 30_000; i++) list.push({ ...file!, key: `d/file-${i}`, sha256: sha(`content ${i}`), ino: BigInt(i) });
      const trees = new Map<string, DirTree>([['d', { members: list.slice(1), subtrees: [], id: sha('tree d'), bytes: 1234 }]]);
      const bytes = saveStatCache(fd, '/ws/big', seedOf(list, trees), pem, 0);
      const body = encodeStatCache('/ws/big', seedOf(list, trees));
      expect(body.length).toBeGreaterThan(3 << 20);
      const onDisk = readFileSync(join(store, 'index', statCacheFileName('/ws/big')));
      expect(bytes).toBe(body.length + 64);
      expect(onDisk.subarray(0, body.length).equals(body)).toBe(true);
      expect(onDisk.length).toBe(body.length + 64);
      expect(verify(null, createHash('sha256').update(body).digest(), publicKey, onDisk.subarray(body.length))).toBe(true);
      const loaded = loadStatCache(fd, '/ws/big', pem);
      expect('seed' in loaded && [...loaded.seed.entries.values()]).toEqual(asRead(list));
      expect('seed' in loaded && loaded.seed.trees?.get('d')?.members.length).toBe(30_000);
      // Read in chunks, so what is wrong is found where it is: each says why it is not used.
      const copy = join(store, 'index', statCacheFileName('/ws/big'));
      const flip = (b: Buffer, at: number) => {
        b[at] ^= 1;
        return b;
      };
      const spoiled = (spoil: (b: Buffer) => Buffer) => {
        writeFileSync(copy, spoil(Buffer.from(onDisk)));
        return loadStatCache(fd, '/ws/big', pem);
      };
      for (const n of [(1 << 20) + 1, 1 << 20, (1 << 20) - 1])
        expect(
          spoiled((b) => b.subarray(0, n)),
          `cut at ${n}`,
        ).toEqual({ rejected: 'damaged: its header counts more than its bytes hold' });
      // Cut inside the last field (tree d's subtree count, the body's last 4 bytes).
      for (const n of [onDisk.length - 1, onDisk.length - 3])
        expect(
          spoiled((b) => b.subarray(0, n)),
          `cut at ${n}`,
        ).toEqual({ rejected: 'damaged: cut short' });
      // Cut inside tree d's 30,000 members (4 bytes each): their count is more than the bytes left.
      for (const n of [onDisk.length - 100, onDisk.length - 64 * 1024])
        expect(
          spoiled((b) => b.subarray(0, n)),
          `cut at ${n}`,
        ).toEqual({ rejected: 'damaged: a count more than its bytes hold' });
      expect(spoiled((b) => b.subarray(0, 40))).toEqual({ rejected: 'damaged: cut short (40 bytes)' });
      expect(spoiled((b) => flip(b, b.length - 1))).toEqual({ rejected: 'not signed by this key, or damaged' });
      // The body's last byte: the high byte of tree d's subtree count (0), made 2^24.
      expect(spoiled((b) => flip(b, b.length - 65))).toEqual({ rejected: 'damaged: a count more than its bytes hold' });
      expect(spoiled((b) => flip(b, 0))).toEqual({ rejected: 'damaged: not a stat cache file (SBXSTAT1)' });
      expect(spoiled((b) => Buffer.concat([b, Buffer.alloc(100)]))).toEqual({ rejected: 'damaged: bytes past its entries and trees, or a path twice' });
      writeFileSync(copy, onDisk);
      expect(loadStatCache(fd, '/ws/other', pem)).toEqual({ absent: true });
      renameSync(copy, join(store, 'index', statCacheFileName('/ws/other')));
      expect(loadStatCache(fd, '/ws/other', pem)).toEqual({ rejected: 'of another directory' });
      renameSync(join(store, 'index', statCacheFileName('/ws/other')), copy);
      // Room for about one chunk: the write stops (at the first chunk or a later one), nothing is left, the older copy goes.
      const fs = statfsSync(store);
      expect(saveStatCache(fd, '/ws/big', seedOf(list, trees), pem, Number(fs.bavail) * Number(fs.bsize) - (2 << 20))).toBe(0);
      expect(loadStatCache(fd, '/ws/big', pem)).toEqual({ absent: true });
      expect(readdirSync(join(store, 'index'))).toEqual([]);
    } finally {
      closeSync(fd);
      rmSync(store, { recursive: true, force: true });
    }
  });
});
