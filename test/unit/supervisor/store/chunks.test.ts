import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { createHash, randomBytes } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it, vi } from 'vitest';

/** fs.write's callback held back this long (0: as is): a chunk write still running when the index timer fires. */
const slowWrite = vi.hoisted(() => ({ ms: 0 }));
vi.mock('node:fs', async (importOriginal) => {
  const fs = await importOriginal<typeof import('node:fs')>();
  const write = (...args: unknown[]) => {
    const cb = args[args.length - 1] as (...r: unknown[]) => void;
    const ms = slowWrite.ms;
    if (!ms) return (fs.write as (...a: unknown[]) => void)(...args);
    (fs.write as (...a: unknown[]) => void)(...args.slice(0, -1), (...r: unknown[]) => setTimeout(() => cb(...r), ms));
  };
  return { ...fs, default: { ...fs, write }, write };
});
import { StreamLog } from '../../../../supervisor/store/chunks.js';
import { HashPool } from '../../../../supervisor/store/hasher.js';
import { writeBuffers } from '../../../../supervisor/store/write-buffers.js';
import { decodeIndex, readIndexFrom, readStored, storedStream } from '../../../../core/state/stream-files.js';
import { chunkFileName } from '../../../../core/state/names.js';

const dirs: string[] = [];
const hashPool = new HashPool();
afterEach(() => dirs.splice(0).forEach((d) => rmSync(d, { recursive: true, force: true })));
afterAll(() => hashPool.close());

describe('StreamLog', () => {
  it('rolls chunk files at chunkBytes and reads back any range exactly', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'sbx-chunks-'));
    dirs.push(dir);
    const log = new StreamLog(dir, 'stdout', 4096, hashPool);
    const data = randomBytes(4096 * 4 + 100);
    const reads = [1, 4095, 4096, 5000, 3000];
    let off = 0;
    let t = 1_700_000_000_000_000;
    for (const n of reads) {
      log.append(data.subarray(off, off + n), t++);
      off += n;
    }
    log.append(data.subarray(off), t++);
    const { sha256, indexSha256 } = await log.finalize();
    expect(log.cursor).toBe(data.length);
    expect(sha256).toBe(createHash('sha256').update(data).digest('hex'));
    expect(readdirSync(join(dir, 'stdout')).sort()).toEqual([
      chunkFileName(0),
      chunkFileName(4096),
      chunkFileName(8192),
      chunkFileName(12288),
      chunkFileName(16384),
      'index.bin',
    ]);
    for (const [from, max] of [
      [0, 1 << 20],
      [4095, 2],
      [4096, 10],
      [5000, 9000],
      [data.length - 1, 10],
      [data.length, 10],
    ]) {
      const parts: Buffer[] = [];
      let c = from;
      for (;;) {
        const b = readStored(join(dir, 'stdout'), 4096, c, log.cursor, max);
        if (!b.length) break;
        parts.push(b);
        c += b.length;
      }
      expect(Buffer.concat(parts).equals(data.subarray(from))).toBe(true);
    }
    const index = readFileSync(join(dir, 'stdout', 'index.bin'));
    expect(createHash('sha256').update(index).digest('hex')).toBe(indexSha256);
    const records = decodeIndex(index);
    expect(records.map((r) => r.length)).toEqual([...reads, data.length - off]);
    expect(records.map((r) => r.cursor)).toEqual([0, 1, 4096, 8192, 13192, 16192]);
    expect(records[0].arrivalUs).toBe(1_700_000_000_000_000);
  });
});

describe('the index as read_index reads it', () => {
  it('readIndexFrom finds the read holding a cursor (binary search) and pages by limit; pendingRecords serves stored records before index.bin has them', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'sbx-chunks-'));
    dirs.push(dir);
    const log = new StreamLog(dir, 'stdout', 4096, hashPool);
    const lengths = [3, 1, 7, 100, 5000, 2, 9];
    let t = 1_800_000_000_000_000;
    for (const n of lengths) log.append(Buffer.alloc(n, 0x61), t++);
    // Before any flush (records wait up to 100 ms): index.bin is empty, the stored ones are in memory.
    await log.idle();
    expect(readIndexFrom(join(dir, 'stdout'), 0, 100)).toEqual([]);
    const pending = log.pendingRecords(4, 3);
    expect(pending.unstoredAtUs).toBeNull();
    expect(pending.records.map((r) => [r.cursor, r.length])).toEqual([
      [4, 7],
      [11, 100],
      [111, 5000],
    ]);
    await log.finalize();
    expect(log.pendingRecords(0, 100).records).toEqual([]);
    const ends = lengths.map((_, i) => lengths.slice(0, i + 1).reduce((a, b) => a + b, 0));
    for (const from of [0, 2, 3, 4, 10, 11, 110, 111, 5110, 5111, 5112, 5113, ends[ends.length - 1]! - 1]) {
      const first = ends.findIndex((e) => e > from);
      const got = readIndexFrom(join(dir, 'stdout'), from, 2);
      expect(
        got.map((r) => r.length),
        `from ${from}`,
      ).toEqual(lengths.slice(first, first + 2));
      expect(got[0]!.arrivalUs).toBe(1_800_000_000_000_000 + first);
    }
    expect(readIndexFrom(join(dir, 'stdout'), ends[ends.length - 1]!, 10)).toEqual([]);
    expect(readIndexFrom(join(dir, 'nothing-here'), 0, 10)).toEqual([]);
  });
});

