// kill: send one signal to every process of the session (its cgroup; in subreaper mode every
// descendant of the shim), by name or number; answers with how many pids it reached.
import { SupervisorError } from '../../../ipc/errors.js';
import { signalName, signalNumber } from '../../session/spawn.js';
import type { Handler } from '../handler.js';

export const kill: Handler<'kill'> = async ({ supervisor }, params) => {
  const session = supervisor.find(params);
  let name: string;
  try {
    name = signalName(typeof params.signal === 'number' ? params.signal : signalNumber(params.signal));
    signalNumber(name); // a number without a name (e.g. 32) is not deliverable by name
  } catch {
    throw new SupervisorError('INVALID_ARGUMENT', `kill: unknown signal ${JSON.stringify(params.signal)}`, { field: 'signal' });
  }
  if (session.state === 'unknown' && !session.hasCgroup) {
    // Its processes were its shim's to reach; the shim is gone (subreaper mode): nothing to signal.
    throw new SupervisorError(
      'INVALID_ARGUMENT',
      `session ${session.id} is unknown and has no cgroup: what it left is not reachable from here: ${session.unknownReason ?? 'no evidence of its end'} (sbx resolve records an operator's word)`,
    );
  }
  return { session_id: session.id, signal: name, pids: await session.signal(name as NodeJS.Signals) };
};
