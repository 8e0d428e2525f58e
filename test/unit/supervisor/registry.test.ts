// The registry apart from the socket (supervisor/supervisor.ts, built by compose.ts, its sessions
// in session-table.ts): a real supervisor in this process, subreaper mode, in a temp state dir.
// Launch by key, the retry answered by the same session, KEY_CONFLICT, the seal, shutdown with
// every session settled, a restart that restores and never reruns, and the table's prefixes.
import { closeSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pino from 'pino';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { SupervisorError } from '../../../ipc/errors.js';
import type { LaunchParams, Receipt } from '../../../ipc/protocol.js';
import { verifySignature } from '../../../core/receipts/signature.js';
import { compose } from '../../../supervisor/compose.js';
import { parseConfig } from '../../../supervisor/config.js';
import { ownChildren } from '../../../supervisor/reaper.js';
import type { Session } from '../../../supervisor/session/session.js';
import { SessionTable } from '../../../supervisor/session-table.js';
import type { Supervisor } from '../../../supervisor/supervisor.js';

const log = pino({ level: 'silent' });
let dir: string;
const running: Supervisor[] = [];

/** A supervisor on dir's state dir, subreaper mode (no cgroup made), no workspace. */
function start(): Supervisor {
  const config = parseConfig({ stateDir: join(dir, 'state'), socketPath: join(dir, 'sock'), cgroup: { mode: 'subreaper' } }, 'test', {});
  const s = compose(config, log);
  running.push(s);
  return s;
}

/** Shuts s down and lets go of what this process holds for it (its hashing threads, the state dir's lock). */
async function stop(s: Supervisor): Promise<void> {
  await s.shutdown();
  await s.ctx.hashPool.close();
  closeSync(s.lock.fd);
  running.splice(running.indexOf(s), 1);
}

const launchOf = (argv: string[], key: string, extra: Partial<LaunchParams> = {}): LaunchParams => ({ argv, cwd: '/', invocation_key: key, ...extra });

async function ended(session: Session | null): Promise<Receipt> {
  const receipt = await session!.ended;
  expect(receipt).not.toBeNull();
  return receipt!;
}

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'registry-'));
});

afterEach(async () => {
  for (const s of [...running]) await stop(s);
  // Nothing of ours left running: every child was reaped.
  expect(ownChildren().filter((pid) => pid !== process.pid)).toEqual([]);
  rmSync(dir, { recursive: true, force: true });
});

