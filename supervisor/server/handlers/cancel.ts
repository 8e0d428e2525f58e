// cancel: end the session with the usual escalation (SIGTERM to every process, cgroup.kill
// after the grace); for a recovered session reconciliation is ending, its KILL comes after
// the given grace (default: now). Answers at once; the receipt comes with wait.
import { SupervisorError } from '../../../ipc/errors.js';
import type { Handler } from '../handler.js';

export const cancel: Handler<'cancel'> = ({ supervisor }, params) => {
  const session = supervisor.find(params);
  if (session.state === 'unknown') {
    if (!session.cancelRecovered(params.grace_ms ?? 0)) {
      throw new SupervisorError(
        'INVALID_ARGUMENT',
        `session ${session.id} is unknown and nothing of it is being ended: ${session.unknownReason ?? 'no evidence of its end'} (${
          session.hasCgroup ? 'sbx kill reaches its cgroup' : 'it has no cgroup: what it left is not reachable from here'
        }; sbx resolve records an operator's word)`,
      );
    }
    return { session_id: session.id, state: session.state };
  }
  void session.terminate('cancel', params.grace_ms);
  return { session_id: session.id, state: session.state };
};
