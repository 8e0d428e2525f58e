// A session's stdin (--stdin): bytes written by clients, each write at its offset in its writer's own byte
// stream, so a retry after a reconnect delivers every byte exactly once (bytes before that writer's cursor
// were delivered already and are skipped; a gap is INVALID_ARGUMENT). In arrival order, with backpressure
// from the pipe or the pty. Owns the stdin cursors; not the pipe's fd.
import type { Socket } from 'node:net';
import { SupervisorError } from '../../ipc/errors.js';

/** Writer tokens a session's stdin tracks at most (a cursor each); a new one beyond is LIMIT_EXCEEDED. */
export const MAX_STDIN_WRITERS = 1024;

/**
 * Writes without a writer token share one stream (the single writer of before); each token is a
 * stream of its own, so writers side by side interleave per write and never skip each other's bytes.
 */
export class StdinWriter {
  /** Bytes accepted from writes without a token: their shared stream's cursor (where a reattaching terminal resumes). */
  cursor = 0;
  /** Each writer token's cursor: bytes of its stream accepted. */
  private readonly writers = new Map<string, number>();
  private closed = false;
  private lastByte: number | undefined;
  private chain: Promise<unknown> = Promise.resolve();

  /** `pty`: the writer is a pty master (EOF is ^D, not end of the pipe). */
  constructor(
    private readonly sessionId: string,
    private readonly writer: Socket,
    private readonly pty: boolean,
  ) {
    if (!pty) writer.on('error', () => (this.closed = true)); // EPIPE: nobody reads stdin any more
  }

  /**
   * Writes data at offset in the stream of token (default offset: that stream's cursor);
   * resolves with that stream's new cursor once the bytes are handed to the pipe or pty. eof
   * then closes stdin (for every writer). token: the writing client's token (1-128 chars);
   * none: the shared stream of tokenless writes. Errors: INVALID_ARGUMENT for a gap (details
   * {cursor}) or a closed stdin (details {cursor, stdin_closed: true}; not for bytes all before
   * the cursor or an empty eof, answered with the cursor); LIMIT_EXCEEDED
   * {limit: 'stdin_writers'} for a token past MAX_STDIN_WRITERS.
   */
  write(data: Buffer, offset: number | undefined, eof: boolean, token?: string): Promise<number> {
    const run = () => this.writeNow(data, offset, eof, token);
    const result = this.chain.then(run, run);
    this.chain = result.catch(() => {});
    return result;
  }

  /** The cursor of token's stream (tokenless: the shared one); 0 for a token not seen. */
  cursorOf(token?: string): number {
    return token === undefined ? this.cursor : (this.writers.get(token) ?? 0);
  }

  private async writeNow(data: Buffer, offset: number | undefined, eof: boolean, token: string | undefined): Promise<number> {
    const at = this.cursorOf(token);
    const start = offset ?? at;
    if (start > at)
      throw new SupervisorError('INVALID_ARGUMENT', `stdin offset ${start} is past the stdin cursor ${at}${token === undefined ? '' : ' of this writer'}`, {
        cursor: at,
      });
    const fresh = data.subarray(Math.min(data.length, at - start));
    if (this.closed) {
      // Bytes all before the cursor (a resend) and an empty eof (a retried close) are answered
      // with the cursor; a new empty write without eof (a probe: sbx attach, sbx write with
      // nothing to send) is told stdin is closed.
      if (fresh.length === 0 && (data.length > 0 || eof)) return at;
      throw new SupervisorError('INVALID_ARGUMENT', `stdin of session ${this.sessionId} is closed`, { cursor: at, stdin_closed: true });
    }
    if (token !== undefined && fresh.length > 0 && !this.writers.has(token) && this.writers.size >= MAX_STDIN_WRITERS) {
      throw new SupervisorError('LIMIT_EXCEEDED', `stdin of session ${this.sessionId} has had ${MAX_STDIN_WRITERS} writers already`, {
        limit: 'stdin_writers',
        max: MAX_STDIN_WRITERS,
      });
    }
    const writer = this.writer;
    let now = at;
    if (fresh.length > 0) {
      now = at + fresh.length;
      if (token === undefined) this.cursor = now;
      else this.writers.set(token, now);
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
          throw new SupervisorError(
            'INVALID_ARGUMENT',
            `stdin of session ${this.sessionId} closed before it took the bytes (the command stopped reading, or ended)`,
            { cursor: now, stdin_closed: true },
          );
        }
      }
    }
    if (eof) {
      // EOF closes a pipe's write end; on a pty it is VEOF (^D; twice after a partial line: termios(3)).
      this.closed = true;
      if (this.pty) writer.write(Buffer.from(this.lastByte === undefined || this.lastByte === 10 ? [4] : [4, 4]));
      else writer.end();
    }
    return now;
  }

  /** Closes a pipe's write end (the pty master is the drain's: left to it). */
  release(): void {
    this.closed = true;
    if (!this.pty) this.writer.destroy();
  }
}
