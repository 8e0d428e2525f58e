// Every relative link in README.md, CHANGELOG.md and docs/**/*.md resolves: the file (or
// directory) exists in the checkout, and a #anchor names a heading of the linked Markdown file
// by GitHub's slug rules (lowercase; punctuation but - and _ dropped; spaces to -; repeats -1, -2).
// Links inside code (fenced blocks, inline spans) are text, not links, and are not checked.
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';

const ROOT = resolve(import.meta.dirname, '../../..');

/** README.md, CHANGELOG.md and every .md under docs/, as paths relative to ROOT. */
function docFiles(): string[] {
  const out = ['README.md', 'CHANGELOG.md'];
  const walk = (dir: string): void => {
    for (const e of readdirSync(join(ROOT, dir), { withFileTypes: true }).sort((a, b) => a.name.localeCompare(b.name))) {
      const p = join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith('.md')) out.push(p);
    }
  };
  walk('docs');
  return out;
}

/** The text with fenced code blocks blanked (line count kept) and inline code spans removed. */
function withoutCode(text: string): string[] {
  let fence: string | null = null;
  return text.split('\n').map((line) => {
    const m = line.match(/^\s*(```+|~~~+)/);
    if (fence) {
      if (m && m[1]!.startsWith(fence)) fence = null;
      return '';
    }
    if (m) {
      fence = m[1]!;
      return '';
    }
    return line.replace(/(`+)[\s\S]*?\1/g, '');
  });
}

/**
 * GitHub's anchor for a heading's text (github-slugger): inline markup dropped, lowercased,
 * every character but letters, digits, spaces, - and _ removed, each space a -.
 */
export function slug(heading: string): string {
  const text = heading
    .replace(/!?\[([^\]]*)\]\([^)]*\)/g, '$1') // links and images: their text
    .replace(/<[^>]+>/g, '') // inline HTML
    .replace(/[`*]/g, '');
  return text
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\p{M}\- _]/gu, '')
    .replace(/ /g, '-');
}

/** Every anchor a Markdown file has: its ATX headings' slugs, repeats numbered as GitHub does. */
function anchors(file: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set<string>();
  let fence: string | null = null;
  for (const line of readFileSync(file, 'utf8').split('\n')) {
    const f = line.match(/^\s*(```+|~~~+)/);
    if (fence) {
      if (f && f[1]!.startsWith(fence)) fence = null;
      continue;
    }
    if (f) {
      fence = f[1]!;
      continue;
    }
    const h = line.match(/^#{1,6}\s+(.*?)\s*#*\s*$/);
    if (!h) continue;
    const base = slug(h[1]!);
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    out.add(n === 0 ? base : `${base}-${n}`);
  }
  return out;
}

/** The links of a file that do not resolve, each as `line N: target (why)`. */
function brokenLinks(file: string): string[] {
  const abs = join(ROOT, file);
  const broken: string[] = [];
  withoutCode(readFileSync(abs, 'utf8')).forEach((line, i) => {
    const targets = [...line.matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)].map((m) => m[1]!);
    const ref = line.match(/^\s*\[[^\]]+\]:\s+<?(\S+?)>?(?:\s|$)/);
    if (ref) targets.push(ref[1]!);
    for (const target of targets) {
      if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // https:, mailto:: not a file of the checkout
      const [path, anchor] = target.split('#', 2) as [string, string | undefined];
      const dest = path === '' ? abs : resolve(dirname(abs), decodeURIComponent(path));
      if (!existsSync(dest)) {
        broken.push(`line ${i + 1}: ${target} (no ${relative(ROOT, dest)})`);
        continue;
      }
      if (anchor !== undefined && statSync(dest).isFile() && dest.endsWith('.md') && !anchors(dest).has(anchor)) {
        broken.push(`line ${i + 1}: ${target} (no heading #${anchor} in ${relative(ROOT, dest)})`);
      }
    }
  });
  return broken;
}

describe('relative links in the docs', () => {
  it('slugs headings as GitHub does', () => {
    expect(slug('Tasks: complete(task)')).toBe('tasks-completetask');
    expect(slug('`sbx bridge`')).toBe('sbx-bridge');
    expect(slug('Seal, close, quotas, disk space and retention')).toBe('seal-close-quotas-disk-space-and-retention');
    expect(slug('Configuration (`remote.*`)')).toBe('configuration-remote');
    expect(slug('What subreaper mode gives up')).toBe('what-subreaper-mode-gives-up');
  });

  it.each(docFiles())('%s: every relative link resolves, and every #anchor to a heading', (file) => {
    expect(brokenLinks(file)).toEqual([]);
  });
});
