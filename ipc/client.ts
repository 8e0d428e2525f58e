// The client library: one connection to the supervisor (its Unix socket, a WebSocket URL or a
// spawned command: ipc/transport.ts), the hello, requests with ids, keepalive while calls are
// pending, and output subscriptions whose events are routed to handlers. Used by sbx and by
// harnesses. Owns no process and no session: closing it never touches a command.
import { SupervisorError } from './errors.js';
import { encodeFrame } from './framing.js';
import type { GcResult, MethodName, ParamsOf, ResultOf, SealResult } from './methods.js';
import { describeEndpoint, openTransport, resolveEndpoint, transportError, type EndpointOptions, type FrameTransport } from './transport.js';
import {
  PROTOCOL_VERSIONS,
  type ChangesResult,
  type CheckpointResult,
  type EndEvent,
  type HelloResult,
  type LaunchParams,
  type LaunchResult,
  type OutputEvent,
  type RequestFrame,
  type ResponseFrame,
  type Receipt,
  type SessionSelector,
  type SessionSummary,
  type StatusResult,
  type CloseReceipt,
  type StreamName,
  type ReadIndexParams,
  type ReadIndexResult,
  type SubscribeParams,
  type SubscribeResult,
  type TaskReceipt,
  type TaskSealResult,
} from './protocol.js';
import { errnoCode } from './errno.js';

export type { EndpointOptions } from './transport.js';

/** While a call is pending and nothing arrived for this long, a ping is sent, in ms. */
export const DEFAULT_KEEPALIVE_MS = 5_000;
/** While a call is pending and nothing arrived for this long, the transport is dead, in ms. */
export const DEFAULT_SILENCE_MS = 15_000;
/** Deadline of connect + hello, in ms. */
export const DEFAULT_CONNECT_TIMEOUT_MS = 10_000;

/**
 * Where the supervisor is (EndpointOptions: socketPath, or url with token/tokenFile, or
 * command; default $SBX_URL, else the socket) and the deadlines of the connection.
 */
export interface ConnectOptions extends EndpointOptions {
  clientName?: string;
  /** Ping after this long without a byte while a call is pending (default 5000 ms). */
  keepaliveMs?: number;
  /** Declare the transport dead after this long without a byte while a call is pending (default 15000 ms): calls fail ETIMEDOUT. */
  silenceMs?: number;
  /** Deadline of connect + hello (default 10000 ms): ETIMEDOUT. */
  connectTimeoutMs?: number;
}

export interface SubscriptionHandlers {
  onOutput(event: OutputEvent): void;
  onEnd(event: EndEvent): void;
  /** The subscription failed after it started (the stored output could not be read): no end event follows. */
  onError?(err: SupervisorError): void;
}

interface Pending {
  resolve(value: unknown): void;
  reject(err: Error): void;
}

/**
 * A launch without an invocation key that was sent and then lost its connection before the
 * answer: it may have been admitted, and sending it again could run the command twice, so it
 * is not resent (ReconnectingClient.run throws it). code LAUNCH_UNCONFIRMED; `cause` the drop.
 */
export class LaunchUnconfirmedError extends Error {
  readonly code = 'LAUNCH_UNCONFIRMED';
  /** Never resent (ReconnectingClient.run rethrows it). */
  readonly resend = false;

  constructor(cause: Error) {
    super(
      `the launch (without an invocation key) may have reached the supervisor before the connection was lost (${errnoCode(cause) ?? cause.message}); it is not sent again, which could run it twice: give invocation_key to make a launch resendable (ps shows whether it runs)`,
      { cause },
    );
    this.name = 'LaunchUnconfirmedError';
  }
}

/**
 * A connection to the supervisor; every method rejects with SupervisorError or a transport
 * Error (an errno-like code: ECONNRESET, ETIMEDOUT when the transport went silent, ...).
 */
export class SupervisorClient {
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  private readonly subscriptions = new Map<number, SubscriptionHandlers>();
  /** Ids of keepalive pings not yet answered (their answers, or errors from an older supervisor, are only bytes). */
  private readonly pings = new Set<number>();
  private closedError: Error | null = null;
  private readonly closeListeners: ((err: Error) => void)[] = [];
  private readonly keepalive: { timer: NodeJS.Timeout; tickMs: number; lastTickAt: number; seen: number; activeAt: number; pingAt: number };
  hello!: HelloResult;

