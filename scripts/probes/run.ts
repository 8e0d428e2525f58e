// The qualification harness: every probe (scripts/probes/probes.ts), or every case of a
// field-case file, against three targets side by side: naive-node, naive-python (a
// stream-shaped path as agent runtimes commonly build it: scripts/probes/targets/) and
// sandbox-supervisor (the client library, and sbx where it matters). Prints a Markdown table
// (one row per probe, one column per target, each cell the exact observation), or JSON.
// Exits 1 when a probe fails against sandbox-supervisor; naive failures are the point.
//
//   npm run probes -- [--cases FILE|default] [--targets naive-node,naive-python,sandbox-supervisor]
//                     [--only ID,...] [--fast] [--json] [--socket PATH] [--repeat-scale N]
//   (--cases default: test/fixtures/field-cases.jsonl, the format of docs/reference/field-cases.md)
//
// Without --socket it boots a supervisor of its own in a temp dir (as root: cgroup mode),
// and it makes itself a child subreaper that does not reap on its own, standing for a
// container init without tini: orphans of a naive run are reparented to it and counted as
// zombies, then reaped. Every process a probe starts carries SBX_PROBE_MARK=<unique> in its
// environment; after each probe those still alive are counted, then SIGKILLed by pid.
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { SupervisorClient } from '../../ipc/client.js';
import { Reaper } from '../../supervisor/reaper.js';
import { native } from '../../core/fs/native.js';
import { TestDaemon } from '../../test/helpers/daemon.js';
import { type CaseResult, type FieldCase, loadCases, releaseRuns, runCase } from './field-cases.js';
import { type NaiveResult, type NaiveTarget, runNaiveCase } from './naive.js';
import { PROBES } from './probes.js';

const ROOT = resolve(import.meta.dirname, '../..');

/** A bad option or case file: one line, exit 2, no stack. */
class UsageError extends Error {}
const ALL_TARGETS = ['naive-node', 'naive-python', 'sandbox-supervisor'] as const;
type Target = (typeof ALL_TARGETS)[number];

interface Cell {
  ok: boolean | null;
  text: string;
  /** Per way the target ran it (client, sbx, client+pty; naive: one). */
  runs: { via: string; ok: boolean | null; failures: string[]; observed: string; wall_ms?: number }[];
  peakRssKb?: number;
}

interface Row {
  id: string;
  title: string;
  cells: Partial<Record<Target, Cell>>;
}

function supervisorCell(results: CaseResult[]): Cell {
  const ok = results.every((r) => r.ok);
  const text = results.map((r) => `${r.via}: ${r.ok ? '' : `${r.failures.join('; ')}; observed `}${r.observed}`).join('<br>');
  return { ok, text, runs: results.map((r) => ({ via: r.via, ok: r.ok, failures: r.failures, observed: r.observed, wall_ms: r.wallMs })) };
}

function naiveCell(r: NaiveResult): Cell {
  return {
    ok: r.ok,
    text: r.ok === false ? `${r.failures.join('; ')}; observed ${r.observed}` : r.observed,
    runs: [{ via: r.target, ok: r.ok, failures: r.failures, observed: r.observed }],
    peakRssKb: r.peakRssKb,
  };
}

const mark = (c: Cell | undefined) => (c === undefined ? '' : c.ok === null ? '—' : c.ok ? 'pass' : '**FAIL**');

