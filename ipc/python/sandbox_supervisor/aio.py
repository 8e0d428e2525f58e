"""The asyncio client: the same methods as Client (client.py), as coroutines, over the same
endpoints (the Unix socket, a WebSocket URL, a command: aio_transport.py) and deadlines. Requests on one
connection run concurrently (answers matched by id, as docs/reference/protocol.md allows); each
``read_output`` reads on a connection of its own, pulled, so a reader that does not iterate
holds the supervisor off. After a drop it reconnects for up to ``reconnect_seconds`` and resends;
``read_output`` resumes from the next byte not yet yielded. Same framing, types and errors.
"""
from __future__ import annotations

import asyncio
import os
from typing import Any, AsyncIterator, Callable, Dict, List, Mapping, Optional, Sequence, Set

from . import _protocol as P
from . import files as _files
from .aio_transport import AioTransport, open_aio_transport
from .client import _close_params, diff_checkpoints, restore_checkpoint
from .endpoint import Endpoint, EndpointClient, LaunchNotResent, TransportDead
from .errors import CallbackFailed, SupervisorError, guarded
from .types import Hello, OutputChunk, Receipt, Result, Session, SessionRef


class _Wire:
    """One transport with the hello done; frames read in order by whoever calls next_frame().

    While busy (``begin()``..``end()``: a call or a read is awaited) a ``ping`` goes every
    keepalive_seconds, and no frame for silence_seconds closes the transport: the awaited read
    then raises TransportDead (an OSError: the caller reconnects)."""

    def __init__(self, transport: AioTransport, endpoint: Endpoint, keepalive_seconds: float, silence_seconds: float) -> None:
        self.transport = transport
        self.endpoint = endpoint
        self.keepalive_seconds = keepalive_seconds
        self.silence_seconds = silence_seconds
        self.frames: List[Dict[str, Any]] = []
        self.next_id = 1
        self.hello: Hello
        self.busy = 0
        self.busy_since = self.last_rx = asyncio.get_running_loop().time()
        self.dead: Optional[TransportDead] = None
        self.watch: Optional["asyncio.Task[None]"] = None

    @classmethod
    async def open(cls, endpoint: Endpoint, client_name: str, *, connect_timeout_seconds: float, keepalive_seconds: float, silence_seconds: float, reaps: Set["asyncio.Task[None]"]) -> "_Wire":
        """Connect + hello within connect_timeout_seconds (else TransportDead, the transport closed)."""
        opened: List[AioTransport] = []

        async def handshake() -> "_Wire":
            transport = await open_aio_transport(endpoint, reaps)
            opened.append(transport)
            wire = cls(transport, endpoint, keepalive_seconds, silence_seconds)
            rid = await wire.send("hello", P.hello_params(client_name))
            frame = await wire.next_frame()
            while frame.get("id") != rid:
                frame = await wire.next_frame()
            r = P.answer(frame)
            wire.hello = Hello(version=r["version"], server=r["server"], instance=r["instance"], generation=r["generation"], max_frame_bytes=r.get("max_frame_bytes"))
            return wire

        try:
            wire = await asyncio.wait_for(handshake(), connect_timeout_seconds)
        except asyncio.TimeoutError:
            for t in opened:
                t.close(dead=True)
            await asyncio.gather(*list(reaps), return_exceptions=True)
            raise TransportDead(f"the supervisor over {endpoint.describe()} did not connect and hello within {connect_timeout_seconds:g} s") from None
        except BaseException:
            for t in opened:
                t.close(dead=True)
            raise
        wire.watch = asyncio.get_running_loop().create_task(wire._keepalive())
        return wire

    def begin(self) -> None:
        """A call or read is now awaited (the silence clock starts at the first)."""
        if self.busy == 0:
            self.busy_since = asyncio.get_running_loop().time()
        self.busy += 1

    def end(self) -> None:
        self.busy -= 1

    async def _keepalive(self) -> None:
        loop = asyncio.get_running_loop()
        last_ping = loop.time()
        while True:
            now = loop.time()
            if self.busy <= 0:
                last_ping = now
                await asyncio.sleep(min(self.keepalive_seconds or self.silence_seconds, self.silence_seconds))
                continue
            quiet_since = max(self.last_rx, self.busy_since)
            if now - quiet_since >= self.silence_seconds:
                self.dead = TransportDead(f"no byte from the supervisor over {self.endpoint.describe()} for {self.silence_seconds:g} s while a call was pending: the transport is dead (closed)")
                self.transport.close(dead=True)
                return
            if self.keepalive_seconds > 0 and now - max(last_ping, self.busy_since) >= self.keepalive_seconds:
                rid = self.next_id
                self.next_id += 1
                self.transport.ping({"id": rid, "method": "ping", "params": {}})
                last_ping = now
            wake = quiet_since + self.silence_seconds
            if self.keepalive_seconds > 0:
                wake = min(wake, max(last_ping, self.busy_since) + self.keepalive_seconds)
            await asyncio.sleep(max(wake - now, 0.01))

    async def send(self, method: str, params: Mapping[str, Any]) -> int:
        rid = self.next_id
        self.next_id += 1
        try:
            await self.transport.send({"id": rid, "method": method, "params": dict(params)})
        except OSError:
            if self.dead is not None:
                raise self.dead from None
            raise
        return rid

    async def next_frame(self) -> Dict[str, Any]:
        """The next frame; id 0 with an error (the connection refused) is raised; EOF is ConnectionLost;
        a transport found silent is TransportDead."""
        while not self.frames:
            try:
                frames = await self.transport.recv()
            except OSError:
                if self.dead is not None:
                    raise self.dead from None
                raise
            self.last_rx = asyncio.get_running_loop().time()
            self.frames.extend(frames)
        frame = self.frames.pop(0)
        if frame.get("id") == 0 and frame.get("error") is not None:
            raise SupervisorError.from_wire(frame["error"])
        return frame

    def close(self, dead: bool = False) -> None:
        if self.watch is not None:
            self.watch.cancel()
        self.transport.close(dead=dead or self.dead is not None)


