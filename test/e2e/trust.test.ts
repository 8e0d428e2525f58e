// Receipts you can trust: signatures that break when anything changes, stored bytes that are
// checked against them, sessions run as another user that cannot touch the evidence, and a
// state dir that never writes through a planted link.
import { randomBytes } from 'node:crypto';
import {
  chmodSync,
  chownSync,
  cpSync,
  existsSync,
  linkSync,
  lstatSync,
  mkdirSync,
  readFileSync,
  readdirSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Receipt, SessionSummary } from '../../ipc/protocol.js';
import { verifySignature, verifyStoredOutput } from '../../core/receipts/verify.js';
import { TestDaemon, until } from '../helpers/daemon.js';

let daemon: TestDaemon;
beforeAll(async () => {
  daemon = new TestDaemon({ config: { drain: { chunkBytes: 4096 } } });
  chmodSync(daemon.dir, 0o711); // others may traverse it: the state dir's own modes must protect
  await daemon.start();
});
afterAll(async () => {
  expect(await daemon.stop()).toEqual({ code: 0, signal: null });
});

const pub = () => readFileSync(join(daemon.stateDir, 'receipt-key.pub'), 'utf8');

async function receiptOf(argv: string[], extra: string[] = []): Promise<{ receipt: Receipt; path: string }> {
  const path = join(daemon.dir, `r-${randomBytes(4).toString('hex')}.json`);
  await daemon.sbx(['run', '--receipt', path, '--cwd', '/', ...extra, '--', ...argv]);
  return { receipt: JSON.parse(readFileSync(path, 'utf8')) as Receipt, path };
}

