// Length-prefixed msgpack frames over a stream socket: a 4-byte big-endian body length, then one msgpack map.
// Owns encoding, incremental decoding, the frame-size bound (checked on the prefix before any body byte is
// buffered) and the account of the incomplete frame (bytes held, when its first byte came) that the server
// bounds. Not the methods, not timers.
import { Packr, Unpackr } from 'msgpackr/pack';
import { SupervisorError } from './errors.js';

/** Default upper bound on one frame's body, in bytes. */
export const DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024;
/** Pieces smaller than this are copied into the decoder's tail rather than kept as they came. */
const SMALL_PIECE_BYTES = 2048;
/** Size of that tail, in bytes. */
const TAIL_BYTES = 16 * 1024;

// msgpackr/pack resolves to its index.js for Node: Packr and Unpackr without the optional
// native string extractor (msgpackr-extract, found through node-gyp-build and detect-libc),
// which cost sbx ~8 ms of start-up on every command and is not needed for frames this small.
// Plain maps and binary on the wire (no msgpackr records), so any msgpack peer can speak it.
const packr = new Packr({ useRecords: false, moreTypes: false });
// int64AsType auto: a uint64/int64-encoded integer is a number when safe, else a bigint
// (which validation then refuses), so peers that always encode 64-bit integers work.
// ('auto' is in msgpackr's unpack.js since 1.x but missing from its type definitions.)
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: 'auto' as 'bigint' });

/** Encodes one value as a frame: [u32 BE length][msgpack body]. */
export function encodeFrame(value: unknown): Buffer {
  const body = packr.pack(value);
  const frame = Buffer.allocUnsafe(4 + body.length);
  frame.writeUInt32BE(body.length, 0);
  body.copy(frame, 4);
  return frame;
}

/**
 * The output event frame, `{id, event: "output", stream, cursor, data}`, encoded by hand so
 * that the data is read from its chunk file straight into the frame (one copy instead of
 * three: this is the replay hot path). `fill(buf, offset, maxBytes)` writes at most maxBytes
 * at offset and returns how many it wrote; null when it wrote none. Decodes with any msgpack
 * decoder as the same map msgpackr would produce (test/unit/ipc/framing.test.ts); id and cursor
 * are uint64, data a bin32.
 */
export function encodeOutputFrame(
  id: number,
  stream: string,
  cursor: number,
  maxBytes: number,
  fill: (buf: Buffer, offset: number, maxBytes: number) => number,
  /** A buffer to encode into, when it has room (a sender's pool); else one is allocated. */
  into?: Buffer,
): Buffer | null {
  const head = outputHead(stream);
  const frame = into && into.length >= 4 + head.length + maxBytes ? into : Buffer.allocUnsafe(4 + head.length + maxBytes);
  head.copy(frame, 4);
  frame.writeBigUInt64BE(BigInt(id), 4 + 5);
  frame.writeBigUInt64BE(BigInt(cursor), 4 + head.length - 5 - 5 - 8);
  const n = fill(frame, 4 + head.length, maxBytes);
  if (n <= 0) return null;
  frame.writeUInt32BE(n, 4 + head.length - 4);
  frame.writeUInt32BE(head.length + n, 0);
  return frame.subarray(0, 4 + head.length + n);
}

/** An output event's msgpack head for each stream name, id, cursor and length zero (copied, then filled in). */
const outputHeads = new Map<string, Buffer>();

function outputHead(stream: string): Buffer {
  let head = outputHeads.get(stream);
  if (head) return head;
  const streamName = Buffer.from(stream);
  if (streamName.length > 31) throw new RangeError('stream name longer than a fixstr');
  head = Buffer.concat([
    Buffer.from([0x85, 0xa2, 0x69, 0x64, 0xcf, 0, 0, 0, 0, 0, 0, 0, 0]), // map(5), "id", uint64
    Buffer.from([0xa5, ...Buffer.from('event'), 0xa6, ...Buffer.from('output')]),
    Buffer.from([0xa6, ...Buffer.from('stream'), 0xa0 | streamName.length, ...streamName]),
    Buffer.from([0xa6, ...Buffer.from('cursor'), 0xcf, 0, 0, 0, 0, 0, 0, 0, 0]),
    Buffer.from([0xa4, ...Buffer.from('data'), 0xc6, 0, 0, 0, 0]), // bin32
  ]);
  if (outputHeads.size < 64) outputHeads.set(stream, head);
  return head;
}

/**
 * Incremental decoder: push() bytes as they arrive; each whole frame's value is passed to
 * onFrame in order. Throws SupervisorError FRAME_TOO_LARGE when a prefix announces more than
 * maxFrameBytes, and INVALID_ARGUMENT when a body is not one msgpack map, after handing over
 * every frame before the bad one; the connection should then be closed (and reset() called).
 * The incomplete frame's pieces are kept as they came and copied once, when it is whole;
 * pieces under 2 KiB are gathered into a 16 KiB tail instead, since each Buffer costs about
 * 400 bytes of its own (so a peer sending a byte at a time holds about what it is counted for).
 */
export class FrameDecoder {
  private chunks: Buffer[] = [];
  private heldBytes = 0;
  /** Where small pieces of an incomplete frame are gathered; dropped once nothing is held. */
  private tail: Buffer | null = null;
  private tailUsed = 0;
  /** Body length the current frame's prefix announced; -1 until its 4 prefix bytes are in. */
  private bodyBytes = -1;
  private startedAt: number | null = null;

  /** `now` is the clock of frameStartedAt, in ms (monotonic: performance.now()). */
  constructor(
    private readonly maxFrameBytes = DEFAULT_MAX_FRAME_BYTES,
    private readonly now: () => number = () => performance.now(),
  ) {}

