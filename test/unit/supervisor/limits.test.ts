// Session limits as pure decisions (docs/guide/limits.md): the size syntax of --memory, what each
// limit writes (cpu.max's quota), /proc/cgroups, the refusal and its reason on a hybrid host, a
// pure cgroup2 host, an undelegated cgroup and subreaper mode, status, config defaults, and the
// receipt's limits and cause.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { parseSizeBytes, sizeText } from '../../../ipc/size.js';
import { applyLimits, cpuMaxValue, limitWrites, parseControllers, parseProcCgroups } from '../../../supervisor/cgroup.js';
import { admit, type AdmissionLoad } from '../../../supervisor/admission.js';
import { defaultLimitsProblem, effectiveLimits, limitRefusal, limitsStatus, type LimitHost } from '../../../supervisor/limits.js';
import { buildReceipt, causeWithOom, decideOutcome, type ReceiptFacts } from '../../../supervisor/session/receipt.js';
import { howEnded, limitsLine, oomLine } from '../../../cli/explain.js';
import { statusText } from '../../../cli/ps-format.js';
import type { Receipt, SessionSummary } from '../../../ipc/protocol.js';

// /proc/cgroups as this hybrid host has it (memory, pids, cpu in v1 hierarchies; hugetlb in v2).
const PROC_CGROUPS_HYBRID = `#subsys_name\thierarchy\tnum_cgroups\tenabled
cpuset\t3\t1\t1
cpu\t1\t1\t1
memory\t4\t15\t1
hugetlb\t0\t1\t1
pids\t8\t1\t1
`;
const PROC_CGROUPS_V2 = 'cpu\t0\t80\t1\nmemory\t0\t80\t1\npids\t0\t80\t1\n';
const SESSIONS = '/sys/fs/cgroup/unified/sandbox-supervisor/sessions';
const hybrid: LimitHost = {
  sessionsCgroup: SESSIONS,
  available: { memory: false, pids: false, cpu: false },
  controllers: '',
  root: { path: '/sys/fs/cgroup/unified', controllers: 'hugetlb' },
  procCgroups: parseProcCgroups(PROC_CGROUPS_HYBRID),
};
const pure: LimitHost = {
  sessionsCgroup: '/sys/fs/cgroup/system.slice/sandbox-supervisor.service/sessions',
  available: { memory: true, pids: true, cpu: true },
  controllers: 'cpu memory pids',
  root: { path: '/sys/fs/cgroup', controllers: 'cpuset cpu io memory hugetlb pids rdma misc' },
  procCgroups: parseProcCgroups(PROC_CGROUPS_V2),
};
const dirs: string[] = [];
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));
const subreaper: LimitHost = {
  sessionsCgroup: null,
  available: { memory: false, pids: false, cpu: false },
  controllers: '',
  root: null,
  procCgroups: parseProcCgroups(PROC_CGROUPS_V2),
};

describe('--memory sizes (ipc/size.ts)', () => {
  it('takes bytes and 1024-based K M G T, KiB MiB GiB TiB, in either case, with fractions', () => {
    expect(parseSizeBytes('67108864')).toBe(64 * 2 ** 20);
    expect(parseSizeBytes('64M')).toBe(64 * 2 ** 20);
    expect(parseSizeBytes('64MiB')).toBe(64 * 2 ** 20);
    expect(parseSizeBytes('64m')).toBe(64 * 2 ** 20);
    expect(parseSizeBytes('512k')).toBe(512 * 1024);
    expect(parseSizeBytes('1.5G')).toBe(1.5 * 2 ** 30);
    expect(parseSizeBytes('2 GiB')).toBe(2 * 2 ** 30);
    expect(parseSizeBytes('1T')).toBe(2 ** 40);
    expect(parseSizeBytes('100b')).toBe(100);
  });
  it('refuses what is not a size, the ambiguous MB, nothing and too much', () => {
    for (const bad of ['', 'M', '64MB', '64 mb', '-1', '1e6', '64X', '0x10']) expect(() => parseSizeBytes(bad), bad).toThrow(/is not a size/);
    expect(() => parseSizeBytes('0')).toThrow(/less than one byte/);
    expect(() => parseSizeBytes('0.5')).toThrow(/less than one byte/);
    expect(() => parseSizeBytes('99999999T')).toThrow(/too large/);
  });
  it('writes sizes back in the largest unit reached', () => {
    expect([sizeText(512), sizeText(64 * 2 ** 20), sizeText(1.5 * 2 ** 30), sizeText(2 ** 40), sizeText(65 * 2 ** 20 + 2 ** 19)]).toEqual([
      '512 B',
      '64 MiB',
      '1.5 GiB',
      '1 TiB',
      '65.5 MiB',
    ]);
  });
});

