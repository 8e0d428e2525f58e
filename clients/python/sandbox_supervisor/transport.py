"""The blocking client's transports (endpoint.py chooses one): the Unix socket and a command's
stdin/stdout carry length-prefixed frames; a WebSocket (websockets' Sans-I/O ClientConnection over
a plain socket, TLS for wss) carries one frame body per binary message. Owns opening them within a
deadline, sending and receiving frames with deadlines (no call blocks for ever on a silent peer),
and closing them (a command's process group is signalled and the command reaped). No background thread, no event loop.
"""
from __future__ import annotations

import os
import select
import signal
import socket
import ssl
import subprocess
import time
from typing import Any, Dict, List, Optional
from urllib.parse import urlparse

import msgpack

from . import _protocol as P
from ._pgroup import POLL_SECONDS, signal_group, spawn_options, terminate_group
from .endpoint import COMMAND_EXIT_GRACE_SECONDS, Endpoint, TransportDead
from .errors import SupervisorError
from .framing import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, decode_body, encode_frame

_RECV_BYTES = 1024 * 1024


class Transport:
    """Frames to and from the supervisor. ``send`` raises TransportDead when the peer takes no byte
    for ``stall_seconds``; ``recv(timeout)`` returns the frames now whole ([] possible), None when
    nothing came within timeout, and raises P.ConnectionLost at EOF; both raise OSError on a drop."""

    stall_seconds: float = 15.0

    def send(self, value: Dict[str, Any]) -> None:
        raise NotImplementedError

    def recv(self, timeout: float) -> Optional[List[Dict[str, Any]]]:
        raise NotImplementedError

    def close(self, dead: bool = False) -> None:
        """Closes it; ``dead``: it failed (a command is killed at once, not given time to exit)."""
        raise NotImplementedError


# -- byte streams ---------------------------------------------------------------------------