describe('signatures', () => {
  it('a genuine receipt verifies, offline and with its stored bytes', async () => {
    const { receipt, path } = await receiptOf(['sh', '-c', 'head -c 10000 /dev/urandom; echo warn >&2; exit 4']);
    expect(receipt.signature).toMatchObject({ alg: 'ed25519', key_id: expect.stringMatching(/^sha256:[0-9a-f]{64}$/) });
    expect(receipt.output.stdout!.chunks.map((c) => [c.start_cursor, c.length])).toEqual([
      [0, 4096],
      [4096, 4096],
      [8192, 1808],
    ]);
    expect(verifySignature(receipt, pub())).toEqual([]);
    expect(verifyStoredOutput(receipt, daemon.stateDir)).toEqual([]);
    const cli = await daemon.sbx(['verify', path, '--state-dir', daemon.stateDir]);
    expect(cli.status).toBe(0);
    expect(cli.stdout.toString()).toMatch(/^OK: signed by sha256:[0-9a-f]{64}; stored output matches \(stdout 10000 bytes, stderr 5 bytes\)\n$/);
    const status = JSON.parse((await daemon.sbx(['status', '--json'])).stdout.toString());
    expect(status.receipt_key.key_id).toBe(receipt.signature!.key_id);
    expect(status.receipt_key.public_key_pem).toBe(pub());
    expect(statSync(join(daemon.stateDir, 'receipt-key')).mode & 0o777).toBe(0o600);
  });

  it('without --state-dir, the state dir of $SBX_STATE_DIR is re-read when it holds the session: a corrupt chunk is a MISMATCH, never an OK', async () => {
    const { receipt, path } = await receiptOf(['sh', '-c', 'printf "0123456789"']);
    const env = { SBX_STATE_DIR: daemon.stateDir };
    const good = await daemon.sbx(['verify', path], { env });
    expect([good.status, good.stdout.toString()]).toEqual([
      0,
      `OK: signed by ${receipt.signature!.key_id}; stored output matches (stdout 10 bytes, stderr 0 bytes)\n`,
    ]);
    // A state dir that does not hold it (another machine's receipt): the signature only, said so.
    const elsewhere = join(daemon.dir, 'elsewhere');
    mkdirSync(elsewhere, { recursive: true });
    const only = await daemon.sbx(['verify', path, '--public-key', join(daemon.stateDir, 'receipt-key.pub')], { env: { SBX_STATE_DIR: elsewhere } });
    expect([only.status, only.stdout.toString()]).toEqual([
      0,
      `OK: signed by ${receipt.signature!.key_id}; signature only (the state dir ${elsewhere} does not hold this session: --state-dir DIR re-reads its stored output)\n`,
    ]);
    const chunk = join(daemon.stateDir, 'sessions', receipt.session_id, 'stdout', '0000000000000000.chunk');
    writeFileSync(chunk, '0123456780');
    const bad = await daemon.sbx(['verify', path], { env });
    expect(bad.status).toBe(1);
    expect(bad.stdout.toString()).toMatch(/^MISMATCH: stdout: /);
  });

  it('a planted link in the stored output (a chunk, or a stream directory) is a MISMATCH naming it, never a crash or an OK', async () => {
    const { receipt, path } = await receiptOf(['sh', '-c', 'printf out; printf err >&2']);
    const sessionDir = join(daemon.stateDir, 'sessions', receipt.session_id);
    // stdout's chunk replaced by a link to an identical copy; stderr's directory by a link to a copy of it.
    const copy = join(daemon.dir, `copy-${receipt.session_id}`);
    mkdirSync(copy);
    writeFileSync(join(copy, 'chunk'), readFileSync(join(sessionDir, 'stdout', '0000000000000000.chunk')));
    rmSync(join(sessionDir, 'stdout', '0000000000000000.chunk'));
    symlinkSync(join(copy, 'chunk'), join(sessionDir, 'stdout', '0000000000000000.chunk'));
    cpSync(join(sessionDir, 'stderr'), join(copy, 'stderr'), { recursive: true });
    rmSync(join(sessionDir, 'stderr'), { recursive: true });
    symlinkSync(join(copy, 'stderr'), join(sessionDir, 'stderr'));
    const v = await daemon.sbx(['verify', path, '--state-dir', daemon.stateDir]);
    expect(v.status).toBe(1);
    const lines = v.stdout.toString().trimEnd().split('\n');
    expect(lines).toContain('MISMATCH: stderr: the stream directory is a symbolic link');
    expect(lines.some((l) => /^MISMATCH: stdout: cannot read the stored stream: .*ELOOP/.test(l))).toBe(true);
    expect(v.stderr.toString()).toBe('');
  });

  it('changing any field breaks the signature', async () => {
    const { receipt } = await receiptOf(['sh', '-c', 'echo hi; exit 3']);
    const tampered: [string, (r: any) => void][] = [
      ['exit code', (r) => (r.exit.code = 0)],
      ['cursor', (r) => (r.output.stdout.final_cursor += 1)],
      ['digest', (r) => (r.output.stdout.sha256 = r.output.stdout.sha256.replace(/^./, (c: string) => (c === '0' ? '1' : '0')))],
      ['outcome', (r) => (r.outcome = 'timed_out')],
      ['a new field', (r) => (r.note = 'added later')],
      ['a chunk', (r) => (r.output.stdout.chunks[0].length = 2)],
    ];
    for (const [what, change] of tampered) {
      const copy = structuredClone(receipt);
      change(copy);
      expect(verifySignature(copy, pub()), what).toEqual(['the signature does not match the receipt: a field was changed after signing']);
      const path = join(daemon.dir, `tampered-${what.replace(/ /g, '-')}.json`);
      writeFileSync(path, JSON.stringify(copy));
      const cli = await daemon.sbx(['verify', path, '--public-key', join(daemon.stateDir, 'receipt-key.pub')]);
      expect(cli.status, what).toBe(1);
      expect(cli.stdout.toString()).toContain('MISMATCH');
    }
  });

  it('flipping one byte of a stored chunk fails --state-dir verification', async () => {
    const { receipt, path } = await receiptOf(['sh', '-c', 'head -c 6000 /dev/zero | tr "\\0" x']);
    const chunk = join(daemon.stateDir, 'sessions', receipt.session_id, 'stdout', '0000000000001000.chunk');
    const bytes = readFileSync(chunk);
    bytes[100] ^= 1;
    writeFileSync(chunk, bytes);
    const cli = await daemon.sbx(['verify', path, '--state-dir', daemon.stateDir]);
    expect(cli.status).toBe(1);
    expect(cli.stdout.toString()).toContain('MISMATCH: stdout: sha256 on disk');
    // New receipts list chunks without their own digest (the stream's covers them).
    expect(receipt.output.stdout!.chunks).toEqual([
      { start_cursor: 0, length: 4096 },
      { start_cursor: 4096, length: 1904 },
    ]);
  });

  it('an added chunk file or entry fails --state-dir verification', async () => {
    const { receipt, path } = await receiptOf(['echo', 'short']);
    const dir = join(daemon.stateDir, 'sessions', receipt.session_id);
    writeFileSync(join(dir, 'stdout', '0000000000001000.chunk'), 'appended later');
    mkdirSync(join(dir, 'extra'));
    const cli = await daemon.sbx(['verify', path, '--state-dir', daemon.stateDir]);
    expect(cli.status).toBe(1);
    expect(cli.stdout.toString()).toContain('MISMATCH: stdout: unexpected file 0000000000001000.chunk');
    expect(cli.stdout.toString()).toContain('MISMATCH: unexpected entry in the session directory: extra');
  });

  it('keeps verifying the checked-in v1 receipt and key (format compatibility)', async () => {
    const fixture = join(import.meta.dirname, '../fixtures/receipt-v1');
    const receipt = JSON.parse(readFileSync(join(fixture, 'receipt.json'), 'utf8')) as Receipt;
    expect(receipt.version).toBe(1);
    expect(verifySignature(receipt, readFileSync(join(fixture, 'receipt-key.pub'), 'utf8'))).toEqual([]);
    expect(verifyStoredOutput(receipt, join(fixture, 'state'))).toEqual([]);
    const cli = await daemon.sbx([
      'verify',
      join(fixture, 'receipt.json'),
      '--public-key',
      join(fixture, 'receipt-key.pub'),
      '--state-dir',
      join(fixture, 'state'),
    ]);
    expect(cli.status).toBe(0);
  });
});

