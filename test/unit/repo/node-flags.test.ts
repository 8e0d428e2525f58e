// Every way the supervisor is started passes the node flags it runs with (supervisor/node-flags.ts):
// package.json's start, the systemd unit's ExecStart lines, install.sh's launcher and the Python
// tests' daemon; main.ts's #! line stays portable. Reads the checkout's files as text.
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import { SUPERVISOR_NODE_FLAGS } from '../../../supervisor/node-flags.js';

const ROOT = resolve(import.meta.dirname, '../../..');
const read = (path: string) => readFileSync(join(ROOT, path), 'utf8');
const flags = SUPERVISOR_NODE_FLAGS.join(' ');

describe('the node flags of every start', () => {
  it('npm start passes them', () => {
    const pkg = JSON.parse(read('package.json')) as { scripts: { start: string } };
    expect(pkg.scripts.start).toBe(`exec node ${flags} dist/supervisor/main.js serve`);
  });

  it("the systemd unit's ExecStart lines, commented or not, pass them", () => {
    const lines = read('systemd/sandbox-supervisor.service')
      .split('\n')
      .filter((l) => /^#?ExecStart=@NODE@/.test(l));
    expect(lines.length).toBe(2);
    for (const l of lines) expect(l).toMatch(new RegExp(`^#?ExecStart=@NODE@ ${flags} @LIBDIR@/dist/supervisor/main.js serve`));
  });

  it("install.sh's launcher passes them", () => {
    const launcher = read('scripts/install.sh')
      .split('\n')
      .filter((l) => l.includes('/dist/supervisor/main.js "$@"'));
    expect(launcher).toEqual([
      `printf '#!/bin/sh\\nexec %s ${flags} %s/dist/supervisor/main.js "$@"\\n' "$node_bin" "$libdir" > "$root$prefix/bin/sandbox-supervisor"`,
    ]);
  });

  it("main.ts's #! line stays plain (busybox's env has no -S): run as a program, it warns at start instead", () => {
    expect(read('supervisor/main.ts').split('\n')[0]).toBe('#!/usr/bin/env node');
  });

  it("the Python tests' daemon passes them", () => {
    expect(read('clients/python/tests/daemon.py')).toContain(`NODE_FLAGS = [${SUPERVISOR_NODE_FLAGS.map((f) => `"${f}"`).join(', ')}]`);
  });
});
