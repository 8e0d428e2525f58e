// Files over the transport, as sessions (docs/guide/files.md): writeFile, readFile, upload, download.
// Each call is keyed (a random key when none is given), so a resend after a drop finds the same
// session; stdin goes by offset (<= 4 MiB per write, exactly once), stdout is read by cursor
// (readOutput), and the receipt decides: exit 0, no dropped bytes, the digest of what was read.
// Owns those steps; the connection is ReconnectingClient's, the sessions the supervisor's.
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { PassThrough, type Readable, type Writable } from 'node:stream';
import { ReconnectingClient, readOutput, type ReconnectOptions } from './client.js';
import { ERROR_CODES, SupervisorError, type ErrorCode } from './errors.js';
import type { MethodName, ParamsOf } from './methods.js';
import type { LaunchResult, Receipt } from './protocol.js';
import { TarGuard } from './tar-guard.js';

/** Most bytes of stdin per `write` request (the schema allows 8 MiB); less when the server's frame limit is lower (stdinChunkBytes). */
export const FILE_WRITE_CHUNK_BYTES = 4 * 1024 * 1024;

/** Bytes of a `write` frame besides its data (id, method, session_id, offset, eof), with room to spare. */
const WRITE_FRAME_OVERHEAD_BYTES = 4096;

/** Stdin bytes per `write` for a server whose hello said max_frame_bytes: at most 4 MiB, and a frame under its limit. */
export function stdinChunkBytes(hello: { max_frame_bytes?: number } | undefined): number {
  const max = hello?.max_frame_bytes;
  if (typeof max !== 'number' || !Number.isFinite(max)) return FILE_WRITE_CHUNK_BYTES;
  return Math.max(1, Math.min(FILE_WRITE_CHUNK_BYTES, max - WRITE_FRAME_OVERHEAD_BYTES));
}

/** Options of every file call: the invocation key (default: a random one), task, the user its session runs as, and its deadline (ms; default none). */
export interface FileOptions {
  key?: string;
  task?: string;
  user?: string;
  /** The session's timeout_ms: a client that never comes back leaves no session waiting for its stdin past it. */
  timeoutMs?: number;
}

const sessionOpts = (verb: string, opts: FileOptions) => ({ key: opts.key ?? newKey(verb), task: opts.task, user: opts.user, timeout_ms: opts.timeoutMs });

/** Where the calls go: connect options (socketPath, reconnectMs, ...) shared by the requests and readOutput. */
export type FilesTarget = ReconnectOptions;

/** What each call answers: its session and its receipt. */
export interface FileResult {
  session_id: string;
  invocation_key: string;
  receipt: Receipt;
}

type FileMethod = Extract<MethodName, 'write_file' | 'read_file' | 'upload' | 'download'>;

const newKey = (method: string) => `file-${method}-${randomBytes(12).toString('hex')}`;

/** Launches the file session (again after a drop: its key returns the same session). */
function launchFile<M extends FileMethod>(conn: ReconnectingClient, method: M, params: ParamsOf<M>): Promise<LaunchResult> {
  return conn.run((c) => c.request(method, params) as Promise<LaunchResult>);
}

/**
 * Streams source into the session's stdin: each chunk at its offset, awaited, so after a drop
 * the relaunch (same key) tells the stdin cursor and the chunk is resent from there (the
 * supervisor skips bytes it had): every byte exactly once. `beforeEof` runs before eof is
 * sent (upload: the local tar's exit); it throws to leave stdin open (then the session is cancelled).
 */
async function feedStdin(
  conn: ReconnectingClient,
  relaunch: () => Promise<LaunchResult>,
  sessionId: string,
  source: AsyncIterable<Uint8Array>,
  beforeEof?: () => Promise<void>,
): Promise<number> {
  let offset = 0;
  // Each piece is sized for the connection it goes on (its hello's max_frame_bytes).
  const send = async (data: Buffer, eof: boolean) => {
    let at = 0;
    do {
      for (let first = true; ; first = false) {
        try {
          const c = await conn.get();
          if (!first) await relaunch(); // a new connection: the session is found by its key
          const n = Math.min(data.length - at, stdinChunkBytes(c.hello));
          await c.request('write', { session_id: sessionId, data: data.subarray(at, at + n), offset, eof: eof && at + n === data.length });
          at += n;
          offset += n;
          break;
        } catch (err) {
          if (err instanceof SupervisorError && err.details?.stdin_closed === true) throw new StdinClosed();
          if (err instanceof SupervisorError) throw err;
          conn.drop();
        }
      }
    } while (at < data.length);
  };
  let pending: Buffer[] = [];
  let pendingBytes = 0;
  const flush = async () => {
    if (pendingBytes === 0) return;
    const data = pending.length === 1 ? pending[0] : Buffer.concat(pending, pendingBytes); // one chunk (writeFile's data): no copy
    pending = [];
    pendingBytes = 0;
    await send(data, false);
  };
  try {
    for await (const chunk of source) {
      const b = Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
      pending.push(b);
      pendingBytes += b.length;
      if (pendingBytes >= FILE_WRITE_CHUNK_BYTES) await flush();
    }
    await flush();
    await beforeEof?.();
    await send(Buffer.alloc(0), true);
  } catch (err) {
    // The command stopped reading (ended, or closed its stdin: tar past the archive's end, the
    // tool on too many bytes): its receipt says how it went (settle).
    if (!(err instanceof StdinClosed)) throw err;
  }
  return offset;
}

