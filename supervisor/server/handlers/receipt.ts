// receipt: the session's state and its receipt (null until it has ended); for an escaped
// session, the operator's word that what left its cgroup is ended, once given (escape_attested).
import type { Handler } from '../handler.js';

export const receipt: Handler<'receipt'> = ({ supervisor }, params) => {
  const session = supervisor.find(params);
  const attested = session.escapeAttestedAnswer();
  return { state: session.state, receipt: session.receipt, ...(attested ? { escape_attested: attested } : {}) };
};