class _SocketIO:
    """A connected socket (Unix, TCP, TLS): writes that give up after a stall, reads with a timeout."""

    def __init__(self, sock: socket.socket, what: str) -> None:
        self.sock = sock
        self.what = what

    def write_all(self, data: bytes, stall_seconds: float) -> None:
        view = memoryview(data)
        while view:
            self.sock.settimeout(stall_seconds)
            try:
                n = self.sock.send(view)
            except socket.timeout:
                raise TransportDead(f"the supervisor over {self.what} took no byte for {stall_seconds:g} s: the transport is dead") from None
            view = view[n:]

    def read_some(self, timeout: float) -> Optional[bytes]:
        """Bytes (b"" at EOF), or None when none came within timeout (0: what is there now)."""
        self.sock.settimeout(timeout if timeout > 0 else 0.0)
        try:
            return self.sock.recv(_RECV_BYTES)
        except (socket.timeout, BlockingIOError, ssl.SSLWantReadError):
            return None

    def shutdown_write(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class _PipeIO:
    """A spawned command's stdin (we write) and stdout (we read), non-blocking, waited on with select."""

    def __init__(self, proc: "subprocess.Popen[bytes]", what: str) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.proc = proc
        self.what = what
        self.wfd = proc.stdin.fileno()
        self.rfd = proc.stdout.fileno()
        os.set_blocking(self.wfd, False)
        os.set_blocking(self.rfd, False)

    def write_all(self, data: bytes, stall_seconds: float) -> None:
        view = memoryview(data)
        while view:
            _, ready, _ = select.select([], [self.wfd], [], stall_seconds)
            if not ready:
                raise TransportDead(f"the supervisor over {self.what} took no byte for {stall_seconds:g} s: the transport is dead")
            try:
                n = os.write(self.wfd, view)
            except BlockingIOError:
                continue
            except BrokenPipeError:
                raise P.ConnectionLost(f"{self.what} closed its stdin (exit status {self.proc.poll()})") from None
            view = view[n:]

    def read_some(self, timeout: float) -> Optional[bytes]:
        ready, _, _ = select.select([self.rfd], [], [], max(timeout, 0.0))
        if not ready:
            return None
        try:
            return os.read(self.rfd, _RECV_BYTES)
        except BlockingIOError:
            return None

    def close(self, dead: bool) -> None:
        """Ends its stdin and stdout, signals its process group (the command and all it started):
        SIGTERM (+SIGCONT), then SIGKILL once the group is still there after
        COMMAND_EXIT_GRACE_SECONDS (at once when dead); the command is always reaped."""
        proc = self.proc
        for f in (proc.stdin, proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        pgid = proc.pid  # the leader of its own group (spawn_options)
        if dead:
            signal_group(pgid, signal.SIGKILL)
        else:
            terminate_group(pgid)
            give_up = time.monotonic() + COMMAND_EXIT_GRACE_SECONDS
            while time.monotonic() < give_up:
                proc.poll()  # reaped once it exits: a zombie leader would keep the group alive
                if proc.returncode is not None and not signal_group(pgid, 0):
                    break
                time.sleep(POLL_SECONDS)
            signal_group(pgid, signal.SIGKILL)
        proc.wait()


# -- length-prefixed frames (Unix socket, command) ------------------------------------------


class _StreamTransport(Transport):
    def __init__(self, io: Any, stall_seconds: float) -> None:
        self.io = io
        self.stall_seconds = stall_seconds
        self.decoder = FrameDecoder(DEFAULT_MAX_FRAME_BYTES)

    def send(self, value: Dict[str, Any]) -> None:
        self.io.write_all(encode_frame(value), self.stall_seconds)

    def recv(self, timeout: float) -> Optional[List[Dict[str, Any]]]:
        data = self.io.read_some(timeout)
        if data is None:
            return None
        if not data:
            raise P.ConnectionLost(f"connection to the supervisor over {self.io.what} closed")
        return self.decoder.feed(data)

    def close(self, dead: bool = False) -> None:
        if isinstance(self.io, _PipeIO):
            self.io.close(dead)
        else:
            self.io.close()


def open_socket(path: str, deadline: float, stall_seconds: float) -> Transport:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        sock.connect(path)
    except socket.timeout:
        sock.close()
        raise TransportDead(f"connecting to the supervisor socket at {path} took too long") from None
    except OSError as err:
        sock.close()
        raise P.connect_error(err, path) from None
    except BaseException:
        sock.close()
        raise
    return _StreamTransport(_SocketIO(sock, path), stall_seconds)


def open_command(command: List[str], stall_seconds: float) -> Transport:
    """Spawns command (stderr inherited; in a process group of its own, so no controlling terminal
    reads a password: ssh needs keys or BatchMode) with its stdin/stdout as the transport. FileNotFoundError
    (no such program) and PermissionError are raised as such."""
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, close_fds=True, **spawn_options())
    return _StreamTransport(_PipeIO(proc, "command " + " ".join(command)), stall_seconds)


# -- WebSocket ----------------------------------------------------------------------------------


class _WsTransport(Transport):
    """websockets' Sans-I/O client over a socket: one binary message = one frame body."""

    def __init__(self, io: _SocketIO, conn: Any, stall_seconds: float) -> None:
        self.io = io
        self.conn = conn
        self.stall_seconds = stall_seconds
        self.parts: List[bytes] = []

    def _flush(self) -> None:
        for data in self.conn.data_to_send():
            if data:
                self.io.write_all(data, self.stall_seconds)
            else:
                self.io.shutdown_write()

    def send(self, value: Dict[str, Any]) -> None:
        from websockets.exceptions import InvalidState

        try:
            self.conn.send_binary(msgpack.packb(value, use_bin_type=True))
        except InvalidState:
            raise P.ConnectionLost(f"the WebSocket to {self.io.what} is closing") from None
        self._flush()

    def recv(self, timeout: float) -> Optional[List[Dict[str, Any]]]:
        from websockets.frames import Opcode

        data = self.io.read_some(timeout)
        if data is None:
            return None
        try:
            if data:
                self.conn.receive_data(data)
            else:
                self.conn.receive_eof()
        except EOFError:  # data or EOF after the stream already ended
            raise P.ConnectionLost(f"the WebSocket to {self.io.what} closed") from None
        frames: List[Dict[str, Any]] = []
        closed: Optional[str] = None
        for event in self.conn.events_received():
            op = event.opcode
            if op in (Opcode.BINARY, Opcode.CONT):
                self.parts.append(event.data)
                if event.fin:
                    body, self.parts = b"".join(self.parts), []
                    frames.append(decode_body(body))
            elif op == Opcode.TEXT:
                self.conn.fail(1003, "text messages are not part of the protocol")
                closed = "the supervisor sent a text message (not part of the protocol)"
            elif op == Opcode.CLOSE:
                rcvd = self.conn.close_rcvd
                closed = f"the supervisor closed the WebSocket ({rcvd.code} {rcvd.reason})".rstrip() if rcvd else "the supervisor closed the WebSocket"
        try:
            self._flush()  # pongs, the close echo
        except OSError:
            pass
        if frames:
            return frames  # the close is raised at the next recv
        if closed is not None or not data or self.conn.parser_exc is not None:
            raise P.ConnectionLost(closed or f"the WebSocket to {self.io.what} closed ({self.conn.parser_exc or 'EOF'})")
        return frames

    def close(self, dead: bool = False) -> None:
        if not dead:
            try:
                self.conn.send_close(1000)
                self._flush()
            except Exception:
                pass
        self.io.close()


def handshake_error(status: int, body: Optional[bytes], url: str) -> Exception:
    """The error of a refused upgrade: 401/403 UNAUTHORIZED; 429 and 5xx an OSError (tried again
    while reconnecting); others SupervisorError with the body's message."""
    text = (body or b"").decode("utf-8", "replace").strip()
    message = text
    try:
        import json

        parsed = json.loads(text)
        if isinstance(parsed, dict):
            inner = parsed.get("error") if isinstance(parsed.get("error"), dict) else parsed
            message = str(inner.get("message") or text)
    except ValueError:
        pass
    if status in (401, 403):
        return SupervisorError("UNAUTHORIZED", f"the supervisor at {url} refused the token (HTTP {status}): check the token given, the token file, or $SBX_TOKEN / $SBX_TOKEN_FILE" + (f" ({message})" if message else ""), {"http_status": status})
    if status == 429 or status >= 500:
        return ConnectionRefusedError(f"the supervisor at {url} refused the connection for now (HTTP {status}{': ' + message if message else ''})")
    return SupervisorError("INVALID_ARGUMENT", f"the supervisor at {url} refused the WebSocket upgrade (HTTP {status}{': ' + message if message else ''})", {"http_status": status})


def ssl_context(ca_file: Optional[str]) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
    return ctx


def open_websocket(endpoint: Endpoint, deadline: float, stall_seconds: float) -> Transport:
    from websockets.client import ClientConnection
    from websockets.http11 import Response
    from websockets.uri import parse_uri

    url = str(endpoint.url)
    wsuri = parse_uri(url)
    token = endpoint.bearer_token()
    host = urlparse(url).hostname or wsuri.host
    remaining = lambda: max(deadline - time.monotonic(), 0.001)  # noqa: E731
    try:
        sock = socket.create_connection((host, wsuri.port), timeout=remaining())
    except socket.timeout:
        raise TransportDead(f"connecting to the supervisor at {url} took too long") from None
    except OSError as err:
        raise type(err)(err.errno, f"cannot connect to the supervisor at {url}: {err.strerror or err}") if err.errno else err from None
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if wsuri.secure:
            sock.settimeout(remaining())
            sock = ssl_context(endpoint.ca_file).wrap_socket(sock, server_hostname=host)
        io = _SocketIO(sock, url)
        conn = ClientConnection(wsuri, max_size=DEFAULT_MAX_FRAME_BYTES)
        request = conn.connect()
        if token:
            request.headers["Authorization"] = f"Bearer {token}"
        conn.send_request(request)
        transport = _WsTransport(io, conn, stall_seconds)
        transport._flush()
        response: Optional[Response] = None
        while response is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TransportDead(f"the WebSocket upgrade at {url} took too long")
            data = io.read_some(left)
            if data is None:
                continue
            try:
                if data:
                    conn.receive_data(data)
                else:
                    conn.receive_eof()
            except EOFError:
                raise P.ConnectionLost(f"the supervisor at {url} closed the connection during the WebSocket upgrade") from None
            for event in conn.events_received():
                if isinstance(event, Response):
                    response = event
            if response is None and not data:
                raise P.ConnectionLost(f"the supervisor at {url} closed the connection during the WebSocket upgrade")
        if conn.handshake_exc is not None:
            if response.status_code != 101:
                raise handshake_error(response.status_code, response.body, url)
            raise SupervisorError("INVALID_ARGUMENT", f"the WebSocket upgrade at {url} failed: {conn.handshake_exc}")
        return transport
    except BaseException:
        sock.close()
        raise


def open_transport(endpoint: Endpoint, deadline: float, stall_seconds: float) -> Transport:
    """The endpoint's transport, opened before deadline (monotonic). Raises TransportDead past it,
    OSError when it cannot be reached, SupervisorError UNAUTHORIZED for a refused token."""
    if endpoint.url:
        return open_websocket(endpoint, deadline, stall_seconds)
    if endpoint.command:
        return open_command(endpoint.command, stall_seconds)
    return open_socket(str(endpoint.socket_path), deadline, stall_seconds)
