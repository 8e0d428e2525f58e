"""The asyncio client's transports (endpoint.py chooses one): the Unix socket and a spawned
command's stdin/stdout carry length-prefixed frames; a WebSocket (websockets' asyncio client,
``Authorization: Bearer`` in extra_headers, TLS for wss) one frame body per binary message.
Owns opening, sending, receiving and closing them; a command's process group is signalled and the command reaped (the
reaping tasks go into the owner's set, awaited by AsyncClient.close).
"""
from __future__ import annotations

import asyncio
import signal
from typing import Any, Dict, List, Optional, Set

import msgpack

from . import _protocol as P
from ._pgroup import POLL_SECONDS, signal_group, spawn_options, terminate_group
from .endpoint import COMMAND_EXIT_GRACE_SECONDS, Endpoint
from .framing import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, decode_body, encode_frame
from .transport import handshake_error, ssl_context

_READ_BYTES = 1024 * 1024


class AioTransport:
    """``send(value)``; ``recv()`` the frames now whole (raises P.ConnectionLost at EOF, OSError on a
    drop); ``ping(value)`` sends without waiting for the peer to take it; ``close(dead)`` at once."""

    what: str = ""

    async def send(self, value: Dict[str, Any]) -> None:
        raise NotImplementedError

    def ping(self, value: Dict[str, Any]) -> None:
        raise NotImplementedError

    async def recv(self) -> List[Dict[str, Any]]:
        raise NotImplementedError

    def close(self, dead: bool = False) -> None:
        raise NotImplementedError


class _AioStream(AioTransport):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, what: str, proc: Any = None, reaps: Optional[Set["asyncio.Task[None]"]] = None) -> None:
        self.reader = reader
        self.writer = writer
        self.what = what
        self.proc = proc
        self.reaps = reaps if reaps is not None else set()
        self.decoder = FrameDecoder(DEFAULT_MAX_FRAME_BYTES)
        self.closed = False

    async def send(self, value: Dict[str, Any]) -> None:
        if self.closed:
            raise P.ConnectionLost(f"the transport over {self.what} is closed")
        self.writer.write(encode_frame(value))
        await self.writer.drain()

    def ping(self, value: Dict[str, Any]) -> None:
        if not self.closed and not self.writer.is_closing():
            self.writer.write(encode_frame(value))

    async def recv(self) -> List[Dict[str, Any]]:
        data = await self.reader.read(_READ_BYTES)
        if not data:
            raise P.ConnectionLost(f"connection to the supervisor over {self.what} closed")
        return self.decoder.feed(data)

    def close(self, dead: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        if self.proc is None:
            if dead:
                self.writer.transport.abort()
            else:
                self.writer.close()
            return
        try:
            self.writer.close()  # the bridge's stdin ends: it exits
        except (OSError, RuntimeError):
            pass
        if dead:
            signal_group(self.proc.pid, signal.SIGKILL)
        task = asyncio.get_running_loop().create_task(_reap(self.proc, 0 if dead else COMMAND_EXIT_GRACE_SECONDS))
        self.reaps.add(task)
        task.add_done_callback(self.reaps.discard)


async def _reap(proc: Any, grace_seconds: float) -> None:
    """Signals the command's process group: SIGTERM (+SIGCONT), SIGKILL once the group is still
    there after grace_seconds (0: at once); waits for the command (reaped)."""
    pgid = proc.pid  # the leader of its own group (spawn_options)
    try:
        if grace_seconds > 0:
            terminate_group(pgid)
            give_up = asyncio.get_running_loop().time() + grace_seconds
            while asyncio.get_running_loop().time() < give_up:
                if proc.returncode is not None and not signal_group(pgid, 0):
                    break
                await asyncio.sleep(POLL_SECONDS)
        signal_group(pgid, signal.SIGKILL)
        await proc.wait()
    except asyncio.CancelledError:
        signal_group(pgid, signal.SIGKILL)  # the loop is ending: the child watcher still reaps it
        raise
    finally:
        transport = getattr(proc, "_transport", None)  # asyncio's process transport: closed here, not by GC after the loop
        if transport is not None:
            transport.close()


class _AioWebSocket(AioTransport):
    def __init__(self, ws: Any, what: str, reaps: Set["asyncio.Task[None]"]) -> None:
        self.ws = ws
        self.what = what
        self.reaps = reaps
        self.pinging: Optional["asyncio.Future[None]"] = None

    async def send(self, value: Dict[str, Any]) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            await self.ws.send(msgpack.packb(value, use_bin_type=True))
        except ConnectionClosed as err:
            raise P.ConnectionLost(f"the WebSocket to {self.what} closed ({err})") from None

    def ping(self, value: Dict[str, Any]) -> None:
        if self.pinging is None or self.pinging.done():
            fut = asyncio.ensure_future(self.send(value))
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # a failed ping is seen by recv
            self.pinging = fut

    async def recv(self) -> List[Dict[str, Any]]:
        from websockets.exceptions import ConnectionClosed

        try:
            message = await self.ws.recv()
        except ConnectionClosed as err:
            raise P.ConnectionLost(f"the WebSocket to {self.what} closed ({err})") from None
        if isinstance(message, str):
            self.close(dead=True)
            raise P.ConnectionLost(f"the supervisor at {self.what} sent a text message (not part of the protocol)")
        return [decode_body(message)]

    def close(self, dead: bool = False) -> None:
        if dead:
            if self.ws.transport is not None:
                self.ws.transport.abort()
            return
        task = asyncio.get_running_loop().create_task(self.ws.close())
        self.reaps.add(task)
        task.add_done_callback(self.reaps.discard)


async def open_aio_transport(endpoint: Endpoint, reaps: Set["asyncio.Task[None]"]) -> AioTransport:
    """The endpoint's transport (no deadline here: the caller wraps connect + hello in one).
    Raises OSError when it cannot be reached, SupervisorError UNAUTHORIZED for a refused token."""
    if endpoint.command:
        what = "command " + " ".join(endpoint.command)
        proc = await asyncio.create_subprocess_exec(*endpoint.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=_READ_BYTES, **spawn_options())
        assert proc.stdin is not None and proc.stdout is not None
        return _AioStream(proc.stdout, proc.stdin, what, proc, reaps)
    if endpoint.url:
        return await _open_websocket(endpoint, reaps)
    path = str(endpoint.socket_path)
    try:
        reader, writer = await asyncio.open_unix_connection(path, limit=_READ_BYTES)
    except OSError as err:
        raise P.connect_error(err, path) from None
    return _AioStream(reader, writer, path)


async def _open_websocket(endpoint: Endpoint, reaps: Set["asyncio.Task[None]"]) -> AioTransport:
    import websockets.client
    from websockets.exceptions import InvalidStatusCode

    url = str(endpoint.url)
    token = endpoint.bearer_token()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    ssl = ssl_context(endpoint.ca_file) if url.startswith("wss://") else None
    try:
        ws = await websockets.client.connect(
            url, extra_headers=headers, ssl=ssl, compression=None, max_size=DEFAULT_MAX_FRAME_BYTES, max_queue=8, ping_interval=None, open_timeout=None, close_timeout=1
        )
    except InvalidStatusCode as err:
        raise handshake_error(err.status_code, None, url) from None
    except OSError as err:
        raise type(err)(err.errno, f"cannot connect to the supervisor at {url}: {err.strerror or err}") if err.errno else err from None
    return _AioWebSocket(ws, url, reaps)
