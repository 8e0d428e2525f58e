// The built-in probes, in the field-case format (docs/reference/field-cases.md) so every target
// runs them the same way. Expected bytes and digests are computed here from the bytes the
// command is meant to write (Buffer/JS generators), never taken from a run.
//
// Facts beyond the case format, used only here:
// - kill_client_after_output: SIGKILL the client (sbx; for the naive targets, the runner that
//   owns the process) after the first output, then judge what was recorded;
// - kill_supervisor_after_output: SIGKILL the supervisor after the first output, restart it;
// - outcome: the receipt's outcome; executions: lines appended to "$SBX_PROBE_COUNTER";
// - allow_incomplete: a stream may be marked incomplete (its owner died mid-run).
// `fast` marks the probes CI runs against the supervisor (test/e2e/probes.test.ts).
import { createHash } from 'node:crypto';
import type { FieldCase } from './field-cases.js';

export interface Probe extends FieldCase {
  title: string;
  fast: boolean;
}

const sha256 = (b: Uint8Array | string) => createHash('sha256').update(b).digest('hex');
const EMPTY = sha256('');

/** stdout facts of exactly these bytes; stderr empty unless given. */
function bytes(stdout: Buffer | string, stderr: Buffer | string = ''): Record<string, unknown> {
  const out = Buffer.from(stdout);
  const err = Buffer.from(stderr);
  return { stdout_bytes: out.length, stdout_sha256: sha256(out), stderr_bytes: err.length, stderr_sha256: err.length ? sha256(err) : EMPTY };
}

/** sha256 of n bytes of 'a' then "\n", hashed in 1 MiB pieces. */
function longLine(n: number): Record<string, unknown> {
  const h = createHash('sha256');
  const piece = Buffer.alloc(1 << 20, 'a');
  for (let left = n; left > 0; left -= piece.length) h.update(left >= piece.length ? piece : piece.subarray(0, left));
  h.update('\n');
  return { stdout_bytes: n + 1, stdout_sha256: h.digest('hex'), stderr_bytes: 0, stderr_sha256: EMPTY, stdout_newlines: 1 };
}

const exited = (code: number) => ({ exit_code: code, signal: null, timed_out: false, descendants_dead: true });
const killedAtDeadline = (signal: number) => ({ exit_code: null, signal, timed_out: true, descendants_dead: true });
const lines40 = Array.from({ length: 40 }, (_, i) => `line-${i + 1}\n`).join('');
const binary = Buffer.concat([Buffer.from([0xff, 0xfe, 0x00, 0x80, 0xc0, 0xc1, 0x0a]), Buffer.alloc(4096), Buffer.from('tail-without-newline')]);

