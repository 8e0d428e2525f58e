"""run(stdin=...) of more than one write's worth (8 MiB, docs/reference/protocol.md): sent in pieces at
their offsets, EOF with the last, blocking and async; a write that fails for good cancels the
session (never left waiting for the rest of its stdin) and is raised."""
from __future__ import annotations

import asyncio
import hashlib
import random
import secrets
import time

import pytest

from daemon import Daemon, until
from sandbox_supervisor import AsyncClient, Client, InvocationKey, SupervisorError
MAX_WRITE_BYTES = 8 * 1024 * 1024  # the most one write may carry (docs/reference/protocol.md, ipc/schemas.ts)

SIZE = 20 * 1024 * 1024


def key() -> str:
    return f"py-{secrets.token_hex(6)}"


@pytest.fixture(scope="module")
def payload() -> bytes:
    seed = int(time.time_ns())
    print(f"stdin payload: {SIZE} random bytes, seed {seed}")
    return random.Random(seed).randbytes(SIZE)


def expected(payload: bytes):
    return [b"%d\n" % len(payload), hashlib.sha256(payload).hexdigest().encode() + b"  -\n"]


def test_run_feeds_20_mib_of_stdin_in_pieces(daemon: Daemon, payload: bytes):
    assert SIZE > 2 * MAX_WRITE_BYTES
    with Client(daemon.socket_path) as c:
        results = [c.run(["wc", "-c"], key=key(), stdin=payload, timeout_seconds=60), c.run(["sha256sum"], key=key(), stdin=payload, timeout_seconds=60)]
    assert [(r.exit_code, r.outcome, r.stdout, r.stderr) for r in results] == [(0, "exited", out, b"") for out in expected(payload)]


def test_async_run_feeds_20_mib_of_stdin_in_pieces(daemon: Daemon, payload: bytes):
    async def main():
        async with AsyncClient(daemon.socket_path) as c:
            return await asyncio.gather(c.run(["wc", "-c"], key=key(), stdin=payload, timeout_seconds=60), c.run(["sha256sum"], key=key(), stdin=payload, timeout_seconds=60))

    results = asyncio.run(main())
    assert [(r.exit_code, r.outcome, r.stdout, r.stderr) for r in results] == [(0, "exited", out, b"") for out in expected(payload)]


def ended_as(daemon: Daemon, k: str) -> str:
    with Client(daemon.socket_path) as c:
        r = until(lambda: c.receipt(InvocationKey(k))["receipt"], f"session {k} to end (not left waiting for its stdin)")
    return r["outcome"]


def test_a_write_that_fails_for_good_cancels_the_session(daemon: Daemon, payload: bytes, monkeypatch: pytest.MonkeyPatch):
    writes = []
    request = Client.request

    def failing_second_write(self, method, params=None, **kw):  # type: ignore[no-untyped-def]
        if method == "write":
            writes.append(params.get("offset"))
            if len(writes) == 2:
                raise SupervisorError("INTERNAL", "injected: the second piece fails")
        return request(self, method, params, **kw)

    monkeypatch.setattr(Client, "request", failing_second_write)
    k = key()
    with Client(daemon.socket_path) as c, pytest.raises(SupervisorError, match="injected"):
        c.run(["wc", "-c"], key=k, stdin=payload)
    monkeypatch.undo()
    assert writes == [0, MAX_WRITE_BYTES]
    assert ended_as(daemon, k) == "cancelled"


def test_async_a_write_that_fails_for_good_cancels_the_session(daemon: Daemon, payload: bytes, monkeypatch: pytest.MonkeyPatch):
    writes = []
    request = AsyncClient.request

    async def failing_second_write(self, method, params=None, **kw):  # type: ignore[no-untyped-def]
        if method == "write":
            writes.append(params.get("offset"))
            if len(writes) == 2:
                raise SupervisorError("INTERNAL", "injected: the second piece fails")
        return await request(self, method, params, **kw)

    monkeypatch.setattr(AsyncClient, "request", failing_second_write)
    k = key()

    async def main():
        async with AsyncClient(daemon.socket_path) as c:
            await c.run(["wc", "-c"], key=k, stdin=payload)

    with pytest.raises(SupervisorError, match="injected"):
        asyncio.run(main())
    monkeypatch.undo()
    assert writes == [0, MAX_WRITE_BYTES]
    assert ended_as(daemon, k) == "cancelled"


def test_a_command_that_stops_reading_is_not_an_error_of_run(daemon: Daemon, payload: bytes):
    with Client(daemon.socket_path) as c:
        r = c.run(["head", "-c", "3"], key=key(), stdin=payload)
    assert (r.exit_code, r.stdout) == (0, payload[:3])
