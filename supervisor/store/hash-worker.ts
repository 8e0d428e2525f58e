// The hashing thread (worker_threads): SHA-256 of each stream's stored bytes, read back from
// its chunk files (page cache) as the drain advances, so the thread that reads the pipes
// never hashes (DESIGN.md 14: SHA-256 is about 0.6 core-seconds per GB here; on the drain
// thread it halved throughput). Messages (hasher.ts): open {id, dir, chunkBytes},
// advance {id, cursor}, digest {id, cursor} -> {id, sha256} | {id, error}.
import { closeSync, constants, openSync, readSync } from 'node:fs';
import { createHash, type Hash } from 'node:crypto';
import { join } from 'node:path';
import { parentPort } from 'node:worker_threads';
import { chunkFileName } from '../../ipc/state-layout.js';

export interface HashStream {
  dir: string;
  chunkBytes: number;
  hash: Hash;
  /** Bytes hashed so far. */
  cursor: number;
  fd: number;
  fdStart: number;
}

const buf = Buffer.allocUnsafe(1 << 20);

/** Hashes the stored bytes [s.cursor, to) of a stream; throws when a chunk is short or gone. */
export function hashUpTo(s: HashStream, to: number): void {
  while (s.cursor < to) {
    const start = s.cursor - (s.cursor % s.chunkBytes);
    if (s.fd < 0 || s.fdStart !== start) {
      if (s.fd >= 0) closeSync(s.fd);
      s.fd = openSync(join(s.dir, chunkFileName(start)), constants.O_RDONLY | constants.O_NOFOLLOW);
      s.fdStart = start;
    }
    const want = Math.min(buf.length, to - s.cursor, start + s.chunkBytes - s.cursor);
    const n = readSync(s.fd, buf, 0, want, s.cursor - start);
    if (n === 0) throw new Error(`chunk ${chunkFileName(start)} ends at ${s.cursor}, before ${to}`);
    s.hash.update(buf.subarray(0, n));
    s.cursor += n;
  }
}

export function closeStream(s: HashStream): void {
  if (s.fd >= 0) closeSync(s.fd);
  s.fd = -1;
}

export function openStream(dir: string, chunkBytes: number): HashStream {
  return { dir, chunkBytes, hash: createHash('sha256'), cursor: 0, fd: -1, fdStart: -1 };
}

if (parentPort) {
  const port = parentPort;
  const streams = new Map<number, HashStream>();
  const failed = new Map<number, string>();
  port.on('message', (m: { op: 'open' | 'advance' | 'digest'; id: number; dir?: string; chunkBytes?: number; cursor?: number }) => {
    if (m.op === 'open') {
      streams.set(m.id, openStream(m.dir!, m.chunkBytes!));
      return;
    }
    const s = streams.get(m.id);
    try {
      if (s && !failed.has(m.id)) hashUpTo(s, m.cursor!);
    } catch (err) {
      failed.set(m.id, (err as Error).message);
    }
    if (m.op === 'digest') {
      const error = failed.get(m.id) ?? (s ? null : 'unknown stream');
      port.postMessage(error ? { id: m.id, error } : { id: m.id, sha256: s!.hash.digest('hex') });
      if (s) closeStream(s);
      streams.delete(m.id);
      failed.delete(m.id);
    }
  });
}
