"""The client's shapes, shared by Client and AsyncClient: what launch and run return, a chunk of
output, and how a session is named. Wire records (receipts, ps rows, status, changes, checkpoint
and close results) stay plain dicts exactly as the supervisor sent them (ipc/protocol.ts,
docs/reference/protocol.md), so a receipt keeps every field its signature covers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Union

#: A receipt (docs/reference/contract.md "Receipt"), as decoded from msgpack: str keys, ints, str, bools, None, lists, dicts.
Receipt = Dict[str, Any]


@dataclass(frozen=True)
class InvocationKey:
    """Selects a session by its invocation key instead of its id: ``client.wait(InvocationKey("job-42"))``."""

    key: str


@dataclass(frozen=True)
class Session:
    """A launched session (``launch``'s answer). ``existing``: the key already had this session (a retry); ``state`` as then."""

    session_id: str
    invocation_key: str
    existing: bool
    state: str
    command_digest: str
    #: Sessions launched with stdin: the stdin bytes accepted so far (where a writer resumes).
    stdin_cursor: Optional[int] = None

    @classmethod
    def from_wire(cls, r: Dict[str, Any]) -> "Session":
        return cls(
            session_id=r["session_id"],
            invocation_key=r["invocation_key"],
            existing=bool(r["existing"]),
            state=r["state"],
            command_digest=r["command_digest"],
            stdin_cursor=r.get("stdin_cursor"),
        )


#: Where a method takes a session: a Session, its id, or InvocationKey(key).
SessionRef = Union[Session, str, InvocationKey]


@dataclass(frozen=True)
class OutputChunk:
    """Bytes ``[cursor, cursor + len(data))`` of one stream (``stdout``, ``stderr`` or ``pty``)."""

    stream: str
    cursor: int
    data: bytes


@dataclass(frozen=True)
class Result:
    """What ``run`` returns once the session's receipt is durable.

    ``exit_code``: sh/timeout(1)/docker conventions, as ``sbx run`` exits (C, 128+N for a
    signal, 124 timed out, 126/127 spawn failed, 125 owner lost); ``outcome``: the receipt's
    (exited, signaled, timed_out, cancelled, spawn_failed, owner_lost); ``stdout``/``stderr``:
    every stored byte of each stream, exactly (None for a stream run handed to a callback,
    ``on_stdout``/``on_stderr``, instead of keeping it); ``receipt``: the signed receipt.
    """

    exit_code: int
    outcome: str
    stdout: Optional[bytes]
    stderr: Optional[bytes]
    receipt: Receipt
    session: Session

    @property
    def session_id(self) -> str:
        return self.session.session_id

    @property
    def timed_out(self) -> bool:
        return self.outcome == "timed_out"


@dataclass(frozen=True)
class Hello:
    """The hello's answer: protocol ``version``, ``server`` version, ``instance`` and ``generation`` of the supervisor,
    and ``max_frame_bytes`` (its ipc.maxFrameBytes, bytes; None from older supervisors)."""

    version: int
    server: str
    instance: str
    generation: int
    max_frame_bytes: Optional[int] = None

    @classmethod
    def from_wire(cls, r: Dict[str, Any]) -> "Hello":
        return cls(version=r["version"], server=r["server"], instance=r["instance"], generation=r["generation"], max_frame_bytes=r.get("max_frame_bytes"))
