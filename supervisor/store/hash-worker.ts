// The hashing thread (worker_threads): SHA-256 of each stream's stored bytes, so the thread that reads the
// pipes never hashes (docs/design/facts.md 14: SHA-256 is about 0.6 core-seconds per GB here; on the drain
// thread it halved throughput). Bytes just written from a shared write buffer (store/write-buffers.ts) are
// hashed from that memory; any others are read back from the chunk files (page cache) through the one chunk
// reader (core/state/stream-files.ts).
import { createHash, type Hash } from 'node:crypto';
import { parentPort } from 'node:worker_threads';
import { ChunkReader } from '../../core/state/stream-files.js';
import { native } from '../../core/fs/native.js';

interface HashStream {
  reader: ChunkReader;
  hash: Hash;
  /** Bytes hashed so far. */
  cursor: number;
}

const buf = Buffer.allocUnsafe(1 << 20);

/** The hashing threads' name (/proc/<pid>/task/<tid>/comm). */
export const HASH_THREAD_NAME = 'sbx-hash';

/** Hashes the stored bytes [s.cursor, to) of a stream; throws when a chunk is short or gone. */
function hashUpTo(s: HashStream, to: number): void {
  if (to <= s.cursor) return;
  s.reader.each(s.cursor, to, buf, (bytes) => s.hash.update(bytes));
  s.cursor = to;
}

/**
 * Messages (hasher.ts): open {id, dir, chunkBytes}; advance {id, cursor}: stored up to cursor; update {id, at,
 * sab, off, len, token}: stored bytes [at, at+len) are sab[off, off+len), answered {hashed: token} once read;
 * digest {id, cursor} → {id, sha256} | {id, error}. Bytes not given in an update (written without a buffer,
 * or before this thread took the stream over) are read back from the chunk files.
 */
interface Message {
  op: 'open' | 'advance' | 'update' | 'digest';
  id: number;
  dir?: string;
  chunkBytes?: number;
  cursor?: number;
  at?: number;
  sab?: SharedArrayBuffer;
  off?: number;
  len?: number;
  token?: number;
}

if (parentPort) {
  const port = parentPort;
  // Named, so its CPU can be told from the threadpool's (scripts/bench/stages.ts).
  native().setThreadName(HASH_THREAD_NAME);
  const streams = new Map<number, HashStream>();
  const failed = new Map<number, string>();
  port.on('message', (m: Message) => {
    if (m.op === 'open') {
      streams.set(m.id, { reader: new ChunkReader(m.dir!, m.chunkBytes!), hash: createHash('sha256'), cursor: 0 });
      return;
    }
    const s = streams.get(m.id);
    try {
      if (s && !failed.has(m.id)) {
        if (m.op === 'update') {
          // Bytes before `at` are stored (writes are in order): read back what this thread did not see.
          hashUpTo(s, m.at!);
          if (m.at! + m.len! > s.cursor) {
            const skip = s.cursor - m.at!;
            s.hash.update(new Uint8Array(m.sab!, m.off! + skip, m.len! - skip));
            s.cursor = m.at! + m.len!;
          }
        } else hashUpTo(s, m.cursor!);
      }
    } catch (err) {
      failed.set(m.id, (err as Error).message);
    }
    if (m.op === 'update') {
      port.postMessage({ hashed: m.token });
      return;
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
