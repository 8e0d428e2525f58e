"""run(on_stdout=, on_stderr=) streams each stream's bytes to its callback, in order and exactly
(sha256 of what the callbacks got against the command's own), without keeping them (the
Result's field None), a raising callback cancelling the session (an OSError too, sync and
async, no reader left); run(inherit_env=) as launch; kill() defaults to SIGKILL as sbx kill.
Also the harness's peak RSS for 100 MB of stdout, buffered vs streamed, in child processes."""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import subprocess
import sys

import pytest

from daemon import Daemon, until
from sandbox_supervisor import AsyncClient, Client

PKG = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

# 4 MiB of each stream from seeded bytes (a sha256 counter stream), stdout and stderr
# written alternately in 64 KiB pieces: the digests are the command's own, printed last.
GEN = r"""
import hashlib, os, sys
out, err, ho, he = sys.stdout.buffer, sys.stderr.buffer, hashlib.sha256(), hashlib.sha256()
for i in range(64):
    for f, h, tag in ((out, ho, b"o"), (err, he, b"e")):
        piece = b"".join(hashlib.sha256(tag + b"%d.%d" % (i, j)).digest() for j in range(2048))
        f.write(piece); f.flush(); h.update(piece)
open(sys.argv[1], "w").write(ho.hexdigest() + " " + he.hexdigest())
"""


def key() -> str:
    return f"py-{secrets.token_hex(6)}"


def test_run_callbacks_get_every_byte_in_order(daemon: Daemon, tmp_path):
    digest_file = str(tmp_path / "digests")
    got = {"stdout": hashlib.sha256(), "stderr": hashlib.sha256()}
    counts = {"stdout": 0, "stderr": 0}

    def sink(stream):
        def take(data: bytes) -> None:
            assert isinstance(data, bytes) and data
            got[stream].update(data)
            counts[stream] += len(data)
        return take

    with Client(daemon.socket_path) as c:
        r = c.run([sys.executable, "-c", GEN, digest_file], key=key(), timeout_seconds=60, on_stdout=sink("stdout"), on_stderr=sink("stderr"))
    assert (r.exit_code, r.outcome, r.stdout, r.stderr) == (0, "exited", None, None)
    want_out, want_err = open(digest_file).read().split()
    assert (got["stdout"].hexdigest(), got["stderr"].hexdigest()) == (want_out, want_err)
    assert counts == {"stdout": 64 * 65536, "stderr": 64 * 65536}


def test_run_callback_on_one_stream_keeps_the_other(daemon: Daemon):
    pieces = []
    with Client(daemon.socket_path) as c:
        r = c.run(["sh", "-c", "printf out; printf err >&2"], key=key(), on_stderr=pieces.append)
    assert (r.stdout, r.stderr, b"".join(pieces)) == (b"out", None, b"err")


def test_async_run_callbacks(daemon: Daemon, tmp_path):
    digest_file = str(tmp_path / "digests")
    got = {"stdout": hashlib.sha256(), "stderr": hashlib.sha256()}

    async def main():
        async with AsyncClient(daemon.socket_path) as c:
            return await c.run([sys.executable, "-c", GEN, digest_file], key=key(), timeout_seconds=60, on_stdout=got["stdout"].update, on_stderr=got["stderr"].update)

    r = asyncio.run(main())
    assert (r.exit_code, r.stdout, r.stderr) == (0, None, None)
    assert (got["stdout"].hexdigest(), got["stderr"].hexdigest()) == tuple(open(digest_file).read().split())


def test_run_callback_raising_oserror_is_raised_and_cancels(daemon: Daemon):
    """An OSError from a callback (a full disk) is the callback's, not a dropped connection:
    raised as it was, the session cancelled, never a silent success with the bytes skipped."""
    k = key()
    with Client(daemon.socket_path) as c:
        def full(data: bytes) -> None:
            raise OSError(28, "No space left on device")
        try:
            c.run(["sh", "-c", "echo first; exec sleep 30"], key=k, on_stdout=full)
        except OSError as err:
            assert (err.errno, err.strerror) == (28, "No space left on device")
        else:
            raise AssertionError("run() returned although its callback raised")
        session = next(s for s in c.ps(all=True) if s["invocation_key"] == k)
        receipt = c.wait(session["session_id"])
    assert receipt["termination"]["cause"] == "cancel", receipt


def test_async_run_callback_raising_cancels_and_leaves_nothing_pending(daemon: Daemon):
    k = key()

    async def main():
        async with AsyncClient(daemon.socket_path) as c:
            try:
                await c.run(["sh", "-c", "echo x; exec sleep 30"], key=k, on_stdout=lambda b: 1 / 0)
            except ZeroDivisionError:
                pass
            else:
                raise AssertionError("run() returned although its callback raised")
            # Neither reader is left: only this task (and the client's own keepalive) runs.
            left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and "collect" in repr(t.get_coro())]
            session = next(s for s in (await c.ps(all=True)) if s["invocation_key"] == k)
            return left, await c.wait(session["session_id"])

    left, receipt = asyncio.run(main())
    assert left == []
    assert receipt["termination"]["cause"] == "cancel", receipt


