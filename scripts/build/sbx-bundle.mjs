#!/usr/bin/env node
// Makes sbx's bundle and launcher (run by `npm run build`, `prepare` and `pretest` after tsc):
// dist/cli/sbx.bundle.cjs, sbx and everything it loads at start in one script (esbuild), so a
// start reads and compiles one file instead of loading ~100 modules; the modules it imports
// lazily (verify, restore, checkpoints, diff) stay beside it and are imported from there.
// dist/cli/sbx is the launcher (cli/sbx-launcher.sh), and dist/cli/sbx.node the node that built
// it, which the launcher runs. When the bundle cannot be made (no esbuild), it is left out with
// a warning and the launcher starts sbx.js: the build does not fail for it.
import { chmodSync, copyFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '../..');
const out = join(root, 'dist/cli');
const bundle = join(out, 'sbx.bundle.cjs');

copyFileSync(join(root, 'cli/sbx-launcher.sh'), join(out, 'sbx'));
chmodSync(join(out, 'sbx'), 0o755);
writeFileSync(join(out, 'sbx.node'), `${process.execPath}\n`);
// What the startup snapshot of earlier builds left (the launcher no longer reads them).
for (const old of ['sbx.blob', 'sbx.blob.node', 'sbx.snapshot.cjs']) rmSync(join(out, old), { force: true });
rmSync(bundle, { force: true });
try {
  const { buildSync } = await import('esbuild');
  buildSync({
    entryPoints: [join(out, 'sbx.js')],
    outfile: bundle,
    bundle: true,
    platform: 'node',
    // iife: sbx.js's exports (`program`, read by scripts/docs/generate.ts) need no `module` here.
    format: 'iife',
    target: 'node20',
    // Imported at run time from beside the bundle (dist/cli/, dist/core/): only the commands that need them pay for them.
    external: ['./checkpoints.js', './tasks.js', '../core/receipts/verify.js'],
    // ipc/version.ts finds package.json from its own URL: the bundle's, two levels below it.
    define: { 'import.meta.url': '__sbxBundleUrl' },
    banner: { js: "var __sbxBundleUrl = require('node:url').pathToFileURL(__filename).href;" },
    logLevel: 'warning',
  });
} catch (err) {
  rmSync(bundle, { force: true });
  process.stderr.write(`sbx-bundle: no bundle (sbx starts from sbx.js, about 40 ms slower): ${err.message}\n`);
}
