"""AsyncClient against a real supervisor: the same answers as Client, many requests at once on
one connection."""
from __future__ import annotations

import asyncio
import secrets

import pytest

from daemon import Daemon, planted_receipt_link
from sandbox_supervisor import AsyncClient, InvocationKey, SupervisorError, verify_receipt


def key() -> str:
    return f"py-{secrets.token_hex(6)}"


def test_async_run_many_at_once_exact_bytes_and_verified_receipts(daemon: Daemon):
    async def main() -> None:
        async with AsyncClient(daemon.socket_path) as c:
            results = await asyncio.gather(*(c.run(["sh", "-c", f"printf 'out {i}'; printf 'err {i}' >&2; exit {i}"], key=key()) for i in range(8)))
            assert [(r.exit_code, r.outcome, r.stdout, r.stderr) for r in results] == [(i, "exited", b"out %d" % i, b"err %d" % i) for i in range(8)]
            pem = (await c.status())["receipt_key"]["public_key_pem"]
            assert all(verify_receipt(r.receipt, pem) for r in results)
            r = await c.run(["cat"], key=key(), stdin=b"\x00in\xff")
            assert r.stdout == b"\x00in\xff"

    asyncio.run(main())


def test_async_read_output_wait_and_errors(daemon: Daemon):
    async def main() -> None:
        async with AsyncClient(daemon.socket_path) as c:
            k = key()
            s = await c.launch(["sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.05; done"], key=k)
            waiting = asyncio.ensure_future(c.wait(InvocationKey(k)))  # concurrently with the reads below
            data = b"".join([chunk.data async for chunk in c.read_output(s, "stdout", follow=True)])
            assert data == b"1\n2\n3\n"
            receipt = await waiting
            assert receipt["session_id"] == s.session_id and receipt["output"]["stdout"]["final_cursor"] == 6
            assert await c.read(s, "stdout", cursor=2) == b"2\n3\n"
            with pytest.raises(SupervisorError) as e:
                await c.read(s, "stdout", cursor=7)
            assert e.value.code == "CURSOR_OUT_OF_RANGE"
            with pytest.raises(SupervisorError) as e:
                await c.launch(["true"], key=k)
            assert (e.value.code, e.value.retryable) == ("KEY_CONFLICT", False)
            # Errors and answers share the connection: it still serves.
            assert (await c.receipt(s))["state"] == "ended"
            assert any(row["session_id"] == s.session_id for row in await c.ps(all=True))

    asyncio.run(main())


def test_async_first_connection_to_nothing_fails_at_once(tmp_path):
    async def main() -> None:
        with pytest.raises(FileNotFoundError):
            await AsyncClient(str(tmp_path / "none.sock")).connect()

    asyncio.run(main())


def test_async_run_raises_session_unknown_rather_than_waiting_for_good(daemon: Daemon, tmp_path):
    target = tmp_path / "receipt-target"
    target.write_text("original")

    async def main() -> None:
        async with AsyncClient(daemon.socket_path) as c:
            with pytest.raises(SupervisorError) as e:
                await c.run(["sh", "-c", planted_receipt_link(daemon, str(target))], key=key(), cwd="/")
            assert e.value.code == "SESSION_UNKNOWN"
            assert e.value.details["reason"].startswith("the receipt could not be written: EEXIST")
            assert target.read_text() == "original"
            await c.resolve(e.value.details["session_id"], reason="test: planted receipt link")

    asyncio.run(main())
