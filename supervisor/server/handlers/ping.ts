// ping: the keepalive of every transport (clients send it while a call is pending): answered
// at once with the supervisor's wall clock; it touches no session.
import type { Handler } from '../handler.js';

export const ping: Handler<'ping'> = () => ({ now_ms: Date.now() });
