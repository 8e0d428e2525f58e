// Writes the first N bytes of the bench's test pattern to stdout: each 8-byte word holds its
// own index, little endian (scripts/bench/common.ts patternBytes), in writes of CHUNK bytes
// (a multiple of 8, default 1 MiB). Usage: node pattern.mjs N [CHUNK]
import { writeSync } from 'node:fs';

const total = Number(process.argv[2]);
const chunk = Number(process.argv[3] ?? 1 << 20);
const u32 = new Uint32Array(chunk / 4);
const buf = Buffer.from(u32.buffer);
for (let off = 0; off < total; off += chunk) {
  const first = off / 8;
  const high = Math.floor(first / 0x1_0000_0000); // constant within a chunk (chunks of <= 2^32 words, aligned)
  for (let i = 0, w = first % 0x1_0000_0000; i < chunk / 8; i++, w++) {
    u32[2 * i] = w;
    u32[2 * i + 1] = high;
  }
  const n = Math.min(chunk, total - off);
  for (let w = 0; w < n;) w += writeSync(1, buf, w, n - w);
}
