// The client library: one connection to the supervisor's Unix socket, the hello, requests
// with ids, and output subscriptions whose events are routed to handlers. Used by sbx and by
// harnesses. Owns no process and no session: closing it never touches a command.
import { statSync } from 'node:fs';
import { connect as netConnect, type Socket } from 'node:net';
import { SupervisorError } from './errors.js';
import { encodeFrame, FrameDecoder } from './framing.js';
import type { GcResult, MethodName, ParamsOf, ResultOf, SealResult } from './methods.js';
import { defaultSocketPath } from './paths.js';
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

export interface ConnectOptions {
  socketPath?: string;
  clientName?: string;
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
 * connect(2) to a path that is there but no socket (a regular file, a directory) fails
 * ECONNREFUSED, as for a socket nobody listens on, which a client would wait for: it is
 * ENOTSOCK here (never retried), naming what is there. null when the path is a socket, or gone.
 */
function notASocket(err: NodeJS.ErrnoException, socketPath: string): NodeJS.ErrnoException | null {
  if (err.code !== 'ECONNREFUSED') return null;
  let kind: string;
  try {
    const st = statSync(socketPath);
    if (st.isSocket()) return null;
    kind = st.isDirectory() ? 'a directory' : st.isFile() ? 'a regular file' : 'something else';
  } catch {
    return null;
  }
  return Object.assign(new Error(`connect ENOTSOCK ${socketPath}: ${kind}, not a socket`), { code: 'ENOTSOCK', errno: -88, syscall: 'connect', address: socketPath, found: kind });
}

/** A connection to the supervisor; every method rejects with SupervisorError or a socket Error. */
export class SupervisorClient {
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  private readonly subscriptions = new Map<number, SubscriptionHandlers>();
  private readonly decoder = new FrameDecoder();
  private closedError: Error | null = null;
  private readonly closeListeners: ((err: Error) => void)[] = [];
  hello!: HelloResult;

  private constructor(private readonly socket: Socket) {
    socket.on('data', (data: Buffer) => this.onData(data));
    socket.on('error', (err) => this.fail(err));
    socket.on('close', () => this.fail(Object.assign(new Error('connection to the supervisor closed'), { code: 'ECONNRESET' })));
  }

  /** Connects to socketPath (default: SPEC's path) and runs the hello; rejects on ENOENT/ECONNREFUSED. */
  static async connect(options: ConnectOptions = {}): Promise<SupervisorClient> {
    const socketPath = options.socketPath ?? defaultSocketPath();
    const socket = await new Promise<Socket>((resolve, reject) => {
      const s = netConnect(socketPath);
      s.once('connect', () => {
        s.off('error', reject);
        resolve(s);
      });
      s.once('error', (err: NodeJS.ErrnoException) => reject(notASocket(err, socketPath) ?? err));
    });
    const client = new SupervisorClient(socket);
    client.hello = await client.request('hello', {
      versions: [...PROTOCOL_VERSIONS],
      client: options.clientName ?? 'sandbox-supervisor-client',
    });
    return client;
  }

