// The layers of the source tree (docs/design/architecture.md "Layout"): ipc/ (the wire) at the
// bottom, core/ (what the supervisor and the offline tools share) above it, then supervisor/
// (the daemon) and cli/ (sbx) on top, side by side. Fails on any import, static or dynamic,
// that points up or across: cli/ or core/ reaching into supervisor/, anything reaching cli/.
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, normalize, relative, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';

const ROOT = resolve(import.meta.dirname, '../../..');
const TOPS = ['ipc', 'core', 'supervisor', 'cli'] as const;
type Top = (typeof TOPS)[number];
/** What each top-level dir may import from (besides itself, node: and packages). */
const MAY_IMPORT: Record<Top, Top[]> = { ipc: [], core: ['ipc'], supervisor: ['core', 'ipc'], cli: ['core', 'ipc'] };

function sources(dir: string): string[] {
  const out: string[] = [];
  for (const e of readdirSync(join(ROOT, dir), { withFileTypes: true })) {
    const rel = join(dir, e.name);
    if (e.isDirectory()) {
      if (e.name !== 'node_modules') out.push(...sources(rel));
    } else if (e.name.endsWith('.ts')) out.push(rel);
  }
  return out;
}

/** Every relative specifier a file imports (import/export from, import(), side-effect imports). */
function specifiers(text: string): string[] {
  const out: string[] = [];
  for (const m of text.matchAll(/(?:\bfrom\s*|\bimport\s*\(\s*|^\s*import\s+)(['"])(\.{1,2}\/[^'"]+)\1/gm)) out.push(m[2]);
  return out;
}

/** The edges from file to the top-level dirs it must not import, as "file -> target". */
function violations(): string[] {
  const bad: string[] = [];
  for (const top of TOPS) {
    for (const file of sources(top)) {
      for (const spec of specifiers(readFileSync(join(ROOT, file), 'utf8'))) {
        const target = normalize(join(dirname(file), spec));
        const targetTop = relative('.', target).split('/')[0] as Top;
        if (!TOPS.includes(targetTop) || targetTop === top) continue;
        if (!MAY_IMPORT[top].includes(targetTop)) bad.push(`${file} -> ${target}`);
      }
    }
  }
  return bad;
}

describe('source layers', () => {
  it('finds the imports it checks (a parser that saw none would pass anything)', () => {
    const sbx = specifiers(readFileSync(join(ROOT, 'cli/sbx.ts'), 'utf8'));
    expect(sbx).toContain('../ipc/client.js');
    expect(sbx).toContain('../core/receipts/verify.js'); // a dynamic import()
    expect(specifiers("import x from '../supervisor/a.js';\nconst y = await import('../cli/b.js');\nexport { z } from './c.js';")).toEqual([
      '../supervisor/a.js',
      '../cli/b.js',
      './c.js',
    ]);
  });

  it('no import points up: cli/ and core/ never reach supervisor/, ipc/ reaches nothing above it, nothing reaches cli/', () => {
    expect(violations()).toEqual([]);
  });
});
