// The stat cache on disk (git's index, kept across restarts): per checkpointed directory, the
// entries of its last read-back checkpoint with the stat each was captured at, and its
// directories' trees, in the store's index/ (docs/reference/state-dir.md). Owns that file's
// format, its signed write (replaced whole, by rename) and its checked read; what is trusted
// across checkpoints, and when, is stat-cache.ts's.
import { createHash, createPrivateKey, createPublicKey, sign, verify, type Hash, type KeyObject } from 'node:crypto';
import {
  closeSync,
  constants,
  fstatSync,
  futimesSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readSync,
  renameSync,
  statfsSync,
  unlinkSync,
} from 'node:fs';
import { writeAll } from '../../core/fs/durable.js';
import { pathAt } from '../../core/fs/walk.js';
import { TIME_OUT_OF_RANGE } from '../../core/fs/native.js';
import { STORE_DIRS } from '../../core/state/names.js';
import { errnoCode } from '../../ipc/errno.js';
import type { EntryType } from '../../core/fs/walk.js';
import type { CapturedEntry } from './passes.js';
import type { DirTree } from './trees.js';
import type { CaptureSeed } from './stat-cache.js';
import { heapTick } from './heap-bound.js';

/** The file's first bytes: its format, version 1. */
const MAGIC = Buffer.from('SBXSTAT1');
/** An Ed25519 signature, last: over the SHA-256 of every byte before it. */
const SIGNATURE_BYTES = 64;
/** Copies kept in index/ at most (one per checkpointed directory): past it, the least recently used go (touchStatCache). */
export const MAX_STAT_CACHE_FILES = 16;
/** A file bigger than this is not read (about 4,000,000 entries): the capture reads every file instead. */
const MAX_STAT_CACHE_FILE_BYTES = 1 << 30;

/** The largest int64; the smallest, TIME_OUT_OF_RANGE, marks a time written as its digits (as the addon marks one given apart). */
const INT64_MAX = -TIME_OUT_OF_RANGE - 1n;
const TYPES: readonly Exclude<EntryType, 'unknown'>[] = ['file', 'dir', 'symlink', 'fifo', 'socket', 'char', 'block'];
const HAS_SHA256 = 1;
const HAS_TARGET = 2;
const HAS_RDEV = 4;
const IS_MOUNT = 8;
const HAS_JSON_BYTES = 16;

/** The header: what the entries are of, and what they were captured against. */
interface Header {
  root: string;
  rootFs: string;
  rootSig: string;
  entries: number;
  dirs: number;
}

/** The file of root in the store's index/: the hex SHA-256 of its path (a path is never a file name). */
export function statCacheFileName(root: string): string {
  return `${createHash('sha256').update(root).digest('hex')}.bin`;
}

/** What saveStatCache's sink throws when the file system is short of the room to keep free. */
const NO_ROOM = new Error('short of the room to keep free');
/** The bytes a Writer with a sink holds before it hands them on (and what it starts with). */
const WRITER_CHUNK_BYTES = 1 << 20;

/**
 * Little endian throughout. With a sink: the bytes go to it in chunks of about
 * WRITER_CHUNK_BYTES as they are written (the sink must use a chunk before it returns: its
 * buffer is written over next), so a file of any size takes one chunk of memory; without,
 * it grows and done() gives them all.
 */
class Writer {
  private buf = Buffer.allocUnsafe(WRITER_CHUNK_BYTES);
  private view = new DataView(this.buf.buffer, this.buf.byteOffset, this.buf.length);
  /** The bytes held (not yet handed to the sink). */
  length = 0;

  constructor(private readonly sink?: (chunk: Buffer) => void) {}

  /** Room for n more bytes; the offset to write them at. */
  private room(n: number): number {
    if (this.length + n > this.buf.length) {
      if (this.sink) this.flush();
      if (this.length + n > this.buf.length) {
        const next = Buffer.allocUnsafe(Math.max(this.buf.length * 2, this.length + n));
        this.buf.copy(next, 0, 0, this.length);
        this.buf = next;
        this.view = new DataView(next.buffer, next.byteOffset, next.length);
      }
    }
    const at = this.length;
    this.length = at + n;
    return at;
  }

