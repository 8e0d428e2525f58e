// The supervisor: identity (instance, durable generation, boot id), mode (cgroup or
// subreaper), the registry of sessions by id and invocation key, admission, and orderly
// shutdown. Owns policy across sessions; one session's life is session.ts, the socket is
// server.ts.
import { randomBytes } from 'node:crypto';
import { closeSync, constants, existsSync, fsyncSync, ftruncateSync, lstatSync, mkdirSync, openSync, readdirSync, readFileSync, renameSync, rmdirSync, rmSync, statSync, writeSync } from 'node:fs';
import { userInfo } from 'node:os';
import { isAbsolute, join } from 'node:path';
import type { Logger } from 'pino';
import { SupervisorError } from '../ipc/errors.js';
import type { LaunchResult, Receipt, SessionSelector, SessionState, StatusResult, SupervisorMode } from '../ipc/protocol.js';
import { PROTOCOL_VERSION } from '../ipc/protocol.js';
import { CgroupLeaf, CgroupTree } from './cgroup.js';
import type { Config } from './config.js';
import { createFileDurable, fsyncDir, writeFileDurable } from './durable.js';
import { planRetention } from './retention.js';
import { type CloseReceipt, scanWorkspaces } from './close.js';
import { receiptDigest, verifySignature } from '../ipc/verify.js';
import { native } from './native.js';
import { Reaper } from './reaper.js';
import { faultPoint } from './fault.js';
import { commandDigest } from './receipt.js';
import { Session, type OperatorAttestation, type SessionContext } from './session.js';
import { ReceiptSigner } from './signing.js';
import { KeyIndex, onlyUncommittedAdmission, promoteReservedReceipt, readAdmission, readReceipt, readReserved, receiptFromFacts, sessionDirs, tidyEndedSessionDir, type AdmissionRecord } from './store.js';
import { storedChunks } from '../ipc/state-layout.js';
import { lookupUser } from './users.js';
import { StorageGuard, thresholdWarnings } from './storage.js';
import { hashWorkerPath, onHashWorkerFailure } from './hasher.js';
import type { LaunchParams } from '../ipc/protocol.js';
import { VERSION } from '../ipc/version.js';
import { cpus, freemem, loadavg, totalmem, uptime } from 'node:os';
import si from 'systeminformation';
import { z } from 'zod';

/** Reads /proc/sys/kernel/random/boot_id: changes on every boot. */
export function readBootId(): string {
  return readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
}

/** The highest generation named by any readable admission record (0 if none). */
function highestAdmittedGeneration(sessionsDir: string): number {
  let highest = 0;
  for (const id of sessionDirs(sessionsDir)) {
    try {
      highest = Math.max(highest, readAdmission(join(sessionsDir, id)).generation);
    } catch {
      // torn: skipped here, reported by restore()
    }
  }
  return highest;
}

let stateDirBytesCache: { at: number; bytes: number } | null = null;

/** Bytes held by the files under dir (lstat, not following links), cached for 5 s (and dropped by gc). */
function stateDirBytes(dir: string): number {
  if (stateDirBytesCache && performance.now() - stateDirBytesCache.at < 5_000) return stateDirBytesCache.bytes;
  let bytes = 0;
  const walk = (d: string) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      try {
        if (e.isDirectory()) walk(p);
        else if (e.isFile()) bytes += lstatSync(p).size;
      } catch {
        // removed meanwhile
      }
    }
  };
  walk(dir);
  stateDirBytesCache = { at: performance.now(), bytes };
  return bytes;
}

/** Takes a session dir out of sessions/ in one rename (durable), then removes its files. */
function removeSessionDir(sessionsDir: string, id: string): void {
  const trash = join(sessionsDir, `.retiring-${id}`);
  renameSync(join(sessionsDir, id), trash);
  fsyncDir(sessionsDir);
  rmSync(trash, { recursive: true, force: true });
}

/** Tombstone of a session the retention policy removed whole (<state>/retired/<id>.json). */
interface RetiredRecord {
  session_id: string;
  invocation_key: string;
  command_digest: string;
  outcome: string;
  ended_at: string;
  receipt_sha256: string;
  retired_at: string;
}

const RetiredSchema = z.object({
  session_id: z.string().regex(/^s-[0-9a-z]+-[0-9a-f]+$/),
  invocation_key: z.string().min(1),
  command_digest: z.string(),
  outcome: z.string(),
  ended_at: z.string(),
  receipt_sha256: z.string(),
  retired_at: z.string(),
});

/**
 * The tombstones in dir, each checked against its shape and its file name; one that fails is
 * returned as an error (its key record still blocks the key: the session shows as unknown).
 */
function readRetired(dir: string): { records: RetiredRecord[]; errors: { file: string; reason: string }[] } {
  const records: RetiredRecord[] = [];
  const errors: { file: string; reason: string }[] = [];
  if (!existsSync(dir)) return { records, errors };
  for (const name of readdirSync(dir)) {
    if (!name.endsWith('.json') || name.startsWith('.')) continue;
    try {
      const parsed = RetiredSchema.safeParse(JSON.parse(readFileSync(join(dir, name), 'utf8')));
      if (!parsed.success) throw new Error(`not a tombstone: ${parsed.error.issues[0].path.join('.')}: ${parsed.error.issues[0].message}`);
      if (`${parsed.data.session_id}.json` !== name) throw new Error(`names session ${parsed.data.session_id}`);
      records.push(parsed.data);
    } catch (err) {
      errors.push({ file: name, reason: (err as Error).message });
    }
  }
  return { records, errors };
}

