// Named crash points for the crash tests (test/e2e/fault-injection.test.ts), in the manner of FoundationDB's
// buggify: `SBX_FAULT_POINT=NAME[@N]` in the supervisor's environment makes the N-th pass (default 1st)
// through faultPoint(NAME) act, so a test can crash it between two exact steps instead of hoping a random
// delay lands there. Unset, it costs one comparison. Owns nothing else; the points are listed where they are
// placed (grep faultPoint).

const spec = process.env.SBX_FAULT_POINT ?? '';
const at = spec.lastIndexOf('@');
const armedName = at > 0 ? spec.slice(0, at) : spec;
const armedPass = at > 0 ? Math.max(1, Number(spec.slice(at + 1)) || 1) : 1;
let passes = 0;

/**
 * A named crash point: acts on the armed pass (SIGKILL of this process unless `act` says
 * otherwise, e.g. a worker thread ending itself), else returns at once. Placed between two exact
 * steps (the temp admission record written but not linked, say).
 */
export function faultPoint(name: string, act: () => void = () => process.kill(process.pid, 'SIGKILL')): void {
  if (armedName === '' || armedName !== name) return;
  if (++passes !== armedPass) return;
  act();
}