describe('the registry', () => {
  it('launches by key; a retry is answered by the same session, a changed command is KEY_CONFLICT naming the field', async () => {
    const s = start();
    expect(s.mode).toBe('subreaper');
    const first = s.launch(launchOf(['/bin/sh', '-c', 'printf registry'], 'k1'));
    expect(first.result).toMatchObject({ invocation_key: 'k1', existing: false });
    const retry = s.launch(launchOf(['/bin/sh', '-c', 'printf registry'], 'k1'));
    expect(retry.result).toMatchObject({ session_id: first.result.session_id, existing: true, command_digest: first.result.command_digest });
    expect(retry.session).toBe(first.session);
    const receipt = await ended(first.session);
    expect({ outcome: receipt.outcome, exit: receipt.exit.code, bytes: receipt.output.stdout?.final_cursor }).toEqual({ outcome: 'exited', exit: 0, bytes: 8 });
    expect(verifySignature(receipt, s.ctx.signer.publicKeyPem)).toEqual([]);

    let conflict: unknown;
    try {
      s.launch(launchOf(['/bin/sh', '-c', 'printf other'], 'k1'));
    } catch (err) {
      conflict = err;
    }
    expect(conflict).toBeInstanceOf(SupervisorError);
    expect((conflict as SupervisorError).code).toBe('KEY_CONFLICT');
    expect((conflict as SupervisorError).details).toMatchObject({ differs: ['argv'] });

    // Found by id, by a unique prefix, by key; an unknown one is SESSION_NOT_FOUND.
    const id = first.result.session_id;
    expect(s.find({ session_id: id })).toBe(first.session);
    expect(s.find({ session_id: id.slice(0, 8) })).toBe(first.session);
    expect(s.find({ invocation_key: 'k1' })).toBe(first.session);
    expect(() => s.find({ invocation_key: 'nope' })).toThrow(expect.objectContaining({ code: 'SESSION_NOT_FOUND' }));
    expect(s.list(false)).toEqual([]);
    expect(s.list(true).map((x) => x.id)).toEqual([id]);
  });

  it('the seal refuses new keys (ADMISSION_SEALED) and still answers a retried one; shutdown settles every session, refuses new keys and still answers a retried one', async () => {
    const s = start();
    const sleeper = s.launch(launchOf(['/bin/sleep', '30'], 'sleeper'));
    expect(s.admissionState()).toBe('open');
    expect(s.seal()).toMatchObject({ already_sealed: false });
    expect(s.admissionState()).toBe('sealed');
    expect(() => s.launch(launchOf(['/bin/true'], 'new-key'))).toThrow(expect.objectContaining({ code: 'ADMISSION_SEALED' }));
    expect(s.launch(launchOf(['/bin/sleep', '30'], 'sleeper')).result).toMatchObject({ session_id: sleeper.result.session_id, existing: true });

    const stopping = s.shutdown();
    expect(s.admissionState()).toBe('stopping');
    expect(() => s.launch(launchOf(['/bin/true'], 'another-key'))).toThrow(expect.objectContaining({ code: 'SHUTTING_DOWN' }));
    // A retry told the session it has (it goes on to wait for it, here or after a restart), never refused.
    expect(s.launch(launchOf(['/bin/sleep', '30'], 'sleeper')).result).toMatchObject({ session_id: sleeper.result.session_id, existing: true });
    await stopping;
    const receipt = await ended(sleeper.session);
    expect({ outcome: receipt.outcome, cause: receipt.termination.cause }).toEqual({ outcome: 'cancelled', cause: 'shutdown' });
  });

  it('a restart restores every session from the state dir, ended, and a retried key is answered by it: nothing runs twice', async () => {
    const first = start();
    const marker = join(dir, 'runs');
    const launched = first.launch(launchOf(['/bin/sh', '-c', `echo ran >> ${marker}; printf once`], 'once'));
    const receipt = await ended(launched.session);
    // A second supervisor on the same state dir is refused while the first holds it.
    expect(() => start()).toThrow(/is in use by another supervisor/);
    await stop(first);

    const again = start();
    await again.reconcile();
    expect(again.admissionState()).toBe('open');
    const retry = again.launch(launchOf(['/bin/sh', '-c', `echo ran >> ${marker}; printf once`], 'once'));
    expect(retry.result).toMatchObject({ session_id: launched.result.session_id, existing: true, state: 'ended' });
    expect(await retry.session!.ended).toEqual(receipt);
    expect(readdirSync(dir)).toContain('runs');
    expect(readFileSync(marker, 'utf8')).toBe('ran\n');
  });
});

describe('the session table', () => {
  const fake = (id: string, key: string, state = 'ended') => ({ id, state, req: { invocationKey: key } }) as unknown as Session;

  it('finds by exact id, by a unique prefix of 3+ characters, by key; an ambiguous prefix is INVALID_ARGUMENT listing the ids', () => {
    const t = new SessionTable();
    const a = fake('s-abc1', 'ka');
    const b = fake('s-abc2', 'kb', 'running');
    const c = fake('s-xyz', 'kc');
    for (const s of [a, b, c]) t.add(s);
    expect(t.byIdOrPrefix('s-abc1')).toBe(a);
    expect(t.byIdOrPrefix('s-x')).toBe(c);
    expect(t.byIdOrPrefix('s-')).toBeUndefined(); // under 3 characters: the exact id only
    expect(t.byKey('kb')).toBe(b);
    expect(t.liveCount()).toBe(1);
    let err: unknown;
    try {
      t.byIdOrPrefix('s-abc');
    } catch (e) {
      err = e;
    }
    expect((err as SupervisorError).code).toBe('INVALID_ARGUMENT');
    expect((err as SupervisorError).details).toEqual({ field: 'session_id', prefix: 's-abc', matches: ['s-abc1', 's-abc2'], count: 2 });
    t.forget(b);
    expect([t.get('s-abc2'), t.byKey('kb'), t.size]).toEqual([undefined, undefined, 2]);
    expect(t.byIdOrPrefix('s-abc')).toBe(a);
    // A key held by a later session (restore keeps one per key): forgetting the earlier one leaves the key to the later.
    const later = fake('s-def', 'ka');
    t.add(later);
    t.forget(a);
    expect([t.get('s-abc1'), t.byKey('ka')]).toEqual([undefined, later]);
  });
});
