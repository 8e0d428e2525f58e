// The manifest's size bound (checkpoint.maxManifestBytes) counts each walk entry at the bytes
// its manifest entry takes (supervisor/checkpoint/passes.ts entryJsonBytes): exactly, for
// names with quotes, backslashes, control characters (\u00XX: six bytes each) and bytes that
// are not UTF-8 (path_b64), for every entry type. An estimate that ran low let a breaker's
// tree of control-character names make a manifest 5.6 times the bound (issue 34).
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { jcs } from '../../../../core/receipts/verify.js';
import { toManifestEntry, type EntryFacts } from '../../../../core/checkpoint/manifest.js';
import { entryJsonBytes } from '../../../../supervisor/checkpoint/passes.js';
import type { EntryType, WalkEntry } from '../../../../core/fs/walk.js';

const TYPES: Exclude<EntryType, 'unknown'>[] = ['file', 'dir', 'symlink', 'fifo', 'socket', 'char', 'block'];

/** The manifest entry the capture makes of e (passes.ts Capture.entry), a file's content hashed to some digest. */
function factsOf(e: WalkEntry): EntryFacts {
  const type = e.type as Exclude<EntryType, 'unknown'>;
  const base = { path: e.path, type, mode: e.mode & 0o7777, uid: e.uid, gid: e.gid, mtimeNs: e.mtimeNs };
  if (type === 'file') return { ...base, size: Number(e.size), sha256: 'ab'.repeat(32) };
  if (type === 'symlink') return { ...base, size: e.linkTarget!.length, target: e.linkTarget! };
  if (type === 'char' || type === 'block') return { ...base, size: 0, rdev: Number(e.rdev) };
  return { ...base, size: 0, ...(e.mountPoint ? { mount: true as const } : {}) };
}

const name = fc.uint8Array({ minLength: 1, maxLength: 40 }).map((b) => Buffer.from(b.map((x) => (x === 0 || x === 0x2f ? 0x41 : x))));

describe('entryJsonBytes', () => {
  it('is the byte length of the entry in RFC 8785 JSON, plus its comma', () => {
    fc.assert(
      fc.property(
        fc.record({
          path: fc.array(name, { minLength: 1, maxLength: 4 }).map((parts) => Buffer.concat(parts.flatMap((p, i) => (i ? [Buffer.from('/'), p] : [p])))),
          type: fc.constantFrom(...TYPES),
          mode: fc.integer({ min: 0, max: 0o177777 }),
          uid: fc.integer({ min: 0, max: 2 ** 32 - 1 }),
          gid: fc.integer({ min: 0, max: 2 ** 32 - 1 }),
          size: fc.bigInt({ min: 0n, max: 2n ** 50n }),
          mtimeNs: fc.bigInt({ min: -(2n ** 62n), max: 2n ** 62n }),
          rdev: fc.bigInt({ min: 0n, max: 2n ** 40n }),
          target: name,
          mountPoint: fc.boolean(),
        }),
        (r) => {
          const e = {
            ...r,
            name: r.path,
            depth: 1,
            blocks: 0n,
            nlink: 1n,
            dev: 1n,
            ino: 1n,
            ctimeNs: 0n,
            linkTarget: r.type === 'symlink' ? r.target : null,
            dirFd: -1,
            ...(r.mountPoint && r.type === 'dir' ? { mountPoint: true as const } : { mountPoint: undefined }),
          } as unknown as WalkEntry;
          expect(entryJsonBytes(e)).toBe(Buffer.byteLength(jcs(toManifestEntry(factsOf(e)))) + 1);
        },
      ),
      { numRuns: 2000 },
    );
  });

  it('counts a control character as six bytes, a quote or a newline as two', () => {
    const e = (path: string) =>
      ({ path: Buffer.from(path), type: 'dir', mode: 0o40755, uid: 0, gid: 0, size: 0n, mtimeNs: 1n, rdev: 0n, linkTarget: null }) as unknown as WalkEntry;
    expect(entryJsonBytes(e('\x01'.repeat(255))) - entryJsonBytes(e('a'.repeat(255)))).toBe(255 * 5);
    expect(entryJsonBytes(e('"\n')) - entryJsonBytes(e('ab'))).toBe(2);
  });
});
