// The node flags the supervisor runs with, and the check that it was started with them. Every way
// it is started names them: package.json's start, the systemd unit and install.sh's launcher
// (test/unit/repo/node-flags.test.ts keeps them equal to SUPERVISOR_NODE_FLAGS); main.js run as a
// program (#!/usr/bin/env node: busybox's env has no -S) warns at start.

/**
 * V8's young generation capped at two 2 MiB semi-spaces (node --max-semi-space-size, in MiB;
 * V8 flags: `node --v8-options`). Left to itself V8 grows them to 16 MiB each under a steady
 * allocation rate (a long drain, a burst of launches), and the pages it then touched stay
 * resident: measured, a 1 GiB line grew the supervisor by 16.4-17.2 MiB with the default and
 * 7.8-9.2 MiB with the cap (launched and waited for), the drain of 2 GiB and 200 launches no slower
 * (docs/design/performance.md, "The young generation").
 */
export const SUPERVISOR_NODE_FLAGS: readonly string[] = ['--max-semi-space-size=2'];

/**
 * The flags of SUPERVISOR_NODE_FLAGS this process was started without, for the start's log
 * line. Looked for in NODE_OPTIONS, then node's own arguments (process.execArgv), which node
 * reads in that order, so a flag's last value is the one in force; a name may be spelled with
 * - or _ (V8 takes both). A numeric cap is in force when its last value is at most the flag's
 * and not 0, V8's "unset" (--max-semi-space-size=1 caps tighter still); any other flag needs its
 * value exactly.
 */
export function missingNodeFlags(execArgv: readonly string[] = process.execArgv, nodeOptions = process.env.NODE_OPTIONS ?? ''): string[] {
  const last = new Map<string, string>();
  for (const arg of [...nodeOptionsArgs(nodeOptions), ...execArgv]) {
    const { name, value } = parsed(arg);
    if (value !== undefined) last.set(name, value);
  }
  return SUPERVISOR_NODE_FLAGS.filter((flag) => {
    const want = parsed(flag);
    const got = last.get(want.name);
    if (got === undefined) return true;
    const numeric = /^\d+$/;
    // 0 is V8's "not set" (its own sizing): not a tighter cap.
    return numeric.test(want.value!) && numeric.test(got) ? Number(got) === 0 || Number(got) > Number(want.value) : got !== want.value;
  });
}

/**
 * NODE_OPTIONS as node splits it (src/node_options.cc, ParseNodeOptionsEnvVar): arguments
 * separated by spaces (a tab is part of one), double quotes join and are dropped, and inside
 * them a backslash takes the next character as it is. `"--max-semi-space-size=2"` is the flag.
 */
export function nodeOptionsArgs(nodeOptions: string): string[] {
  const args: string[] = [];
  let inString = false;
  let startNew = true;
  for (let i = 0; i < nodeOptions.length; i++) {
    let c = nodeOptions[i];
    if (c === '\\' && inString && i + 1 < nodeOptions.length) c = nodeOptions[++i];
    else if (c === ' ' && !inString) {
      startNew = true;
      continue;
    } else if (c === '"') {
      inString = !inString;
      continue;
    }
    if (startNew) args.push(c);
    else args[args.length - 1] += c;
    startNew = false;
  }
  return args;
}

/** A flag's name (its _ as -: --max_semi_space_size is --max-semi-space-size) and its value after =, if any. */
function parsed(flag: string): { name: string; value?: string } {
  const eq = flag.indexOf('=');
  return eq < 0 ? { name: flag.replaceAll('_', '-') } : { name: flag.slice(0, eq).replaceAll('_', '-'), value: flag.slice(eq + 1) };
}
