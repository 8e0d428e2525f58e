// The README's agent workflow, run as written: the ```sh block marked `<!-- test: workflow-cli -->`
// and the ```python block marked `<!-- test: workflow-python -->`, against a real supervisor with
// a watched workspace (the blocks' /srv/workspace replaced by this run's), so the README's first
// screen cannot drift from what sbx and the Python client do.
import { spawn, spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROOT, SBX_BIN, TestDaemon, within } from '../helpers/daemon.js';

const WORKSPACE_IN_README = '/srv/workspace';
const hasJq = spawnSync('sh', ['-c', 'command -v jq'], { stdio: 'ignore' }).status === 0;

/**
 * The fenced block right after `<!-- test: NAME -->` in README.md: its body (without the fences).
 * Throws when the marker or a block of lang right after it is missing.
 */
function markedBlock(readme: string, name: string, lang: string): string {
  const marker = `<!-- test: ${name} -->\n`;
  const at = readme.indexOf(marker);
  if (at < 0) throw new Error(`README.md has no ${marker.trim()}`);
  const m = readme.slice(at + marker.length).match(new RegExp('^```' + lang + '\\n([\\s\\S]*?)\\n```\\n'));
  if (!m) throw new Error(`README.md: no \`\`\`${lang} block right after ${marker.trim()}`);
  return m[1]!;
}

interface Ran {
  status: number | null;
  stdout: string;
  stderr: string;
}

/** argv run to its end in cwd with env (added to ours); its status and whole output, as text. */
function run(argv: string[], cwd: string, env: NodeJS.ProcessEnv): Promise<Ran> {
  return new Promise((resolve, reject) => {
    const child = spawn(argv[0]!, argv.slice(1), { cwd, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (b: Buffer) => out.push(b));
    child.stderr.on('data', (b: Buffer) => err.push(b));
    child.on('error', reject);
    child.on('close', (status) => resolve({ status, stdout: Buffer.concat(out).toString(), stderr: Buffer.concat(err).toString() }));
  });
}

const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
let daemon: TestDaemon;
let ws = '';

beforeAll(async () => {
  daemon = new TestDaemon();
  ws = join(daemon.dir, 'workspace');
  mkdirSync(ws);
  await daemon.withConfig({ workspace: { paths: [ws] } }).start();
});
afterAll(async () => {
  expect(await daemon.stop()).toEqual({ code: 0, signal: null });
});

describe("the README's agent workflow", () => {
  it.skipIf(!hasJq)('the CLI block (sh), as written: keyed runs, a retry, a deadline, logs, the task closed, verified, restored', async () => {
    const block = markedBlock(readme, 'workflow-cli', 'sh');
    expect(block).toContain(WORKSPACE_IN_README);
    const cwd = join(daemon.dir, 'cli');
    mkdirSync(cwd);
    // The supervisor named by its socket alone, as a user of one not at the default paths has it:
    // sbx verify task.json finds its key and state dir through it (no $SBX_STATE_DIR).
    const env = { PATH: `${dirname(SBX_BIN)}:${process.env.PATH}`, SBX_SOCKET: daemon.socketPath };
    const r = await within(run(['sh', '-c', block.replaceAll(WORKSPACE_IN_README, ws)], cwd, env), 'the CLI block', 60_000);
    expect(r.stderr).toBe('');
    const lines = r.stdout.split('\n');
    expect(lines.slice(0, 6)).toEqual([
      '42',
      '42',
      'exit 124',
      '42',
      '{"outcome":"exited","exit":{"code":0,"signal":null},"death":"cgroup_empty"}',
      'complete: true',
    ]);
    expect(lines[6]).toMatch(
      /^OK: task receipt of "turn-1" \(complete: true\) signed by sha256:[0-9a-f]{64}; 3 session receipt\(s\) match, 1 checkpoint\(s\) verify /,
    );
    expect(lines[7]).toMatch(new RegExp(`^restored checkpoint [0-9a-f]{64} into ${cwd}/snapshot: `));
    expect(lines.slice(8)).toEqual(['OK: the restored tree is identical to the manifest', 'print(6 * 7)', '']);
    expect(r.status).toBe(0);

    // The retry was the same run: three sessions in the task, one per key; the deadline's session timed out.
    const task = JSON.parse(readFileSync(join(cwd, 'task.json'), 'utf8'));
    expect(task).toMatchObject({ kind: 'task', task: 'turn-1', complete: true, obligations: [] });
    const ps = JSON.parse((await daemon.sbx(['ps', '--all', '--json'])).stdout.toString()) as Array<{ task: string; invocation_key: string }>;
    expect(
      ps
        .filter((s) => s.task === 'turn-1')
        .map((s) => s.invocation_key)
        .sort(),
    ).toEqual(['turn-1-edit', 'turn-1-hang', 'turn-1-test']);
    const hang = JSON.parse((await daemon.sbx(['receipt', '--key', 'turn-1-hang'])).stdout.toString());
    expect(hang).toMatchObject({ outcome: 'timed_out', termination: { cause: 'deadline' }, death: { evidence: 'cgroup_empty' } });
    expect(readFileSync(join(ws, 'answer.py'), 'utf8')).toBe('print(6 * 7)\n');
  });

  it('the Python block, as written: run, a retry that is the same run, the task closed, receipts verified', async () => {
    const block = markedBlock(readme, 'workflow-python', 'python');
    expect(block).toContain(WORKSPACE_IN_README);
    const cwd = join(daemon.dir, 'python');
    mkdirSync(cwd);
    writeFileSync(join(cwd, 'agent.py'), block.replaceAll(WORKSPACE_IN_README, ws));
    const env = { PYTHONPATH: join(ROOT, 'clients/python'), SBX_SOCKET: daemon.socketPath };
    const r = await within(run(['/usr/bin/python3', 'agent.py'], cwd, env), 'the Python block', 60_000);
    expect(r.stderr).toBe('');
    expect(r.stdout).toBe("0 exited b'42\\n'\nTrue True\nTrue []\nTrue True\n");
    expect(r.status).toBe(0);
    const ps = JSON.parse((await daemon.sbx(['ps', '--all', '--json'])).stdout.toString()) as Array<{ task: string; invocation_key: string }>;
    expect(
      ps
        .filter((s) => s.task === 'turn-2')
        .map((s) => s.invocation_key)
        .sort(),
    ).toEqual(['turn-2-edit', 'turn-2-test']);
  });
});
