// `sbx bridge [--socket PATH]`: joins this process's stdin and stdout to the supervisor's Unix
// socket byte for byte (frames pass through unchanged), so any exec channel carries the
// protocol (docker exec -i BOX sbx bridge, kubectl exec -i, ssh, nsenter; docs/REMOTE.md).
// Backpressure both ways (pipes: bounded memory); writes nothing of its own to stdout. Exits
// 0 when stdin ends (the socket is ended) or the supervisor closes; 69 (EX_UNAVAILABLE) with a
// message on stderr when the socket cannot be connected. Imports node: only (snapshot-safe).
import { fstatSync } from 'node:fs';
import { connect, Socket } from 'node:net';
import type { Readable, Writable } from 'node:stream';

/** sysexits(3) EX_UNAVAILABLE: the supervisor's socket could not be connected. */
export const EX_UNAVAILABLE = 69;

/**
 * fd as a stream: a pipe or socket as a non-blocking net.Socket (process.stdout writes to a
 * pipe synchronously on Linux, which would stall the other direction), anything else
 * (a file, a tty) as process.stdin/stdout.
 */
function fdStream(fd: 0 | 1): Readable | Writable {
  let st;
  try {
    st = fstatSync(fd);
  } catch {
    st = null;
  }
  if (st && (st.isFIFO() || st.isSocket())) return new Socket({ fd, readable: fd === 0, writable: fd === 1 });
  return fd === 0 ? process.stdin : process.stdout;
}

/** Runs the bridge until one side closes; resolves with the exit status (0, or EX_UNAVAILABLE). */
export function runBridge(socketPath: string, warn: (message: string) => void): Promise<number> {
  return new Promise((resolve) => {
    let done = false;
    const finish = (status: number) => {
      if (done) return;
      done = true;
      resolve(status);
    };
    const sock = connect(socketPath);
    sock.once('error', (err: NodeJS.ErrnoException) => {
      warn(`bridge: cannot connect to the supervisor at ${socketPath}: ${err.code ?? err.message}`);
      finish(EX_UNAVAILABLE);
    });
    sock.once('connect', () => {
      sock.removeAllListeners('error');
      sock.on('error', () => sock.destroy()); // a reset: 'close' follows
      const input = fdStream(0) as Readable;
      const output = fdStream(1) as Writable;
      output.on('error', () => {
        // The reader of our stdout is gone: nothing can be delivered any more.
        sock.destroy();
        finish(0);
      });
      input.on('error', () => sock.end());
      input.pipe(sock); // stdin's end ends the socket (the supervisor then closes its side)
      sock.pipe(output, { end: false });
      sock.once('close', () => {
        // Whatever the supervisor sent is flushed to stdout before we exit.
        if (output.writableLength === 0) return finish(0);
        output.once('drain', () => finish(0));
        output.once('close', () => finish(0));
      });
    });
  });
}
