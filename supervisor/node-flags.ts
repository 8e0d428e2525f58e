// The node flags the supervisor runs with, and the check that it was started with them. Every way
// it is started names them: package.json's start, the systemd unit, install.sh's launcher and
// main.ts's #! line (test/unit/repo/node-flags.test.ts keeps them equal to SUPERVISOR_NODE_FLAGS).

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
 * line: looked for in node's own arguments (process.execArgv) and in NODE_OPTIONS, which node
 * also takes them from, a flag's name spelled with - or _ (V8 takes both).
 */
export function missingNodeFlags(execArgv: readonly string[] = process.execArgv, nodeOptions = process.env.NODE_OPTIONS ?? ''): string[] {
  const given = new Set([...execArgv, ...nodeOptions.split(/\s+/)].map(spelled));
  return SUPERVISOR_NODE_FLAGS.filter((flag) => !given.has(spelled(flag)));
}

/** A flag with its name's _ as - (--max_semi_space_size=2 is --max-semi-space-size=2). */
function spelled(flag: string): string {
  const eq = flag.indexOf('=');
  return eq < 0 ? flag.replaceAll('_', '-') : flag.slice(0, eq).replaceAll('_', '-') + flag.slice(eq);
}
