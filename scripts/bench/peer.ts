// peer: the supervisor side by side with what users would otherwise pick, systemd 252 booted
// as PID 1 in systemd-nspawn (the recipe of test/nspawn.test.ts and docs/design/facts.md "Testing the
// systemd unit for real"), with this checkout installed as its unit (scripts/install.sh).
// Inside the container, in the same run: launch wall (`systemd-run --wait --pipe -- true`
// against `sbx run -- true` and a launch -> receipt through the client library on one
// connection), a line flood under journald's defaults (lines kept, time until journalctl
// reads them) against the supervisor (lines kept, time until the receipt), and one 4 MiB line
// (records and the longest). Timed inside the container (date +%s%N around each loop), so
// nsenter's own start is not counted. Skipped, saying why, where nspawn cannot run.
import { CHECKOUT, NspawnContainer, nspawnUnavailable } from '../../test/helpers/nspawn.js';
import { until } from '../../test/helpers/daemon.js';
import { fmtMs, printTable, type Row, writeJson } from './common.js';

/** ms per iteration of body, n times, timed inside the container. */
function perOpMs(c: NspawnContainer, body: string, n: number): number {
  const ns = Number(c.bash(`t0=$(date +%s%N); for i in $(seq ${n}); do ${body}; done; t1=$(date +%s%N); echo $(( (t1 - t0) / ${n} ))`));
  return ns / 1e6;
}

export async function peerBench(options: { launches: number; lines: number }): Promise<Row[]> {
  const why = nspawnUnavailable();
  if (why) {
    const rows: Row[] = [{ metric: 'peer: systemd 252 in nspawn', value: `skipped: ${why}`, baseline: '', ratio: '', target: '', met: null }];
    printTable('peer (systemd in nspawn)', rows);
    return rows;
  }
  const c = new NspawnContainer({ machine: 'sbxbench', rootfs: '/tmp/sbx-bench-nspawn-root', cgroupName: 'sbx-bench-nspawn', commandTimeoutMs: 300_000 });
  try {
    await c.boot();
    const n = options.launches;
    // Warm both (the first systemd-run loads units; the first sbx run socket-activates the service).
    c.bash('systemd-run --wait --pipe -q -- true; /usr/local/bin/sbx run --cwd / -- true');
    const systemdRun = perOpMs(c, 'systemd-run --wait --pipe -q -- true > /dev/null', n);
    const sbxRun = perOpMs(c, '/usr/local/bin/sbx run --cwd / -- true > /dev/null', n);
    const lib = Number(
      c.bash(
        `node --input-type=module -e "import { SupervisorClient } from '${CHECKOUT}/dist/ipc/client.js'; const c = await SupervisorClient.connect({}); const w = await c.launch({ argv: ['true'], cwd: '/' }); await c.wait({ session_id: w.session_id }); const t0 = performance.now(); for (let i = 0; i < ${n}; i++) { const l = await c.launch({ argv: ['true'], cwd: '/' }); await c.wait({ session_id: l.session_id }); } console.log((performance.now() - t0) / ${n}); c.close();"`,
      ),
    );

    // A line flood: journald under its defaults against the supervisor.
    const lines = options.lines;
    const journald = c
      .bash(
        `t0=$(date +%s%N); systemd-run --wait -q --unit=sbx-bench-flood -- seq 1 ${lines}; prev=-1; last=$(date +%s%N); for i in $(seq 200); do k=$(journalctl -q -u sbx-bench-flood.service -o cat --no-pager | wc -l); now=$(date +%s%N); if [ "$k" != "$prev" ]; then prev=$k; last=$now; elif [ $(( (now - last) / 1000000 )) -gt 1000 ]; then break; fi; sleep 0.1; done; echo "$prev $(( (last - t0) / 1000000 ))"`,
      )
      .split(' ')
      .map(Number);
    const ours = c
      .bash(
        `t0=$(date +%s%N); id=$(/usr/local/bin/sbx run --cwd / --detach -- seq 1 ${lines}); /usr/local/bin/sbx wait $id > /dev/null; t1=$(date +%s%N); k=$(/usr/local/bin/sbx logs $id | wc -l); echo "$k $(( (t1 - t0) / 1000000 ))"`,
      )
      .split(' ')
      .map(Number);

    // One 4 MiB line (and its newline).
    const LINE = 4 << 20;
    const line = `head -c ${LINE} /dev/zero | tr '\\\\0' a; echo`;
    c.bash(`systemd-run --wait -q --unit=sbx-bench-longline -- sh -c "${line}"`);
    await until(() => Number(c.bash('journalctl -q -u sbx-bench-longline.service -o cat --no-pager | wc -l')) > 0, 'journald to have the long line', 30_000);
    const records = c
      .bash(`journalctl -q -u sbx-bench-longline.service -o cat --no-pager | awk '{ n++; if (length($0) > m) m = length($0) } END { print n, m }'`)
      .split(' ')
      .map(Number);
    const oursLine = c
      .bash(`/usr/local/bin/sbx run --cwd / -- sh -c "${line}" | awk '{ n++; if (length($0) > m) m = length($0) } END { print n, m }'`)
      .split(' ')
      .map(Number);

    const rows: Row[] = [
      {
        metric: 'launch wall: sbx run -- true',
        value: fmtMs(sbxRun),
        baseline: `systemd-run --wait --pipe: ${fmtMs(systemdRun)}`,
        ratio: `${(sbxRun / systemdRun).toFixed(2)}x`,
        target: '',
        met: null,
      },
      {
        metric: 'launch -> receipt: client library, one connection',
        value: fmtMs(lib),
        baseline: `systemd-run --wait --pipe: ${fmtMs(systemdRun)}`,
        ratio: `${(lib / systemdRun).toFixed(2)}x`,
        target: '',
        met: null,
      },
      {
        metric: `line flood: seq 1 ${lines}`,
        value: `${ours[0]} lines kept, receipt in ${fmtMs(ours[1]!)}`,
        baseline: `journald: ${journald[0]} lines kept, readable after ${fmtMs(journald[1]!)}`,
        ratio: `${(ours[0]! / Math.max(1, journald[0]!)).toFixed(1)}x lines`,
        target: '',
        met: null,
      },
      {
        metric: 'one 4 MiB line',
        value: `${oursLine[0]} record(s), longest ${oursLine[1]} bytes`,
        baseline: `journald: ${records[0]} records, longest ${records[1]} bytes`,
        ratio: '',
        target: '',
        met: null,
      },
    ];
    printTable(`peer (systemd 252 in nspawn, ${n} launches each, timed inside)`, rows);
    writeJson('peer', {
      launches: n,
      systemd_run_ms: systemdRun,
      sbx_run_ms: sbxRun,
      client_ms: lib,
      flood: { lines, journald_kept: journald[0], journald_ms: journald[1], supervisor_kept: ours[0], supervisor_ms: ours[1] },
      long_line: { bytes: LINE, journald_records: records[0], journald_longest: records[1], supervisor_records: oursLine[0], supervisor_longest: oursLine[1] },
    });
    return rows;
  } finally {
    await c.cleanUp();
  }
}
