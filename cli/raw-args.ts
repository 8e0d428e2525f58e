// sbx's own arguments and environment as the bytes the kernel gave it (/proc/self/cmdline,
// /proc/self/environ): Node decodes them lossily (an invalid byte becomes U+FFFD), and
// everything sbx sends is text on the wire (msgpack str), so what is not UTF-8 is refused
// rather than sent as other bytes than given. And the command after `--`, taken here rather
// than by commander.
import { isUtf8 } from 'node:buffer';
import { readFileSync } from 'node:fs';
import { fail } from './common.js';

/**
 * Refuses (125) an argument that is not UTF-8 (a command's, an --env value, a --cwd, a --key),
 * then takes the command after `--` of `sbx run` out of `argv` (which it shortens in place), so
 * commander never sees it: commander spreads its arguments onto the stack (`push(...args)`:
 * RangeError past ~120,000 of them, far below the kernel's ARG_MAX). Only the command's first
 * word is left for commander. Returns the command, or null when there is no `--`.
 */
export function takeCommandArgv(argv: string[]): string[] | null {
  const raw = readRawArgs(argv.length - 2);
  raw?.forEach((bytes, i) => {
    if (!isUtf8(bytes)) fail(`INVALID_ARGUMENT: argument ${i + 1} (${JSON.stringify(argv[i + 2])}) is not valid UTF-8; sbx passes arguments as text, and will not send other bytes than it was given`);
  });
  const dashDash = argv.indexOf('--');
  if (dashDash > 0 && argv.slice(2, dashDash).includes('run') && dashDash + 1 < argv.length) {
    const command = argv.slice(dashDash + 1);
    argv.splice(dashDash + 2);
    return command;
  }
  return null;
}

/** This CLI's whole environment for --inherit-env; a variable that is not UTF-8 is refused (125), as arguments are. */
export function inheritedEnv(): Record<string, string> {
  let environ: Buffer | null = null;
  try {
    environ = readFileSync('/proc/self/environ');
  } catch {
    // no /proc: Node's decoding it is
  }
  for (const entry of environ ? splitNul(environ) : []) {
    if (!isUtf8(entry)) fail(`INVALID_ARGUMENT: --inherit-env: the environment variable ${JSON.stringify(entry.toString('utf8').split('=')[0])} is not valid UTF-8; sbx will not send other bytes than it was given (unset it, or pass what is needed with --env)`);
  }
  return Object.fromEntries(Object.entries(process.env).filter(([, v]) => v !== undefined)) as Record<string, string>;
}

/** The NUL-terminated parts of /proc/self/{cmdline,environ}. */
function splitNul(data: Buffer): Buffer[] {
  const parts: Buffer[] = [];
  let start = 0;
  for (let i = 0; i < data.length; i++) {
    if (data[i] === 0) {
      parts.push(data.subarray(start, i));
      start = i + 1;
    }
  }
  return parts;
}

/** This process's own arguments as bytes, the last `count` of /proc/self/cmdline (null where unreadable). */
function readRawArgs(count: number): Buffer[] | null {
  let cmdline: Buffer;
  try {
    cmdline = readFileSync('/proc/self/cmdline');
  } catch {
    return null;
  }
  const parts = splitNul(cmdline);
  return parts.length >= count ? parts.slice(parts.length - count) : null;
}
