// The sessions held: by id and by invocation key, found by id prefix as docker finds container
// ids (3+ characters; an ambiguous prefix is INVALID_ARGUMENT). Shared by the registry (which
// adds), retention (which forgets what it retired), the task close and status (which read).
import { SupervisorError } from '../ipc/errors.js';
import type { Session } from './session/session.js';

/** The shortest session id prefix find() resolves (a shorter one must be the exact id): 3 characters, as `s-` starts every id. */
const MIN_ID_PREFIX = 3;

/** At most this many ids in an ambiguous prefix's details.matches (details.count has them all). */
const MAX_PREFIX_MATCHES = 100;

export class SessionTable {
  private readonly byId = new Map<string, Session>();
  private readonly byKeyMap = new Map<string, Session>();

  /** Holds session by its id and its invocation key (a later one with the same key replaces the earlier: restore keeps one per key). */
  add(session: Session): void {
    this.byId.set(session.id, session);
    this.byKeyMap.set(session.req.invocationKey, session);
  }

  /** Lets go of a session (retention retired it whole); its key then answers from the tombstone. */
  forget(session: Session): void {
    this.byId.delete(session.id);
    if (this.byKeyMap.get(session.req.invocationKey) === session) this.byKeyMap.delete(session.req.invocationKey);
  }

  get(id: string): Session | undefined {
    return this.byId.get(id);
  }

  byKey(key: string): Session | undefined {
    return this.byKeyMap.get(key);
  }

  get size(): number {
    return this.byId.size;
  }

  /** Every session held, in the order added. */
  all(): IterableIterator<Session> {
    return this.byId.values();
  }

  /** Sessions not ended (unknown ones included: they may still run), against session.maxSessions. */
  liveCount(): number {
    let n = 0;
    for (const s of this.byId.values()) if (s.state !== 'ended') n++;
    return n;
  }

  /**
   * The session of this exact id, else the one session whose id starts with it (MIN_ID_PREFIX+
   * characters); undefined when none. INVALID_ARGUMENT when the prefix names several, details
   * {field, prefix, matches: [ids, sorted, at most 100], count}.
   */
  byIdOrPrefix(id: string): Session | undefined {
    return byIdOrPrefix(this.byId, id);
  }
}

/**
 * The entry of this exact session id in byId, else the one whose id starts with it
 * (MIN_ID_PREFIX+ characters); undefined when none. INVALID_ARGUMENT when the prefix names
 * several, details {field, prefix, matches: [ids, sorted, at most 100], count}. The session
 * table's lookup, and retention's of its tombstones.
 */
export function byIdOrPrefix<T>(byId: ReadonlyMap<string, T>, id: string): T | undefined {
  const exact = byId.get(id);
  if (exact || id.length < MIN_ID_PREFIX) return exact;
  const ids: string[] = [];
  for (const sid of byId.keys()) if (sid.startsWith(id)) ids.push(sid);
  if (ids.length <= 1) return ids.length ? byId.get(ids[0]!) : undefined;
  ids.sort();
  const shown = ids.length > 10 ? `${ids.slice(0, 10).join(', ')}, ... (${ids.length} in all)` : ids.join(', ');
  throw new SupervisorError('INVALID_ARGUMENT', `session id prefix ${JSON.stringify(id)} is ambiguous: it matches ${shown}; give more of the id`, {
    field: 'session_id',
    prefix: id,
    matches: ids.slice(0, MAX_PREFIX_MATCHES),
    count: ids.length,
  });
}
