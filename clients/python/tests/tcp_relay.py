"""A TCP relay for the WebSocket tests: 127.0.0.1:PORT forwards byte for byte to a target port
(two threads per connection); ``drop_all()`` resets every connection (SO_LINGER 0: an RST, as a
link that died), so a client's TCP connection can be cut mid-stream; ``freeze()`` makes the open
connections a black hole (bytes taken, none passed on: a silent link), new ones unaffected.
"""
from __future__ import annotations

import socket
import struct
import threading
from typing import List, Tuple


class TcpRelay:
    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.pairs: List[Tuple[socket.socket, socket.socket, threading.Event]] = []
        self.accepted = 0
        self.closed = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def url(self, scheme: str = "ws") -> str:
        return f"{scheme}://127.0.0.1:{self.port}/"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            frozen = threading.Event()
            with self.lock:
                self.pairs.append((client, upstream, frozen))
                self.accepted += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._copy, args=(a, b, frozen), daemon=True).start()

    @staticmethod
    def _copy(src: socket.socket, dst: socket.socket, frozen: threading.Event) -> None:
        try:
            while True:
                data = src.recv(1 << 20)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                if not frozen.is_set():
                    dst.sendall(data)
        except OSError:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def drop_all(self) -> int:
        """Resets every open connection (both sides); how many pairs there were."""
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for *pair, _ in pairs:
            for s in pair:
                try:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                try:
                    s.close()
                except OSError:
                    pass
        return len(pairs)

    def freeze(self) -> int:
        """The open connections pass nothing on from now (a silent link); how many."""
        with self.lock:
            for _, _, frozen in self.pairs:
                frozen.set()
            return len(self.pairs)

    def stop(self) -> None:
        self.listener.close()
        self.drop_all()
