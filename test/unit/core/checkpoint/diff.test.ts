// sbx diff's comparison (core/checkpoint/diff.ts), pure: every category, a name that is not
// UTF-8 (path_b64), a file held as chunks against one sha256 (equal when the bytes are), mode
// only, type changes, mtime never compared, the text lines sorted by path bytes.
import { describe, expect, it } from 'vitest';
import { chunkListKey, diffEntries, diffLines, diffManifests, diffSummary, undecidedChunkLists } from '../../../../core/checkpoint/diff.js';
import { type Manifest, type ManifestEntry } from '../../../../core/checkpoint/manifest.js';
import { escapeControls } from '../../../../cli/escape.js';
import { manifestOf } from '../../../helpers/manifest.js';

const H = (c: string) => c.repeat(64);
const file = (path: string, extra: Partial<ManifestEntry> = {}): ManifestEntry => ({
  path,
  type: 'file',
  mode: 0o644,
  uid: 1000,
  gid: 1000,
  size: 3,
  mtime_ns: '1',
  sha256: H('a'),
  ...extra,
});
const dir = (path: string, extra: Partial<ManifestEntry> = {}): ManifestEntry => ({
  path,
  type: 'dir',
  mode: 0o755,
  uid: 1000,
  gid: 1000,
  size: 0,
  mtime_ns: '1',
  ...extra,
});
const link = (path: string, target: string, extra: Partial<ManifestEntry> = {}): ManifestEntry => ({
  path,
  type: 'symlink',
  mode: 0o777,
  uid: 1000,
  gid: 1000,
  size: target.length,
  mtime_ns: '1',
  target,
  ...extra,
});
const empty = { added: 0, removed: 0, modified: 0, type_changed: 0, mode_changed: 0, owner_changed: 0 };

