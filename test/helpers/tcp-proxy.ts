// A TCP proxy on loopback that a test puts between a client and a listener, to break the link
// on purpose: cut() closes both sides of one connection (as a dropped link: the peer sees EOF
// or a reset), stall() stops forwarding either way while both stay open (a black hole: pings go
// unanswered, only a deadline can tell), holdReplies() stops only what the listener sends (an
// answer lost on its way back). close() ends every connection and the listener.
import { createServer, connect as netConnect, type Server, type Socket } from 'node:net';

export interface ProxiedConnection {
  /** 1, 2, ...: in the order accepted. */
  id: number;
  client: Socket;
  upstream: Socket;
  stalled: boolean;
  closed: boolean;
}

export class TcpProxy {
  private server: Server | null = null;
  private nextId = 1;
  readonly connections = new Set<ProxiedConnection>();
  /** Connections accepted in all (a reconnect is one more). */
  accepted = 0;
  port = 0;

  constructor(
    private readonly targetPort: number,
    private readonly targetHost = '127.0.0.1',
  ) {}

  /** Listens on 127.0.0.1 (an ephemeral port: this.port) and resolves once it does. */
  async start(): Promise<this> {
    this.server = createServer((client) => this.accept(client));
    await new Promise<void>((resolve, reject) => {
      this.server!.once('error', reject);
      this.server!.listen(0, '127.0.0.1', () => resolve());
    });
    this.port = (this.server.address() as { port: number }).port;
    return this;
  }

  private accept(client: Socket): void {
    this.accepted++;
    const upstream = netConnect(this.targetPort, this.targetHost);
    const c: ProxiedConnection = { id: this.nextId++, client, upstream, stalled: false, closed: false };
    this.connections.add(c);
    client.pipe(upstream);
    upstream.pipe(client);
    const end = () => {
      if (c.closed) return;
      c.closed = true;
      this.connections.delete(c);
      client.destroy();
      upstream.destroy();
    };
    for (const s of [client, upstream]) {
      s.on('error', end);
      s.on('close', end);
    }
  }

  /** The connections open and forwarding now. */
  live(): ProxiedConnection[] {
    return [...this.connections].filter((c) => !c.closed && !c.stalled);
  }

  /** Closes both sides of c at once (the client sees its link drop). */
  cut(c: ProxiedConnection): void {
    c.closed = true;
    this.connections.delete(c);
    c.client.destroy();
    c.upstream.destroy();
  }

  /**
   * Stops forwarding c both ways; both sides stay open and nothing more passes (what arrives is
   * read and dropped, so a side that gives up and closes is seen, and closes the other).
   */
  stall(c: ProxiedConnection): void {
    c.stalled = true;
    c.client.unpipe(c.upstream);
    c.upstream.unpipe(c.client);
    const drop = () => {};
    c.client.on('data', drop).resume(); // unpipe paused them: read on, or a close would go unseen
    c.upstream.on('data', drop).resume();
  }

  /**
   * Stops forwarding what the listener sends on c (read and dropped) while what the client sends
   * still passes: a request arrives and its answer is lost on the way back, until c is cut or
   * stalled. c stays live() (a drop still finds it).
   */
  holdReplies(c: ProxiedConnection): void {
    c.upstream.unpipe(c.client);
    c.upstream.on('data', () => {}).resume();
  }

  /** Ends every connection and stops listening. */
  async close(): Promise<void> {
    for (const c of [...this.connections]) this.cut(c);
    const s = this.server;
    this.server = null;
    if (s) await new Promise<void>((resolve) => s.close(() => resolve()));
  }
}

/** A TCP port free on 127.0.0.1 now (bound and released: a listener started right after takes it). */
export async function freeLoopbackPort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((resolve, reject) => {
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => resolve());
  });
  const port = (s.address() as { port: number }).port;
  await new Promise<void>((resolve) => s.close(() => resolve()));
  return port;
}
