// handoff: what handing leftovers off to a service costs the command (issue 32): from the
// leader's last act (`date +%s%N` printed, then exit) to its fsync'ed receipt at the client, for
// a command that leaves one `sleep` behind with linger handoff (freeze, move, split the pipes,
// thaw) and with linger kill (TERM, the sleep dies at once), next to one that leaves nothing,
// interleaved in one run. Each service is cancelled and waited for before the next sample.
import type { TestDaemon } from '../../test/helpers/daemon.js';
import { connect, distribution, fmtMs, nowMs, printTable, type Row, writeJson } from './common.js';

const execAt = (out: Buffer | string) => Number(BigInt(String(out).trim().split('\n')[0]) / 1000n) / 1000;

export async function handoffBench(d: TestDaemon, runs: number): Promise<Row[]> {
  const client = await connect(d);
  const samples: Record<'none' | 'kill' | 'handoff', number[]> = { none: [], kill: [], handoff: [] };
  const script = { none: 'date +%s%N', kill: 'sleep 60 & date +%s%N', handoff: 'sleep 60 & date +%s%N' };
  try {
    for (let i = 0; i < runs; i++) {
      for (const kind of ['none', 'kill', 'handoff'] as const) {
        const { session_id } = await client.launch({ argv: ['sh', '-c', script[kind]], cwd: '/', linger: kind === 'none' ? 'kill' : kind, grace_ms: 1000 });
        const r = await client.wait({ session_id });
        const t1 = nowMs();
        if (r.exit.code !== 0 || (kind === 'handoff') !== Boolean(r.handed_off))
          throw new Error(
            `handoff bench: ${kind} session ${session_id} ended ${r.outcome} ${JSON.stringify(r.exit)} handed_off ${JSON.stringify(r.handed_off)}`,
          );
        samples[kind].push(t1 - execAt(await client.read({ session_id }, 'stdout')));
        if (r.handed_off) {
          await client.request('cancel', { session_id: r.handed_off.service_id, grace_ms: 0 });
          await client.wait({ session_id: r.handed_off.service_id });
        }
      }
    }
  } finally {
    client.close();
  }
  const [none, kill, handoff] = (['none', 'kill', 'handoff'] as const).map((k) => distribution(samples[k]));
  const rows: Row[] = [
    { metric: 'exit -> receipt, nothing left, p50 / p99', value: `${fmtMs(none.p50)} / ${fmtMs(none.p99)}`, baseline: '', ratio: '', target: '', met: null },
    {
      metric: 'exit -> receipt, one leftover, --linger kill, p50 / p99',
      value: `${fmtMs(kill.p50)} / ${fmtMs(kill.p99)}`,
      baseline: fmtMs(none.p50),
      ratio: `${(kill.p50 / none.p50).toFixed(2)}x`,
      target: '',
      met: null,
    },
    {
      metric: 'exit -> receipt, one leftover, --linger handoff, p50 / p99',
      value: `${fmtMs(handoff.p50)} / ${fmtMs(handoff.p99)}`,
      baseline: fmtMs(kill.p50),
      ratio: `${(handoff.p50 / kill.p50).toFixed(2)}x`,
      target: '',
      met: null,
    },
  ];
  printTable(`handoff (${runs} of each, interleaved)`, rows);
  writeJson('handoff', { none, kill, handoff, samples });
  return rows;
}
