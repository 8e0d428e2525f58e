// The package version, read once from package.json (source and compiled layouts; else 0.0.0): sbx --version,
// hello's `server`, status's `version`; not the protocol version (docs/reference/protocol.md "hello").
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

function read(): string {
  for (const rel of ['../package.json', '../../package.json']) {
    try {
      const pkg = JSON.parse(readFileSync(fileURLToPath(new URL(rel, import.meta.url)), 'utf8')) as { name?: string; version?: string };
      if (pkg.name === 'sandbox-supervisor' && pkg.version) return pkg.version;
    } catch {
      // try the next layout
    }
  }
  return '0.0.0';
}

export const VERSION = read();
