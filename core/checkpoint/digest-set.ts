// A set of SHA-256 digests kept compact: the first 16 bytes of each in one open-addressing table
// (linear probing over a Buffer, kept 35-70% full: 23-46 bytes a digest), where a Set of hex strings
// takes over 100; and one bit per slot to claim each digest once. What a walk of a checkpoint's
// trees remembers of the objects it has met (verify.ts): at 1,000,000 objects, 32 MiB rather than
// 100, in one table sized for them from the start (no smaller one left to the collector).
const KEY_BYTES = 16;
const MIN_SLOTS = 1024;

export class DigestSet {
  private slots: number;
  private table: Buffer;
  /** One bit per slot: claimed (claim). Made at the first claim; no add grows the table after it. */
  private claimed: Uint8Array | null = null;
  /** A digest whose first 16 bytes are all zero: the table's empty slot, so kept apart. */
  private hasZero = false;
  private zeroClaimed = false;
  private count = 0;
  /** Claimed digests that were never added (claim). */
  private unknown: DigestSet | null = null;

  /** expected: how many digests will be added (a bound is fine): the table is made that big at once, never grown up to it. */
  constructor(expected = 0) {
    let slots = MIN_SLOTS;
    while (expected * 10 > slots * 7) slots *= 2;
    this.slots = slots;
    this.table = Buffer.alloc(slots * KEY_BYTES);
  }

  get size(): number {
    return this.count;
  }

  /** Adds a digest (64 hex digits); true when it was not in the set. Two digests equal in their first 128 bits count as one (a 2^-64 chance at 2^32 objects). */
  add(sha256Hex: string): boolean {
    if (this.claimed) throw new Error('DigestSet: add after claim');
    const key = keyOf(sha256Hex);
    if (isZero(key)) {
      if (this.hasZero) return false;
      this.hasZero = true;
      this.count++;
      return true;
    }
    if ((this.count + 1) * 10 > this.slots * 7) this.grow();
    if (!this.place(this.table, this.slots, key)) return false;
    this.count++;
    return true;
  }

  /**
   * Claims a digest added before: true the first time it is claimed, false after that. A digest
   * never added is claimed too, in a set of its own (so an add after a claim never moves a slot).
   */
  claim(sha256Hex: string): boolean {
    const key = keyOf(sha256Hex);
    if (isZero(key)) {
      if (!this.hasZero) return (this.unknown ??= new DigestSet()).add(sha256Hex);
      if (this.zeroClaimed) return false;
      this.zeroClaimed = true;
      return true;
    }
    this.claimed ??= new Uint8Array(Math.ceil(this.slots / 8));
    const at = this.find(key);
    if (at < 0) return (this.unknown ??= new DigestSet()).add(sha256Hex);
    const bit = 1 << (at & 7);
    if (this.claimed[at >> 3] & bit) return false;
    this.claimed[at >> 3] |= bit;
    return true;
  }

  /** The slot holding key, or -1. */
  private find(key: Buffer): number {
    const slot = probe(this.table, this.slots, key);
    return slot >= 0 ? slot : -1;
  }

  /** Puts key in table (slots of KEY_BYTES); false when it is there already. */
  private place(table: Buffer, slots: number, key: Buffer): boolean {
    const slot = probe(table, slots, key);
    if (slot >= 0) return false;
    key.copy(table, (-slot - 1) * KEY_BYTES);
    return true;
  }

  private grow(): void {
    const slots = this.slots * 2;
    const table = Buffer.alloc(slots * KEY_BYTES);
    for (let at = 0; at < this.table.length; at += KEY_BYTES) {
      const key = this.table.subarray(at, at + KEY_BYTES);
      if (key.readBigUInt64BE(0) !== 0n || key.readBigUInt64BE(8) !== 0n) this.place(table, slots, Buffer.from(key));
    }
    this.slots = slots;
    this.table = table;
  }
}

/** A digest's first KEY_BYTES bytes; throws RangeError when it is not 64 hex digits' worth. */
function keyOf(sha256Hex: string): Buffer {
  const key = Buffer.from(sha256Hex.slice(0, 2 * KEY_BYTES), 'hex');
  if (key.length !== KEY_BYTES) throw new RangeError(`not a SHA-256 digest: ${JSON.stringify(sha256Hex)}`);
  return key;
}

function isZero(key: Buffer): boolean {
  return key.every((b) => b === 0);
}

/** Linear probing from key's hash: the slot holding key, else -(the empty slot where it goes) - 1. */
function probe(table: Buffer, slots: number, key: Buffer): number {
  // A digest's bytes are uniform: its first four are the hash.
  let i = key.readUInt32BE(0) & (slots - 1);
  for (;;) {
    const at = i * KEY_BYTES;
    if (table.readBigUInt64BE(at) === 0n && table.readBigUInt64BE(at + 8) === 0n) return -i - 1;
    if (table.compare(key, 0, KEY_BYTES, at, at + KEY_BYTES) === 0) return i;
    i = (i + 1) & (slots - 1);
  }
}
