"""AsyncClient's bound on requests in flight on its one connection (max_in_flight, 64 as the
supervisor's ipc.maxInFlight): a gather of 100 runs all succeed, and against a supervisor with a
lower ipc.maxInFlight the requests it refuses (LIMIT_EXCEEDED, limit "in_flight") are sent again."""
from __future__ import annotations

import asyncio
import secrets
from typing import Iterator, List

import pytest

from daemon import Daemon
from sandbox_supervisor import AsyncClient, aio

ARGV = ["sh", "-c", "sleep 0.3; echo $0"]


def key() -> str:
    return f"py-{secrets.token_hex(6)}"


@pytest.fixture(scope="module")
def low_limit_daemon() -> Iterator[Daemon]:
    d = Daemon(config={"ipc": {"maxInFlight": 4}})
    try:
        d.start()
        yield d
    finally:
        d.stop()


def refusals_seen(monkeypatch: pytest.MonkeyPatch) -> List[dict]:
    """Every in_flight LIMIT_EXCEEDED answer the AsyncClient's dispatcher receives."""
    seen: List[dict] = []
    call = aio._Dispatcher.call

    async def counting(self, method, params):  # type: ignore[no-untyped-def]
        frame = await call(self, method, params)
        err = frame.get("error")
        if err and err.get("code") == "LIMIT_EXCEEDED" and (err.get("details") or {}).get("limit") == "in_flight":
            seen.append(err)
        return frame

    monkeypatch.setattr(aio._Dispatcher, "call", counting)
    return seen


async def hundred_runs(socket_path: str) -> None:
    async with AsyncClient(socket_path) as c:
        results = await asyncio.gather(*(c.run([*ARGV, f"run-{i}"], key=key()) for i in range(100)))
    assert [(r.exit_code, r.stdout, r.stderr) for r in results] == [(0, b"run-%d\n" % i, b"") for i in range(100)]


def test_gather_of_100_runs_on_one_async_client_all_succeed(daemon: Daemon, monkeypatch: pytest.MonkeyPatch):
    seen = refusals_seen(monkeypatch)
    asyncio.run(hundred_runs(daemon.socket_path))
    assert seen == []  # the client's own bound (64) kept it within the supervisor's default


def test_requests_beyond_a_lower_supervisor_limit_are_resent_and_succeed(low_limit_daemon: Daemon, monkeypatch: pytest.MonkeyPatch):
    seen = refusals_seen(monkeypatch)
    asyncio.run(hundred_runs(low_limit_daemon.socket_path))
    assert seen and all(e["details"]["max"] == 4 for e in seen)