describe('checkpoint diff', () => {
  it('identical entry lists: nothing in any list, identical; mtime alone is not a change', () => {
    const a = [dir('d'), file('d/x'), link('l', 'd/x')];
    const b = [dir('d', { mtime_ns: '99' }), file('d/x', { mtime_ns: '12345' }), link('l', 'd/x', { mtime_ns: '7' })];
    expect(diffEntries(a, b)).toEqual({
      added: [],
      removed: [],
      modified: [],
      type_changed: [],
      mode_changed: [],
      owner_changed: [],
      counts: empty,
      identical: true,
    });
    expect(diffLines(diffEntries(a, a), escapeControls)).toEqual([]);
  });

  it('every category, each item with its old and new fields, lines sorted by path bytes', () => {
    const a = [
      file('changed'),
      file('grown'),
      file('gone'),
      file('same-bytes-new-mode'),
      file('owned'),
      file('to-link'),
      dir('was-dir'),
      file('was-dir/inner'),
      link('moved-link', 'x'),
    ];
    const b = [
      file('added', { sha256: H('b'), size: 5 }),
      file('changed', { sha256: H('c') }),
      file('grown', { size: 4, sha256: H('d') }),
      link('moved-link', 'y'),
      file('owned', { uid: 0, gid: 0 }),
      file('same-bytes-new-mode', { mode: 0o755 }),
      link('to-link', 'changed'),
      file('was-dir'),
    ];
    const d = diffEntries(a, b);
    expect(d.added).toEqual([{ path: 'added', type: 'file', size: 5, mode: 0o644, sha256: H('b') }]);
    expect(d.removed).toEqual([
      { path: 'gone', type: 'file', size: 3, mode: 0o644, sha256: H('a') },
      { path: 'was-dir/inner', type: 'file', size: 3, mode: 0o644, sha256: H('a') },
    ]);
    expect(d.modified).toEqual([
      {
        path: 'changed',
        type: 'file',
        changed: ['content'],
        old_size: 3,
        new_size: 3,
        old_mode: 0o644,
        new_mode: 0o644,
        old_sha256: H('a'),
        new_sha256: H('c'),
      },
      {
        path: 'grown',
        type: 'file',
        changed: ['content', 'size'],
        old_size: 3,
        new_size: 4,
        old_mode: 0o644,
        new_mode: 0o644,
        old_sha256: H('a'),
        new_sha256: H('d'),
      },
      {
        path: 'moved-link',
        type: 'symlink',
        changed: ['target'],
        old_size: 1,
        new_size: 1,
        old_mode: 0o777,
        new_mode: 0o777,
        old_target: 'x',
        new_target: 'y',
      },
    ]);
    expect(d.type_changed).toEqual([
      { path: 'to-link', old_type: 'file', new_type: 'symlink', old_size: 3, new_size: 7, old_mode: 0o644, new_mode: 0o777 },
      { path: 'was-dir', old_type: 'dir', new_type: 'file', old_size: 0, new_size: 3, old_mode: 0o755, new_mode: 0o644 },
    ]);
    expect(d.mode_changed).toEqual([{ path: 'same-bytes-new-mode', type: 'file', old_mode: 0o644, new_mode: 0o755 }]);
    expect(d.owner_changed).toEqual([{ path: 'owned', type: 'file', old_uid: 1000, new_uid: 0, old_gid: 1000, new_gid: 0 }]);
    expect(d.counts).toEqual({ added: 1, removed: 2, modified: 3, type_changed: 2, mode_changed: 1, owner_changed: 1 });
    expect(d.identical).toBe(false);
    expect(diffLines(d, escapeControls)).toEqual([
      'A added',
      'M changed',
      'D gone',
      'M grown',
      'M moved-link',
      'o owned (1000:1000 -> 0:0)',
      'm same-bytes-new-mode (0644 -> 0755)',
      'T to-link (file -> symlink)',
      'T was-dir (dir -> file)',
      'D was-dir/inner',
    ]);
    expect(diffSummary(d)).toBe('1 added, 2 removed, 3 modified, 2 type changed, 1 mode changed, 1 owner changed');
  });

  it('a content change with a mode change is modified only (the modes in its item); mode and owner together are in both lists', () => {
    const d = diffEntries([file('f'), file('g')], [file('f', { sha256: H('e'), mode: 0o600 }), file('g', { mode: 0o600, uid: 1 })]);
    expect(d.modified).toEqual([
      { path: 'f', type: 'file', changed: ['content'], old_size: 3, new_size: 3, old_mode: 0o644, new_mode: 0o600, old_sha256: H('a'), new_sha256: H('e') },
    ]);
    expect(d.mode_changed).toEqual([{ path: 'g', type: 'file', old_mode: 0o644, new_mode: 0o600 }]);
    expect(d.owner_changed).toEqual([{ path: 'g', type: 'file', old_uid: 1000, new_uid: 1, old_gid: 1000, new_gid: 1000 }]);
    expect(diffLines(d, escapeControls)).toEqual(['M f', 'm g (0644 -> 0600)', 'o g (1000:1000 -> 1:1000)']);
  });

  it('a name that is not UTF-8 is matched by its bytes, kept as path_b64, shown with \\xNN; sorted by bytes (0xff after ASCII); control characters escaped', () => {
    const raw = Buffer.from([0x6e, 0xff, 0xfe]);
    const b64 = raw.toString('base64');
    const a = [{ ...file(''), path: undefined, path_b64: b64 }, file('new\nline')];
    const b = [
      { ...file('', { mode: 0o600 }), path: undefined, path_b64: b64 },
      file('new\nline', { sha256: H('f') }),
      { ...file(''), path: undefined, path_b64: Buffer.from([0x6e, 0xfe]).toString('base64') },
    ];
    const d = diffEntries(a as ManifestEntry[], b as ManifestEntry[]);
    expect(d.mode_changed).toEqual([{ path_b64: b64, type: 'file', old_mode: 0o644, new_mode: 0o600 }]);
    expect(d.added).toEqual([{ path_b64: 'bv4=', type: 'file', size: 3, mode: 0o644, sha256: H('a') }]);
    expect(diffLines(d, escapeControls)).toEqual(['M new\\nline', 'A n\\xfe', 'm n\\xff\\xfe (0644 -> 0600)']);
  });

  it('a symlink target that is not UTF-8 is compared by bytes and given as *_target_b64', () => {
    const t1 = Buffer.from([0x74, 0xff]).toString('base64');
    const t2 = Buffer.from([0x74, 0xfe]).toString('base64');
    const l = (t: string): ManifestEntry => ({ path: 'l', type: 'symlink', mode: 0o777, uid: 0, gid: 0, size: 2, mtime_ns: '1', target_b64: t });
    expect(diffEntries([l(t1)], [l(t1)]).identical).toBe(true);
    expect(diffEntries([l(t1)], [l(t2)]).modified).toEqual([
      { path: 'l', type: 'symlink', changed: ['target'], old_size: 2, new_size: 2, old_mode: 0o777, new_mode: 0o777, old_target_b64: t1, new_target_b64: t2 },
    ]);
  });

  it('chunks against one sha256: a single chunk is the whole file; equal chunk lists are equal; 2+ chunks need the whole-file digest', () => {
    const whole = file('f', { size: 6, sha256: H('1') });
    const one = file('f', { size: 6, sha256: undefined, chunks: [{ sha256: H('1'), size: 6 }] });
    const two = file('f', {
      size: 6,
      sha256: undefined,
      chunks: [
        { sha256: H('2'), size: 3 },
        { sha256: H('3'), size: 3 },
      ],
    });
    expect(diffEntries([whole], [one]).identical).toBe(true);
    expect(diffEntries([two], [two]).identical).toBe(true);
    expect(undecidedChunkLists([whole], [one])).toEqual([]);
    expect(undecidedChunkLists([two], [two])).toEqual([]);
    // Undecided from the manifests alone: modified, unless the list's whole-file digest is given.
    expect(undecidedChunkLists([whole], [two])).toEqual([two.chunks]);
    expect(diffEntries([whole], [two]).counts.modified).toBe(1);
    expect(diffEntries([whole], [two], new Map([[chunkListKey(two.chunks!), H('1')]])).identical).toBe(true);
    const other = diffEntries([whole], [two], new Map([[chunkListKey(two.chunks!), H('9')]]));
    expect(other.modified).toEqual([
      { path: 'f', type: 'file', changed: ['content'], old_size: 6, new_size: 6, old_mode: 0o644, new_mode: 0o644, old_sha256: H('1') },
    ]);
    // A size that differs decides without any digest.
    expect(undecidedChunkLists([file('f', { size: 7, sha256: H('1') })], [two])).toEqual([]);
  });

  it('devices: another rdev is modified; fifos and sockets have no content', () => {
    const dev = (rdev: number): ManifestEntry => ({ path: 'null', type: 'char', mode: 0o666, uid: 0, gid: 0, size: 0, mtime_ns: '1', rdev });
    expect(diffEntries([dev(259)], [dev(260)]).modified.map((m) => m.changed)).toEqual([['rdev']]);
    const fifo: ManifestEntry = { path: 'p', type: 'fifo', mode: 0o644, uid: 0, gid: 0, size: 0, mtime_ns: '1' };
    expect(diffEntries([fifo], [{ ...fifo, mtime_ns: '2' }]).identical).toBe(true);
  });

  it('diffManifests names both sides; from null: everything added', () => {
    const m = (task: string | null, entries: ManifestEntry[]): Manifest => manifestOf(entries, { task, createdAt: '2026-12-01T00:00:01.000Z' });
    const d = diffManifests(null, { id: H('c'), manifest: m('t', [dir('d'), file('d/x')]) });
    expect(d.from).toBeNull();
    expect(d.to).toEqual({ checkpoint_id: H('c'), workspace: '/w', task: 't', created_at: '2026-12-01T00:00:01.000Z' });
    expect(diffLines(d, escapeControls)).toEqual(['A d', 'A d/x']);
    expect(d.counts).toEqual({ ...empty, added: 2 });
  });
});
