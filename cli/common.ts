// What every sbx subcommand shares: the exit status of a failure (125, as docker run and
// timeout(1)), error text a person can act on, one-exchange connections, the selector and
// option parsers, and output copied with backpressure. Imports ipc/ only (types only from
// protocol.ts: no zod at startup, DESIGN.md 17).
import { constants as osConstants } from 'node:os';
import { InvalidArgumentError } from 'commander';
import { readOutput, SupervisorClient } from '../ipc/client.js';
import { parseDurationMs } from '../ipc/duration.js';
import { isSupervisorError } from '../ipc/errors.js';
import type { SessionSelector, StreamName } from '../ipc/protocol.js';

export const FAILURE = 125;

export interface GlobalOptions {
  socket?: string;
  json?: boolean;
}

export function signalNumber(name: string): number {
  return osConstants.signals[name as keyof typeof osConstants.signals] ?? 0;
}

export function fail(message: string, status = FAILURE): never {
  process.stderr.write(`sbx: ${message}\n`);
  process.exit(status);
}

export function describe(err: unknown): string {
  if (isSupervisorError(err, 'ADMISSION_DENIED')) return `${err.code}: ${err.message} (sbx status says why)`;
  if (isSupervisorError(err)) return `${err.code}: ${err.message}`;
  const e = err as NodeJS.ErrnoException;
  if (e.code === 'ENOENT' || e.code === 'ECONNREFUSED') {
    const at = (e as { address?: string }).address;
    return `cannot reach the supervisor${at ? ` at ${at}` : ''} (${e.code}); is it running? (npm start, or the systemd unit; --socket or SBX_SOCKET name another)`;
  }
  return e.message ?? String(err);
}

export async function connect(g: GlobalOptions): Promise<SupervisorClient> {
  try {
    return await SupervisorClient.connect({ socketPath: g.socket, clientName: 'sbx' });
  } catch (err) {
    fail(describe(err));
  }
}

/** Connects, runs one exchange, closes; any failure is the message and exit 125. */
export async function call<T>(g: GlobalOptions, fn: (client: SupervisorClient) => Promise<T>): Promise<T> {
  const client = await connect(g);
  try {
    return await fn(client);
  } catch (err) {
    fail(describe(err));
  } finally {
    client.close();
  }
}

export function selector(id: string | undefined, key: string | undefined): SessionSelector {
  if (key !== undefined && id !== undefined) fail('give a session ID or --key, not both');
  if (key !== undefined) return { invocation_key: key };
  if (id === undefined) fail('a session ID (or --key K) is required');
  return { session_id: id };
}

/** Option parser for durations; a bad one is INVALID_ARGUMENT, exit 125, before any request. */
export function duration(text: string): number {
  try {
    return parseDurationMs(text);
  } catch (err) {
    fail(`INVALID_ARGUMENT: ${(err as Error).message}`);
  }
}

export function collectEnv(kv: string, acc: Record<string, string>): Record<string, string> {
  const eq = kv.indexOf('=');
  if (eq <= 0) throw new InvalidArgumentError(`--env takes NAME=VALUE, got ${JSON.stringify(kv)}`);
  acc[kv.slice(0, eq)] = kv.slice(eq + 1);
  return acc;
}

/** Copies one stream to a local output, waiting for the output to drain (backpressure). */
export async function pipeOutput(g: GlobalOptions, sel: SessionSelector, stream: StreamName, out: NodeJS.WriteStream, from: number, followToEnd: boolean): Promise<void> {
  for await (const chunk of readOutput({ socketPath: g.socket, clientName: 'sbx', selector: sel, stream, from, follow: followToEnd })) {
    if (!out.write(chunk.data)) await new Promise((r) => out.once('drain', r));
  }
}

export function positiveInt(v: string): number {
  if (!/^\d+$/.test(v) || Number(v) < 1 || Number(v) > 65535) fail(`INVALID_ARGUMENT: expected an integer from 1 to 65535, got ${JSON.stringify(v)}`);
  return Number(v);
}


export const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(bytes < 10 * 2 ** 20 ? 1 : 0)} MiB`;

export function printJson(value: unknown): void {
  process.stdout.write(JSON.stringify(value, null, 2) + '\n');
}

