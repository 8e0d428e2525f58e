// write_file, read_file, upload, download: each launches its session (supervisor/files/
// sessions.ts gives the argv) through the launch handler, so it answers as launch does
// (an existing session for its key, stdin_cursor for a session with stdin).
import type { Handler } from '../handler.js';
import { downloadLaunch, readFileLaunch, uploadLaunch, writeFileLaunch } from '../../files/sessions.js';
import { launch } from './launch.js';

export const writeFile: Handler<'write_file'> = (ctx, params) => launch(ctx, writeFileLaunch(ctx.supervisor.config, params));
export const readFile: Handler<'read_file'> = (ctx, params) => launch(ctx, readFileLaunch(params));
export const upload: Handler<'upload'> = (ctx, params) => launch(ctx, uploadLaunch(params));
export const download: Handler<'download'> = (ctx, params) => launch(ctx, downloadLaunch(params));