  private constructor(
    private readonly transport: FrameTransport,
    private readonly keepaliveMs: number,
    private readonly silenceMs: number,
  ) {
    transport.start((frame) => this.route(frame as ResponseFrame));
    transport.onClose((err) => this.fail(err));
    const tickMs = Math.max(5, Math.min(keepaliveMs, silenceMs) / 4);
    const now = performance.now();
    this.keepalive = { timer: setInterval(() => this.tick(), tickMs).unref(), tickMs, lastTickAt: now, seen: 0, activeAt: now, pingAt: 0 };
  }

  /**
   * Connects to the endpoint (ConnectOptions: socketPath, url + token, or command; default
   * $SBX_URL, else the socket) and runs the hello, within connectTimeoutMs (ETIMEDOUT).
   * Rejects with the connect error (ENOENT, ECONNREFUSED, ENOTSOCK, a spawn error),
   * UNAUTHORIZED (a 401 from a URL, or the supervisor's refusal), INVALID_ARGUMENT (bad options).
   */
  static async connect(options: ConnectOptions = {}): Promise<SupervisorClient> {
    const endpoint = resolveEndpoint(options);
    const timeoutMs = options.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS;
    const deadline = new AbortController();
    // The error is made only when the deadline passes (no stack trace on every connect).
    const late = () => deadline.signal.reason as Error;
    const timer = setTimeout(
      () =>
        deadline.abort(
          transportError('ETIMEDOUT', `no answer from the supervisor at ${describeEndpoint(endpoint)} within ${timeoutMs} ms (connect and hello)`),
        ),
      timeoutMs,
    );
    let client: SupervisorClient | null = null;
    try {
      const transport = await openTransport(endpoint, { signal: deadline.signal });
      client = new SupervisorClient(transport, options.keepaliveMs ?? DEFAULT_KEEPALIVE_MS, options.silenceMs ?? DEFAULT_SILENCE_MS);
      const hello = client.request('hello', {
        versions: [...PROTOCOL_VERSIONS],
        client: options.clientName ?? 'sandbox-supervisor-client',
      });
      const c = client;
      deadline.signal.addEventListener('abort', () => c.destroy(late()), { once: true });
      client.hello = await hello;
      if (typeof client.hello?.version !== 'number')
        throw transportError('EPROTO', `the peer at ${transport.endpoint} answered the hello without a version: not a supervisor`);
      return client;
    } catch (err) {
      client?.close();
      throw err;
    } finally {
      clearTimeout(timer);
    }
  }

  /** The spawned command's pid, for a command endpoint (undefined otherwise). */
  get transportPid(): number | undefined {
    return this.transport.pid;
  }

  /**
   * Sends one request and resolves with its result (typed by the method table, ipc/methods.ts).
   * One the supervisor refuses as too many in flight on this connection (LIMIT_EXCEEDED, limit
   * "in_flight": refused before it ran) is sent again after its retry_after_ms.
   */
  request<M extends MethodName>(method: M, params: ParamsOf<M>): Promise<ResultOf<M>> {
    const sent = this.resendRefusedInFlight(() => this.requestOnce(method, params));
    // A keyless launch that may have arrived is never sent again (LaunchUnconfirmedError).
    if (method === 'launch' && (params as LaunchParams).invocation_key === undefined) {
      return sent.catch((err: Error) => {
        throw err instanceof SupervisorError ? err : new LaunchUnconfirmedError(err);
      });
    }
    return sent;
  }

