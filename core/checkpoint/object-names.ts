// The names in one object fan directory, kept compact (local-store.ts keeps one per fan across
// openings of a store, for every object the store holds): SHA-256 names as 32-byte digests in
// one sorted buffer, found by binary search on their first four bytes; any other name, and the names added since, in a
// Set. ~36 bytes per object where a Set of hex strings cost ~116.
import { isSha256Hex } from './store.js';

const DIGEST_BYTES = 32;

/** A set of file names: has, add, size and iteration, as Set<string>'s (no delete: a fan's names are listed again instead). */
export class ObjectNames implements Iterable<string> {
  /** The listed SHA-256 names, decoded, ascending (byte order is the lowercase hex's order). */
  private readonly digests: Buffer;
  private readonly count: number;
  /** Each digest's first four bytes (big endian), for the search. */
  private readonly prefixes: Uint32Array;
  /** Names listed that are no lowercase SHA-256 hex (a planted file, say), and names added since. */
  private readonly extra = new Set<string>();

  constructor(names: Iterable<string> = []) {
    const hex: string[] = [];
    for (const n of names) {
      if (isSha256Hex(n)) hex.push(n);
      else this.extra.add(n);
    }
    hex.sort();
    this.digests = Buffer.allocUnsafe(hex.length * DIGEST_BYTES);
    let count = 0;
    for (let i = 0; i < hex.length; i++) {
      if (i > 0 && hex[i] === hex[i - 1]) continue;
      this.digests.write(hex[i]!, count * DIGEST_BYTES, DIGEST_BYTES, 'hex');
      count++;
    }
    this.count = count;
    this.prefixes = new Uint32Array(count);
    for (let i = 0; i < count; i++) this.prefixes[i] = this.digests.readUInt32BE(i * DIGEST_BYTES);
  }

  get size(): number {
    return this.count + this.extra.size;
  }

  has(name: string): boolean {
    if (this.extra.has(name)) return true;
    return this.count > 0 && isSha256Hex(name) && this.indexOf(name) >= 0;
  }

  /** has() for a lowercase SHA-256 hex this process computed (its form is not checked again: local-store.ts hasOwnObject). */
  hasDigest(sha256: string): boolean {
    if (this.extra.size > 0 && this.extra.has(sha256)) return true;
    return this.count > 0 && this.indexOf(sha256) >= 0;
  }

  /** Adds name (a no-op when it is there). */
  add(name: string): this {
    if (!this.has(name)) this.extra.add(name);
    return this;
  }

  *[Symbol.iterator](): IterableIterator<string> {
    for (let i = 0; i < this.count; i++) yield this.digests.toString('hex', i * DIGEST_BYTES, (i + 1) * DIGEST_BYTES);
    yield* this.extra;
  }

  /**
   * The position of a lowercase SHA-256 hex name among the digests, or -1: a binary search on
   * the first four bytes (prefixes), then the rest compared byte by byte, all in JavaScript
   * (a Buffer write and compare per step cost ~700 ns a lookup; this ~10 times less).
   */
  private indexOf(hex: string): number {
    const want =
      ((hexNibble(hex, 0) << 28) |
        (hexNibble(hex, 1) << 24) |
        (hexNibble(hex, 2) << 20) |
        (hexNibble(hex, 3) << 16) |
        (hexNibble(hex, 4) << 12) |
        (hexNibble(hex, 5) << 8) |
        (hexNibble(hex, 6) << 4) |
        hexNibble(hex, 7)) >>>
      0;
    const prefixes = this.prefixes;
    let lo = 0;
    let hi = this.count;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (prefixes[mid]! < want) lo = mid + 1;
      else hi = mid;
    }
    for (let i = lo; i < this.count && prefixes[i] === want; i++) if (this.restMatches(i, hex)) return i;
    return -1;
  }

  /** Whether digest i's bytes after its prefix are hex's. */
  private restMatches(i: number, hex: string): boolean {
    const d = this.digests;
    for (let k = 4, at = i * DIGEST_BYTES + 4; k < DIGEST_BYTES; k++, at++)
      if (d[at] !== ((hexNibble(hex, 2 * k) << 4) | hexNibble(hex, 2 * k + 1))) return false;
    return true;
  }
}

/** The value of the lowercase hex digit at s[i] (the caller has checked the form). */
function hexNibble(s: string, i: number): number {
  const c = s.charCodeAt(i);
  return c <= 0x39 ? c - 0x30 : c - 0x57;
}
