// The hashing thread (worker_threads): SHA-256 of each stream's stored bytes, read back from
// its chunk files (page cache) through the one chunk reader (ipc/state-layout.ts) as the drain
// advances, so the thread that reads the pipes never hashes (DESIGN.md 14: SHA-256 is about
// 0.6 core-seconds per GB here; on the drain thread it halved throughput). Messages
// (hasher.ts): open {id, dir, chunkBytes}, advance {id, cursor}, digest {id, cursor} →
// {id, sha256} | {id, error}.
import { createHash, type Hash } from 'node:crypto';
import { parentPort } from 'node:worker_threads';
import { ChunkReader } from '../../ipc/stream-files.js';

interface HashStream {
  reader: ChunkReader;
  hash: Hash;
  /** Bytes hashed so far. */
  cursor: number;
}

const buf = Buffer.allocUnsafe(1 << 20);

/** Hashes the stored bytes [s.cursor, to) of a stream; throws when a chunk is short or gone. */
function hashUpTo(s: HashStream, to: number): void {
  s.reader.each(s.cursor, to, buf, (bytes) => s.hash.update(bytes));
  s.cursor = Math.max(s.cursor, to);
}

if (parentPort) {
  const port = parentPort;
  const streams = new Map<number, HashStream>();
  const failed = new Map<number, string>();
  port.on('message', (m: { op: 'open' | 'advance' | 'digest'; id: number; dir?: string; chunkBytes?: number; cursor?: number }) => {
    if (m.op === 'open') {
      streams.set(m.id, { reader: new ChunkReader(m.dir!, m.chunkBytes!), hash: createHash('sha256'), cursor: 0 });
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
      s?.reader.close();
      streams.delete(m.id);
      failed.delete(m.id);
    }
  });
}