/** The session's stdin took no more bytes: its command ended or closed it. */
class StdinClosed extends Error {}

/** Cancels a session quietly (a file call that failed on our side before its eof). */
async function cancelQuietly(conn: ReconnectingClient, sessionId: string): Promise<void> {
  try {
    await (await conn.get()).request('cancel', { session_id: sessionId, grace_ms: 0 });
  } catch {
    // it may have ended already
  }
}

/**
 * The receipt, then: exit 0, else the tool's error (its JSON line on stderr: code, message) or
 * FILE_ERROR with tar's stderr; stdout past the stream quota is OUTPUT_QUOTA_EXCEEDED.
 */
async function settle(conn: ReconnectingClient, sessionId: string, what: string): Promise<Receipt> {
  const receipt = await conn.run((c) => c.wait({ session_id: sessionId }));
  if (receipt.exit.code !== 0) {
    const stderr = await conn.run((c) => c.read({ session_id: sessionId }, 'stderr'));
    throw toolError(stderr.toString('utf8'), receipt, what);
  }
  const out = receipt.output.stdout;
  if (out && !out.complete && out.reason !== 'quota' && out.dropped_bytes === 0) {
    throw new SupervisorError('FILE_ERROR', `${what}: the session's stdout is incomplete (reason ${out.reason})`, {
      reason: out.reason,
      session_id: sessionId,
    });
  }
  if (out && (out.dropped_bytes > 0 || out.reason === 'quota')) {
    const total = out.final_cursor + out.dropped_bytes;
    throw new SupervisorError(
      'OUTPUT_QUOTA_EXCEEDED',
      `${what}: ${total} bytes are past the session's stream quota: ${out.final_cursor} stored, ${out.dropped_bytes} dropped (reason ${out.reason}); nothing is returned`,
      { total_bytes: total, stored_bytes: out.final_cursor, dropped_bytes: out.dropped_bytes, reason: out.reason, session_id: sessionId },
    );
  }
  return receipt;
}

/** The error a failed file session stands for: the tool's last JSON line, else FILE_ERROR with the stderr text. */
function toolError(stderr: string, receipt: Receipt, what: string): SupervisorError {
  const lines = stderr.trim().split('\n');
  const last = lines[lines.length - 1] ?? '';
  try {
    const parsed = JSON.parse(last) as { code?: string; message?: string } & Record<string, unknown>;
    if (typeof parsed.code === 'string' && parsed.code in ERROR_CODES) {
      const { code, message, ...details } = parsed;
      return new SupervisorError(code as ErrorCode, `${what}: ${message ?? code}`, { ...details, session_id: receipt.session_id });
    }
  } catch {
    // not the tool's line: tar's (or a spawn failure's) text
  }
  const why = receipt.exit.code !== null ? `exit ${receipt.exit.code}` : `${receipt.outcome}${receipt.exit.signal ? ` (${receipt.exit.signal})` : ''}`;
  return new SupervisorError('FILE_ERROR', `${what}: ${why}${stderr.trim() ? `: ${stderr.trim().slice(-4096)}` : ''}`, {
    exit: receipt.exit,
    outcome: receipt.outcome,
    session_id: receipt.session_id,
  });
}

/** Reads the session's stdout by cursor into sink, and checks its sha256 against the receipt's. */
async function readStdout(
  target: FilesTarget,
  sessionId: string,
  receipt: Receipt,
  sink: (data: Buffer) => Promise<void> | void,
  what: string,
): Promise<number> {
  const hash = createHash('sha256');
  let bytes = 0;
  for await (const { data } of readOutput({ ...target, selector: { session_id: sessionId }, stream: 'stdout', follow: true })) {
    hash.update(data);
    bytes += data.length;
    await sink(data);
  }
  const want = receipt.output.stdout;
  const got = hash.digest('hex');
  if (!want || want.final_cursor !== bytes || want.sha256 !== got) {
    throw new SupervisorError('INTERNAL', `${what}: read ${bytes} bytes (sha256 ${got}), the receipt says ${want?.final_cursor} (sha256 ${want?.sha256})`, {
      session_id: sessionId,
    });
  }
  return bytes;
}

