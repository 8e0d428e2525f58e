// wait: answers once the session's receipt is durable (a session that stays unknown keeps
// the request open: there is no receipt without evidence).
import { SupervisorError } from '../../../ipc/errors.js';
import type { Handler } from '../handler.js';

export const wait: Handler<'wait'> = async ({ supervisor }, params) => {
  const session = supervisor.find(params);
  const receipt = await session.ended;
  if (!receipt) throw new SupervisorError('INTERNAL', `session ${session.id} is ${session.state}: no receipt without death evidence`);
  return receipt;
};