  private requestOnce<M extends MethodName>(method: M, params: ParamsOf<M>): Promise<ResultOf<M>> {
    if (this.closedError) return Promise.reject(this.closedError);
    const id = this.nextId++;
    this.markBusy();
    return new Promise<ResultOf<M>>((resolve, reject) => {
      this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject });
      this.transport.send(encodeFrame({ id, method, params: withoutUndefined(params) } satisfies RequestFrame));
    });
  }

  /**
   * send() again after retry_after_ms (default 100) while the supervisor refuses it as one
   * request too many in flight on this connection (LIMIT_EXCEEDED, limit "in_flight",
   * protocol.md's ipc.maxInFlight): such a request was refused before it ran, so sending it
   * again is safe for any method. As the Python AsyncClient does. Other errors, and a
   * connection closed meanwhile, reject.
   */
  private async resendRefusedInFlight<T>(send: () => Promise<T>): Promise<T> {
    for (;;) {
      try {
        return await send();
      } catch (err) {
        if (!(err instanceof SupervisorError) || err.code !== 'LIMIT_EXCEEDED' || err.details?.limit !== 'in_flight' || this.closedError) throw err;
        const ms = Number(err.details.retry_after_ms);
        await new Promise((r) => setTimeout(r, Number.isFinite(ms) && ms > 0 ? ms : 100));
      }
    }
  }

  launch(params: LaunchParams): Promise<LaunchResult> {
    return this.request('launch', params);
  }

  /**
   * Launches params (as launch; `options.inheritEnv`: this process's environment as
   * `inherit_env`, as `sbx run` passes it), writes `options.stdin` then EOF (absent:
   * /dev/null), follows stdout and stderr to their ends at once on this connection, and
   * resolves once the receipt is durable. `onStdout`/`onStderr`: called with each new piece of
   * that stream as it arrives, in cursor order; such a stream is not kept (its field null),
   * so memory is one piece, not the output. A callback that throws rejects run and cancels
   * the session. With `params.pty` the session has one stream, the terminal's (`pty`: stdout
   * and stderr together, `\n` as `\r\n`): it comes as stdout, as `sbx run --pty` and
   * `docker run -t` print it, and stderr is empty. Errors as launch, subscribe and wait; a
   * drop rejects (one connection). A session unknown with no receipt on its way once its
   * streams have ended (its exec shim died, its receipt could not be written, a restart found
   * no evidence of its end) rejects with SESSION_UNKNOWN (details: session_id, reason) rather
   * than waiting for good; it is not cancelled, and its key is never run again (sbx resolve is
   * the operator's way to end it).
   */
  async run(params: LaunchParams, options: RunOptions = {}): Promise<RunResult> {
    const launch: LaunchParams = { ...params, stdin: options.stdin !== undefined ? true : params.stdin };
    if (options.inheritEnv) launch.inherit_env = { ...definedEnv(process.env), ...(params.inherit_env ?? {}) };
    const session = await this.launch(launch);
    const selector = { session_id: session.session_id };
    const kept: Record<'stdout' | 'stderr', Buffer[]> = { stdout: [], stderr: [] };
    const sinks = {
      stdout: options.onStdout ?? ((b: Buffer) => void kept.stdout.push(b)),
      stderr: options.onStderr ?? ((b: Buffer) => void kept.stderr.push(b)),
    };
    const follow = (stream: 'stdout' | 'stderr', stored: StreamName = stream) =>
      new Promise<void>((resolve, reject) => {
        let expected = 0;
        this.subscribe(
          { ...selector, stream: stored, from: 0, follow: true },
          {
            onOutput: (ev) => {
              if (ev.cursor !== expected) return;
              const data = Buffer.from(ev.data.buffer, ev.data.byteOffset, ev.data.byteLength);
              expected += data.length;
              try {
                sinks[stream](data);
              } catch (err) {
                reject(err as Error);
              }
            },
            onEnd: () => resolve(),
            onError: reject,
          },
        ).catch(reject);
        this.onClose(reject);
      });
    try {
      if (options.stdin !== undefined && session.state !== 'ended') await this.writeAll(selector, options.stdin);
      await Promise.all(params.pty ? [follow('stdout', 'pty')] : [follow('stdout'), follow('stderr')]);
    } catch (err) {
      if (!(err instanceof SupervisorError) && !this.closedError) await this.request('cancel', selector).catch(() => undefined);
      throw err;
    }
    // unknown "fail": a session unknown with no receipt on its way is answered SESSION_UNKNOWN,
    // where a plain wait would never answer. Sent once the streams have ended, so a run holds
    // two requests in flight at most (ipc.maxInFlight).
    const receipt = await this.wait(selector, { unknown: 'fail' });
    return {
      session,
      receipt,
      stdout: options.onStdout ? null : Buffer.concat(kept.stdout),
      stderr: options.onStderr ? null : Buffer.concat(kept.stderr),
    };
  }

  /** All of data then EOF on the session's stdin, in writes of at most 8 MiB at their offsets; a command that stopped reading is not an error. */
  private async writeAll(selector: SessionSelector, data: Buffer): Promise<void> {
    const piece = 8 * 1024 * 1024;
    try {
      for (let at = 0; at === 0 || at < data.length; at += piece) {
        const part = data.subarray(at, at + piece);
        await this.request('write', { ...selector, data: part, offset: at, eof: at + piece >= data.length });
        if (data.length === 0) break;
      }
    } catch (err) {
      if (err instanceof SupervisorError && err.code === 'INVALID_ARGUMENT' && (err.details as { stdin_closed?: boolean } | undefined)?.stdin_closed) return;
      throw err;
    }
  }

  /** Sends signal (a name such as 'SIGUSR1', or a number; default SIGKILL, as `sbx kill`) to every process of the session. Never resent (ReconnectingClient.run would). */
  kill(selector: SessionSelector, signal: string | number = 'SIGKILL'): Promise<ResultOf<'kill'>> {
    return this.request('kill', { ...selector, signal });
  }

  /**
   * Resolves with the receipt once the session has ended (durably). `unknown: 'fail'`: rejects
   * with SESSION_UNKNOWN (details: session_id, reason) once the session is unknown with no
   * receipt on its way, rather than waiting until evidence or an operator ends it (the default).
   */
  wait(selector: SessionSelector, options: { unknown?: 'wait' | 'fail' } = {}): Promise<Receipt> {
    return this.request('wait', { ...selector, ...options });
  }

  /** The session's state, its receipt (null until ended) and, for an escaped one, the operator's word once given. */
  receipt(selector: SessionSelector): Promise<ResultOf<'receipt'>> {
    return this.request('receipt', selector);
  }

  /** What the session changed in each workspace (attributed events, in order), and what no session claimed meanwhile. */
  changes(selector: SessionSelector): Promise<ChangesResult> {
    return this.request('changes', selector);
  }

  /**
   * Takes a checkpoint of a workspace directory (absolute) and resolves once it is published:
   * its manifest and every object read back and re-hashed (docs/guide/checkpoints.md "Checkpoints"). Errors:
   * INVALID_ARGUMENT (no such directory, holds the state dir), CHECKPOINT_FAILED (details.stage).
   */
  checkpoint(params: { workspace: string; task?: string }): Promise<CheckpointResult> {
    return this.request('checkpoint', params);
  }

  ps(all = false): Promise<{ sessions: SessionSummary[] }> {
    return this.request('ps', { all });
  }

  status(): Promise<StatusResult> {
    return this.request('status', {});
  }

  /** The supervisor's clock now (`{ now_ms }`, ms since the Unix epoch): one round trip, what the keepalive sends. */
  ping(): Promise<ResultOf<'ping'>> {
    return this.request('ping', {});
  }

  /** Applies the retention policy now (sbx gc). */
  gc(): Promise<GcResult> {
    return this.request('gc', {});
  }

  /** Stops admission of the whole sandbox, every task, for good (durable; sbx seal --all): new keys get ADMISSION_SEALED. */
  sealAll(): Promise<SealResult> {
    return this.request('seal', {}) as Promise<SealResult>;
  }

  /** Stops admission of new keys in one task for good (durable); other tasks are unaffected, retries of the task's keys still answer. */
  sealTask(task: string): Promise<TaskSealResult> {
    return this.request('seal', { task }) as Promise<TaskSealResult>;
  }

  /**
   * `close` of the whole sandbox (sbx close --all): seals every task for good, settles every
   * session (terminating the rest after timeout_ms), closes each task, returns the signed close
   * receipt with each task's verdict; `complete: false` is not final (close again).
   */
  closeSupervisor(params: { timeout_ms?: number; workspaces?: string[] } = {}): Promise<CloseReceipt> {
    return this.request('close', params) as Promise<CloseReceipt>;
  }

  /**
   * `close --task` (docs/guide/tasks.md "Tasks: complete(task)"): seals the task, settles its sessions
   * (terminating the rest after timeout_ms, cause close), checkpoints each workspace and
   * returns the signed task receipt: `complete`, its `conditions`, and the `obligations`
   * that name what is missing. A complete receipt is final (returned unchanged). The
   * workspaces default to every watched one. Errors: TASK_CONFLICT (other workspaces than
   * this task's close named), INVALID_ARGUMENT.
   */
  closeTask(params: { task: string; timeout_ms?: number; workspaces?: string[] }): Promise<TaskReceipt> {
    return this.request('close', params) as Promise<TaskReceipt>;
  }

  /** Starts streaming one stream from a cursor; events go to handlers until onEnd. Refused as too many in flight: sent again, as request(). */
  subscribe(params: SubscribeParams, handlers: SubscriptionHandlers): Promise<SubscribeResult> {
    return this.resendRefusedInFlight(() => this.subscribeOnce(params, handlers));
  }

  private subscribeOnce(params: SubscribeParams, handlers: SubscriptionHandlers): Promise<SubscribeResult> {
    if (this.closedError) return Promise.reject(this.closedError);
    const id = this.nextId++;
    this.markBusy();
    this.subscriptions.set(id, handlers);
    return new Promise<SubscribeResult>((resolve, reject) => {
      this.pending.set(id, {
        resolve: resolve as (v: unknown) => void,
        reject: (err) => {
          this.subscriptions.delete(id);
          reject(err);
        },
      });
      this.transport.send(encodeFrame({ id, method: 'subscribe', params: withoutUndefined(params) } satisfies RequestFrame));
    });
  }

  /**
   * The per-read index of one stream (docs/reference/state-dir.md "index.bin") from cursor `from`
   * (default 0): up to `limit` records (default 4096, at most 65536) `{cursor, length,
   * at_us}` (arrival in µs since the Unix epoch), the first holding byte `from`; `next` to
   * ask from next, `more` when the limit cut the answer, `cursor` the stored bytes, `final`
   * once the index will never grow, `through_us` (every read arrived by then is among these
   * records: what a merge of streams may rely on). With `follow`, an answer with no record
   * waits until the stream stores a record or becomes final. The bytes themselves come from
   * subscribe/readOutput. Errors: SESSION_NOT_FOUND, INVALID_ARGUMENT (bad field, no such
   * stream), CURSOR_OUT_OF_RANGE (`from` past the stored end without follow;
   * details.cursor), OUTPUT_REMOVED.
   */
  readIndex(params: ReadIndexParams): Promise<ReadIndexResult> {
    return this.request('read_index', params);
  }

  /** Reads [from, end) of a stream as it is now (no follow) into one Buffer. */
  async read(selector: SessionSelector, stream: StreamName, from = 0): Promise<Buffer> {
    const parts: Buffer[] = [];
    await new Promise<void>((resolve, reject) => {
      this.subscribe(
        { ...selector, stream, from, follow: false },
        {
          onOutput: (ev) => parts.push(Buffer.from(ev.data.buffer, ev.data.byteOffset, ev.data.byteLength)),
          onEnd: () => resolve(),
          onError: reject,
        },
      ).catch(reject);
      this.onClose(reject);
    });
    return Buffer.concat(parts);
  }

  /** Stops reading from the transport (backpressure towards the supervisor) / resumes; the silence deadline does not run while paused. */
  pause(): void {
    this.transport.pause();
  }
  resume(): void {
    this.transport.resume();
  }

  /** Called once when the connection is gone, with why. */
  onClose(listener: (err: Error) => void): void {
    if (this.closedError) listener(this.closedError);
    else this.closeListeners.push(listener);
  }

  /** Closes the connection (a command transport: ended, killed by pid and reaped). */
  close(): void {
    this.transport.close();
  }

  /** Ends the connection at once; pending calls fail with err. */
  private destroy(err: Error): void {
    this.fail(err);
    this.transport.destroy(err);
  }

  /** A call starts: when none was pending, the silence clock starts now. */
  private markBusy(): void {
    if (this.pending.size === 0 && this.subscriptions.size === 0) this.keepalive.activeAt = performance.now();
  }

  /**
   * Keepalive, every tickMs: while calls are pending and reading is not paused, a ping after
   * keepaliveMs without a byte, and the transport declared dead (ETIMEDOUT) after silenceMs.
   * A tick that comes late (this process's event loop was held up) checks nothing: bytes
   * may be waiting that the loop has not read yet.
   */
  private tick(): void {
    const k = this.keepalive;
    const now = performance.now();
    const late = now - k.lastTickAt > 3 * k.tickMs + 50;
    k.lastTickAt = now;
    const seen = this.transport.receivedChunks;
    if (late || seen !== k.seen || this.transport.paused || (this.pending.size === 0 && this.subscriptions.size === 0)) {
      k.seen = seen;
      k.activeAt = now;
      return;
    }
    const silentMs = now - k.activeAt;
    if (silentMs >= this.silenceMs) {
      this.destroy(
        transportError(
          'ETIMEDOUT',
          `no byte from the supervisor at ${this.transport.endpoint} for ${Math.round(silentMs)} ms while calls were pending (keepalive pings unanswered): the transport is taken as dead`,
        ),
      );
    } else if (silentMs >= this.keepaliveMs && now - k.pingAt >= this.keepaliveMs) {
      k.pingAt = now;
      const id = this.nextId++;
      this.pings.add(id);
      this.transport.send(encodeFrame({ id, method: 'ping', params: {} } satisfies RequestFrame));
    }
  }

  private route(frame: ResponseFrame): void {
    if (frame.event) {
      const handlers = this.subscriptions.get(frame.id);
      if (!handlers) return;
      if (frame.event === 'output') handlers.onOutput(frame as unknown as OutputEvent);
      else if (frame.event === 'end') {
        this.subscriptions.delete(frame.id);
        handlers.onEnd(frame as unknown as EndEvent);
      }
      return;
    }
    // id 0 is never a request of ours: it is the server refusing the whole connection (limits,
    // UNAUTHORIZED, a bad frame) just before it closes; every request waiting gets that error.
    if (frame.id === 0 && frame.error) {
      this.fail(SupervisorError.fromWire(frame.error));
      return;
    }
    const pending = this.pending.get(frame.id);
    if (!pending) {
      if (this.pings.delete(frame.id)) return;
      // An error after a subscription's result: it is over, with that error.
      const handlers = frame.error ? this.subscriptions.get(frame.id) : undefined;
      if (handlers) {
        this.subscriptions.delete(frame.id);
        handlers.onError?.(SupervisorError.fromWire(frame.error!));
      }
      return;
    }
    this.pending.delete(frame.id);
    if (frame.error) pending.reject(SupervisorError.fromWire(frame.error));
    else pending.resolve(frame.result);
  }

  private fail(err: Error): void {
    if (this.closedError) return;
    this.closedError = err;
    clearInterval(this.keepalive.timer);
    for (const p of this.pending.values()) p.reject(err);
    this.pending.clear();
    this.subscriptions.clear();
    for (const l of this.closeListeners.splice(0)) l(err);
  }
}

