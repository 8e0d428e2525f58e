// `sbx bridge [--socket PATH]`: joins this process's stdin and stdout to the supervisor's Unix socket byte
// for byte (frames pass through unchanged), so any exec channel carries the protocol (docker exec -i BOX sbx
// bridge, kubectl exec -i, ssh, nsenter; docs/guide/remote.md). Writes nothing of its own to stdout. Imports
// node: only.
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

/** Bytes read from the socket at a time, into one buffer reused for the life of the bridge. */
const READ_BUFFER_BYTES = 256 * 1024;

/**
 * Runs the bridge until one side closes; resolves with the exit status: 0 when stdin ends (the socket
 * is ended) or the supervisor closes; EX_UNAVAILABLE (69), with a message on stderr (warn), when the
 * socket cannot be connected. Backpressure both ways (pipes: bounded memory):
 * socket → stdout, the bulk direction, reads into one reused buffer (net's onread) and stops
 * reading until stdout has taken each piece: no garbage per read, so its memory stays flat
 * however much passes. stdin → socket is a pipe (requests; stream.pipe's backpressure).
 */
export function runBridge(socketPath: string, warn: (message: string) => void): Promise<number> {
  return new Promise((resolve) => {
    let done = false;
    const finish = (status: number) => {
      if (done) return;
      done = true;
      resolve(status);
    };
    let output: Writable | null = null;
    let waitingForOutput = false;
    const sock = connect({
      path: socketPath,
      onread: {
        buffer: Buffer.allocUnsafe(READ_BUFFER_BYTES),
        callback: (bytes: number, buf: Uint8Array) => {
          if (!output) return true;
          // The buffer is read into again once resumed: stdout must have taken this piece first.
          waitingForOutput = true;
          output.write(buf.subarray(0, bytes), () => {
            waitingForOutput = false;
            if (!sock.destroyed) sock.resume();
            flushed();
          });
          return false;
        },
      },
    });
    let closed = false;
    const flushed = () => {
      if (closed && !waitingForOutput) finish(0);
    };
    sock.once('error', (err: NodeJS.ErrnoException) => {
      warn(`bridge: cannot connect to the supervisor at ${socketPath}: ${err.code ?? err.message}`);
      finish(EX_UNAVAILABLE);
    });
    sock.once('connect', () => {
      sock.removeAllListeners('error');
      sock.on('error', () => sock.destroy()); // a reset: 'close' follows
      const input = fdStream(0) as Readable;
      output = fdStream(1) as Writable;
      output.on('error', () => {
        // The reader of our stdout is gone: nothing can be delivered any more.
        sock.destroy();
        finish(0);
      });
      input.on('error', () => sock.end());
      input.pipe(sock); // stdin's end ends the socket (the supervisor then closes its side)
      sock.once('close', () => {
        // Whatever the supervisor sent is flushed to stdout before we exit.
        closed = true;
        flushed();
      });
    });
  });
}
