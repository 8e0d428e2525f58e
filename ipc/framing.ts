// Length-prefixed msgpack frames over a stream socket: a 4-byte big-endian body length,
// then one msgpack value. Owns encoding, incremental decoding and the frame-size bound,
// which is checked on the prefix before any body byte is buffered. Not the methods.
import { Packr, Unpackr } from 'msgpackr';
import { SupervisorError } from './errors.js';

/** Default upper bound on one frame's body, in bytes. */
export const DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024;

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
 * decoder as the same map msgpackr would produce (test/unit/framing.test.ts); id and cursor
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
  const streamName = Buffer.from(stream);
  if (streamName.length > 31) throw new RangeError('stream name longer than a fixstr');
  const head = Buffer.concat([
    Buffer.from([0x85, 0xa2, 0x69, 0x64, 0xcf, 0, 0, 0, 0, 0, 0, 0, 0]), // map(5), "id", uint64
    Buffer.from([0xa5, ...Buffer.from('event'), 0xa6, ...Buffer.from('output')]),
    Buffer.from([0xa6, ...Buffer.from('stream'), 0xa0 | streamName.length, ...streamName]),
    Buffer.from([0xa6, ...Buffer.from('cursor'), 0xcf, 0, 0, 0, 0, 0, 0, 0, 0]),
    Buffer.from([0xa4, ...Buffer.from('data'), 0xc6, 0, 0, 0, 0]), // bin32
  ]);
  head.writeBigUInt64BE(BigInt(id), 5);
  const cursorAt = head.length - 5 - 5 - 8;
  head.writeBigUInt64BE(BigInt(cursor), cursorAt);
  const frame = into && into.length >= 4 + head.length + maxBytes ? into : Buffer.allocUnsafe(4 + head.length + maxBytes);
  head.copy(frame, 4);
  const n = fill(frame, 4 + head.length, maxBytes);
  if (n <= 0) return null;
  frame.writeUInt32BE(n, 4 + head.length - 4);
  frame.writeUInt32BE(head.length + n, 0);
  return frame.subarray(0, 4 + head.length + n);
}

/**
 * Incremental decoder: push() bytes as they arrive; each whole frame's value is passed to
 * onFrame in order. Throws SupervisorError FRAME_TOO_LARGE when a prefix announces more than
 * maxFrameBytes, and INVALID_ARGUMENT when a body is not msgpack, after handing over every
 * frame before the bad one; the connection should then be closed.
 */
export class FrameDecoder {
  private pending: Buffer[] = [];
  private pendingBytes = 0;

  constructor(private readonly maxFrameBytes = DEFAULT_MAX_FRAME_BYTES) {}

  push(data: Buffer, onFrame: (value: unknown) => void): void {
    this.pending.push(data);
    this.pendingBytes += data.length;
    for (;;) {
      if (this.pendingBytes < 4) break;
      const head = this.peek(4);
      const bodyBytes = head.readUInt32BE(0);
      if (bodyBytes > this.maxFrameBytes) {
        throw new SupervisorError('FRAME_TOO_LARGE', `frame of ${bodyBytes} bytes is over the limit of ${this.maxFrameBytes}`, {
          max_frame_bytes: this.maxFrameBytes,
        });
      }
      if (this.pendingBytes < 4 + bodyBytes) break;
      const frame = this.take(4 + bodyBytes);
      let value: unknown;
      try {
        value = unpackr.unpack(frame.subarray(4));
      } catch (err) {
        throw new SupervisorError('INVALID_ARGUMENT', `malformed msgpack frame: ${(err as Error).message}`);
      }
      onFrame(value);
    }
  }

  private peek(bytes: number): Buffer {
    if (this.pending[0].length < bytes) this.pending = [Buffer.concat(this.pending)];
    return this.pending[0];
  }

  private take(bytes: number): Buffer {
    const all = this.pending.length === 1 ? this.pending[0] : Buffer.concat(this.pending);
    const frame = all.subarray(0, bytes);
    const rest = all.subarray(bytes);
    this.pending = rest.length ? [rest] : [];
    this.pendingBytes = rest.length;
    return frame;
  }
}
