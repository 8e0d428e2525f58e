// Workspace trees for the scan tests, and the close digest computed independently of the
// supervisor: python3's os.fwalk walks with directory fds (fstatat), so it reaches any depth;
// it writes the same line format (escapes and symlink targets included) and sorts as
// JavaScript does (UTF-16 code units).
import { spawnSync } from 'node:child_process';
import { mkdirSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

function run(argv: string[], cwd?: string): string {
  const r = spawnSync(argv[0], argv.slice(1), { cwd, encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`${argv.join(' ')}: exit ${r.status} ${r.signal ?? ''}: ${r.stderr}`);
  return r.stdout;
}

/**
 * A chain of `depth` directories named `name` (default d) under dir, each made through its
 * parent's fd (no long path), with content (default "x\n") in the file f at the bottom. One
 * python3, not a shell loop: `mkdir d && cd -P d` forks per level (9 s for 2,100 levels here).
 */
export function makeDeepTree(dir: string, depth: number, options: { name?: string; content?: string } = {}): void {
  mkdirSync(dir, { recursive: true });
  const py = [
    'import os, sys',
    "fd = os.open('.', os.O_RDONLY | os.O_DIRECTORY)",
    'for _ in range(int(sys.argv[1])):',
    '    os.mkdir(sys.argv[2], dir_fd=fd)',
    '    c = os.open(sys.argv[2], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)',
    '    os.close(fd)',
    '    fd = c',
    "f = os.open('f', os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666, dir_fd=fd)",
    'os.write(f, os.fsencode(sys.argv[3]))',
  ].join('\n');
  run(['python3', '-c', py, String(depth), options.name ?? 'd', options.content ?? 'x\n'], dir);
}

/** Removes a tree of any depth (GNU rm walks with fts and directory fds). */
export function removeTree(dir: string): void {
  run(['rm', '-rf', '--', dir]);
}

/** Non-UTF-8 names in the mixed tree (bytes). */
export const NON_UTF8_NAMES = [Buffer.from([0xff, 0x41]), Buffer.from([0x80])];

/**
 * Files, dirs, a fifo, a socket, symlinks (dangling, to /, to /etc planted as a directory name,
 * a self loop, to . and ..), UTF-8 names whose code point order differs from UTF-16 order,
 * and with nonUtf8 two names that are not UTF-8 beside one that decodes alike ("\uFFFDA").
 * 8 regular files (10 bytes) and 18 entries; with nonUtf8 11 files (12 bytes) and 22 entries.
 */
export function makeMixedTree(dir: string, options: { nonUtf8?: boolean } = {}): void {
  mkdirSync(join(dir, 'sub', 'deeper'), { recursive: true });
  writeFileSync(join(dir, 'a'), '12345');
  writeFileSync(join(dir, 'empty'), '');
  writeFileSync(join(dir, 'sub', 'b'), '123');
  writeFileSync(join(dir, 'sub', 'deeper', 'c'), 'x');
  writeFileSync(join(dir, 'sp ace'), '');
  writeFileSync(join(dir, '\u00e9'), ''); // é: two UTF-8 bytes
  writeFileSync(join(dir, '\uff21'), 'y'); // fullwidth A: after the emoji by code point, before it in UTF-16
  writeFileSync(join(dir, '\u{1f600}'), '');
  symlinkSync('nowhere', join(dir, 'dangling'));
  symlinkSync('/', join(dir, 'root'));
  symlinkSync('/etc', join(dir, 'etc'));
  symlinkSync('loop', join(dir, 'loop'));
  symlinkSync('.', join(dir, 'up'));
  symlinkSync('..', join(dir, 'sub', 'back'));
  run(['mkfifo', join(dir, 'pipe')]);
  run(['python3', '-c', 'import socket,sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])', join(dir, 'sock')]);
  if (options.nonUtf8) {
    const base = Buffer.from(dir + '/');
    writeFileSync(Buffer.concat([base, NON_UTF8_NAMES[0]]), '1');
    writeFileSync(join(dir, '\ufffdA'), '');
    mkdirSync(Buffer.concat([base, NON_UTF8_NAMES[1]]));
    writeFileSync(Buffer.concat([base, NON_UTF8_NAMES[1], Buffer.from('/inner')]), '2');
  }
}

const PY_DIGEST = String.raw`
import hashlib, os, stat, sys
sys.setrecursionlimit(100000)  # os.fwalk recurses once per level
root = os.fsencode(sys.argv[1])
lines = []
files = 0
total = 0
for dirpath, dirnames, filenames, dirfd in os.fwalk(root, follow_symlinks=False):
    rel = os.path.relpath(dirpath, root)
    for name in dirnames + filenames:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        m = st.st_mode
        t = 'f' if stat.S_ISREG(m) else 'd' if stat.S_ISDIR(m) else 'l' if stat.S_ISLNK(m) else 'o'
        if t == 'f':
            files += 1
            total += st.st_size
        path = name if rel == b'.' else rel + b'/' + name
        esc = lambda s: s.replace('%', '%25').replace('\n', '%0A')
        line = '%s %s %d %d' % (t, esc(path.decode('utf-8', 'surrogateescape')), st.st_size if t == 'f' else 0, st.st_mtime_ns)
        if t == 'l':
            line += ' ' + esc(os.fsdecode(os.readlink(name, dir_fd=dirfd))).replace(' ', '%20')
        lines.append(line)
lines.sort(key=lambda line: line.encode('utf-16-be', 'surrogatepass'))
digest = hashlib.sha256('\n'.join(lines).encode('utf-8', 'surrogateescape')).hexdigest()
print('sha256:%s %d %d %d' % (digest, files, total, len(lines)))
`;

/** The close digest of dir as python3 computes it, with its file count, bytes and entry count. */
export function pythonCloseDigest(dir: string): { digest: string; files: number; total_bytes: number; entries: number } {
  const [digest, files, total, entries] = run(['python3', '-c', PY_DIGEST, dir]).trim().split(' ');
  return { digest, files: Number(files), total_bytes: Number(total), entries: Number(entries) };
}

const PY_LISTING = String.raw`
import hashlib, json, os, stat, sys
sys.setrecursionlimit(100000)  # os.fwalk recurses once per level
root = os.fsencode(sys.argv[1])
out = []
kinds = [(stat.S_ISREG, 'file'), (stat.S_ISDIR, 'dir'), (stat.S_ISLNK, 'symlink'), (stat.S_ISFIFO, 'fifo'), (stat.S_ISSOCK, 'socket'), (stat.S_ISCHR, 'char'), (stat.S_ISBLK, 'block')]
for dirpath, dirnames, filenames, dirfd in os.fwalk(root, follow_symlinks=False):
    rel = os.path.relpath(dirpath, root)
    for name in dirnames + filenames:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        t = next(k for f, k in kinds if f(st.st_mode))
        path = name if rel == b'.' else rel + b'/' + name
        e = {'path': path.hex(), 'type': t, 'mode': st.st_mode & 0o7777, 'uid': st.st_uid, 'gid': st.st_gid, 'size': 0, 'mtime_ns': str(st.st_mtime_ns)}
        if t == 'file':
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dirfd)
            h = hashlib.sha256()
            n = 0
            while True:
                b = os.read(fd, 1 << 20)
                if not b:
                    break
                h.update(b)
                n += len(b)
            os.close(fd)
            e['size'] = n
            e['sha256'] = h.hexdigest()
        elif t == 'symlink':
            target = os.readlink(name, dir_fd=dirfd)
            e['target'] = target.hex()
            e['size'] = len(target)
        elif t in ('char', 'block'):
            e['rdev'] = st.st_rdev
        out.append(e)
out.sort(key=lambda e: bytes.fromhex(e['path']))
json.dump(out, sys.stdout)
`;

/** One entry as python3 sees it (os.fwalk, lstat; a file's bytes hashed), path and target as hex of their bytes. */
export interface ListedEntry {
  path: string;
  type: string;
  mode: number;
  uid: number;
  gid: number;
  size: number;
  mtime_ns: string;
  sha256?: string;
  target?: string;
  rdev?: number;
}

/** Every entry under dir (not dir itself), sorted by path bytes: computed by python3, independently of the supervisor. */
export function pythonTreeListing(dir: string): ListedEntry[] {
  const r = spawnSync('python3', ['-c', PY_LISTING, dir], { encoding: 'utf8', maxBuffer: 1 << 30 });
  if (r.status !== 0) throw new Error(`python3 listing of ${dir}: exit ${r.status}: ${r.stderr}`);
  return JSON.parse(r.stdout) as ListedEntry[];
}
