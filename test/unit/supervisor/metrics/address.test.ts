// metrics.listen / --metrics: what parses, to what, and which hosts count as loopback (pure).
import { describe, expect, it } from 'vitest';
import { isLoopback, parseMetricsAddress } from '../../../../supervisor/metrics/address.js';

describe('parseMetricsAddress', () => {
  it('takes IPv4, bracketed IPv6, localhost (as 127.0.0.1) and absolute socket paths', () => {
    expect(parseMetricsAddress('127.0.0.1:9464')).toEqual({ kind: 'tcp', host: '127.0.0.1', port: 9464, text: '127.0.0.1:9464' });
    expect(parseMetricsAddress('[::1]:0')).toEqual({ kind: 'tcp', host: '::1', port: 0, text: '[::1]:0' });
    expect(parseMetricsAddress('localhost:9464')).toMatchObject({ kind: 'tcp', host: '127.0.0.1', port: 9464 });
    expect(parseMetricsAddress('0.0.0.0:65535')).toMatchObject({ kind: 'tcp', host: '0.0.0.0', port: 65535 });
    expect(parseMetricsAddress('/run/sandbox-supervisor/metrics.sock')).toEqual({
      kind: 'unix',
      path: '/run/sandbox-supervisor/metrics.sock',
      text: '/run/sandbox-supervisor/metrics.sock',
    });
  });

  it('refuses what is not an explicit IP and port, or a relative path', () => {
    for (const [text, says] of [
      ['', 'is not HOST:PORT'],
      [':9464', 'names no host'],
      ['9464', 'is not HOST:PORT'],
      ['127.0.0.1', 'is not HOST:PORT'],
      ['127.0.0.1:', 'is not HOST:PORT'],
      ['127.0.0.1:65536', 'port outside 0-65535'],
      ['127.0.0.1:000009464', 'port outside 0-65535'],
      ['127.0.0.1:-1', 'is not HOST:PORT'],
      ['::1:9464', 'is not HOST:PORT'],
      ['[::g]:9464', 'not an IPv6 address'],
      ['256.0.0.1:9464', 'not an IP address'],
      ['prometheus.internal:9464', 'not an IP address'],
      ['metrics.sock', 'is not HOST:PORT'],
      ['/a\0b', 'NUL'],
    ]) {
      expect(() => parseMetricsAddress(text), text).toThrow(says);
    }
  });
});

describe('socket paths and sun_path', () => {
  it('takes a path of 107 bytes, refuses 108 (counted in bytes, not characters)', () => {
    const at = (n: number) => `/${'a'.repeat(n - 1)}`;
    expect(parseMetricsAddress(at(107))).toMatchObject({ kind: 'unix', path: at(107) });
    expect(() => parseMetricsAddress(at(108))).toThrow('is a Unix socket path of 108 bytes: at most 107 fit (sun_path, unix(7))');
    const wide = `/${'é'.repeat(54)}`; // 55 characters, 109 bytes
    expect(() => parseMetricsAddress(wide)).toThrow('of 109 bytes');
  });
});

describe('isLoopback', () => {
  it('is 127/8 and ::1 (also IPv4-mapped), nothing else', () => {
    for (const host of ['127.0.0.1', '127.1.2.3', '::1', '0:0:0:0:0:0:0:1', '::ffff:127.0.0.1']) expect(isLoopback(host), host).toBe(true);
    for (const host of ['0.0.0.0', '::', '10.0.0.1', '::ffff:10.0.0.1', '128.0.0.1']) expect(isLoopback(host), host).toBe(false);
  });
});
