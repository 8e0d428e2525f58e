// The hand-off of a command's leftovers to a service (linger handoff): at the leader's exit,
// every process still in the command's leaf is frozen, moved into the service's frozen leaf,
// the pipes they hold are split at that instant (what was written before is the command's,
// what comes after the service's), and the service is thawed. Frozen, no process forks or
// writes during the move, so none escapes it and none is counted twice (cgroup-v2.rst, "cgroup.freeze").
import type { Logger } from 'pino';
import type { HandoffFacts, StreamName } from '../../ipc/protocol.js';
import type { CgroupLeaf } from '../cgroup.js';
import type { StreamDrain } from './drain.js';
import type { LiveSession } from './live.js';

/** How long the freeze may take before the move goes on anyway (a process in an uninterruptible sleep freezes when it wakes: moved into a frozen leaf, it stops there). */
export const FREEZE_WAIT_MS = 2000;

/**
 * Hands the processes left in `leaf` on to a new service (`admit`: the registry's, admitted
 * and frozen, not started). Returns what was handed off, or null when nothing was: every
 * leftover exited before the freeze took (then nothing is admitted), or the service could not
 * be admitted or the move failed (logged; what is still in `leaf` is thawed there, for the
 * caller to end as linger kill). The command's drains end at the split (drain_end handoff).
 */
export async function handOffLeftovers(o: {
  originId: string;
  leaf: CgroupLeaf;
  drains: ReadonlyMap<StreamName, StreamDrain>;
  admit: () => LiveSession;
  log: Logger;
}): Promise<HandoffFacts | null> {
  const { leaf, log } = o;
  leaf.freeze(true);
  try {
    if (!(await leaf.waitFrozen(FREEZE_WAIT_MS)))
      log.warn({ session_id: o.originId, wait_ms: FREEZE_WAIT_MS }, 'handoff: the leftovers did not all freeze in time; moving them anyway');
    if (leaf.pids().length === 0) return null;
    let service: LiveSession;
    try {
      service = o.admit();
    } catch (err) {
      log.warn({ session_id: o.originId, err }, 'handoff: no service could be admitted; the leftovers are ended (linger kill)');
      return null;
    }
    let moved: number[] = [];
    try {
      moved = leaf.moveAllTo(service.cgroup!);
    } catch (err) {
      log.error({ session_id: o.originId, service_id: service.id, err }, 'handoff: the move failed; what was not moved is ended (linger kill)');
    }
    // Every writer is frozen (here or in the service's leaf): the pipes are split now.
    const fds: Partial<Record<'stdout' | 'stderr', number>> = {};
    for (const [name, drain] of o.drains) {
      if (name === 'pty') continue;
      const fd = drain.handOff();
      if (fd !== null) fds[name] = fd;
    }
    const at = new Date().toISOString();
    service.startHandedOff(fds);
    log.info({ session_id: o.originId, service_id: service.id, pids: moved.length }, 'leftovers handed off to a service');
    return { service_id: service.id, pids: moved.length, at };
  } finally {
    leaf.freeze(false);
  }
}
