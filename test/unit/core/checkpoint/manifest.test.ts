// The manifest format's pure parts (core/checkpoint/manifest.ts): the entry order (by
// component, a directory right before what it holds), names that are not UTF-8, the checks a
// reader makes of a manifest's own bytes and of each entry's fields.
import { describe, expect, it } from 'vitest';
import { jcs } from '../../../../core/receipts/verify.js';
import {
  checkManifest,
  comparePaths,
  manifestBytes,
  manifestJcs,
  mountsSkipped,
  nameFields,
  type ManifestEntry,
} from '../../../../core/checkpoint/manifest.js';
import { EMPTY_FILE_FIELDS, manifestOf } from '../../../helpers/manifest.js';

const b = (s: string) => Buffer.from(s, 'latin1');

const file = (path: string, extra: Partial<ManifestEntry> = {}): ManifestEntry => ({
  path,
  ...EMPTY_FILE_FIELDS,
  ...extra,
});

describe('manifest', () => {
  it('orders paths by component: a directory right before what it holds, then its later siblings', () => {
    const paths = ['a-b', 'a/b', 'a', 'a/b/c', 'a!', 'ab', 'a/a'];
    expect([...paths].sort((x, y) => comparePaths(b(x), b(y)))).toEqual(['a', 'a/a', 'a/b', 'a/b/c', 'a!', 'a-b', 'ab']);
    expect(comparePaths(b('x'), b('x'))).toBe(0);
  });

  it('names a path that is not UTF-8 by its bytes (path_b64), and a UTF-8 one as text', () => {
    expect(nameFields(Buffer.from([0x6e, 0xff]), 'path')).toEqual({ path_b64: 'bv8=' });
    expect(nameFields(Buffer.from('new\nline é'), 'target')).toEqual({ target: 'new\nline é' });
  });

  it('manifestJcs (the entries canonicalised once, set into the rest) is the JCS of the whole', () => {
    const m = {
      ...manifestOf([
        file('a'),
        file('b/c'),
        { path: 'l', type: 'symlink', mode: 0o777, uid: 0, gid: 0, size: 1, mtime_ns: '1', target: 'x' } as ManifestEntry,
      ]),
      signature: { alg: 'ed25519' as const, key_id: 'k', value: 'v' },
    };
    expect(manifestJcs(m, jcs(m.entries))).toBe(jcs(m));
    const { signature: _s, ...unsigned } = m;
    expect(manifestJcs(unsigned, jcs(m.entries))).toBe(jcs(unsigned));
    expect(manifestBytes(m).bytes.toString()).toBe(jcs(m));
  });

  it('accepts its own canonical bytes, and names what is wrong with edited ones', () => {
    const m = manifestOf([file('a'), file('b/c')]);
    const { bytes, id } = manifestBytes(m);
    expect(checkManifest(bytes, { expectId: id }).problems).toEqual([]);
    expect(checkManifest(Buffer.from(JSON.stringify(m, null, 1)), { expectId: id }).problems).toEqual([
      expect.stringContaining('not in canonical form'),
      expect.stringContaining(`not its id ${id}`),
    ]);
    const edited = { ...m, entries: [file('a'), file('b/c', { mode: 0o4777 })] };
    expect(checkManifest(Buffer.from(jcs(edited))).problems).toEqual([expect.stringContaining('the scan digest is')]);
  });

  it('refuses entries a restore must never act on: escapes, duplicates, unknown types, bad fields', () => {
    const problems = (entries: ManifestEntry[]) => checkManifest(Buffer.from(jcs(manifestOf(entries)))).problems.join(' | ');
    expect(problems([file('../x')])).toContain('not a relative path of plain names');
    expect(problems([file('/abs')])).toContain('not a relative path of plain names');
    expect(problems([file('a//b')])).toContain('not a relative path of plain names');
    expect(problems([file('a'), file('a')])).toContain('out of order or listed twice');
    expect(problems([{ ...file('a'), type: 'door' as never }])).toContain('unknown type');
    expect(problems([file('a', { mode: '0777' as never })])).toContain('is not permission bits');
    expect(problems([file('a', { sha256: 'nothex' })])).toContain('no sha256');
    expect(problems([{ path: 'l', type: 'symlink', mode: 0o777, uid: 0, gid: 0, size: 1, mtime_ns: '1' }])).toContain('a symlink with no target');
    expect(problems([{ path: 'd', type: 'char', mode: 0o600, uid: 0, gid: 0, size: 0, mtime_ns: '1' }])).toContain('a device with no rdev');
    expect(problems([file('a', { size: 3, chunks: [{ sha256: 'a'.repeat(64), size: 1 }] })])).toContain('chunks are not');
    expect(
      problems([
        file('a', {
          size: 2,
          sha256: undefined,
          chunks: [
            { sha256: 'a'.repeat(64), size: 1 },
            { sha256: 'b'.repeat(64), size: 1 },
          ],
        }),
      ]),
    ).toBe('');
  });

  it('a mount point is a directory marked mount: true with nothing under it; a manifest without the field reads as before', () => {
    const dir = (path: string, extra: Partial<ManifestEntry> = {}): ManifestEntry => ({
      path,
      type: 'dir',
      mode: 0o755,
      uid: 0,
      gid: 0,
      size: 0,
      mtime_ns: '1',
      ...extra,
    });
    const problems = (entries: ManifestEntry[]) => checkManifest(Buffer.from(jcs(manifestOf(entries)))).problems.join(' | ');
    const ok = manifestOf([dir('m', { mount: true }), dir('m-x'), file('m-x/f'), dir('n'), file('n/f')]);
    expect(checkManifest(Buffer.from(jcs(ok))).problems).toEqual([]);
    expect(mountsSkipped(ok)).toEqual(['m']);
    expect(mountsSkipped(manifestOf([dir('a'), file('a/f')]))).toEqual([]);
    expect(mountsSkipped(manifestOf([{ ...dir('x'), path: undefined, path_b64: Buffer.from([0x6d, 0xff]).toString('base64'), mount: true }]))).toEqual([
      'm\\xff',
    ]);
    expect(problems([dir('m', { mount: true }), file('m/inside')])).toContain('entry "m/inside": under a mount point, which is never entered');
    expect(problems([file('m', { mount: true })])).toContain('mount true on a file: only a directory is a mount point (true)');
    expect(problems([dir('m', { mount: false as never })])).toContain('mount false on a dir');
    expect(problems([dir('m', { mount: 'yes' as never })])).toContain('mount "yes" on a dir');
  });
});