  /** Sends one request and resolves with its result (typed by the method table, ipc/methods.ts). */
  request<M extends MethodName>(method: M, params: ParamsOf<M>): Promise<ResultOf<M>> {
    if (this.closedError) return Promise.reject(this.closedError);
    const id = this.nextId++;
    return new Promise<ResultOf<M>>((resolve, reject) => {
      this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject });
      this.socket.write(encodeFrame({ id, method, params: withoutUndefined(params) } satisfies RequestFrame));
    });
  }

  launch(params: LaunchParams): Promise<LaunchResult> {
    return this.request('launch', params);
  }

  /** Resolves with the receipt once the session has ended (durably). */
  wait(selector: SessionSelector): Promise<Receipt> {
    return this.request('wait', selector);
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
   * its manifest and every object read back and re-hashed (README "Checkpoints"). Errors:
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
   * `close --task` (README "Tasks: complete(task)"): seals the task, settles its sessions
   * (terminating the rest after timeout_ms, cause close), checkpoints each workspace and
   * returns the signed task receipt: `complete`, its `conditions`, and the `obligations`
   * that name what is missing. A complete receipt is final (returned unchanged). The
   * workspaces default to every watched one. Errors: TASK_CONFLICT (other workspaces than
   * this task's close named), INVALID_ARGUMENT.
   */
  closeTask(params: { task: string; timeout_ms?: number; workspaces?: string[] }): Promise<TaskReceipt> {
    return this.request('close', params) as Promise<TaskReceipt>;
  }

  /** Starts streaming one stream from a cursor; events go to handlers until onEnd. */
  subscribe(params: SubscribeParams, handlers: SubscriptionHandlers): Promise<SubscribeResult> {
    if (this.closedError) return Promise.reject(this.closedError);
    const id = this.nextId++;
    this.subscriptions.set(id, handlers);
    return new Promise<SubscribeResult>((resolve, reject) => {
      this.pending.set(id, {
        resolve: resolve as (v: unknown) => void,
        reject: (err) => {
          this.subscriptions.delete(id);
          reject(err);
        },
      });
      this.socket.write(encodeFrame({ id, method: 'subscribe', params: withoutUndefined(params) } satisfies RequestFrame));
    });
  }

  /**
   * The per-read index of one stream (docs/STATE.md "index.bin") from cursor `from`
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
      this.subscribe({ ...selector, stream, from, follow: false }, {
        onOutput: (ev) => parts.push(Buffer.from(ev.data.buffer, ev.data.byteOffset, ev.data.byteLength)),
        onEnd: () => resolve(),
        onError: reject,
      }).catch(reject);
      this.onClose(reject);
    });
    return Buffer.concat(parts);
  }

  /** Stops reading from the socket (backpressure towards the supervisor) / resumes. */
  pause(): void {
    this.socket.pause();
  }
  resume(): void {
    this.socket.resume();
  }

  /** Called once when the connection is gone, with why. */
  onClose(listener: (err: Error) => void): void {
    if (this.closedError) listener(this.closedError);
    else this.closeListeners.push(listener);
  }

  close(): void {
    this.socket.end();
    this.socket.destroy();
  }

  private onData(data: Buffer): void {
    try {
      this.decoder.push(data, (raw) => this.route(raw as ResponseFrame));
    } catch (err) {
      this.fail(err as Error);
      this.socket.destroy();
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
    for (const p of this.pending.values()) p.reject(err);
    this.pending.clear();
    this.subscriptions.clear();
    for (const l of this.closeListeners.splice(0)) l(err);
  }
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

  constructor(private readonly options: ReconnectOptions = {}, first: SupervisorClient | null = null) {
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
    while (!this.client) {
      try {
        this.client = await SupervisorClient.connect(this.options);
      } catch (err) {
        this.options.onReconnecting?.((err as NodeJS.ErrnoException).code ?? (err as Error).message);
        if (performance.now() > giveUpAt) {
          const reason = (err as NodeJS.ErrnoException).code ?? (err as Error).message;
          throw new Error(`lost the supervisor and it did not come back within ${Math.round((this.options.reconnectMs ?? DEFAULT_RECONNECT_MS) / 1000)} s (${reason})`);
        }
        await new Promise((r) => setTimeout(r, 200));
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
        if (err instanceof SupervisorError) throw err;
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
  stream: StreamName;
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
        .subscribe({ ...options.selector, stream: options.stream, from: expected, follow: options.follow ?? false }, {
          onOutput: (ev) => {
            if (ev.cursor !== expected) return;
            const data = Buffer.from(ev.data.buffer, ev.data.byteOffset, ev.data.byteLength);
            queue.push({ stream: options.stream, cursor: ev.cursor, data });
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
        })
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
