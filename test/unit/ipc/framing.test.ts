import { describe, expect, it } from 'vitest';
import { isSupervisorError, SupervisorError, ERROR_CODES } from '../../../ipc/errors.js';
import { encodeFrame, encodeOutputFrame, FrameDecoder } from '../../../ipc/framing.js';

describe('frames', () => {
  it('round-trips values, binary included, across arbitrary splits', () => {
    const values = [
      { id: 1, method: 'hello', params: { versions: [1] } },
      { id: 2, event: 'output', data: Buffer.from([0, 255, 10, 13]) },
    ];
    const bytes = Buffer.concat(values.map(encodeFrame));
    for (const step of [1, 3, 7, bytes.length]) {
      const decoder = new FrameDecoder();
      const out: any[] = [];
      for (let i = 0; i < bytes.length; i += step) decoder.push(bytes.subarray(i, i + step), (v) => out.push(v));
      expect(out[0]).toEqual(values[0]);
      expect(Buffer.from(out[1].data).equals(values[1].data as Buffer)).toBe(true);
    }
  });

  it('refuses a frame over the limit from its 4-byte prefix alone', () => {
    const decoder = new FrameDecoder(1024);
    const prefix = Buffer.alloc(4);
    prefix.writeUInt32BE(1025);
    let caught: unknown;
    try {
      decoder.push(prefix, () => {});
    } catch (err) {
      caught = err;
    }
    expect(isSupervisorError(caught, 'FRAME_TOO_LARGE')).toBe(true);
  });

  it('accounts the incomplete frame: bytes held (prefix included) and when its first byte came', () => {
    let nowMs = 0;
    const decoder = new FrameDecoder(1024, () => nowMs);
    const a = encodeFrame({ id: 1, method: 'status', params: {} });
    const b = encodeFrame({ id: 2, method: 'ps', params: { all: true } });
    const out: unknown[] = [];
    const push = (at: number, bytes: Buffer) => {
      nowMs = at;
      decoder.push(bytes, (v) => out.push(v));
      return [decoder.bufferedBytes, decoder.frameStartedAt, out.length];
    };
    expect([decoder.bufferedBytes, decoder.frameStartedAt]).toEqual([0, null]);
    expect(push(10, a.subarray(0, 2))).toEqual([2, 10, 0]); // half a prefix
    expect(push(20, a.subarray(2, 9))).toEqual([9, 10, 0]); // the clock stays at the first byte
    expect(push(30, Buffer.concat([a.subarray(9), b.subarray(0, 3)]))).toEqual([3, 30, 1]); // the next frame began at 30
    expect(push(40, b.subarray(3))).toEqual([0, null, 2]); // between frames: nothing held, no clock
    expect(push(50, Buffer.concat([a, b]))).toEqual([0, null, 4]); // whole frames are never held
    expect(out).toEqual([
      { id: 1, method: 'status', params: {} },
      { id: 2, method: 'ps', params: { all: true } },
      { id: 1, method: 'status', params: {} },
      { id: 2, method: 'ps', params: { all: true } },
    ]);
    expect(push(60, b.subarray(0, 5))).toEqual([5, 60, 4]);
    decoder.reset();
    expect([decoder.bufferedBytes, decoder.frameStartedAt]).toEqual([0, null]);
    expect(push(70, a)).toEqual([0, null, 5]); // what reset dropped does not prefix the next frame
  });

  it('decodes exactly across pieces of every size, also a byte at a time, and never rewrites bytes it handed out', () => {
    let seed = 7;
    const rand = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % n);
    const values = Array.from({ length: 40 }, (_, i) => ({
      id: i,
      method: 'write',
      params: { data: Buffer.from(Array.from({ length: rand(40_000) }, () => rand(256))) },
    }));
    const bytes = Buffer.concat(values.map(encodeFrame));
    for (const pieces of ['random', 'one byte'] as const) {
      const decoder = new FrameDecoder();
      const out: any[] = [];
      let held = 0;
      for (let i = 0; i < bytes.length;) {
        const n = pieces === 'one byte' ? 1 : [1, 3, 7, 2047, 2048, 5000, 70_000][rand(7)];
        const piece = Buffer.from(bytes.subarray(i, i + n)); // a socket's reads are buffers of their own
        const before = out.length;
        decoder.push(piece, (v) => out.push(v));
        // Small pieces are gathered (copied), not kept: a Buffer each would cost ~400 bytes. (A
        // frame handed over from within the piece is a view of it, so only when there was none.)
        if (n < 2048 && out.length === before) piece.fill(0xee);
        i += n;
        held = Math.max(held, decoder.bufferedBytes);
      }
      expect(decoder.bufferedBytes).toBe(0);
      expect(held).toBeLessThanOrEqual(Math.max(...values.map((v) => encodeFrame(v).length)));
      expect(out.map((v) => [v.id, Buffer.from(v.params.data).toString('hex')])).toEqual(values.map((v) => [v.id, v.params.data.toString('hex')]));
    }
  });

  it('refuses a body that is not exactly one msgpack map, after the frames before it', () => {
    const frame = (body: number[]) => Buffer.concat([Buffer.from([0, 0, 0, body.length]), Buffer.from(body)]);
    const bodies: [string, number[]][] = [
      ['0xc1, never used (msgpackr would return a C1 object)', [0xc1]],
      ['an integer', [0x2a]],
      ['an array', [0x92, 0x01, 0x02]],
      ['a string', [0xa1, 0x78]],
      ['nil', [0xc0]],
      ['an empty body', []],
      ['a map cut short', [0x81, 0xa1]],
      ['a map and then more', [0x80, 0x01]],
    ];
    for (const [what, body] of bodies) {
      const out: unknown[] = [];
      let caught: unknown;
      try {
        new FrameDecoder().push(Buffer.concat([encodeFrame({ id: 1 }), frame(body), encodeFrame({ id: 2 })]), (v) => out.push(v));
      } catch (err) {
        caught = err;
      }
      expect(isSupervisorError(caught, 'INVALID_ARGUMENT'), what).toBe(true);
      expect(out, what).toEqual([{ id: 1 }]);
    }
    const out: unknown[] = [];
    new FrameDecoder().push(Buffer.concat([frame([0x80]), frame([0xde, 0, 1, 0xa1, 0x61, 0x01]), frame([0xdf, 0, 0, 0, 1, 0xa1, 0x62, 0x02])]), (v) =>
      out.push(v),
    );
    expect(out).toEqual([{}, { a: 1 }, { b: 2 }]); // fixmap, map16, map32
  });

  it('errors carry the documented codes and retryability', () => {
    expect(new SupervisorError('LIMIT_EXCEEDED', 'x').retryable).toBe(true);
    expect(new SupervisorError('KEY_CONFLICT', 'x').retryable).toBe(false);
    expect(Object.keys(ERROR_CODES)).toEqual([
      'INVALID_ARGUMENT',
      'UNSUPPORTED_VERSION',
      'FRAME_TOO_LARGE',
      'UNAUTHORIZED',
      'SESSION_NOT_FOUND',
      'KEY_CONFLICT',
      'CURSOR_OUT_OF_RANGE',
      'SPAWN_FAILED',
      'ADMISSION_SEALED',
      'ADMISSION_DENIED',
      'LIMIT_EXCEEDED',
      'SHUTTING_DOWN',
      'INTERNAL',
      'OUTPUT_REMOVED', // extension (CHANGELOG.md): appended, never reordered
      'CHECKPOINT_FAILED', // extension (issue 18)
      'TASK_CONFLICT', // extension (issue 19)
      // extensions (issue 30): the file verbs' errors, and a read past the stream quota
      'SYMLINK_REFUSED',
      'NOT_FOUND',
      'NOT_A_DIRECTORY',
      'IS_A_DIRECTORY',
      'NOT_A_REGULAR_FILE',
      'SIZE_MISMATCH',
      'PERMISSION_DENIED',
      'FILE_ERROR',
      'OUTPUT_QUOTA_EXCEEDED',
      'LIMIT_UNAVAILABLE', // extension (issue 32): a limit whose cgroup v2 controller this host lacks
      'SESSION_UNKNOWN', // extension: a wait with unknown "fail" for a session unknown with no receipt on its way
    ]);
    expect(new SupervisorError('LIMIT_UNAVAILABLE', 'x').retryable).toBe(false);
    expect(new SupervisorError('SESSION_UNKNOWN', 'x').retryable).toBe(false);
    expect(new SupervisorError('CHECKPOINT_FAILED', 'x').retryable).toBe(true);
    expect(new SupervisorError('TASK_CONFLICT', 'x').retryable).toBe(false);
    const back = SupervisorError.fromWire({ code: 'NOT_A_CODE' as any, message: 'm', retryable: false });
    expect(back.code).toBe('INTERNAL');
    expect(back.message).toBe('NOT_A_CODE: m');
  });
});