/** What SupervisorClient.run takes besides the launch params. */
export interface RunOptions {
  /** Bytes written to stdin, then EOF (absent: /dev/null). */
  stdin?: Buffer;
  /** Pass this process's environment as `inherit_env` (the launch's `env` still wins), as `sbx run` does. */
  inheritEnv?: boolean;
  /** Each new piece of stdout (with a pty: the terminal's output) as it arrives, in order; stdout is then not kept (result.stdout null). */
  onStdout?: (data: Buffer) => void;
  /** Each new piece of stderr as it arrives, in order; stderr is then not kept (result.stderr null). */
  onStderr?: (data: Buffer) => void;
}

/** What SupervisorClient.run resolves with once the receipt is durable. */
export interface RunResult {
  session: LaunchResult;
  receipt: Receipt;
  /** Every stored byte of stdout (with a pty: of the terminal's output), or null when onStdout took it. */
  stdout: Buffer | null;
  /** Every stored byte of stderr, or null when onStderr took it. */
  stderr: Buffer | null;
}

function definedEnv(env: NodeJS.ProcessEnv): Record<string, string> {
  return Object.fromEntries(Object.entries(env).filter((e): e is [string, string] => typeof e[1] === 'string'));
}

/** Drops undefined fields: an absent option is absent on the wire, not nil. */
function withoutUndefined(params: object): Record<string, unknown> {
  return Object.fromEntries(Object.entries(params).filter(([, v]) => v !== undefined));
}