/** The open lock file of this process's state dir: held (flock) until the process exits. */
let stateDirLockFd = -1;

/**
 * One supervisor per state dir: an exclusive flock(2) on <state>/supervisor.lock, which holds
 * the owner's pid. A second one would reconcile the first one's live sessions as owner_lost.
 */
function lockStateDir(stateDir: string): void {
  if (stateDirLockFd >= 0) return;
  const path = join(stateDir, 'supervisor.lock');
  const fd = openSync(path, constants.O_RDWR | constants.O_CREAT | constants.O_NOFOLLOW, 0o600);
  if (!native().tryLockExclusive(fd)) {
    const holder = readFileSync(path, 'utf8').trim();
    closeSync(fd);
    throw new Error(`the state dir ${stateDir} is in use by another supervisor (pid ${holder || 'unknown'}); stop it first, or give this one its own stateDir`);
  }
  // In place, then truncated: on a full file system a truncate first would free the block the
  // write then cannot get back. The pid is for people; the flock is what counts.
  const pid = Buffer.from(`${process.pid}\n`);
  try {
    writeSync(fd, pid, 0, pid.length, 0);
    ftruncateSync(fd, pid.length);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOSPC' && (err as NodeJS.ErrnoException).code !== 'EDQUOT') throw err;
  }
  stateDirLockFd = fd;
}

/** Bytes an identity record is padded to, so it can be rewritten in place (one sector). */
const IDENTITY_BYTES = 128;

/**
 * Writes supervisor.json durably: a new file renamed over the old one; on a full file system
 * (ENOSPC: no block for the new file) the old one is rewritten in place instead, within its
 * own padded block (one sector write, fsync'ed), so a start on a full disk still takes a new
 * generation. A torn identity is recovered at the next start (kept aside; the generation
 * then comes from the admission records).
 */
