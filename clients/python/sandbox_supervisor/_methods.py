"""The method table: each method both clients have, written once and without I/O as a generator of steps:
it yields Call (one request) or Own (a part whose I/O is each client's own), is sent each one's answer and
returns the method's result. ``blocking`` (client.py) and ``asynchronous`` (aio.py) make a client's method of
an entry: the same name, signature and docstring, each client's own transport.
"""
# mypy: no-warn-return-any
# (an entry returns the answer it is sent: the wire's decoded result, typed Any; its annotation says its shape)
from __future__ import annotations

import functools
import inspect
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Dict, Generator, List, Mapping, Optional, Sequence, TypeVar, Union, cast

from ._protocol import launch_params, ms, pieces, selector, write_params
from .checkpoints import diff_checkpoints, restore_checkpoint
from .types import Receipt, Result, Session, SessionRef

if TYPE_CHECKING:
    from typing_extensions import Concatenate, ParamSpec

    _P = ParamSpec("_P")

_T = TypeVar("_T")
_F = TypeVar("_F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Call:
    """One request: the wire method (ipc/methods.ts), its params, and whether it may be sent again after a drop (Client.request)."""

    method: str
    params: Dict[str, Any]
    resend: bool = True


class Own:
    """A part whose I/O is each client's own: the client's method ``name`` with ``args`` (Client calls it, AsyncClient awaits it):
    ``_offline`` (work off the connection: in place, or in a worker thread), ``_run_launched`` (run's streams)."""

    def __init__(self, name: str, *args: Any) -> None:
        self.name, self.args = name, args


#: An entry of the table: yields its steps, is sent each one's answer (a wire result is an object,
#: ipc/methods.ts; an Own's, what the client's method returned), returns the method's result.
Steps = Generator[Union[Call, Own], Any, _T]


def _method(method: _F, spec: Callable[..., Any]) -> _F:
    """method named, documented and signed as spec, with ``self`` first and returning what spec's Steps return."""
    functools.update_wrapper(method, spec)
    sig = inspect.signature(spec)
    returns = sig.return_annotation
    if isinstance(returns, str) and returns.startswith("Steps[") and returns.endswith("]"):
        returns = returns[len("Steps[") : -1]
    self_ = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    setattr(method, "__signature__", sig.replace(parameters=[self_, *sig.parameters.values()], return_annotation=returns))
    method.__annotations__ = {**spec.__annotations__, "return": returns}
    return method


def blocking(spec: Callable[_P, Steps[_T]]) -> Callable[Concatenate[Any, _P], _T]:
    """Client's method of an entry: each step by ``self.request`` or the client's own method."""

    def method(self: Any, *args: _P.args, **kwargs: _P.kwargs) -> Any:
        steps = spec(*args, **kwargs)
        answer: Any = None
        while True:
            try:
                step = steps.send(answer)
            except StopIteration as done:
                return done.value
            answer = self.request(step.method, step.params, resend=step.resend) if isinstance(step, Call) else getattr(self, step.name)(*step.args)

    return cast("Callable[Concatenate[Any, _P], _T]", _method(method, spec))  # self may be named too, as in any method


def asynchronous(spec: Callable[_P, Steps[_T]]) -> Callable[Concatenate[Any, _P], Coroutine[Any, Any, _T]]:
    """AsyncClient's method of an entry: each step awaited on ``self.request`` or the client's own method."""

    async def method(self: Any, *args: _P.args, **kwargs: _P.kwargs) -> Any:
        steps = spec(*args, **kwargs)
        answer: Any = None
        while True:
            try:
                step = steps.send(answer)
            except StopIteration as done:
                return done.value
            answer = await (self.request(step.method, step.params, resend=step.resend) if isinstance(step, Call) else getattr(self, step.name)(*step.args))

    return cast("Callable[Concatenate[Any, _P], Coroutine[Any, Any, _T]]", _method(method, spec))


# -- sessions -------------------------------------------------------------------------------------


def launch(
    argv: Sequence[str],
    *,
    key: Optional[str] = None,
    timeout_seconds: Optional[float] = None,
    grace_seconds: Optional[float] = None,
    cwd: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    inherit_env: bool = False,
    user: Optional[str] = None,
    task: Optional[str] = None,
    stdin: bool = False,
    pty: Optional[Mapping[str, int]] = None,
    linger: Optional[str] = None,
    on_disconnect: Optional[str] = None,
    service: bool = False,
    keep_after_close: bool = False,
    memory_max_bytes: Optional[int] = None,
    pids_max: Optional[int] = None,
    cpus: Optional[float] = None,
) -> Steps[Session]:
    """Launches argv and returns its Session at once (``existing`` True: ``key`` already had it).

    ``key``: the invocation key (default: a fresh one, made here so a resend after a drop
    is the same launch); ``timeout_seconds`` (None or 0: no deadline), ``grace_seconds``
    (TERM to KILL, default 10 s); ``cwd`` (default: this process's, absolute); ``env``
    (added to the session's clean base environment), ``inherit_env`` (this process's
    whole environment too); ``user`` (name or uid: the supervisor must be root);
    ``task`` (default "default"); ``stdin``: the session's stdin is written with
    ``write`` (else /dev/null); ``pty``: ``{"cols", "rows"}`` (one stream, "pty");
    ``linger``: "handoff"|"kill"|"wait" (default: the supervisor's, handoff: leftovers go on as
    a service); ``on_disconnect``: "continue"|"cancel"; ``service``: start a service (meant
    to keep running; a task's close ends it), ``keep_after_close``: one that outlives its
    task's close. Limits of the
    session's cgroup (docs/guide/limits.md): ``memory_max_bytes`` (memory.max, bytes; no swap
    past it), ``pids_max`` (pids.max, tasks), ``cpus`` (cpu.max, CPUs, at least 0.01).
    Errors: INVALID_ARGUMENT, KEY_CONFLICT, ADMISSION_SEALED, ADMISSION_DENIED, LIMIT_EXCEEDED,
    LIMIT_UNAVAILABLE (a limit whose controller this host's cgroup v2 lacks: nothing was run).
    """
    params = launch_params(argv, key=key, timeout_seconds=timeout_seconds, grace_seconds=grace_seconds, cwd=cwd, env=env, inherit_env=inherit_env, user=user, task=task, stdin=stdin, pty=pty, linger=linger, on_disconnect=on_disconnect, service=service, keep_after_close=keep_after_close, memory_max_bytes=memory_max_bytes, pids_max=pids_max, cpus=cpus)
    return Session.from_wire((yield Call("launch", params)))


def run(
    argv: Sequence[str],
    *,
    key: Optional[str] = None,
    timeout_seconds: Optional[float] = None,
    grace_seconds: Optional[float] = None,
    cwd: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    inherit_env: bool = False,
    user: Optional[str] = None,
    task: Optional[str] = None,
    stdin: Optional[bytes] = None,
    linger: Optional[str] = None,
    memory_max_bytes: Optional[int] = None,
    pids_max: Optional[int] = None,
    cpus: Optional[float] = None,
    on_stdout: Optional[Callable[[bytes], None]] = None,
    on_stderr: Optional[Callable[[bytes], None]] = None,
) -> Steps[Result]:
    """Launches argv (as ``launch``, ``inherit_env`` too), feeds it ``stdin`` (bytes, then EOF;
    None: /dev/null), reads stdout and stderr to their ends, and returns the Result once
    the receipt is durable.

    Both streams are followed at once (Client: on one connection of run's own). ``on_stdout`` /
    ``on_stderr``: called with each new piece of that stream's bytes as it arrives, in
    cursor order (Client: from this thread, inside run; AsyncClient: plain functions, called in the
    event loop); such a stream is not kept: the Result's ``stdout``/``stderr`` is None for it
    (memory stays at one piece, not the output).
    A retry with the same ``key`` after a crash returns the first run's Result (its stored
    output and receipt), never a second run. Errors as ``launch``; an exception from a
    callback (any, an OSError too) cancels the session and is raised as it was; so does
    AsyncClient's run being cancelled (the session is cancelled). A session that is unknown
    with no receipt on its way once its streams have ended (its exec shim died, its supervisor
    restarted without evidence of its end) raises SupervisorError SESSION_UNKNOWN (details:
    session_id, reason) rather than waiting for good; it is not cancelled, and its key is
    never run again.
    """
    session = yield from launch(argv, key=key, timeout_seconds=timeout_seconds, grace_seconds=grace_seconds, cwd=cwd, env=env, inherit_env=inherit_env, user=user, task=task, stdin=stdin is not None, linger=linger, memory_max_bytes=memory_max_bytes, pids_max=pids_max, cpus=cpus)
    return (yield Own("_run_launched", session, stdin, on_stdout, on_stderr))


def wait(session: SessionRef, unknown: str = "wait") -> Steps[Receipt]:
    """Waits until the session's receipt is durable and returns it (signed; see verify_receipt).

    ``unknown="fail"``: raises SupervisorError SESSION_UNKNOWN (details: session_id, reason) once
    the session is unknown with no receipt on its way, rather than waiting until evidence or an
    operator (``sbx resolve``) ends it (``"wait"``, the default)."""
    if unknown not in ("wait", "fail"):
        raise ValueError(f'unknown must be "wait" or "fail", not {unknown!r}')
    return (yield Call("wait", {**selector(session), **({"unknown": "fail"} if unknown == "fail" else {})}))


def receipt(session: SessionRef) -> Steps[Dict[str, Any]]:
    """``{"state", "receipt": receipt or None}`` now, without waiting."""
    return (yield Call("receipt", selector(session)))


def cancel(session: SessionRef, grace_seconds: Optional[float] = None) -> Steps[Dict[str, Any]]:
    """TERM to every process of the session, KILL after the grace (first cause wins): ``{"session_id", "state"}``."""
    grace = {} if grace_seconds is None else {"grace_ms": ms(grace_seconds, "grace_seconds")}
    return (yield Call("cancel", {**selector(session), **grace}))


def kill(session: SessionRef, signal: Any = "SIGKILL") -> Steps[Dict[str, Any]]:
    """Sends signal (a name like "SIGUSR1"/"USR1", or a number; default SIGKILL, as ``sbx kill``) to every process of the session: ``{"session_id", "signal", "pids"}``. Never resent after a drop."""
    if isinstance(signal, bool) or not isinstance(signal, (str, int)):
        # int(9.7) would be 9: a signal is a name or a whole number (an IntEnum such as signal.SIGUSR1 is one), never rounded.
        raise TypeError(f"signal must be a name or an int, not {type(signal).__name__} ({signal!r})")
    sig = signal if isinstance(signal, str) else int(signal)
    return (yield Call("kill", {**selector(session), "signal": sig}, resend=False))


def write(session: SessionRef, data: bytes, *, offset: Optional[int] = None, eof: bool = False) -> Steps[Dict[str, Any]]:
    """Writes stdin bytes (a session launched with ``stdin=True``), any amount: sent in
    requests of at most MAX_WRITE_BYTES (8 MiB) each, at their offsets, eof with the last.

    ``offset``: the stdin cursor of data[0] (bytes before the session's cursor are skipped,
    so a resend is exactly once; default: append); ``eof``: close stdin after them.
    Returns ``{"session_id", "cursor"}`` of the last piece once handed to the pipe or pty.
    Without ``offset`` the first piece is an append, which may have been written when the link
    drops before its answer: it is never resent (``ConnectionLost``; read the cursor from
    ``ps``/the session and write again with ``offset``); later pieces carry their offsets.
    """
    parts = pieces(bytes(data))
    result: Dict[str, Any] = {}
    for i, part in enumerate(parts):
        # An append (no offset yet) of bytes is never resent: they may be in the pipe already.
        result = yield Call("write", write_params(session, part, offset, eof and i == len(parts) - 1), resend=offset is not None or not part)
        if offset is None:  # the first piece was appended: it began at the cursor less its length
            offset = result["cursor"] - len(part)
        offset += len(part)  # each piece's offset from data[0]'s, never the answered cursor (ahead after a resend)
    return result


def close_stdin(session: SessionRef) -> Steps[Dict[str, Any]]:
    """EOF on the session's stdin."""
    return (yield from write(session, b"", eof=True))


def resize(session: SessionRef, cols: int, rows: int) -> Steps[Dict[str, Any]]:
    """A pty session's terminal size."""
    return (yield Call("resize", {**selector(session), "cols": cols, "rows": rows}))


def changes(session: SessionRef) -> Steps[Dict[str, Any]]:
    """What the session changed in each watched workspace (``ChangesResult``, ipc/protocol.ts)."""
    return (yield Call("changes", selector(session)))


def resolve(session: SessionRef, reason: str, force: bool = False) -> Steps[Receipt]:
    """Operator escape for a session stuck ``unknown``: a receipt with evidence ``operator_attested``;
    for an ended one whose death is ``cgroup_escaped``: the word that what left its cgroup is ended (its receipt, unchanged); refused while a destination still holds processes unless ``force``."""
    return (yield Call("resolve", {**selector(session), "as_operator": True, "reason": reason, **({"force": True} if force else {})}))


# -- the supervisor -------------------------------------------------------------------------------


def ps(all: bool = False) -> Steps[List[Dict[str, Any]]]:
    """Session summaries (``SessionSummary``): those not ended, or every one with ``all``."""
    return list((yield Call("ps", {"all": all}))["sessions"])


def status() -> Steps[Dict[str, Any]]:
    """Supervisor health (``StatusResult``): version, mode, sessions, admission, ``receipt_key`` {key_id, public_key_pem, path}, ..."""
    return (yield Call("status", {}))


def gc() -> Steps[Dict[str, Any]]:
    """Applies the retention policy now."""
    return (yield Call("gc", {}))


def seal(task: str) -> Steps[Dict[str, Any]]:
    """``sbx seal --task``: stops admission of new keys in one task for good (durable); other tasks go on."""
    return (yield Call("seal", {"task": task}))


def seal_all() -> Steps[Dict[str, Any]]:
    """``sbx seal --all``: stops admission of the whole sandbox, every task, for good (durable)."""
    return (yield Call("seal", {}))


def _close_params(task: Optional[str], workspaces: Optional[Sequence[str]], timeout_seconds: Optional[float]) -> Dict[str, Any]:
    params: Dict[str, Any] = {} if task is None else {"task": task}
    if workspaces is not None:
        params["workspaces"] = [os.path.abspath(w) for w in workspaces]
    if timeout_seconds is not None:
        params["timeout_ms"] = ms(timeout_seconds, "timeout_seconds")
    return params


def close_task(task: str, *, workspaces: Optional[Sequence[str]] = None, timeout_seconds: Optional[float] = None) -> Steps[Dict[str, Any]]:
    """``sbx close --task``: seals the task, settles its sessions (ending the rest after timeout_seconds, default 60),
    checkpoints each workspace (default: every watched one) and returns the signed task receipt
    (``complete``, ``conditions``, ``obligations``). Errors: TASK_CONFLICT, INVALID_ARGUMENT, SHUTTING_DOWN."""
    return (yield Call("close", _close_params(task, workspaces, timeout_seconds)))


def close_supervisor(*, workspaces: Optional[Sequence[str]] = None, timeout_seconds: Optional[float] = None) -> Steps[Dict[str, Any]]:
    """``sbx close --all``: seals the whole sandbox for good, settles every session, closes each task and returns the
    signed close receipt with each task's verdict (``complete``; not final when false: close again)."""
    return (yield Call("close", _close_params(None, workspaces, timeout_seconds)))


def checkpoint(workspace: str, task: Optional[str] = None) -> Steps[Dict[str, Any]]:
    """A checkpoint of a workspace directory, returned once published (``CheckpointResult``: ``checkpoint_id``, ``consistent``, ...).
    Errors: INVALID_ARGUMENT, CHECKPOINT_FAILED (retryable; ``details["stage"]``)."""
    return (yield Call("checkpoint", {"workspace": os.path.abspath(workspace), **({} if task is None else {"task": task})}))


def restore(checkpoint_id: str, directory: str, *, store: Optional[str] = None, key_path: Optional[str] = None, same_owner: Optional[bool] = None, sbx: Optional[str] = None) -> Steps[Dict[str, Any]]:
    """Materialises a published checkpoint into an empty or new directory and compares it (``sbx restore --json``).

    Restore reads the store directly (there is no wire method), from this supervisor's
    state dir (from ``status()``) unless ``store`` is given: a local store in Python
    (restore.py, no sbx needed: the same checks, result and refusals as sbx's); with
    ``sbx`` (a path), or an ``s3://`` store, by running the ``sbx`` bin (``sbx``, else
    ``$SBX_BIN``, else on PATH). AsyncClient does it in a worker thread. Returns sbx's result
    (``identical``, ``differences``, ``entries``, ``files``, ``bytes``, ...). Raises SupervisorError
    (RestoreError from Python, ``details["restore_error"]``; the code sbx names, else INTERNAL) when it could not restore.
    """
    state_dir = None if store is not None else (yield from status())["state_dir"]
    return (yield Own("_offline", lambda: restore_checkpoint(checkpoint_id, directory, state_dir=state_dir, store=store, key_path=key_path, same_owner=same_owner, sbx=sbx)))


def diff(a: Optional[str] = None, b: Optional[str] = None, *, task: Optional[str] = None, store: Optional[str] = None, key_path: Optional[str] = None, sbx: Optional[str] = None) -> Steps[Any]:
    """What changed from checkpoint ``a`` to ``b`` (``sbx diff A B --json``: a dict with ``from``,
    ``to``, ``added``, ``removed``, ``modified``, ``type_changed``, ``mode_changed``,
    ``owner_changed``, ``counts``, ``identical``), or with ``task`` (a and b None) its latest
    checkpoint against the one before it, one dict per workspace in a list (``sbx diff --task T
    --json``). Offline like restore (AsyncClient: in a worker thread): this supervisor's state dir (from ``status()``) unless
    ``store`` is given; a local store is read in Python (diff.py), an ``s3://`` store or
    ``sbx`` runs the sbx bin. Raises SupervisorError NOT_FOUND / INVALID_ARGUMENT."""
    state_dir = None if store is not None else (yield from status())["state_dir"]
    return (yield Own("_offline", lambda: diff_checkpoints(a, b, task=task, state_dir=state_dir, store=store, key_path=key_path, sbx=sbx)))


#: Every entry, in the clients' order: both have each as a method of the same name.
TABLE = (launch, run, wait, receipt, cancel, kill, write, close_stdin, resize, changes, resolve, ps, status, gc, seal, seal_all, close_task, close_supervisor, checkpoint, restore, diff)