/** Default time a ReconnectingClient keeps trying to reach a supervisor that went away. */
export const DEFAULT_RECONNECT_MS = 60_000;

export interface ReconnectOptions extends ConnectOptions {
  /** How long to keep trying after a drop, in ms (default 60 s). */
  reconnectMs?: number;
  /** Called when an attempt to (re)connect fails and it waits to try again, with the errno code (e.g. ECONNREFUSED): a client can say why it waits. */
  onReconnecting?: (code: string) => void;
}

/**
 * A connection that comes back: run(fn) calls fn with a connected client and, when the
 * connection drops (supervisor restart, EOF), reconnects and calls fn again, for up to
 * reconnectMs. SupervisorErrors (answers, not transport failures) are thrown as they are.
 */
export class ReconnectingClient {
  private client: SupervisorClient | null;

  constructor(
    private readonly options: ReconnectOptions = {},
    first: SupervisorClient | null = null,
  ) {
    this.client = first;
  }

  /** The connected client now, if any (e.g. to send a signal without waiting). */
  get current(): SupervisorClient | null {
    return this.client;
  }

  /**
   * A connected client, reconnecting for up to reconnectMs. Calls made while a connect is
   * under way share it: one connection, never one per caller (a second one was left open,
   * and kept sbx from exiting).
   */
  get(): Promise<SupervisorClient> {
    if (this.client) return Promise.resolve(this.client);
    this.connecting ??= this.connectLoop().finally(() => (this.connecting = null));
    return this.connecting;
  }

