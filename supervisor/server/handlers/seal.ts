// seal: stop admission for good (durable); idempotent. With a task: that task's admission only. New keys then
// get ADMISSION_SEALED; retries of existing keys still answer (docs/reference/protocol.md "Methods").
import type { Handler } from '../handler.js';

export const seal: Handler<'seal'> = ({ supervisor }, params) => (params.task !== undefined ? supervisor.sealTask(params.task) : supervisor.seal());
