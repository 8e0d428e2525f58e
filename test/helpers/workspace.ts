// Daemons watching workspaces for the workspace-clock tests: mounts made for them (tmpfs,
// overlay) and the pause files of the reader test hook, all undone by cleanup() (unmount
// before the daemon's dir goes). Real mounts: root only (mount(8)).
import { spawnSync } from 'node:child_process';
import { mkdirSync, rmSync } from 'node:fs';
import { expect } from 'vitest';
import type { Receipt } from '../../ipc/protocol.js';
import { TestDaemon } from './daemon.js';

export class WorkspaceRig {
  private readonly daemons: TestDaemon[] = [];
  private readonly mounts: string[] = [];
  private readonly files: string[] = [];

  /** mount ARGS AT (AT made first); unmounted by cleanup(). Throws with mount's stderr. */
  mount(args: string[], at: string): void {
    mkdirSync(at, { recursive: true });
    const r = spawnSync('mount', [...args, at]);
    if (r.status !== 0) throw new Error(`mount ${args.join(' ')} ${at}: ${r.stderr.toString()}`);
    this.mounts.push(at);
  }

  /** A file removed by cleanup() (a pause file of SBX_TEST_WATCH_PAUSE_FILE). */
  removeLater(path: string): string {
    this.files.push(path);
    return path;
  }

  /** A started daemon watching the workspaces make() creates under its dir. */
  async daemon(make: (dir: string) => string[], options: { env?: NodeJS.ProcessEnv; wrap?: string[]; config?: Record<string, unknown> } = {}) {
    const d = new TestDaemon({ cgroupPrefix: 'sbx-test-ws-', env: options.env, wrap: options.wrap });
    this.daemons.push(d);
    const paths = make(d.dir);
    d.withConfig({ workspace: { paths, ...(options.config ?? {}) } });
    await d.start();
    return { d, paths };
  }

  /** A daemon the test starts itself (expected to fail at start, say); stopped by cleanup(). */
  track(d: TestDaemon): TestDaemon {
    this.daemons.push(d);
    return d;
  }

  /** Daemons stopped, mounts undone (innermost first), then the daemons' dirs and cgroups removed. */
  async cleanup(): Promise<void> {
    const stopping = this.daemons.splice(0);
    for (const d of stopping) await d.terminate();
    for (const m of this.mounts.splice(0).reverse()) expect(spawnSync('umount', [m]).status).toBe(0);
    for (const d of stopping) await d.stop();
    for (const f of this.files.splice(0)) rmSync(f, { force: true });
  }
}

export const json = <T>(r: { stdout: Buffer }) => JSON.parse(r.stdout.toString()) as T;

/** sbx run --key KEY -- sh -c SCRIPT (exit 0 expected), then its receipt. */
export async function runScript(d: TestDaemon, key: string, script: string): Promise<Receipt> {
  // linger kill: a background writer ends with its script (its writes are the script's session's), never goes on as a service.
  const r = await d.sbx(['run', '--key', key, '--linger', 'kill', '--', 'sh', '-c', script]);
  expect(r.status).toBe(0);
  return json<Receipt>(await d.sbx(['receipt', '--key', key]));
}
