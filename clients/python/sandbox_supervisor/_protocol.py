"""What both clients do the same way, without I/O: the hello, params of launch and write from
Python arguments (seconds to ms, absent options absent on the wire), selectors, the answer of a
response frame, a stream read by cursor (Subscription), the exit status and Result of a run.
Methods and shapes: docs/reference/protocol.md; the methods themselves: _methods.py.
"""
from __future__ import annotations

import errno
import os
import signal as _signal
import secrets
from typing import Any, Dict, List, Mapping, Optional, Sequence

from .errors import SupervisorError
from .types import InvocationKey, OutputChunk, Receipt, Result, Session, SessionRef

#: Protocol versions this client speaks.
PROTOCOL_VERSIONS = [1]
STREAMS = ("stdout", "stderr", "pty")
#: How long a client keeps trying to reach a supervisor that went away, in seconds (as the TypeScript client).
DEFAULT_RECONNECT_SECONDS = 60.0
#: Pause between attempts to reconnect, in seconds.
RECONNECT_PAUSE_SECONDS = 0.2
#: Most stdin bytes one ``write`` request may carry (docs/reference/protocol.md ``write``, ipc/schemas.ts: 8 MiB).
MAX_WRITE_BYTES = 8 * 1024 * 1024


def hello_params(client_name: str) -> Dict[str, Any]:
    return {"versions": PROTOCOL_VERSIONS, "client": client_name}


def selector(session: SessionRef) -> Dict[str, str]:
    """The wire selector ``{session_id}`` or ``{invocation_key}`` of a Session, id or InvocationKey."""
    if isinstance(session, Session):
        return {"session_id": session.session_id}
    if isinstance(session, InvocationKey):
        return {"invocation_key": session.key}
    if isinstance(session, str):
        return {"session_id": session}
    raise TypeError(f"a session is a Session, a session id (str) or InvocationKey(key), not {type(session).__name__}")


def ms(seconds: Optional[float], what: str) -> Optional[int]:
    """Seconds (int or float) as whole ms for the wire; None stays absent."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        raise SupervisorError("INVALID_ARGUMENT", f"{what} must be a number of seconds >= 0, not {seconds!r}")
    return int(round(seconds * 1000))


def new_invocation_key() -> str:
    """A fresh invocation key in the supervisor's own format (as sbx makes one): ``auto-`` and 24 hex digits."""
    return "auto-" + secrets.token_hex(12)


def launch_params(
    argv: Sequence[str],
    *,
    key: Optional[str],
    timeout_seconds: Optional[float],
    grace_seconds: Optional[float],
    cwd: Optional[str],
    env: Optional[Mapping[str, str]],
    inherit_env: bool,
    user: Optional[str],
    task: Optional[str],
    stdin: bool,
    pty: Optional[Mapping[str, int]],
    linger: Optional[str],
    on_disconnect: Optional[str],
    service: bool = False,
    keep_after_close: bool = False,
    memory_max_bytes: Optional[int] = None,
    pids_max: Optional[int] = None,
    cpus: Optional[float] = None,
) -> Dict[str, Any]:
    """launch's params. A key is made here when none is given, so a resend after a drop finds the first launch's session.
    The limits (memory_max_bytes: bytes, pids_max: tasks, cpus: CPUs; docs/guide/limits.md) go as given; the supervisor checks them."""
    if isinstance(argv, (str, bytes)):
        raise SupervisorError("INVALID_ARGUMENT", "argv must be a list of strings, not one string")
    params: Dict[str, Any] = {
        "argv": list(argv),
        "cwd": os.path.abspath(cwd if cwd is not None else os.getcwd()),
        "invocation_key": key if key is not None else new_invocation_key(),
    }
    optional = {
        "env": dict(env) if env is not None else None,
        "inherit_env": dict(os.environ) if inherit_env else None,
        "timeout_ms": ms(timeout_seconds, "timeout_seconds"),
        "grace_ms": ms(grace_seconds, "grace_seconds"),
        "user": str(user) if user is not None else None,
        "task": task,
        "stdin": True if stdin else None,
        "pty": dict(pty) if pty is not None else None,
        "linger": linger,
        "on_disconnect": on_disconnect,
        "service": True if service else None,
        "keep_after_close": True if keep_after_close else None,
        "memory_max_bytes": memory_max_bytes,
        "pids_max": pids_max,
        "cpus": cpus,
    }
    params.update({k: v for k, v in optional.items() if v is not None})
    return params


def pieces(data: bytes) -> List[memoryview]:
    """data cut into the pieces ``write`` sends, each at most MAX_WRITE_BYTES (one empty piece for no data)."""
    view = memoryview(data)
    return [view[i : i + MAX_WRITE_BYTES] for i in range(0, len(data), MAX_WRITE_BYTES)] or [view]


def write_params(session: SessionRef, data: Any, offset: Optional[int], eof: bool) -> Dict[str, Any]:
    params: Dict[str, Any] = {**selector(session), "data": bytes(data)}
    if offset is not None:
        params["offset"] = offset
    if eof:
        params["eof"] = True
    return params


def stdin_closed(err: SupervisorError) -> bool:
    """A write refused because the command stopped reading stdin (EPIPE), ended, or stdin got its EOF already."""
    return err.code == "INVALID_ARGUMENT" and bool(err.details.get("stdin_closed"))