describe('StreamLog write buffers', () => {
  it('coalesces the reads of one event-loop turn into one write: 8 reads of 4 KiB that arrive as a write returns go out as one 32 KiB write, not 4 KiB then 28 KiB', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'sbx-chunks-'));
    dirs.push(dir);
    const log = new StreamLog(dir, 'stdout', 64 << 20, hashPool);
    const inUse = writeBuffers.inUse;
    const data = randomBytes(4096 * (1 + 8 * 31)); // within one 1 MiB write buffer
    let off = 0;
    const read = () => {
      if (off === data.length) return;
      log.append(data.subarray(off, off + 4096), off);
      off += 4096;
    };
    // libuv completes a write and reads the pipe in the same poll phase: here the reads
    // come just after onAdvance (a microtask: still that phase), which a returned write calls.
    const writes: number[] = [];
    let last = 0;
    log.onAdvance = (cursor) => {
      writes.push(cursor - last);
      last = cursor;
      queueMicrotask(() => {
        for (let k = 0; k < 8; k++) read();
      });
    };
    read();
    await until(() => off === data.length && log.cursor === data.length, 'every read written');
    // Quiet now: the buffer it filled goes back once a turn brings nothing (and its hashing is done).
    await until(() => writeBuffers.inUse === inUse, "the quiet stream's buffer back in the pool");
    const { sha256 } = await log.finalize();
    expect(sha256).toBe(createHash('sha256').update(data).digest('hex'));
    expect(writes[0]).toBe(4096);
    expect(writes.slice(1)).toEqual(Array(31).fill(8 * 4096));
  });

  it('takes reads faster than the disk: says when to wait, calls onRoom, stores every byte in order, gives every buffer back', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'sbx-chunks-'));
    dirs.push(dir);
    const log = new StreamLog(dir, 'stdout', 3 * 1024 * 1024 + 17, hashPool);
    const before = writeBuffers.inUse;
    const reads = Array.from({ length: 24 }, (_, i) => randomBytes(i % 3 === 0 ? 1 << 20 : 100_000 + i));
    let waits = 0;
    let rooms = 0;
    let advances = 0;
    log.onRoom = () => rooms++;
    log.onAdvance = () => advances++;
    let t = 1;
    for (const r of reads) if (!log.append(r, t++)) waits++;
    // Appended in one go, without awaiting: the writes are on the threadpool.
    expect(waits).toBeGreaterThan(0);
    expect(log.cursor).toBeLessThan(reads.reduce((n, r) => n + r.length, 0));
    const { sha256 } = await log.finalize();
    const all = Buffer.concat(reads);
    expect(log.cursor).toBe(all.length);
    expect(log.droppedBytes).toBe(0);
    expect(sha256).toBe(createHash('sha256').update(all).digest('hex'));
    expect(storedStream(dir, 'stdout', 3 * 1024 * 1024 + 17).sha256).toBe(sha256);
    expect(rooms).toBeGreaterThan(0);
    expect(advances).toBeGreaterThan(0);
    const records = decodeIndex(readFileSync(join(dir, 'stdout', 'index.bin')));
    expect(records.map((r) => r.length)).toEqual(reads.map((r) => r.length));
    await until(() => writeBuffers.inUse === before, 'every write buffer given back once hashed');
  });
});

async function until(ok: () => boolean, what: string, ms = 5000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

describe('StreamLog index timer', () => {
  it('a record whose bytes were still being written when the timer fired reaches index.bin once written, by the timer armed again, not at finalize', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'sbx-chunks-'));
    dirs.push(dir);
    const log = new StreamLog(dir, 'stdout', 1 << 20, hashPool);
    const index = () => readFileSync(join(dir, 'stdout', 'index.bin')).length / 24;
    slowWrite.ms = 1000;
    try {
      log.append(Buffer.alloc(1000, 1), 1_700_000_000_000_000); // its write returns after 1 s
      // The index timer (100 ms, armed by the append) fires before this one: the bytes are unwritten then.
      await new Promise((r) => setTimeout(r, 150));
      expect(log.cursor).toBe(0);
      expect(index()).toBe(0);
      // Once written, the record reaches index.bin with no finalize: the timer was armed again.
      await until(() => log.cursor === 1000, 'the slow write to return', 10_000);
      await until(() => index() === 1, 'the record to reach index.bin', 5_000);
    } finally {
      slowWrite.ms = 0;
    }
    await log.finalize();
    expect(index()).toBe(1);
  });
});
