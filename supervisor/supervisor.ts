// The supervisor: identity (instance, durable generation, boot id), mode (cgroup or
// subreaper), the registry of sessions by id and invocation key, admission, and orderly
// shutdown. Owns policy across sessions; one session's life is session.ts, the socket is
// server.ts.
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, renameSync, statSync } from 'node:fs';
import { userInfo } from 'node:os';
import { isAbsolute, join } from 'node:path';
import type { Logger } from 'pino';
import { SupervisorError } from '../ipc/errors.js';
import type { LaunchResult, SessionSelector, StatusResult, SupervisorMode } from '../ipc/protocol.js';
import { PROTOCOL_VERSION } from '../ipc/protocol.js';
import { CgroupTree } from './cgroup.js';
import type { Config } from './config.js';
import { writeFileDurable } from './durable.js';
import { native } from './native.js';
import { Reaper } from './reaper.js';
import { commandDigest } from './receipt.js';
import { Session, type OperatorAttestation, type SessionContext } from './session.js';
import { ReceiptSigner } from './signing.js';
import { KeyIndex, readAdmission, readReceipt, sessionDirs } from './store.js';
import { lookupUser } from './users.js';
import type { LaunchParams } from './validate.js';
import { VERSION } from '../ipc/version.js';
import { cpus, freemem, loadavg, totalmem } from 'node:os';

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

/** A fresh session id: sortable by admission time, unguessable. */
export function newSessionId(nowMs = Date.now()): string {
  return `s-${nowMs.toString(36).padStart(9, '0')}-${randomBytes(6).toString('hex')}`;
}

export class Supervisor {
  private readonly sessions = new Map<string, Session>();
  private readonly byKey = new Map<string, Session>();
  private stopping: Promise<void> | null = null;
  /** True until reconciliation has looked at every session left unknown by a restart. */
  private reconciling = false;
  readonly ctx: SessionContext;
  private readonly keys: KeyIndex;

  private constructor(readonly config: Config, readonly log: Logger, ctx: SessionContext) {
    this.ctx = ctx;
    this.keys = new KeyIndex(config.stateDir);
    this.restore();
  }

  /**
   * Loads every session in the state dir: with a receipt it is ended; without one it is
   * unknown until reconcile(). Files that cannot be read make only their own session
   * unknown (with the reason) and never stop start-up. Keys are indexed from the key files
   * and, for a crash between the admission and key writes, from the admission records.
   */
  private restore(): void {
    const keyOf = new Map<string, string>();
    const { records, errors } = this.keys.load();
    for (const e of errors) this.log.error(e, 'unreadable key record');
    for (const r of records) keyOf.set(r.session_id, r.invocation_key);
    for (const sessionId of sessionDirs(this.ctx.sessionsDir)) {
      const dir = join(this.ctx.sessionsDir, sessionId);
      let session: Session;
      try {
        const admission = readAdmission(dir);
        let receipt = null;
        try {
          receipt = readReceipt(dir);
        } catch (err) {
          throw new Error(`receipt is unreadable: ${(err as Error).message}`);
        }
        session = Session.restore(admission, receipt, this.ctx);
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
      if (!this.byKey.has(r.invocation_key)) {
        this.register(Session.broken(r.session_id, r.invocation_key, 'the session\'s files are gone; its key stays used', this.ctx));
      }
    }
    const unknown = [...this.sessions.values()].filter((s) => s.state === 'unknown').length;
    this.reconciling = unknown > 0;
    this.log.info({ sessions: this.sessions.size, unknown }, 'state restored');
  }

  private register(session: Session): void {
    this.sessions.set(session.id, session);
    this.byKey.set(session.req.invocationKey, session);
  }

  /**
   * Settles every unknown session with evidence where there is some (owner_lost receipts);
   * until it has looked at each, new keys get ADMISSION_DENIED (retryable).
   */
  async reconcile(): Promise<void> {
    const unknown = [...this.sessions.values()].filter((s) => s.state === 'unknown');
    await Promise.all(
      unknown.map((s) =>
        s.reconcile().catch((err: Error) => {
          s.unknownReason = `reconciliation failed: ${err.message}`;
          this.log.error({ err, session_id: s.id }, 'reconciliation failed; the session stays unknown');
        }),
      ),
    );
    this.reconciling = false;
    const left = unknown.filter((s) => s.state === 'unknown').length;
    this.log.info({ reconciled: unknown.length - left, still_unknown: left }, 'reconciliation done');
  }

  /** Ends an unknown session on an operator's word (never automatic). */
  async resolve(selector: SessionSelector, operator: OperatorAttestation) {
    const session = this.find(selector);
    if (session.state !== 'unknown') {
      throw new SupervisorError('INVALID_ARGUMENT', `session ${session.id} is ${session.state}; only an unknown session can be resolved by an operator`);
    }
    this.log.warn({ session_id: session.id, operator }, 'operator attested the end of an unknown session');
    return session.resolveAsOperator(operator);
  }

  /** Prepares the state dir, identity, subreaper and cgroup subtree; throws with a reason. */
  static create(config: Config, log: Logger): Supervisor {
    mkdirSync(config.stateDir, { recursive: true, mode: 0o700 });
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
    writeFileDurable(identityPath, JSON.stringify({ instance, generation }) + '\n');

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
    const ctx: SessionContext = {
      config,
      log,
      reaper,
      tree,
      sessionsDir,
      identity: { instance, generation, bootId: readBootId(), mode, pid: process.pid },
      signer: ReceiptSigner.loadOrCreate(config.stateDir),
    };
    log.info({ instance, generation, mode, cgroup: tree?.basePath ?? null, subreaper: native().isChildSubreaper() }, 'supervisor ready');
    return new Supervisor(config, log, ctx);
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
    const live = this.liveSessions();
    if (live >= this.config.session.maxSessions) {
      throw new SupervisorError('LIMIT_EXCEEDED', `${live} sessions are running, the limit is ${this.config.session.maxSessions}`, {
        limit: 'sessions',
        max: this.config.session.maxSessions,
        retry_after_ms: 1000,
      });
    }
    if (this.reconciling) {
      throw new SupervisorError('ADMISSION_DENIED', 'reconciling sessions left by a restart; retry shortly', { retry_after_ms: 250 });
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
    session.start();
    this.log.info({ session_id: session.id, invocation_key: key, argv: params.argv, pid: session.pid }, 'session launched');
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
      throw new SupervisorError('SESSION_NOT_FOUND', `no ${what}`);
    }
    return session;
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

  status(socketPath: string): StatusResult {
    const counts: Record<string, number> = {};
    for (const s of this.sessions.values()) counts[s.state] = (counts[s.state] ?? 0) + 1;
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
    };
  }

  /** Stops admission, terminates every session (cause shutdown), waits for every receipt. */
  shutdown(): Promise<void> {
    this.stopping ??= (async () => {
      const live = [...this.sessions.values()].filter((s) => s.state !== 'ended' && s.state !== 'unknown');
      this.log.info({ sessions: live.length }, 'shutting down: terminating sessions');
      await Promise.all(live.map((s) => s.terminate('shutdown')));
      await Promise.all(live.map((s) => s.ended));
      this.ctx.reaper.reapNow();
      this.ctx.reaper.stop();
      this.ctx.tree?.teardown();
    })();
    return this.stopping;
  }
}
