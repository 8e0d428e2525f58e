// The generated reference pages and man pages (scripts/docs/generate.ts): what is committed is
// what the code's tables give today (else: run npm run docs), the check mode says which file
// differs, and the man pages render through groff and man-db without a warning.
import { spawnSync } from 'node:child_process';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ERROR_CODES } from '../../../ipc/errors.js';
import { parseConfig } from '../../../supervisor/config.js';
import { program as sbxProgram } from '../../../cli/sbx.js';
import { generate, ROOT, stale } from '../../../scripts/docs/generate.js';

const dirs: string[] = [];
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

const has = (tool: string) => spawnSync('sh', ['-c', `command -v ${tool}`]).status === 0;
/** man-db's man, not a stub such as a minimized image's. */
const hasManDb = /^man /.test(spawnSync('man', ['--version'], { encoding: 'utf8' }).stdout ?? '');
const MAN_PAGES = ['man/sbx.1', 'man/sandbox-supervisor.8'];

describe('generated docs', () => {
  it('are committed as the code generates them (else: run npm run docs)', async () => {
    const generated = await generate();
    expect([...generated.keys()].sort()).toEqual(['docs/reference/config.md', 'docs/reference/errors.md', 'docs/reference/metrics.md', ...MAN_PAGES].sort());
    for (const [path, text] of generated) {
      let committed: string | null = null;
      try {
        committed = readFileSync(join(ROOT, path), 'utf8');
      } catch {
        // missing: the message below says so
      }
      expect(committed, `${path} differs from what the code generates: run npm run docs and commit it`).toBe(text);
    }
  });

  it('are the same bytes on a second run (no clock, no host state)', async () => {
    const [a, b] = [await generate(), await generate()];
    expect(b).toEqual(a);
  });

  it('--check exits 0 on this checkout, writing nothing', () => {
    const r = spawnSync(process.execPath, [join(ROOT, 'node_modules/tsx/dist/cli.mjs'), join(ROOT, 'scripts/docs/generate.ts'), '--check'], {
      encoding: 'utf8',
      cwd: ROOT,
    });
    expect(r.stderr).toBe('');
    expect(r.stdout).toBe('');
    expect(r.status).toBe(0);
  }, 60_000);

  it('check mode names each file that differs or is missing', async () => {
    const root = mkdtempSync(join(tmpdir(), 'sbx-gen-docs-'));
    dirs.push(root);
    cpSync(join(ROOT, 'docs/reference'), join(root, 'docs/reference'), { recursive: true });
    cpSync(join(ROOT, 'man'), join(root, 'man'), { recursive: true });
    expect(await stale(root)).toEqual([]);
    writeFileSync(join(root, 'docs/reference/errors.md'), `${readFileSync(join(root, 'docs/reference/errors.md'), 'utf8')}edited by hand\n`);
    rmSync(join(root, 'man/sbx.1'));
    expect(await stale(root)).toEqual(['docs/reference/errors.md', 'man/sbx.1']);
  });

  it('cover every error code in order, every configuration key and every sbx command', async () => {
    const generated = await generate();
    const errors = generated.get('docs/reference/errors.md')!;
    expect([...errors.matchAll(/^\| `([A-Z_]+)`/gm)].map((m) => m[1])).toEqual(Object.keys(ERROR_CODES));
    const config = generated.get('docs/reference/config.md')!;
    const documented = new Set([...config.matchAll(/^\| `([A-Za-z0-9.]+)`/gm)].map((m) => m[1]));
    const leaves = (o: Record<string, unknown>, prefix = ''): string[] =>
      Object.entries(o).flatMap(([k, v]) =>
        v !== null && typeof v === 'object' && !Array.isArray(v) ? leaves(v as Record<string, unknown>, `${prefix}${k}.`) : [`${prefix}${k}`],
      );
    const { source: _source, ...parsed } = parseConfig({}, 'test', {});
    expect(leaves(parsed).filter((k) => !documented.has(k))).toEqual([]);
    const man = generated.get('man/sbx.1')!;
    for (const c of sbxProgram.commands) expect(man, c.name()).toContain(`.SS "sbx ${c.name().replace(/-/g, '\\-')}"`);
    for (const section of ['NAME', 'SYNOPSIS', 'DESCRIPTION', 'OPTIONS', 'COMMANDS', 'ENVIRONMENT', 'FILES', '"EXIT STATUS"', '"SEE ALSO"']) {
      expect(man).toMatch(new RegExp(`^\\.SH ${section.replace(/"/g, '"?')}$`, 'm'));
    }
  });
});

describe.skipIf(!has('groff'))(
  has('groff') ? 'man pages through groff' : 'man pages through groff (skipped: groff is not installed; apt-get install groff-base)',
  () => {
    it.each(MAN_PAGES)('%s renders with every warning on and none given', (page) => {
      const r = spawnSync('groff', ['-man', '-Tutf8', '-ww', '-z', join(ROOT, page)], { encoding: 'utf8' });
      expect(r.stderr).toBe('');
      expect(r.status).toBe(0);
    });
  },
);

describe.skipIf(!hasManDb)(
  hasManDb ? 'man pages through man-db' : 'man pages through man-db (skipped: man-db is not installed; apt-get install man-db groff-base)',
  () => {
    it.each([
      ['man/sbx.1', 'SBX(1)', /^NAME\n {7}sbx - Launch commands through sandbox-supervisor/m],
      ['man/sandbox-supervisor.8', 'SANDBOX-SUPERVISOR(8)', /^NAME\n {7}sandbox-supervisor - Runs commands to the end/m],
    ])('man -l %s renders without warnings', (page, title, name) => {
      const r = spawnSync('man', ['--warnings', '-E', 'UTF-8', '-l', join(ROOT, page)], {
        encoding: 'utf8',
        env: { ...process.env, MANWIDTH: '80', MAN_KEEP_FORMATTING: '', MANPAGER: 'cat', PAGER: 'cat' },
      });
      expect(r.stderr).toBe('');
      expect(r.status).toBe(0);
      expect(r.stdout.split('\n')[0]).toMatch(new RegExp(`^${title.replace(/[()]/g, '\\$&')} +`));
      expect(r.stdout).toMatch(name);
      expect(r.stdout).toMatch(/^EXIT STATUS$/m);
    });
  },
);
