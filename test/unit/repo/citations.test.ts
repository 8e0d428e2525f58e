// Everything the code and the docs cite lives in the repository (issue 31): no file mentions
// the design notes or product spec that lived beside the checkout (a clone has neither), and
// every cited docs/… or man/… file exists, with the section or numbered fact it names, and
// every relative Markdown link resolves.
// Reads the checkout's files (git ls-files: tracked and untracked, not ignored) as text.
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';

const ROOT = resolve(import.meta.dirname, '../../..');

const CODE_DIRS = ['supervisor', 'ipc', 'cli', 'scripts', 'test', 'native-helpers', 'systemd'];

/** What a clone cannot open. Spelled in pieces so that this file does not match itself. */
const FORBIDDEN: { name: string; re: RegExp }[] = [
  { name: '../' + 'shared', re: new RegExp('\\.\\./' + 'shared\\b') },
  { name: 'SPEC' + '.md', re: new RegExp('\\bSPEC' + '\\.md\\b') },
  { name: 'DESIGN' + '.md', re: new RegExp('\\bDESIGN' + '\\.md\\b') },
  { name: 'the ' + 'SPEC', re: new RegExp('\\bthe ' + 'SPEC\\b') },
];

/** Files under `paths` (relative to the root), tracked or untracked but not ignored. */
function filesUnder(paths: string[]): string[] {
  const out = execFileSync('git', ['ls-files', '-z', '-co', '--exclude-standard', '--', ...paths], { cwd: ROOT, encoding: 'utf8' });
  return out.split('\0').filter((f) => f && existsSync(join(ROOT, f)) && statSync(join(ROOT, f)).isFile());
}

/** A file's text with comment line breaks joined, so a citation split across lines reads as one. */
function text(file: string): string {
  return readFileSync(join(ROOT, file), 'latin1').replace(/[ \t]*\n[ \t]*(?:\/\/|#|\*(?!\/))?[ \t]*/g, ' ');
}

/** Headings of a Markdown file, without #, backticks and surrounding space. */
function headings(file: string): string[] {
  return readFileSync(join(ROOT, file), 'utf8')
    .split('\n')
    .filter((l) => /^#{1,6} /.test(l))
    .map((l) => l.replace(/^#+ /, '').replaceAll('`', '').trim());
}

/** Numbers of docs/design/facts.md's facts ("17. **...**" at the start of a line). */
function factNumbers(): Set<number> {
  const file = join(ROOT, 'docs/design/facts.md');
  if (!existsSync(file)) return new Set();
  return new Set([...readFileSync(file, 'utf8').matchAll(/^(\d+)\. \*\*/gm)].map((m) => Number(m[1])));
}

/** Every problem with one file's citations (`body`: its text): a forbidden mention, a missing file, section or fact. */
function problems(file: string, facts: Set<number>, body = text(file)): string[] {
  const found: string[] = [];
  for (const f of FORBIDDEN) if (f.re.test(body)) found.push(`${file}: mentions ${f.name}`);
  // A cited document: docs/….md or man/…(.1|.8), not inside a URL or another path.
  for (const m of body.matchAll(/(?<![\w./-])((?:docs|man)\/[A-Za-z0-9_./-]*?\.(?:md|1|8))(?![\w-])(?:,?\s+"([^"]+)"|\s+(\d+(?:(?:,\s*|\s+and\s+)\d+)*))?/g)) {
    const [, path, section, numbers] = m;
    if (!existsSync(join(ROOT, path))) {
      found.push(`${file}: cites ${path}, which does not exist`);
      continue;
    }
    // "X": a section (a heading that starts with X) or a name the document spells out (tasks/).
    if (
      section !== undefined &&
      path.endsWith('.md') &&
      !headings(path).some((h) => h.startsWith(section)) &&
      !readFileSync(join(ROOT, path), 'utf8').includes(section)
    ) {
      found.push(`${file}: cites ${path} "${section}", which has no such section or name`);
    }
    if (numbers !== undefined && path === 'docs/design/facts.md') {
      for (const n of numbers.split(/,\s*|\s+and\s+/).map(Number)) if (!facts.has(n)) found.push(`${file}: cites ${path} ${n}, which has no fact ${n}`);
    }
  }
  // A Markdown link to a local file ([text](../reference/protocol.md#anchor)): relative to the page.
  if (file.endsWith('.md')) {
    for (const m of body.matchAll(/\]\(([^()\s]+?)(?:#[^()\s]*)?\)/g)) {
      const target = m[1];
      if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // https:, mailto:
      if (!existsSync(join(ROOT, dirname(file), target))) found.push(`${file}: links to ${target}, which does not exist`);
    }
  }
  return found;
}

/** This file spells out bad citations on purpose (its own check below). */
const SELF = 'test/unit/repo/citations.test.ts';

function check(paths: string[]): string[] {
  const facts = factNumbers();
  return filesUnder(paths)
    .filter((f) => f !== SELF)
    .flatMap((f) => problems(f, facts));
}

describe('citations', () => {
  it('docs/design/facts.md has its facts numbered 1 to 32 at least, each once', () => {
    const all = [...readFileSync(join(ROOT, 'docs/design/facts.md'), 'utf8').matchAll(/^(\d+)\. \*\*/gm)].map((m) => Number(m[1]));
    expect(new Set(all).size).toBe(all.length);
    for (let n = 1; n <= 32; n++) expect(all).toContain(n);
  });

  it('the code cites only what is in the repository', () => {
    expect(check(CODE_DIRS)).toEqual([]);
  });

  it('docs/ cites only what is in the repository', () => {
    expect(check(['docs'])).toEqual([]);
  });

  it('README.md and CHANGELOG.md cite only what is in the repository', () => {
    expect(check(['README.md', 'CHANGELOG.md'])).toEqual([]);
  });

  it('finds what it looks for: forbidden names, a missing file, section or fact', () => {
    const facts = factNumbers();
    expect(problems('x', facts, 'see ../' + 'shared/x and SPEC' + '.md "Names"')).toEqual(['x: mentions ../' + 'shared', 'x: mentions SPEC' + '.md']);
    expect(problems('x', facts, 'as DESIGN' + '.md 3 and the ' + 'SPEC say')).toEqual(['x: mentions DESIGN' + '.md', 'x: mentions the ' + 'SPEC']);
    expect(problems('x', facts, 'SPECIAL; docs/design/facts.md 1, 2 and 32; docs/reference/contract.md "Error codes"; https://example.com/docs/a.md')).toEqual(
      [],
    );
    expect(problems('x', facts, '(docs/design/facts.md 9, 999)')).toEqual(['x: cites docs/design/facts.md 999, which has no fact 999']);
    expect(problems('x', facts, 'docs/reference/contract.md "No such part"')).toEqual([
      'x: cites docs/reference/contract.md "No such part", which has no such section or name',
    ]);
    expect(problems('x', facts, 'see docs/reference/nothing-here.md.')).toEqual(['x: cites docs/reference/nothing-here.md, which does not exist']);
    expect(problems('docs/guide/x.md', facts, '[p](../reference/protocol.md#methods), [w](https://x.io/a.md), [n](../reference/nope.md)')).toEqual([
      'docs/guide/x.md: links to ../reference/nope.md, which does not exist',
    ]);
  });
});