async function* once(data: Uint8Array): AsyncIterable<Uint8Array> {
  yield data;
}

/**
 * Writes data to the absolute path on the supervisor's side, atomically (temp file, fsync,
 * fchmod(mode, default 0o644), rename, fsync of the directory), never through a symlink.
 * Errors: SYMLINK_REFUSED, NOT_FOUND, NOT_A_DIRECTORY, PERMISSION_DENIED, SIZE_MISMATCH,
 * LIMIT_EXCEEDED {limit: "file_bytes"} (over files.maxBytes), FILE_ERROR.
 */
export async function writeFile(target: FilesTarget, path: string, data: Uint8Array, opts: FileOptions & { mode?: number } = {}): Promise<FileResult> {
  const conn = new ReconnectingClient(target);
  try {
    const params = { path, mode: opts.mode, size_bytes: data.length, ...sessionOpts('write', opts) };
    const launch = () => launchFile(conn, 'write_file', params);
    const started = await launch();
    try {
      await feedStdin(conn, launch, started.session_id, once(data));
    } catch (err) {
      await cancelQuietly(conn, started.session_id); // no session left waiting on its stdin
      throw err;
    }
    const receipt = await settle(conn, started.session_id, `write_file ${path}`);
    return { session_id: started.session_id, invocation_key: started.invocation_key, receipt };
  } finally {
    conn.drop();
  }
}

/**
 * The bytes of the regular file at path (never through a symlink). OUTPUT_QUOTA_EXCEEDED when
 * the file is larger than the session's stream quota (drain.quotaBytes): never a silent tail.
 */
export async function readFile(target: FilesTarget, path: string, opts: FileOptions = {}): Promise<Buffer & { result: FileResult }> {
  const conn = new ReconnectingClient(target);
  try {
    const started = await launchFile(conn, 'read_file', { path, ...sessionOpts('read', opts) });
    const receipt = await settle(conn, started.session_id, `read_file ${path}`);
    const parts: Buffer[] = [];
    await readStdout(target, started.session_id, receipt, (d) => void parts.push(d), `read_file ${path}`);
    return Object.assign(Buffer.concat(parts), { result: { session_id: started.session_id, invocation_key: started.invocation_key, receipt } });
  } finally {
    conn.drop();
  }
}

/** Waits for a child's exit; rejects with FILE_ERROR (its stderr) unless it exits 0. */
function exited(child: ReturnType<typeof spawn>, what: string, stderr: () => string): Promise<void> {
  return new Promise((resolve, reject) => {
    child.once('error', (err) => reject(new SupervisorError('FILE_ERROR', `${what}: ${err.message}`)));
    child.once('close', (code, signal) => {
      if (code === 0) resolve();
      else reject(new SupervisorError('FILE_ERROR', `${what}: exit ${code ?? signal}: ${stderr().trim().slice(-4096)}`, { exit: code, signal }));
    });
  });
}

function collect(stream: Readable | null): () => string {
  let text = '';
  stream?.on('data', (d: Buffer) => {
    if (text.length < 65536) text += d.toString('utf8');
  });
  return () => text;
}

/**
 * Copies the local directory's tree into remoteDir (which must exist) with the file tool's `upload` on the
 * supervisor's side (tar into a staging dir, merged without following links); the local `tar -c -f - -C localDir .` is streamed to its stdin. A local tar
 * that fails leaves the remote stdin open and the session cancelled (FILE_ERROR).
 */
export async function upload(target: FilesTarget, localDir: string, remoteDir: string, opts: FileOptions = {}): Promise<FileResult> {
  const conn = new ReconnectingClient(target);
  const tar = spawn('tar', ['-c', '-f', '-', '-C', localDir, '.'], { stdio: ['ignore', 'pipe', 'pipe'] });
  const tarDone = exited(tar, `upload: local tar -c ${localDir}`, collect(tar.stderr));
  tarDone.catch(() => undefined);
  // Read from now on: a child's stdout nobody reads when it exits is resumed and its bytes
  // dropped (node's flushStdio); the PassThrough holds them, with backpressure past 4 MiB.
  const source = tar.stdout!.pipe(new PassThrough({ highWaterMark: FILE_WRITE_CHUNK_BYTES }));
  let sessionId: string | null = null;
  try {
    const params = { dir: remoteDir, ...sessionOpts('upload', opts) };
    const launch = () => launchFile(conn, 'upload', params);
    const started = await launch();
    sessionId = started.session_id;
    await feedStdin(conn, launch, started.session_id, source, () => tarDone);
    sessionId = null;
    const receipt = await settle(conn, started.session_id, `upload ${remoteDir}`);
    return { session_id: started.session_id, invocation_key: started.invocation_key, receipt };
  } catch (err) {
    if (sessionId) await cancelQuietly(conn, sessionId);
    throw err;
  } finally {
    if (tar.exitCode === null && tar.signalCode === null) tar.kill('SIGKILL');
    await tarDone.catch(() => undefined);
    conn.drop();
  }
}

