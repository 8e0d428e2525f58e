// sbx restore's comparison (core/checkpoint/restore.ts compareTree): the restored tree is walked
// beside the manifest's entries, in the one order both have (manifest.ts comparePaths), so that
// neither is held; a path missing, extra or changed is named wherever it falls in that order.
import { mkdirSync, mkdtempSync, rmSync, unlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { compareTree, describeEntries } from '../../../../core/checkpoint/restore.js';

const root = mkdtempSync(join(tmpdir(), 'sbx-compare-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe('compareTree', () => {
  it('names each path missing, extra or changed wherever it falls (before the first, inside a directory, between siblings, past the last), extras last', async () => {
    mkdirSync(join(root, 'a'));
    mkdirSync(join(root, 'm'));
    for (const p of ['a/x', 'a/y', 'a-b', 'm/k', 'z']) writeFileSync(join(root, p), p);
    const entries = [...describeEntries(root)];
    expect(entries.map((e) => e.path)).toEqual(['a', 'a/x', 'a/y', 'a-b', 'm', 'm/k', 'z']);
    expect(await compareTree(entries, null, root, { compareOwners: true, setidDropped: new Set() })).toEqual([]);
    // Extra: before every entry, in a, between a/ and a-b, in m, past the last. Missing: m/k. Changed: a/y's content and mtime.
    for (const p of ['0first', 'a/x2', 'a-a', 'm/j', 'zz']) writeFileSync(join(root, p), p);
    unlinkSync(join(root, 'm/k'));
    writeFileSync(join(root, 'a/y'), 'A/Y');
    // The mtimes the changes gave, made certain (not left to the clock's granule).
    for (const p of ['a', 'a/y', 'm']) utimesSync(join(root, p), 1000, 1000);
    const found = await compareTree(entries, null, root, { compareOwners: true, setidDropped: new Set() });
    expect(found.map((d) => `${d.path} ${d.field}`)).toEqual([
      'a mtime_ns',
      'a/y sha256',
      'a/y mtime_ns',
      'm mtime_ns',
      'm/k missing',
      '0first extra',
      'a/x2 extra',
      'a-a extra',
      'm/j extra',
      'zz extra',
    ]);
    expect(found.find((d) => d.path === 'a/y' && d.field === 'mtime_ns')).toMatchObject({ found: '1000000000000', expected: entries[2].mtime_ns });
    // An async source of entries (a walk of a store's trees) gives the same.
    async function* walked() {
      yield* entries;
    }
    expect(await compareTree(walked(), null, root, { compareOwners: true, setidDropped: new Set() })).toEqual(found);
  });
});
