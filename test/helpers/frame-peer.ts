// What the tests' raw protocol peers share (ws-peer.ts over WebSocket, bridge.test.ts's
// BridgePeer over a bridge child's stdin/stdout): request ids, answers routed to their request
// (a wire error rejects with its SupervisorError), subscription events to their handler.
// Subclasses own the bytes: how a frame is sent, and feeding decoded answers to onAnswer.
import { SupervisorError, type WireError } from '../../ipc/errors.js';
import { encodeFrame } from '../../ipc/framing.js';

/** One decoded frame from the supervisor: an answer (result or error) or an event. */
export type Answer = { id: number; result?: unknown; error?: WireError; event?: string; [k: string]: unknown };

export abstract class FramePeer {
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  private readonly eventHandlers = new Map<number, (e: Answer) => void>();

  /** Sends one whole frame as encodeFrame made it ([u32 BE length][msgpack body]). */
  protected abstract sendFrame(frame: Buffer): void;

  /** Routes a decoded frame: an event to its request's handler, an answer to its request. */
  protected onAnswer(a: Answer): void {
    if (a.event !== undefined) return void this.eventHandlers.get(a.id)?.(a);
    const p = this.pending.get(a.id);
    if (!p) return;
    this.pending.delete(a.id);
    if (a.error) p.reject(SupervisorError.fromWire(a.error));
    else p.resolve(a.result);
  }

  /** Rejects every request still waiting (the transport closed). */
  protected failPending(err: Error): void {
    for (const p of this.pending.values()) p.reject(err);
    this.pending.clear();
  }

  /** Sends {id, method, params}; resolves with its result, rejects with its SupervisorError; onEvent gets its events. */
  request<T = Record<string, unknown>>(method: string, params: Record<string, unknown> = {}, onEvent?: (e: Answer) => void): Promise<T> {
    const id = this.nextId++;
    if (onEvent) this.eventHandlers.set(id, onEvent);
    return new Promise<T>((resolve, reject) => {
      this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject });
      this.sendFrame(encodeFrame({ id, method, params }));
    });
  }
}