  /** Hands the bytes held to the sink. */
  flush(): void {
    if (this.length > 0) this.sink!(this.buf.subarray(0, this.length));
    this.length = 0;
  }
  u8(v: number): void {
    const at = this.room(1);
    this.buf[at] = v;
  }
  u32(v: number): void {
    const at = this.room(4);
    this.view.setUint32(at, v, true);
  }
  f64(v: number): void {
    const at = this.room(8);
    this.view.setFloat64(at, v, true);
  }
  i64(v: bigint): void {
    const at = this.room(8);
    this.view.setBigInt64(at, v, true);
  }
  /** A time in ns: an i64, or past int64 (before 1677, after 2262) TIME_OUT_OF_RANGE and its decimal digits (latin1). */
  time(v: bigint): void {
    if (v > TIME_OUT_OF_RANGE && v <= INT64_MAX) return this.i64(v);
    this.i64(TIME_OUT_OF_RANGE);
    this.latin1(v.toString());
  }
  bytes(b: Uint8Array): void {
    const at = this.room(b.length);
    this.buf.set(b, at);
  }
  /** Length-prefixed (u32). */
  blob(b: Uint8Array): void {
    this.u32(b.length);
    this.bytes(b);
  }
  /** A latin1 string (a byte per char), length-prefixed (u32). */
  latin1(s: string): void {
    this.u32(s.length);
    const at = this.room(s.length);
    this.buf.write(s, at, s.length, 'latin1');
  }
  /** 64 hex digits as their 32 bytes. */
  sha256(hex: string): void {
    const at = this.room(32);
    if (this.buf.write(hex, at, 32, 'hex') !== 32) throw new Error(`not a SHA-256: ${hex}`);
  }
  done(): Buffer {
    return this.buf.subarray(0, this.length);
  }
}

/** What a Reader throws when the body ends before what it reads. */
const CUT_SHORT = new Error('cut short');

/** Where a Reader's bytes come from: up to length of the body's next bytes into buf at offset; how many (0: none left, or an error). */
type ByteSource = (buf: Buffer, offset: number, length: number) => number;

/** The bytes a Reader takes from its source at a time (a field longer than this is held whole). */
const READER_CHUNK_BYTES = 1 << 20;

/**
 * Little endian throughout, as Writer writes. Reads bodyBytes from its source a chunk of about
 * READER_CHUNK_BYTES at a time, each hashed into `hash` as it arrives, so a file of any size
 * takes one chunk of memory (and what is decoded from it). Throws CUT_SHORT past the body's
 * end. A Buffer it returns (bytes, blob) is valid until its next read.
 */
class Reader {
  private buf = Buffer.allocUnsafe(0);
  private view = new DataView(this.buf.buffer, this.buf.byteOffset, 0);
  /** The unread bytes held: buf[start, end). */
  private start = 0;
  private end = 0;
  /** The body's bytes not yet taken from the source. */
  private unread: number;

  constructor(
    private readonly source: ByteSource,
    bodyBytes: number,
    private readonly hash: Hash,
  ) {
    this.unread = bodyBytes;
  }

  /** The body's bytes not yet decoded (held, or still at the source). */
  get left(): number {
    return this.end - this.start + this.unread;
  }

  private need(n: number): number {
    if (this.end - this.start < n) this.fill(n);
    const at = this.start;
    this.start += n;
    return at;
  }

