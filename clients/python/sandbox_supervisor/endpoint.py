"""Where a client reaches the supervisor (docs/reference/contract.md "Remote harnesses"): the Unix socket, a WebSocket
URL with a bearer token, or a command whose stdin/stdout carry the frames (``sbx bridge`` through ``docker exec -i``,
``ssh``). Owns choosing the endpoint and reading its token, the deadlines' defaults, the transport errors both
clients raise, their shared base (EndpointClient) and when to reconnect after a drop (Retry). No I/O but a token file.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, TypeVar

from ._protocol import DEFAULT_RECONNECT_SECONDS, RECONNECT_PAUSE_SECONDS
from .errors import SupervisorError
from .paths import default_socket_path

#: While a call is pending, a ``ping`` request every this many seconds.
DEFAULT_KEEPALIVE_SECONDS = 5.0
#: No byte received for this long while a call is pending: the transport is dead.
DEFAULT_SILENCE_SECONDS = 15.0
#: Connect (spawn, TCP, TLS, upgrade) and hello together, in seconds.
DEFAULT_CONNECT_TIMEOUT_SECONDS = 10.0
#: How long ``close`` gives a command transport's process group after SIGTERM before SIGKILL, in seconds.
COMMAND_EXIT_GRACE_SECONDS = 1.0


class TransportDead(TimeoutError):
    """The transport said nothing for ``silence_seconds`` while a call was pending (or connect + hello
    overran ``connect_timeout_seconds``): it was closed. An OSError, so the reconnecting layers
    reconnect and resend as after any drop."""


class LaunchNotResent(ConnectionError):
    """The connection dropped after a launch without an invocation key may have reached the supervisor:
    it may be running, so it is not sent again. Give ``key`` (``Client.launch`` makes one) to make it safe."""


@dataclass(frozen=True)
class Endpoint:
    """One of: ``socket_path``; ``url`` (ws:// or wss://) with ``token``/``token_file`` and ``ca_file``
    (wss: a CA bundle to trust instead of the system's); ``command`` (argv spawned per connection)."""

    socket_path: Optional[str] = None
    url: Optional[str] = None
    token: Optional[str] = None
    token_file: Optional[str] = None
    ca_file: Optional[str] = None
    command: Optional[List[str]] = field(default=None)

    @property
    def kind(self) -> str:
        """"socket", "url" or "command"."""
        return "url" if self.url else "command" if self.command else "socket"

    def describe(self) -> str:
        """For messages: the socket path, the URL, or the command line (never the token)."""
        if self.url:
            return self.url
        if self.command:
            return "command " + " ".join(self.command)
        return str(self.socket_path)

    def bearer_token(self, env: Optional[Mapping[str, str]] = None) -> Optional[str]:
        """The token now (a file is read at each connect, so a rotated file is picked up): ``token``,
        else ``token_file``, else ``$SBX_TOKEN``, else ``$SBX_TOKEN_FILE``; None when none is set.
        Raises SupervisorError UNAUTHORIZED when a named token file cannot be read or is empty."""
        env = os.environ if env is None else env
        if self.token:
            return self.token
        path = self.token_file
        if not path and env.get("SBX_TOKEN"):
            return env["SBX_TOKEN"]
        path = path or env.get("SBX_TOKEN_FILE")
        if not path:
            return None
        try:
            with open(path, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as err:
            raise SupervisorError("UNAUTHORIZED", f"cannot read the token file {path} for {self.url}: {err.strerror or err}") from None
        if not token:
            raise SupervisorError("UNAUTHORIZED", f"the token file {path} for {self.url} is empty")
        return token


def resolve_endpoint(
    socket_path: Optional[str] = None,
    *,
    url: Optional[str] = None,
    token: Optional[str] = None,
    token_file: Optional[str] = None,
    ca_file: Optional[str] = None,
    command: Optional[Sequence[str]] = None,
    env: Optional[Mapping[str, str]] = None,
) -> Endpoint:
    """The endpoint of a client: the one given (at most one of socket_path, url, command), else
    ``$SBX_URL`` (+ ``$SBX_TOKEN``/``$SBX_TOKEN_FILE``, read at connect), else the socket path
    (``$SBX_SOCKET`` or the default). Raises ValueError for two at once, a command that is one string
    or empty, or a URL that is not ws:// or wss://."""
    env = os.environ if env is None else env
    given = [n for n, v in (("socket_path", socket_path), ("url", url), ("command", command)) if v]
    if len(given) > 1:
        raise ValueError(f"give one endpoint, not {' and '.join(given)}")
    if command is not None:
        if isinstance(command, (str, bytes)) or not command or not all(isinstance(a, str) for a in command):
            raise ValueError("command must be a non-empty list of strings (argv), e.g. ['docker', 'exec', '-i', 'box', 'sbx', 'bridge']")
        return Endpoint(command=list(command))
    if not socket_path and not url and env.get("SBX_URL"):
        url = env["SBX_URL"]
    if url:
        if not (url.startswith("ws://") or url.startswith("wss://")):
            raise ValueError(f"the supervisor's URL must be ws:// or wss://, not {url!r}")
        return Endpoint(url=url, token=token, token_file=token_file, ca_file=ca_file)
    return Endpoint(socket_path=socket_path or default_socket_path(env))


_C = TypeVar("_C", bound="EndpointClient")


class EndpointClient:
    """What Client and AsyncClient share: the endpoint (``socket_path``; ``url`` with ``token`` /
    ``token_file`` / ``ca_file``; ``command``; or a resolved ``endpoint``; none: ``$SBX_URL``, else
    the socket; see resolve_endpoint), ``client_name`` and the deadlines in seconds
    (``reconnect_seconds``, ``connect_timeout_seconds``, ``keepalive_seconds``, ``silence_seconds``).
    Raises ValueError as resolve_endpoint does."""

    def __init__(
        self, socket_path: Optional[str] = None, *, url: Optional[str] = None, token: Optional[str] = None, token_file: Optional[str] = None, ca_file: Optional[str] = None, command: Optional[Sequence[str]] = None,
        client_name: str = "sandbox-supervisor-python",
        reconnect_seconds: float = DEFAULT_RECONNECT_SECONDS,
        connect_timeout_seconds: float = DEFAULT_CONNECT_TIMEOUT_SECONDS,
        keepalive_seconds: float = DEFAULT_KEEPALIVE_SECONDS,
        silence_seconds: float = DEFAULT_SILENCE_SECONDS,
        endpoint: Optional[Endpoint] = None,
    ) -> None:
        self.endpoint = endpoint or resolve_endpoint(socket_path, url=url, token=token, token_file=token_file, ca_file=ca_file, command=command)
        #: The Unix socket's path, None over a URL or a command.
        self.socket_path = self.endpoint.socket_path
        self.client_name = client_name
        self.reconnect_seconds = reconnect_seconds
        self.connect_timeout_seconds = connect_timeout_seconds
        self.keepalive_seconds = keepalive_seconds
        self.silence_seconds = silence_seconds
        #: Once reached, a client may wait for the supervisor to come back.
        self._connected_once = False

    @classmethod
    def over_command(cls: "type[_C]", command: Sequence[str], **options: Any) -> _C:
        """A client whose transport is ``command``'s stdin/stdout (``sbx bridge`` through an exec channel)."""
        return cls(command=command, **options)

    @classmethod
    def over_url(cls: "type[_C]", url: str, token: Optional[str] = None, **options: Any) -> _C:
        """A client over a WebSocket URL (ws:// or wss://) with a bearer token."""
        return cls(url=url, token=token, **options)

    def _same_options(self) -> Dict[str, Any]:
        """The keyword arguments of a client to the same endpoint with the same options."""
        return {"endpoint": self.endpoint, "client_name": self.client_name, "reconnect_seconds": self.reconnect_seconds, "connect_timeout_seconds": self.connect_timeout_seconds, "keepalive_seconds": self.keepalive_seconds, "silence_seconds": self.silence_seconds}


class Retry:
    """What a client does when the link drops, for one request or stream (no I/O: the client sleeps the
    pause returned, time.sleep or asyncio.sleep, and tries again). The deadline is ``reconnect_seconds``
    from the first failure (a drop, or a reconnect that failed); ``progress()`` (a byte read) restarts it.
    A ``launch`` without invocation key is never resent (it may be running), nor is one with ``resend=False``."""

    def __init__(self, client: EndpointClient, method: str = "", params: Optional[Mapping[str, Any]] = None, *, resend: bool = True) -> None:
        self.client, self.method, self.resend = client, method, resend
        self.unkeyed_launch = method == "launch" and not (params or {}).get("invocation_key")
        self.give_up_at: Optional[float] = None  # time.monotonic() seconds

    def _too_late(self) -> bool:
        now = time.monotonic()
        if self.give_up_at is None:
            self.give_up_at = now + self.client.reconnect_seconds
        return now > self.give_up_at

    def progress(self) -> None:
        self.give_up_at = None

    def connect_failed(self, err: BaseException) -> float:
        """The pause after a failed connect. Raises err on the client's first connect (nothing listens:
        at once) and for a refusal not retryable; ConnectionError naming the endpoint past the deadline."""
        if not self.client._connected_once or (isinstance(err, SupervisorError) and not err.retryable):
            raise err
        if self._too_late():
            raise ConnectionError(f"lost the supervisor at {self.client.endpoint.describe()} and it did not come back within {self.client.reconnect_seconds:g} s ({err})") from err
        return RECONNECT_PAUSE_SECONDS

    def dropped(self, err: OSError) -> float:
        """The pause after a drop while the request (or stream) was pending, before it is sent again.
        Raises err when it is not resent, LaunchNotResent for a launch without invocation key,
        ConnectionError naming the endpoint and method past the deadline."""
        where = self.client.endpoint.describe()
        if not self.resend:
            raise err
        if self.unkeyed_launch:
            raise LaunchNotResent(f"the connection to the supervisor at {where} dropped after a launch without an invocation key was sent: it may be running, so it is not sent again (give it a key to make it safe to resend) ({err})") from err
        if self._too_late():
            raise ConnectionError(f"the supervisor at {where} dropped the connection on every attempt of {self.method} for {self.client.reconnect_seconds:g} s; gave up ({err})") from err
        return RECONNECT_PAUSE_SECONDS