  /** Bytes of the incomplete frame held now (prefix included); 0 between frames. */
  get bufferedBytes(): number {
    return this.heldBytes;
  }

  /** now() when the first byte of the incomplete frame arrived; null between frames. */
  get frameStartedAt(): number | null {
    return this.startedAt;
  }

  /** Drops the incomplete frame (after a refusal: its bytes are not kept until the socket closes). */
  reset(): void {
    this.chunks = [];
    this.heldBytes = 0;
    this.bodyBytes = -1;
    this.startedAt = null;
    this.tail = null;
  }

  /** Takes the next bytes; hands each frame now whole to onFrame; throws as the class says. */
  push(data: Buffer, onFrame: (value: unknown) => void): void {
    if (data.length === 0) return;
    const at = this.now();
    if (this.heldBytes === 0) this.startedAt = at;
    this.chunks.push(data);
    this.heldBytes += data.length;
    for (;;) {
      if (this.bodyBytes < 0) {
        if (this.heldBytes < 4) break;
        const bodyBytes = this.prefix();
        if (bodyBytes > this.maxFrameBytes) {
          throw new SupervisorError('FRAME_TOO_LARGE', `frame of ${bodyBytes} bytes is over the limit of ${this.maxFrameBytes}`, {
            max_frame_bytes: this.maxFrameBytes,
          });
        }
        this.bodyBytes = bodyBytes;
      }
      if (this.heldBytes < 4 + this.bodyBytes) break;
      const body = this.take(4 + this.bodyBytes).subarray(4);
      this.bodyBytes = -1;
      // What is left came in this push: the next frame started now.
      this.startedAt = this.heldBytes > 0 ? at : null;
      if (this.heldBytes === 0) this.tail = null;
      onFrame(decodeBody(body));
    }
    this.gatherLast();
  }

  /**
   * Copies the last piece into the tail when it is small (what is left of this push: at most
   * one such piece per push), so small pieces share one Buffer. The tail is append-only:
   * views of it handed out in frames are never overwritten.
   */
  private gatherLast(): void {
    const last = this.chunks.length - 1;
    const piece = this.chunks[last];
    if (!piece || piece.length >= SMALL_PIECE_BYTES || this.inTail(piece)) return;
    let tail = this.tail;
    if (!tail || this.tailUsed + piece.length > tail.length) {
      // Sized by what is held, so a short remainder of a small request costs a pool slice.
      tail = this.tail = Buffer.allocUnsafe(Math.min(TAIL_BYTES, Math.max(1024, this.heldBytes)));
      this.tailUsed = 0;
    }
    const at = this.tailUsed;
    piece.copy(tail, at);
    this.tailUsed += piece.length;
    const before = this.chunks[last - 1];
    if (before && this.inTail(before) && before.byteOffset + before.length === tail.byteOffset + at) {
      this.chunks.pop();
      this.chunks[last - 1] = tail.subarray(before.byteOffset - tail.byteOffset, this.tailUsed);
    } else {
      this.chunks[last] = tail.subarray(at, this.tailUsed);
    }
  }

  /** Whether b is a view of the tail (not merely of the same ArrayBuffer: small Buffers share a pool). */
  private inTail(b: Buffer): boolean {
    const tail = this.tail;
    return !!tail && b.buffer === tail.buffer && b.byteOffset >= tail.byteOffset && b.byteOffset + b.length <= tail.byteOffset + tail.length;
  }

  /** The 4-byte big-endian prefix at the front, which may straddle pieces. */
  private prefix(): number {
    const first = this.chunks[0];
    if (first.length >= 4) return first.readUInt32BE(0);
    const head = Buffer.alloc(4);
    let filled = 0;
    for (const c of this.chunks) {
      filled += c.copy(head, filled, 0, Math.min(c.length, 4 - filled));
      if (filled === 4) break;
    }
    return head.readUInt32BE(0);
  }

  /** The first `bytes` held, as one buffer (a view when they lie in one piece, else one copy). */
  private take(bytes: number): Buffer {
    this.heldBytes -= bytes;
    const first = this.chunks[0];
    if (first.length >= bytes) {
      if (first.length === bytes) this.chunks.shift();
      else this.chunks[0] = first.subarray(bytes);
      return first.subarray(0, bytes);
    }
    const out = Buffer.allocUnsafe(bytes);
    let filled = 0;
    let used = 0;
    while (filled < bytes) {
      const c = this.chunks[used];
      const n = Math.min(c.length, bytes - filled);
      c.copy(out, filled, 0, n);
      filled += n;
      if (n === c.length) used++;
      else this.chunks[used] = c.subarray(n);
    }
    this.chunks.splice(0, used);
    return out;
  }
}

/**
 * One frame body: exactly one msgpack map (the first byte says so: fixmap, map16, map32);
 * throws INVALID_ARGUMENT otherwise. Exported for message transports (a WebSocket message is
 * one body, without the length prefix).
 */
export function decodeBody(body: Buffer): unknown {
  const first = body.length ? body[0] : -1;
  if (!((first >= 0x80 && first <= 0x8f) || first === 0xde || first === 0xdf)) {
    // Checked before msgpackr: it would return a value for 0xc1 ("never used") instead of failing.
    const what = first < 0 ? 'empty' : `0x${first.toString(16).padStart(2, '0')}`;
    throw new SupervisorError('INVALID_ARGUMENT', `a frame body must be one msgpack map; it starts with ${what}`);
  }
  try {
    return unpackr.unpack(body);
  } catch (err) {
    throw new SupervisorError('INVALID_ARGUMENT', `malformed msgpack frame: ${(err as Error).message}`);
  }
}