describe('sessions as another user', () => {
  it('runs as nobody, and nobody cannot touch the state dir or the socket dir', async () => {
    const id = await daemon.sbx(['run', '--user', 'nobody', '--cwd', '/', '--', 'sh', '-c', 'id -u; id -g; echo "$USER $HOME"']);
    expect(id.stdout.toString()).toBe('65534\n65534\nnobody /nonexistent\n');
    const sessionDir = join(daemon.stateDir, 'sessions', readdirSync(join(daemon.stateDir, 'sessions'))[0]);
    const before = readFileSync(join(daemon.stateDir, 'supervisor.json'));
    const attempts: Record<string, string> = {
      'create in the state dir': `touch ${daemon.stateDir}/planted`,
      'create in a session dir': `touch ${sessionDir}/planted`,
      'change the identity file': `echo x >> ${daemon.stateDir}/supervisor.json`,
      'delete the identity file': `rm -f ${daemon.stateDir}/supervisor.json`,
      'read the signing key': `cat ${daemon.stateDir}/receipt-key`,
      'delete a receipt': `rm -f ${sessionDir}/receipt.json`,
      'create in the socket dir': `touch ${daemon.dir}/planted`,
      'delete the socket': `rm -f ${daemon.socketPath}`,
      'connect to the socket': `exec 3<>/dev/null; node -e "require('net').connect('${daemon.socketPath}').on('connect',()=>process.exit(0)).on('error',(e)=>process.exit(e.code==='EACCES'?1:3))"`,
    };
    for (const [what, cmd] of Object.entries(attempts)) {
      const r = await daemon.sbx(['run', '--user', 'nobody', '--cwd', '/', '--', 'sh', '-c', cmd]);
      // Each fails for the one right reason: permission (EACCES), never a missing file.
      if (what === 'connect to the socket') {
        expect(r.status, what).toBe(1); // the script's exit on the connect error
        continue;
      }
      expect(r.status, what).toBe(what === 'change the identity file' ? 2 : 1); // sh's status for a failed redirection is 2
      expect(r.stderr.toString(), what).toMatch(/Permission denied\n$/);
    }
    expect(readFileSync(join(daemon.stateDir, 'supervisor.json')).equals(before)).toBe(true);
    expect(existsSync(join(daemon.stateDir, 'planted'))).toBe(false);
    expect(existsSync(join(daemon.dir, 'planted'))).toBe(false);
    expect(existsSync(daemon.socketPath)).toBe(true);
    expect(existsSync(join(sessionDir, 'receipt.json'))).toBe(true);
  });

  it('refuses an unknown user', async () => {
    const r = await daemon.sbx(['run', '--user', 'no-such-user-here', '--', 'true']);
    expect(r.status).toBe(125);
    expect(r.stderr.toString()).toContain('INVALID_ARGUMENT');
  });
});

