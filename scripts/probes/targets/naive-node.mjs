// naive-node: a command run the way agent runtimes commonly run one, kept naive on purpose so
// the probes (scripts/probes/run.ts) can show where this path fails. Not part of the product.
//
//   node naive-node.mjs '{"command": "...", "timeout_ms": 1000, "stdin": null | "<base64>"}'
//
// - child_process.spawn('/bin/sh', ['-c', command]) with the default stdio (three pipes);
//   stdin is written and closed only when the request has some, otherwise left open;
// - readline over stdout, each line counted as `line + "\n"` (what such runtimes hand on);
// - the timeout is checked when a line arrives, and then child.kill() (SIGTERM to the leader);
// - done when the stdout stream ends; then the leader's exit status.
// Prints one JSON object on stdout; writes "first-line" on stderr when the first line arrives.
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';

const request = JSON.parse(process.argv[2]);
const t0 = Date.now();
const child = spawn('/bin/sh', ['-c', request.command]);
if (request.stdin !== null) child.stdin.end(Buffer.from(request.stdin, 'base64'));

const stdoutHash = createHash('sha256');
const stderrHash = createHash('sha256');
let stdoutBytes = 0;
let stdoutNewlines = 0;
let stderrBytes = 0;
let timedOut = false;
let killsSent = 0;
child.stderr.on('data', (d) => {
  stderrHash.update(d);
  stderrBytes += d.length;
});

const lines = createInterface({ input: child.stdout, crlfDelay: Infinity });
lines.on('line', (line) => {
  if (stdoutNewlines === 0) process.stderr.write('first-line\n');
  const bytes = Buffer.from(`${line}\n`);
  stdoutHash.update(bytes);
  stdoutBytes += bytes.length;
  stdoutNewlines++;
  if (Date.now() - t0 > request.timeout_ms) {
    timedOut = true;
    killsSent++;
    child.kill();
  }
});
lines.on('close', async () => {
  const streamEndMs = Date.now() - t0;
  if (child.exitCode === null && child.signalCode === null) await new Promise((r) => child.once('exit', r));
  const signals = { SIGHUP: 1, SIGINT: 2, SIGKILL: 9, SIGPIPE: 13, SIGTERM: 15 };
  process.stdout.write(
    `${JSON.stringify({
      leader_pid: child.pid,
      stdout_bytes: stdoutBytes,
      stdout_sha256: stdoutHash.digest('hex'),
      stdout_newlines: stdoutNewlines,
      stderr_bytes: stderrBytes,
      stderr_sha256: stderrHash.digest('hex'),
      exit_code: child.exitCode,
      signal: child.signalCode ? (signals[child.signalCode] ?? child.signalCode) : null,
      timed_out: timedOut,
      kills_sent: killsSent,
      stream_end_ms: streamEndMs,
      wall_ms: Date.now() - t0,
      // VmHWM, not getrusage: ru_maxrss carries the parent's peak across fork and exec.
      peak_rss_kb: Number(/VmHWM:\s+(\d+)/.exec(readFileSync('/proc/self/status', 'utf8'))[1]),
    })}\n`,
  );
  process.exit(0);
});
