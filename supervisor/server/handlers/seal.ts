// seal: stop admission for good (durable); idempotent. With a task: that task's admission only.
import type { Handler } from '../handler.js';

export const seal: Handler<'seal'> = ({ supervisor }, params) => (params.task !== undefined ? supervisor.sealTask(params.task) : supervisor.seal());