describe('what a limit writes (cgroup-v2.rst)', () => {
  it('cpu.max: round(cpus * 100000) per 100000 µs, at least 1000', () => {
    expect(cpuMaxValue(0.5)).toBe('50000 100000');
    expect(cpuMaxValue(2)).toBe('200000 100000');
    expect(cpuMaxValue(0.333333)).toBe('33333 100000');
    expect(cpuMaxValue(0.01)).toBe('1000 100000');
    expect(cpuMaxValue(0.001)).toBe('1000 100000');
  });
  it('memory.max and then memory.swap.max 0 where it exists, pids.max, cpu.max; nothing for no limits', () => {
    expect(limitWrites({ memory_max_bytes: 1024, pids_max: 64, cpus: 1.5 })).toEqual([
      { file: 'memory.max', value: '1024' },
      { file: 'memory.swap.max', value: '0', optional: true },
      { file: 'pids.max', value: '64' },
      { file: 'cpu.max', value: '150000 100000' },
    ]);
    expect(limitWrites({})).toEqual([]);
  });
  it('applyLimits writes each file of a leaf in order, skips an absent memory.swap.max, and names a file it cannot write', () => {
    // A plain directory standing in for a leaf: the files a kernel with the controllers has (the kernel's own checks: test/nspawn.test.ts).
    const dir = mkdtempSync(join(tmpdir(), 'sbx-limits-'));
    dirs.push(dir);
    for (const f of ['memory.max', 'pids.max', 'cpu.max']) writeFileSync(join(dir, f), 'max\n');
    applyLimits(dir, { memory_max_bytes: 4096, pids_max: 3, cpus: 0.25 });
    expect(['memory.max', 'pids.max', 'cpu.max'].map((f) => readFileSync(join(dir, f), 'utf8'))).toEqual(['4096', '3', '25000 100000']);
    writeFileSync(join(dir, 'memory.swap.max'), 'max\n');
    applyLimits(dir, { memory_max_bytes: 8192 });
    expect(readFileSync(join(dir, 'memory.swap.max'), 'utf8')).toBe('0');
    rmSync(join(dir, 'pids.max'));
    expect(() => applyLimits(dir, { pids_max: 3 })).toThrow(
      expect.objectContaining({ code: 'ENOENT', message: expect.stringContaining(`cannot write 3 to ${join(dir, 'pids.max')}`) }),
    );
  });
  it('parses cgroup.controllers and /proc/cgroups (cgroups(7))', () => {
    expect(parseControllers('cpu memory pids\n')).toEqual(['cpu', 'memory', 'pids']);
    expect(parseControllers('\n')).toEqual([]);
    const proc = parseProcCgroups(PROC_CGROUPS_HYBRID);
    expect(proc.get('memory')).toEqual({ hierarchy: 4, enabled: true });
    expect(proc.get('hugetlb')).toEqual({ hierarchy: 0, enabled: true });
    expect(proc.has('#subsys_name')).toBe(false);
  });
});

