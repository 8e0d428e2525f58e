// The file methods as sessions (docs/guide/files.md): each becomes the launch params of an honest
// session (argv: the file tool run by this Node, or tar), launched through the normal path, so
// admission, invocation keys, users, receipts, the workspace clock and task closes cover it.
// Owns the argv and the size limit; not the launch (Supervisor.launch) nor the bytes (clients).
import { chmodSync, copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, parse, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { SupervisorError } from '../../ipc/errors.js';
import type { DownloadParams, LaunchParams, ReadFileParams, UploadParams, WriteFileParams } from '../../ipc/protocol.js';
import type { Config } from '../config.js';

let toolPath: string | null = null;

/**
 * The compiled file tool (dist/supervisor/files/file-tool.js), beside this module once built.
 * A session with `user` runs it as that user, who must be able to read it: when the checkout
 * is not readable by others (a 0700 home such as /root/project), the tool and every module it
 * imports are copied once into a root-owned 0755 directory of the temp dir (files 0644,
 * removed at exit).
 */
export function fileToolPath(): string {
  if (toolPath !== null && existsSync(toolPath)) return toolPath;
  const here = dirname(fileURLToPath(import.meta.url));
  const tried = [join(here, 'file-tool.js'), join(here, '../../dist/supervisor/files/file-tool.js')];
  const built = tried.find((p) => existsSync(p));
  if (built === undefined) throw new SupervisorError('INTERNAL', `the file tool is not built (run npm run build); looked in: ${tried.join(', ')}`);
  toolPath = readableByAll(built) ? built : publishTool(built);
  return toolPath;
}

/** Whether every user can read path: o+r on it and o+x on each directory above it. */
function readableByAll(path: string): boolean {
  if ((statSync(path).mode & 0o004) === 0) return false;
  for (let dir = dirname(path); ; dir = dirname(dir)) {
    if ((statSync(dir).mode & 0o001) === 0) return false;
    if (dir === parse(dir).root) return true;
  }
}

/** The relative specifiers a compiled module imports (`from './x.js'`, `import('../y.js')`); node: and bare ones are not files of ours. */
function relativeImports(source: string): string[] {
  return [...source.matchAll(/(?:\bfrom\s*|\bimport\s*\(\s*|^import\s*)'(\.{1,2}\/[^']+)'/gm)].map((m) => m[1]!);
}

/**
 * The tool's module and every module of ours it imports, followed through their relative
 * imports (so a new import of the tool's is copied too), as paths relative to dist/.
 */
export function toolModules(toolFile: string): string[] {
  const distRoot = join(dirname(toolFile), '../..');
  const seen = new Set<string>();
  const queue = [toolFile];
  while (queue.length) {
    const file = queue.pop()!;
    if (seen.has(file)) continue;
    seen.add(file);
    for (const spec of relativeImports(readFileSync(file, 'utf8'))) queue.push(join(dirname(file), spec));
  }
  return [...seen].map((file) => relative(distRoot, file)).sort();
}

/**
 * Copies the tool (toolFile, in dist/supervisor/files/) and its modules into a fresh 0755
 * directory (mkdtemp: ours alone), laid out as under dist/, with a package.json making them ES
 * modules; returns the copy of file-tool.js. The native helper is not copied: the tool's file
 * primitives fall back to node:fs without it (core/fs/native.ts nativeOrNull).
 */
export function publishTool(toolFile: string): string {
  const distRoot = join(dirname(toolFile), '../..');
  const dir = mkdtempSync(join(tmpdir(), 'sandbox-supervisor-file-tool-'));
  process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
  for (const name of toolModules(toolFile)) {
    mkdirSync(dirname(join(dir, name)), { recursive: true, mode: 0o755 });
    copyFileSync(join(distRoot, name), join(dir, name));
    chmodSync(join(dir, name), 0o644);
  }
  writeFileSync(join(dir, 'package.json'), '{"type":"module"}\n', { mode: 0o644 });
  chmodSync(dir, 0o755);
  return join(dir, relative(distRoot, toolFile));
}

/** Largest write_file size_bytes: files.maxBytes, else drain.quotaBytes; 0: no limit. */
export function fileMaxBytes(config: Config): number {
  return config.files.maxBytes ?? config.drain.quotaBytes;
}

type Common = { key?: string; task?: string; user?: string; timeout_ms?: number };
const common = (p: Common): Pick<LaunchParams, 'invocation_key' | 'task' | 'user' | 'cwd' | 'timeout_ms'> => ({
  cwd: '/',
  invocation_key: p.key,
  task: p.task,
  user: p.user,
  timeout_ms: p.timeout_ms,
});

/** write_file: `node file-tool.js write PATH --mode 0644 --size N`, stdin streamed. LIMIT_EXCEEDED {limit: "file_bytes"} past the limit. */
export function writeFileLaunch(config: Config, p: WriteFileParams): LaunchParams {
  const max = fileMaxBytes(config);
  if (max > 0 && p.size_bytes > max) {
    throw new SupervisorError('LIMIT_EXCEEDED', `write_file: size_bytes ${p.size_bytes} is over files.maxBytes ${max}`, {
      limit: 'file_bytes',
      size_bytes: p.size_bytes,
      max_bytes: max,
    });
  }
  const mode = (p.mode ?? 0o644).toString(8).padStart(4, '0');
  return { ...common(p), argv: [process.execPath, fileToolPath(), 'write', p.path, '--mode', mode, '--size', String(p.size_bytes)], stdin: true };
}

/** read_file: `node file-tool.js read PATH`; the bytes are its stdout. */
export function readFileLaunch(p: ReadFileParams): LaunchParams {
  return { ...common(p), argv: [process.execPath, fileToolPath(), 'read', p.path] };
}

/** upload: `node file-tool.js upload DIR`, the tar on stdin (the tool runs `tar -x -p` into a staging dir inside DIR, then merges it: upload.ts). */
export function uploadLaunch(p: UploadParams): LaunchParams {
  return { ...common(p), argv: [process.execPath, fileToolPath(), 'upload', p.dir], stdin: true };
}

/** download: `tar -c -f - -C DIR .`; the tar is its stdout. */
export function downloadLaunch(p: DownloadParams): LaunchParams {
  return { ...common(p), argv: ['tar', '-c', '-f', '-', '-C', p.dir, '.'] };
}
