// The change log (coalescing, bound, renames paired, torn lines) and the mutation scan's
// digest (ctime: a `touch -d` that moves mtime back still changes it).
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, expect, it } from 'vitest';
import {
  ChangeLog,
  type ChangeKind,
  changeKinds,
  CHANGES_FILE,
  type ChangeRecord,
  pairRenames,
  readChanges,
} from '../../../../supervisor/workspace/changes.js';
import { runScanHere } from '../../../../supervisor/workspace/scan-worker.js';
import type { MutationScan } from '../../../../supervisor/workspace/digest.js';
import { FAN } from '../../../../supervisor/workspace/watch-worker.js';

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});
const tmp = () => {
  const d = mkdtempSync(join(tmpdir(), 'sbx-unit-ws-'));
  dirs.push(d);
  return d;
};
const at = '2026-12-01T00:00:00.000Z';

it('spells a merged mask as every kind in it, in the order they happen to one name', () => {
  expect(changeKinds(FAN.CREATE | FAN.MODIFY | FAN.CLOSE_WRITE)).toEqual(['created', 'modified']);
  expect(changeKinds(FAN.MODIFY | FAN.CLOSE_WRITE)).toEqual(['modified']);
  expect(changeKinds(FAN.CREATE | FAN.MODIFY | FAN.MOVED_FROM)).toEqual(['created', 'modified', 'renamed_from']); // an atomic save's temp file
  expect(changeKinds(FAN.MOVED_TO | FAN.ATTRIB | FAN.MOVED_FROM)).toEqual(['renamed_to', 'attrib', 'renamed_from']);
  expect(changeKinds(FAN.CREATE | FAN.DELETE)).toEqual(['created', 'deleted']);
  expect(changeKinds(FAN.DELETE_SELF)).toEqual([]);
});

it('coalesces repeated modifications of one path, bounds the log, and reads it back with renames paired', () => {
  const dir = tmp();
  const log = new ChangeLog(join(dir, CHANGES_FILE), 4, 'boot:1');
  log.add({ seq: 1, ws: 0, kind: 'created', path: 'a', at });
  for (let seq = 2; seq <= 5; seq++) log.add({ seq, ws: 0, kind: 'modified', path: 'a', at });
  log.add({ seq: 6, ws: 0, kind: 'renamed_from', path: 'a', at });
  log.add({ seq: 7, ws: 0, kind: 'renamed_to', path: 'b', at });
  log.add({ seq: 8, ws: 0, kind: 'deleted', path: 'b', at }); // the 5th line: past the bound
  log.add({ seq: 9, ws: 0, kind: 'created', path: 'c', at });
  log.close();
  const { epoch, records, dropped } = readChanges(dir);
  expect(epoch).toBe('boot:1');
  expect(dropped).toBe(2);
  expect(records.map((r) => [r.seq, r.kind, r.path])).toEqual([
    [1, 'created', 'a'],
    [5, 'modified', 'a'],
    [6, 'renamed_from', 'a'],
    [7, 'renamed_to', 'b'],
  ]);
  expect(pairRenames(records).map((c) => [c.seq, c.kind, c.from ?? null, c.path])).toEqual([
    [1, 'created', null, 'a'],
    [5, 'modified', null, 'a'],
    [7, 'renamed', 'a', 'b'],
  ]);
});

it('pairs a rename by its moved object, also when the kernel merged the renamed_from into an earlier event and other changes came between', () => {
  const r = (seq: number, kind: ChangeKind, path: string, object?: string): ChangeRecord => ({ seq, ws: 0, kind, path, ...(object ? { object } : {}), at });
  const records = [
    r(10, 'created', 'x.tmp'),
    r(10, 'modified', 'x.tmp'),
    r(10, 'renamed_from', 'x.tmp', 'aaaa'), // merged: create, write, rename away of one name
    r(11, 'created', 'xdir'),
    r(12, 'renamed_from', 'y', 'bbbb'),
    r(13, 'renamed_to', 'z', 'bbbb'),
    r(14, 'renamed_to', 'x', 'aaaa'),
    r(15, 'renamed_from', 'gone', 'cccc'), // moved out of the workspace: no renamed_to here
    r(16, 'renamed_to', 'came', 'dddd'), // moved in from elsewhere
  ];
  expect(pairRenames(records).map((c) => [c.seq, c.kind, c.from ?? null, c.path])).toEqual([
    [10, 'created', null, 'x.tmp'],
    [10, 'modified', null, 'x.tmp'],
    [11, 'created', null, 'xdir'],
    [13, 'renamed', 'y', 'z'],
    [14, 'renamed', 'x.tmp', 'x'],
    [15, 'renamed_from', null, 'gone'],
    [16, 'renamed_to', null, 'came'],
  ]);
  // Records of two different objects side by side are not one rename.
  expect(pairRenames([r(1, 'renamed_from', 'a', 'aaaa'), r(2, 'renamed_to', 'b', 'bbbb')]).map((c) => c.kind)).toEqual(['renamed_from', 'renamed_to']);
});

it('leaves a torn last line out', () => {
  const dir = tmp();
  writeFileSync(join(dir, CHANGES_FILE), JSON.stringify({ seq: 1, ws: 0, kind: 'created', path: 'a', at }) + '\n{"seq": 2, "ws"');
  expect(readChanges(dir).records.map((r) => r.path)).toEqual(['a']);
});

it('the mutation scan changes when touch -d moves mtime back (ctime moves on)', () => {
  const dir = tmp();
  writeFileSync(join(dir, 'f'), 'x');
  const scan = () => {
    const r = runScanHere({ root: dir, kind: 'mutation', startHrNs: process.hrtime.bigint() });
    if (!r.ok) throw new Error(r.message);
    return r.result as MutationScan;
  };
  const first = scan();
  expect(first).toMatchObject({ entries: 1, bytes: 1 });
  const mtimeBefore = execFileSync('stat', ['-c', '%Y', join(dir, 'f')]).toString();
  execFileSync('touch', ['-d', '2001-01-01', join(dir, 'f')]);
  const second = scan();
  expect(Number(execFileSync('stat', ['-c', '%Y', join(dir, 'f')]).toString())).toBeLessThan(Number(mtimeBefore));
  expect(second.digest).not.toBe(first.digest);
  expect(Date.parse(second.max_ctime!)).toBeGreaterThanOrEqual(Date.parse(first.max_ctime!));
});