function writeIdentity(path: string, identity: { instance: string; generation: number }): void {
  const text = JSON.stringify(identity);
  const data = text.padEnd(IDENTITY_BYTES - 1, ' ') + '\n';
  try {
    writeFileDurable(path, data);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if ((code !== 'ENOSPC' && code !== 'EDQUOT') || !existsSync(path) || statSync(path).size < Buffer.byteLength(data)) throw err;
    const fd = openSync(path, constants.O_WRONLY | constants.O_NOFOLLOW);
    try {
      writeSync(fd, Buffer.from(data), 0, Buffer.byteLength(data), 0);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
  }
}

/** A fresh session id: sortable by admission time, unguessable. */
export function newSessionId(nowMs = Date.now()): string {
  return `s-${nowMs.toString(36).padStart(9, '0')}-${randomBytes(6).toString('hex')}`;
}

export class Supervisor {
  private readonly sessions = new Map<string, Session>();
  private readonly byKey = new Map<string, Session>();
  private stopping: Promise<void> | null = null;
  /** Admission sealed (durable: <state>/seal.json), and since which generation. */
  private sealRecord: { generation: number; sealed_at: string } | null = null;
  private closing: Promise<CloseReceipt> | null = null;
  /** Sessions the retention policy removed whole (tombstones in <state>/retired/), by id and by key. */
  private readonly retired = new Map<string, RetiredRecord>();
  private readonly retiredByKey = new Map<string, RetiredRecord>();
  private retentionTimer: NodeJS.Timeout | null = null;
  /** True until reconciliation has looked at every session left unknown by a restart. */
  private reconciling = false;
  readonly ctx: SessionContext;
  private readonly keys: KeyIndex;

  private constructor(readonly config: Config, readonly log: Logger, ctx: SessionContext) {
    this.ctx = ctx;
    this.keys = new KeyIndex(config.stateDir);
    this.sealRecord = this.readSeal();
    ctx.storage.onBelowKeepFree = () => this.keepFree();
    void si.currentLoad().catch(() => {}); // primes the CPU load sample (see status())
    this.restore();
  }

  /**
   * Loads every session in the state dir: with a receipt it is ended; without one it is
   * unknown until reconcile(). Files that cannot be read make only their own session
   * unknown (with the reason) and never stop start-up. Keys are indexed from the key files
   * and, for a crash between the admission and key writes, from the admission records.
   */
  private restore(): void {
    const tombstones = readRetired(this.retiredDir);
    for (const e of tombstones.errors) this.log.error(e, 'unreadable tombstone; ignored');
    for (const r of tombstones.records) this.rememberRetired(r);
    // Retirements a crash interrupted: the tombstone is written, so the dir goes, but only
    // when the tombstone is of that very receipt (never a session on a stray tombstone's word).
    for (const name of readdirSync(this.ctx.sessionsDir)) {
      if (name.startsWith('.retiring-')) rmSync(join(this.ctx.sessionsDir, name), { recursive: true, force: true });
      else if (this.retired.has(name)) this.finishRetirement(name);
    }
    const keyOf = new Map<string, string>();
    const { records, errors } = this.keys.load();
    for (const e of errors) this.log.error(e, 'unreadable key record');
    for (const r of records) keyOf.set(r.session_id, r.invocation_key);
    for (const sessionId of sessionDirs(this.ctx.sessionsDir)) {
      const dir = join(this.ctx.sessionsDir, sessionId);
      if (!keyOf.has(sessionId) && onlyUncommittedAdmission(dir) && this.discardUncommittedAdmission(sessionId)) continue;
      let session: Session;
      try {
        const admission = readAdmission(dir);
        let receipt = null;
        let resumed: Receipt | null = null;
        try {
          receipt = readReceipt(dir, sessionId);
        } catch (err) {
          throw new Error(`receipt is unreadable: ${(err as Error).message}`);
        }
        // Signed by this supervisor's key and not matching: changed since (a receipt signed by
        // an earlier key, or unsigned from before signing, cannot be checked here: kept).
        if (receipt?.signature?.key_id === this.ctx.signer.keyId) {
          const problems = verifySignature(receipt, this.ctx.signer.publicKeyPem);
          if (problems.length) throw new Error(`receipt does not verify: ${problems.join('; ')}`);
        }
        if (!receipt) {
          const adopted = this.adoptReserved(dir, admission);
          if (adopted?.published) receipt = adopted.receipt;
          else if (adopted) resumed = adopted.receipt;
        }
        if (receipt) {
          try {
            tidyEndedSessionDir(dir);
          } catch (err) {
            this.log.warn({ err, session_id: sessionId }, 'could not tidy an ended session dir');
          }
        }
        session = Session.restore(admission, receipt, this.ctx);
        if (resumed) session.resumeReceipt(resumed);
        if (!keyOf.has(sessionId)) {
          this.keys.write({ invocation_key: admission.invocation_key, session_id: sessionId, command_digest: admission.command_digest, admitted_at: admission.admitted_at });
        }
      } catch (err) {
        const reason = `state files unreadable: ${(err as Error).message}`;
        this.log.error({ session_id: sessionId, reason }, 'session files are torn or corrupt; the session is unknown');
        session = Session.broken(sessionId, keyOf.get(sessionId) ?? `unreadable-${sessionId}`, reason, this.ctx);
      }
      this.register(session);
    }
    // A key whose session is gone from disk still can never run again.
    for (const r of records) {
      if (!this.byKey.has(r.invocation_key) && !this.retiredByKey.has(r.invocation_key)) {
        this.register(Session.broken(r.session_id, r.invocation_key, 'the session\'s files are gone; its key stays used', this.ctx));
      }
    }
    const unknown = [...this.sessions.values()].filter((s) => s.state === 'unknown').length;
    this.reconciling = unknown > 0;
    this.log.info({ sessions: this.sessions.size, unknown }, 'state restored');
  }

  /**
   * A session dir holding no admission record, only its temp file or nothing, is an
   * admission a crash interrupted before it committed: nothing was spawned (the spawn comes
   * after the fsync'ed record) and the key was not taken (its record comes after too). The
   * dir and its empty leaf go. A populated leaf (never by construction) is kept as a broken
   * session, whose processes reconciliation ends. Returns whether it was discarded.
   */
  private discardUncommittedAdmission(sessionId: string): boolean {
    const leaf = this.ctx.tree ? new CgroupLeaf(join(this.ctx.tree.sessionsPath, sessionId)) : null;
    if (leaf?.populated()) return false;
    try {
      if (leaf && existsSync(leaf.path)) rmdirSync(leaf.path);
      rmSync(join(this.ctx.sessionsDir, sessionId), { recursive: true, force: true });
      fsyncDir(this.ctx.sessionsDir);
    } catch (err) {
      this.log.warn({ err, session_id: sessionId }, 'could not remove an admission that never committed');
      return false;
    }
    this.log.info({ session_id: sessionId }, 'removed an admission a crash interrupted before it committed (nothing ran, no key was taken)');
    return true;
  }

  /**
   * What a crash left in a session's reservation, if it carries our signature: a whole
   * receipt written and fsync'ed but not yet linked (linked into place now: published), or
   * the facts record of a receipt the disk had no room for (rebuilt from the admission record
   * and the chunk files; it is written once there is room). Null: nothing usable there.
   */
  private adoptReserved(dir: string, admission: AdmissionRecord): { receipt: Receipt; published: boolean } | null {
    const sessionId = admission.session_id;
    const found = readReserved(dir, sessionId);
    if (!found) return null;
    const record = found.kind === 'receipt' ? found.receipt : found.facts;
    const problems = verifySignature(record, this.ctx.signer.publicKeyPem);
    if (problems.length) {
      this.log.warn({ session_id: sessionId, problems }, 'the receipt reservation holds a record that does not verify; ignored');
      return null;
    }
    if (found.kind === 'facts') {
      const rebuilt = receiptFromFacts(found.facts, admission, (stream) => storedChunks(dir, stream as 'stdout', admission.chunk_bytes));
      if (!rebuilt) {
        this.log.warn({ session_id: sessionId }, 'the receipt facts in the reservation no longer match the chunk files; ignored');
        return null;
      }
      this.log.info({ session_id: sessionId }, 'rebuilt a receipt from the facts a crash left in its reservation');
      return { receipt: this.ctx.signer.sign(rebuilt), published: false };
    }
    try {
      promoteReservedReceipt(dir);
      this.log.info({ session_id: sessionId }, 'published a receipt a crash left in its reservation');
    } catch (err) {
      // Durable under its reservation's name all the same: written into place by the session.
      this.log.warn({ err, session_id: sessionId }, 'could not link a receipt found in its reservation');
      return { receipt: found.receipt, published: false };
    }
    return { receipt: found.receipt, published: true };
  }

  /** A session dir whose tombstone a crash left: removed if the tombstone is of its receipt, else kept (and the tombstone ignored). */
  private finishRetirement(sessionId: string): void {
    const tombstone = this.retired.get(sessionId)!;
    let receipt: Receipt | null = null;
    try {
      receipt = readReceipt(join(this.ctx.sessionsDir, sessionId), sessionId);
    } catch {
      // unreadable: not the receipt the tombstone names
    }
    if (receipt && receiptDigest(receipt) === tombstone.receipt_sha256 && receipt.invocation_key === tombstone.invocation_key) {
      removeSessionDir(this.ctx.sessionsDir, sessionId);
      return;
    }
    this.log.error({ session_id: sessionId }, 'a tombstone that is not of this session\'s receipt; the session is kept and the tombstone ignored');
    this.retired.delete(sessionId);
    if (this.retiredByKey.get(tombstone.invocation_key) === tombstone) this.retiredByKey.delete(tombstone.invocation_key);
  }

  private register(session: Session): void {
    this.sessions.set(session.id, session);
    this.byKey.set(session.req.invocationKey, session);
    session.on('state', (state: SessionState) => {
      if (state === 'ended') this.keepFree();
    });
  }

  /**
   * Settles every unknown session with evidence where there is some (owner_lost receipts).
   * Each session's course is decided at once (Session.reconcile decides before its first
   * await) and admission of new keys opens right after, in the same tick: ending a
   * TERM-ignoring leaf takes its grace (up to 30 days), and runs on in the background while
   * retries of its key answer with the session, unknown until its receipt is written.
   * Resolves once every one of them is settled.
   */
  reconcile(): Promise<void> {
    const unknown = [...this.sessions.values()].filter((s) => s.state === 'unknown');
    const settling = unknown.map((s) =>
      s.reconcile().catch((err: Error) => {
        this.log.error({ err, session_id: s.id }, 'reconciliation failed; the session stays unknown');
      }),
    );
    this.reconciling = false;
    this.log.info({ sessions: unknown.length, being_ended: unknown.filter((s) => s.state === 'unknown').length }, 'reconciliation decided; admission open');
    this.reconciliation = Promise.all(settling).then(() => {
      const left = unknown.filter((s) => s.state === 'unknown').length;
      this.log.info({ reconciled: unknown.length - left, still_unknown: left }, 'reconciliation done');
    });
    return this.reconciliation;
  }

  /** Reconciliation's background part (escalations of recovered sessions), for shutdown to settle. */
  private reconciliation: Promise<void> = Promise.resolve();

  private readSeal(): { generation: number; sealed_at: string } | null {
    const path = join(this.config.stateDir, 'seal.json');
    if (!existsSync(path)) return null;
    try {
      const r = JSON.parse(readFileSync(path, 'utf8')) as { generation: number; sealed_at: string };
      if (!Number.isSafeInteger(r.generation) || typeof r.sealed_at !== 'string') throw new Error('fields missing');
      return r;
    } catch (err) {
      // Sealed is the safe reading of a torn seal: admission stays closed.
      this.log.error({ err }, 'seal.json is unreadable; admission stays sealed');
      return { generation: this.ctx.identity.generation, sealed_at: new Date(0).toISOString() };
    }
  }

  /** Whether new launches are taken, and if not why. */
  admissionState(): StatusResult['admission'] {
    return this.stopping ? 'stopping' : this.sealRecord ? 'sealed' : this.reconciling ? 'reconciling' : this.ctx.storage.admits() ? 'open' : 'disk_low';
  }

  /**
   * When free space in the state dir is below storage.keepFreeBytes, gc(): at most once a
   * second; a call within a second of the last run is deferred to the end of that second,
   * never dropped (the end of the session that held the space must not go unnoticed).
   */
  private keepFreeAt = -Infinity;
  private keepFreeTimer: NodeJS.Timeout | null = null;
  keepFree(): void {
    if (this.keepFreeTimer) return;
    const waitMs = this.keepFreeAt + 1000 - performance.now();
    if (waitMs > 0) {
      this.keepFreeTimer = setTimeout(() => {
        this.keepFreeTimer = null;
        this.keepFree();
      }, Math.ceil(waitMs));
      this.keepFreeTimer.unref();
      return;
    }
    const storage = this.ctx.storage;
    if (storage.freeBytes() >= storage.keepFreeBytes) return;
    this.keepFreeAt = performance.now();
    try {
      this.gc();
    } catch (err) {
      this.log.error({ err }, 'retention (keep-free) failed');
    }
  }

  /** Stops admission for good (durable; a restart does not unseal). Idempotent. */
  seal(): { generation: number; sealed_at: string; already_sealed: boolean } {
    if (this.sealRecord) return { ...this.sealRecord, already_sealed: true };
    const record = { generation: this.ctx.identity.generation, sealed_at: new Date().toISOString() };
    writeFileDurable(join(this.config.stateDir, 'seal.json'), JSON.stringify(record) + '\n');
    this.sealRecord = record;
    this.log.info(record, 'admission sealed');
    return { ...record, already_sealed: false };
  }

  /**
   * Close is a join: seal, let every running session end by itself for up to timeoutMs,
   * terminate the rest (TERM, grace, KILL; cause close), wait for every receipt, scan the
   * workspaces, and write the signed close receipt (<state>/close-receipt.json). Calling it
   * again, even after a restart, returns the same close receipt.
   */
  close(timeoutMs: number, workspaces: string[]): Promise<CloseReceipt> {
    const path = join(this.config.stateDir, 'close-receipt.json');
    if (existsSync(path)) return Promise.resolve(JSON.parse(readFileSync(path, 'utf8')) as CloseReceipt);
    this.closing ??= (async () => {
      const sealed = this.seal();
      const live = [...this.sessions.values()].filter((s) => s.state !== 'ended' && s.state !== 'unknown');
      this.log.info({ sessions: live.length, timeout_ms: timeoutMs }, 'closing: settling sessions');
      // Settled: a receipt, or unknown (a session that lost its evidence never gets one, and
      // is listed as unknown rather than waited for).
      const allEnded = Promise.all(live.map((s) => s.settled()));
      let timer: NodeJS.Timeout | undefined;
      const timedOut = await Promise.race([allEnded.then(() => false), new Promise<boolean>((r) => (timer = setTimeout(() => r(true), timeoutMs)))]);
      clearTimeout(timer);
      const rest = timedOut ? live.filter((s) => s.state !== 'ended' && s.state !== 'unknown') : [];
      await Promise.all(rest.map((s) => s.terminate('close')));
      await allEnded;
      const scans = await scanWorkspaces(workspaces);
      for (const s of scans) if (s.error) this.log.warn({ path: s.path, error: s.error, message: s.error_message }, 'workspace scan failed');
      const { instance, generation, bootId, mode } = this.ctx.identity;
      const receipt = this.ctx.signer.sign<CloseReceipt>({
        version: 1,
        kind: 'close',
        supervisor: { instance, generation, boot_id: bootId, mode },
        sealed: { generation: sealed.generation, sealed_at: sealed.sealed_at },
        closed_at: new Date().toISOString(),
        settle: { timeout_ms: timeoutMs, terminated: rest.length },
        sessions: [...this.sessions.values()]
          .sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0))
          .map((s) => ({ session_id: s.id, invocation_key: s.req.invocationKey, state: s.state, outcome: s.receipt?.outcome ?? null, receipt_sha256: s.receipt ? receiptDigest(s.receipt) : null })),
        workspaces: scans,
      });
      createFileDurable(path, JSON.stringify(receipt, null, 2) + '\n');
      this.log.info({ sessions: receipt.sessions.length, terminated: rest.length }, 'closed');
      return receipt;
    })();
    this.closing.catch(() => (this.closing = null));
    return this.closing;
  }

  /** Ends an unknown session on an operator's word (never automatic). */
  async resolve(selector: SessionSelector, operator: OperatorAttestation) {
    const session = this.find(selector);
    const receipt = await session.resolveAsOperator(operator);
    this.log.warn({ session_id: session.id, operator }, 'operator attested the end of an unknown session');
    return receipt;
  }

  /** Prepares the state dir, identity, subreaper and cgroup subtree; throws with a reason. */
  static create(config: Config, log: Logger): Supervisor {
    mkdirSync(config.stateDir, { recursive: true, mode: 0o700 });
    lockStateDir(config.stateDir);
    const sessionsDir = join(config.stateDir, 'sessions');
    mkdirSync(sessionsDir, { recursive: true, mode: 0o700 });
    const identityPath = join(config.stateDir, 'supervisor.json');
    let instance = randomBytes(8).toString('hex');
    let generation = 0;
    if (existsSync(identityPath)) {
      try {
        const prev = JSON.parse(readFileSync(identityPath, 'utf8')) as { instance: unknown; generation: unknown };
        if (typeof prev.instance !== 'string' || !Number.isSafeInteger(prev.generation)) throw new Error('fields missing');
        instance = prev.instance;
        generation = prev.generation as number;
      } catch (err) {
        // Torn identity: kept aside; the generation still only goes up (past every admission).
        renameSync(identityPath, `${identityPath}.unreadable-${Date.now()}`);
        generation = highestAdmittedGeneration(sessionsDir);
        log.error({ err, generation }, 'supervisor.json was unreadable; kept aside, generation recovered from admission records');
      }
    }
    generation += 1;
    writeIdentity(identityPath, { instance, generation });

    const reaper = new Reaper();
    reaper.start();
    let tree: CgroupTree | null = null;
    let mode: SupervisorMode = 'subreaper';
    if (config.cgroup.mode !== 'subreaper') {
      try {
        tree = CgroupTree.setup(config.cgroup.parent);
        mode = 'cgroup';
      } catch (err) {
        if (config.cgroup.mode === 'cgroup') {
          throw new Error(`cgroup mode was required but no writable cgroup2 is available: ${(err as Error).message}`);
        }
        log.warn({ reason: (err as Error).message }, 'no writable cgroup v2: running in subreaper mode (death evidence: subreaper_reaped)');
      }
    }
    const storage = new StorageGuard(config.stateDir, config.storage);
    for (const warning of thresholdWarnings(storage, storage.totalBytes)) log.warn({ state_dir: config.stateDir }, warning);
    hashWorkerPath(); // fails start-up, naming where it looked, rather than every receipt later
    onHashWorkerFailure((reason) => log.error({ reason }, 'a hashing thread failed; replaced (its streams are hashed again from their chunk files)'));
    const ctx: SessionContext = {
      config,
      log,
      reaper,
      tree,
      sessionsDir,
      identity: { instance, generation, bootId: readBootId(), mode, pid: process.pid },
      signer: ReceiptSigner.loadOrCreate(config.stateDir),
      storage,
    };
    log.info({ instance, generation, mode, cgroup: tree?.basePath ?? null, subreaper: native().isChildSubreaper() }, 'supervisor ready');
    try {
      return new Supervisor(config, log, ctx);
    } catch (err) {
      // Nothing ran: the cgroup subtree made for this start goes with it.
      tree?.teardown();
      throw err;
    }
  }

  get mode(): SupervisorMode {
    return this.ctx.identity.mode;
  }

  /**
   * Admits and starts a session, or returns the existing one for the same invocation key
   * and command digest; KEY_CONFLICT when the key was used for another command.
   */
  launch(params: LaunchParams): LaunchResult {
    if (this.stopping) throw new SupervisorError('SHUTTING_DOWN', 'the supervisor is stopping');
    if (!isAbsolute(params.cwd)) throw new SupervisorError('INVALID_ARGUMENT', `cwd must be absolute: ${params.cwd}`);
    let cwdIsDir = false;
    try {
      cwdIsDir = statSync(params.cwd).isDirectory();
    } catch {
      // reported below
    }
    if (!cwdIsDir) throw new SupervisorError('INVALID_ARGUMENT', `cwd is not a directory: ${params.cwd}`);
    const env = params.env ?? {};
    const userSpec = params.user ?? (this.config.session.user !== undefined ? String(this.config.session.user) : null);
    const sessionUser = userSpec === null ? null : lookupUser(userSpec);
    if (sessionUser && process.getuid?.() !== 0 && sessionUser.uid !== process.getuid?.()) {
      throw new SupervisorError('INVALID_ARGUMENT', `user: running as ${userSpec} needs a root supervisor`, { field: 'user' });
    }
    const pty = params.pty ? { cols: params.pty.cols ?? 80, rows: params.pty.rows ?? 24 } : null;
    const stdin = params.stdin ? 'stream' : 'null';
    const digest = commandDigest({ argv: params.argv, cwd: params.cwd, env, pty: pty !== null, stdin, user: userSpec });
    const key = params.invocation_key ?? `auto-${randomBytes(12).toString('hex')}`;
    const existing = this.byKey.get(key);
    const gone = existing ? undefined : this.retiredByKey.get(key);
    if (gone) {
      // Keys are forever: a session removed by retention is never run again.
      if (gone.command_digest !== digest) {
        throw new SupervisorError('KEY_CONFLICT', `invocation key ${JSON.stringify(key)} was used for another command`, { invocation_key: key, session_id: gone.session_id });
      }
      return { session_id: gone.session_id, invocation_key: key, existing: true, state: 'retired', command_digest: digest };
    }
    if (existing) {
      // A session whose admission record is unreadable has no known digest: its key is
      // blocked, and a retry gets that session (unknown) rather than a conflict or a run.
      if (existing.req.commandDigest !== '' && existing.req.commandDigest !== digest) {
        throw new SupervisorError('KEY_CONFLICT', `invocation key ${JSON.stringify(key)} was used for another command`, {
          invocation_key: key,
          session_id: existing.id,
        });
      }
      return { session_id: existing.id, invocation_key: key, existing: true, state: existing.state, command_digest: digest };
    }
    if (this.sealRecord) {
      throw new SupervisorError('ADMISSION_SEALED', `admission was sealed at generation ${this.sealRecord.generation} (${this.sealRecord.sealed_at})`, {
        generation: this.sealRecord.generation,
      });
    }
    const live = this.liveSessions();
    if (live >= this.config.session.maxSessions) {
      throw new SupervisorError('LIMIT_EXCEEDED', `${live} sessions are running, the limit is ${this.config.session.maxSessions}`, {
        limit: 'sessions',
        max: this.config.session.maxSessions,
        retry_after_ms: 1000,
      });
    }
    if (this.reconciling) {
      throw new SupervisorError('ADMISSION_DENIED', 'reconciling sessions left by a restart; retry shortly', { retry_after_ms: 250, reason: 'reconciling' });
    }
    if (!this.ctx.storage.admits()) this.keepFree();
    if (!this.ctx.storage.admits()) {
      const free = this.ctx.storage.freeBytes();
      throw new SupervisorError('ADMISSION_DENIED', `disk low: ${free} bytes free in the state dir, ${this.ctx.storage.minFreeBytes} needed; retry later`, {
        retry_after_ms: 5000,
        reason: 'disk_low',
        free_bytes: free,
        min_free_bytes: this.ctx.storage.minFreeBytes,
      });
    }
    const self = userInfo();
    const userName = sessionUser ? (sessionUser.name ?? String(sessionUser.uid)) : self.username;
    const leaderEnv: Record<string, string> = {
      PATH: this.config.session.path,
      HOME: sessionUser ? sessionUser.home : self.homedir,
      USER: userName,
      LOGNAME: userName,
      LANG: this.config.session.lang,
      ...(pty ? { TERM: 'xterm-256color' } : {}),
      ...(params.inherit_env ?? {}),
      ...env,
    };
    const session = new Session(
      newSessionId(),
      {
        argv: params.argv,
        cwd: params.cwd,
        env,
        leaderEnv,
        invocationKey: key,
        commandDigest: digest,
        timeoutMs: params.timeout_ms ?? 0,
        graceMs: params.grace_ms ?? this.config.session.defaultGraceMs,
        linger: params.linger ?? 'kill',
        chunkBytes: this.config.drain.chunkBytes,
        user: userSpec,
        sessionUser,
        pty,
        stdin,
      },
      this.ctx,
    );
    // Admission record, then key record, both durable, then spawn (DESIGN.md 9). All
    // synchronous, so a concurrent launch with this key finds it registered.
    try {
      session.admit();
      this.keys.write({ invocation_key: key, session_id: session.id, command_digest: digest, admitted_at: session.admittedAt.toISOString() });
    } catch (err) {
      this.log.error({ err, session_id: session.id }, 'admission failed');
      session.abandon();
      throw new SupervisorError('ADMISSION_DENIED', `cannot record the admission: ${(err as Error).message}`, { retry_after_ms: 1000 });
    }
    this.register(session);
    faultPoint('launch:before-spawn');
    session.start();
    faultPoint('launch:started');
    // The command by its digest and name: argv may be megabytes (the kernel's ARG_MAX), and a
    // log line is written synchronously on the launch path.
    this.log.info({ session_id: session.id, invocation_key: key, command: params.argv[0].slice(0, 256), argc: params.argv.length, command_digest: digest, pid: session.pid }, 'session launched');
    void session.ended.then((receipt) => {
      if (receipt) this.log.info({ session_id: session.id, outcome: receipt.outcome, exit: receipt.exit }, 'session ended');
    });
    return { session_id: session.id, invocation_key: key, existing: false, state: session.state, command_digest: digest };
  }

  /** The session named by id or key; SESSION_NOT_FOUND otherwise. */
  find(selector: SessionSelector): Session {
    const session = selector.session_id
      ? this.sessions.get(selector.session_id)
      : selector.invocation_key
        ? this.byKey.get(selector.invocation_key)
        : undefined;
    if (!session) {
      const what = selector.session_id ? `session ${selector.session_id}` : `invocation key ${JSON.stringify(selector.invocation_key)}`;
      const gone = selector.session_id ? this.retired.get(selector.session_id) : this.retiredByKey.get(selector.invocation_key ?? '');
      if (gone) {
        throw new SupervisorError('SESSION_NOT_FOUND', `${what} was removed by the retention policy at ${gone.retired_at} (it ended ${gone.outcome}; receipt ${gone.receipt_sha256}); its key stays used`, {
          retired_at: gone.retired_at,
          receipt_sha256: gone.receipt_sha256,
        });
      }
      throw new SupervisorError('SESSION_NOT_FOUND', `no ${what}`);
    }
    return session;
  }

  private get retiredDir(): string {
    return join(this.config.stateDir, 'retired');
  }

  private rememberRetired(r: RetiredRecord): void {
    this.retired.set(r.session_id, r);
    this.retiredByKey.set(r.invocation_key, r);
  }

  /**
   * Applies the retention policy now (sbx gc; also every retention.intervalMs): output of old
   * ended sessions first, oldest first while over the total; whole sessions (receipt too)
   * past receiptMaxAgeMs, leaving a tombstone so their key still answers. Never a running or
   * unknown session, never a key record.
   */
  gc(nowMs = Date.now()): { removed_output: string[]; retired: string[]; freed_bytes: number; closed?: true } {
    // A closed state dir is an archive: its close receipt lists receipts (and their output)
    // that must stay verifiable, so retention leaves it alone.
    if (this.closing || existsSync(join(this.config.stateDir, 'close-receipt.json'))) return { removed_output: [], retired: [], freed_bytes: 0, closed: true };
    const candidates = [...this.sessions.values()].map((s) => ({
      sessionId: s.id,
      ended: s.state === 'ended' && s.receipt !== null,
      endedAtMs: s.receipt ? Date.parse(s.receipt.ended_at) : 0,
      outputBytes: s.outputBytes(),
      outputRemoved: s.outputRemoved,
    }));
    const storage = this.ctx.storage;
    const plan = planRetention(candidates, this.config.retention, nowMs, { freeBytes: storage.freeBytes(), keepFreeBytes: storage.keepFreeBytes });
    let freed = 0;
    // Output first: on a full disk it frees the room a tombstone then needs. One that fails
    // (ENOSPC for a tombstone, say) is logged and left for the next run; the rest go on.
    const removedOutput: string[] = [];
    const retired: string[] = [];
    for (const id of plan.removeOutput) {
      try {
        freed += this.sessions.get(id)!.removeOutput();
        removedOutput.push(id);
      } catch (err) {
        this.log.error({ err, session_id: id }, 'retention could not remove this output; left for the next run');
      }
    }
    for (const id of plan.retire) {
      const s = this.sessions.get(id)!;
      const bytes = s.outputBytes();
      const record: RetiredRecord = {
        session_id: s.id,
        invocation_key: s.req.invocationKey,
        command_digest: s.req.commandDigest,
        outcome: s.receipt!.outcome,
        ended_at: s.receipt!.ended_at,
        receipt_sha256: receiptDigest(s.receipt),
        retired_at: new Date(nowMs).toISOString(),
      };
      try {
        mkdirSync(this.retiredDir, { recursive: true, mode: 0o700 });
        // Tombstone first (kept if a crash left one), then the dir leaves the sessions list in
        // one rename, then its files go: a crash at any point leaves either the session whole
        // or a tombstone, and restore() finishes what was started.
        if (!existsSync(join(this.retiredDir, `${s.id}.json`))) createFileDurable(join(this.retiredDir, `${s.id}.json`), JSON.stringify(record) + '\n');
        removeSessionDir(this.ctx.sessionsDir, s.id);
      } catch (err) {
        this.log.error({ err, session_id: id }, 'retention could not retire this session; left for the next run');
        continue;
      }
      freed += bytes;
      this.sessions.delete(s.id);
      this.byKey.delete(s.req.invocationKey);
      this.rememberRetired(record);
      retired.push(id);
    }
    if (retired.length || removedOutput.length) this.log.info({ removed_output: removedOutput.length, retired: retired.length, freed_bytes: freed }, 'retention applied');
    stateDirBytesCache = null;
    return { removed_output: removedOutput, retired, freed_bytes: freed };
  }

  /** Runs gc() every retention.intervalMs (0: never by itself). */
  startRetention(): void {
    const every = this.config.retention.intervalMs;
    if (every <= 0 || this.retentionTimer) return;
    this.retentionTimer = setInterval(() => {
      try {
        this.gc();
      } catch (err) {
        this.log.error({ err }, 'retention failed');
      }
    }, every);
    this.retentionTimer.unref();
  }

  /** Sessions that have not ended (unknown ones included: they may still run). */
  liveSessions(): number {
    let n = 0;
    for (const s of this.sessions.values()) if (s.state !== 'ended') n++;
    return n;
  }

  list(all: boolean): Session[] {
    return [...this.sessions.values()].filter((s) => all || s.state !== 'ended');
  }

  async status(socketPath: string): Promise<StatusResult> {
    const counts: Record<string, number> = {};
    for (const s of this.sessions.values()) counts[s.state] = (counts[s.state] ?? 0) + 1;
    // systeminformation's first currentLoad() samples for about 0.5 s: it is primed at start,
    // and a status asked before that says null rather than waiting.
    const load = await Promise.race([si.currentLoad().catch(() => null), new Promise<null>((r) => setTimeout(() => r(null), 50))]);
    const mem = await si.mem();
    const storage = this.ctx.storage;
    const free = storage.freeBytes();
    const admission = this.admissionState();
    return {
      version: VERSION,
      protocol: PROTOCOL_VERSION,
      instance: this.ctx.identity.instance,
      generation: this.ctx.identity.generation,
      mode: this.mode,
      boot_id: this.ctx.identity.bootId,
      pid: process.pid,
      socket: socketPath,
      state_dir: this.config.stateDir,
      cgroup: this.ctx.tree ? this.ctx.tree.basePath : null,
      receipt_key: { key_id: this.ctx.signer.keyId, public_key_pem: this.ctx.signer.publicKeyPem, path: join(this.config.stateDir, 'receipt-key.pub') },
      sessions: counts,
      load: { loadavg: loadavg(), cpus: cpus().length, free_mem_bytes: freemem(), total_mem_bytes: totalmem() },
      admission,
      ...(admission === 'disk_low'
        ? { admission_reason: `disk low: ${free} bytes free in the state dir, ${storage.minFreeBytes} needed; retention removes the oldest ended sessions' output while less than ${storage.keepFreeBytes} is free (sbx gc), and cannot touch running or unknown sessions` }
        : admission === 'reconciling'
          ? { admission_reason: 'reconciling sessions left by a restart' }
          : {}),
      sealed: this.sealRecord,
      storage: {
        state_dir_bytes: stateDirBytes(this.config.stateDir),
        free_bytes: free,
        total_bytes: storage.totalBytes,
        reserve_bytes: storage.reserveBytes,
        min_free_bytes: storage.minFreeBytes,
        keep_free_bytes: storage.keepFreeBytes,
        admits: free >= storage.minFreeBytes,
      },
      machine: { cpu_load_percent: load ? Math.round(load.currentLoad * 10) / 10 : null, mem_total_bytes: mem.total, mem_available_bytes: mem.available, uptime_s: Math.round(uptime()) },
    };
  }

  /**
   * Stops admission, terminates every session (cause shutdown), and waits until each is
   * settled: a receipt, or unknown (one whose receipt cannot be written, or whose evidence was
   * lost, never gets one: waiting for its `ended` would never return). Recovered sessions
   * still being ended by reconciliation are waited for too.
   */
  shutdown(): Promise<void> {
    this.stopping ??= (async () => {
      const live = [...this.sessions.values()].filter((s) => s.state !== 'ended' && s.state !== 'unknown');
      this.log.info({ sessions: live.length }, 'shutting down: terminating sessions');
      await Promise.all(live.map((s) => s.terminate('shutdown')));
      await Promise.all(live.map((s) => s.settled()));
      await this.reconciliation;
      this.ctx.reaper.reapNow();
      this.ctx.reaper.stop();
      this.ctx.tree?.teardown();
    })();
    return this.stopping;
  }
}
