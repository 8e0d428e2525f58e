// supervisor/users.ts: users and groups through NSS (the native getpwnam_r/getgrnam_r), checked
// against getent(1), which asks NSS the same questions, and the errors for what is not there.
import { execFileSync, spawnSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { lookupGroup, lookupUser } from '../../../supervisor/users.js';

/** getent's entries of a database: each line split on ':'. */
const getent = (db: 'passwd' | 'group', key?: string) =>
  execFileSync('getent', key === undefined ? [db] : [db, key])
    .toString()
    .trim()
    .split('\n')
    .map((l) => l.split(':'));

/** A uid or gid with no entry in NSS (getent exits 2: "not found"). */
function unusedId(db: 'passwd' | 'group'): number {
  for (let id = 4_000_000_123; ; id++) if (spawnSync('getent', [db, String(id)]).status === 2) return id;
}

describe('lookupUser', () => {
  it('finds every user NSS lists, by name, as getent does', () => {
    const entries = getent('passwd');
    expect(entries.length).toBeGreaterThan(1);
    for (const [name, , uid, gid, , home] of entries) {
      expect(lookupUser(name)).toEqual({ name, uid: Number(uid), gid: Number(gid), home: home || '/' });
    }
  });

  it('takes digits as a uid: the entry when there is one, else gid = uid, no name, HOME=/', () => {
    const [name, , uid, gid, , home] = getent('passwd', '65534')[0];
    expect(lookupUser('65534')).toEqual({ name, uid: Number(uid), gid: Number(gid), home });
    expect(lookupUser('0')).toMatchObject({ name: 'root', uid: 0, gid: 0 });
    const free = unusedId('passwd');
    expect(lookupUser(String(free))).toEqual({ uid: free, gid: free, name: null, home: '/' });
  });

  it('refuses an unknown name, a NUL and an out-of-range uid with INVALID_ARGUMENT naming the field', () => {
    expect(() => lookupUser('no-such-user-here')).toThrow(
      expect.objectContaining({
        code: 'INVALID_ARGUMENT',
        message: 'user: no user named "no-such-user-here" in the user database (passwd)',
        details: { field: 'user' },
      }),
    );
    expect(() => lookupUser('root\0x')).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT', details: { field: 'user' } }));
    for (const spec of ['4294967295', '99999999999999999999']) {
      expect(() => lookupUser(spec)).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT', message: `user: uid ${spec} is out of range` }));
    }
  });
});

describe('lookupGroup', () => {
  it('finds every group NSS lists, by name, as getent does', () => {
    const entries = getent('group');
    expect(entries.length).toBeGreaterThan(1);
    for (const [name, , gid] of entries) expect(lookupGroup(name)).toBe(Number(gid));
  });

  it('takes a number or digits as the gid itself, entry or not (as chown does)', () => {
    const free = unusedId('group');
    expect(lookupGroup(free)).toBe(free);
    expect(lookupGroup(String(free))).toBe(free);
    expect(lookupGroup('0')).toBe(0);
  });

  it('refuses an unknown name and a bad gid with INVALID_ARGUMENT naming the field given', () => {
    expect(() => lookupGroup('no-such-group-here', 'ipc.socketGroup')).toThrow(
      expect.objectContaining({
        code: 'INVALID_ARGUMENT',
        message: 'ipc.socketGroup: no group named "no-such-group-here" in the group database (group)',
        details: { field: 'ipc.socketGroup' },
      }),
    );
    for (const gid of [-1, 1.5, 4294967295]) {
      expect(() => lookupGroup(gid)).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT', message: `group: gid ${gid} is out of range` }));
    }
    expect(() => lookupGroup('root\0')).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT', details: { field: 'group' } }));
  });
});
