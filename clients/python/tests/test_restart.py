"""read_output across a supervisor crash and restart (SIGKILL by pid, then a new supervisor on the
same socket and state dir): it reconnects and resumes from its cursor, with no gap and no
duplicate; checked against the stored bytes and the receipt's final cursor and SHA-256."""
from __future__ import annotations

import asyncio
import hashlib
import secrets

from daemon import Daemon, until
from sandbox_supervisor import AsyncClient, Client

# A burst (288,894 bytes) and then a line every 50 ms, until the restarted supervisor ends it.
PRODUCER = ["sh", "-c", "seq 1 50000; while :; do echo tick; sleep 0.05; done"]
BURST_BYTES = len(b"".join(b"%d\n" % i for i in range(1, 50001))) + 5 * len(b"tick\n")


def stored_past(client: Client, session_id: str, cursor_bytes: int) -> bool:
    rows = [r for r in client.ps(all=True) if r["session_id"] == session_id]
    return bool(rows) and rows[0]["cursors"].get("stdout", 0) > cursor_bytes


def crash_and_restart(daemon: Daemon) -> None:
    daemon.kill9()
    daemon.start()


def check_against_the_receipt(daemon: Daemon, session_id: str, data: bytes) -> None:
    with Client(daemon.socket_path) as c:
        receipt = c.wait(session_id)
        stored = c.read(session_id, "stdout")
    assert receipt["outcome"] == "owner_lost"
    assert data == stored
    assert (receipt["output"]["stdout"]["final_cursor"], receipt["output"]["stdout"]["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    assert data.startswith(b"".join(b"%d\n" % i for i in range(1, 50001)))


def test_read_output_resumes_across_a_restart(daemon: Daemon):
    with Client(daemon.socket_path) as c:
        s = c.launch(PRODUCER, key=f"py-{secrets.token_hex(6)}")
        reader = c.read_output(s, "stdout", cursor=0, follow=True)
        first = next(reader)
        assert first.cursor == 0 and first.data
        until(lambda: stored_past(c, s.session_id, BURST_BYTES), "the burst to be stored")
        crash_and_restart(daemon)  # the reader is suspended meanwhile: what it has not taken it gets after the restart
        rest = [chunk for chunk in reader]
    data = first.data + b"".join(x.data for x in rest)
    assert [x.cursor for x in rest] == [len(first.data) + sum(len(y.data) for y in rest[:i]) for i in range(len(rest))]
    check_against_the_receipt(daemon, s.session_id, data)


def test_async_read_output_resumes_across_a_restart(daemon: Daemon):
    async def main() -> bytes:
        async with AsyncClient(daemon.socket_path) as c:
            s = await c.launch(PRODUCER, key=f"py-{secrets.token_hex(6)}")
            reader = c.read_output(s, "stdout").__aiter__()
            first = await reader.__anext__()
            with Client(daemon.socket_path) as probe:
                until(lambda: stored_past(probe, s.session_id, BURST_BYTES), "the burst to be stored")
            crash_and_restart(daemon)
            parts = [first.data] + [chunk.data async for chunk in reader]
            assert (await c.wait(s))["outcome"] == "owner_lost"  # the request connection came back too
            main.session_id = s.session_id  # type: ignore[attr-defined]
            return b"".join(parts)

    data = asyncio.run(main())
    check_against_the_receipt(daemon, main.session_id, data)  # type: ignore[attr-defined]
