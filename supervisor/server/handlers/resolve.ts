// resolve: an operator's word ends a session stuck unknown (evidence operator_attested).
// Who attests is read from the socket (SO_PEERCRED), never taken from the request.
import type { Handler } from '../handler.js';

export const resolve: Handler<'resolve'> = ({ supervisor, conn }, params) =>
  supervisor.resolve(params, {
    uid: conn.peer.uid,
    pid: conn.peer.pid,
    ...(conn.peer.remote !== undefined ? { remote: conn.peer.remote } : {}),
    reason: params.reason,
    force: params.force === true,
  });
