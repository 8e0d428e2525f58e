// Interactive sessions: a pty as the leader's controlling terminal, stdin streamed exactly
// once, resize, and no byte lost at exit (the supervisor holds the slave until death and
// reads the master to EIO).
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { closeSync, readFileSync, writeFileSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { constants as osConstants } from 'node:os';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Receipt } from '../../ipc/protocol.js';
import { isSupervisorError } from '../../ipc/errors.js';
import { native } from '../../core/fs/native.js';
import { parentPid, pidsWithMarker, SBX, SBX_BIN, sha256, TestDaemon, until } from '../helpers/daemon.js';

let daemon: TestDaemon;
beforeAll(async () => {
  daemon = await new TestDaemon().start();
});
afterAll(async () => {
  expect(await daemon.stop()).toEqual({ code: 0, signal: null });
});

/** Runs a python3 program (the pty drivers: pty.fork) with args, against the daemon's socket; resolves with its stdout once it exits. */
async function python3(program: string, args: string[]): Promise<string> {
  const child = spawn('/usr/bin/python3', ['-c', program, ...args], {
    env: { ...process.env, SBX_SOCKET: daemon.socketPath },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  let out = '';
  child.stdout.on('data', (b: Buffer) => (out += b.toString()));
  await new Promise((r) => child.on('exit', r));
  return out;
}

/**
 * What the pty drivers share (python3): the imports; read_until(fd, what): reads the master
 * until what has come, 20 s at most, and says whether it did; status(st): a waitpid status as
 * a shell says it ("129", "signal 6").
 */
const PTY_DRIVER = [
  'import fcntl, os, pty, select, signal, struct, sys, termios, time',
  'def read_until(fd, what):',
  "    seen, deadline = b'', time.time() + 20",
  '    while what not in seen and time.time() < deadline:',
  '        if select.select([fd], [], [], 0.5)[0]:',
  '            seen += os.read(fd, 4096)',
  '    return what in seen',
  'def status(st):',
  '    return str(os.WEXITSTATUS(st)) if os.WIFEXITED(st) else "signal %d" % os.WTERMSIG(st)',
];

describe('pty', () => {
  it('is the controlling terminal, with the requested size and TERM', async () => {
    const r = await daemon.sbx(['run', '--pty', '--cols', '101', '--rows', '33', '--', 'sh', '-c', 'tty; stty size; echo $TERM; ps -o tty= -p $$']);
    expect(r.status).toBe(0);
    const lines = r.stdout.toString().split('\r\n');
    expect(lines[0]).toMatch(/^\/dev\/pts\/\d+$/);
    expect(lines[1]).toBe('33 101');
    expect(lines[2]).toBe('xterm-256color');
    expect(lines[3].trim()).toBe(lines[0].slice('/dev/'.length)); // its controlling tty
  });

  it('30 runs of 400000 bytes then exit 3: every byte, every time', async () => {
    const client = await daemon.client();
    const expected = sha256(Buffer.from('\0'.repeat(300000)).toString('base64'));
    for (let i = 0; i < 30; i++) {
      const { session_id } = await client.launch({ argv: ['sh', '-c', 'head -c 300000 /dev/zero | base64 -w0; exit 3'], cwd: '/', pty: {} });
      const receipt = await client.wait({ session_id });
      expect(receipt.exit.code).toBe(3);
      expect(receipt.output.pty).toMatchObject({ final_cursor: 400000, sha256: expected, complete: true, drain_end: 'eio' });
      expect(sha256(await client.read({ session_id }, 'pty'))).toBe(expected);
    }
    const viaSbx = await daemon.sbx(['run', '--pty', '--', 'sh', '-c', 'head -c 300000 /dev/zero | base64 -w0; exit 3']);
    expect(viaSbx.status).toBe(3);
    expect(viaSbx.stdout.length).toBe(400000);
  });

  it('30 runs of a fast printf: all identical, nothing lost at exit', async () => {
    const client = await daemon.client();
    const seen = new Set<string>();
    for (let i = 0; i < 30; i++) {
      const { session_id } = await client.launch({ argv: ['printf', 'fast-output'], cwd: '/', pty: {} });
      await client.wait({ session_id });
      seen.add((await client.read({ session_id }, 'pty')).toString());
    }
    expect([...seen]).toEqual(['fast-output']);
  });

  it('ends at its deadline with no process left and a complete receipt', async () => {
    const m = `8${randomBytes(2).readUInt16BE(0) % 100}.${randomBytes(3).readUIntBE(0, 3)}`;
    const client = await daemon.client();
    const { session_id } = await client.launch({ argv: ['sh', '-c', `echo start; sleep ${m}`], cwd: '/', pty: {}, timeout_ms: 500, grace_ms: 500 });
    const receipt = await client.wait({ session_id });
    expect(receipt.outcome).toBe('timed_out');
    expect(receipt.output.pty).toMatchObject({ final_cursor: 7, sha256: sha256('start\r\n'), complete: true });
    expect(pidsWithMarker(m)).toEqual([]);
  });

  it("a shim (the pty's session leader) the command stops is continued: its exit is reported, its deadline ends it", async () => {
    // Before, the stopped shim never reported the leader's exit: sbx run waited forever.
    const r = await daemon.sbx(['run', '--pty', '--', 'sh', '-c', 'kill -STOP $PPID; echo hi']);
    expect({ status: r.status, stdout: r.stdout.toString() }).toEqual({ status: 0, stdout: 'hi\r\n' });
    const m = `8${randomBytes(2).readUInt16BE(0) % 100}.${randomBytes(3).readUIntBE(0, 3)}`;
    const client = await daemon.client();
    try {
      const { session_id } = await client.launch({
        argv: ['sh', '-c', `kill -STOP 0; sleep ${m}; exit 0`],
        cwd: '/',
        pty: {},
        timeout_ms: 300,
        grace_ms: 20_000,
      });
      const receipt = await client.wait({ session_id });
      expect(receipt.outcome).toBe('timed_out');
      expect(receipt.termination.steps.map((s) => [s.signal, s.pids])).toEqual([['SIGTERM', 1]]);
      expect(receipt.death.evidence).toBe('cgroup_empty');
      expect(pidsWithMarker(m)).toEqual([]);
    } finally {
      client.close();
    }
  });

  it('resizes, by id and by --key: the foreground process sees SIGWINCH and the new size', async () => {
    const key = `resize-${randomBytes(4).toString('hex')}`;
    const detached = await daemon.sbx([
      'run',
      '--detach',
      '--key',
      key,
      '--pty',
      '--cols',
      '80',
      '--rows',
      '24',
      '--timeout',
      '20s',
      '--',
      'sh',
      '-c',
      'trap "stty size" WINCH; echo ready; while :; do sleep 0.05; done',
    ]);
    const id = detached.stdout.toString().trim();
    await until(async () => (await daemon.sbx(['logs', id])).stdout.toString().includes('ready'), 'the session to be ready');
    // A retry of the key from a terminal of another size is the same command (the digest has
    // whether there is a pty, not its size): the existing session, its size unchanged.
    const retry = await daemon.sbx([
      'run',
      '--detach',
      '--key',
      key,
      '--pty',
      '--cols',
      '132',
      '--rows',
      '50',
      '--timeout',
      '20s',
      '--',
      'sh',
      '-c',
      'trap "stty size" WINCH; echo ready; while :; do sleep 0.05; done',
    ]);
    expect([retry.status, retry.stdout.toString().trim()]).toEqual([0, id]);
    expect((await daemon.sbx(['resize', id, '120', '40'])).status).toBe(0);
    await until(async () => (await daemon.sbx(['logs', id])).stdout.toString().includes('40 120'), 'the new size to be printed');
    expect((await daemon.sbx(['logs', id])).stdout.toString()).toBe('ready\r\n40 120\r\n'); // the retry's 132x50 never applied
    const byKey = await daemon.sbx(['resize', '--key', key, '100', '30', '--json']);
    expect(byKey.status, byKey.stderr.toString()).toBe(0);
    expect(JSON.parse(byKey.stdout.toString())).toEqual({ session_id: id, cols: 100, rows: 30 });
    await until(async () => (await daemon.sbx(['logs', id])).stdout.toString().includes('30 100'), 'the size set by --key to be printed');
    // An ID and --key, a size short of two numbers or a number too many: refused before any request.
    const usage = ': sbx resize ID COLS ROWS, or sbx resize --key K COLS ROWS\n';
    for (const [args, said] of [
      [['resize', id, '--key', key, '90', '20'], 'give a session ID or --key, not both\n'],
      [['resize', '--key', key, '90'], `INVALID_ARGUMENT: give COLS and ROWS${usage}`],
      [['resize', '--key', key, '90', '20', '30'], `INVALID_ARGUMENT: too many arguments${usage}`],
      [['resize', id, '90'], `INVALID_ARGUMENT: give COLS and ROWS${usage}`],
    ] as const) {
      const r = await daemon.sbx([...args]);
      expect([r.status, r.stderr.toString()], args.join(' ')).toEqual([125, `sbx: ${said}`]);
    }
    // A size without --pty is refused, not dropped.
    const sizeOnly = await daemon.sbx(['run', '--cols', '100', '--', 'true']);
    expect([sizeOnly.status, sizeOnly.stderr.toString()]).toEqual([125, 'sbx: INVALID_ARGUMENT: --cols and --rows are the size of a pty: add --pty (-t)\n']);
    await daemon.sbx(['cancel', id, '--grace', '0']);
    expect((JSON.parse((await daemon.sbx(['wait', id])).stdout.toString()) as Receipt).outcome).toBe('cancelled');
  });
  it('sbx attach from a terminal gives a pty session its size, then sends each SIGWINCH on as a resize (as docker attach -t)', async () => {
    const detached = await daemon.sbx([
      'run',
      '--detach',
      '--pty',
      '--cols',
      '80',
      '--rows',
      '24',
      '--timeout',
      '30s',
      '--',
      'sh',
      '-c',
      'trap "stty size" WINCH; echo ready; while :; do sleep 0.05; done',
    ]);
    const id = detached.stdout.toString().trim();
    await until(async () => (await daemon.sbx(['logs', id])).stdout.toString().includes('ready'), 'the session to be ready');
    // attach on a 111x33 terminal (python3's pty.fork); once the session has said so, the
    // terminal becomes 122x44 (TIOCSWINSZ on the master: the kernel sends attach SIGWINCH).
    const driver = [
      ...PTY_DRIVER,
      'pid, fd = pty.fork()',
      'if pid == 0:',
      "    fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack('HHHH', 33, 111, 0, 0))",
      "    os.execv(sys.argv[1], [sys.argv[1], 'attach', sys.argv[2], '--no-stdin'])",
      "first = read_until(fd, b'33 111')",
      "fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack('HHHH', 44, 122, 0, 0))",
      "second = read_until(fd, b'44 122')",
      'os.kill(pid, signal.SIGINT)',
      'print(first, second, status(os.waitpid(pid, 0)[1]))',
    ].join('\n');
    const out = await python3(driver, [SBX_BIN, id]);
    expect(out).toBe('True True 130\n'); // both sizes reached the session; Ctrl-C detached
    expect((await daemon.sbx(['logs', id])).stdout.toString()).toMatch(/33 111\r\n(.|\n)*44 122\r\n/);
    await daemon.sbx(['cancel', id, '--grace', '0']);
    expect((JSON.parse((await daemon.sbx(['wait', id])).stdout.toString()) as Receipt).outcome).toBe('cancelled');
  });

  it('sbx attach, sent SIGHUP or SIGTERM on a live terminal, detaches (129, 143) and puts its raw mode back; the session goes on', async () => {
    const detached = await daemon.sbx(['run', '--detach', '--pty', '--stdin', '--timeout', '30s', '--', 'sh', '-c', 'echo ready; sleep 25']);
    const id = detached.stdout.toString().trim();
    // python3 runs attach on a terminal, waits for the replayed line, signals sbx, then reads
    // the terminal's modes through its master (TCGETS there answers the slave's).
    const driver = [
      ...PTY_DRIVER,
      'pid, fd = pty.fork()',
      'if pid == 0:',
      "    os.execv(sys.argv[1], [sys.argv[1], 'attach', sys.argv[2], '--from-start'])",
      "read_until(fd, b'ready')",
      'os.kill(pid, getattr(signal, sys.argv[3]))',
      'st = os.waitpid(pid, 0)[1]',
      'iflag, oflag, cflag, lflag = termios.tcgetattr(fd)[:4]',
      'cooked = bool(lflag & termios.ICANON) and bool(lflag & termios.ECHO) and bool(oflag & termios.OPOST)',
      'print(status(st), "cooked" if cooked else "raw")',
    ].join('\n');
    expect(await python3(driver, [SBX_BIN, id, 'SIGHUP'])).toBe('129 cooked\n');
    expect(await python3(driver, [SBX_BIN, id, 'SIGTERM'])).toBe('143 cooked\n');
    const row = (await (await daemon.client()).ps(false)).sessions.find((s) => s.session_id === id);
    expect(row?.state).toBe('running');
    await daemon.sbx(['cancel', id, '--grace', '0']);
    expect((JSON.parse((await daemon.sbx(['wait', id])).stdout.toString()) as Receipt).outcome).toBe('cancelled');
  });

  it('sbx attach to a pty session whose stdin is closed only watches: the terminal stays cooked, so Ctrl-C detaches', async () => {
    const detached = await daemon.sbx(['run', '--detach', '--pty', '--stdin', '--timeout', '30s', '--', 'sh', '-c', 'echo ready; sleep 25']);
    const id = detached.stdout.toString().trim();
    expect((await daemon.sbx(['write', id, '--eof'], { input: '' })).status).toBe(0);
    // An empty write (no eof) on the closed stdin is told so: attach's probe, sbx write with nothing to send.
    const probe = await daemon.sbx(['write', id], { input: '' });
    expect([probe.status, probe.stderr.toString()]).toEqual([125, `sbx: INVALID_ARGUMENT: stdin of session ${id} is closed\n`]);
    const driver = [
      ...PTY_DRIVER,
      'pid, fd = pty.fork()',
      'if pid == 0:',
      "    os.execv(sys.argv[1], [sys.argv[1], 'attach', sys.argv[2], '--from-start'])",
      "read_until(fd, b'ready')",
      'lflag = termios.tcgetattr(fd)[3]',
      "os.write(fd, b'\\x03')",
      'print("cooked" if lflag & termios.ICANON and lflag & termios.ISIG else "raw", status(os.waitpid(pid, 0)[1]))',
    ].join('\n');
    expect(await python3(driver, [SBX_BIN, id])).toBe('cooked 130\n');
    await daemon.sbx(['cancel', id, '--grace', '0']);
    expect((JSON.parse((await daemon.sbx(['wait', id])).stdout.toString()) as Receipt).outcome).toBe('cancelled');
  });

  it('sbx wait and sbx logs -f on a terminal that is hung up, then SIGTERM or SIGINT: they die of that signal, as on a live one (not SIGABRT)', async () => {
    // Node's own SIGINT/SIGTERM handler puts the terminal's modes back first, and aborted on the
    // hung-up terminal (EIO). The session leader (python3) survives the hangup; sbx, in its
    // session, gets no SIGHUP, only the signal sent afterwards.
    const client = await daemon.client();
    const { session_id } = await client.launch({ argv: ['sleep', '600'], cwd: '/' });
    const driver = [
      'import os, pty, signal, subprocess, sys, time',
      'sbx, sid, sig, verb = sys.argv[1], sys.argv[2], getattr(signal, sys.argv[3]), sys.argv[4]',
      'r, w = os.pipe()',
      'pid, fd = pty.fork()',
      'if pid == 0:',
      '    signal.signal(signal.SIGHUP, lambda *a: None)',
      "    p = subprocess.Popen([sbx, verb, sid] if verb == 'wait' else [sbx, 'logs', '-f', sid])",
      "    os.write(w, b'%d\\n' % p.pid)",
      "    os.write(w, b'%d\\n' % p.wait())",
      '    os._exit(0)',
      'child = int(os.read(r, 100))',
      // Node has started on a live terminal (it notes the modes to put back) once it is connected.
      'deadline = time.time() + 20',
      'def connected():',
      '    try:',
      "        return any('socket' in os.readlink('/proc/%d/fd/%s' % (child, f)) for f in os.listdir('/proc/%d/fd' % child))",
      '    except OSError:',
      '        return False',
      'while time.time() < deadline and not connected():',
      '    time.sleep(0.05)',
      'os.close(fd)  # the last master: the tty is hung up before close returns (pty_close, tty_vhangup)',
      'os.kill(child, sig)',
      'print(int(os.read(r, 100)))',
      'os.waitpid(pid, 0)',
    ].join('\n');
    try {
      for (const [signal, verb, status] of [
        ['SIGTERM', 'wait', -15],
        ['SIGINT', 'logs', -2],
      ] as const) {
        const out = await python3(driver, [SBX_BIN, session_id, signal, verb]);
        expect(out, `${verb} then ${signal}`).toBe(`${status}\n`);
      }
    } finally {
      await client.request('kill', { session_id, signal: 'SIGKILL' });
      await client.wait({ session_id });
    }
  });

  it('a command that hangs up its own tty (TIOCVHANGUP, vhangup(2)): the hangup flushed what was in flight, so the pty stream is never complete (pty_hangup)', async () => {
    const client = await daemon.client();
    // 20,000 bytes written, then the hangup; what the master had not read yet is gone, and the
    // master still ends in EIO, so only the supervisor's own slave fd (EIO now) can tell.
    const script = "import fcntl, os; os.write(1, b'A' * 20000); fcntl.ioctl(1, 0x5437)"; // TIOCVHANGUP
    const { session_id } = await client.launch({ argv: ['/usr/bin/python3', '-c', script], cwd: '/', pty: { cols: 80, rows: 24 } });
    const receipt = await client.wait({ session_id });
    expect(receipt.exit.code).toBe(0);
    expect(receipt.output.pty).toMatchObject({ complete: false, reason: 'pty_hangup' });
    // What was stored is what the digest says, and no more than was written.
    const stored = await client.read({ session_id }, 'pty');
    expect([stored.length <= 20000, sha256(stored)]).toEqual([true, receipt.output.pty!.sha256]);
    // A session that is not hung up stays complete.
    const plain = await client.launch({ argv: ['/usr/bin/python3', '-c', "import os; os.write(1, b'A' * 20000)"], cwd: '/', pty: { cols: 80, rows: 24 } });
    expect((await client.wait({ session_id: plain.session_id })).output.pty).toMatchObject({
      final_cursor: 20000,
      complete: true,
      reason: null,
      drain_end: 'eio',
    });
  });

  it("sbx run -it turns the terminal's output processing off while it runs, as cfmakeraw(3) does (no \\r\\r\\n), and puts it back", async () => {
    // A shell on python3's terminal prints the opost flag, runs sbx run -it (a command that
    // leaves a process behind), prints it again.
    // The session's pty turns \n into \r\n already; with the outer terminal's ONLCR still on
    // (libuv's raw mode) the screen, and any recording of it, got \r\r\n.
    const driver = [
      'import os, pty, sys',
      'pid, fd = pty.fork()',
      'if pid == 0:',
      '    flag = \'stty -a | grep -ow -- "-\\{0,1\\}opost"\'',
      "    os.execv('/bin/sh', ['sh', '-c', flag + '; \"$0\" run -it -- sh -c \"$1\"; echo \"exit $?\"; ' + flag, sys.argv[1], sys.argv[2]])",
      "out = b''",
      'while True:',
      '    try:',
      '        b = os.read(fd, 4096)',
      '    except OSError:',
      '        break',
      '    if not b:',
      '        break',
      '    out += b',
      'os.waitpid(pid, 0)',
      'sys.stdout.write(out.decode())',
    ].join('\n');
    // sbx's own line (its leftover, killed: a pty's linger default) ends in \r\n too while raw.
    expect(await python3(driver, [SBX_BIN, 'sleep 97 & printf "a\\nb\\n"'])).toBe(
      'opost\r\na\r\nb\r\nsbx: 1 leftover process was ended (linger kill)\r\nexit 0\r\nopost\r\n',
    );
  });

  it('sbx run -it whose terminal is hung up (its window closed) sends SIGHUP on and exits 129: never a crash on the gone terminal', async () => {
    // python3 gives sbx a terminal (pty.fork), waits for the command's line, closes the master:
    // the kernel hangs the tty up and sends sbx SIGHUP. sbx died of SIGABRT or SIGSEGV here, in
    // Node's own exit (its tcsetattr on the hung-up terminal failed: EIO).
    const key = `hup-${randomBytes(4).toString('hex')}`;
    const driver = [
      ...PTY_DRIVER,
      'pid, fd = pty.fork()',
      'if pid == 0:',
      "    os.execv(sys.argv[1], [sys.argv[1], 'run', '-it', '--key', sys.argv[2], '--', 'sh', '-c', 'echo up; exec sleep 60'])",
      "read_until(fd, b'up')",
      'os.close(fd)',
      'print(status(os.waitpid(pid, 0)[1]))',
    ].join('\n');
    const out = await python3(driver, [SBX_BIN, key]);
    expect(out).toBe('129\n');
    const receipt = JSON.parse((await daemon.sbx(['wait', '--key', key])).stdout.toString()) as Receipt;
    expect(receipt.exit).toMatchObject({ code: null, signal: 'SIGHUP' });
  });

  /**
   * A driver (python3) that gives sbx a terminal of its own (openpty; the slave is the controlling
   * tty of the driver's session, sbx its foreground process group), keeps the slave to read its modes: modes() says "raw" (ICANON, ECHO and OPOST off) or
   * "cooked" (all three on, as openpty made it) or what it is; wait_modes(m) polls for m, 10 s;
   * start_sbx(argv) runs sbx on it.
   */
  const TTY_DRIVER = [
    ...PTY_DRIVER,
    'master, slave = os.openpty()',
    'def modes():',
    '    a = termios.tcgetattr(slave)',
    '    on = (bool(a[3] & termios.ICANON), bool(a[3] & termios.ECHO), bool(a[1] & termios.OPOST))',
    '    return {(False, False, False): "raw", (True, True, True): "cooked"}.get(on, repr(on))',
    'def wait_modes(m):',
    '    deadline = time.time() + 10',
    '    while modes() != m and time.time() < deadline:',
    '        time.sleep(0.02)',
    '    return modes()',
    // A driver that hangs (a regression) kills its sbx and exits after 40 s: nothing is left behind.
    'children = []',
    'def give_up(*_):',
    '    for p in children:',
    '        os.kill(p, signal.SIGKILL)',
    '    os._exit(3)',
    'signal.signal(signal.SIGALRM, give_up)',
    'signal.alarm(40)',
    // As a shell with job control: the driver leads the terminal's session; sbx runs in a
    // process group of its own, the foreground one (not orphaned: a stop by SIGTSTP holds).
    'os.setsid()',
    'fcntl.ioctl(slave, termios.TIOCSCTTY, 0)',
    'def start_sbx(argv):',
    '    pid = os.fork()',
    '    if pid == 0:',
    '        os.setpgid(0, 0)',
    '        signal.signal(signal.SIGTTOU, signal.SIG_IGN)',
    '        os.tcsetpgrp(slave, os.getpid())',
    '        signal.signal(signal.SIGTTOU, signal.SIG_DFL)',
    '        for f in (0, 1, 2):',
    '            os.dup2(slave, f)',
    '        os.execv(argv[0], argv)',
    '    children.append(pid)',
    '    return pid',
  ];

  it('sbx run -it ended by a signal it does not handle (SIGUSR2, SIGALRM, SIGIO) gives the terminal its modes back, then dies of that signal', async () => {
    // (Not the ones whose default action dumps core, SIGABRT say: the same path, no core files left.)
    for (const signal of ['SIGUSR2', 'SIGALRM', 'SIGIO'] as const) {
      const key = `ending-${signal}-${randomBytes(4).toString('hex')}`;
      const driver = [
        ...TTY_DRIVER,
        "pid = start_sbx([sys.argv[1], 'run', '-it', '--key', sys.argv[2], '--', 'sh', '-c', 'echo up; exec sleep 60'])",
        "up = read_until(master, b'up')",
        "raw = wait_modes('raw')",
        `os.kill(pid, signal.${signal})`,
        'print(up, raw, status(os.waitpid(pid, 0)[1]), modes())',
      ].join('\n');
      // Before: sbx died of it and left the terminal raw (the shell then echoed nothing).
      expect(await python3(driver, [SBX_BIN, key])).toBe(`True raw signal ${osConstants.signals[signal]} cooked\n`);
      // The session was not sbx's to end: it runs on until cancelled.
      expect((await daemon.sbx(['cancel', '--key', key])).status).toBe(0);
    }
  });

  it('sbx run -it stopped (SIGTSTP) gives the terminal back while stopped and takes it raw again when continued (fg), then reads on', async () => {
    const driver = [
      ...TTY_DRIVER,
      "pid = start_sbx([sys.argv[1], 'run', '-it', '--', 'sh', '-c', 'echo up; read l; echo \"got $l\"'])",
      "up = read_until(master, b'up')",
      "before = wait_modes('raw')",
      'os.kill(pid, signal.SIGTSTP)',
      'st = os.waitpid(pid, os.WUNTRACED)[1]',
      'stopped = os.WIFSTOPPED(st) and os.WSTOPSIG(st) == signal.SIGTSTP',
      'while_stopped = modes()',
      'os.kill(pid, signal.SIGCONT)',
      "after = wait_modes('raw')",
      "os.write(master, b'hi\\r')",
      "got = read_until(master, b'got hi')",
      'print(up, before, stopped, while_stopped, after, got, status(os.waitpid(pid, 0)[1]), modes())',
    ].join('\n');
    // Before: stopped with the terminal raw, and after fg (bash does not give a job its modes back) cooked under a raw sbx.
    expect(await python3(driver, [SBX_BIN])).toBe('True raw True cooked raw True 0 cooked\n');
  });

  it("a shim (the pty's session leader) killed before it reports leaves the session unknown, not hung", async () => {
    const m = `9${randomBytes(3).readUIntBE(0, 3)}`;
    const client = await daemon.client();
    try {
      const { session_id } = await client.launch({ argv: ['sleep', m], cwd: '/', pty: { cols: 80, rows: 24 } });
      const [leader] = await until(() => {
        const pids = pidsWithMarker(m);
        return pids.length === 1 ? pids : null;
      }, 'the command to run');
      const shim = parentPid(leader);
      expect(readFileSync(`/proc/${shim}/cmdline`, 'utf8')).toContain('exec-shim');
      process.kill(shim, 'SIGKILL');
      const row = await until(
        async () => (await client.ps(true)).sessions.find((s) => s.session_id === session_id && s.state === 'unknown'),
        'the session to be unknown',
      );
      expect(row.reason).toBe("the exec shim (the session's subreaper) died before reporting all descendants reaped");
      expect((await client.receipt({ session_id })).receipt).toBeNull();
      // Its tty hung up with the shim: the stream ends (the supervisor lets its slave go), so an
      // attached sbx run says unknown (125) instead of following it for good.
      const run = await daemon.sbx(['run', '--pty', '--', 'sh', '-c', 'kill -9 $PPID; sleep 1; echo x']);
      expect(run.status).toBe(125);
      expect(run.stderr.toString()).toMatch(
        /^sbx: session s-\S+ is unknown: the exec shim \(the session's subreaper\) died before reporting all descendants reaped; /,
      );
      // A wait with unknown "fail" answers SESSION_UNKNOWN at once; the library's run() too,
      // once the session turns unknown, rather than waiting for a receipt that never comes.
      const reason = "the exec shim (the session's subreaper) died before reporting all descendants reaped";
      const failed = await client.wait({ session_id }, { unknown: 'fail' }).catch((e: unknown) => e);
      expect(isSupervisorError(failed) && [failed.code, failed.details]).toEqual(['SESSION_UNKNOWN', { session_id, reason }]);
      const ran = await client.run({ argv: ['sh', '-c', 'kill -9 $PPID; sleep 1; echo x'], cwd: '/', pty: { cols: 80, rows: 24 } }).catch((e: unknown) => e);
      expect(isSupervisorError(ran) && ran.code).toBe('SESSION_UNKNOWN');
      expect((ran as { details: { reason: string } }).details.reason).toBe(reason);
      expect((ran as Error).message).toMatch(/^session s-\S+ is unknown: the exec shim .* it is never run again \(sbx ps, sbx resolve\)$/);
    } finally {
      for (const pid of pidsWithMarker(m)) process.kill(pid, 'SIGKILL');
      await until(() => pidsWithMarker(m).length === 0, 'the command to be gone');
      client.close();
    }
  });
});

describe('stdin', () => {
  it('--stdin into a pty: read x; echo got-$x', async () => {
    const r = await daemon.sbx(['run', '--stdin', '--pty', '--', 'sh', '-c', 'read x; echo got-$x'], { input: 'hi\n' });
    expect(r.status).toBe(0);
    expect(r.stdout.toString()).toContain('got-hi\r\n');
  });

  it("ends a pty session's input after a partial line too (two ^D)", async () => {
    const r = await daemon.sbx(['run', '--pty', '--stdin', '--', 'sh', '-c', 'read x; echo "got=$x"'], { input: 'abc' });
    expect(r.status).toBe(0);
    expect(r.stdout.toString()).toContain('got=abc');
  });

  it('gives a --user session its terminal', async () => {
    const r = await daemon.sbx(['run', '--pty', '--user', 'nobody', '--cwd', '/', '--', 'sh', '-c', 'echo hi > $(tty) && echo reopened']);
    expect(r.status).toBe(0);
    expect(r.stdout.toString()).toContain('reopened');
  });

  it('1 MiB through --stdin into sha256sum (pipe mode) matches', async () => {
    const input = randomBytes(1024 * 1024);
    const r = await daemon.sbx(['run', '--stdin', '--', 'sha256sum'], { input });
    expect(r.stdout.toString()).toBe(`${createHash('sha256').update(input).digest('hex')}  -\n`);
  });

  it('without --stdin, cat returns at once with exit 0 and no output', async () => {
    const r = await daemon.sbx(['run', '--', 'cat']);
    expect(r.status).toBe(0);
    expect(r.stdout.length).toBe(0);
  });

  it('delivers bytes exactly once by offset: retries skip, gaps are refused', async () => {
    const client = await daemon.client();
    const { session_id } = await client.launch({ argv: ['cat'], cwd: '/', stdin: true });
    const write = (data: string, offset?: number, eof = false) => client.request('write', { session_id, data: Buffer.from(data), offset, eof });
    expect((await write('abc', 0)).cursor).toBe(3);
    expect((await write('abcdef', 0)).cursor).toBe(6); // a retry from 0: only "def" is new
    await expect(write('zz', 9)).rejects.toSatisfy((e: unknown) => isSupervisorError(e, 'INVALID_ARGUMENT'));
    expect((await write('gh', undefined, true)).cursor).toBe(8);
    expect((await write('', 8, true)).cursor).toBe(8); // a retried eof
    const receipt = await client.wait({ session_id });
    expect(receipt.output.stdout).toMatchObject({ final_cursor: 8, sha256: sha256('abcdefgh') });
  });

  it('sbx write with nothing to send still checks the session', async () => {
    const plain = await daemon.sbx(['run', '--detach', '--', 'true']);
    const r = await daemon.sbx(['write', plain.stdout.toString().trim()]);
    expect(r.status).toBe(125);
    expect(r.stderr.toString()).toContain('not started with --stdin');
    expect((await daemon.sbx(['write', 's-0-missing'])).status).toBe(125);
  });

  it('sbx write feeds a detached session', async () => {
    const detached = await daemon.sbx(['run', '--detach', '--stdin', '--', 'tr', 'a-z', 'A-Z']);
    const id = detached.stdout.toString().trim();
    const file = join(daemon.dir, 'in.txt');
    writeFileSync(file, 'hello\n');
    expect((await daemon.sbx(['write', id], { input: 'hello ' })).status).toBe(0);
    const last = await daemon.sbx(['write', id, '--eof', '--json'], { input: 'world\n' });
    expect([last.status, JSON.parse(last.stdout.toString())]).toEqual([0, { session_id: id, cursor: 12, eof: true }]);
    expect((await daemon.sbx(['wait', id])).status).toBe(0);
    expect((await daemon.sbx(['logs', id])).stdout.toString()).toBe('HELLO WORLD\n');
  });
});

describe('a terminal reattaching', () => {
  it("resumes stdin at the session's cursor: what is typed after a reattach is delivered once", async () => {
    const key = `tty-${randomBytes(4).toString('hex')}`;
    const fds: number[] = [];
    const sbxs: ReturnType<typeof spawn>[] = [];
    /** sbx run --pty --stdin with its stdin on a fresh pty's slave (a person's terminal); stdout a pipe. */
    const attach = () => {
      const pty = native().openPty(80, 24);
      fds.push(pty.master, pty.slave);
      const child = spawn(process.execPath, [SBX, 'run', '--pty', '--stdin', '--key', key, '--', 'cat'], {
        cwd: '/',
        env: { ...process.env, SBX_SOCKET: daemon.socketPath },
        stdio: [pty.slave, 'pipe', 'pipe'],
      });
      sbxs.push(child);
      let out = '';
      child.stdout!.on('data', (b: Buffer) => (out += b.toString()));
      child.stderr!.resume();
      const exited = new Promise<number | null>((r) => child.on('close', (code) => r(code)));
      return { master: pty.master, child, exited, stdout: () => out };
    };
    const logs = async () => (await daemon.sbx(['logs', '--key', key, '--stream', 'pty'])).stdout.toString();
    try {
      const first = attach();
      writeSync(first.master, 'one\n');
      await until(async () => (await logs()) === 'one\r\none\r\n', 'the first line to be echoed and cat');
      first.child.kill('SIGKILL');
      await first.exited;
      const second = attach();
      writeSync(second.master, 'two\n');
      await until(async () => (await logs()) === 'one\r\none\r\ntwo\r\ntwo\r\n', 'the line typed after the reattach to reach cat');
      writeSync(second.master, '\x04'); // ^D at the start of a line: cat reads EOF
      expect(await second.exited).toBe(0);
      expect(second.stdout()).toBe('one\r\none\r\ntwo\r\ntwo\r\n');
    } finally {
      for (const c of sbxs) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
      await daemon.sbx(['cancel', '--key', key, '--grace', '0']);
      for (const fd of fds) closeSync(fd);
    }
  });

  it('piped stdin (not a terminal) keeps the exactly-once rule from offset 0', async () => {
    const key = `piped-${randomBytes(4).toString('hex')}`;
    const detached = await daemon.sbx(['run', '--detach', '--stdin', '--key', key, '--', 'cat']);
    expect(detached.status).toBe(0);
    expect((await daemon.sbx(['write', '--key', key], { input: 'abc' })).status).toBe(0);
    // A retry replays its input from 0: "abc" counts as delivered, "def" is added, then EOF.
    const r = await daemon.sbx(['run', '--stdin', '--key', key, '--', 'cat'], { input: 'abcdef' });
    expect(r.status).toBe(0);
    expect(r.stdout.toString()).toBe('abcdef');
  });
});
