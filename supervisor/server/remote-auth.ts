// Who may use the WebSocket listener: the bearer token (from SBX_REMOTE_TOKEN, config
// remote.token, else the token file, made 0600 with 32 random bytes at first start and read
// again whenever it changes, so a token is rotated by renaming a new file over it), the
// constant-time check of an `Authorization: Bearer` header, and the slow-down of failures
// per remote address (100 ms doubling to 2 s, reset by a success). Never logs a token.
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { closeSync, constants, fstatSync, openSync, readFileSync, statSync, writeSync } from 'node:fs';
import { join } from 'node:path';

/** Where the token comes from (status and the start-up log say which, never the token). */
export type TokenSourceKind = 'env' | 'config' | 'file' | 'none';

/** The token file's default name under the state dir. */
export const TOKEN_FILE_NAME = 'remote-token';
/** Bytes of a token made at first start (base64url: 43 characters). */
const TOKEN_BYTES = 32;

/** Why a handshake failed (the metric's reason label). */
export type HandshakeFailure = 'no_token' | 'wrong_token' | 'bad_upgrade' | 'not_websocket' | 'upgrade_timeout' | 'connections';
export const HANDSHAKE_FAILURES: readonly HandshakeFailure[] = ['no_token', 'wrong_token', 'bad_upgrade', 'not_websocket', 'upgrade_timeout', 'connections'];

/** The token to compare against; re-read from its file when the file changes (inode, size, mtime). */
export class RemoteToken {
  private digest: Buffer | null = null;
  private seen = '';

  private constructor(readonly kind: TokenSourceKind, readonly file: string | null, fixed: string | null) {
    if (fixed !== null) this.digest = sha256(fixed);
  }

  /**
   * The token source, first that is set: env SBX_REMOTE_TOKEN, config remote.token, else the
   * file (tokenFile, default <stateDir>/remote-token), created 0600 if absent; `insecure`:
   * none (every client is served). Throws an Error saying why when no token can be had.
   */
  static open(opts: { env: NodeJS.ProcessEnv; token?: string; tokenFile?: string; stateDir: string; insecure: boolean }): RemoteToken {
    const envToken = opts.env.SBX_REMOTE_TOKEN;
    if (envToken) return new RemoteToken('env', null, envToken.trim());
    if (opts.token) return new RemoteToken('config', null, opts.token);
    if (opts.insecure) return new RemoteToken('none', null, null);
    const file = opts.tokenFile ?? join(opts.stateDir, TOKEN_FILE_NAME);
    createTokenFile(file);
    const t = new RemoteToken('file', file, null);
    t.refresh();
    if (!t.digest) throw new Error(`the remote token file ${file} holds no token (write one, or delete the file so a new one is made)`);
    return t;
  }

  /** Whether clients must give a token (false only for remote.insecure on loopback). */
  get required(): boolean {
    return this.kind !== 'none';
  }

  /** Re-reads the file if it changed since last read (a rename over it is a new inode). */
  private refresh(): void {
    if (this.file === null) return;
    let st;
    try {
      st = statSync(this.file);
    } catch {
      this.digest = null; // removed: nothing is accepted until a token file is back
      this.seen = '';
      return;
    }
    const id = `${st.dev}:${st.ino}:${st.size}:${st.mtimeMs}`;
    if (id === this.seen) return;
    this.seen = id;
    let text = '';
    try {
      text = readFileSync(this.file, 'utf8').trim();
    } catch {
      text = '';
    }
    this.digest = text ? sha256(text) : null;
  }

  /**
   * Checks an Authorization header value: 'ok', or why not ('no_token': none or not Bearer;
   * 'wrong_token'). Constant time in the token: digests of equal length are compared.
   */
  check(header: string | undefined): 'ok' | 'no_token' | 'wrong_token' {
    if (!this.required) return 'ok';
    const m = header === undefined ? null : /^Bearer[ \t]+(\S+)[ \t]*$/i.exec(header);
    if (!m) return 'no_token';
    this.refresh();
    if (!this.digest) return 'wrong_token';
    return timingSafeEqual(sha256(m[1]), this.digest) ? 'ok' : 'wrong_token';
  }
}

function sha256(text: string): Buffer {
  return createHash('sha256').update(text, 'utf8').digest();
}

/** Makes the token file (O_EXCL, 0600) with a new token unless it exists; an existing one readable by others is refused. */
function createTokenFile(file: string): void {
  try {
    const fd = openSync(file, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
    try {
      writeSync(fd, `${randomBytes(TOKEN_BYTES).toString('base64url')}\n`);
    } finally {
      closeSync(fd);
    }
    return;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw new Error(`cannot create the remote token file ${file}: ${(err as Error).message}`);
  }
  const fd = openSync(file, constants.O_RDONLY | constants.O_NOFOLLOW);
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) throw new Error(`the remote token file ${file} is not a regular file`);
    if ((st.mode & 0o077) !== 0) throw new Error(`the remote token file ${file} is readable by others (mode ${(st.mode & 0o777).toString(8)}): chmod 600 it`);
  } finally {
    closeSync(fd);
  }
}

/** First failure's delay, ms; it doubles per failure up to FAILURE_DELAY_MAX_MS. */
export const FAILURE_DELAY_FIRST_MS = 100;
export const FAILURE_DELAY_MAX_MS = 2000;
/** Addresses remembered at once (the oldest is forgotten past it). */
const MAX_ADDRESSES = 4096;
/** A failure this long ago no longer counts. */
const FORGET_AFTER_MS = 60_000;

/** Per remote address: how long the answer to its next failed handshake waits. */
export class FailureThrottle {
  private readonly failures = new Map<string, { count: number; lastAt: number }>();

  /** Records a failure from address; returns how long to delay its answer, ms. */
  failed(address: string, now = performance.now()): number {
    const prev = this.failures.get(address);
    const count = prev && now - prev.lastAt < FORGET_AFTER_MS ? prev.count + 1 : 1;
    this.failures.delete(address);
    this.failures.set(address, { count, lastAt: now });
    if (this.failures.size > MAX_ADDRESSES) this.failures.delete(this.failures.keys().next().value!);
    return Math.min(FAILURE_DELAY_FIRST_MS * 2 ** Math.min(count - 1, 20), FAILURE_DELAY_MAX_MS);
  }

  /** A success from address: its count starts again. */
  succeeded(address: string): void {
    this.failures.delete(address);
  }
}