class _Dispatcher:
    """A wire whose frames a background task routes to the request awaiting each id."""

    def __init__(self, wire: _Wire) -> None:
        self.wire = wire
        self.pending: Dict[int, "asyncio.Future[Dict[str, Any]]"] = {}
        self.failed: Optional[BaseException] = None
        self.task = asyncio.get_running_loop().create_task(self._route())

    async def call(self, method: str, params: Mapping[str, Any]) -> Dict[str, Any]:
        if self.failed is not None:
            raise self.failed
        fut: "asyncio.Future[Dict[str, Any]]" = asyncio.get_running_loop().create_future()
        rid = self.wire.next_id
        self.pending[rid] = fut
        self.wire.begin()
        try:
            await self.wire.send(method, params)
            return await fut
        finally:
            self.wire.end()
            self.pending.pop(rid, None)

    async def _route(self) -> None:
        try:
            while True:
                frame = await self.wire.next_frame()
                fut = self.pending.get(frame.get("id"))  # type: ignore[arg-type]
                if fut is not None and not fut.done():
                    fut.set_result(frame)
        except BaseException as err:  # EOF, reset, a bad frame, id 0: every waiting request gets it
            self.failed = err if isinstance(err, (OSError, SupervisorError)) else P.ConnectionLost(f"connection to the supervisor failed: {err!r}")
            for fut in self.pending.values():
                if not fut.done():
                    fut.set_exception(self.failed)

    def close(self) -> None:
        self.task.cancel()
        self.wire.close(dead=self.failed is not None)