  /** Holds at least n unread bytes: what is held moved to the front, then chunks from the source. */
  private fill(n: number): void {
    if (n > this.left) throw CUT_SHORT;
    const held = this.end - this.start;
    const size = Math.max(n, Math.min(READER_CHUNK_BYTES, this.left));
    if (size > this.buf.length) {
      const next = Buffer.allocUnsafe(size);
      this.buf.copy(next, 0, this.start, this.end);
      this.buf = next;
      this.view = new DataView(next.buffer, next.byteOffset, next.length);
    } else {
      this.buf.copyWithin(0, this.start, this.end);
    }
    this.start = 0;
    this.end = held;
    while (this.end < n || (this.end < this.buf.length && this.unread > 0)) {
      const got = this.source(this.buf, this.end, Math.min(this.buf.length - this.end, this.unread));
      if (got <= 0) throw CUT_SHORT;
      this.hash.update(this.buf.subarray(this.end, this.end + got));
      this.end += got;
      this.unread -= got;
    }
  }

  u8(): number {
    return this.buf[this.need(1)];
  }
  u32(): number {
    return this.view.getUint32(this.need(4), true);
  }
  /** A u32 count of items of at least itemBytes each: more than the body has left is damage (nothing is allocated for it). */
  count(itemBytes: number): number {
    const n = this.u32();
    if (n * itemBytes > this.left) throw new Error('a count more than its bytes hold');
    return n;
  }
  f64(): number {
    return this.view.getFloat64(this.need(8), true);
  }
  i64(): bigint {
    return this.view.getBigInt64(this.need(8), true);
  }
  time(): bigint {
    const v = this.i64();
    if (v !== TIME_OUT_OF_RANGE) return v;
    const digits = this.latin1();
    if (!/^-?\d{1,28}$/.test(digits)) throw new Error('not a time');
    return BigInt(digits);
  }
  bytes(n: number): Buffer {
    const at = this.need(n);
    return this.buf.subarray(at, at + n);
  }
  blob(): Buffer {
    return this.bytes(this.u32());
  }
  latin1(): string {
    const n = this.u32();
    const at = this.need(n);
    return this.buf.toString('latin1', at, at + n);
  }
  sha256(): string {
    const at = this.need(32);
    return this.buf.toString('hex', at, at + 32);
  }
}

/**
 * The file's bytes for a seed (unsigned: signStatCache adds the signature). Its trees are
 * written only where every member is one of its entries (a racily clean file is left out of the
 * entries, so its directory's tree is built again), members by their index in the entries.
 */
export function encodeStatCache(root: string, seed: CaptureSeed): Buffer {
  const w = new Writer();
  encodeStatCacheTo(w, root, seed);
  return w.done();
}

/** encodeStatCache's bytes into w (with a sink, streamed: saveStatCache). */
function encodeStatCacheTo(w: Writer, root: string, seed: CaptureSeed): void {
  const index = new Map<CapturedEntry, number>();
  const entries = [...seed.entries.values()];
  entries.forEach((e, i) => index.set(e, i));
  const dirs: [string, DirTree][] = [];
  for (const [key, tree] of seed.trees ?? []) if (tree.members.every((m) => index.has(m))) dirs.push([key, tree]);
  const header: Header = { root, rootFs: seed.rootFs, rootSig: seed.rootSig, entries: entries.length, dirs: dirs.length };
  w.bytes(MAGIC);
  w.blob(Buffer.from(JSON.stringify(header)));
  for (const e of entries) {
    heapTick();
    const flags =
      (e.sha256 !== undefined ? HAS_SHA256 : 0) |
      (e.target !== undefined ? HAS_TARGET : 0) |
      (e.rdev !== undefined ? HAS_RDEV : 0) |
      (e.mount ? IS_MOUNT : 0) |
      (e.jsonBytes !== undefined ? HAS_JSON_BYTES : 0);
    w.u8(flags);
    w.u8(TYPES.indexOf(e.type));
    w.latin1(e.key);
    w.u32(e.mode);
    w.u32(e.uid);
    w.u32(e.gid);
    w.f64(e.size);
    w.time(e.mtimeNs);
    w.time(e.ctimeNs);
    w.i64(e.ino); // signed, as stat gives it (an inode number of 2^63 or more is negative there: overlayfs xino)
    w.u32(e.stMode);
    w.f64(e.stSize);
    w.f64(e.stRdev);
    w.f64(e.stDev);
    if (e.sha256 !== undefined) w.sha256(e.sha256);
    if (e.target !== undefined) w.blob(e.target);
    if (e.rdev !== undefined) w.f64(e.rdev);
    if (e.jsonBytes !== undefined) w.f64(e.jsonBytes);
  }
  for (const [key, tree] of dirs) {
    w.latin1(key);
    w.sha256(tree.id);
    w.f64(tree.bytes);
    w.u32(tree.members.length);
    for (const m of tree.members) w.u32(index.get(m)!);
    w.u32(tree.subtrees.length);
    for (const s of tree.subtrees) w.sha256(s);
  }
}