  private connecting: Promise<SupervisorClient> | null = null;

  private async connectLoop(): Promise<SupervisorClient> {
    const giveUpAt = performance.now() + (this.options.reconnectMs ?? DEFAULT_RECONNECT_MS);
    // A socket is tried every 200 ms; a URL or a command (each try a TCP handshake or a
    // process: ssh, docker exec) from 200 ms doubling to 2 s.
    const growing = resolveEndpoint(this.options).kind !== 'socket';
    let delayMs = 200;
    /** Failed attempts by code, for the message that gives up. */
    const failures = new Map<string, number>();
    while (!this.client) {
      try {
        this.client = await SupervisorClient.connect(this.options);
      } catch (err) {
        // A refusal that will not change (UNAUTHORIZED: a wrong token; INVALID_ARGUMENT: bad options) ends it now.
        if (err instanceof SupervisorError && !err.retryable) throw err;
        const code = errnoCode(err) ?? (err as Error).message;
        failures.set(code, (failures.get(code) ?? 0) + 1);
        this.options.onReconnecting?.(code);
        if (performance.now() > giveUpAt) {
          throw new Error(
            `lost the supervisor and it did not come back within ${Math.round((this.options.reconnectMs ?? DEFAULT_RECONNECT_MS) / 1000)} s ` +
              `(${code}; ${[...failures.values()].reduce((a, b) => a + b, 0)} attempts failed: ${[...failures].map(([c, n]) => `${c} ${n}`).join(', ')}; the last: ${(err as Error).message})`,
          );
        }
        await new Promise((r) => setTimeout(r, delayMs));
        if (growing) delayMs = Math.min(delayMs * 2, 2000);
      }
    }
    return this.client;
  }

