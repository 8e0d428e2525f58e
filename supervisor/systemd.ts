// Running under systemd: socket activation (sd_listen_fds(3): LISTEN_PID, LISTEN_FDS, the first
// fd is 3), readiness and stopping notices and the watchdog (sd_notify(3), sent by the native
// helper: Node has no AF_UNIX datagrams, docs/design/facts.md 19). Outside systemd every call is a no-op.
import { native } from '../core/fs/native.js';

/** SD_LISTEN_FDS_START: the first passed fd. */
const LISTEN_FDS_START = 3;

/**
 * The listening socket fd systemd passed us, or null. The variables are removed so nothing
 * we spawn inherits them.
 */
export function takeListenFd(env: NodeJS.ProcessEnv = process.env): number | null {
  const ours = env.LISTEN_PID === String(process.pid) && Number(env.LISTEN_FDS) >= 1;
  delete env.LISTEN_PID;
  delete env.LISTEN_FDS;
  delete env.LISTEN_FDNAMES;
  return ours ? LISTEN_FDS_START : null;
}

/** Sends a state line ("READY=1", "STOPPING=1", "WATCHDOG=1", "STATUS=..."); false outside systemd. */
export function notify(state: string): boolean {
  return native().sdNotify(state);
}

/**
 * Pings the watchdog from the event loop at half of WATCHDOG_USEC, so a wedged loop misses
 * it and systemd restarts the service. Returns a stop function.
 */
export function startWatchdog(env: NodeJS.ProcessEnv = process.env): () => void {
  const usec = Number(env.WATCHDOG_USEC);
  if (!usec || (env.WATCHDOG_PID && env.WATCHDOG_PID !== String(process.pid))) return () => {};
  const timer = setInterval(() => notify('WATCHDOG=1'), Math.max(1, Math.floor(usec / 2000)));
  timer.unref();
  return () => clearInterval(timer);
}