/**
 * The seed in bytes (encodeStatCache's, signed), or null when they are not a stat cache of root
 * signed by key's public key: any damage, another format or root. Its seed has no storeId,
 * presentIn, boundary or objects: after a restart no tree counts as checked by a read-back, each
 * file's object is looked up in the store, the journal is another, and the object list is made again.
 */
export function decodeStatCache(bytes: Buffer, root: string, publicKey: KeyObject): CaptureSeed | null {
  if (bytes.length < MAGIC.length + SIGNATURE_BYTES) return null;
  const bodyBytes = bytes.length - SIGNATURE_BYTES;
  let at = 0;
  const source: ByteSource = (buf, offset, length) => {
    const n = bytes.copy(buf, offset, at, Math.min(at + length, bodyBytes));
    at += n;
    return n;
  };
  const decoded = decodeStatCacheFrom(source, bodyBytes, bytes.subarray(bodyBytes), root, publicKey);
  return typeof decoded === 'string' ? null : decoded;
}

/** Smallest encodings (stat-cache-file format, encodeStatCacheTo): an entry (flags, type, an empty key, the fixed fields), a tree (an empty key, id, bytes, two counts). */
const MIN_ENTRY_BYTES = 2 + 4 + 3 * 4 + 8 + 3 * 8 + 4 + 3 * 8;
const MIN_TREE_BYTES = 4 + 32 + 8 + 4 + 4;

/** A count in a copy (a size, a device number, a manifest entry's bytes): a whole number, 0 or more. */
const isCount = (n: number | undefined) => n === undefined || (Number.isInteger(n) && n >= 0);

/**
 * Whether a decoded entry is one a capture could have made (passes.ts entry()): a file with its
 * digest, a link with its target, a device with its number, a mount point only a directory, the
 * permission bits of its stat, counts that are counts. A signed
 * copy is still checked: one a bug wrote would otherwise fail every checkpoint of its directory.
 */
function wellFormed(e: CapturedEntry): boolean {
  if (e.type === 'file' && e.sha256 === undefined) return false;
  if (e.type === 'symlink' && e.target === undefined) return false;
  if ((e.type === 'char' || e.type === 'block') && e.rdev === undefined) return false;
  if (e.mount && e.type !== 'dir') return false;
  // The permission bits are those of the stat it was captured at (passes.ts: mode is st_mode & 07777).
  if (e.mode !== (e.stMode & 0o7777)) return false;
  return [e.size, e.stSize, e.stRdev, e.stDev, e.rdev].every(isCount);
}

/**
 * decodeStatCache from a source of the body's bodyBytes, read a chunk at a time and hashed as
 * decoded; the seed counts only once every byte was decoded and the signature is over their
 * digest. Until then nothing is allocated for a count the body's bytes could not hold (a forged
 * header or count is damage, not a huge array). Else why not, for the log (what unsigned bytes
 * say: any of it may be damage). Throws the source's errno errors.
 */