describe('no link-following in the state dir', () => {
  it('refuses to write the next chunk through a planted symlink or hardlink', async () => {
    const go = join(daemon.dir, `go-${randomBytes(3).toString('hex')}`);
    const c = await daemon.client();
    const { session_id } = await c.launch({
      argv: ['sh', '-c', `head -c 4096 /dev/zero; head -c 4096 /dev/zero >&2; while [ ! -e ${go} ]; do sleep 0.02; done; echo more; echo more >&2`],
      cwd: '/',
    });
    await until(async () => {
      const s = (await c.ps()).sessions.find((x) => x.session_id === session_id) as SessionSummary;
      return s.cursors.stdout === 4096 && s.cursors.stderr === 4096;
    }, 'the first chunks to fill');
    const dir = join(daemon.stateDir, 'sessions', session_id);
    const targetA = join(daemon.dir, 'target-a');
    const targetB = join(daemon.dir, 'target-b');
    writeFileSync(targetA, 'original a');
    writeFileSync(targetB, 'original b');
    symlinkSync(targetA, join(dir, 'stdout', '0000000000001000.chunk'));
    linkSync(targetB, join(dir, 'stderr', '0000000000001000.chunk'));
    writeFileSync(go, '');
    const receipt = await c.wait({ session_id });
    expect(readFileSync(targetA, 'utf8')).toBe('original a');
    expect(readFileSync(targetB, 'utf8')).toBe('original b');
    for (const stream of ['stdout', 'stderr'] as const) {
      expect(receipt.output[stream]).toMatchObject({ final_cursor: 4096, complete: false, reason: 'io_error', dropped_bytes: 5 });
    }
    await until(() => daemon.log().includes('the stream stopped storing'), 'the refusal to be logged');
  });

  it('refuses to write a receipt through a planted link: the session stays unknown, the target unchanged', async () => {
    const go = join(daemon.dir, `go-${randomBytes(3).toString('hex')}`);
    const c = await daemon.client();
    const { session_id } = await c.launch({ argv: ['sh', '-c', `while [ ! -e ${go} ]; do sleep 0.02; done`], cwd: '/' });
    const target = join(daemon.dir, 'receipt-target');
    writeFileSync(target, 'original');
    await until(() => existsSync(join(daemon.stateDir, 'sessions', session_id)), 'the session dir');
    symlinkSync(target, join(daemon.stateDir, 'sessions', session_id, 'receipt.json'));
    writeFileSync(go, '');
    await until(async () => (await c.ps()).sessions.find((s) => s.session_id === session_id)?.state === 'unknown', 'the session to be unknown');
    const row = (await c.ps()).sessions.find((s) => s.session_id === session_id)!;
    expect(row.reason).toContain('the receipt could not be written: EEXIST');
    expect(readFileSync(target, 'utf8')).toBe('original');
  });
});

