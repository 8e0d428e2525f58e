// How sbx ends by a signal it does not otherwise take, after its own cleanup: the cleanup, then
// the listener gone and the signal raised again, so that sbx dies of it at its default action
// (signal(7)), as a shell and a parent expect. Owns nothing else.

/**
 * On the first of signals to arrive: cleanup, then sbx dies of that signal (its listener
 * removed, the signal raised again: Node gives it its default action back when none is left).
 * onlyIfAlone: not when another listener takes that signal (the command's own: sbx then ends
 * through exit, and cleanup belongs there).
 */
export function cleanupBeforeDying(signals: readonly NodeJS.Signals[], cleanup: () => void, onlyIfAlone = false): void {
  for (const signal of signals) {
    const onSignal = () => {
      if (onlyIfAlone && process.listenerCount(signal) > 1) return;
      cleanup();
      process.removeListener(signal, onSignal);
      process.kill(process.pid, signal);
    };
    process.on(signal, onSignal);
  }
}
