// Session users (`sbx run --user NAME|UID`, config session.user): resolved from /etc/passwd
// (passwd(5)); the exec shim takes uid/gid and the name for initgroups(3). Users known only
// to other NSS sources (LDAP) are not looked up here: give a numeric uid for those.
import { readFileSync } from 'node:fs';
import { SupervisorError } from '../ipc/errors.js';

export interface SessionUser {
  uid: number;
  gid: number;
  /** Login name when /etc/passwd has one (for initgroups and USER/LOGNAME). */
  name: string | null;
  home: string;
}

/** Entries of a passwd(5) file's text. */
export function parsePasswd(text: string): SessionUser[] {
  const out: SessionUser[] = [];
  for (const line of text.split('\n')) {
    const f = line.split(':');
    if (f.length < 7 || line.startsWith('#')) continue;
    out.push({ name: f[0], uid: Number(f[2]), gid: Number(f[3]), home: f[5] || '/' });
  }
  return out;
}

/**
 * A user by name or numeric uid. A uid without a passwd entry runs with gid = uid, no
 * supplementary groups and HOME=/. An unknown name is INVALID_ARGUMENT.
 */
export function lookupUser(spec: string, passwd = readFileSync('/etc/passwd', 'utf8')): SessionUser {
  const entries = parsePasswd(passwd);
  if (/^\d+$/.test(spec)) {
    const uid = Number(spec);
    if (!Number.isSafeInteger(uid) || uid > 0xfffffffe) throw new SupervisorError('INVALID_ARGUMENT', `user: uid ${spec} is out of range`, { field: 'user' });
    return entries.find((e) => e.uid === uid) ?? { uid, gid: uid, name: null, home: '/' };
  }
  const entry = entries.find((e) => e.name === spec);
  if (!entry) throw new SupervisorError('INVALID_ARGUMENT', `user: no user named ${JSON.stringify(spec)} in /etc/passwd`, { field: 'user' });
  return entry;
}