def new_output(stream: str, expected: int, cursor: Any, data: bytes) -> bytes:
    """The bytes of an output frame at ``cursor`` that come after ``expected`` (the next byte not
    yet yielded): all of them when it starts there, the tail of a frame that overlaps what was
    yielded (a resend), b"" when it holds nothing new. A frame that starts past ``expected``
    would lose bytes: SupervisorError INTERNAL naming both cursors, never skipped."""
    if isinstance(cursor, bool) or not isinstance(cursor, int) or cursor < 0:
        raise SupervisorError("INTERNAL", f"an output frame of {stream} has no valid cursor ({cursor!r})", {"stream": stream, "expected_cursor": expected})
    if cursor > expected:
        raise SupervisorError(
            "INTERNAL",
            f"output of {stream} has a gap: the next frame starts at cursor {cursor}, but the next byte not yet read is {expected} ({cursor - expected} bytes missing)",
            {"stream": stream, "expected_cursor": expected, "cursor": cursor},
        )
    return data[expected - cursor :] if cursor + len(data) > expected else b""


def answer(frame: Mapping[str, Any]) -> Any:
    """The result of a response frame, or its error raised as SupervisorError."""
    if frame.get("error") is not None:
        raise SupervisorError.from_wire(frame["error"])
    return frame.get("result")


def exit_status_of(receipt: Receipt) -> int:
    """The status ``sbx run``/``sbx wait`` exit with (ipc/protocol.ts exitStatusOf; docs/reference/exit-statuses.md)."""
    outcome = receipt.get("outcome")
    exit_ = receipt.get("exit") or {}
    code = exit_.get("code")
    # A service of leftovers has no leader, so no exit status of its own: 0 once it ended with proof.
    if (receipt.get("service") or {}).get("handed_off_from") and code is None and not exit_.get("signal") and outcome in ("exited", "cancelled"):
        return 0
    if outcome in ("exited", "spawn_failed"):
        return code if code is not None else 125
    if outcome == "timed_out":
        return 124
    if outcome == "owner_lost":
        return 125
    if outcome in ("signaled", "cancelled"):
        sig = exit_.get("signal")
        if sig:
            try:
                return 128 + int(_signal.Signals[sig])
            except KeyError:
                pass
        return code if code is not None else 125
    return 125


def result_of(session: Session, receipt: Receipt, stdout: Optional[bytes], stderr: Optional[bytes]) -> Result:
    """run's Result once the receipt is durable."""
    return Result(exit_code=exit_status_of(receipt), outcome=receipt["outcome"], stdout=stdout, stderr=stderr, receipt=receipt, session=session)


class Subscription:
    """One stream read by cursor (``subscribe``), without I/O: its params from the next byte not yet
    handed on, then each frame of it in turn: the answer, ``output`` (only its new bytes: new_output),
    ``end`` (``ended``) or an error. After a drop, send params() again on the new connection."""

    def __init__(self, session: SessionRef, stream: str, cursor: int, follow: bool) -> None:
        if stream not in STREAMS:
            raise SupervisorError("INVALID_ARGUMENT", f"stream must be one of all, {', '.join(STREAMS)}, not {stream!r}")
        self.selector = selector(session)
        self.stream, self.cursor, self.follow = stream, cursor, follow
        self.answered = self.ended = False

    def params(self) -> Dict[str, Any]:
        """subscribe's params (a new subscription: its answer comes first again)."""
        self.answered = False
        return {**self.selector, "stream": self.stream, "from": self.cursor, "follow": self.follow}

    def take(self, frame: Mapping[str, Any]) -> Optional[OutputChunk]:
        """The new bytes of a frame of this subscription (None: nothing new); raises its error as SupervisorError."""
        if not self.answered:
            answer(frame)
            self.answered = True
            return None
        event = frame.get("event")
        if event == "output":
            data = new_output(self.stream, self.cursor, frame.get("cursor"), bytes(frame["data"]))
            if data:
                self.cursor += len(data)
                return OutputChunk(stream=self.stream, cursor=self.cursor - len(data), data=data)
        elif event == "end":
            self.ended = True
        elif frame.get("error") is not None:
            raise SupervisorError.from_wire(frame["error"])
        return None


def connect_error(err: OSError, socket_path: str) -> OSError:
    """A failed connect as the same OSError type, its message naming the socket and what to check."""
    if isinstance(err, FileNotFoundError):
        return FileNotFoundError(errno.ENOENT, f"no supervisor socket at {socket_path}: is the supervisor running (`sbx status`), and does $SBX_SOCKET name its socket?", socket_path)
    if isinstance(err, ConnectionRefusedError):
        return ConnectionRefusedError(errno.ECONNREFUSED, f"nothing accepts connections on the supervisor socket at {socket_path} (a stale socket: the supervisor is not running; `sbx status`)", socket_path)
    if isinstance(err, PermissionError):
        return PermissionError(errno.EACCES, f"no permission to connect to the supervisor socket at {socket_path} (see ipc.allowUids / ipc.socketGroup)", socket_path)
    return err


class ConnectionLost(ConnectionResetError):
    """The connection to the supervisor closed (EOF or a reset) before the answer came."""
