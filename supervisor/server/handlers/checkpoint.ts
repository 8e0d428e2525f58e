// checkpoint: take, store, read back and publish a checkpoint of one workspace directory
// (Checkpoints.checkpoint, checkpoint/checkpoint.ts); answers once it is published.
import type { Handler } from '../handler.js';

export const checkpoint: Handler<'checkpoint'> = ({ supervisor }, params) => supervisor.checkpoints.checkpoint(params.workspace, params.task ?? null);
