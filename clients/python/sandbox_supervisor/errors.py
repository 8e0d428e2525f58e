"""Stable error codes of the wire protocol (docs/reference/contract.md "Error codes", ipc/errors.ts) and the one
error class every answer's error becomes. Owns the code table as Python sees it; not the
transport: a connection that fails raises the socket's own ``OSError`` (``ConnectionError``,
``FileNotFoundError``), as the TypeScript client does.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional

#: code -> retryable, exactly ipc/errors.ts ERROR_CODES (extend, never rename or reuse).
ERROR_CODES: Dict[str, bool] = {
    "INVALID_ARGUMENT": False,
    "UNSUPPORTED_VERSION": False,
    "FRAME_TOO_LARGE": False,
    "UNAUTHORIZED": False,
    "SESSION_NOT_FOUND": False,
    "KEY_CONFLICT": False,
    "CURSOR_OUT_OF_RANGE": False,
    "SPAWN_FAILED": False,
    "ADMISSION_SEALED": False,
    "ADMISSION_DENIED": True,
    "LIMIT_EXCEEDED": True,
    "SHUTTING_DOWN": True,
    "INTERNAL": False,
    "OUTPUT_REMOVED": False,
    "CHECKPOINT_FAILED": True,
    "TASK_CONFLICT": False,
    # files (docs/guide/files.md)
    "SYMLINK_REFUSED": False,
    "NOT_FOUND": False,
    "NOT_A_DIRECTORY": False,
    "IS_A_DIRECTORY": False,
    "NOT_A_REGULAR_FILE": False,
    "SIZE_MISMATCH": False,
    "PERMISSION_DENIED": False,
    "FILE_ERROR": False,
    "OUTPUT_QUOTA_EXCEEDED": False,
    # limits (docs/guide/limits.md): the controller of an asked-for limit is not in cgroup v2 here
    "LIMIT_UNAVAILABLE": False,
    # a wait with unknown="fail" (run()): the session is unknown with no receipt on its way
    "SESSION_UNKNOWN": False,
}


class SupervisorError(Exception):
    """An error the supervisor answered (or a frame it sent that breaks the protocol).

    ``code``: one of ERROR_CODES; ``retryable``: whether the same request may succeed later
    (e.g. ADMISSION_DENIED with ``details["retry_after_ms"]``); ``details``: the wire's
    ``details`` map or ``{}``.
    """

    code: str
    retryable: bool
    details: Dict[str, Any]

    def __init__(self, code: str, message: str, details: Optional[Mapping[str, Any]] = None, retryable: Optional[bool] = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retryable = ERROR_CODES.get(code, False) if retryable is None else retryable
        self.details = dict(details or {})

    @classmethod
    def from_wire(cls, wire: Any) -> "SupervisorError":
        """The error of a response frame ``{code, message, retryable, details?}``; ``retryable`` as
        the wire says (else the table's). A code this client does not know (a newer supervisor's)
        becomes INTERNAL with the code kept in the message and in ``details["unknown_code"]``."""
        if not isinstance(wire, Mapping):
            return cls("INTERNAL", f"malformed error from the supervisor: {wire!r}")
        code = str(wire.get("code"))
        message = str(wire.get("message", ""))
        details = dict(wire["details"]) if isinstance(wire.get("details"), Mapping) else {}
        retryable = wire.get("retryable") if isinstance(wire.get("retryable"), bool) else None
        if code not in ERROR_CODES:
            return cls("INTERNAL", f"{code} (an error code this client does not know): {message}", {**details, "unknown_code": code}, retryable)
        return cls(code, message, details, retryable)


class CallbackFailed(Exception):
    """Private carrier of an exception a ``run()`` output callback raised (``error``): neither an
    OSError (taken for a dropped connection) nor a SupervisorError, so ``run()`` tells it from
    the transport's failures, cancels the session, and raises ``error`` itself."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(repr(error))
        self.error = error


def guarded(callback: Callable[[bytes], None]) -> Callable[[bytes], None]:
    """``callback``, its exceptions carried out as CallbackFailed."""

    def call(data: bytes) -> None:
        try:
            callback(data)
        except BaseException as err:
            raise CallbackFailed(err) from err

    return call
