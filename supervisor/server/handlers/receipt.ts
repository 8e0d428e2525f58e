// receipt: the session's id (the one a prefix or key selected), its state and its receipt (null
// until it has ended); for an escaped session, the operator's word that what left its
// cgroup is ended, once given (escape_attested).
import type { Handler } from '../handler.js';

export const receipt: Handler<'receipt'> = ({ supervisor }, params) => {
  const session = supervisor.find(params);
  const attested = session.escapeAttestedAnswer();
  return { session_id: session.id, state: session.state, receipt: session.receipt, ...(attested ? { escape_attested: attested } : {}) };
};
