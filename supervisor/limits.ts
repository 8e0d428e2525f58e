// Session limits (docs/guide/limits.md): which a launch asks for (its own, else the config's
// session.defaultLimits), whether this host can enforce each (the sessions cgroup's
// controllers), and the refusal when it cannot (LIMIT_UNAVAILABLE, naming the controller and
// why: bound to cgroup v1, disabled, not delegated, or no cgroup at all). Pure decisions over
// facts read by limitHost(); never run without a limit that was asked for.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { SupervisorError } from '../ipc/errors.js';
import type { LimitController, LimitsStatus, SessionLimits } from '../ipc/protocol.js';
import { LIMIT_CONTROLLERS, parseProcCgroups, type CgroupTree } from './cgroup.js';

/** Each limit's controller, its `sbx run` flag and its config default's key, in the order they are checked. */
export const LIMITS = [
  { limit: 'memory_max_bytes', controller: 'memory', flag: '--memory', configKey: 'memoryMaxBytes' },
  { limit: 'pids_max', controller: 'pids', flag: '--pids', configKey: 'pidsMax' },
  { limit: 'cpus', controller: 'cpu', flag: '--cpus', configKey: 'cpus' },
] as const satisfies readonly { limit: keyof SessionLimits; controller: LimitController; flag: string; configKey: string }[];

/** session.defaultLimits (config.ts): each null when unset. */
export interface DefaultLimits {
  memoryMaxBytes: number | null;
  pidsMax: number | null;
  cpus: number | null;
}

/** What the host offers session leaves (read by limitHost; plain data, so the decisions are unit-tested). */
export interface LimitHost {
  /** The sessions cgroup's absolute path; null: no cgroup (subreaper mode). */
  sessionsCgroup: string | null;
  /** Each controller enabled for the leaves (the sessions dir's cgroup.subtree_control). */
  available: Record<LimitController, boolean>;
  /** The sessions dir's cgroup.controllers text (what its parent hands it). */
  controllers: string;
  /** The cgroup2 mount's root and its cgroup.controllers text (every controller cgroup v2 has on this kernel); null: no cgroup. */
  root: { path: string; controllers: string } | null;
  /** /proc/cgroups by controller (parseProcCgroups); empty when unreadable. */
  procCgroups: Map<string, { hierarchy: number; enabled: boolean }>;
}

/** The host's facts now: the tree's limitsAvailable() and /proc/cgroups (cgroups(7)); in subreaper mode (tree null) nothing is available. */
export function limitHost(tree: CgroupTree | null): LimitHost {
  let procCgroups = new Map<string, { hierarchy: number; enabled: boolean }>();
  try {
    procCgroups = parseProcCgroups(readFileSync('/proc/cgroups', 'utf8'));
  } catch {
    // no /proc/cgroups (CONFIG_CGROUPS off, or hidden): the reasons say less
  }
  if (!tree) return { sessionsCgroup: null, available: { memory: false, pids: false, cpu: false }, controllers: '', root: null, procCgroups };
  const { controllers, ...available } = tree.limitsAvailable();
  let rootControllers = '';
  try {
    rootControllers = readFileSync(join(tree.mount.mountPoint, 'cgroup.controllers'), 'utf8').trim();
  } catch {
    // in a cgroup namespace the root may be out of sight
  }
  return { sessionsCgroup: tree.sessionsPath, available, controllers, root: { path: tree.mount.mountPoint, controllers: rootControllers }, procCgroups };
}

/** The limits a launch runs under: each its own where it names one, else the config default (null: none). Only the set ones are present. */
export function effectiveLimits(asked: SessionLimits, defaults: DefaultLimits): SessionLimits {
  const out: SessionLimits = {};
  for (const { limit, configKey } of LIMITS) {
    const value = asked[limit] ?? defaults[configKey] ?? undefined;
    if (value !== undefined) out[limit] = value;
  }
  return out;
}

/** Whether any limit is set. */
export function hasLimits(limits: SessionLimits): boolean {
  return LIMITS.some(({ limit }) => limits[limit] !== undefined);
}

/**
 * Why a controller cannot be used for sessions here, in words (null: it can), from the
 * kernel's own facts: no cgroup (subreaper mode); disabled (/proc/cgroups enabled 0); bound
 * to cgroup v1 (/proc/cgroups hierarchy > 0: a controller is in one hierarchy only,
 * cgroup-v2.rst "Mounting"); offered but not enabled; or not delegated by the parent.
 */
