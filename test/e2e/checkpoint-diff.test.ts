// sbx diff (docs/guide/checkpoints.md "What changed: sbx diff"): checkpoint A of a tree, edits
// (add, delete, modify, chmod, chown, a file replaced by a symlink, a dir by a file, a name that
// is not UTF-8, an mtime-only touch), checkpoint B; the text and --json of A B exactly, exit 1;
// A A exit 0; id prefixes; --task (the latest of the task against the one before it, and from
// null); a manifest that does not verify refused (exit 125); the TS client's diffCheckpoints.
import { spawnSync } from 'node:child_process';
import { chmodSync, chownSync, mkdirSync, readFileSync, rmSync, symlinkSync, unlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { diffCheckpoints } from '../../core/checkpoint/diff-offline.js';
import type { CheckpointResult } from '../../ipc/protocol.js';
import { sha256, TestDaemon } from '../helpers/daemon.js';

const LATIN = Buffer.from([0x6e, 0xff, 0x2e, 0x62]); // "n\xff.b": not UTF-8

describe('sbx diff', () => {
  let d: TestDaemon;
  let ws: string;
  let A: CheckpointResult;
  let B: CheckpointResult;
  let C: CheckpointResult;

  async function checkpoint(task: string): Promise<CheckpointResult> {
    const r = await d.sbx(['checkpoint', '--workspace', ws, '--task', task, '--json']);
    expect(r.stderr.toString()).toBe('');
    expect(r.status).toBe(0);
    return JSON.parse(r.stdout.toString()) as CheckpointResult;
  }
  const put = (name: string, text: string, mode = 0o644) => {
    writeFileSync(join(ws, name), text);
    chmodSync(join(ws, name), mode);
  };

  beforeAll(async () => {
    d = await new TestDaemon().start();
    ws = join(d.dir, 'ws');
    mkdirSync(ws);
    chmodSync(ws, 0o755);
    put('keep', 'kept\n');
    put('touched', 'same bytes\n');
    put('edit', 'old\n');
    put('gone', 'bye\n');
    put('script', '#!/bin/sh\n');
    put('owned', 'mine\n');
    put('swap', 'a file\n');
    mkdirSync(join(ws, 'dir'));
    chmodSync(join(ws, 'dir'), 0o755);
    put('dir/inner', 'in\n');
    A = await checkpoint('first');
    put('edit', 'new text\n');
    unlinkSync(join(ws, 'gone'));
    chmodSync(join(ws, 'script'), 0o755);
    chownSync(join(ws, 'owned'), 1234, 4321);
    unlinkSync(join(ws, 'swap'));
    symlinkSync('keep', join(ws, 'swap'));
    rmSync(join(ws, 'dir'), { recursive: true });
    put('dir', 'now a file\n');
    put('added', 'hello\n');
    writeFileSync(Buffer.concat([Buffer.from(`${ws}/`), LATIN]), 'latin\n');
    chmodSync(Buffer.concat([Buffer.from(`${ws}/`), LATIN]), 0o600);
    utimesSync(join(ws, 'touched'), 1_000_000, 1_000_000); // mtime only: no change
    B = await checkpoint('second');
  }, 60_000);

  afterAll(async () => {
    await d?.stop();
  });

  const LINES = [
    'A added',
    'T dir (dir -> file)',
    'D dir/inner',
    'M edit',
    'D gone',
    'A n\\xff.b',
    'o owned (0:0 -> 1234:4321)',
    'm script (0644 -> 0755)',
    'T swap (file -> symlink)',
  ];

  it('A B: git --name-status lines sorted by path bytes, a summary on stderr, exit 1', async () => {
    const r = await d.sbx(['diff', A.checkpoint_id, B.checkpoint_id, '--state-dir', d.stateDir]);
    expect(r.stdout.toString()).toBe(LINES.map((l) => `${l}\n`).join(''));
    expect(r.stderr.toString()).toBe(
      `sbx: ${A.checkpoint_id.slice(0, 16)} -> ${B.checkpoint_id.slice(0, 16)}: 2 added, 2 removed, 1 modified, 2 type changed, 1 mode changed, 1 owner changed\n`,
    );
    expect(r.status).toBe(1);
  });

  it('--json: both sides and every list with its old and new fields', async () => {
    const r = await d.sbx(['diff', A.checkpoint_id.slice(0, 12), `SHA256:${B.checkpoint_id.toUpperCase()}`, '--state-dir', d.stateDir, '--json']);
    expect(r.status).toBe(1);
    const out = JSON.parse(r.stdout.toString());
    const side = (c: CheckpointResult, task: string) => ({
      checkpoint_id: c.checkpoint_id,
      workspace: ws,
      task,
      created_at: expect.stringMatching(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/),
    });
    expect(out).toEqual({
      from: side(A, 'first'),
      to: side(B, 'second'),
      added: [
        { path: 'added', type: 'file', size: 6, mode: 0o644, sha256: sha256('hello\n') },
        { path_b64: LATIN.toString('base64'), type: 'file', size: 6, mode: 0o600, sha256: sha256('latin\n') },
      ],
      removed: [
        { path: 'dir/inner', type: 'file', size: 3, mode: 0o644, sha256: sha256('in\n') },
        { path: 'gone', type: 'file', size: 4, mode: 0o644, sha256: sha256('bye\n') },
      ],
      modified: [
        {
          path: 'edit',
          type: 'file',
          changed: ['content', 'size'],
          old_size: 4,
          new_size: 9,
          old_mode: 0o644,
          new_mode: 0o644,
          old_sha256: sha256('old\n'),
          new_sha256: sha256('new text\n'),
        },
      ],
      type_changed: [
        { path: 'dir', old_type: 'dir', new_type: 'file', old_size: 0, new_size: 11, old_mode: 0o755, new_mode: 0o644 },
        { path: 'swap', old_type: 'file', new_type: 'symlink', old_size: 7, new_size: 4, old_mode: 0o644, new_mode: 0o777 },
      ],
      mode_changed: [{ path: 'script', type: 'file', old_mode: 0o644, new_mode: 0o755 }],
      owner_changed: [{ path: 'owned', type: 'file', old_uid: 0, new_uid: 1234, old_gid: 0, new_gid: 4321 }],
      counts: { added: 2, removed: 2, modified: 1, type_changed: 2, mode_changed: 1, owner_changed: 1 },
      identical: false,
    });
  });

  it('A A: nothing on stdout, exit 0', async () => {
    const r = await d.sbx(['diff', A.checkpoint_id, A.checkpoint_id, '--state-dir', d.stateDir]);
    expect(r.stdout.toString()).toBe('');
    expect(r.stderr.toString()).toBe(
      `sbx: ${A.checkpoint_id.slice(0, 16)} -> ${A.checkpoint_id.slice(0, 16)}: identical; 0 added, 0 removed, 0 modified, 0 type changed, 0 mode changed, 0 owner changed\n`,
    );
    expect(r.status).toBe(0);
  });

  it('--task: its latest checkpoint against the one before it in the workspace (whatever its task); the first one: from null, everything added', async () => {
    const second = await d.sbx(['diff', '--task', 'second', '--state-dir', d.stateDir]);
    expect(second.stdout.toString()).toBe([`workspace: ${ws}`, `from: ${A.checkpoint_id}`, `to: ${B.checkpoint_id}`, ...LINES].map((l) => `${l}\n`).join(''));
    expect(second.status).toBe(1);
    const first = await d.sbx(['diff', '--task', 'first', '--state-dir', d.stateDir, '--json']);
    expect(first.status).toBe(1);
    const [only, ...rest] = JSON.parse(first.stdout.toString());
    expect(rest).toEqual([]);
    expect(only.from).toBeNull();
    expect(only.to.checkpoint_id).toBe(A.checkpoint_id);
    expect(only.added.map((e: { path: string }) => e.path)).toEqual(['dir', 'dir/inner', 'edit', 'gone', 'keep', 'owned', 'script', 'swap', 'touched']);
    expect(only.counts).toEqual({ added: 9, removed: 0, modified: 0, type_changed: 0, mode_changed: 0, owner_changed: 0 });
    const text = await d.sbx(['diff', '--task', 'first', '--state-dir', d.stateDir]);
    expect(text.stdout.toString().split('\n').slice(0, 4)).toEqual([`workspace: ${ws}`, 'from: null', `to: ${A.checkpoint_id}`, 'A dir']);
    expect(text.stderr.toString()).toBe(
      `sbx: nothing -> ${A.checkpoint_id.slice(0, 16)}: 9 added, 0 removed, 0 modified, 0 type changed, 0 mode changed, 0 owner changed (no checkpoint of this workspace before it: everything is added)\n`,
    );
    // A later checkpoint of another task: --task second still compares B with A, its predecessor.
    C = await checkpoint('third');
    const again = await d.sbx(['diff', '--task', 'second', '--state-dir', d.stateDir, '--json']);
    expect(
      JSON.parse(again.stdout.toString()).map((x: { from: { checkpoint_id: string }; to: { checkpoint_id: string } }) => [
        x.from.checkpoint_id,
        x.to.checkpoint_id,
      ]),
    ).toEqual([[A.checkpoint_id, B.checkpoint_id]]);
    const third = await d.sbx(['diff', '--task', 'third', '--state-dir', d.stateDir]);
    expect(third.stdout.toString()).toBe(`workspace: ${ws}\nfrom: ${B.checkpoint_id}\nto: ${C.checkpoint_id}\n`);
    expect(third.status).toBe(0);
    const none = await d.sbx(['diff', '--task', 'nope', '--state-dir', d.stateDir]);
    expect(none.stderr.toString()).toBe(`sbx: NOT_FOUND: diff: no published checkpoint of task "nope" in ${join(d.stateDir, 'checkpoints')}\n`);
    expect(none.status).toBe(125);
  });

  it('refusals: an unknown id, a bad argument, a manifest that does not verify (exit 125, a stable code)', async () => {
    const unknown = await d.sbx(['diff', '0'.repeat(64), B.checkpoint_id, '--state-dir', d.stateDir]);
    expect(unknown.stderr.toString()).toBe(
      `sbx: NOT_FOUND: diff: no checkpoint ${'0'.repeat(64)} in ${join(d.stateDir, 'checkpoints')} (never taken there, or removed by gc)\n`,
    );
    expect(unknown.status).toBe(125);
    const both = await d.sbx(['diff', A.checkpoint_id, B.checkpoint_id, '--task', 'x', '--state-dir', d.stateDir]);
    expect(both.stderr.toString()).toBe('sbx: INVALID_ARGUMENT: diff: give two checkpoints (A B) or --task T, not both\n');
    expect(both.status).toBe(125);
    const short = await d.sbx(['diff', 'abc', B.checkpoint_id, '--state-dir', d.stateDir]);
    expect(short.stderr.toString()).toBe('sbx: INVALID_ARGUMENT: diff: "abc": give at least 8 hex digits of the checkpoint id\n');
    expect(short.status).toBe(125);
    // A copy of the store with one byte of A's manifest changed: refused, whichever side it is.
    const copy = join(d.dir, 'store-copy');
    expect(spawnSync('cp', ['-a', join(d.stateDir, 'checkpoints'), copy]).status).toBe(0);
    const file = join(copy, 'manifests', `${A.checkpoint_id}.json`);
    chmodSync(file, 0o644);
    writeFileSync(file, readFileSync(file, 'utf8').replace('"task":"first"', '"task":"fixed"'));
    const key = join(d.stateDir, 'receipt-key.pub');
    const bad = await d.sbx(['diff', B.checkpoint_id, A.checkpoint_id, '--store', copy, '--public-key', key]);
    expect(bad.stdout.toString()).toBe('');
    expect(bad.stderr.toString()).toMatch(
      new RegExp(`^sbx: INVALID_ARGUMENT: diff: checkpoint ${A.checkpoint_id}: its manifest does not verify: .*not its id ${A.checkpoint_id}`),
    );
    expect(bad.status).toBe(125);
    // The copy's good pair still compares.
    const good = await d.sbx(['diff', B.checkpoint_id, C.checkpoint_id, '--store', copy, '--public-key', key]);
    expect(good.status).toBe(0);
  });

  it('the TS client: diffCheckpoints gives the --json result in process; a refusal is a SupervisorError with the code', async () => {
    const r = await diffCheckpoints(A.checkpoint_id, B.checkpoint_id.slice(0, 10), { stateDir: d.stateDir });
    const cli = JSON.parse((await d.sbx(['diff', A.checkpoint_id, B.checkpoint_id, '--state-dir', d.stateDir, '--json'])).stdout.toString());
    expect(r).toEqual(cli);
    const byTask = await diffCheckpoints(null, null, { task: 'second', stateDir: d.stateDir });
    expect(byTask).toEqual([cli]);
    await expect(diffCheckpoints('0'.repeat(64), A.checkpoint_id, { stateDir: d.stateDir })).rejects.toMatchObject({ code: 'NOT_FOUND' });
  });

  it("without --state-dir, the store is the running supervisor's (asked over its socket: $SBX_SOCKET or --socket), for diff, checkpoints, verify ID and restore; a --socket or $SBX_SOCKET nothing answers on, and --url, are refused", async () => {
    const env = { SBX_STATE_DIR: '' };
    const diff = await d.sbx(['diff', A.checkpoint_id, B.checkpoint_id], { env });
    expect([diff.status, diff.stdout.toString()]).toEqual([1, LINES.join('\n') + '\n']);
    const viaFlag = await d.sbx(['diff', A.checkpoint_id, B.checkpoint_id, '--socket', d.socketPath], { env: { ...env, SBX_SOCKET: '' } });
    expect([viaFlag.status, viaFlag.stdout.toString()]).toEqual([1, LINES.join('\n') + '\n']);
    const list = await d.sbx(['checkpoints', '--json'], { env });
    expect(list.status).toBe(0);
    expect((JSON.parse(list.stdout.toString()) as { checkpoint_id: string }[]).map((c) => c.checkpoint_id)).toEqual(
      expect.arrayContaining([A.checkpoint_id, B.checkpoint_id]),
    );
    const verified = await d.sbx(['verify', B.checkpoint_id], { env });
    expect([verified.status, verified.stderr.toString()]).toEqual([0, '']);
    expect(verified.stdout.toString()).toMatch(/^OK: checkpoint .*re-hashed from /);
    const target = join(d.dir, 'restored-via-socket');
    const restored = await d.sbx(['restore', A.checkpoint_id, target], { env });
    expect([restored.status, restored.stderr.toString()]).toEqual([0, '']);
    expect(readFileSync(join(target, 'edit'), 'utf8')).toBe('old\n');
    rmSync(target, { recursive: true });

    const dead = await d.sbx(['checkpoints', '--socket', join(d.dir, 'no-such.sock')], { env });
    expect(dead.status).toBe(125);
    expect(dead.stderr.toString()).toMatch(
      /^sbx: cannot reach the supervisor at .*no-such\.sock .*give --state-dir DIR to read a stopped supervisor's store\)\n$/,
    );
    // $SBX_SOCKET names a supervisor as --socket does: nothing there is refused too, not the default state dir read instead.
    const deadEnv = await d.sbx(['checkpoints'], { env: { ...env, SBX_SOCKET: join(d.dir, 'no-such.sock') } });
    expect(deadEnv.status).toBe(125);
    expect(deadEnv.stderr.toString()).toMatch(/^sbx: cannot reach the supervisor at .*no-such\.sock .*give --state-dir DIR/);
    const remote = await d.sbx(['checkpoints', '--url', 'ws://127.0.0.1:9/'], { env });
    expect(remote.status).toBe(125);
    expect(remote.stderr.toString()).toContain('INVALID_ARGUMENT: this command reads the checkpoint store directly');
  });
});
