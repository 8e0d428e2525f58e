// sbx's raw terminal (sbx run -it, sbx attach to a pty session that takes stdin): put in raw
// mode with output processing off, as cfmakeraw(3) does, and given back on every way out: at
// exit, before a signal sbx does not handle ends it (SIGQUIT to attach, SIGUSR2, SIGALRM...),
// and while it is stopped (SIGTSTP: cooked while stopped, raw again on SIGCONT, as less and vim).
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { rawTerminal } from './escape.js';
import { cleanupBeforeDying } from './signals.js';

/**
 * Signals whose default action ends the process and that Node leaves at their default (signal(7),
 * all of them but SIGUSR1, Node's inspector, and SIGPIPE, which Node ignores;
 * Node puts the terminal back itself for SIGINT and SIGTERM only). When sbx has no other listener
 * for one, its arrival puts the terminal back and then ends sbx by that same signal.
 */
const ENDING_SIGNALS = [
  'SIGQUIT',
  'SIGUSR2',
  'SIGALRM',
  'SIGVTALRM',
  'SIGPROF',
  'SIGXCPU',
  'SIGXFSZ',
  'SIGPWR',
  'SIGABRT',
  'SIGIO',
  'SIGSYS',
  'SIGTRAP',
  'SIGSTKFLT',
] as const;

let held = false;

/**
 * stdin's terminal raw, output processing off. libuv's raw mode keeps OPOST and ONLCR on, so the
 * session's own \r\n (its pty translates already) reached the screen, and a recording of it
 * (script(1)), as \r\r\n; cfmakeraw(3), as ssh -t and docker run -t use, turns it off: so does
 * sbx, through stty(1) on the terminal (Node has no tcsetattr), by its own path (never a PATH
 * entry such as "." picking another). Entering from cooked, libuv saves the modes it then gives
 * back (also OPOST: it is saved before stty turns it off).
 */
function enterRaw(): void {
  // From cooked (libuv's own record says raw when a shell changed the modes while sbx was stopped).
  process.stdin.setRawMode(false);
  process.stdin.setRawMode(true);
  const stty = ['/usr/bin/stty', '/bin/stty'].find((p) => existsSync(p));
  if (stty) spawnSync(stty, ['-opost'], { stdio: ['inherit', 'ignore', 'ignore'] });
  rawTerminal(true);
}

/** The modes libuv saved when raw mode began; nothing on a hung-up terminal (EIO: no modes left to give back). */
function leaveRaw(): void {
  rawTerminal(false);
  try {
    process.stdin.setRawMode?.(false);
  } catch {
    // the terminal was hung up: there is no mode left to put back
  }
}

/**
 * Puts stdin's terminal in raw mode for the rest of sbx's life (once; later calls do nothing)
 * and keeps it right: given back at exit and before an ending signal sbx does not otherwise
 * handle (ENDING_SIGNALS; sbx then dies of that signal, as it would have), given back on SIGTSTP
 * before sbx stops by it, and raw again on SIGCONT. stdin must be a terminal.
 */
export function holdRawTerminal(): void {
  if (held) return;
  held = true;
  enterRaw();
  process.on('exit', leaveRaw);
  // Only alone: another listener (sbx run sends SIGQUIT on to the session) makes it no ending here.
  cleanupBeforeDying(ENDING_SIGNALS, leaveRaw, true);
  // As less(1) does: the terminal back, then the stop itself by SIGTSTP at its default action (so
  // a shell says "Stopped", not "Stopped (signal)"). kill(2) of itself stops sbx before it
  // returns; past it sbx was continued, or the kernel discarded the stop (an orphaned process
  // group: no shell could continue it): either way the handler and raw mode again.
  const stop = () => {
    leaveRaw();
    process.removeListener('SIGTSTP', stop);
    process.kill(process.pid, 'SIGTSTP');
    process.on('SIGTSTP', stop);
    enterRawIfAny();
  };
  process.on('SIGTSTP', stop);
  // Continued (fg, or a kill -CONT after any stop): the shell may have set its own modes meanwhile.
  process.on('SIGCONT', enterRawIfAny);
}

/** enterRaw, unless the terminal was hung up meanwhile (EIO: nothing to put in raw mode; its SIGHUP ends sbx). */
function enterRawIfAny(): void {
  try {
    enterRaw();
  } catch {
    // hung up
  }
}
