// Who this supervisor is: one per state dir (an exclusive flock on supervisor.lock), its
// instance id and durable generation (supervisor.json, +1 at every start, never backwards:
// a torn one is recovered past every admission record), the boot id, and fresh session ids.
// Owns those records; not the sessions. See flock(2), random(4) (boot_id), rename(2).
import { randomBytes } from 'node:crypto';
import { closeSync, constants, existsSync, fsyncSync, ftruncateSync, openSync, readFileSync, renameSync, statSync, writeSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import type { Logger } from 'pino';
import { readRecord } from '../core/state/records.js';
import { STATE, unreadableName } from '../core/state/names.js';
import { native } from '../core/fs/native.js';
import { writeFileDurable } from '../core/fs/durable.js';
import { readAdmission, sessionDirs } from './store/records.js';
import { errnoCode } from '../ipc/errno.js';

/** Reads /proc/sys/kernel/random/boot_id: changes on every boot. */
export function readBootId(): string {
  return readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
}

/** A fresh session id: sortable by admission time, unguessable. */
export function newSessionId(nowMs = Date.now()): string {
  return `s-${nowMs.toString(36).padStart(9, '0')}-${randomBytes(6).toString('hex')}`;
}

/** The open lock file of a state dir: held (flock) as long as this process runs (and its fd stays open). */
export class StateDirLock {
  private constructor(
    readonly path: string,
    readonly fd: number,
  ) {}

  /**
   * One supervisor per state dir: an exclusive flock(2) on <state>/supervisor.lock, which
   * holds the owner's pid. A second one would reconcile the first one's live sessions as
   * owner_lost; it gets an Error naming the holder.
   */
  static take(stateDir: string): StateDirLock {
    const path = join(stateDir, STATE.lock);
    const fd = openSync(path, constants.O_RDWR | constants.O_CREAT | constants.O_NOFOLLOW, 0o600);
    if (!native().tryLockExclusive(fd)) {
      const holder = readFileSync(path, 'utf8').trim();
      closeSync(fd);
      throw new Error(
        `the state dir ${stateDir} is in use by another supervisor (pid ${holder || 'unknown'}); stop it first, or give this one its own stateDir`,
      );
    }
    // In place, then truncated: on a full file system a truncate first would free the block
    // the write then cannot get back. The pid is for people; the flock is what counts.
    const pid = Buffer.from(`${process.pid}\n`);
    try {
      writeSync(fd, pid, 0, pid.length, 0);
      ftruncateSync(fd, pid.length);
    } catch (err) {
      if (errnoCode(err) !== 'ENOSPC' && errnoCode(err) !== 'EDQUOT') throw err;
    }
    return new StateDirLock(path, fd);
  }
}

/** Bytes an identity record is padded to, so it can be rewritten in place (one sector). */
const IDENTITY_BYTES = 128;

/** The highest generation named by any readable admission record (0 if none). */
function highestAdmittedGeneration(sessionsDir: string): number {
  let highest = 0;
  for (const id of sessionDirs(sessionsDir)) {
    try {
      highest = Math.max(highest, readAdmission(join(sessionsDir, id)).generation);
    } catch {
      // torn: skipped here, reported by the registry's restore
    }
  }
  return highest;
}

/**
 * Writes supervisor.json durably: a new file renamed over the old one; on a full file system
 * (ENOSPC: no block for the new file) the old one is rewritten in place instead, within its
 * own padded block (one sector write, fsync'ed), so a start on a full disk still takes a new
 * generation. A torn identity is recovered at the next start.
 */
function writeIdentity(path: string, identity: { instance: string; generation: number }): void {
  const data = JSON.stringify(identity).padEnd(IDENTITY_BYTES - 1, ' ') + '\n';
  try {
    writeFileDurable(path, data);
  } catch (err) {
    const code = errnoCode(err);
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

/**
 * This start's identity: the instance from supervisor.json (a new one at first start) and
 * its generation + 1, written durably before anything is admitted. A torn supervisor.json is
 * kept aside and the generation recovered past every admission record (it only goes up).
 */
export function takeGeneration(stateDir: string, sessionsDir: string, log: Logger): { instance: string; generation: number } {
  const path = join(stateDir, STATE.identity);
  let instance = randomBytes(8).toString('hex');
  let generation = 0;
  if (existsSync(path)) {
    try {
      ({ instance, generation } = readRecord('identity', path));
    } catch (err) {
      renameSync(path, join(dirname(path), unreadableName(basename(path), Date.now())));
      generation = highestAdmittedGeneration(sessionsDir);
      log.error({ err, generation }, 'supervisor.json was unreadable; kept aside, generation recovered from admission records');
    }
  }
  generation += 1;
  writeIdentity(path, { instance, generation });
  return { instance, generation };
}