  /** Runs fn on a live connection, again on a new one after each drop. */
  async run<T>(fn: (client: SupervisorClient) => Promise<T>): Promise<T> {
    for (;;) {
      const client = await this.get();
      try {
        return await fn(client);
      } catch (err) {
        // Answers, and a keyless launch that may have arrived (LaunchUnconfirmedError), are not retried.
        if (err instanceof SupervisorError || (err as { resend?: boolean }).resend === false) throw err;
        this.drop();
      }
    }
  }

  /** Closes the connection (a later get() makes a new one). */
  drop(): void {
    this.client?.close();
    this.client = null;
  }
}

export interface OutputChunk {
  stream: StreamName;
  /** Cursor of data[0]. */
  cursor: number;
  data: Buffer;
}

export interface ReadOutputOptions extends ReconnectOptions {
  selector: SessionSelector;
  /** One stream, or 'all': stdout and stderr merged in arrival order, as `sbx logs --stream all` (from must be 0). */
  stream: StreamName | 'all';
  /** First cursor (default 0). */
  from?: number;
  /** Keep reading until the stream is final (default: stop at the bytes stored now). */
  follow?: boolean;
}

/**
 * The bytes of one stream from a cursor, as an async iterator. Reading is pulled: while the
 * consumer does not take chunks the socket is paused, so the supervisor holds off, never
 * buffering without bound. A dropped connection is re-made and the stream resumed from the
 * next byte not yet yielded: no gap and no duplicate.
 *
 *   for await (const { cursor, data } of readOutput({ selector: { session_id }, stream: 'stdout', follow: true })) ...
 */
