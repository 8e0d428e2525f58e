// One launch request, from the wire's params to what admission and the session take
// (docs/reference/protocol.md "launch"): the checks of cwd, user and options, the command in its
// one shape (CommandFields: what the digest covers and admission compares), its digest, the
// key, the task, the limits and the leader's environment. No state: the registry admits it.
import { randomBytes } from 'node:crypto';
import { statSync } from 'node:fs';
import { isAbsolute } from 'node:path';
import { SupervisorError } from '../ipc/errors.js';
import { errnoCode } from '../ipc/errno.js';
import { DEFAULT_TASK, type LaunchParams } from '../ipc/protocol.js';
import { resolveLinger, type CommandFields } from './admission.js';
import type { Config } from './config.js';
import { effectiveLimits } from './limits.js';
import type { SessionRequest } from './session/context.js';
import { commandDigest } from './session/receipt.js';
import { lookupUser } from './users.js';

/** The invocation keys of services of leftovers (`service:<origin id>`): refused in a launch, so no client can take one first. */
export const SERVICE_KEY_PREFIX = 'service:';

/** What a launch request becomes: the session's request (with its key, task, digest and limits) and the command admission compares. */
export interface LaunchRequest {
  request: SessionRequest;
  command: CommandFields;
}

/** What a request is completed with: the config's defaults, the supervisor's own user (a session without --user gets it), whether sessions get a cgroup. */
export interface LaunchDefaults {
  config: Config;
  self: { username: string; homedir: string };
  cgroup: boolean;
}

/**
 * The request of launch params, checked: cwd absolute and a directory (stat(2)), the user known
 * (getpwnam_r(3)) and another only for a root supervisor, keep_after_close only with service, a
 * key not in the supervisor's own namespace. SupervisorError INVALID_ARGUMENT naming the field,
 * LIMIT_UNAVAILABLE from the linger policy.
 */
export function launchRequest(params: LaunchParams, d: LaunchDefaults): LaunchRequest {
  const { config } = d;
  if (!isAbsolute(params.cwd)) throw new SupervisorError('INVALID_ARGUMENT', `cwd must be absolute: ${params.cwd}`);
  let cwdIsDir = false;
  let cwdError = '';
  try {
    cwdIsDir = statSync(params.cwd).isDirectory();
  } catch (err) {
    cwdError = errnoCode(err) === 'ENOENT' ? 'does not exist' : `cannot be looked up (${errnoCode(err)})`;
  }
  if (!cwdIsDir) throw new SupervisorError('INVALID_ARGUMENT', `cwd ${cwdError || 'is not a directory'}: ${params.cwd}`);
  const env = params.env ?? {};
  const userSpec = params.user ?? (config.session.user !== undefined ? String(config.session.user) : null);
  const sessionUser = userSpec === null ? null : lookupUser(userSpec);
  if (sessionUser && process.getuid?.() !== 0 && sessionUser.uid !== process.getuid?.()) {
    throw new SupervisorError('INVALID_ARGUMENT', `user: running as ${userSpec} needs a root supervisor`, { field: 'user' });
  }
  const pty = params.pty ? { cols: params.pty.cols ?? 80, rows: params.pty.rows ?? 24 } : null;
  const stdin = params.stdin ? 'stream' : 'null';
  if (params.keep_after_close && !params.service)
    throw new SupervisorError('INVALID_ARGUMENT', 'keep_after_close is for a service: give service too (sbx run --service --keep-after-close)', {
      field: 'keep_after_close',
    });
  // A service goes on while any process of it runs (wait), unless it names another linger.
  const linger = resolveLinger(params.linger ?? null, params.service ? 'wait' : config.session.defaultLinger, { cgroup: d.cgroup, pty: pty !== null });
  const command: CommandFields = { argv: params.argv, cwd: params.cwd, env, user: userSpec, pty: pty !== null, stdin };
  const digest = commandDigest(command);
  if (params.invocation_key?.startsWith(SERVICE_KEY_PREFIX)) {
    throw new SupervisorError(
      'INVALID_ARGUMENT',
      `invocation keys starting with ${JSON.stringify(SERVICE_KEY_PREFIX)} are the supervisor's own (the services it hands leftovers to); choose another key`,
      { field: 'invocation_key' },
    );
  }
  const key = params.invocation_key ?? `auto-${randomBytes(12).toString('hex')}`;
  // Not in the digest (as the deadline is not): a retry of the key answers with its session as admitted.
  const limits = effectiveLimits({ memory_max_bytes: params.memory_max_bytes, pids_max: params.pids_max, cpus: params.cpus }, config.session.defaultLimits);
  const userName = sessionUser ? (sessionUser.name ?? String(sessionUser.uid)) : d.self.username;
  const leaderEnv: Record<string, string> = {
    PATH: config.session.path,
    HOME: sessionUser ? sessionUser.home : d.self.homedir,
    USER: userName,
    LOGNAME: userName,
    LANG: config.session.lang,
    ...(pty ? { TERM: 'xterm-256color' } : {}),
    ...(params.inherit_env ?? {}),
    ...env,
  };
  const request: SessionRequest = {
    argv: params.argv,
    cwd: params.cwd,
    env,
    leaderEnv,
    invocationKey: key,
    commandDigest: digest,
    timeoutMs: params.timeout_ms ?? 0,
    graceMs: params.grace_ms ?? config.session.defaultGraceMs,
    linger,
    chunkBytes: config.drain.chunkBytes,
    user: userSpec,
    sessionUser,
    pty,
    stdin,
    task: params.task ?? DEFAULT_TASK,
    service: params.service ? { handed_off_from: null, keep_after_close: params.keep_after_close === true } : null,
    limits,
  };
  return { request, command };
}
