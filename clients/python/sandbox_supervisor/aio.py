"""The asyncio client: Client's methods as coroutines, over the same endpoints (aio_transport.py) and
deadlines. Requests on one connection run concurrently (answers matched by id, at most ``max_in_flight``);
each ``read_output`` reads on a connection of its own, pulled. The methods of the method table (_methods.py)
are made here with ``asynchronous``; what is its own is the I/O (run's streams, read_output).
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Callable, Dict, List, Mapping, Optional, Set

from . import _methods as M
from . import _protocol as P
from . import files as _files
from .aio_transport import AioTransport, open_aio_transport
from .endpoint import Endpoint, EndpointClient, Retry, TransportDead
from .errors import CallbackFailed, SupervisorError, guarded
from .types import Hello, OutputChunk, Result, Session, SessionRef


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
            wire.hello = Hello.from_wire(r)
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

    async def _open_wire(self, retry: Optional[Retry] = None) -> _Wire:
        """A new connection: at once the first time; after a drop, tried again as ``retry`` says (see Client._open)."""
        retry = retry or Retry(self)
        while True:
            try:
                wire = await self._new_wire()
            except (OSError, SupervisorError) as err:
                await asyncio.sleep(retry.connect_failed(err))
                continue
            self._connected_once = True
            return wire

    async def _connection(self, retry: Optional[Retry] = None) -> _Dispatcher:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._conn is not None and self._conn.failed is not None:
                self._conn.close()
                self._conn = None
            if self._conn is None:
                self._conn = _Dispatcher(await self._open_wire(retry))
            return self._conn

    async def request(self, method: str, params: Optional[Mapping[str, Any]] = None, *, resend: bool = True) -> Any:
        """One request's result (see Client.request); concurrent calls share the connection, at most ``max_in_flight`` at once."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_in_flight)
        async with self._slots:
            return await self._request(method, params, resend)

    async def _request(self, method: str, params: Optional[Mapping[str, Any]], resend: bool) -> Any:
        params = params or {}
        retry = Retry(self, method, params, resend=resend)
        while True:
            conn = await self._connection(retry)
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
                await asyncio.sleep(retry.dropped(err))

    # -- the method table (_methods.py): the same methods as Client's, over this transport -------

    launch = M.asynchronous(M.launch)
    run = M.asynchronous(M.run)
    wait = M.asynchronous(M.wait)
    receipt = M.asynchronous(M.receipt)
    cancel = M.asynchronous(M.cancel)
    kill = M.asynchronous(M.kill)
    write = M.asynchronous(M.write)
    close_stdin = M.asynchronous(M.close_stdin)
    resize = M.asynchronous(M.resize)
    changes = M.asynchronous(M.changes)
    resolve = M.asynchronous(M.resolve)
    ps = M.asynchronous(M.ps)
    status = M.asynchronous(M.status)
    gc = M.asynchronous(M.gc)
    seal = M.asynchronous(M.seal)
    seal_all = M.asynchronous(M.seal_all)
    close_task = M.asynchronous(M.close_task)
    close_supervisor = M.asynchronous(M.close_supervisor)
    checkpoint = M.asynchronous(M.checkpoint)
    restore = M.asynchronous(M.restore)
    diff = M.asynchronous(M.diff)

    # -- the parts whose I/O is this client's own -------------------------------------------------

    async def _offline(self, work: Callable[[], Any]) -> Any:
        """Work off the connection (a checkpoint store, the sbx bin: restore, diff), in a worker thread."""
        return await asyncio.get_running_loop().run_in_executor(None, work)

    async def _run_launched(self, session: Session, stdin: Optional[bytes], on_stdout: Optional[Callable[[bytes], None]], on_stderr: Optional[Callable[[bytes], None]]) -> Result:
        """run once launched: stdin fed while both streams are read at once; a callback's exception,
        or run being cancelled, stops both readers and cancels the session."""

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
        receipt = await self.wait(session, unknown="fail")
        return P.result_of(session, receipt, stdout, stderr)

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
        sub = P.Subscription(session, stream, cursor, follow)
        reader = self._sibling()
        retry = Retry(reader, "subscribe")  # from the first failure since the last byte yielded
        while True:
            wire = await reader._open_wire(retry)
            try:
                rid = await wire.send("subscribe", sub.params())
                while not sub.ended:
                    wire.begin()  # only while awaiting: a reader that does not iterate is not silence
                    try:
                        frame = await wire.next_frame()
                    finally:
                        wire.end()
                    new = sub.take(frame) if frame.get("id") == rid else None
                    if new is not None:
                        retry.progress()
                        yield new
                return
            except OSError as err:
                await asyncio.sleep(retry.dropped(err))
            finally:
                wire.close()

    async def read(self, session: SessionRef, stream: str = "stdout", cursor: int = 0) -> bytes:
        """The bytes of one stream stored now, from ``cursor``."""
        return b"".join([c.data async for c in self.read_output(session, stream, cursor, follow=False)])

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
