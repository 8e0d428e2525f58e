// A helper process a test spawns (a racer, a writer, a lease holder): its stdout collected, ended
// by its pid (never by name) and waited for, so a failed test leaves no process behind.
import { spawn, type ChildProcess } from 'node:child_process';

/** A helper process whose stdout is collected; stop() ends it by pid. */
export class Helper {
  readonly child: ChildProcess;
  out = '';
  constructor(argv: string[]) {
    this.child = spawn(argv[0], argv.slice(1), { stdio: ['pipe', 'pipe', 'inherit'] });
    this.child.stdout!.on('data', (d: Buffer) => (this.out += d.toString()));
  }

  /** SIGKILLs it (if it still runs) and waits for its exit. */
  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const gone = new Promise((r) => this.child.once('exit', r));
    this.child.kill('SIGKILL');
    await gone;
  }
}
