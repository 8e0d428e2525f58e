// wait: answers once the session's receipt is durable (a session that stays unknown keeps
// the request open: there is no receipt without evidence), or, with unknown "fail", answers
// SESSION_UNKNOWN once the session is unknown with no receipt on its way (the clients' run()).
import { SupervisorError } from '../../../ipc/errors.js';
import type { Handler } from '../handler.js';

export const wait: Handler<'wait'> = async ({ supervisor }, params) => {
  const session = supervisor.find(params);
  if (params.unknown === 'fail') {
    // One promise per session, shared by every such wait (Session.endedOrStuck).
    await session.endedOrStuck();
    if (session.state !== 'ended') {
      throw new SupervisorError(
        'SESSION_UNKNOWN',
        `session ${session.id} is unknown: ${session.unknownReason ?? 'no evidence of its end'}; it is never run again (sbx ps, sbx resolve)`,
        { session_id: session.id, reason: session.unknownReason },
      );
    }
  }
  const receipt = await session.ended;
  if (!receipt) throw new SupervisorError('INTERNAL', `session ${session.id} is ${session.state}: no receipt without death evidence`);
  return receipt;
};
