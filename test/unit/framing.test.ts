import { describe, expect, it } from 'vitest';
import { isSupervisorError, SupervisorError, ERROR_CODES } from '../../ipc/errors.js';
import { encodeFrame, encodeOutputFrame, FrameDecoder } from '../../ipc/framing.js';

describe('frames', () => {
  it('round-trips values, binary included, across arbitrary splits', () => {
    const values = [{ id: 1, method: 'hello', params: { versions: [1] } }, { id: 2, event: 'output', data: Buffer.from([0, 255, 10, 13]) }];
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

  it('errors carry the SPEC codes and retryability', () => {
    expect(new SupervisorError('LIMIT_EXCEEDED', 'x').retryable).toBe(true);
    expect(new SupervisorError('KEY_CONFLICT', 'x').retryable).toBe(false);
    expect(Object.keys(ERROR_CODES)).toEqual([
      'INVALID_ARGUMENT', 'UNSUPPORTED_VERSION', 'FRAME_TOO_LARGE', 'UNAUTHORIZED', 'SESSION_NOT_FOUND', 'KEY_CONFLICT',
      'CURSOR_OUT_OF_RANGE', 'SPAWN_FAILED', 'ADMISSION_SEALED', 'ADMISSION_DENIED', 'LIMIT_EXCEEDED', 'SHUTTING_DOWN', 'INTERNAL',
      'OUTPUT_REMOVED', // extension (README changelog): appended, never reordered
    ]);
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
