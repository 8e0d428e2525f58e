// A session's stdin (--stdin): bytes written by clients, each write at its offset, so a retry
// after a reconnect delivers every byte exactly once (bytes before the stdin cursor were
// delivered already and are skipped; a gap is INVALID_ARGUMENT), in arrival order, with
// backpressure from the pipe or the pty. EOF closes a pipe's write end; on a pty it is VEOF
// (^D; twice after a partial line: termios(3)). Owns the stdin cursor; not the pipe's fd.
import type { Socket } from 'node:net';
import { SupervisorError } from '../../ipc/errors.js';

export class StdinWriter {
  /** Bytes of stdin accepted so far (where a reattaching terminal resumes). */
  cursor = 0;
  private closed = false;
  private lastByte: number | undefined;
  private chain: Promise<unknown> = Promise.resolve();

  /** `pty`: the writer is a pty master (EOF is ^D, not end of the pipe). */
  constructor(private readonly sessionId: string, private readonly writer: Socket, private readonly pty: boolean) {
    if (!pty) writer.on('error', () => (this.closed = true)); // EPIPE: nobody reads stdin any more
  }

  /**
   * Writes data at offset (default: the cursor); resolves with the new cursor once the bytes
   * are handed to the pipe or pty. eof then closes stdin.
   */
  write(data: Buffer, offset: number | undefined, eof: boolean): Promise<number> {
    const run = () => this.writeNow(data, offset, eof);
    const result = this.chain.then(run, run);
    this.chain = result.catch(() => {});
    return result;
  }

  private async writeNow(data: Buffer, offset: number | undefined, eof: boolean): Promise<number> {
    const start = offset ?? this.cursor;
    if (start > this.cursor) throw new SupervisorError('INVALID_ARGUMENT', `stdin offset ${start} is past the stdin cursor ${this.cursor}`, { cursor: this.cursor });
    const fresh = data.subarray(Math.min(data.length, this.cursor - start));
    if (this.closed) {
      if (fresh.length === 0) return this.cursor; // a retried eof
      throw new SupervisorError('INVALID_ARGUMENT', `stdin of session ${this.sessionId} is closed`, { cursor: this.cursor, stdin_closed: true });
    }
    const writer = this.writer;
    if (fresh.length > 0) {
      this.cursor += fresh.length;
      this.lastByte = fresh[fresh.length - 1];
      if (!writer.write(fresh)) {
        // Until the pipe takes the bytes, or fails (EPIPE: the command stopped reading) or is
        // closed under the write (the session ended): then the write is refused, never hangs.
        await new Promise<void>((resolve) => {
          const done = () => {
            writer.off('drain', done);
            writer.off('close', done);
            writer.off('error', done);
            resolve();
          };
          writer.on('drain', done);
          writer.on('close', done);
          writer.on('error', done);
          if (writer.destroyed) done();
        });
        if (writer.destroyed) {
          this.closed = true;
          throw new SupervisorError('INVALID_ARGUMENT', `stdin of session ${this.sessionId} closed before it took the bytes (the command stopped reading, or ended)`, { cursor: this.cursor, stdin_closed: true });
        }
      }
    }
    if (eof) {
      this.closed = true;
      if (this.pty) writer.write(Buffer.from(this.lastByte === undefined || this.lastByte === 10 ? [4] : [4, 4]));
      else writer.end();
    }
    return this.cursor;
  }

  /** Closes a pipe's write end (the pty master is the drain's: left to it). */
  release(): void {
    this.closed = true;
    if (!this.pty) this.writer.destroy();
  }
}