/**
 * Copies remoteDir's tree into the local directory (which must exist): `tar -c -f - -C DIR .` on
 * the supervisor's side, its stdout read by cursor into a local `tar -x -p -f - -C localDir`
 * (GNU tar drops leading "/" and refuses members with ".."). OUTPUT_QUOTA_EXCEEDED when the tar
 * is larger than the stream quota (nothing is extracted then).
 */
export async function download(target: FilesTarget, remoteDir: string, localDir: string, opts: FileOptions = {}): Promise<FileResult> {
  const conn = new ReconnectingClient(target);
  try {
    const started = await launchFile(conn, 'download', { dir: remoteDir, ...sessionOpts('download', opts) });
    const receipt = await settle(conn, started.session_id, `download ${remoteDir}`);
    await refuseSkipped(conn, started.session_id, remoteDir);
    const guard = new TarGuard();
    const tar = spawn('tar', ['-x', '-p', '-f', '-', '-C', localDir], { stdio: ['pipe', 'ignore', 'pipe'] });
    const tarDone = exited(tar, `download: local tar -x ${localDir}`, collect(tar.stderr));
    tarDone.catch(() => undefined);
    try {
      await readStdout(
        target,
        started.session_id,
        receipt,
        (d) => {
          guard.push(d); // a FIFO or device member: FILE_ERROR before the local tar sees it
          return writeAll(tar.stdin!, d);
        },
        `download ${remoteDir}`,
      );
      tar.stdin!.end();
      await tarDone;
    } finally {
      if (tar.exitCode === null && tar.signalCode === null) tar.kill('SIGKILL');
      await tarDone.catch(() => undefined);
    }
    return { session_id: started.session_id, invocation_key: started.invocation_key, receipt };
  } finally {
    conn.drop();
  }
}

/**
 * FILE_ERROR naming the entries the remote tar left out with exit 0 (GNU tar: "socket ignored"):
 * a download is the whole tree or an error, never silently less (docs/guide/files.md).
 */
async function refuseSkipped(conn: ReconnectingClient, sessionId: string, remoteDir: string): Promise<void> {
  const stderr = (await conn.run((c) => c.read({ session_id: sessionId }, 'stderr'))).toString('utf8');
  const skipped = stderr.split('\n').filter((l) => / ignored$/.test(l.trim()));
  if (skipped.length > 0) {
    const entries = skipped.map((l) => l.replace(/^tar: /, '').replace(/: [^:]* ignored$/, ''));
    throw new SupervisorError(
      'FILE_ERROR',
      `download ${remoteDir}: the remote tar left out ${skipped.length} entries (sockets): ${skipped.join('; ').slice(0, 4096)}; nothing was extracted`,
      { skipped: entries, session_id: sessionId },
    );
  }
}

/** Writes with backpressure: resolves once the stream takes more. */
function writeAll(w: Writable, data: Buffer): Promise<void> {
  return new Promise((resolve, reject) => {
    const onError = (err: Error) => reject(new SupervisorError('FILE_ERROR', `local tar: ${err.message}`));
    w.once('error', onError);
    if (w.write(data)) {
      w.off('error', onError);
      resolve();
    } else {
      w.once('drain', () => {
        w.off('error', onError);
        resolve();
      });
    }
  });
}

/**
 * The four calls bound to one target, for harnesses that hold one:
 * `const files = new Files({ socketPath }); await files.writeFile('/w/a', data, { mode: 0o600 })`.
 */
export class Files {
  constructor(readonly target: FilesTarget = {}) {}
  writeFile(path: string, data: Uint8Array, opts: FileOptions & { mode?: number } = {}): Promise<FileResult> {
    return writeFile(this.target, path, data, opts);
  }
  readFile(path: string, opts: FileOptions = {}): Promise<Buffer & { result: FileResult }> {
    return readFile(this.target, path, opts);
  }
  upload(localDir: string, remoteDir: string, opts: FileOptions = {}): Promise<FileResult> {
    return upload(this.target, localDir, remoteDir, opts);
  }
  download(remoteDir: string, localDir: string, opts: FileOptions = {}): Promise<FileResult> {
    return download(this.target, remoteDir, localDir, opts);
  }
}
