// The WebSocket listener's configuration (remote.*: the insecure/loopback rule, TLS both or
// neither, addresses) and its token source (remote-auth.ts: env, config, the 0600 file made
// at first start and re-read on change, constant-time check) and the failure slow-down.
import { chmodSync, mkdtempSync, readFileSync, renameSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { parseConfig, remoteInsecureProblem } from '../../../../supervisor/config.js';
import { FailureThrottle, RemoteToken } from '../../../../supervisor/server/remote-auth.js';

const dirs: string[] = [];
afterEach(() => dirs.splice(0).forEach((d) => rmSync(d, { recursive: true, force: true })));
const tmp = () => {
  const d = mkdtempSync(join(tmpdir(), 'sbx-remote-'));
  dirs.push(d);
  return d;
};

describe('remote config', () => {
  it('is off by default, with the documented defaults', () => {
    const c = parseConfig({}, 'embedded defaults', {});
    expect(c.remote).toEqual({ insecure: false, pingIntervalMs: 10_000, pingTimeoutMs: 10_000, upgradeTimeoutMs: 10_000 });
  });
  it('allows insecure (no token) on loopback only', () => {
    expect(parseConfig({ remote: { listen: '127.0.0.1:7443', insecure: true } }, 'f.json', {}).remote.insecure).toBe(true);
    expect(parseConfig({ remote: { listen: '[::1]:7443', insecure: true } }, 'f.json', {}).remote.insecure).toBe(true);
    expect(parseConfig({ remote: { listen: 'localhost:7443', insecure: true } }, 'f.json', {}).remote.insecure).toBe(true);
    expect(() => parseConfig({ remote: { listen: '0.0.0.0:7443', insecure: true } }, 'f.json', {})).toThrow(
      /"remote.insecure": remote.insecure \(no token\) is allowed only on a loopback address, not 0.0.0.0:7443/,
    );
    expect(() => parseConfig({ remote: { listen: '10.1.2.3:7443', insecure: true } }, 'f.json', {})).toThrow(/loopback/);
    expect(parseConfig({ remote: { listen: '0.0.0.0:7443' } }, 'f.json', {}).remote.listen).toBe('0.0.0.0:7443');
    expect(remoteInsecureProblem('0.0.0.0:1', true)).toMatch(/loopback/);
    expect(remoteInsecureProblem('0.0.0.0:1', false)).toBeNull();
  });
  it('refuses a path, a host name, a bare port, half a TLS pair, a short token', () => {
    expect(() => parseConfig({ remote: { listen: '/run/x.sock' } }, 'f.json', {})).toThrow(/"remote.listen": .*is a path/);
    expect(() => parseConfig({ remote: { listen: 'example.com:7443' } }, 'f.json', {})).toThrow(/"remote.listen": .*not an IP address/);
    expect(() => parseConfig({ remote: { listen: ':7443' } }, 'f.json', {})).toThrow(/"remote.listen"/);
    expect(() => parseConfig({ remote: { tlsCertFile: '/c.pem' } }, 'f.json', {})).toThrow(/"remote.tlsKeyFile": give both/);
    expect(() => parseConfig({ remote: { token: 'short' } }, 'f.json', {})).toThrow(/"remote.token"/);
    expect(() => parseConfig({ remote: { tokenFile: 'relative' } }, 'f.json', {})).toThrow(/"remote.tokenFile"/);
    expect(() => parseConfig({ remote: { listn: 'x' } }, 'f.json', {})).toThrow(/unknown key "remote.listn"/);
  });
});

describe('the remote token', () => {
  it('takes SBX_REMOTE_TOKEN first, then remote.token, then the file', () => {
    const stateDir = tmp();
    const env = RemoteToken.open({ env: { SBX_REMOTE_TOKEN: 'from-env-0123456789' }, token: 'from-config-0123456789', stateDir, insecure: false });
    expect(env.kind).toBe('env');
    expect(env.check('Bearer from-env-0123456789')).toBe('ok');
    expect(env.check('Bearer from-config-0123456789')).toBe('wrong_token');
    const cfg = RemoteToken.open({ env: {}, token: 'from-config-0123456789', stateDir, insecure: false });
    expect(cfg.kind).toBe('config');
    expect(cfg.check('bearer  from-config-0123456789')).toBe('ok');
    expect(cfg.check(undefined)).toBe('no_token');
    expect(cfg.check('Basic from-config-0123456789')).toBe('no_token');
    expect(cfg.check('Bearer from-config-012345678')).toBe('wrong_token');
    expect(RemoteToken.open({ env: {}, stateDir, insecure: true }).check(undefined)).toBe('ok');
  });
  it('makes the file 0600 with 32 random bytes once, re-reads it when renamed over, refuses one readable by others', () => {
    const stateDir = tmp();
    const t = RemoteToken.open({ env: {}, stateDir, insecure: false });
    const file = join(stateDir, 'remote-token');
    expect(t.file).toBe(file);
    expect(statSync(file).mode & 0o777).toBe(0o600);
    const first = readFileSync(file, 'utf8');
    expect(first).toMatch(/^[A-Za-z0-9_-]{43}\n$/);
    expect(Buffer.from(first.trim(), 'base64url').length).toBe(32);
    // A second start keeps it.
    expect(RemoteToken.open({ env: {}, stateDir, insecure: false }).check(`Bearer ${first.trim()}`)).toBe('ok');
    expect(readFileSync(file, 'utf8')).toBe(first);
    writeFileSync(`${file}.new`, 'rotated-token-0123456789\n', { mode: 0o600 });
    renameSync(`${file}.new`, file);
    expect(t.check(`Bearer ${first.trim()}`)).toBe('wrong_token');
    expect(t.check('Bearer rotated-token-0123456789')).toBe('ok');
    rmSync(file);
    expect(t.check('Bearer rotated-token-0123456789')).toBe('token_file_invalid'); // no file: nothing accepted
    expect(t.invalid).toMatch(/is gone/);
    writeFileSync(file, 'x-token-0123456789\n', { mode: 0o644 });
    chmodSync(file, 0o644);
    expect(() => RemoteToken.open({ env: {}, stateDir, insecure: false })).toThrow(/readable by others \(mode 644\)/);
    writeFileSync(join(stateDir, 'empty'), '', { mode: 0o600 });
    expect(() => RemoteToken.open({ env: {}, stateDir, tokenFile: join(stateDir, 'empty'), insecure: false })).toThrow(/holds no token/);
  });

  it('checks a rotated file as at start: a 0644 file, a symlink, a short or spaced token refuse every handshake until a good file is back', () => {
    const stateDir = tmp();
    const file = join(stateDir, 'remote-token');
    const good = 'good-token-0123456789';
    writeFileSync(file, `${good}\n`, { mode: 0o600 });
    const t = RemoteToken.open({ env: {}, stateDir, insecure: false });
    expect(t.check(`Bearer ${good}`)).toBe('ok');
    const rotate = (content: string, mode = 0o600) => {
      writeFileSync(`${file}.new`, content, { mode });
      chmodSync(`${file}.new`, mode);
      renameSync(`${file}.new`, file);
    };
    const next = 'next-token-0123456789';
    rotate(`${next}\n`, 0o644);
    expect(t.check(`Bearer ${next}`)).toBe('token_file_invalid');
    expect(t.check(`Bearer ${good}`)).toBe('token_file_invalid'); // fail closed: the previous token is not kept
    expect(t.invalid).toMatch(/readable by others \(mode 644\)/);
    rotate('a\n');
    expect(t.check('Bearer a')).toBe('token_file_invalid');
    expect(t.invalid).toMatch(/1 characters \(at least 16\)/);
    rotate('two words-0123456789\n');
    expect(t.check('Bearer two')).toBe('token_file_invalid');
    expect(t.invalid).toMatch(/white space/);
    const target = join(stateDir, 'elsewhere');
    writeFileSync(target, `${next}\n`, { mode: 0o600 });
    symlinkSync(target, `${file}.new`);
    renameSync(`${file}.new`, file);
    expect(t.check(`Bearer ${next}`)).toBe('token_file_invalid');
    expect(t.invalid).toMatch(/symbolic link/);
    rotate(`${next}\n`);
    expect(t.check(`Bearer ${next}`)).toBe('ok');
    chmodSync(file, 0o640); // a chmod alone is seen too
    expect(t.check(`Bearer ${next}`)).toBe('token_file_invalid');
    chmodSync(file, 0o600);
    expect(t.check(`Bearer ${next}`)).toBe('ok');
    // The same checks at start.
    rmSync(file);
    symlinkSync(target, file);
    expect(() => RemoteToken.open({ env: {}, stateDir, insecure: false })).toThrow(/symbolic link/);
    rmSync(file);
    writeFileSync(file, 'short\n', { mode: 0o600 });
    expect(() => RemoteToken.open({ env: {}, stateDir, insecure: false })).toThrow(/5 characters \(at least 16\)/);
  });

  it('holds SBX_REMOTE_TOKEN to the rules of remote.token', () => {
    const stateDir = tmp();
    expect(() => RemoteToken.open({ env: { SBX_REMOTE_TOKEN: ' ' }, stateDir, insecure: false })).toThrow(/SBX_REMOTE_TOKEN holds white space/);
    expect(() => RemoteToken.open({ env: { SBX_REMOTE_TOKEN: 'a' }, stateDir, insecure: false })).toThrow(
      /SBX_REMOTE_TOKEN holds a token of 1 characters \(at least 16\)/,
    );
    expect(() => RemoteToken.open({ env: { SBX_REMOTE_TOKEN: 'env-token-0123456789\n' }, stateDir, insecure: false })).toThrow(/white space/);
    expect(RemoteToken.open({ env: { SBX_REMOTE_TOKEN: 'env-token-0123456789' }, stateDir, insecure: false }).check('Bearer env-token-0123456789')).toBe('ok');
  });
});

describe('the failure slow-down', () => {
  it('doubles from 100 ms to a 2 s cap per address, reset by a success, others untouched', () => {
    const t = new FailureThrottle();
    expect([1, 2, 3, 4, 5, 6, 7].map(() => t.failed('10.0.0.1', 0))).toEqual([100, 200, 400, 800, 1600, 2000, 2000]);
    expect(t.failed('10.0.0.2', 0)).toBe(100);
    t.succeeded('10.0.0.1');
    expect(t.failed('10.0.0.1', 0)).toBe(100);
    expect(t.failed('10.0.0.1', 120_000)).toBe(100); // a minute later it is forgotten
  });
});
