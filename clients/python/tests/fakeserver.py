"""A small fake supervisor on a Unix socket, for what the real one cannot be made to do (close
the connection on every request, send output frames at wrong cursors): it answers hello and
passes every other request frame to a handler, which returns the frames to send, or None to
close the connection. Threads; ``close()`` stops them and removes the socket."""
from __future__ import annotations

import os
import socket
import threading
from typing import Any, Callable, Dict, List, Optional

from sandbox_supervisor.framing import FrameDecoder, encode_frame

Handler = Callable[[Dict[str, Any]], Optional[List[Dict[str, Any]]]]
HELLO = {"version": 1, "server": "sandbox-supervisor/fake", "instance": "fake-instance", "generation": 1}


class FakeServer:
    def __init__(self, path: str, handler: Handler, max_connections: int = 1000) -> None:
        self.path = path
        self.handler = handler
        self.max_connections = max_connections
        self.connections = 0
        self.requests: List[Dict[str, Any]] = []
        self._stop = threading.Event()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(64)
        self._listener.settimeout(0.05)
        self._threads: List[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def __enter__(self) -> "FakeServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _accept(self) -> None:
        try:
            while not self._stop.is_set() and self.connections < self.max_connections:
                try:
                    conn, _ = self._listener.accept()
                except socket.timeout:
                    continue
                self.connections += 1
                t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
                t.start()
                self._threads.append(t)
        finally:
            self._listener.close()
            try:
                os.unlink(self.path)  # past max_connections nothing listens any more
            except FileNotFoundError:
                pass

    def _serve(self, conn: socket.socket) -> None:
        decoder = FrameDecoder()
        conn.settimeout(0.05)
        try:
            while not self._stop.is_set():
                try:
                    data = conn.recv(1 << 20)
                except socket.timeout:
                    continue
                if not data:
                    return
                for frame in decoder.feed(data):
                    if frame.get("method") == "hello":
                        conn.sendall(encode_frame({"id": frame["id"], "result": HELLO}))
                        continue
                    self.requests.append(frame)
                    out = self.handler(frame)
                    if out is None:
                        return
                    for f in out:
                        conn.sendall(encode_frame(f))
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._accepting.join()
        for t in self._threads:
            t.join()
