// Start-up: a bad configuration stops the daemon with a message naming the key; sbx says
// clearly when no supervisor is there.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { DAEMON, DAEMON_ARGV, SBX, TestDaemon } from '../helpers/daemon.js';
import { SUPERVISOR_NODE_FLAGS } from '../../supervisor/node-flags.js';

const dir = mkdtempSync(join(tmpdir(), 'sbx-startup-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function serveWith(config: unknown) {
  const path = join(dir, `config-${Math.random().toString(16).slice(2)}.json`);
  writeFileSync(path, JSON.stringify(config));
  return spawnSync(process.execPath, [...DAEMON_ARGV, 'serve', '--config', path], {
    env: { ...process.env, SBX_SOCKET: join(dir, 's.sock'), SBX_STATE_DIR: join(dir, 'state') },
    timeout: 20_000,
  });
}

describe('start-up', () => {
  it('refuses an unknown config key, naming it', () => {
    const r = serveWith({ drain: { chunkBytez: 1 } });
    expect(r.status).toBe(2);
    expect(r.stderr.toString()).toContain('unknown key "drain.chunkBytez"');
  });

  it('refuses a bad config value, naming it', () => {
    const r = serveWith({ session: { defaultGraceMs: 'ten seconds' } });
    expect(r.status).toBe(2);
    expect(r.stderr.toString()).toContain('"session.defaultGraceMs"');
  });

  it('logs the node flags it runs with, and warns when started without the ones that bound its memory', async () => {
    const starting = (log: string) =>
      log
        .split('\n')
        .filter((l) => l.includes('"msg":"starting"'))
        .map((l) => JSON.parse(l) as { node_flags: string[]; node_options?: string });
    const warnings = (log: string) =>
      log
        .split('\n')
        .filter((l) => l.includes('started without the node flags'))
        .map((l) => JSON.parse(l) as { level: number; missing: string[]; msg: string });
    const flagged = await new TestDaemon().start();
    let log: string;
    try {
      log = flagged.log();
    } finally {
      await flagged.stop();
    }
    expect(starting(log).map((l) => l.node_flags)).toEqual([[...SUPERVISOR_NODE_FLAGS]]);
    expect(log).not.toContain('started without the node flags');
    const bare = await new TestDaemon({ nodeFlags: [] }).start();
    try {
      log = bare.log();
    } finally {
      await bare.stop();
    }
    expect(starting(log).map((l) => l.node_flags)).toEqual([[]]);
    expect(warnings(log)).toEqual([expect.objectContaining({ level: 40, missing: [...SUPERVISOR_NODE_FLAGS] })]);
    expect(log).toContain('started without the node flags that bound its memory, or with looser values (');
    expect(log).toContain(`start it as node ${SUPERVISOR_NODE_FLAGS.join(' ')} ${DAEMON} ...`);
    // A looser value on node's command line (over NODE_OPTIONS' tighter one): named, with the line to start it with; NODE_OPTIONS logged.
    const looser = await new TestDaemon({ nodeFlags: ['--max-semi-space-size=4'] }).withEnv({ NODE_OPTIONS: '--max-semi-space-size=1' }).start();
    try {
      log = looser.log();
    } finally {
      await looser.stop();
    }
    const warned = warnings(log);
    expect(warned.map((w) => w.missing)).toEqual([['--max-semi-space-size=2']]);
    expect(starting(log).map((l) => l.node_options)).toEqual(['--max-semi-space-size=1']);
    expect(warned[0]!.msg).toContain(`(--max-semi-space-size=2): start it as node ${SUPERVISOR_NODE_FLAGS.join(' ')} ${DAEMON} ...`);
  });

  it('sbx exits 125 with a clear message when no supervisor listens', () => {
    const r = spawnSync(process.execPath, [SBX, 'run', '--', 'true'], { env: { ...process.env, SBX_SOCKET: join(dir, 'nobody.sock') } });
    expect(r.status).toBe(125);
    expect(r.stderr.toString()).toContain('cannot reach the supervisor');
  });
});
