// Where the Prometheus endpoint listens (`serve --metrics ADDR`, config `metrics.listen`):
// `HOST:PORT` with HOST an IPv4 literal, `[IPv6]` or `localhost`, or an absolute path for a
// Unix socket. Pure; no names are resolved (a host name could move the listener off the
// loopback), and a bare `:PORT` is refused: all interfaces must be written out (0.0.0.0).
import { isIPv4, isIPv6 } from 'node:net';

/** A parsed listen address: TCP host (an IP literal) and port (0: any free one), or a Unix socket path. */
export type MetricsAddress = { kind: 'tcp'; host: string; port: number; text: string } | { kind: 'unix'; path: string; text: string };

/** Bytes of a Unix socket path that fit sun_path (108 with its NUL, unix(7)); a longer one would bind a truncated path. */
export const SUN_PATH_MAX_BYTES = 107;

/** The example every error message gives. */
export const METRICS_ADDRESS_EXAMPLE = '127.0.0.1:9464';

/** Parses a listen address; throws an Error whose message says what is wrong and what to write. */
export function parseMetricsAddress(text: string): MetricsAddress {
  const bad = (why: string) =>
    new Error(
      `${JSON.stringify(text)} ${why} (give HOST:PORT such as ${METRICS_ADDRESS_EXAMPLE}, [::1]:9464, 0.0.0.0:9464 for every interface, or an absolute path for a Unix socket)`,
    );
  if (text.includes('\0')) throw bad('contains a NUL byte');
  if (text.startsWith('/')) {
    const bytes = Buffer.byteLength(text);
    if (bytes > SUN_PATH_MAX_BYTES)
      throw new Error(
        `${JSON.stringify(text)} is a Unix socket path of ${bytes} bytes: at most ${SUN_PATH_MAX_BYTES} fit (sun_path, unix(7)); give a shorter path`,
      );
    return { kind: 'unix', path: text, text };
  }
  const m = /^(\[[^\]]*\]|[^:[\]]*):([0-9]+)$/.exec(text);
  if (!m) throw bad('is not HOST:PORT or an absolute path');
  let host = m[1];
  const port = Number(m[2]);
  if (m[2].length > 5 || port > 65535) throw bad('has a port outside 0-65535');
  if (host === '') throw bad('names no host; listening on every interface must be explicit');
  if (host.startsWith('[')) {
    host = host.slice(1, -1);
    if (!isIPv6(host)) throw bad('has a bracketed host that is not an IPv6 address');
  } else if (host === 'localhost') {
    host = '127.0.0.1';
  } else if (!isIPv4(host)) {
    throw bad('has a host that is not an IP address (names are not resolved; localhost is 127.0.0.1)');
  }
  return { kind: 'tcp', host, port, text };
}

/** Whether a TCP host is a loopback address (127.0.0.0/8, ::1, or IPv4-mapped 127.x). */
export function isLoopback(host: string): boolean {
  const v4 = host.toLowerCase().startsWith('::ffff:') ? host.slice(7) : host;
  if (isIPv4(v4)) return v4.startsWith('127.');
  return host === '::1' || host === '0:0:0:0:0:0:0:1';
}