describe('sbx run --receipt never writes through a planted link', () => {
  const NOBODY = 65534;
  /** A directory a session run as nobody may write (its cwd), and a root-only file outside it. */
  function setup() {
    const work = join(daemon.dir, `work-${randomBytes(3).toString('hex')}`);
    mkdirSync(work);
    chownSync(work, NOBODY, NOBODY);
    const target = join(daemon.dir, `secret-${randomBytes(3).toString('hex')}`);
    writeFileSync(target, 'root only\n', { mode: 0o600 });
    chmodSync(target, 0o600);
    return { work, target };
  }
  const fingerprint = (path: string) => {
    const st = statSync(path);
    return { bytes: readFileSync(path).toString('hex'), mode: st.mode, ino: st.ino, mtimeMs: st.mtimeMs, nlink: st.nlink };
  };
  const sessionCount = async () => (JSON.parse((await daemon.sbx(['ps', '--all', '--json'])).stdout.toString()) as unknown[]).length;

  it('a symlink the session planted (as nobody): exit 125, the target unchanged, the link left as it was', async () => {
    const { work, target } = setup();
    const before = fingerprint(target);
    const key = `plant-${randomBytes(4).toString('hex')}`;
    const r = await daemon.sbx(
      ['run', '--key', key, '--user', 'nobody', '--receipt', 'receipt.json', '--', 'sh', '-c', `ln -s ${target} receipt.json; echo planted`],
      { cwd: work },
    );
    expect(r.stdout.toString()).toBe('planted\n');
    expect(r.status).toBe(125);
    const id = (JSON.parse((await daemon.sbx(['receipt', '--key', key])).stdout.toString()) as Receipt).session_id;
    expect(r.stderr.toString()).toBe(
      `sbx: --receipt ${work}/receipt.json: not written: it is a symbolic link; sbx never writes through or replaces a link (the session's directory may hold one it planted); the supervisor keeps the receipt: sbx receipt ${id}\n`,
    );
    expect(fingerprint(target)).toEqual(before);
    expect(lstatSync(join(work, 'receipt.json')).isSymbolicLink()).toBe(true);
    expect(readdirSync(work)).toEqual(['receipt.json']); // no temp file left
    expect((await daemon.sbx(['receipt', id])).status).toBe(0);
  });

  it('a hardlink to a root-only file planted while the session runs: exit 125, the target unchanged', async () => {
    const { work, target } = setup();
    const before = fingerprint(target);
    const go = join(work, 'go');
    const key = `plant-${randomBytes(4).toString('hex')}`;
    const child = daemon.sbx(
      ['run', '--key', key, '--user', 'nobody', '--receipt', 'receipt.json', '--', 'sh', '-c', `while [ ! -e ${go} ]; do sleep 0.02; done; echo done`],
      { cwd: work },
    );
    await until(
      async () =>
        (JSON.parse((await daemon.sbx(['ps', '--json'])).stdout.toString()) as SessionSummary[]).some((s) => s.invocation_key === key && s.state === 'running'),
      'the session to run',
    );
    // As root: protected_hardlinks stops nobody from linking a file it cannot write.
    linkSync(target, join(work, 'receipt.json'));
    writeFileSync(go, '');
    const r = await child;
    expect(r.stdout.toString()).toBe('done\n');
    expect(r.status).toBe(125);
    const id = (JSON.parse((await daemon.sbx(['receipt', '--key', key])).stdout.toString()) as Receipt).session_id;
    expect(r.stderr.toString()).toBe(
      `sbx: --receipt ${work}/receipt.json: not written: it is a file with 2 hard links; sbx never writes through or replaces a link (the session's directory may hold one it planted); the supervisor keeps the receipt: sbx receipt ${id}\n`,
    );
    expect(fingerprint(target)).toEqual({ ...before, nlink: 2 });
    expect(readdirSync(work).sort()).toEqual(['go', 'receipt.json']);
  });

  it('a link already there before the run: exit 125 and nothing runs', async () => {
    const { work, target } = setup();
    symlinkSync(target, join(work, 'receipt.json'));
    const n = await sessionCount();
    const r = await daemon.sbx(['run', '--receipt', 'receipt.json', '--', 'sh', '-c', 'echo ran > ran.txt'], { cwd: work });
    expect(r.status).toBe(125);
    expect(r.stderr.toString()).toBe(
      `sbx: --receipt ${work}/receipt.json: refused: it is a symbolic link, and sbx never writes through or replaces one; nothing was run\n`,
    );
    expect(await sessionCount()).toBe(n);
    expect(existsSync(join(work, 'ran.txt'))).toBe(false);
    expect(readFileSync(target, 'utf8')).toBe('root only\n');
  });

  it('a normal run writes exactly the receipt sbx receipt prints, 0644 minus the umask, and exits with the status', async () => {
    const { work } = setup();
    writeFileSync(join(work, 'old.json'), 'an older receipt'); // a regular file is replaced
    const r = await daemon.sbx(['run', '--receipt', 'old.json', '--', 'sh', '-c', 'echo hi; exit 3'], { cwd: work });
    expect(r.status).toBe(3);
    expect(r.stderr.length).toBe(0);
    const written = readFileSync(join(work, 'old.json'));
    const id = (JSON.parse(written.toString()) as Receipt).session_id;
    expect(written.equals((await daemon.sbx(['receipt', id])).stdout)).toBe(true);
    const umask = parseInt(/^Umask:\s+(\d+)$/m.exec(readFileSync('/proc/self/status', 'utf8'))![1], 8);
    expect(statSync(join(work, 'old.json')).mode & 0o777).toBe(0o644 & ~umask);
    expect(readdirSync(work)).toEqual(['old.json']);
  });

  it('a missing directory: exit 125 before anything runs', async () => {
    const { work } = setup();
    const n = await sessionCount();
    const r = await daemon.sbx(['run', '--receipt', 'no-such-dir/r.json', '--', 'sh', '-c', 'echo ran > ran.txt'], { cwd: work });
    expect(r.status).toBe(125);
    expect(r.stderr.toString()).toBe(
      `sbx: --receipt ${work}/no-such-dir/r.json: cannot open its directory ${work}/no-such-dir: no such directory (ENOENT); nothing was run\n`,
    );
    expect(await sessionCount()).toBe(n);
    expect(existsSync(join(work, 'ran.txt'))).toBe(false);
    // A directory that is a symlink says so (not a bare ENOTDIR).
    symlinkSync(work, join(work, 'linked'));
    const linked = await daemon.sbx(['run', '--receipt', 'linked/r.json', '--', 'sh', '-c', 'echo ran > ran.txt'], { cwd: work });
    expect(linked.status).toBe(125);
    expect(linked.stderr.toString()).toBe(
      `sbx: --receipt ${work}/linked/r.json: its directory ${work}/linked is a symbolic link, which sbx does not follow for a receipt (name the directory it points to); nothing was run\n`,
    );
    expect(existsSync(join(work, 'ran.txt'))).toBe(false);
  });
});
