#!/usr/bin/env node
// Makes sbx's startup snapshot and launcher (run by `npm run build`, `prepare` and `pretest`
// after tsc): dist/cli/sbx.snapshot.cjs, sbx and everything it loads but the modules it
// imports lazily (verify, restore, checkpoints, diff: they start from sbx.js), bundled into one
// script by esbuild; dist/cli/sbx.blob, a V8 startup snapshot of it (node --build-snapshot,
// https://nodejs.org/docs/latest-v20.x/api/cli.html#--build-snapshot), valid for this node
// only, which dist/cli/sbx.blob.node names and identifies; dist/cli/sbx, the launcher (cli/sbx-launcher.sh)
// that starts it. When the snapshot cannot be made, the blob is left out with a warning and
// the launcher starts sbx.js: the build does not fail for it.
import { execFileSync } from 'node:child_process';
import { chmodSync, copyFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '../..');
const out = join(root, 'dist/cli');
const bundle = join(out, 'sbx.snapshot.cjs');
const blob = join(out, 'sbx.blob');
const stamp = join(out, 'sbx.blob.node');

copyFileSync(join(root, 'cli/sbx-launcher.sh'), join(out, 'sbx'));
chmodSync(join(out, 'sbx'), 0o755);
rmSync(blob, { force: true });
rmSync(stamp, { force: true });
try {
  const { buildSync } = await import('esbuild');
  buildSync({
    entryPoints: [join(out, 'sbx.js')],
    outfile: bundle,
    bundle: true,
    platform: 'node',
    // iife, not cjs: the snapshot builder has no `module`, and sbx.js's exports (`program`, read by
    // scripts/docs/generate.ts) would need one.
    format: 'iife',
    target: 'node20',
    // Loaded by import() at run time, which a snapshot's main cannot do (the launcher starts
    // these commands from sbx.js).
    external: ['./checkpoints.js', './tasks.js', '../core/receipts/verify.js'],
    // ipc/version.ts finds package.json from its own URL: the bundle's, two levels below it.
    define: { 'import.meta.url': '__sbxBundleUrl' },
    banner: { js: "var __sbxBundleUrl = require('node:url').pathToFileURL(__filename).href;" },
    logLevel: 'warning',
  });
  execFileSync(process.execPath, ['--snapshot-blob', blob, '--build-snapshot', bundle], { stdio: ['ignore', 'ignore', 'pipe'] });
  // The node that made it, as the launcher checks it: path, version, and the file's identity
  // (st_dev:st_ino:st_size:st_mtime, as stat -L -c '%d:%i:%s:%Y' prints it).
  const st = statSync(process.execPath);
  writeFileSync(stamp, `${process.execPath}\n${process.version}\n${st.dev}:${st.ino}:${st.size}:${Math.floor(st.mtimeMs / 1000)}\n`);
} catch (err) {
  rmSync(blob, { force: true });
  const detail = err.stderr ? String(err.stderr).trim() : err.message;
  process.stderr.write(`sbx-snapshot: no startup snapshot (sbx starts from sbx.js, about 30 ms slower): ${detail}\n`);
}
