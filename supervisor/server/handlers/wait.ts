// wait: answers once the session's receipt is durable (a session that stays unknown keeps
// the request open: there is no receipt without evidence), or, with unknown "fail", answers
// SESSION_UNKNOWN once the session is unknown with no receipt on its way (the clients' run()).
import { SupervisorError } from '../../../ipc/errors.js';
import type { Receipt } from '../../../ipc/protocol.js';
import type { Session } from '../../session/session.js';
import type { Handler } from '../handler.js';

export const wait: Handler<'wait'> = async ({ supervisor }, params) => {
  const session = supervisor.find(params);
  const receipt = await (params.unknown === 'fail' ? endedUnlessUnknown(session) : session.ended);
  if (!receipt) throw new SupervisorError('INTERNAL', `session ${session.id} is ${session.state}: no receipt without death evidence`);
  return receipt;
};

/** The receipt once durable; SESSION_UNKNOWN as soon as the session is unknown with no receipt on its way (now or later). */
function endedUnlessUnknown(session: Session): Promise<Receipt | null> {
  return new Promise((resolve, reject) => {
    const check = () => {
      if (!session.unknownWithoutReceipt) return;
      stop();
      reject(
        new SupervisorError(
          'SESSION_UNKNOWN',
          `session ${session.id} is unknown: ${session.unknownReason ?? 'no evidence of its end'}; it is never run again (sbx ps, sbx resolve)`,
          { session_id: session.id, reason: session.unknownReason },
        ),
      );
    };
    const stop = () => {
      session.off('state', check);
      session.off('standing', check);
    };
    session.on('state', check);
    session.on('standing', check);
    void session.ended.then((r) => {
      stop();
      resolve(r);
    });
    check();
  });
}
