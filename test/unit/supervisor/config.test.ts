import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { ConfigError, loadConfig, parseConfig } from '../../../supervisor/config.js';

const dirs: string[] = [];
afterEach(() => dirs.splice(0).forEach((d) => rmSync(d, { recursive: true, force: true })));

describe('config', () => {
  it('has embedded defaults', () => {
    const c = parseConfig({}, 'embedded defaults', {});
    expect(c.drain.chunkBytes).toBe(64 * 1024 * 1024);
    expect(c.session.defaultGraceMs).toBe(10_000);
    expect(c.cgroup).toEqual({ mode: 'auto', parent: '/sandbox-supervisor' });
    expect(c.drain.quotaBytes).toBe(1024 * 1024 * 1024);
    expect(c.storage).toEqual({}); // scaled to the state dir's file system at start (storage.ts)
    expect(c.retention).toEqual({ outputMaxAgeMs: 7 * 86_400_000, outputMaxTotalBytes: 10 * 1024 ** 3, receiptMaxAgeMs: 0, intervalMs: 3_600_000 });
  });
  it('bounds partial frames by time and, across connections, by bytes', () => {
    const c = parseConfig({}, 'embedded defaults', {});
    expect(c.ipc).toMatchObject({ maxFrameBytes: 16 * 1024 * 1024, frameTimeoutMs: 30_000, maxPendingFrameBytes: 256 * 1024 * 1024 });
    expect(parseConfig({ ipc: { frameTimeoutMs: 0, maxPendingFrameBytes: 0 } }, 'f.json', {}).ipc).toMatchObject({
      frameTimeoutMs: 0,
      maxPendingFrameBytes: 0,
    });
    expect(parseConfig({ ipc: { maxFrameBytes: 2048, maxPendingFrameBytes: 2052 } }, 'f.json', {}).ipc.maxPendingFrameBytes).toBe(2052);
    // The default makes room for one whole frame of the largest allowed size.
    expect(parseConfig({ ipc: { maxFrameBytes: 256 * 1024 * 1024 } }, 'f.json', {}).ipc.maxPendingFrameBytes).toBe(256 * 1024 * 1024 + 4);
    expect(() => parseConfig({ ipc: { maxFrameBytes: 2048, maxPendingFrameBytes: 2051 } }, 'f.json', {})).toThrow(
      /"ipc.maxPendingFrameBytes": must be 0 \(no bound\) or at least ipc.maxFrameBytes \+ 4/,
    );
    expect(() => parseConfig({ ipc: { maxPendingFrameBytes: 1000 } }, 'f.json', {})).toThrow(/"ipc.maxPendingFrameBytes"/);
    expect(() => parseConfig({ ipc: { frameTimeoutMs: -1 } }, 'f.json', {})).toThrow(/"ipc.frameTimeoutMs"/);
    expect(() => parseConfig({ ipc: { frameTimeout: 1 } }, 'f.json', {})).toThrow(/unknown key "ipc.frameTimeout"/);
  });
  it('names bad storage and retention keys', () => {
    expect(() => parseConfig({ retention: { maxAge: 1 } }, 'f.json', {})).toThrow(/unknown key "retention.maxAge"/);
    expect(() => parseConfig({ storage: { reserveBytes: 'lots' } }, 'f.json', {})).toThrow(/"storage.reserveBytes"/);
    expect(() => parseConfig({ drain: { quotaBytes: -5 } }, 'f.json', {})).toThrow(/"drain.quotaBytes"/);
  });
  it('names an unknown key, nested ones with their path', () => {
    expect(() => parseConfig({ sockt: '/x' }, 'f.json', {})).toThrow(/unknown key "sockt"/);
    expect(() => parseConfig({ drain: { chunkByte: 1 } }, 'f.json', {})).toThrow(/unknown key "drain.chunkByte"/);
  });
  it('names a bad value', () => {
    expect(() => parseConfig({ drain: { chunkBytes: -1 } }, 'f.json', {})).toThrow(ConfigError);
    expect(() => parseConfig({ drain: { chunkBytes: -1 } }, 'f.json', {})).toThrow(/"drain.chunkBytes"/);
    expect(() => parseConfig({ cgroup: { mode: 'v1' } }, 'f.json', {})).toThrow(/"cgroup.mode"/);
  });
  it('lets SBX_SOCKET and SBX_STATE_DIR override the file', () => {
    const c = parseConfig({ socketPath: '/from/file.sock', stateDir: '/from/file' }, 'f.json', { SBX_SOCKET: '/env.sock', SBX_STATE_DIR: '/env-state' });
    expect(c.socketPath).toBe('/env.sock');
    expect(c.stateDir).toBe('/env-state');
    const f = parseConfig({ socketPath: '/from/file.sock' }, 'f.json', {});
    expect(f.socketPath).toBe('/from/file.sock');
  });
  it('loads a file and reports unreadable JSON with its path', () => {
    const dir = mkdtempSync(join(tmpdir(), 'sbx-config-'));
    dirs.push(dir);
    const good = join(dir, 'good.json');
    writeFileSync(good, JSON.stringify({ logLevel: 'warn' }));
    expect(loadConfig(good, {}).logLevel).toBe('warn');
    const bad = join(dir, 'bad.json');
    writeFileSync(bad, '{ nope');
    expect(() => loadConfig(bad, {})).toThrow(new RegExp(`cannot read configuration ${bad}`));
  });
});
