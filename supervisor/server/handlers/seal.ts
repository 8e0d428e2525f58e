// seal: stop admission for good (durable); idempotent.
import type { Handler } from '../handler.js';

export const seal: Handler<'seal'> = ({ supervisor }) => supervisor.seal();
