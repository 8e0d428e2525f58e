// How sbx ends on its own failure (docs/reference/exit-statuses.md): the progress line cleared,
// the message on stderr (control bytes escaped), and exit status 125, the convention of
// timeout(1), env(1) and docker run for "the tool failed, not the command". One for every command.
import { clearProgress } from './progress.js';
import { warn } from './escape.js';

/** sbx's own failure status (not the command's): 125. */
export const FAILURE = 125;

/** Clears the progress line, writes message to stderr and exits with status (FAILURE by default). */
export function fail(message: string, status = FAILURE): never {
  clearProgress();
  warn(message);
  process.exit(status);
}