describe('the refusal (LIMIT_UNAVAILABLE)', () => {
  it('on a hybrid host names the controller, the sessions cgroup, what v2 has, and the v1 binding', () => {
    const err = limitRefusal({ memory_max_bytes: 64 << 20 }, hybrid)!;
    expect(err.toWire()).toEqual({
      code: 'LIMIT_UNAVAILABLE',
      retryable: false,
      message: `--memory (memory_max_bytes) needs the memory controller in cgroup v2, and ${SESSIONS} does not have it (cgroup.controllers: none; the cgroup2 root's (/sys/fs/cgroup/unified): hugetlb); this host binds it to cgroup v1 (/proc/cgroups: hierarchy 4; a hybrid host), and a controller is in one hierarchy only. Nothing was run.`,
      details: { controller: 'memory', limit: 'memory_max_bytes', cgroup: SESSIONS },
    });
    expect(limitRefusal({ pids_max: 64 }, hybrid)!.details).toEqual({ controller: 'pids', limit: 'pids_max', cgroup: SESSIONS });
    expect(limitRefusal({ cpus: 0.5 }, hybrid)!.message).toMatch(/^--cpus \(cpus\) needs the cpu controller .* hierarchy 1; /);
    // Several asked for: the first in memory, pids, cpu order is named.
    expect(limitRefusal({ cpus: 1, pids_max: 5 }, hybrid)!.details!.controller).toBe('pids');
  });
  it('refuses nothing on a pure cgroup2 host with the controllers delegated, or with no limit asked for', () => {
    expect(limitRefusal({ memory_max_bytes: 1, pids_max: 1, cpus: 1 }, pure)).toBeNull();
    expect(limitRefusal({}, hybrid)).toBeNull();
  });
  it('says what is missing elsewhere: not delegated, offered but not enabled, disabled, subreaper mode', () => {
    const undelegated: LimitHost = { ...pure, available: { memory: false, pids: true, cpu: true }, controllers: 'cpu pids' };
    expect(limitRefusal({ memory_max_bytes: 1 }, undelegated)!.message).toContain('the parent cgroup does not delegate it (under systemd: Delegate=yes');
    expect(limitRefusal({ memory_max_bytes: 1 }, { ...undelegated, controllers: 'cpu memory pids' })!.message).toContain(
      'offered (cgroup.controllers) but could not be enabled',
    );
    expect(limitRefusal({ memory_max_bytes: 1 }, { ...undelegated, procCgroups: parseProcCgroups('memory\t0\t1\t0\n') })!.message).toContain(
      'the kernel has it disabled',
    );
    const s = limitRefusal({ cpus: 1 }, subreaper)!;
    expect(s.message).toBe(
      '--cpus (cpus) needs the cpu controller in cgroup v2, and this supervisor runs in subreaper mode: it has no cgroup at all (sbx status says why). Nothing was run.',
    );
    expect(s.details).toEqual({ controller: 'cpu', limit: 'cpus', cgroup: null });
  });
  it('is decided after the key (a retry answers with its session as admitted) and before the seal and every other refusal of a new key', () => {
    const refusal = limitRefusal({ pids_max: 1 }, hybrid)!;
    const load: AdmissionLoad = {
      existing: null,
      retired: null,
      sealed: { generation: 1, sealed_at: 'x' },
      liveSessions: 99,
      maxSessions: 1,
      reconciling: true,
      disk: { admits: false, freeBytes: 0, minFreeBytes: 1 },
      limitRefusal: refusal,
    };
    const req = { invocationKey: 'k', commandDigest: 'sha256:a', task: 'default' };
    const d = admit(req, load);
    expect(d.kind === 'refuse' && d.error.code).toBe('LIMIT_UNAVAILABLE');
    expect(admit(req, { ...load, existing: { sessionId: 's-1-aa', commandDigest: 'sha256:a', state: 'ended', task: 'default' } })).toEqual({
      kind: 'existing',
      sessionId: 's-1-aa',
      state: 'ended',
    });
  });
});