class AsyncClient(EndpointClient):
    """An asyncio client: ``async with AsyncClient() as c: r = await c.run([...])``.

    Endpoint (``socket_path``, ``url`` + ``token``/``token_file``/``ca_file``, ``command``, or
    ``$SBX_URL``, else the socket) and deadlines (``connect_timeout_seconds``,
    ``keepalive_seconds``, ``silence_seconds``) as Client; ``reconnect_seconds``: after a
    drop, how long to keep trying. The first connection (``connect()`` or the first call)
    raises the socket's OSError at once when nothing listens. ``max_in_flight``: requests
    this client keeps on its connection at once (the supervisor's ``ipc.maxInFlight``, 64 by
    default); more wait their turn here, and one the supervisor still refuses as
    ``LIMIT_EXCEEDED`` (``limit: "in_flight"``, a lower limit configured there) is sent again
    after its ``retry_after_ms``: it was refused before it ran.
    """

    def __init__(self, socket_path: Optional[str] = None, *, max_in_flight: int = 64, **options: Any) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        super().__init__(socket_path, **options)
        self.max_in_flight = max_in_flight
        self._conn: Optional[_Dispatcher] = None
        self._lock: Optional[asyncio.Lock] = None
        self._slots: Optional[asyncio.Semaphore] = None
        #: Tasks that reap closed commands / close WebSockets; close() awaits them.
        self._reaps: Set["asyncio.Task[None]"] = set()

    def _sibling(self) -> "AsyncClient":
        c = AsyncClient(**self._same_options())
        c._connected_once = self._connected_once
        c._reaps = self._reaps
        return c

    async def _new_wire(self) -> _Wire:
        return await _Wire.open(self.endpoint, self.client_name, connect_timeout_seconds=self.connect_timeout_seconds, keepalive_seconds=self.keepalive_seconds, silence_seconds=self.silence_seconds, reaps=self._reaps)

    async def __aenter__(self) -> "AsyncClient":
        await self.connect()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def connect(self) -> Hello:
        """Connects now (hello done) and returns the hello."""
        return (await self._connection()).wire.hello

    async def close(self) -> None:
        """Closes the connection (a command transport is reaped before this returns); never ends a session."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        while self._reaps:
            await asyncio.gather(*list(self._reaps), return_exceptions=True)

    async def _open_wire(self, give_up_at: Optional[float] = None) -> _Wire:
        """A new connection: at once the first time; after a drop, retried until give_up_at (loop time; default reconnect_seconds from now)."""
        if not self._connected_once:
            wire = await self._new_wire()
            self._connected_once = True
            return wire
        if give_up_at is None:
            give_up_at = asyncio.get_running_loop().time() + self.reconnect_seconds
        while True:
            try:
                return await self._new_wire()
            except (OSError, SupervisorError) as err:
                if isinstance(err, SupervisorError) and not err.retryable:
                    raise
                if asyncio.get_running_loop().time() > give_up_at:
                    raise ConnectionError(f"lost the supervisor at {self.endpoint.describe()} and it did not come back within {self.reconnect_seconds:g} s ({err})") from err
                await asyncio.sleep(P.RECONNECT_PAUSE_SECONDS)

    async def _connection(self, give_up_at: Optional[float] = None) -> _Dispatcher:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._conn is not None and self._conn.failed is not None:
                self._conn.close()
                self._conn = None
            if self._conn is None:
                self._conn = _Dispatcher(await self._open_wire(give_up_at))
            return self._conn

    async def request(self, method: str, params: Optional[Mapping[str, Any]] = None, *, resend: bool = True) -> Any:
        """One request's result (see Client.request); concurrent calls share the connection, at most ``max_in_flight`` at once."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_in_flight)
        async with self._slots:
            return await self._request(method, params, resend)

    async def _request(self, method: str, params: Optional[Mapping[str, Any]], resend: bool) -> Any:
        params = params or {}
        unkeyed_launch = method == "launch" and not params.get("invocation_key")
        give_up_at: Optional[float] = None  # set at the request's first failure; a reconnect does not restart it
        while True:
            conn = await self._connection(give_up_at)
            try:
                return P.answer(await conn.call(method, params))
            except SupervisorError as err:
                if err.code == "LIMIT_EXCEEDED" and err.details.get("limit") == "in_flight" and conn.failed is None:
                    # Refused before it ran (the supervisor's limit is below ours): again, after its pause.
                    await asyncio.sleep(max(float(err.details.get("retry_after_ms", 100)), 1.0) / 1000)
                    continue
                if conn.failed is not None and self._conn is conn:  # a bad frame or a refusal: the connection is gone
                    conn.close()
                    self._conn = None
                raise
            except OSError as err:
                if self._conn is conn:
                    conn.close()
                    self._conn = None
                if not resend:
                    raise
                if unkeyed_launch:  # it may have reached the supervisor before the drop
                    raise LaunchNotResent(f"the connection to the supervisor at {self.endpoint.describe()} dropped after a launch without an invocation key was sent: it may be running, so it is not sent again (give it a key to make it safe to resend) ({err})") from err
                now = asyncio.get_running_loop().time()
                if give_up_at is None:
                    give_up_at = now + self.reconnect_seconds
                elif now > give_up_at:
                    raise P.gave_up(self.endpoint.describe(), method, self.reconnect_seconds, err) from err
                await asyncio.sleep(P.RECONNECT_PAUSE_SECONDS)

    async def launch(
        self,
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
    ) -> Session:
        """See Client.launch."""
        params = P.launch_params(argv, key=key, timeout_seconds=timeout_seconds, grace_seconds=grace_seconds, cwd=cwd, env=env, inherit_env=inherit_env, user=user, task=task, stdin=stdin, pty=pty, linger=linger, on_disconnect=on_disconnect, service=service, keep_after_close=keep_after_close, memory_max_bytes=memory_max_bytes, pids_max=pids_max, cpus=cpus)
        return Session.from_wire(await self.request("launch", params))

    async def run(
        self,
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
    ) -> Result:
        """See Client.run; stdout and stderr are read at once. ``on_stdout``/``on_stderr``
        (plain functions, called in the event loop with each piece in order): that stream is
        not kept, its Result field None. An exception from a callback, or run being cancelled,
        stops both readers and cancels the session; the callback's exception is raised."""
        session = await self.launch(argv, key=key, timeout_seconds=timeout_seconds, grace_seconds=grace_seconds, cwd=cwd, env=env, inherit_env=inherit_env, user=user, task=task, stdin=stdin is not None, linger=linger, memory_max_bytes=memory_max_bytes, pids_max=pids_max, cpus=cpus)

        async def feed() -> None:
            if stdin is None or session.state == "ended":
                return
            try:
                await self.write(session, bytes(stdin), offset=0, eof=True)
            except SupervisorError as err:
                if P.stdin_closed(err):
                    return  # the command stopped reading: not an error of run()
                raise

        async def collect(stream: str) -> Optional[bytes]:
            sink = on_stdout if stream == "stdout" else on_stderr
            if sink is None:
                return b"".join([c.data async for c in self.read_output(session, stream)])
            call = guarded(sink)
            async for c in self.read_output(session, stream):
                call(c.data)
            return None

        readers = [asyncio.ensure_future(collect("stdout")), asyncio.ensure_future(collect("stderr"))]
        try:
            await feed()
        except BaseException:
            # The rest of stdin will never come: cancel the session rather than leave it waiting for ever.
            for t in readers:
                t.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
            try:
                await self.cancel(session)
            except (OSError, SupervisorError):
                pass
            raise
        try:
            stdout, stderr = await asyncio.gather(*readers)
        except BaseException as err:
            # One reader failed (or run was cancelled): the other is stopped too, never left pending.
            for t in readers:
                t.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
            if isinstance(err, (CallbackFailed, asyncio.CancelledError)):
                # A callback raised, or the caller gave up on run: nothing reads the rest.
                try:
                    await self.cancel(session)
                except (OSError, SupervisorError):
                    pass
            if isinstance(err, CallbackFailed):
                raise err.error
            raise
        receipt = await self.wait(session)
        return Result(exit_code=P.exit_status_of(receipt), outcome=receipt["outcome"], stdout=stdout, stderr=stderr, receipt=receipt, session=session)

    async def _read_merged(self, session: SessionRef, cursor: int, follow: bool) -> AsyncIterator[OutputChunk]:
        from .client import Client

        blocking = Client(**self._same_options())
        blocking._connected_once = self._connected_once
        merged = blocking.read_output(session, "all", cursor, follow)
        loop = asyncio.get_running_loop()
        try:
            while True:
                chunk = await loop.run_in_executor(None, next, merged, None)
                if chunk is None:
                    return
                yield chunk
        finally:
            await loop.run_in_executor(None, merged.close)
            blocking.close()

    async def read_output(self, session: SessionRef, stream: str = "stdout", cursor: int = 0, follow: bool = True) -> AsyncIterator[OutputChunk]:
        """See Client.read_output: an async iterator of OutputChunks that resumes across a restart (no gap, no duplicate).

        ``stream="all"``: the merge of Client.read_output(session, "all"), run by a blocking
        Client to the same endpoint in a worker thread, one chunk per step (pulled, as there)."""
        if stream == "all":
            async for chunk in self._read_merged(session, cursor, follow):
                yield chunk
            return
        if stream not in P.STREAMS:
            raise SupervisorError("INVALID_ARGUMENT", f"stream must be one of all, {', '.join(P.STREAMS)}, not {stream!r}")
        sel = P.selector(session)
        reader = self._sibling()
        wire: Optional[_Wire] = None
        give_up_at: Optional[float] = None  # from the first failure since the last byte yielded
        try:
            while True:
                wire = await reader._open_wire(give_up_at)
                expected = cursor
                try:
                    rid = await wire.send("subscribe", {**sel, "stream": stream, "from": expected, "follow": follow})
                    answered = False
                    while True:
                        wire.begin()  # only while awaiting: a reader that does not iterate is not silence
                        try:
                            frame = await wire.next_frame()
                        finally:
                            wire.end()
                        if frame.get("id") != rid:
                            continue
                        if not answered:
                            P.answer(frame)
                            answered = True
                            continue
                        event = frame.get("event")
                        if event == "output":
                            data = P.new_output(stream, expected, frame.get("cursor"), bytes(frame["data"]))
                            if not data:
                                continue
                            at = expected
                            expected += len(data)
                            cursor = expected
                            give_up_at = None
                            yield OutputChunk(stream=stream, cursor=at, data=data)
                        elif event == "end":
                            return
                        elif frame.get("error") is not None:
                            raise SupervisorError.from_wire(frame["error"])
                except OSError as err:
                    now = asyncio.get_running_loop().time()
                    if give_up_at is None:
                        give_up_at = now + self.reconnect_seconds
                    elif now > give_up_at:
                        raise P.gave_up(self.endpoint.describe(), "subscribe", self.reconnect_seconds, err) from err
                    await asyncio.sleep(P.RECONNECT_PAUSE_SECONDS)
                finally:
                    wire.close()
                    wire = None
        finally:
            if wire is not None:
                wire.close()

    async def read(self, session: SessionRef, stream: str = "stdout", cursor: int = 0) -> bytes:
        """The bytes of one stream stored now, from ``cursor``."""
        return b"".join([c.data async for c in self.read_output(session, stream, cursor, follow=False)])

    async def wait(self, session: SessionRef) -> Receipt:
        """See Client.wait."""
        return await self.request("wait", P.selector(session))  # type: ignore[no-any-return]

    async def receipt(self, session: SessionRef) -> Dict[str, Any]:
        """See Client.receipt."""
        return await self.request("receipt", P.selector(session))  # type: ignore[no-any-return]

    async def cancel(self, session: SessionRef, grace_seconds: Optional[float] = None) -> Dict[str, Any]:
        """See Client.cancel."""
        params: Dict[str, Any] = dict(P.selector(session))
        if grace_seconds is not None:
            params["grace_ms"] = P.ms(grace_seconds, "grace_seconds")
        return await self.request("cancel", params)  # type: ignore[no-any-return]

    async def kill(self, session: SessionRef, signal: Any = "SIGKILL") -> Dict[str, Any]:
        """See Client.kill (never resent after a drop)."""
        sig = int(signal) if not isinstance(signal, str) else signal
        return await self.request("kill", {**P.selector(session), "signal": sig}, resend=False)  # type: ignore[no-any-return]

    async def write(self, session: SessionRef, data: bytes, *, offset: Optional[int] = None, eof: bool = False) -> Dict[str, Any]:
        """See Client.write (any amount, in pieces of at most 8 MiB)."""
        parts = P.pieces(bytes(data))
        result: Dict[str, Any] = {}
        for i, part in enumerate(parts):
            result = await self.request("write", P.write_params(session, part, offset, eof and i == len(parts) - 1))
            if offset is None:  # the first piece was appended: it began at the cursor less its length
                offset = result["cursor"] - len(part)
            offset += len(part)  # each piece's offset from data[0]'s, never the answered cursor (ahead after a resend)
        return result

    async def close_stdin(self, session: SessionRef) -> Dict[str, Any]:
        """EOF on the session's stdin."""
        return await self.write(session, b"", eof=True)

    async def resize(self, session: SessionRef, cols: int, rows: int) -> Dict[str, Any]:
        """See Client.resize."""
        return await self.request("resize", {**P.selector(session), "cols": cols, "rows": rows})  # type: ignore[no-any-return]

    async def changes(self, session: SessionRef) -> Dict[str, Any]:
        """See Client.changes."""
        return await self.request("changes", P.selector(session))  # type: ignore[no-any-return]

    async def resolve(self, session: SessionRef, reason: str, force: bool = False) -> Receipt:
        """See Client.resolve."""
        return await self.request("resolve", {**P.selector(session), "as_operator": True, "reason": reason, **({"force": True} if force else {})})  # type: ignore[no-any-return]

    async def ps(self, all: bool = False) -> List[Dict[str, Any]]:
        """See Client.ps."""
        return P.ps_rows(await self.request("ps", {"all": all}))

    async def status(self) -> Dict[str, Any]:
        """See Client.status."""
        return await self.request("status", {})  # type: ignore[no-any-return]

    async def gc(self) -> Dict[str, Any]:
        """See Client.gc."""
        return await self.request("gc", {})  # type: ignore[no-any-return]

    async def seal(self, task: str) -> Dict[str, Any]:
        """See Client.seal."""
        return await self.request("seal", {"task": task})  # type: ignore[no-any-return]

    async def seal_all(self) -> Dict[str, Any]:
        """See Client.seal_all."""
        return await self.request("seal", {})  # type: ignore[no-any-return]

    async def close_task(self, task: str, *, workspaces: Optional[Sequence[str]] = None, timeout_seconds: Optional[float] = None) -> Dict[str, Any]:
        """See Client.close_task."""
        return await self.request("close", _close_params(task, workspaces, timeout_seconds))  # type: ignore[no-any-return]

    async def close_supervisor(self, *, workspaces: Optional[Sequence[str]] = None, timeout_seconds: Optional[float] = None) -> Dict[str, Any]:
        """See Client.close_supervisor."""
        return await self.request("close", _close_params(None, workspaces, timeout_seconds))  # type: ignore[no-any-return]

    async def checkpoint(self, workspace: str, task: Optional[str] = None) -> Dict[str, Any]:
        """See Client.checkpoint."""
        params: Dict[str, Any] = {"workspace": os.path.abspath(workspace)}
        if task is not None:
            params["task"] = task
        return await self.request("checkpoint", params)  # type: ignore[no-any-return]

    async def restore(self, checkpoint_id: str, directory: str, *, store: Optional[str] = None, key_path: Optional[str] = None, same_owner: Optional[bool] = None, sbx: Optional[str] = None) -> Dict[str, Any]:
        """See Client.restore (runs ``sbx restore`` in a thread)."""
        state_dir = None if store is not None else (await self.status())["state_dir"]
        return await asyncio.get_running_loop().run_in_executor(
            None, lambda: restore_checkpoint(checkpoint_id, directory, state_dir=state_dir, store=store, key_path=key_path, same_owner=same_owner, sbx=sbx)
        )

    async def diff(self, a: Optional[str] = None, b: Optional[str] = None, *, task: Optional[str] = None, store: Optional[str] = None, key_path: Optional[str] = None, sbx: Optional[str] = None) -> Any:
        """See Client.diff (reads the store in a thread)."""
        state_dir = None if store is not None else (await self.status())["state_dir"]
        return await asyncio.get_running_loop().run_in_executor(None, lambda: diff_checkpoints(a, b, task=task, state_dir=state_dir, store=store, key_path=key_path, sbx=sbx))

    # -- files (sandbox_supervisor/files.py, docs/guide/files.md) -------------------------------------

    async def write_file(self, path: str, data: bytes, *, mode: Optional[int] = None, user: Optional[str] = None, key: Optional[str] = None, task: Optional[str] = None, timeout_seconds: Optional[float] = None) -> Dict[str, Any]:
        """See Client.write_file."""
        return await _files.awrite_file(self, path, data, mode=mode, user=user, key=key, task=task, timeout_seconds=timeout_seconds)

    async def read_file(self, path: str, *, user: Optional[str] = None, key: Optional[str] = None, task: Optional[str] = None, timeout_seconds: Optional[float] = None) -> bytes:
        """See Client.read_file."""
        return await _files.aread_file(self, path, user=user, key=key, task=task, timeout_seconds=timeout_seconds)

    async def upload(self, local_dir: str, remote_dir: str, *, user: Optional[str] = None, key: Optional[str] = None, task: Optional[str] = None, timeout_seconds: Optional[float] = None) -> Dict[str, Any]:
        """See Client.upload."""
        return await _files.aupload(self, local_dir, remote_dir, user=user, key=key, task=task, timeout_seconds=timeout_seconds)

    async def download(self, remote_dir: str, local_dir: str, *, user: Optional[str] = None, key: Optional[str] = None, task: Optional[str] = None, timeout_seconds: Optional[float] = None) -> Dict[str, Any]:
        """See Client.download."""
        return await _files.adownload(self, remote_dir, local_dir, user=user, key=key, task=task, timeout_seconds=timeout_seconds)