export async function* readOutput(options: ReadOutputOptions): AsyncGenerator<OutputChunk> {
  if (options.stream === 'all') {
    yield* readMerged(options);
    return;
  }
  const stream = options.stream;
  const conn = new ReconnectingClient(options);
  let cursor = options.from ?? 0;
  const queue: OutputChunk[] = [];
  let done = false;
  let failure = null as Error | null;
  let wake = null as (() => void) | null;
  const notify = () => {
    wake?.();
    wake = null;
  };
  let paused = null as SupervisorClient | null;
  try {
    for (;;) {
      const client = await conn.get();
      done = false;
      failure = null;
      let expected = cursor; // the queue is empty whenever we (re)subscribe
      client
        .subscribe(
          { ...options.selector, stream, from: expected, follow: options.follow ?? false },
          {
            onOutput: (ev) => {
              if (ev.cursor !== expected) return;
              const data = Buffer.from(ev.data.buffer, ev.data.byteOffset, ev.data.byteLength);
              queue.push({ stream, cursor: ev.cursor, data });
              expected += data.length;
              if (queue.length >= 16) {
                client.pause();
                paused = client;
              }
              notify();
            },
            onEnd: () => {
              done = true;
              notify();
            },
            onError: (err) => {
              failure = err;
              notify();
            },
          },
        )
        .catch((err: Error) => {
          failure = err;
          notify();
        });
      client.onClose((err) => {
        failure ??= err;
        notify();
      });
      for (;;) {
        const chunk = queue.shift();
        if (chunk) {
          if (paused && queue.length < 4) {
            paused.resume();
            paused = null;
          }
          cursor = chunk.cursor + chunk.data.length;
          yield chunk;
          continue;
        }
        if (done) return;
        if (failure) break;
        await new Promise<void>((r) => (wake = r));
      }
      const why = failure as Error | null; // set by the callbacks above
      if (why instanceof SupervisorError) throw why;
      conn.drop();
    }
  } finally {
    conn.drop();
  }
}

/**
 * stdout and stderr merged in arrival order: the merge of `sbx logs --stream all` (ipc/merge.ts
 * mergeStreams: read_index of each stream, a read given once the other stream is known to hold
 * no earlier one; ties stdout first), each piece a chunk of its own stream at its cursor.
 * Pulled: mergeStreams waits while 16 pieces are not taken. Stopping early aborts the merge.
 */
async function* readMerged(options: ReadOutputOptions): AsyncGenerator<OutputChunk> {
  if ((options.from ?? 0) !== 0)
    throw new SupervisorError('INVALID_ARGUMENT', "readOutput with stream 'all' starts at cursor 0 (from is a cursor of one stream)");
  // Imported when used: merge.ts imports this module (readOutput for the bytes).
  const { mergeStreams } = await import('./merge.js');
  const queue: OutputChunk[] = [];
  let done = false;
  let failure = null as Error | null;
  let wake = null as (() => void) | null;
  let drained = null as (() => void) | null;
  const notify = () => {
    wake?.();
    wake = null;
  };
  const abort = new AbortController();
  const { selector, follow, from: _from, stream: _stream, ...endpoint } = options;
  const merge = mergeStreams(
    { ...endpoint, selector, streams: ['stdout', 'stderr'], follow: follow ?? false, noRecordAtUs: 0, signal: abort.signal },
    {
      write: async (p) => {
        if (abort.signal.aborted) throw new Error('readOutput: the reader stopped');
        queue.push({ stream: p.stream, cursor: p.cursor, data: p.data });
        notify();
        if (queue.length >= 16) await new Promise<void>((r) => (drained = r));
      },
      idle: async () => {},
      end: async () => {},
    },
  ).then(
    () => {
      done = true;
      notify();
    },
    (err: Error) => {
      failure = err;
      notify();
    },
  );
  try {
    for (;;) {
      const chunk = queue.shift();
      if (chunk) {
        if (queue.length < 4) {
          drained?.();
          drained = null;
        }
        yield chunk;
        continue;
      }
      if (failure) throw failure;
      if (done) return;
      await new Promise<void>((r) => (wake = r));
    }
  } finally {
    abort.abort();
    drained?.();
    await merge;
  }
}