def test_run_inherit_env(daemon: Daemon, monkeypatch):
    marker = secrets.token_hex(8)
    monkeypatch.setenv("SBX_TEST_INHERITED", marker)
    with Client(daemon.socket_path) as c:
        plain = c.run(["sh", "-c", 'printf "%s" "${SBX_TEST_INHERITED-unset}"'], key=key())
        inherited = c.run(["sh", "-c", 'printf "%s" "${SBX_TEST_INHERITED-unset}"'], key=key(), inherit_env=True)
    assert (plain.stdout, inherited.stdout) == (b"unset", marker.encode())

    async def main():
        async with AsyncClient(daemon.socket_path) as c:
            return await c.run(["sh", "-c", 'printf "%s" "${SBX_TEST_INHERITED-unset}"'], key=key(), inherit_env=True)

    assert asyncio.run(main()).stdout == marker.encode()


def test_kill_defaults_to_sigkill(daemon: Daemon):
    with Client(daemon.socket_path) as c:
        # A TERM would be trapped (exit 0); the default must be KILL: signaled, 137.
        s = c.launch(["sh", "-c", "trap 'exit 0' TERM; echo ready; while :; do sleep 0.05; done"], key=key())
        until(lambda: c.read(s, "stdout") == b"ready\n", "the trap installed")
        answer = c.kill(s)
        receipt = c.wait(s)
    assert answer["signal"] == "SIGKILL"
    assert (receipt["outcome"], receipt["exit"].get("signal")) == ("signaled", "SIGKILL")

    async def main():
        async with AsyncClient(daemon.socket_path) as c:
            s = await c.launch(["sh", "-c", "trap 'exit 0' TERM; echo ready; while :; do sleep 0.05; done"], key=key())
            while (await c.read(s, "stdout")) != b"ready\n":
                await asyncio.sleep(0.02)
            a = await c.kill(s)
            return a, await c.wait(s)

    a, receipt = asyncio.run(main())
    assert a["signal"] == "SIGKILL" and receipt["outcome"] == "signaled"


def test_kill_refuses_a_signal_that_is_not_a_name_or_an_int(daemon: Daemon):
    # int(9.7) was 9: the session got a SIGKILL nobody asked for. Refused before anything is sent.
    import signal as signals

    with Client(daemon.socket_path) as c:
        s = c.launch(["sh", "-c", "echo ready; while :; do sleep 0.05; done"], key=key())
        until(lambda: c.read(s, "stdout") == b"ready\n", "the session to run")
        for bad in (9.7, True, None, b"SIGTERM"):
            with pytest.raises(TypeError, match="signal must be a name or an int"):
                c.kill(s, bad)
        assert c.receipt(s)["state"] == "running"
        assert c.kill(s, signals.SIGUSR1)["signal"] == "SIGUSR1"  # an IntEnum is an int
        c.kill(s)
        assert c.wait(s)["outcome"] == "signaled"


# The harness's memory: a child process runs 100 MB of stdout through run(), buffered or
# streamed to a callback, and prints its peak RSS (ru_maxrss, KiB on Linux).
RSS_CHILD = r"""
import hashlib, json, sys
sys.path.insert(0, sys.argv[1])
from sandbox_supervisor import Client
mode, sock = sys.argv[2], sys.argv[3]
h, n = hashlib.sha256(), [0]
def take(b):
    h.update(b); n[0] += len(b)
with Client(sock) as c:
    argv = ["head", "-c", "100000000", "/dev/zero"]
    if mode == "buffered":
        r = c.run(argv, timeout_seconds=120); n[0] = len(r.stdout); h.update(r.stdout); del r
    else:
        r = c.run(argv, timeout_seconds=120, on_stdout=take)
# VmHWM: this process image's own peak (proc(5)); ru_maxrss would carry the parent's peak
# across fork and exec, so a big pytest would look like a big harness.
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"mode": mode, "bytes": n[0], "sha256": h.hexdigest(), "maxrss_kib": hwm}))
"""


def test_peak_rss_of_100_mb_buffered_vs_callback(daemon: Daemon):
    # Each child reports its own VmHWM (proc(5)), not ru_maxrss, which Linux keeps across fork
    # and exec: the parent's peak (pytest's, with every earlier test) would be the child's.
    h = hashlib.sha256()
    zeros = bytes(1_000_000)
    for _ in range(100):
        h.update(zeros)
    want = h.hexdigest()
    rows = {}
    for mode in ("buffered", "callback"):
        p = subprocess.run([sys.executable, "-c", RSS_CHILD, PKG, mode, daemon.socket_path], capture_output=True, timeout=300)
        assert p.returncode == 0, p.stderr.decode()
        rows[mode] = json.loads(p.stdout)
        print(f"peak RSS, run() of `head -c 100000000 /dev/zero`, {mode}: {rows[mode]['maxrss_kib'] / 1024:.1f} MiB")
    assert all(r["bytes"] == 100_000_000 and r["sha256"] == want for r in rows.values())
    assert rows["callback"]["maxrss_kib"] < 64 * 1024  # one piece at a time, not the output
    assert rows["buffered"]["maxrss_kib"] > 100_000_000 // 1024