describe('encodeOutputFrame', () => {
  it('decodes as the map msgpackr would produce, for small and 64-bit cursors', () => {
    for (const cursor of [0, 1, 2 ** 32 + 5, Number.MAX_SAFE_INTEGER]) {
      const data = Buffer.from('bytes\0\xff of the stream', 'latin1');
      const frame = encodeOutputFrame(2 ** 40 + 3, 'stdout', cursor, 1024, (buf, off, max) => {
        expect(max).toBe(1024);
        return data.copy(buf, off);
      })!;
      const got: unknown[] = [];
      new FrameDecoder().push(frame, (v) => got.push(v));
      expect(got).toHaveLength(1);
      const v = got[0] as { id: number; event: string; stream: string; cursor: number; data: Uint8Array };
      expect({ ...v, data: Buffer.from(v.data) }).toEqual({ id: 2 ** 40 + 3, event: 'output', stream: 'stdout', cursor, data });
      expect(frame.readUInt32BE(0)).toBe(frame.length - 4);
    }
  });

  it('encodes into a given buffer when it has room for a full event and the head', () => {
    const into = Buffer.alloc((1 << 20) + 128);
    const frame = encodeOutputFrame(7, 'stdout', 0, 1 << 20, (buf, off, max) => buf.fill(1, off, off + max) && max, into)!;
    expect(frame.buffer).toBe(into.buffer);
    expect(frame.length).toBe(4 + 66 + (1 << 20));
    const small = Buffer.alloc(1 << 20);
    expect(encodeOutputFrame(7, 'stdout', 0, 1 << 20, (_b, _o, max) => max, small)!.buffer).not.toBe(small.buffer);
  });

  it('is null when nothing was read', () => {
    expect(encodeOutputFrame(1, 'pty', 0, 10, () => 0)).toBeNull();
  });
});
