// Restoring the registry at start: every session dir read back into a recovered session: ended (its receipt,
// checked: shape, session, signature; or one a crash left in its reservation, published now), unknown until
// reconciliation, or broken (files unreadable: unknown with the reason, its key blocked). An admission a
// crash cut before it committed is removed. Torn or corrupt files never stop start-up. See
// docs/reference/state-dir.md.
import { existsSync, readdirSync, rmdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import type { Receipt } from '../ipc/protocol.js';
import { isRetiringDirName, keyRecordName } from '../core/state/names.js';
import { storedChunks } from '../core/state/stream-files.js';
import { verifySignature } from '../core/receipts/verify.js';
import { CgroupLeaf } from './cgroup.js';
import type { Retention } from './retention.js';
import type { SessionContext } from './session/context.js';
import { RecoveredSession } from './session/recovered.js';
import type { Session } from './session/session.js';
import { fsyncDir } from '../core/fs/durable.js';
import { promoteReservedReceipt, readReceipt, readReserved, receiptFromFacts, tidySessionDir } from './store/receipt-file.js';
import { onlyUncommittedAdmission, readAdmission, sessionDirs, type AdmissionRecord, type KeyIndex } from './store/records.js';

/**
 * Loads every session in the state dir: with a receipt it is ended; without one it is
 * unknown until reconcile(). Files that cannot be read make only their own session
 * unknown (with the reason) and never stop start-up. Keys are indexed from the key files
 * and, for a crash between the admission and key writes, from the admission records.
 * Restore order: tombstones and interrupted retirements, key records, then each session.
 */
export function restoreSessions(ctx: SessionContext, keys: KeyIndex, retention: Retention): Session[] {
  const log = ctx.log;
  const sessions: Session[] = [];
  const byKey = new Set<string>();
  const register = (session: Session) => {
    sessions.push(session);
    byKey.add(session.req.invocationKey);
  };
  const names = readdirSync(ctx.sessionsDir);
  for (const name of names) {
    if (isRetiringDirName(name)) rmSync(join(ctx.sessionsDir, name), { recursive: true, force: true });
  }
  retention.restore(names.filter((n) => !n.startsWith('.')));
  const keyOf = new Map<string, string>();
  const { records, errors } = keys.load();
  // An empty one is what a crash leaves of a key record written without an fsync (a launch's):
  // not an error, rebuilt below (its session named it in its admission record).
  for (const e of errors) {
    if (e.empty) log.info({ file: e.file }, 'a key record a crash left empty');
    else log.error({ file: e.file, reason: e.reason }, 'unreadable key record');
  }
  for (const r of records) keyOf.set(r.session_id, r.invocation_key);
  // Key record files that could not be read: each still blocks its key (the name is the key's
  // hash); one whose session's admission record names its key is rebuilt from that record.
  const unreadableKeyFiles = new Map(errors.map((e) => [e.file, e.empty]));
  for (const sessionId of sessionDirs(ctx.sessionsDir)) {
    const dir = join(ctx.sessionsDir, sessionId);
    if (!keyOf.has(sessionId) && onlyUncommittedAdmission(dir) && discardUncommittedAdmission(ctx, sessionId)) continue;
    let session: Session;
    try {
      const admission = readAdmission(dir);
      let receipt: Receipt | null = null;
      let resumed: Receipt | null = null;
      try {
        receipt = readReceipt(dir, sessionId);
      } catch (err) {
        throw new Error(`receipt is unreadable: ${(err as Error).message}`);
      }
      // Signed by this supervisor's key and not matching: changed since (a receipt signed by
      // an earlier key, or unsigned from before signing, cannot be checked here: kept).
      if (receipt?.signature?.key_id === ctx.signer.keyId) {
        const problems = verifySignature(receipt, ctx.signer.publicKeyPem);
        if (problems.length) throw new Error(`receipt does not verify: ${problems.join('; ')}`);
      }
      if (!receipt) {
        const adopted = adoptReserved(ctx, dir, admission);
        if (adopted?.published) receipt = adopted.receipt;
        else if (adopted) resumed = adopted.receipt;
      }
      try {
        tidySessionDir(dir, receipt !== null);
      } catch (err) {
        log.warn({ err, session_id: sessionId }, 'could not tidy a session dir');
      }
      const recovered = RecoveredSession.fromRecords(admission, receipt, ctx);
      if (resumed) recovered.resumeReceipt(resumed);
      session = recovered;
      if (!keyOf.has(sessionId)) {
        const record = {
          invocation_key: admission.invocation_key,
          session_id: sessionId,
          command_digest: admission.command_digest,
          admitted_at: admission.admitted_at,
        };
        try {
          const file = keyRecordName(record.invocation_key);
          const empty = unreadableKeyFiles.get(file);
          if (empty !== undefined) {
            unreadableKeyFiles.delete(file);
            keys.rebuild(record, empty);
            if (empty) log.info({ session_id: sessionId, file }, "rebuilt a key record a crash left empty from its session's admission record");
            else
              log.warn({ session_id: sessionId, file }, "rebuilt an unreadable key record from its session's admission record (the unreadable one kept aside)");
          } else {
            // Lost to a crash (a launch writes it without an fsync): written again the same way.
            keys.writeAfterAdmission(record);
          }
        } catch (err) {
          // The session is readable and keeps its key in memory; the next start tries again.
          log.error({ err, session_id: sessionId }, 'could not write the key record of a restored session');
        }
      }
    } catch (err) {
      const reason = `state files unreadable: ${(err as Error).message}`;
      // Its receipt, readable and signed by this supervisor (an operator's word on a session
      // whose admission record is torn, say), still ends it: its end was proven once, for good.
      const receipt = ownReceipt(ctx, dir, sessionId);
      if (receipt) log.error({ session_id: sessionId, reason }, 'session files are torn or corrupt; the session is ended (its signed receipt is readable)');
      else log.error({ session_id: sessionId, reason }, 'session files are torn or corrupt; the session is unknown');
      session = RecoveredSession.broken(sessionId, keyOf.get(sessionId) ?? `unreadable-${sessionId}`, reason, ctx, receipt);
    }
    register(session);
  }
  // A key whose session is gone from disk still can never run again. A record naming a session
  // that is there under another key (corrupt: no crash writes it) does not replace that session:
  // its key stays blocked by the record itself (a launch with it meets EEXIST: KEY_CONFLICT).
  const ids = new Set(sessions.map((x) => x.id));
  for (const r of records) {
    if (ids.has(r.session_id) && !byKey.has(r.invocation_key)) {
      log.error({ session_id: r.session_id, invocation_key: r.invocation_key }, 'a key record names a session of another key; ignored (its key stays used)');
      continue;
    }
    if (!byKey.has(r.invocation_key) && !retention.tombstone({ invocationKey: r.invocation_key })) {
      register(RecoveredSession.broken(r.session_id, r.invocation_key, "the session's files are gone; its key stays used", ctx));
    }
  }
  return sessions;
}

/** The session's receipt if it is readable and verifies under this supervisor's key, else null. */
function ownReceipt(ctx: SessionContext, dir: string, sessionId: string): Receipt | null {
  try {
    const receipt = readReceipt(dir, sessionId);
    return receipt && receipt.signature?.key_id === ctx.signer.keyId && verifySignature(receipt, ctx.signer.publicKeyPem).length === 0 ? receipt : null;
  } catch {
    return null;
  }
}

/**
 * A session dir holding no admission record, only its temp file or nothing, is an
 * admission a crash interrupted before it committed: nothing was spawned (the spawn comes
 * after the fsync'ed record) and the key was not taken (its record comes after too). The
 * dir and its empty leaf go. A populated leaf (never by construction) is kept as a broken
 * session, whose processes reconciliation ends. Returns whether it was discarded.
 */
function discardUncommittedAdmission(ctx: SessionContext, sessionId: string): boolean {
  const log = ctx.log;
  const leaf = ctx.tree ? new CgroupLeaf(join(ctx.tree.sessionsPath, sessionId)) : null;
  if (leaf?.populated()) return false;
  try {
    if (leaf && existsSync(leaf.path)) rmdirSync(leaf.path);
    rmSync(join(ctx.sessionsDir, sessionId), { recursive: true, force: true });
    fsyncDir(ctx.sessionsDir);
  } catch (err) {
    log.warn({ err, session_id: sessionId }, 'could not remove an admission that never committed');
    return false;
  }
  log.info({ session_id: sessionId }, 'removed an admission a crash interrupted before it committed (nothing ran, no key was taken)');
  return true;
}

/**
 * What a crash left in a session's reservation, if it carries our signature: a whole
 * receipt written and fsync'ed but not yet linked (linked into place now: published), or
 * the facts record of a receipt the disk had no room for (rebuilt from the admission record
 * and the chunk files; it is written once there is room). Null: nothing usable there.
 */
function adoptReserved(ctx: SessionContext, dir: string, admission: AdmissionRecord): { receipt: Receipt; published: boolean } | null {
  const log = ctx.log;
  const sessionId = admission.session_id;
  const found = readReserved(dir, sessionId);
  if (!found) return null;
  const record = found.kind === 'receipt' ? found.receipt : found.facts;
  const problems = verifySignature(record, ctx.signer.publicKeyPem);
  if (problems.length) {
    log.warn({ session_id: sessionId, problems }, 'the receipt reservation holds a record that does not verify; ignored');
    return null;
  }
  if (found.kind === 'facts') {
    const rebuilt = receiptFromFacts(found.facts, admission, (stream) => storedChunks(dir, stream as 'stdout', admission.chunk_bytes));
    if (!rebuilt) {
      log.warn({ session_id: sessionId }, 'the receipt facts in the reservation no longer match the chunk files; ignored');
      return null;
    }
    log.info({ session_id: sessionId }, 'rebuilt a receipt from the facts a crash left in its reservation');
    return { receipt: ctx.signer.sign(rebuilt), published: false };
  }
  try {
    promoteReservedReceipt(dir);
    log.info({ session_id: sessionId }, 'published a receipt a crash left in its reservation');
  } catch (err) {
    // Durable under its reservation's name all the same: written into place by the session.
    log.warn({ err, session_id: sessionId }, 'could not link a receipt found in its reservation');
    return { receipt: found.receipt, published: false };
  }
  return { receipt: found.receipt, published: true };
}
