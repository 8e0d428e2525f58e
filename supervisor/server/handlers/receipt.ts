// receipt: the session's state and its receipt (null until it has ended).
import type { Handler } from '../handler.js';

export const receipt: Handler<'receipt'> = ({ supervisor }, params) => {
  const session = supervisor.find(params);
  return { state: session.state, receipt: session.receipt };
};
