// Who may use the WebSocket listener: the bearer token (from SBX_REMOTE_TOKEN, config remote.token, else the
// token file, made 0600 with 32 random bytes at first start: RemoteToken), the constant-time check of an
// `Authorization: Bearer` header, and the slow-down of failures per remote address (100 ms doubling to 2 s,
// reset by a success: FailureThrottle). Never logs a token.
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { closeSync, constants, fstatSync, lstatSync, openSync, readSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { errnoCode, systemError } from '../../ipc/errno.js';

/** Where the token comes from (status and the start-up log say which, never the token). */
export type TokenSourceKind = 'env' | 'config' | 'file' | 'none';

/** The token file's default name under the state dir. */
export const TOKEN_FILE_NAME = 'remote-token';
/** Bytes of a token made at first start (base64url: 43 characters). */
const TOKEN_BYTES = 32;
/** The shortest token accepted from any source (as config remote.token). */
export const MIN_TOKEN_CHARS = 16;
/** A token file larger than this is no token file (a token is one line). */
const MAX_TOKEN_FILE_BYTES = 4096;

/** Why a handshake failed (the metric's reason label). */
export type HandshakeFailure = 'no_token' | 'wrong_token' | 'token_file_invalid' | 'bad_upgrade' | 'not_websocket' | 'upgrade_timeout' | 'connections';

/**
 * Why text is no token, or null when it is one: the rules of config remote.token (at least
 * MIN_TOKEN_CHARS characters, no white space). `what` names the source in the message.
 */
export function tokenProblem(text: string, what: string): string | null {
  if (text.length === 0) return `${what} holds no token`;
  if (/\s/.test(text)) return `${what} holds white space (a token is one word of at least ${MIN_TOKEN_CHARS} characters)`;
  if (text.length < MIN_TOKEN_CHARS) return `${what} holds a token of ${text.length} characters (at least ${MIN_TOKEN_CHARS})`;
  return null;
}

/**
 * The token file's token, with every check (at start and at every re-read): opened O_NOFOLLOW
 * (a symlink is refused), a regular file owned by uid, no group/other mode bits, at most 4 KiB,
 * its content minus one trailing newline (\n or \r\n) obeying tokenProblem. Returns the token
 * and the file's identity (dev:ino:size:mtime), or throws an Error saying why not (ENOENT's
 * `code` kept).
 */
export function readTokenFile(file: string, uid: number | undefined = process.getuid?.()): { token: string; id: string } {
  let fd: number;
  try {
    fd = openSync(file, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch (err) {
    const e = systemError(err);
    const why = e.code === 'ELOOP' ? 'is a symbolic link (the file itself must be the token file)' : `cannot be opened: ${e.code ?? e.message}`;
    throw Object.assign(new Error(`the remote token file ${file} ${why}`), { code: e.code });
  }
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) throw new Error(`the remote token file ${file} is not a regular file`);
    if (uid !== undefined && st.uid !== uid) throw new Error(`the remote token file ${file} is owned by uid ${st.uid}, not the supervisor's (${uid})`);
    if ((st.mode & 0o077) !== 0) throw new Error(`the remote token file ${file} is readable by others (mode ${(st.mode & 0o777).toString(8)}): chmod 600 it`);
    if (st.size > MAX_TOKEN_FILE_BYTES) throw new Error(`the remote token file ${file} is ${st.size} bytes (a token is one line)`);
    const buf = Buffer.alloc(MAX_TOKEN_FILE_BYTES + 1);
    let n = 0;
    for (let got = -1; got !== 0 && n < buf.length; n += got) got = readSync(fd, buf, n, buf.length - n, n);
    const token = buf
      .subarray(0, n)
      .toString('utf8')
      .replace(/\r?\n$/, '');
    const problem = tokenProblem(token, `the remote token file ${file}`);
    if (problem) throw new Error(`${problem} (write one, or delete the file so a new one is made)`);
    return { token, id: `${st.dev}:${st.ino}:${st.size}:${st.mtimeMs}:${st.mode}:${st.uid}` };
  } finally {
    closeSync(fd);
  }
}

/**
 * The token to compare against; a token file is re-read (readTokenFile, every check) when its
 * identity changes, so a token is rotated by renaming a new file over it. A file that fails the checks (or is gone) refuses every handshake
 * ('token_file_invalid', `invalid` says why) until a good one is there: fail closed, the
 * previous token is not kept.
 */
export class RemoteToken {
  private digest: Buffer | null = null;
  private seen = '';
  /** Why the token file is refused now, or null (a fixed token, or a good file). */
  invalid: string | null = null;

  private constructor(
    readonly kind: TokenSourceKind,
    readonly file: string | null,
    fixed: string | null,
  ) {
    if (fixed !== null) this.digest = sha256(fixed);
  }

  /**
   * The token source, first that is set: env SBX_REMOTE_TOKEN, config remote.token, else the
   * file (tokenFile, default <stateDir>/remote-token), created 0600 if absent; `insecure`:
   * none (every client is served). Throws an Error saying why when no token can be had (an
   * env token that breaks the rules of remote.token, a token file that fails readTokenFile).
   */
  static open(opts: { env: NodeJS.ProcessEnv; token?: string; tokenFile?: string; stateDir: string; insecure: boolean }): RemoteToken {
    const envToken = opts.env.SBX_REMOTE_TOKEN;
    if (envToken !== undefined && envToken !== '') {
      const problem = tokenProblem(envToken, 'SBX_REMOTE_TOKEN');
      if (problem) throw new Error(problem);
      return new RemoteToken('env', null, envToken);
    }
    if (opts.token) return new RemoteToken('config', null, opts.token);
    if (opts.insecure) return new RemoteToken('none', null, null);
    const file = opts.tokenFile ?? join(opts.stateDir, TOKEN_FILE_NAME);
    createTokenFile(file);
    const t = new RemoteToken('file', file, null);
    const { token, id } = readTokenFile(file);
    t.digest = sha256(token);
    t.seen = id;
    return t;
  }

  /** Whether clients must give a token (false only for remote.insecure on loopback). */
  get required(): boolean {
    return this.kind !== 'none';
  }

  /** Re-reads the file (with every check) when its identity changed (a rename over it is a new inode). */
  private refresh(): void {
    if (this.file === null) return;
    let id: string;
    try {
      const st = lstatSync(this.file);
      id = `${st.dev}:${st.ino}:${st.size}:${st.mtimeMs}:${st.mode}:${st.uid}`;
    } catch {
      id = 'gone';
    }
    if (id === this.seen) return;
    this.seen = id;
    this.digest = null; // fail closed: nothing is accepted until the file passes
    try {
      const read = readTokenFile(this.file);
      this.digest = sha256(read.token);
      this.invalid = null;
    } catch (err) {
      this.invalid = errnoCode(err) === 'ENOENT' ? `the remote token file ${this.file} is gone` : (err as Error).message;
    }
  }

  /**
   * Checks an Authorization header value: 'ok', or why not ('no_token': none or not Bearer;
   * 'token_file_invalid': the token file fails its checks, see `invalid`; 'wrong_token').
   * Constant time in the token: digests of equal length are compared.
   */
  check(header: string | undefined): 'ok' | 'no_token' | 'wrong_token' | 'token_file_invalid' {
    if (!this.required) return 'ok';
    this.refresh();
    if (!this.digest) return 'token_file_invalid';
    const m = header === undefined ? null : /^Bearer[ \t]+(\S+)[ \t]*$/i.exec(header);
    if (!m) return 'no_token';
    return timingSafeEqual(sha256(m[1]), this.digest) ? 'ok' : 'wrong_token';
  }
}

function sha256(text: string): Buffer {
  return createHash('sha256').update(text, 'utf8').digest();
}

/** Makes the token file (O_EXCL, O_NOFOLLOW, 0600) with a new token unless it exists (readTokenFile then checks it). */
function createTokenFile(file: string): void {
  try {
    const fd = openSync(file, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
    try {
      writeSync(fd, `${randomBytes(TOKEN_BYTES).toString('base64url')}\n`);
    } finally {
      closeSync(fd);
    }
  } catch (err) {
    if (errnoCode(err) !== 'EEXIST') throw new Error(`cannot create the remote token file ${file}: ${(err as Error).message}`);
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
