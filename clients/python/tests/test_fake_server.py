"""The clients against a fake supervisor (fakeserver.py) that misbehaves as the real one cannot
be made to: a connection closed on every request, output frames at wrong cursors."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from fakeserver import FakeServer
from sandbox_supervisor import AsyncClient, Client
from sandbox_supervisor._protocol import RECONNECT_PAUSE_SECONDS


def closes_every_request(frame):
    return None


def run_bounded(fn, seconds: float):
    """fn() in a thread, so a client that loops for ever fails the test instead of hanging it."""
    out: dict = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - handed to the test
            out["error"] = err

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds} s"
    return out


@pytest.mark.parametrize("flavour", ["blocking", "async"])
def test_a_supervisor_that_drops_every_request_is_given_up_on_after_reconnect_seconds(tmp_path, flavour):
    path = str(tmp_path / "fake.sock")
    # At most 200 connections: past them nothing listens (so a client that resends without bound still ends).
    with FakeServer(path, closes_every_request, max_connections=200) as fake:
        if flavour == "blocking":
            def call():
                with Client(path, reconnect_seconds=1.0) as c:
                    return c.status()
        else:
            def call():
                async def main():
                    async with AsyncClient(path, reconnect_seconds=1.0) as c:
                        return await c.status()
                return asyncio.run(main())

        start = time.monotonic()
        out = run_bounded(call, 20)
        elapsed = time.monotonic() - start
        connections = fake.connections
    err = out.get("error")
    assert isinstance(err, ConnectionError), out
    assert path in str(err) and "status" in str(err)
    # Resent with a pause, for reconnect_seconds counted from the first failure: about 1 / 0.2 + 1 attempts.
    assert 1.0 <= elapsed < 3.0
    assert 3 <= connections <= 1.0 / RECONNECT_PAUSE_SECONDS + 3


@pytest.mark.parametrize("flavour", ["blocking", "async"])
def test_read_output_from_a_supervisor_that_drops_every_subscribe_is_given_up_on(tmp_path, flavour):
    path = str(tmp_path / "fake.sock")
    with FakeServer(path, closes_every_request, max_connections=200) as fake:
        if flavour == "blocking":
            def call():
                with Client(path, reconnect_seconds=1.0) as c:
                    c.hello  # connected once: from here on a drop is reconnected
                    return list(c.read_output("s-fake", "stdout"))
        else:
            def call():
                async def main():
                    async with AsyncClient(path, reconnect_seconds=1.0) as c:
                        return [chunk async for chunk in c.read_output("s-fake", "stdout")]
                return asyncio.run(main())

        out = run_bounded(call, 20)
        connections = fake.connections
    err = out.get("error")
    assert isinstance(err, ConnectionError) and path in str(err) and "subscribe" in str(err), out
    assert connections <= 1.0 / RECONNECT_PAUSE_SECONDS + 4


def serves_output(*pieces):
    """A handler answering subscribe with output frames at the given (cursor, data), then end."""
    def handler(frame):
        rid, p = frame["id"], frame["params"]
        out = [{"id": rid, "result": {"session_id": "s-fake", "stream": p["stream"], "from": p["from"], "cursor": 0}}]
        out += [{"id": rid, "event": "output", "stream": p["stream"], "cursor": c, "data": d} for c, d in pieces]
        end = max([c + len(d) for c, d in pieces] or [0])
        return out + [{"id": rid, "event": "end", "stream": p["stream"], "cursor": end, "final": True}]
    return handler


def read_all(path: str, flavour: str):
    if flavour == "blocking":
        with Client(path) as c:
            return [(chunk.cursor, chunk.data) for chunk in c.read_output("s-fake", "stdout")]

    async def main():
        async with AsyncClient(path) as c:
            return [(chunk.cursor, chunk.data) async for chunk in c.read_output("s-fake", "stdout")]

    return asyncio.run(main())


@pytest.mark.parametrize("flavour", ["blocking", "async"])
def test_read_output_trims_an_overlapping_frame_to_its_new_bytes(tmp_path, flavour):
    path = str(tmp_path / "fake.sock")
    with FakeServer(path, serves_output((0, b"abcd"), (2, b"cdef"), (1, b"bc"), (6, b"gh"))):
        chunks = read_all(path, flavour)
    assert chunks == [(0, b"abcd"), (4, b"ef"), (6, b"gh")]


@pytest.mark.parametrize("flavour", ["blocking", "async"])
def test_read_output_raises_on_a_gap_never_skips_it(tmp_path, flavour):
    from sandbox_supervisor import SupervisorError

    path = str(tmp_path / "fake.sock")
    with FakeServer(path, serves_output((0, b"abcd"), (7, b"hij"))):
        with pytest.raises(SupervisorError) as e:
            read_all(path, flavour)
    assert (e.value.code, e.value.retryable) == ("INTERNAL", False)
    assert "cursor 7" in e.value.message and "4" in e.value.message
    assert (e.value.details["expected_cursor"], e.value.details["cursor"]) == (4, 7)


@pytest.mark.parametrize("flavour", ["blocking", "async"])
def test_an_append_write_whose_answer_is_lost_is_never_resent_and_one_with_an_offset_is(tmp_path, flavour):
    # The fake takes every write and drops the connection before answering: the bytes may be
    # in the pipe, so an append (no offset) is sent once and fails; with an offset it is resent
    # (the supervisor skips what it has: exactly once) and fails only when reconnect_seconds end.
    path = str(tmp_path / "fake.sock")
    with FakeServer(path, closes_every_request, max_connections=50) as fake:

        def call(offset):
            if flavour == "blocking":
                with Client(path, reconnect_seconds=0.5) as c:
                    return c.write("s-1-a", b"hello\n", offset=offset)

            async def main():
                async with AsyncClient(path, reconnect_seconds=0.5) as c:
                    return await c.write("s-1-a", b"hello\n", offset=offset)

            return asyncio.run(main())

        out = run_bounded(lambda: call(None), 20)
        writes = [f for f in fake.requests if f["method"] == "write"]
        assert isinstance(out.get("error"), ConnectionError), out
        assert len(writes) == 1 and "offset" not in writes[0]["params"], writes
        out = run_bounded(lambda: call(0), 20)
        writes = [f for f in fake.requests if f["method"] == "write" and f["params"].get("offset") == 0]
        assert isinstance(out.get("error"), ConnectionError), out
        assert len(writes) > 1, writes