export function table(rows: Row[], targets: readonly Target[]): string {
  const esc = (s: string) => s.replaceAll('|', '\\|').replaceAll('\n', ' ');
  const head = `| probe | ${targets.join(' | ')} |`;
  const sep = `|---|${targets.map(() => '---').join('|')}|`;
  const lines = rows.map(
    (r) => `| ${esc(r.title)} (\`${r.id}\`) | ${targets.map((t) => (r.cells[t] ? `${mark(r.cells[t])}: ${esc(r.cells[t]!.text)}` : '')).join(' | ')} |`,
  );
  const summary = `| **passed** | ${targets
    .map((t) => {
      const cells = rows.map((r) => r.cells[t]).filter((c) => c && c.ok !== null);
      return `${cells.filter((c) => c!.ok).length} of ${cells.length}`;
    })
    .join(' | ')} |`;
  return [head, sep, ...lines, summary].join('\n');
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      cases: { type: 'string' },
      targets: { type: 'string', default: ALL_TARGETS.join(',') },
      only: { type: 'string' },
      fast: { type: 'boolean', default: false },
      json: { type: 'boolean', default: false },
      socket: { type: 'string' },
      'repeat-scale': { type: 'string', default: '1' },
    },
  });
  const targets = values.targets!.split(',') as Target[];
  for (const t of targets) if (!ALL_TARGETS.includes(t)) throw new UsageError(`--targets: unknown target ${t}; one of ${ALL_TARGETS.join(', ')}`);
  let cases: FieldCase[];
  if (values.cases) {
    const file = values.cases === 'default' ? join(ROOT, 'test/fixtures/field-cases.jsonl') : values.cases;
    process.stderr.write(`probes: cases from ${file}\n`);
    try {
      cases = loadCases(file);
    } catch (err) {
      throw new UsageError(`--cases: ${(err as Error).message}`);
    }
  } else {
    cases = PROBES.filter((p) => !values.fast || p.fast);
  }
  if (values.only) {
    const only = values.only.split(',');
    const unknown = only.filter((id) => !cases.some((c) => c.id === id));
    if (unknown.length)
      throw new UsageError(`--only: no ${values.cases ? 'case' : 'probe'} named ${unknown.join(', ')} (there are: ${cases.map((c) => c.id).join(', ')})`);
    cases = cases.filter((c) => only.includes(c.id));
  }
  const repeatScale = Number(values['repeat-scale']);
  if (!(repeatScale > 0)) throw new UsageError(`--repeat-scale: a positive number, not ${JSON.stringify(values['repeat-scale'])}`);

  // The harness as a non-reaping subreaper: see the header.
  const account = new Reaper();
  native().setChildSubreaper();

  let socketPath = values.socket;
  let own: TestDaemon | null = null;
  if (targets.includes('sandbox-supervisor') && !socketPath) {
    own = await new TestDaemon({ config: { logLevel: 'warn' }, cgroupPrefix: 'sbx-probes-' }).start();
    account.track(own.pid);
    socketPath = own.socketPath;
  }
  const rows: Row[] = [];
  // Interrupted: end what the current probe started and the harness's own supervisor.
  const interrupted = (signal: NodeJS.Signals) => {
    process.stderr.write(`probes: ${signal}: cleaning up\n`);
    void releaseRuns(() => account.reapNow())
      .then(() => own?.stop())
      .finally(() => process.exit(signal === 'SIGINT' ? 130 : 143));
  };
  process.once('SIGINT', interrupted);
  process.once('SIGTERM', interrupted);
  try {
    let supervisorPid = -1;
    if (socketPath) {
      const client = await SupervisorClient.connect({ socketPath });
      supervisorPid = (await client.status()).pid;
      client.close();
    }
    for (const c of cases) {
      const row: Row = { id: c.id, title: c.title ?? c.id.replace(/^[a-z]\d+-/, '').replaceAll('-', ' '), cells: {} };
      for (const target of targets) {
        process.stderr.write(`probes: ${c.id} / ${target}\n`);
        if (target === 'sandbox-supervisor') {
          if (c.expect.kill_supervisor_after_output && !own) {
            row.cells[target] = { ok: null, text: 'n/a: needs a supervisor of the harness (drop --socket)', runs: [] };
            continue;
          }
          const results = await runCase(socketPath!, supervisorPid, c, { repeatScale, ...(own ? { daemon: own } : {}), reap: () => account.reapNow() });
          if (own && c.expect.kill_supervisor_after_output) {
            account.track(own.pid);
            supervisorPid = own.pid;
          }
          row.cells[target] = supervisorCell(results);
        } else {
          row.cells[target] = naiveCell(await runNaiveCase(target as NaiveTarget, c, account, { repeatScale }));
        }
      }
      rows.push(row);
    }
  } finally {
    await own?.stop();
    account.reapNow();
  }
  const passed = Object.fromEntries(
    targets.map((t) => [
      t,
      {
        passed: rows.filter((r) => r.cells[t]?.ok === true).length,
        failed: rows.filter((r) => r.cells[t]?.ok === false).length,
        not_applicable: rows.filter((r) => r.cells[t]?.ok === null).length,
      },
    ]),
  );
  const out = values.json ? JSON.stringify({ targets, summary: passed, rows }, null, 2) : table(rows, targets);
  process.stdout.write(`${out}\n`);
  process.exitCode = rows.every((r) => r.cells['sandbox-supervisor']?.ok !== false) ? 0 : 1;
}

if (process.argv[1] && resolve(process.argv[1]) === resolve(import.meta.filename)) {
  main().catch((err) => {
    const usage = err instanceof UsageError || String((err as { code?: string }).code).startsWith('ERR_PARSE_ARGS');
    process.stderr.write(`probes: ${usage ? (err as Error).message : (err as Error).stack}\n`);
    process.exit(2);
  });
}
