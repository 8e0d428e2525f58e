"""read_output(s, "all"): stdout and stderr merged in arrival order, as `sbx logs --stream all`.
The command writes one line per stdin line, to the stream the line names; the test sends the
next line only once the previous write is stored (polled with a deadline), so the arrival
order is known exactly: the merge must give it, live (follow, read while it runs) and after."""
from __future__ import annotations

import json
import secrets
import threading

import pytest

from daemon import Daemon, until
from sandbox_supervisor import Client, SupervisorError

ECHO = 'while read s n; do if [ "$s" = o ]; then echo "out $n"; else echo "err $n" >&2; fi; done'
PLAN = "o e e o e o o o e e o e".split()


def test_all_merges_in_arrival_order(daemon: Daemon):
    expected = [("stdout" if s == "o" else "stderr", (f"out {i}\n" if s == "o" else f"err {i}\n").encode()) for i, s in enumerate(PLAN)]
    live: list = []
    with Client(daemon.socket_path) as c:
        s = c.launch(["sh", "-c", ECHO], key=f"py-{secrets.token_hex(6)}", stdin=True)
        reader = threading.Thread(target=lambda: live.extend((ch.stream, ch.data) for ch in c.read_output(s, "all", follow=True)))
        reader.start()
        sizes = {"stdout": 0, "stderr": 0}
        for i, (stream, line) in enumerate(expected):
            c.write(s, f"{PLAN[i]} {i}\n".encode())
            sizes[stream] += len(line)
            until(lambda: len(c.read(s, stream)) == sizes[stream], f"write {i} stored")
        c.close_stdin(s)
        receipt = c.wait(s)
        reader.join(30)
        assert not reader.is_alive()
        after = [(ch.stream, ch.data) for ch in c.read_output(s, "all", follow=False)]
    assert receipt["outcome"] == "exited"
    assert live == expected
    assert after == expected
    # The same order as sbx logs --stream all --json gives.
    p = daemon.sbx(["logs", s.session_id, "--stream", "all", "--json"])
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in p.stdout.decode().splitlines()]
    assert [r["stream"] for r in rows] == [st for st, _ in expected]


def test_all_refuses_a_cursor(daemon: Daemon):
    with Client(daemon.socket_path) as c:
        r = c.run(["true"])
        with pytest.raises(SupervisorError) as e:
            list(c.read_output(r.session, "all", cursor=3))
    assert e.value.code == "INVALID_ARGUMENT"


def test_async_all_gives_the_same_merge(daemon: Daemon):
    import asyncio

    from sandbox_supervisor import AsyncClient

    with Client(daemon.socket_path) as c:
        s = c.launch(["sh", "-c", ECHO], key=f"py-{secrets.token_hex(6)}", stdin=True)
        sizes = {"stdout": 0, "stderr": 0}
        for i, p in enumerate(PLAN[:6]):
            stream = "stdout" if p == "o" else "stderr"
            c.write(s, f"{p} {i}\n".encode())
            sizes[stream] += len(f"out {i}\n")
            until(lambda: len(c.read(s, stream)) == sizes[stream], f"write {i} stored")
        c.close_stdin(s)
        c.wait(s)
        sync = [(ch.stream, ch.data) for ch in c.read_output(s, "all", follow=False)]

    async def main():
        async with AsyncClient(daemon.socket_path) as a:
            return [(ch.stream, ch.data) async for ch in a.read_output(s, "all", follow=True)]

    assert asyncio.run(main()) == sync and [st for st, _ in sync] == ["stdout" if p == "o" else "stderr" for p in PLAN[:6]]
