// remote: the transports of issue 30 against the Unix socket, same run, one supervisor with its
// WebSocket listener on loopback: launch -> receipt of `true` p50/p99 (one kept connection each,
// transports taking turns) and read_output of one stored 1 GiB stream (a new connection each, as
// readOutput makes it), over the socket, `sbx bridge` and ws://127.0.0.1. Goal: launch within
// 1.5x of the socket, throughput at least 0.5x.
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { readOutput, SupervisorClient, type ConnectOptions } from '../../ipc/client.js';
import { SBX_BIN } from '../../test/helpers/daemon.js';
import { freeLoopbackPort } from '../../test/helpers/tcp-proxy.js';
import { benchDaemon, distribution, fmtMs, fmtRate, nowMs, printTable, type Row, writeJson } from './common.js';

const TOKEN = 'bench-remote-token-0123456789abcdef0123';
const TRANSPORTS = ['unix socket', 'sbx bridge', 'WebSocket'] as const;
type Transport = (typeof TRANSPORTS)[number];

export async function remoteBench(options: { launches: number; gib: number }): Promise<Row[]> {
  const port = await freeLoopbackPort();
  const d = await benchDaemon({ config: { remote: { listen: `127.0.0.1:${port}` } }, env: { SBX_REMOTE_TOKEN: TOKEN } });
  const endpoints: Record<Transport, ConnectOptions> = {
    'unix socket': { socketPath: d.socketPath },
    'sbx bridge': { command: [SBX_BIN, 'bridge', '--socket', d.socketPath] },
    WebSocket: { url: `ws://127.0.0.1:${port}`, token: TOKEN },
  };
  const launch: Record<Transport, number[]> = { 'unix socket': [], 'sbx bridge': [], WebSocket: [] };
  const readMs: Record<Transport, number[]> = { 'unix socket': [], 'sbx bridge': [], WebSocket: [] };
  const bytes = Math.round(options.gib * 2 ** 30);
  try {
    const clients = Object.fromEntries(
      await Promise.all(TRANSPORTS.map(async (t) => [t, await SupervisorClient.connect({ ...endpoints[t], clientName: 'bench remote' })] as const)),
    ) as Record<Transport, SupervisorClient>;
    try {
      for (const t of TRANSPORTS) {
        const w = await clients[t].launch({ argv: ['true'], cwd: '/' }); // warm
        await clients[t].wait({ session_id: w.session_id });
      }
      for (let i = 0; i < options.launches; i++) {
        for (const t of TRANSPORTS) {
          const c = clients[t];
          const t0 = nowMs();
          const { session_id } = await c.launch({ argv: ['true'], cwd: '/' });
          const r = await c.wait({ session_id });
          launch[t].push(nowMs() - t0);
          if (r.outcome !== 'exited' || r.exit.code !== 0) throw new Error(`remote: ${t}: session ${session_id} ended ${r.outcome} ${JSON.stringify(r.exit)}`);
        }
      }
    } finally {
      for (const c of Object.values(clients)) c.close();
    }

    // One stored stream, read whole over each transport (twice, alternating).
    const c = await SupervisorClient.connect({ socketPath: d.socketPath });
    let sessionId: string;
    try {
      ({ session_id: sessionId } = await c.launch({ argv: ['head', '-c', String(bytes), '/dev/zero'], cwd: '/' }));
      const r = await c.wait({ session_id: sessionId });
      if (r.output.stdout?.final_cursor !== bytes) throw new Error(`remote: the producer stored ${r.output.stdout?.final_cursor} bytes, not ${bytes}`);
    } finally {
      c.close();
    }
    for (let rep = 0; rep < 2; rep++) {
      for (const t of TRANSPORTS) {
        const t0 = nowMs();
        let n = 0;
        for await (const chunk of readOutput({ ...endpoints[t], selector: { session_id: sessionId }, stream: 'stdout' })) n += chunk.data.length;
        readMs[t].push(nowMs() - t0);
        if (n !== bytes) throw new Error(`remote: ${t} read ${n} bytes of ${bytes}`);
      }
    }
    rmSync(join(d.stateDir, 'sessions', sessionId, 'stdout'), { recursive: true, force: true });
  } finally {
    await d.stop();
  }
  const dist = Object.fromEntries(TRANSPORTS.map((t) => [t, distribution(launch[t])])) as Record<Transport, ReturnType<typeof distribution>>;
  const best = Object.fromEntries(TRANSPORTS.map((t) => [t, Math.min(...readMs[t])])) as Record<Transport, number>;
  const base = dist['unix socket'];
  const rows: Row[] = [
    {
      metric: `launch -> receipt over the unix socket, p50 / p99 (${options.launches})`,
      value: `${fmtMs(base.p50)} / ${fmtMs(base.p99)}`,
      baseline: '',
      ratio: '',
      target: '',
      met: null,
    },
  ];
  for (const t of ['sbx bridge', 'WebSocket'] as const) {
    const x = dist[t];
    rows.push({
      metric: `launch -> receipt over ${t}, p50 / p99 (${options.launches})`,
      value: `${fmtMs(x.p50)} / ${fmtMs(x.p99)}`,
      baseline: `unix socket: ${fmtMs(base.p50)} / ${fmtMs(base.p99)}`,
      ratio: `${(x.p50 / base.p50).toFixed(2)}x / ${(x.p99 / base.p99).toFixed(2)}x`,
      target: '<= 1.5x (p50)',
      met: x.p50 / base.p50 <= 1.5,
    });
  }
  const gibText = `${options.gib} GiB`;
  rows.push({
    metric: `read_output of ${gibText} over the unix socket (best of 2)`,
    value: fmtRate(bytes, best['unix socket']),
    baseline: '',
    ratio: '',
    target: '',
    met: null,
  });
  for (const t of ['sbx bridge', 'WebSocket'] as const) {
    const ratio = best['unix socket'] / best[t];
    rows.push({
      metric: `read_output of ${gibText} over ${t} (best of 2)`,
      value: fmtRate(bytes, best[t]),
      baseline: `unix socket: ${fmtRate(bytes, best['unix socket'])}`,
      ratio: `${ratio.toFixed(2)}x`,
      target: '>= 0.5x',
      met: ratio >= 0.5,
    });
  }
  printTable('remote (transports)', rows);
  writeJson('remote', { launch_to_receipt_ms: dist, read_output_ms: readMs, bytes, samples: { launch_to_receipt: launch } });
  return rows;
}
