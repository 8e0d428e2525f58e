"""Client and AsyncClient over a WebSocket URL with a bearer token, against a real supervisor's own
listener (`remote.listen`, token by config); a TCP relay (tcp_relay.py) in between so a test can
reset the connection mid-stream or make it silent.
Good token: exact bytes and the receipt's digest; wrong or missing token: UNAUTHORIZED; a reset
TCP connection during read_output resumes with no gap and no duplicate; a frozen (silent) link is
found within silence_seconds and the call completes on a new connection; wss with a CA file.
"""
from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import socket
import ssl
import subprocess
import time
from typing import Any, Dict, Iterator, Tuple

import pytest

from daemon import Daemon, until
from sandbox_supervisor import AsyncClient, Client, SupervisorError
from tcp_relay import TcpRelay

TOKEN = "test-" + secrets.token_urlsafe(24)
FAST = {"keepalive_seconds": 0.5, "silence_seconds": 3.0, "reconnect_seconds": 20.0}
PRODUCER = ["sh", "-c", "i=0; while [ $i -lt 30 ]; do seq $((i*20000)) $((i*20000+9999)); i=$((i+1)); sleep 0.03; done"]
EXPECTED = b"".join(b"%d\n" % n for i in range(30) for n in range(i * 20000, i * 20000 + 10000))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def connectable(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def ws() -> Iterator[Tuple[Daemon, TcpRelay]]:
    """A supervisor reachable over WebSocket through a relay: (daemon, relay)."""
    port = free_port()
    d = Daemon({"remote": {"listen": f"127.0.0.1:{port}", "token": TOKEN}})
    try:
        d.start()
        until(lambda: connectable(port), f"the supervisor's WebSocket listener on 127.0.0.1:{port}")
        relay = TcpRelay(port)
        try:
            yield d, relay
        finally:
            relay.stop()
    finally:
        d.stop()


def key() -> str:
    return f"py-{secrets.token_hex(6)}"


def check_digest(receipt: Dict[str, Any], stream: str, data: bytes) -> None:
    out = receipt["output"][stream]
    assert (out["final_cursor"], out["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())


def test_good_token_run_read_receipt(ws):
    d, relay = ws
    payload = os.urandom(300_000)
    with Client.over_url(relay.url(), token=TOKEN, **FAST) as c:
        assert c.hello.version == 1
        r = c.run(["sh", "-c", "cat; printf err >&2"], key=key(), stdin=payload)
        assert (r.exit_code, r.stdout, r.stderr) == (0, payload, b"err")
        check_digest(r.receipt, "stdout", payload)
        assert c.read(r.session, "stdout") == payload


def test_wrong_or_missing_token_is_unauthorized(ws, tmp_path, monkeypatch):
    d, relay = ws
    monkeypatch.delenv("SBX_TOKEN", raising=False)
    monkeypatch.delenv("SBX_TOKEN_FILE", raising=False)
    for token in ("wrong", TOKEN[:-1], None):
        with pytest.raises(SupervisorError) as info:
            Client(url=relay.url(), token=token, **FAST).hello
        assert info.value.code == "UNAUTHORIZED" and "refused the token (HTTP 401)" in info.value.message, info.value

        async def main() -> None:
            with pytest.raises(SupervisorError) as ainfo:
                await AsyncClient(url=relay.url(), token=token, **FAST).connect()
            assert ainfo.value.code == "UNAUTHORIZED" and "HTTP 401" in ainfo.value.message

        asyncio.run(main())
    # The token from $SBX_URL + $SBX_TOKEN_FILE (read at connect).
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.setenv("SBX_URL", relay.url())
    monkeypatch.setenv("SBX_TOKEN_FILE", str(token_file))
    with Client(**FAST) as c:
        assert c.endpoint.kind == "url" and c.status()["version"]


def test_async_good_token_run_read_receipt(ws):
    d, relay = ws

    async def main() -> None:
        async with AsyncClient.over_url(relay.url(), token=TOKEN, **FAST) as c:
            results = await asyncio.gather(*(c.run(["sh", "-c", f"printf 'out {i}'; printf 'err {i}' >&2; exit {i}"], key=key()) for i in range(6)))
            assert [(r.exit_code, r.stdout, r.stderr) for r in results] == [(i, b"out %d" % i, b"err %d" % i) for i in range(6)]
            for i, r in enumerate(results):
                check_digest(r.receipt, "stdout", b"out %d" % i)

    asyncio.run(main())


def test_tcp_reset_mid_stream_resumes_without_gap_or_duplicate(ws):
    d, relay = ws
    with Client.over_url(relay.url(), token=TOKEN, **FAST) as c:
        s = c.launch(PRODUCER, key=key())
        data = bytearray()
        drops = 0
        for i, chunk in enumerate(c.read_output(s, "stdout")):
            assert chunk.cursor == len(data)
            data += chunk.data
            if i in (2, 5, 9):
                drops += relay.drop_all()
        receipt = c.wait(s)  # the request connection was reset too: it reconnects
    assert bytes(data) == EXPECTED
    check_digest(receipt, "stdout", EXPECTED)
    assert drops >= 3


def test_async_tcp_reset_mid_stream_resumes_without_gap_or_duplicate(ws):
    d, relay = ws

    async def main() -> None:
        async with AsyncClient.over_url(relay.url(), token=TOKEN, **FAST) as c:
            s = await c.launch(PRODUCER, key=key())
            data = bytearray()
            i = 0
            async for chunk in c.read_output(s, "stdout"):
                assert chunk.cursor == len(data)
                data += chunk.data
                if i in (2, 5, 9):
                    relay.drop_all()
                i += 1
            assert bytes(data) == EXPECTED
            check_digest(await c.wait(s), "stdout", EXPECTED)

    asyncio.run(main())


def test_a_silent_link_is_found_within_the_silence_deadline_and_the_call_completes(ws):
    d, relay = ws
    with Client.over_url(relay.url(), token=TOKEN, **FAST) as c:
        s = c.launch(["sleep", "1"], key=key())
        before = relay.accepted
        assert relay.freeze() >= 1
        frozen_at = time.monotonic()
        receipt = c.wait(s)
        took = time.monotonic() - frozen_at
    assert receipt["outcome"] == "exited" and receipt["session_id"] == s.session_id
    assert relay.accepted > before  # it reconnected
    assert took <= FAST["silence_seconds"] + 2.0, took

    async def main() -> None:
        async with AsyncClient.over_url(relay.url(), token=TOKEN, **FAST) as c:
            s = await c.launch(["sleep", "1"], key=key())
            before = relay.accepted
            assert relay.freeze() >= 1
            frozen_at = time.monotonic()
            receipt = await asyncio.wait_for(c.wait(s), 30)
            took = time.monotonic() - frozen_at
            assert receipt["outcome"] == "exited" and relay.accepted > before
            assert took <= FAST["silence_seconds"] + 2.0, took

    asyncio.run(main())


def test_wss_with_a_ca_file(tmp_path):
    cert, tls_key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(tls_key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    port = free_port()
    d = Daemon({"remote": {"listen": f"127.0.0.1:{port}", "token": TOKEN, "tlsCertFile": str(cert), "tlsKeyFile": str(tls_key)}})
    try:
        d.start()
        until(lambda: connectable(port), "the wss listener")
        url = f"wss://127.0.0.1:{port}/"
        with Client.over_url(url, token=TOKEN, ca_file=str(cert), **FAST) as c:
            r = c.run(["printf", "over tls"], key=key())
            assert r.stdout == b"over tls"
            check_digest(r.receipt, "stdout", b"over tls")
        with pytest.raises(ssl.SSLCertVerificationError):
            Client.over_url(url, token=TOKEN, **FAST).hello  # the system's CAs do not know it

        async def main() -> None:
            async with AsyncClient.over_url(url, token=TOKEN, ca_file=str(cert), **FAST) as c:
                r = await c.run(["printf", "async tls"], key=key())
                assert r.stdout == b"async tls"

        asyncio.run(main())
    finally:
        d.stop()


def tcp_state(local_port: int) -> str:
    """The kernel's state (hex, /proc/net/tcp) of the IPv4 TCP socket bound to 127.0.0.1:local_port."""
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[1] == f"0100007F:{local_port:04X}":
                return fields[3]
    return ""


def test_an_idle_connection_the_server_dropped_is_replaced_before_a_call_is_sent():
    """The server pings (remote.pingIntervalMs) an idle blocking client that does not read, and drops
    it; the next call sees the closed connection first and sends on a new one, so even ``kill``
    (never resent) succeeds."""
    port = free_port()
    d = Daemon({"remote": {"listen": f"127.0.0.1:{port}", "token": TOKEN, "pingIntervalMs": 100, "pingTimeoutMs": 100}})
    try:
        d.start()
        until(lambda: connectable(port), "the listener")
        with Client.over_url(f"ws://127.0.0.1:{port}/", token=TOKEN, **FAST) as c:
            s = c.launch(["sleep", "30"], key=key())
            assert c._conn is not None
            local_port = c._conn.transport.io.sock.getsockname()[1]
            until(lambda: tcp_state(local_port) in ("08", ""), "the server to drop the idle connection (CLOSE_WAIT here)")
            assert c.kill(s, "SIGKILL")["session_id"] == s.session_id
            assert c.wait(s)["outcome"] == "signaled"
    finally:
        d.stop()
