// The state dir's records other than the receipt's bytes (docs/reference/state-dir.md): admission records,
// the invocation-key index (one file per key, named by the key's SHA-256, never removed: a key
// runs at most once, ever), the started record, tombstones, and the session dirs. Owns
// reading and writing them, each parsed with its schema (core/state/records.ts); a torn or
// corrupt file is an Error for the caller to make its session unknown.
import { constants, existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, unlinkSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { basename, join } from 'node:path';
import {
  parseRecord,
  readRecord,
  type AdmissionRecord,
  type EscapeAttestedRecord,
  type KeyRecord,
  type StartedRecord,
  type TombstoneRecord,
} from '../../core/state/records.js';
import {
  ADMISSION_FILE,
  ESCAPE_ATTESTED_FILE,
  isTempFileName,
  keyRecordName,
  retiringDirName,
  STARTED_FILE,
  STATE,
  tombstoneName,
  unreadableName,
} from '../../core/state/names.js';
import { createFileDurable, createFileUnsynced, fsyncDir, writeFileUnsynced } from '../../core/fs/durable.js';

export type { AdmissionRecord, EscapeAttestedRecord, KeyRecord, StartedRecord, TombstoneRecord } from '../../core/state/records.js';

/** Reads and checks <sessionDir>/admission.json; throws with the reason when torn or corrupt. */
export function readAdmission(sessionDir: string): AdmissionRecord {
  try {
    return readRecord('admission', join(sessionDir, ADMISSION_FILE));
  } catch (err) {
    throw new Error(`admission record is unreadable: ${(err as Error).message}`);
  }
}

/** Writes the admission record once, durably (before anything runs: docs/design/facts.md 9). */
export function writeAdmission(sessionDir: string, record: AdmissionRecord): void {
  createFileDurable(join(sessionDir, ADMISSION_FILE), JSON.stringify(record) + '\n');
}

/** What a session dir holds when its admission was never committed: nothing, or only temp files. */
export function onlyUncommittedAdmission(sessionDir: string): boolean {
  return readdirSync(sessionDir).every((name) => isTempFileName(name, ADMISSION_FILE));
}

/**
 * Writes <session>/started.json once the exec is reported (O_EXCL|O_NOFOLLOW; not fsync'ed),
 * on the threadpool: the event loop goes on (a short command's exit is handled meanwhile).
 * Rejects with the open or write error.
 */
export async function writeStarted(sessionDir: string, record: StartedRecord): Promise<void> {
  const file = await open(join(sessionDir, STARTED_FILE), constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
  try {
    await file.writeFile(JSON.stringify(record) + '\n');
  } finally {
    await file.close();
  }
}

/** Writes <session>/escape-attested.json once, durably (EEXIST: attested already). */
export function writeEscapeAttested(sessionDir: string, record: EscapeAttestedRecord): void {
  createFileDurable(join(sessionDir, ESCAPE_ATTESTED_FILE), JSON.stringify(record) + '\n');
}

/** The escape attestation if one is there and whole; null when absent (a torn one throws: the caller says so). */
export function readEscapeAttested(sessionDir: string): EscapeAttestedRecord | null {
  if (!existsSync(join(sessionDir, ESCAPE_ATTESTED_FILE))) return null;
  return readRecord('escapeAttested', join(sessionDir, ESCAPE_ATTESTED_FILE));
}

/** The started record if one is there and whole; null otherwise (torn, absent). */
export function readStarted(sessionDir: string): StartedRecord | null {
  try {
    return readRecord('started', join(sessionDir, STARTED_FILE));
  } catch {
    return null;
  }
}

/** The key index: <state>/keys/<sha256(key)>.json; the key itself is never a path. */
export class KeyIndex {
  readonly dir: string;

  constructor(stateDir: string) {
    this.dir = join(stateDir, STATE.keysDir);
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
  }

  /** Durably records that key belongs to a session. */
  write(record: KeyRecord): void {
    createFileDurable(join(this.dir, keyRecordName(record.invocation_key)), JSON.stringify(record) + '\n');
  }

  /**
   * Records that key belongs to a session admitted just now, before its spawn, without an
   * fsync: its admission record, durable already, names the key, and a start rebuilds a key
   * record lost or torn by a crash from it (restore.ts). So a launch makes one durable record,
   * and no command runs unrecorded. EEXIST when the key has a record (one the start found
   * unreadable: the key may have run).
   */
  writeAfterAdmission(record: KeyRecord): void {
    createFileUnsynced(join(this.dir, keyRecordName(record.invocation_key)), JSON.stringify(record) + '\n');
  }

  /**
   * Replaces an unreadable key record (one of load()'s errors) with record, rebuilt from its
   * session's admission record. An empty one (what a crash leaves of a record written without
   * an fsync: writeAfterAdmission) holds nothing to keep: it is replaced in place, no more
   * durably than a launch writes it. Any other unreadable bytes are kept aside
   * (unreadableName), never removed; a crash between the two steps leaves no record, which
   * the next start rebuilds the same way. Throws the fs error.
   */
  rebuild(record: KeyRecord, empty = false): void {
    const path = join(this.dir, keyRecordName(record.invocation_key));
    if (empty) {
      writeFileUnsynced(path, JSON.stringify(record) + '\n');
      return;
    }
    renameSync(path, join(this.dir, unreadableName(basename(path), Date.now())));
    fsyncDir(this.dir);
    this.write(record);
  }

  /** Every readable key record; unreadable ones are returned as errors with their file (`empty`: a file of no bytes). */
  load(): { records: KeyRecord[]; errors: { file: string; reason: string; empty: boolean }[] } {
    const records: KeyRecord[] = [];
    const errors: { file: string; reason: string; empty: boolean }[] = [];
    for (const name of readdirSync(this.dir)) {
      // A temp a crash left before its rename: the record is rebuilt from the admission record.
      // One that cannot go (a directory, an immutable file) is left: the start goes on.
      if (isTempFileName(name)) {
        try {
          unlinkSync(join(this.dir, name));
        } catch {
          // Not a file, or not removable: ignored like every other dot name here.
        }
        continue;
      }
      if (!name.endsWith('.json') || name.startsWith('.')) continue;
      try {
        const r = readRecord('key', join(this.dir, name));
        if (keyRecordName(r.invocation_key) !== name) throw new Error(`it names the key of ${keyRecordName(r.invocation_key)}`);
        records.push(r);
      } catch (err) {
        let empty = false;
        try {
          empty = lstatSync(join(this.dir, name)).size === 0;
        } catch {
          // Gone meanwhile: not empty, just unreadable.
        }
        errors.push({ file: name, reason: (err as Error).message, empty });
      }
    }
    return { records, errors };
  }
}

/** Session directory names under <state>/sessions. */
export function sessionDirs(sessionsDir: string): string[] {
  return readdirSync(sessionsDir, { withFileTypes: true })
    .filter((d) => d.isDirectory() && !d.name.startsWith('.'))
    .map((d) => d.name);
}

/**
 * The tombstones in dir, each checked against its shape and its file name; one that fails is
 * returned as an error (its key record still blocks the key: the session shows as unknown).
 */
export function readRetired(dir: string): { records: TombstoneRecord[]; errors: { file: string; reason: string }[] } {
  const records: TombstoneRecord[] = [];
  const errors: { file: string; reason: string }[] = [];
  if (!existsSync(dir)) return { records, errors };
  for (const name of readdirSync(dir)) {
    if (!name.endsWith('.json') || name.startsWith('.')) continue;
    try {
      const r = parseRecord('tombstone', readFileSync(join(dir, name), 'utf8'));
      if (tombstoneName(r.session_id) !== name) throw new Error(`names session ${r.session_id}`);
      records.push(r);
    } catch (err) {
      errors.push({ file: name, reason: (err as Error).message });
    }
  }
  return { records, errors };
}

/** Writes a tombstone once (durably; one left by a crash is kept). */
export function writeRetired(dir: string, record: TombstoneRecord): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const path = join(dir, tombstoneName(record.session_id));
  if (!existsSync(path)) createFileDurable(path, JSON.stringify(record) + '\n');
}

/** Takes a session dir out of sessions/ in one rename (durable), then removes its files. */
export function removeSessionDir(sessionsDir: string, sessionId: string): void {
  const trash = join(sessionsDir, retiringDirName(sessionId));
  renameSync(join(sessionsDir, sessionId), trash);
  fsyncDir(sessionsDir);
  rmSync(trash, { recursive: true, force: true });
}
