// Default locations from docs/reference/contract.md "Names": the socket and the state dir, for root and for
// other users. Shared by the daemon and sbx so both agree without configuration.
import { homedir } from 'node:os';
import { join } from 'node:path';

function isRoot(): boolean {
  return typeof process.getuid === 'function' && process.getuid() === 0;
}

/** $SBX_SOCKET, else /run/sandbox-supervisor/supervisor.sock as root, else under $XDG_RUNTIME_DIR. */
export function defaultSocketPath(env: NodeJS.ProcessEnv = process.env): string {
  if (env.SBX_SOCKET) return env.SBX_SOCKET;
  if (isRoot()) return '/run/sandbox-supervisor/supervisor.sock';
  const runtime = env.XDG_RUNTIME_DIR || join('/tmp', `sandbox-supervisor-${process.getuid?.() ?? 'user'}`);
  return join(runtime, 'sandbox-supervisor', 'supervisor.sock');
}

/** $SBX_STATE_DIR, else /var/lib/sandbox-supervisor as root, else $XDG_STATE_HOME/sandbox-supervisor. */
export function defaultStateDir(env: NodeJS.ProcessEnv = process.env): string {
  if (env.SBX_STATE_DIR) return env.SBX_STATE_DIR;
  if (isRoot()) return '/var/lib/sandbox-supervisor';
  const base = env.XDG_STATE_HOME || join(homedir(), '.local', 'state');
  return join(base, 'sandbox-supervisor');
}
