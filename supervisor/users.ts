// Users and groups by name or number: session users (`sbx run --user NAME|UID`, config
// session.user) and the socket's group (ipc.socketGroup). Looked up once, through the C
// library (native userByName/userById/groupByName), so every NSS source counts (files, LDAP,
// systemd-userdb), as for the exec shim's initgroups(3). See getpwnam_r(3), nsswitch.conf(5).
// Owns the lookup and its errors; not dropping privileges (the exec shim does that).
import { SupervisorError } from '../ipc/errors.js';
import { native } from '../core/fs/native.js';
import { errnoCode, systemError } from '../ipc/errno.js';

export interface SessionUser {
  uid: number;
  gid: number;
  /** Login name when the user database has one (for initgroups and USER/LOGNAME). */
  name: string | null;
  home: string;
}

/** Largest id a uid_t/gid_t may name ((uid_t)-1 means "no change" to setuid and chown). */
const MAX_ID = 0xfffffffe;

/** Whether a native lookup error means "no such entry" (ENOENT), not a failed lookup. */
const noEntry = (err: unknown) => errnoCode(err) === 'ENOENT';

/** Lookup errors that say "not now": out of fds or memory (getpwnam_r(3) ERRORS); the lookup may work once they come back. */
const RESOURCE_ERRORS = new Set(['EMFILE', 'ENFILE', 'ENOMEM', 'EAGAIN']);

/**
 * A failed lookup, naming what was looked up and why: out of a resource (EMFILE, ENFILE,
 * ENOMEM, EAGAIN) is ADMISSION_DENIED, retryable, as the admission record's own failures;
 * anything else (NSS unreachable) INTERNAL.
 */
function lookupFailed(field: string, what: string, err: unknown): SupervisorError {
  const e = systemError(err);
  const text = `${field}: looking up ${what} failed: ${e.message}`;
  if (e.code && RESOURCE_ERRORS.has(e.code)) return new SupervisorError('ADMISSION_DENIED', text, { field, code: e.code, retry_after_ms: 1000 });
  return new SupervisorError('INTERNAL', text, { field, code: e.code });
}

/** A decimal id ("65534") as a number, range-checked; null when spec is not all digits. */
function numericId(spec: string, field: string, kind: 'uid' | 'gid'): number | null {
  if (!/^\d+$/.test(spec)) return null;
  const id = Number(spec);
  if (!Number.isSafeInteger(id) || id > MAX_ID) throw new SupervisorError('INVALID_ARGUMENT', `${field}: ${kind} ${spec} is out of range`, { field });
  return id;
}

/**
 * A user by name or numeric uid (getpwnam_r / getpwuid_r). A uid without an entry runs with
 * gid = uid, no supplementary groups and HOME=/. An unknown name is INVALID_ARGUMENT; a lookup
 * that fails (not "no such user") is ADMISSION_DENIED when out of fds or memory, else INTERNAL.
 */
export function lookupUser(spec: string): SessionUser {
  const uid = numericId(spec, 'user', 'uid');
  if (uid !== null) {
    try {
      return fromEntry(native().userById(uid));
    } catch (err) {
      if (noEntry(err)) return { uid, gid: uid, name: null, home: '/' };
      throw lookupFailed('user', `uid ${uid}`, err);
    }
  }
  if (spec.includes('\0')) throw new SupervisorError('INVALID_ARGUMENT', `user: a user name cannot contain NUL`, { field: 'user' });
  try {
    return fromEntry(native().userByName(spec));
  } catch (err) {
    if (noEntry(err))
      throw new SupervisorError('INVALID_ARGUMENT', `user: no user named ${JSON.stringify(spec)} in the user database (passwd)`, { field: 'user' });
    throw lookupFailed('user', JSON.stringify(spec), err);
  }
}

/**
 * A gid by group name or number (getgrnam_r); a number, or a string of digits, is taken as
 * the gid itself, as chown(1) does. An unknown name is INVALID_ARGUMENT naming field.
 */
export function lookupGroup(nameOrGid: string | number, field = 'group'): number {
  if (typeof nameOrGid === 'number') {
    if (!Number.isInteger(nameOrGid) || nameOrGid < 0 || nameOrGid > MAX_ID)
      throw new SupervisorError('INVALID_ARGUMENT', `${field}: gid ${nameOrGid} is out of range`, { field });
    return nameOrGid;
  }
  const gid = numericId(nameOrGid, field, 'gid');
  if (gid !== null) return gid;
  if (nameOrGid.includes('\0')) throw new SupervisorError('INVALID_ARGUMENT', `${field}: a group name cannot contain NUL`, { field });
  try {
    return native().groupByName(nameOrGid);
  } catch (err) {
    if (noEntry(err))
      throw new SupervisorError('INVALID_ARGUMENT', `${field}: no group named ${JSON.stringify(nameOrGid)} in the group database (group)`, { field });
    throw lookupFailed(field, JSON.stringify(nameOrGid), err);
  }
}

function fromEntry(e: { uid: number; gid: number; name: string; home: string }): SessionUser {
  return { uid: e.uid, gid: e.gid, name: e.name, home: e.home || '/' };
}