export const PROBES: Probe[] = [
  {
    id: 'long-line-4mib',
    title: 'one 4 MiB line',
    kind: 'a',
    fast: true,
    command: "head -c 4194304 /dev/zero | tr '\\0' a; echo",
    stdin: null,
    timeout_ms: 30_000,
    expect: { ...longLine(4 << 20), ...exited(0), max_wall_ms: 5000, max_supervisor_rss_growth_mb: 32 },
  },
  {
    id: 'long-line-256mib',
    title: 'one 256 MiB line',
    kind: 'a',
    fast: false,
    command: "head -c 268435456 /dev/zero | tr '\\0' a; echo",
    stdin: null,
    timeout_ms: 120_000,
    // RSS is measured after the line was also read back over the socket (1 MiB frames not yet
    // collected count); a supervisor that buffered the line would grow by 256 MB or more.
    expect: { ...longLine(256 << 20), ...exited(0), max_wall_ms: 30_000, max_supervisor_rss_growth_mb: 64 },
  },
  {
    id: 'double-fork-daemon',
    title: 'double-fork daemon (stdio closed)',
    kind: 'c',
    fast: true,
    command: "sh -c 'sleep 8 </dev/null >/dev/null 2>&1 &'; echo parent-done",
    stdin: null,
    timeout_ms: 10_000,
    expect: { ...bytes('parent-done\n'), ...exited(0), max_wall_ms: 2000 },
  },
  {
    id: 'setsid-escapee',
    title: 'setsid escapee holding stdout, 1 s deadline',
    kind: 'c',
    fast: true,
    command: 'echo spawned; setsid sleep 8 & wait',
    stdin: null,
    timeout_ms: 1000,
    expect: { ...bytes('spawned\n'), ...killedAtDeadline(15), min_wall_ms: 900, max_wall_ms: 1600 },
  },
  {
    id: 'nohup-background',
    title: '`nohup ... &` background',
    kind: 'c',
    fast: true,
    command: 'nohup sleep 8 >/dev/null 2>&1 & echo launched',
    stdin: null,
    timeout_ms: 10_000,
    expect: { ...bytes('launched\n'), ...exited(0), max_wall_ms: 2000 },
  },
  {
    id: 'grandchild-holds-stdout',
    title: 'grandchild holds stdout after the leader exits',
    kind: 'b',
    fast: true,
    command: 'sleep 8 & echo leader-done',
    stdin: null,
    timeout_ms: 20_000,
    expect: { ...bytes('leader-done\n'), ...exited(0), max_wall_ms: 2000 },
  },
  {
    id: 'silent-past-deadline',
    title: 'silent command past its 1 s deadline',
    kind: 'e',
    fast: true,
    command: 'echo start; sleep 8',
    stdin: null,
    timeout_ms: 1000,
    expect: { ...bytes('start\n'), ...killedAtDeadline(15), min_wall_ms: 900, max_wall_ms: 1600 },
  },
  {
    id: 'flood-past-deadline',
    title: 'output flood (a shell loop piped to cat) past its 1 s deadline',
    kind: 'e',
    fast: true,
    // A shell loop (tens of MB/s) rather than yes(1) (GB/s): the wall bound is about the
    // deadline, not about storing and hashing a gigabyte after it.
    command: 'while :; do echo flood-past-deadline; done | cat',
    stdin: null,
    timeout_ms: 1000,
    expect: { stderr_bytes: 0, ...killedAtDeadline(15), min_wall_ms: 900, max_wall_ms: 1600 },
  },
  {
    id: 'sigterm-ignored',
    title: 'SIGTERM ignored, ticking, 1 s deadline + 1 s grace',
    kind: 'k',
    fast: true,
    command: "trap '' TERM; while :; do echo tick; sleep 0.2; done",
    stdin: null,
    timeout_ms: 1000,
    expect: { stderr_bytes: 0, ...killedAtDeadline(9), min_wall_ms: 900, max_wall_ms: 2500 },
  },
  {
    id: 'orphans-100',
    title: '100 orphans (zombies)',
    kind: 'd',
    fast: true,
    command:
      'i=0; while [ $i -lt 100 ]; do sh -c \'sleep 0.05 &\'; i=$((i+1)); done; echo "orphans=$i"; sleep 1; me=$(cut -d\' \' -f6 /proc/self/stat); cat /proc/[0-9]*/stat 2>/dev/null | awk -v me="$me" \'$3=="Z" && $6==me {n++} END {print "zombies=" n+0}\'',
    stdin: null,
    timeout_ms: 10_000,
    expect: { ...bytes('orphans=100\nzombies=0\n'), ...exited(0), max_wall_ms: 4000, zombies_after: 0 },
  },
  {
    id: 'binary-invalid-utf8',
    title: 'binary and invalid UTF-8 output',
    kind: 'i',
    fast: true,
    command: "printf '\\377\\376\\000\\200\\300\\301\\n'; head -c 4096 /dev/zero; printf tail-without-newline",
    stdin: null,
    timeout_ms: 10_000,
    expect: { ...bytes(binary), ...exited(0), max_wall_ms: 2000 },
  },
  {
    id: 'dev-stdout-reopen',
    title: '`/dev/stdout` and `/dev/stderr` reopened',
    kind: 'i',
    fast: true,
    command: 'echo via-dev-stdout > /dev/stdout; echo via-dev-stderr > /dev/stderr; echo via-fd-1',
    stdin: null,
    timeout_ms: 10_000,
    expect: { ...bytes('via-dev-stdout\nvia-fd-1\n', 'via-dev-stderr\n'), ...exited(0), max_wall_ms: 2000 },
  },
  {
    id: 'cat-no-stdin',
    title: '`cat` with no stdin given',
    kind: 'l',
    fast: true,
    command: 'cat; echo cat-returned',
    stdin: null,
    timeout_ms: 10_000,
    expect: { ...bytes('cat-returned\n'), ...exited(0), max_wall_ms: 1000 },
  },
  {
    id: 'client-sigkill',
    title: 'client SIGKILLed mid-run',
    kind: 'h',
    fast: true,
    command: 'echo begin; sleep 1; echo end',
    stdin: null,
    timeout_ms: 10_000,
    expect: { ...bytes('begin\nend\n'), ...exited(0), max_wall_ms: 2000, kill_client_after_output: true },
  },
  {
    id: 'supervisor-sigkill-restart',
    title: 'supervisor SIGKILLed mid-run, then restarted',
    kind: 'h',
    fast: true,
    command: 'echo run >> "$SBX_PROBE_COUNTER"; echo begin; sleep 30',
    stdin: null,
    timeout_ms: 60_000,
    expect: {
      ...bytes('begin\n'),
      descendants_dead: true,
      outcome: 'owner_lost',
      executions: 1,
      allow_incomplete: true,
      max_wall_ms: 10_000,
      kill_supervisor_after_output: true,
    },
  },
  {
    id: 'reader-resume',
    title: 'reader disconnects at byte 50, resumes from cursor 50',
    kind: 'g',
    fast: true,
    command: 'i=1; while [ $i -le 40 ]; do echo "line-$i"; i=$((i+1)); sleep 0.02; done',
    stdin: null,
    timeout_ms: 10_000,
    expect: {
      ...bytes(lines40),
      ...exited(0),
      max_wall_ms: 4000,
      reader_disconnect_at_byte: 50,
      reader_pause_ms: 300,
      reader_resume_cursor: 50,
      reader_concat_sha256: sha256(lines40),
    },
  },
  {
    id: 'retried-launch',
    title: 'launch retried with the same key (first answer dropped)',
    kind: 'h',
    fast: true,
    command: 'echo run >> "$SBX_PROBE_COUNTER"; echo executed',
    stdin: null,
    timeout_ms: 10_000,
    expect: { ...bytes('executed\n'), ...exited(0), max_wall_ms: 2000, submissions: 2, executions: 1 },
  },
];