export function unavailableBecause(controller: LimitController, host: LimitHost): { short: string; long: string } | null {
  if (host.sessionsCgroup === null)
    return { short: 'subreaper mode: no cgroup', long: 'this supervisor runs in subreaper mode: it has no cgroup at all (sbx status says why)' };
  if (host.available[controller]) return null;
  const proc = host.procCgroups.get(controller);
  if (proc && !proc.enabled)
    return { short: 'disabled in the kernel', long: `the kernel has it disabled (/proc/cgroups: enabled 0; cgroup_disable= on its command line)` };
  if (proc && proc.hierarchy > 0) {
    return {
      short: 'bound to cgroup v1',
      long: `this host binds it to cgroup v1 (/proc/cgroups: hierarchy ${proc.hierarchy}; a hybrid host), and a controller is in one hierarchy only`,
    };
  }
  if (host.controllers.split(/\s+/).includes(controller))
    return {
      short: 'offered but not enabled for the leaves',
      long: 'it is offered (cgroup.controllers) but could not be enabled in its cgroup.subtree_control',
    };
  return {
    short: 'not delegated to this cgroup',
    long:
      'the parent cgroup does not delegate it (under systemd: Delegate=yes in the unit; elsewhere, +' + controller + " in the parent's cgroup.subtree_control)",
  };
}

/** "cgroup.controllers: none; the cgroup2 root's (/sys/fs/cgroup/unified): hugetlb": what the sessions dir is handed, and what v2 has at all. */
function controllersText(host: LimitHost): string {
  const root = host.root && host.root.path !== host.sessionsCgroup ? `; the cgroup2 root's (${host.root.path}): ${host.root.controllers || 'none'}` : '';
  return `cgroup.controllers: ${host.controllers || 'none'}${root}`;
}

/**
 * The refusal of a launch asking for a limit this host cannot enforce, or null: the first such
 * limit, in LIMITS order, as LIMIT_UNAVAILABLE with details { controller, limit, cgroup }
 * (cgroup: the sessions cgroup, null in subreaper mode). Decided before anything is admitted.
 */
export function limitRefusal(limits: SessionLimits, host: LimitHost): SupervisorError | null {
  for (const { limit, controller, flag } of LIMITS) {
    if (limits[limit] === undefined) continue;
    const why = unavailableBecause(controller, host);
    if (!why) continue;
    const where = host.sessionsCgroup === null ? `and ${why.long}` : `and ${host.sessionsCgroup} does not have it (${controllersText(host)}); ${why.long}`;
    return new SupervisorError('LIMIT_UNAVAILABLE', `${flag} (${limit}) needs the ${controller} controller in cgroup v2, ${where}. Nothing was run.`, {
      controller,
      limit,
      cgroup: host.sessionsCgroup,
    });
  }
  return null;
}

/**
 * `status.limits`: each controller enforceable here, and when any is not, why (the
 * controllers grouped by their reason: "memory, pids, cpu are bound to cgroup v1 (X: cgroup.controllers: none; ...)").
 */
export function limitsStatus(host: LimitHost): LimitsStatus {
  const status: LimitsStatus = { memory: false, pids: false, cpu: false };
  const byReason = new Map<string, LimitController[]>();
  for (const c of LIMIT_CONTROLLERS) {
    const why = unavailableBecause(c, host);
    status[c] = why === null;
    if (why) byReason.set(why.short, [...(byReason.get(why.short) ?? []), c]);
  }
  if (byReason.size > 0) {
    const parts = [...byReason].map(([short, cs]) => `${cs.join(', ')} ${cs.length === 1 ? 'is' : 'are'} ${short}`);
    status.reason =
      host.sessionsCgroup === null
        ? 'subreaper mode: no cgroup, so no limit can be enforced'
        : `${parts.join('; ')} (${host.sessionsCgroup}: ${controllersText(host)})`;
  }
  return status;
}

/**
 * Why the config's default limits cannot be enforced on this host (the supervisor then refuses
 * to start: it never runs a session without a limit it was told to apply), or null.
 */
export function defaultLimitsProblem(defaults: DefaultLimits, host: LimitHost): string | null {
  for (const { configKey, controller, limit } of LIMITS) {
    if (defaults[configKey] === null) continue;
    const refusal = limitRefusal({ [limit]: defaults[configKey] }, host);
    if (!refusal) continue;
    const why = unavailableBecause(controller, host)!;
    return `session.defaultLimits.${configKey} is set (${defaults[configKey]}), but the ${controller} controller is not available to sessions here: ${why.long}${host.sessionsCgroup ? ` (${host.sessionsCgroup}: ${controllersText(host)})` : ''}; the supervisor will not run sessions without a limit it was told to apply: remove the default, or run where cgroup v2 has the controller`;
  }
  return null;
}