function decodeStatCacheFrom(source: ByteSource, bodyBytes: number, signature: Buffer, root: string, publicKey: KeyObject): CaptureSeed | string {
  const digest = createHash('sha256');
  const r = new Reader(source, bodyBytes, digest);
  let seed: CaptureSeed;
  try {
    if (!r.bytes(MAGIC.length).equals(MAGIC)) return 'damaged: not a stat cache file (SBXSTAT1)';
    let header: Header;
    try {
      header = JSON.parse(r.blob().toString('utf8')) as Header;
    } catch (err) {
      if (err === CUT_SHORT) throw err;
      return 'damaged: its header is not JSON';
    }
    if (typeof header.rootSig !== 'string' || typeof header.rootFs !== 'string') return 'damaged: its header is not one';
    if (header.root !== root) return 'of another directory';
    const counts = [header.entries, header.dirs];
    if (!counts.every((n) => Number.isSafeInteger(n) && n >= 0) || header.entries * MIN_ENTRY_BYTES + header.dirs * MIN_TREE_BYTES > r.left)
      return 'damaged: its header counts more than its bytes hold';
    const list: CapturedEntry[] = new Array<CapturedEntry>(header.entries);
    const entries = new Map<string, CapturedEntry>();
    for (let i = 0; i < header.entries; i++) {
      heapTick();
      const flags = r.u8();
      const type = TYPES[r.u8()];
      if (type === undefined) return 'damaged: an entry of no known type';
      const e: CapturedEntry = {
        key: r.latin1(),
        type,
        mode: r.u32(),
        uid: r.u32(),
        gid: r.u32(),
        size: r.f64(),
        mtimeNs: r.time(),
        ctimeNs: r.time(),
        ino: r.i64(),
        stMode: r.u32(),
        stSize: r.f64(),
        stRdev: r.f64(),
        stDev: r.f64(),
      };
      if (flags & HAS_SHA256) e.sha256 = r.sha256();
      if (flags & HAS_TARGET) e.target = Buffer.from(r.blob());
      if (flags & HAS_RDEV) e.rdev = r.f64();
      if (flags & IS_MOUNT) e.mount = true;
      // Its manifest entry's bytes are not taken: they count against checkpoint.maxManifestBytes
      // with no check of their own (a wrong one failed every checkpoint, or let one past the
      // bound); the walk counts each entry again (passes.ts entryJsonBytes).
      if (flags & HAS_JSON_BYTES) r.f64();
      if (!wellFormed(e)) return 'damaged: an entry that cannot be one (a file without its digest, a mode that is not its stat, a size that is no count)';
      list[i] = e;
      entries.set(e.key, e);
    }
    const trees = new Map<string, DirTree>();
    for (let i = 0; i < header.dirs; i++) {
      const key = r.latin1();
      const id = r.sha256();
      const treeBytes = r.f64();
      if (!isCount(treeBytes)) return 'damaged: a tree whose size is no count';
      const members: CapturedEntry[] = new Array<CapturedEntry>(r.count(4));
      for (let m = 0; m < members.length; m++) {
        const e = list[r.u32()];
        if (e === undefined) return 'damaged: a tree member that is no entry';
        members[m] = e;
      }
      const subtrees: string[] = new Array<string>(r.count(32));
      for (let s = 0; s < subtrees.length; s++) subtrees[s] = r.sha256();
      trees.set(key, { members, subtrees, id, bytes: treeBytes });
    }
    if (r.left !== 0 || entries.size !== header.entries) return 'damaged: bytes past its entries and trees, or a path twice';
    seed = { entries, trees, rootSig: header.rootSig, rootFs: header.rootFs, boundary: null };
  } catch (err) {
    // The source's errors (errno: EIO, say) are the caller's; any other is damage.
    if (errnoCode(err) !== undefined) throw err;
    return `damaged: ${(err as Error).message}`;
  }
  return verify(null, digest.digest(), publicKey, signature) ? seed : 'not signed by this key, or damaged';
}

/** The signing key's public half (one PEM parsed once per thread). */
const keys = new Map<string, { privateKey: KeyObject; publicKey: KeyObject }>();
function keyPair(signingKeyPem: string): { privateKey: KeyObject; publicKey: KeyObject } {
  let k = keys.get(signingKeyPem);
  if (!k) {
    const privateKey = createPrivateKey(signingKeyPem);
    k = { privateKey, publicKey: createPublicKey(privateKey) };
    keys.clear();
    keys.set(signingKeyPem, k);
  }
  return k;
}