describe('status, defaults and receipts', () => {
  it('status: the three booleans and one reason grouping the controllers by why', () => {
    expect(limitsStatus(pure)).toEqual({ memory: true, pids: true, cpu: true });
    const h = limitsStatus(hybrid);
    expect(h).toEqual({
      memory: false,
      pids: false,
      cpu: false,
      reason: `memory, pids, cpu are bound to cgroup v1 (${SESSIONS}: cgroup.controllers: none; the cgroup2 root's (/sys/fs/cgroup/unified): hugetlb)`,
    });
    expect(limitsLine(h)).toBe(`none enforceable here (${h.reason})`);
    expect(limitsLine(limitsStatus(pure))).toBe('memory, pids, cpu (--memory, --pids, --cpus)');
    const partial = limitsStatus({ ...pure, available: { memory: true, pids: true, cpu: false }, controllers: 'memory pids' });
    expect(partial.reason).toMatch(/^cpu is not delegated to this cgroup \(/);
    expect(limitsLine(partial)).toMatch(/^only memory, pids \(cpu is not delegated/);
    expect(limitsStatus(subreaper).reason).toBe('subreaper mode: no cgroup, so no limit can be enforced');
  });
  it("defaults apply limit by limit where the launch names none; one the host cannot enforce is start-up's problem", () => {
    const defaults = { memoryMaxBytes: 1 << 30, pidsMax: null, cpus: 2 };
    expect(effectiveLimits({}, defaults)).toEqual({ memory_max_bytes: 1 << 30, cpus: 2 });
    expect(effectiveLimits({ memory_max_bytes: 5, pids_max: 7 }, defaults)).toEqual({ memory_max_bytes: 5, pids_max: 7, cpus: 2 });
    expect(effectiveLimits({}, { memoryMaxBytes: null, pidsMax: null, cpus: null })).toEqual({});
    expect(defaultLimitsProblem(defaults, pure)).toBeNull();
    expect(defaultLimitsProblem({ memoryMaxBytes: null, pidsMax: null, cpus: null }, hybrid)).toBeNull();
    expect(defaultLimitsProblem(defaults, hybrid)).toMatch(
      /^session\.defaultLimits\.memoryMaxBytes is set \(1073741824\), but the memory controller is not available to sessions here: this host binds it to cgroup v1 .*; the supervisor will not run sessions without a limit it was told to apply/,
    );
  });
  const facts: ReceiptFacts = {
    sessionId: 's-1-aa',
    invocationKey: 'k',
    commandDigest: 'sha256:a',
    argv: ['x'],
    cwd: '/',
    user: null,
    supervisor: { instance: 'i', generation: 1, bootId: 'b', mode: 'cgroup', pid: 1 },
    admittedAt: new Date(0),
    startedAt: new Date(0),
    leaderExitedAt: new Date(1),
    endedAt: new Date(2),
    exit: { code: null, signal: 'SIGKILL' },
    spawnFailure: null,
    cause: 'oom_kill',
    steps: [],
    signalsSent: new Set(),
    death: { evidence: 'cgroup_empty', observedAt: new Date(2) },
    output: {},
    usage: { memory_controller: true, memory_peak_bytes: 64 << 20, oom_kills: 1 },
    descendantsTerminated: 0,
  };
  it('the cause: oom_kill only for a leader SIGKILLed unasked with an OOM kill counted; a descendant only leaves it', () => {
    expect(causeWithOom(null, { leaderKilledUnasked: true, oomKills: 1 })).toBe('oom_kill');
    expect(causeWithOom('linger', { leaderKilledUnasked: true, oomKills: 2 })).toBe('oom_kill'); // the linger came after
    expect(causeWithOom(null, { leaderKilledUnasked: true, oomKills: 0 })).toBeNull(); // a kill -9 from the session itself
    expect(causeWithOom(null, { leaderKilledUnasked: true, oomKills: undefined })).toBeNull(); // no memory controller
    expect(causeWithOom(null, { leaderKilledUnasked: false, oomKills: 3 })).toBeNull(); // a descendant was the victim
    expect(causeWithOom('linger', { leaderKilledUnasked: false, oomKills: 1 })).toBe('linger');
    expect(causeWithOom('deadline', { leaderKilledUnasked: true, oomKills: 1 })).toBe('deadline');
  });
  it('the receipt: limits only when set; an OOM kill is signaled with cause oom_kill, said in one line', () => {
    const r = buildReceipt({ ...facts, limits: { memory_max_bytes: 64 << 20 } });
    expect(r.limits).toEqual({ memory_max_bytes: 64 << 20 });
    expect(r.outcome).toBe('signaled');
    expect(r.termination).toEqual({ cause: 'oom_kill', steps: [], signal_source: 'not_supervisor' });
    expect(oomLine(r as Receipt)).toBe('killed by the OOM killer at memory.max 64 MiB (peak 64 MiB; sbx receipt s-1-aa)');
    expect('limits' in buildReceipt(facts)).toBe(false);
    expect('limits' in buildReceipt({ ...facts, limits: {} })).toBe(false);
    expect(oomLine(buildReceipt({ ...facts, cause: null }))).toBeNull();
    expect(decideOutcome({ spawnFailure: null, cause: 'oom_kill', exit: { code: null, signal: 'SIGKILL' } })).toBe('signaled');
  });
  it('sbx ps and the ended lines say the OOM killer, not a bare SIGKILL', () => {
    const ended = '2026-12-03T10:00:00.000Z';
    const row = {
      state: 'ended',
      outcome: 'signaled',
      exit: { code: null, signal: 'SIGKILL' },
      termination_cause: 'oom_kill',
      ended_at: ended,
    } as SessionSummary;
    expect(statusText(row, Date.parse(ended) + 120_000)).toBe('killed by the OOM killer, 2 min ago');
    expect(statusText({ ...row, termination_cause: null }, Date.parse(ended) + 120_000)).toBe('killed by SIGKILL, 2 min ago');
    expect(howEnded(row)).toBe(`killed by the OOM killer (SIGKILL) at ${ended}`);
    expect(howEnded(buildReceipt({ ...facts, limits: { memory_max_bytes: 1 } }))).toBe(`killed by the OOM killer (SIGKILL) at ${new Date(2).toISOString()}`);
  });
});
