"""A stand-in WebSocket listener for the client's tests when the built supervisor has none
(`remote.listen`): websockets' asyncio server in a thread of its own, `Authorization: Bearer
TOKEN` checked (else 401), each connection joined to the supervisor's Unix socket (one binary
message = one frame body). ``drop_all()`` aborts every TCP connection (a dropped link).
"""
from __future__ import annotations

import asyncio
import http
import struct
import threading
from typing import Any, Optional, Set

import websockets.server


class WsProxy:
    def __init__(self, socket_path: str, token: str) -> None:
        self.socket_path = socket_path
        self.token = token
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.port = 0
        self.conns: Set[Any] = set()
        self.server: Optional[Any] = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/"

    def start(self) -> "WsProxy":
        self.thread.start()
        if not self.ready.wait(10):
            raise RuntimeError("ws proxy did not start")
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())
        self.loop.run_forever()

    async def _serve(self) -> None:
        async def check(path: str, headers: Any) -> Any:
            if headers.get("Authorization") != f"Bearer {self.token}":
                return http.HTTPStatus.UNAUTHORIZED, [("WWW-Authenticate", "Bearer")], b'{"error":{"code":"UNAUTHORIZED","message":"bad token"}}'
            return None

        self.server = await websockets.server.serve(self._handle, "127.0.0.1", 0, process_request=check, max_size=None, compression=None, ping_interval=None)
        self.port = self.server.sockets[0].getsockname()[1]
        self.ready.set()

    async def _handle(self, ws: Any, path: str = "/") -> None:
        self.conns.add(ws)
        reader, writer = await asyncio.open_unix_connection(self.socket_path, limit=1 << 20)

        async def down() -> None:
            while True:
                prefix = await reader.readexactly(4)
                (n,) = struct.unpack(">I", prefix)
                await ws.send(await reader.readexactly(n))

        task = asyncio.ensure_future(down())
        try:
            async for message in ws:
                writer.write(struct.pack(">I", len(message)) + message)
                await writer.drain()
        except Exception:
            pass
        finally:
            task.cancel()
            writer.close()
            self.conns.discard(ws)

    def drop_all(self) -> int:
        """Aborts every connection's TCP (no close frame); how many there were."""
        async def drop() -> int:
            n = len(self.conns)
            for ws in list(self.conns):
                ws.transport.abort()
            return n

        return asyncio.run_coroutine_threadsafe(drop(), self.loop).result(10)

    def stop(self) -> None:
        async def stop() -> None:
            if self.server is not None:
                self.server.close()
                await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
