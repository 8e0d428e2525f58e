// A session's stdin (--stdin): bytes written by clients, each write at its offset, so a retry
// after a reconnect delivers every byte exactly once (bytes before the stdin cursor were
// delivered already and are skipped; a gap is INVALID_ARGUMENT; with a writer token, bytes
// another writer delivered at those offsets are a conflict, not a retry), in arrival order, with
// backpressure from the pipe or the pty. EOF closes a pipe's write end; on a pty it is VEOF
// (^D; twice after a partial line: termios(3)). Owns the stdin cursor; not the pipe's fd.
import type { Socket } from 'node:net';
import { SupervisorError } from '../../ipc/errors.js';

/** How far behind the stdin cursor writer ranges are kept: twice the largest write. */
const RETRY_WINDOW_BYTES = 16 * 1024 * 1024;

export class StdinWriter {
  /** Bytes of stdin accepted so far (where a reattaching terminal resumes). */
  cursor = 0;
  private closed = false;
  private lastByte: number | undefined;
  private chain: Promise<unknown> = Promise.resolve();
  /** Who wrote the recent stdin bytes: [start, end) ranges, newest last, merged per writer; kept for RETRY_WINDOW_BYTES. */
  private segments: { token: string | undefined; start: number; end: number }[] = [];

  /** `pty`: the writer is a pty master (EOF is ^D, not end of the pipe). */
  constructor(private readonly sessionId: string, private readonly writer: Socket, private readonly pty: boolean) {
    if (!pty) writer.on('error', () => (this.closed = true)); // EPIPE: nobody reads stdin any more
  }

  /**
   * Writes data at offset (default: the cursor); resolves with the new cursor once the bytes
   * are handed to the pipe or pty. eof then closes stdin. token: the writing client's token
   * (any string); bytes before the cursor count as this write's retry unless a writer with
   * another token delivered some of them: then INVALID_ARGUMENT with details {cursor,
   * stdin_conflict: true} and nothing is written (the client may send its bytes again at that
   * cursor). Bytes written without a token, and any write without one, follow the
   * single-writer rule: bytes before the cursor are skipped as delivered.
   */
  write(data: Buffer, offset: number | undefined, eof: boolean, token?: string): Promise<number> {
    const run = () => this.writeNow(data, offset, eof, token);
    const result = this.chain.then(run, run);
    this.chain = result.catch(() => {});
    return result;
  }

  private async writeNow(data: Buffer, offset: number | undefined, eof: boolean, token: string | undefined): Promise<number> {
    const start = offset ?? this.cursor;
    if (start > this.cursor) throw new SupervisorError('INVALID_ARGUMENT', `stdin offset ${start} is past the stdin cursor ${this.cursor}`, { cursor: this.cursor });
    if (token !== undefined && start < this.cursor && !this.wroteAll(token, start, Math.min(this.cursor, start + data.length))) {
      throw new SupervisorError('INVALID_ARGUMENT', `stdin of session ${this.sessionId}: another writer delivered bytes at offsets ${start}..${this.cursor}; this write was not delivered (send it at the stdin cursor ${this.cursor})`, { cursor: this.cursor, stdin_conflict: true });
    }
    const fresh = data.subarray(Math.min(data.length, this.cursor - start));
    if (this.closed) {
      if (fresh.length === 0) return this.cursor; // a retried eof
      throw new SupervisorError('INVALID_ARGUMENT', `stdin of session ${this.sessionId} is closed`, { cursor: this.cursor, stdin_closed: true });
    }
    const writer = this.writer;
    if (fresh.length > 0) {
      this.record(token, this.cursor, this.cursor + fresh.length);
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

  /** Whether no other token's writer delivered a stdin byte in [from, to) (within the kept window): bytes written without a token are anyone's (the single-writer rule). */
  private wroteAll(token: string, from: number, to: number): boolean {
    let at = from;
    for (const s of this.segments) {
      if (s.end <= at) continue;
      if (s.start > at || (s.token !== undefined && s.token !== token)) return false;
      at = s.end;
      if (at >= to) return true;
    }
    return at >= to;
  }

  private record(token: string | undefined, start: number, end: number): void {
    const last = this.segments[this.segments.length - 1];
    if (last && last.token === token && last.end === start) last.end = end;
    else this.segments.push({ token, start, end });
    // A retry overlaps at most one write (8 MiB, the schema's bound) behind the cursor.
    while (this.segments.length > 1 && this.segments[0].end <= end - RETRY_WINDOW_BYTES) this.segments.shift();
  }

  /** Closes a pipe's write end (the pty master is the drain's: left to it). */
  release(): void {
    this.closed = true;
    if (!this.pty) this.writer.destroy();
  }
}
