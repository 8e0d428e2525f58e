// Request validation (ipc/schemas.ts): the one source of every method's params; a bad field
// is INVALID_ARGUMENT naming it.
import { describe, expect, it } from 'vitest';
import { SupervisorError } from '../../../ipc/errors.js';
import { ParamsSchemas, validate } from '../../../ipc/schemas.js';

const fails = (method: keyof typeof ParamsSchemas, params: unknown) => {
  try {
    validate(ParamsSchemas[method] as never, params, method);
  } catch (err) {
    expect(err).toBeInstanceOf(SupervisorError);
    return (err as SupervisorError).toWire();
  }
  throw new Error(`${method} accepted ${JSON.stringify(params)}`);
};

describe('ParamsSchemas', () => {
  it('has one schema per method of the method table', () => {
    expect(Object.keys(ParamsSchemas).sort()).toEqual(
      [
        'cancel',
        'changes',
        'checkpoint',
        'close',
        'gc',
        'hello',
        'kill',
        'ping',
        'launch',
        'ps',
        'read_index',
        'receipt',
        'resize',
        'resolve',
        'seal',
        'status',
        'subscribe',
        'wait',
        'write',
        'write_file',
        'read_file',
        'upload',
        'download',
      ].sort(),
    );
  });

  it('the file methods: absolute paths without NUL, a mode up to 0o7777, size_bytes required for write_file, key/task/user, nothing else', () => {
    expect(validate(ParamsSchemas.write_file, { path: '/a/b', size_bytes: 3, mode: 0o600, key: 'k', task: 't', user: 'nobody' }, 'write_file')).toEqual({
      path: '/a/b',
      size_bytes: 3,
      mode: 0o600,
      key: 'k',
      task: 't',
      user: 'nobody',
    });
    expect(fails('write_file', { path: 'rel', size_bytes: 1 })).toMatchObject({ code: 'INVALID_ARGUMENT', details: { field: 'path' } });
    expect(fails('write_file', { path: '/a' })).toMatchObject({ details: { field: 'size_bytes' } });
    expect(fails('write_file', { path: '/a', size_bytes: 1, mode: 0o10000 })).toMatchObject({ details: { field: 'mode' } });
    expect(fails('read_file', { path: '/a\0b' })).toMatchObject({ details: { field: 'path' } });
    // A trailing slash names a directory: refused for the one-file methods, not ignored.
    expect(fails('write_file', { path: '/w/d/', size_bytes: 1 })).toMatchObject({ code: 'INVALID_ARGUMENT', details: { field: 'path' } });
    expect(fails('read_file', { path: '/w/d/' })).toMatchObject({ code: 'INVALID_ARGUMENT', details: { field: 'path' } });
    expect(fails('read_file', { path: '/' })).toMatchObject({ code: 'INVALID_ARGUMENT', details: { field: 'path' } });
    expect(fails('upload', { dir: '/d', user: 'a b' })).toMatchObject({ details: { field: 'user' } });
    expect(fails('download', { dir: '/d', argv: ['sh'] })).toMatchObject({ code: 'INVALID_ARGUMENT' });
  });

  it('checkpoint: an absolute workspace without NUL, a task like a key, nothing else', () => {
    expect(validate(ParamsSchemas.checkpoint, { workspace: '/w', task: 't' }, 'checkpoint')).toEqual({ workspace: '/w', task: 't' });
    expect(fails('checkpoint', { workspace: 'rel' })).toMatchObject({ code: 'INVALID_ARGUMENT', details: { field: 'workspace' } });
    expect(fails('checkpoint', { workspace: '/a\0b' })).toMatchObject({ details: { field: 'workspace' } });
    expect(fails('checkpoint', { workspace: '/w', task: '' })).toMatchObject({ details: { field: 'task' } });
    expect(fails('checkpoint', { workspace: '/w', extra: 1 })).toMatchObject({ code: 'INVALID_ARGUMENT' });
  });

  it('launch: argv without a fixed cap, no NUL; env names without = ; durations up to 30 days; no unknown keys', () => {
    expect(validate(ParamsSchemas.launch, { argv: Array.from({ length: 100_000 }, () => 'x'), cwd: '/' }, 'launch').argv).toHaveLength(100_000);
    expect(fails('launch', { argv: ['a\0b'], cwd: '/' })).toMatchObject({
      code: 'INVALID_ARGUMENT',
      details: { field: 'argv.0' },
      message: expect.stringContaining('NUL'),
    });
    expect(fails('launch', { argv: [], cwd: '/' })).toMatchObject({ details: { field: 'argv' } });
    expect(fails('launch', { argv: ['true'], cwd: '/', env: { 'A=B': 'x' } })).toMatchObject({
      message: 'launch: env.A=B: Invalid key in record',
      details: { field: 'env.A=B' },
    });
    expect(fails('launch', { argv: ['true'], cwd: '/', timeout_ms: 31 * 24 * 3600 * 1000 })).toMatchObject({ details: { field: 'timeout_ms' } });
    expect(fails('launch', { argv: ['true'], cwd: '/', surprise: 1 })).toMatchObject({
      code: 'INVALID_ARGUMENT',
      message: expect.stringContaining('surprise'),
    });
  });

  it('selectors take exactly one of session_id and invocation_key', () => {
    expect(validate(ParamsSchemas.wait, { session_id: 's-1-aa' }, 'wait')).toEqual({ session_id: 's-1-aa' });
    expect(fails('wait', {})).toMatchObject({ message: 'wait: params: give exactly one of session_id or invocation_key' });
    expect(fails('wait', { session_id: 's', invocation_key: 'k' })).toMatchObject({ code: 'INVALID_ARGUMENT' });
  });

  it('write takes bytes (at most 8 MiB), subscribe a known stream and a non-negative cursor, kill a signal', () => {
    expect(validate(ParamsSchemas.write, { session_id: 's', data: Buffer.from('x') }, 'write').data).toEqual(Buffer.from('x'));
    expect(fails('write', { session_id: 's', data: 'text' })).toMatchObject({ details: { field: 'data' } });
    expect(fails('write', { session_id: 's', data: Buffer.alloc(8 * 1024 * 1024 + 1) })).toMatchObject({ message: expect.stringContaining('at most 8 MiB') });
    expect(fails('subscribe', { session_id: 's', stream: 'stdin' })).toMatchObject({ details: { field: 'stream' } });
    expect(fails('subscribe', { session_id: 's', stream: 'stdout', from: -1 })).toMatchObject({ details: { field: 'from' } });
    expect(validate(ParamsSchemas.kill, { session_id: 's', signal: 'SIGTERM' }, 'kill').signal).toBe('SIGTERM');
    expect(fails('kill', { session_id: 's', signal: 65 })).toMatchObject({ details: { field: 'signal' } });
  });
});
