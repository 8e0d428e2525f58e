// The state dir's layout (core/state/records.ts): every record kind read back from the version 1
// compatibility fixtures (test/fixtures/records-v1, receipt-v1) with its schema, torn and
// foreign files refused with the reason, names, and the one chunk reader.
import { mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { parseRecord, readRecord } from '../../../../core/state/records.js';
import {
  isRetiringDirName,
  isTempFileName,
  TASK_FILES,
  taskDirName,
  isUnreadableReceiptName,
  keyRecordName,
  removedStreamDirName,
  retiringDirName,
  tempFileName,
  tombstoneName,
  unreadableName,
} from '../../../../core/state/names.js';
import { ChunkReader, decodeIndex, storedStream } from '../../../../core/state/stream-files.js';
import { chunkFileName } from '../../../../core/state/names.js';

const FIXTURES = join(import.meta.dirname, '../../../fixtures');
const V1 = join(FIXTURES, 'records-v1');
const SESSION = 's-0mx1qdohz-aac531b4efb0';
const tmp = mkdtempSync(join(tmpdir(), 'sbx-layout-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

describe('version 1 records read back', () => {
  it('supervisor.json (padded), seal.json, a key record named by its key, a tombstone', () => {
    expect(readRecord('identity', join(V1, 'supervisor.json'))).toEqual({ instance: 'f3689aec827c016d', generation: 7 });
    expect(readRecord('seal', join(V1, 'seal.json'))).toEqual({ generation: 7, sealed_at: '2026-11-30T09:00:00.000Z' });
    const keyFile = join(V1, 'keys', keyRecordName('fixture-v1'));
    expect(keyRecordName('fixture-v1')).toBe('fc1c0e0c7ae8690bf702ade724d2543f81603a03b3956338f76ddef54ad713b9.json');
    expect(readRecord('key', keyFile)).toMatchObject({ invocation_key: 'fixture-v1', session_id: SESSION });
    expect(readRecord('tombstone', join(V1, 'retired', tombstoneName('s-0mx0aaaaa-000000000002')))).toMatchObject({
      invocation_key: 'old-key',
      outcome: 'exited',
    });
  });

  it('admission records, of today and from before pty, stdin and user; started and output-removed', () => {
    expect(readRecord('admission', join(V1, 'sessions', SESSION, 'admission.json'))).toMatchObject({
      session_id: SESSION,
      chunk_bytes: 4096,
      user: null,
      mode: 'cgroup',
      generation: 1,
    });
    const old = readRecord('admission', join(V1, 'sessions', 's-0mx0aaaaa-000000000001', 'admission.json'));
    expect(old.pty).toBeUndefined();
    expect(old.stdin).toBeUndefined();
    expect(readRecord('started', join(V1, 'sessions', SESSION, 'started.json'))).toEqual({ started_at: '2026-11-29T11:03:21.677Z', pid: 23970 });
    expect(readRecord('outputRemoved', join(V1, 'sessions', SESSION, 'output-removed.json'))).toEqual({ removed_at: '2026-12-06T11:03:21.700Z', bytes: 5048 });
  });

  it('a receipt (pretty, v1, signed) and a close receipt', () => {
    const receipt = readRecord('receipt', join(FIXTURES, 'receipt-v1', 'receipt.json'));
    expect(receipt).toMatchObject({ version: 1, session_id: SESSION, outcome: 'exited', exit: { code: 2, signal: null }, signature: { alg: 'ed25519' } });
    expect(readRecord('closeReceipt', join(V1, 'close-receipt.json'))).toMatchObject({ kind: 'close', sessions: [{ session_id: SESSION }] });
  });

  it("a task's records: its seal, close, attempt and task receipt, in a dir named by the task id's SHA-256", () => {
    const dir = join(V1, 'tasks', taskDirName('A'));
    expect(taskDirName('A')).toBe('559aead08264d5795d3909718cdd05abd49572e84fe55590eef31a88a08fdffd');
    expect(readRecord('taskSeal', join(dir, TASK_FILES.seal))).toEqual({ task: 'A', generation: 1, sealed_at: '2026-12-01T16:47:39.340Z' });
    expect(readRecord('taskClose', join(dir, TASK_FILES.close))).toMatchObject({ task: 'A', workspaces: ['/tmp/t19/ws'], generation: 1 });
    expect(readRecord('taskAttempt', join(dir, TASK_FILES.attempt))).toMatchObject({ task: 'A', attempt: 1, settle: { timeout_ms: 60000, terminated: 0 } });
    expect(readRecord('taskReceipt', join(dir, TASK_FILES.receipt))).toMatchObject({
      kind: 'task',
      task: 'A',
      attempt: 1,
      complete: true,
      signature: { alg: 'ed25519' },
    });
    expect(() => parseRecord('taskReceipt', JSON.stringify({ version: 1, kind: 'close' }))).toThrow(/not a taskReceipt record: kind/);
  });

  it('the index of a stored stream tiles it, and its bytes read back through the chunk reader', () => {
    const stdout = join(FIXTURES, 'receipt-v1', 'state', 'sessions', SESSION, 'stdout');
    const records = decodeIndex(readFileSync(join(stdout, 'index.bin')));
    expect(records).toEqual([{ stream: 0, length: 5000, cursor: 0, arrivalUs: expect.any(Number) }]);
    const stored = storedStream(join(FIXTURES, 'receipt-v1', 'state', 'sessions', SESSION), 'stdout', 4096);
    expect(stored).toMatchObject({
      final_cursor: 5000,
      chunks: [
        { start_cursor: 0, length: 4096 },
        { start_cursor: 4096, length: 904 },
      ],
    });
    const reader = new ChunkReader(stdout, 4096);
    const buf = Buffer.alloc(5000);
    let got = 0;
    while (got < 5000) got += reader.readInto(got, 5000, buf, got, 5000 - got);
    reader.close();
    expect(buf.equals(Buffer.alloc(5000, 'v'))).toBe(true);
  });
});

describe('transient names (docs/reference/state-dir.md)', () => {
  it('are the ones a restart and verify recognise', () => {
    expect(removedStreamDirName('stdout')).toBe('.removed-stdout');
    expect(retiringDirName('s-1-ab')).toBe('.retiring-s-1-ab');
    expect(isRetiringDirName('.retiring-s-1-ab')).toBe(true);
    expect(isRetiringDirName('s-1-ab')).toBe(false);
    expect(unreadableName('receipt.json', 1700000000000)).toBe('receipt.unreadable-1700000000000.json');
    expect(unreadableName('supervisor.json', 5)).toBe('supervisor.json.unreadable-5');
    expect(isUnreadableReceiptName(unreadableName('receipt.json', 42))).toBe(true);
    expect(isUnreadableReceiptName('receipt.unreadable-x.json')).toBe(false);
    expect(tempFileName('admission.json', 'a1b2c3')).toBe('.admission.json.a1b2c3.tmp');
    expect(isTempFileName(tempFileName('admission.json', 'ff'), 'admission.json')).toBe(true);
    expect(isTempFileName(tempFileName('receipt.json', 'ff'), 'admission.json')).toBe(false);
    expect(isTempFileName(tempFileName('receipt.json', 'ff'))).toBe(true);
    expect(isTempFileName('admission.json')).toBe(false);
  });
});

describe('torn and foreign files', () => {
  it('are refused with the reason', () => {
    expect(() => parseRecord('admission', '{"session_id": "s-')).toThrow(/^not JSON: /);
    expect(() => parseRecord('receipt', '{"outcome":"exited"}')).toThrow(/^not a receipt record: version: /);
    expect(() => parseRecord('key', JSON.stringify({ invocation_key: 'k', session_id: '../../etc', command_digest: '', admitted_at: '' }))).toThrow(
      /^not a key record: session_id: /,
    );
    expect(() => parseRecord('tombstone', 'null')).toThrow(/^not a tombstone record: \(root\)/);
    expect(() => parseRecord('identity', '{"instance": "x"}')).toThrow(/not a identity record: generation/);
  });

  it("a receipt followed by its reservation's zeros (written in place, not yet truncated) reads back; zeros alone do not", () => {
    const text = readFileSync(join(FIXTURES, 'receipt-v1', 'receipt.json'), 'utf8') + '\0'.repeat(4096);
    expect(parseRecord('receipt', text).session_id).toBe(SESSION);
    expect(() => parseRecord('receipt', '\0'.repeat(4096))).toThrow(/^not JSON/);
  });
});

describe('the chunk reader', () => {
  it('names chunks by their start cursor, reads across them, and refuses a planted link', () => {
    expect(chunkFileName(0x4000000)).toBe('0000000004000000.chunk');
    const dir = join(tmp, 'stream');
    mkdirSync(dir);
    writeFileSync(join(dir, chunkFileName(0)), 'abcd');
    writeFileSync(join(dir, chunkFileName(4)), 'ef');
    const reader = new ChunkReader(dir, 4);
    const out: string[] = [];
    reader.each(1, 6, Buffer.alloc(3), (b) => out.push(b.toString()));
    expect(out).toEqual(['bcd', 'ef']); // never past a chunk's end
    expect(() => reader.readInto(4, 9, Buffer.alloc(8), 0, 8)).toThrow(/ends at 6, before 8/);
    reader.close();
    writeFileSync(join(tmp, 'secret'), 'secret');
    symlinkSync(join(tmp, 'secret'), join(dir, chunkFileName(8)));
    expect(() => new ChunkReader(dir, 4).readInto(8, 10, Buffer.alloc(2), 0, 2)).toThrow(expect.objectContaining({ code: 'ELOOP' }));
  });
});
