// read_index's follow long poll against a stand-in session and a real Connection over a
// stand-in socket: polls at once (up to ipc.maxInFlight) give no MaxListenersExceededWarning,
// and after 1000 polls on one connection no listener is left on the socket, the connection
// or the session.
import { EventEmitter } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Socket } from 'node:net';
import { afterAll, describe, expect, it } from 'vitest';
import { Connection, type FrameLimits } from '../../../../../supervisor/server/connection.js';
import { readIndex } from '../../../../../supervisor/server/handlers/read-index.js';
import type { RequestContext } from '../../../../../supervisor/server/handler.js';
import type { ReadRecord } from '../../../../../supervisor/store/chunks.js';

const dir = mkdtempSync(join(tmpdir(), 'sbx-read-index-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A live stdout with no index.bin: every record is in memory (pendingIndex). */
class FakeSession extends EventEmitter {
  readonly id = 's-fake';
  readonly outputRemoved = false;
  records: ReadRecord[] = [];
  stored = 0;
  constructor() {
    super();
    this.setMaxListeners(0); // as Session (a subscription or poll each)
  }
  hasStream = (s: string) => s === 'stdout';
  cursor = () => this.stored;
  streamFinal = () => false;
  streamDir = () => join(dir, 'stdout');
  pendingIndex = (_s: string, from: number, limit: number) => ({
    records: this.records.filter((r) => r.cursor + r.length > from).slice(0, limit),
    unstoredAtUs: null,
  });
  /** One more read of n bytes, stored and told. */
  read(n: number): void {
    this.records.push({ cursor: this.stored, length: n, arrivalUs: 1_700_000_000_000_000 + this.records.length });
    this.stored += n;
    this.emit('output', 'stdout');
  }
}

function setup() {
  const session = new FakeSession();
  const socket = new EventEmitter() as unknown as Socket;
  const conn = new Connection(
    socket,
    { maxFrameBytes: 1 << 20, frameTimeoutMs: 0, pending: { heldBytes: 0, maxBytes: 1 << 30 }, onFrameTimeout: () => {} } satisfies FrameLimits,
    { pid: 1, uid: 0, gid: 0 },
  );
  const supervisor = { find: () => session, log: { warn: () => {} } };
  const ctx = { supervisor, conn, id: 1, socketPath: '' } as unknown as RequestContext;
  const poll = () =>
    readIndex(ctx, { session_id: session.id, stream: 'stdout', from: session.stored, follow: true } as never) as Promise<{ records: unknown[] }>;
  const counts = () => ({
    socketClose: (socket as unknown as EventEmitter).listenerCount('close'),
    output: session.listenerCount('output'),
    conn: conn.closeWaiterCount,
  });
  return { session, socket: socket as unknown as EventEmitter, poll, counts };
}

describe('read_index follow polls', () => {
  it('64 at once on one connection: no listener warning; 1000 in turn: every listener gone after each', async () => {
    const warnings: Error[] = [];
    const onWarning = (w: Error) => warnings.push(w);
    process.on('warning', onWarning);
    try {
      const { session, poll, counts } = setup();
      const base = counts();
      expect(base.conn).toBe(0);
      const polls = Array.from({ length: 64 }, poll);
      await new Promise((r) => setImmediate(r));
      expect(counts().socketClose).toBe(base.socketClose); // none on the socket per poll
      session.read(10);
      for (const r of await Promise.all(polls)) expect(r.records).toHaveLength(1);
      expect(counts()).toEqual(base);
      for (let i = 0; i < 1000; i++) {
        const p = poll();
        await new Promise((r) => setImmediate(r));
        session.read(1);
        expect((await p).records).toHaveLength(1);
      }
      expect(counts()).toEqual(base);
      await new Promise((r) => setTimeout(r, 10)); // warnings are emitted on a later tick
      expect(warnings.filter((w) => w.name === 'MaxListenersExceededWarning')).toEqual([]);
    } finally {
      process.off('warning', onWarning);
    }
  });

  it('the connection closing ends the polls waiting, and leaves nothing behind', async () => {
    const { socket, poll, counts } = setup();
    const base = counts();
    const polls = Array.from({ length: 5 }, poll);
    await new Promise((r) => setImmediate(r));
    expect(counts().output).toBe(base.output + 5);
    socket.emit('close');
    for (const r of await Promise.all(polls)) expect(r.records).toHaveLength(0);
    expect(counts()).toEqual({ ...base, conn: 0 });
  });
});