/** index/ in the store (storeFd), made 0700 when create; its fd, or null (absent, or not a directory: a link is never followed). */
function indexDir(storeFd: number, create: boolean): number | null {
  const path = pathAt(storeFd, STORE_DIRS.index);
  if (create) {
    try {
      mkdirSync(path, 0o700);
    } catch (err) {
      if (errnoCode(err) !== 'EEXIST') throw err;
    }
  }
  try {
    return openSync(path, constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW);
  } catch (err) {
    if (errnoCode(err) === 'ENOENT' || errnoCode(err) === 'ENOTDIR' || errnoCode(err) === 'ELOOP') return null;
    throw err;
  }
}

/**
 * Writes root's stat cache (replacing the last: a temp file, then rename(2); not fsync'ed, so a
 * crash may leave the older one, or none: both are only read again, never trusted wrongly),
 * signed with the checkpoint signing key. Not written when it would leave the store's file
 * system less than reserveBytes free. Returns the bytes written (0: not written). Throws
 * errno errors (the caller drops the cache then: removeStatCache).
 */
export function saveStatCache(storeFd: number, root: string, seed: CaptureSeed, signingKeyPem: string, reserveBytes: number): number {
  const dirFd = indexDir(storeFd, true);
  if (dirFd === null) return 0;
  const name = statCacheFileName(root);
  const temp = `.${name}.tmp`;
  try {
    unlinkQuiet(dirFd, temp);
    const fd = openSync(pathAt(dirFd, temp), constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
    // Written as encoded, a chunk at a time (1,000,000 entries are ~130 MB: never whole in
    // memory), hashed as written; each chunk only while the file system keeps reserveBytes free.
    const digest = createHash('sha256');
    let written = 0;
    const put = (b: Buffer) => {
      writeAll(fd, b);
      written += b.length;
    };
    try {
      const w = new Writer((chunk) => {
        const fs = statfsSync(pathAt(dirFd, '.'));
        if (Number(fs.bavail) * Number(fs.bsize) - chunk.length - SIGNATURE_BYTES < reserveBytes) throw NO_ROOM;
        digest.update(chunk);
        put(chunk);
      });
      encodeStatCacheTo(w, root, seed);
      w.flush();
      put(sign(null, digest.digest(), keyPair(signingKeyPem).privateKey));
    } catch (err) {
      closeSync(fd);
      unlinkQuiet(dirFd, temp);
      if (err !== NO_ROOM) throw err;
      // Short of the room to keep free: no copy (the last one, of other entries, goes too).
      unlinkQuiet(dirFd, name);
      return 0;
    }
    closeSync(fd);
    try {
      renameSync(pathAt(dirFd, temp), pathAt(dirFd, name));
    } catch (err) {
      unlinkQuiet(dirFd, temp); // a directory at the copy's name, say
      throw err;
    }
    keepNewest(dirFd, MAX_STAT_CACHE_FILES);
    return written;
  } finally {
    closeSync(dirFd);
  }
}

/** What loadStatCache found: the seed, no copy, or a copy not used (why, for the log). */
export type StatCacheLoad = { seed: CaptureSeed } | { absent: true } | { rejected: string };

/** Reads root's stat cache from the store (storeFd): its seed, none, or why the copy there is not used (not a regular file, over twice maxBytes (not read: the capture's checkpoint.maxManifestBytes; a copy's entries and trees take less than twice their manifest's bytes), cut short while read, damaged (cut short, say, or a count past its bytes), of another directory, or not signed by this key). */
export function loadStatCache(storeFd: number, root: string, signingKeyPem: string, maxBytes = MAX_STAT_CACHE_FILE_BYTES): StatCacheLoad {
  let dirFd: number | null;
  try {
    dirFd = indexDir(storeFd, false);
  } catch (err) {
    return { rejected: `index/ cannot be opened: ${(err as Error).message}` };
  }
  if (dirFd === null) return { absent: true };
  try {
    const fd = openSync(pathAt(dirFd, statCacheFileName(root)), constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
    try {
      const st = fstatSync(fd);
      if (!st.isFile()) return { rejected: 'not a regular file' };
      const bound = Math.min(2 * maxBytes, MAX_STAT_CACHE_FILE_BYTES);
      if (st.size > bound) return { rejected: `${st.size} bytes, over ${bound}` };
      if (st.size < MAGIC.length + SIGNATURE_BYTES) return { rejected: `damaged: cut short (${st.size} bytes)` };
      // Read a chunk at a time (1,000,000 entries are ~130 MB: never whole in memory), the signature first.
      const bodyBytes = st.size - SIGNATURE_BYTES;
      const signature = Buffer.alloc(SIGNATURE_BYTES);
      let at = 0;
      let short = readSync(fd, signature, 0, SIGNATURE_BYTES, bodyBytes) !== SIGNATURE_BYTES;
      const source: ByteSource = (buf, offset, length) => {
        const n = readSync(fd, buf, offset, length, at);
        if (n === 0) short = true;
        at += n;
        return n;
      };
      if (short) return { rejected: 'cut short while read' };
      const decoded = decodeStatCacheFrom(source, bodyBytes, signature, root, keyPair(signingKeyPem).publicKey);
      if (short) return { rejected: 'cut short while read' };
      return typeof decoded === 'string' ? { rejected: decoded } : { seed: decoded };
    } finally {
      closeSync(fd);
    }
  } catch (err) {
    const code = errnoCode(err);
    if (code === 'ENOENT') return { absent: true };
    return { rejected: code === 'ELOOP' ? 'a symbolic link (never followed)' : (err as Error).message };
  } finally {
    closeSync(dirFd);
  }
}

/**
 * Marks root's copy as used now (its mtime: the copies kept past MAX_STAT_CACHE_FILES are the
 * most recently used); false when there is no regular file there to mark (removed, or pushed
 * out: the caller writes it again).
 */
export function touchStatCache(storeFd: number, root: string): boolean {
  const dirFd = indexDir(storeFd, false);
  if (dirFd === null) return false;
  try {
    const fd = openSync(pathAt(dirFd, statCacheFileName(root)), constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
    try {
      if (!fstatSync(fd).isFile()) return false;
      const now = new Date();
      futimesSync(fd, now, now);
      return true;
    } finally {
      closeSync(fd);
    }
  } catch {
    return false;
  } finally {
    closeSync(dirFd);
  }
}

/** Removes root's stat cache from the store, if any (its checkpoint's read-back failed: nothing it captured is trusted). Throws errno errors but ENOENT. */
export function removeStatCache(storeFd: number, root: string): void {
  const dirFd = indexDir(storeFd, false);
  if (dirFd === null) return;
  try {
    unlinkQuiet(dirFd, statCacheFileName(root));
  } finally {
    closeSync(dirFd);
  }
}

/** Removes all but the n most recently used (by mtime: written, or touched) copies in index/, and temp files left by writes cut short (other names there are left alone). */
function keepNewest(dirFd: number, n: number): void {
  const copies: { name: string; mtimeMs: number }[] = [];
  for (const name of readdirSync(pathAt(dirFd, '.'))) {
    // A temp file of a write cut short (a crash): the one thread writing here has none open now.
    if (/^\.[0-9a-f]{64}\.bin\.tmp$/.test(name)) unlinkQuiet(dirFd, name);
    if (!/^[0-9a-f]{64}\.bin$/.test(name)) continue;
    try {
      copies.push({ name, mtimeMs: lstatSync(pathAt(dirFd, name)).mtimeMs });
    } catch {
      // gone meanwhile
    }
  }
  if (copies.length <= n) return;
  copies.sort((a, b) => b.mtimeMs - a.mtimeMs);
  for (const c of copies.slice(n)) unlinkQuiet(dirFd, c.name);
}

function unlinkQuiet(dirFd: number, name: string): void {
  try {
    unlinkSync(pathAt(dirFd, name));
  } catch (err) {
    if (errnoCode(err) !== 'ENOENT') throw err;
  }
}
