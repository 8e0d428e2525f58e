"""The blocking client: a connection to the supervisor (its Unix socket, a WebSocket URL or a command's
stdin/stdout: endpoint.py, transport.py; hello first), one request at a time by id with keepalive pings and a
silence bound, and output read by cursor on connections of its own. Owns no process and no session. The methods
of the method table (_methods.py) are made here with ``blocking``; what is its own is the I/O (run's streams, read_output).
"""
from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Deque, Dict, Generator, Iterator, List, Mapping, Optional, Sequence, Set

from . import _methods as M
from . import _protocol as P
from . import files as _files
from .checkpoints import diff_checkpoints as diff_checkpoints, restore_checkpoint as restore_checkpoint  # importable from here as before
from .errors import CallbackFailed, SupervisorError, guarded
from .endpoint import DEFAULT_CONNECT_TIMEOUT_SECONDS, DEFAULT_KEEPALIVE_SECONDS, DEFAULT_SILENCE_SECONDS, Endpoint, EndpointClient, Retry, TransportDead
from .transport import open_transport
from .types import Hello, OutputChunk, Result, Session, SessionRef


class _Connection:
    """One transport with the hello done; frames of other ids than the one awaited are kept for their turn.

    While a request is awaited a ``ping`` goes every keepalive_seconds; no byte for silence_seconds
    closes the transport and raises TransportDead (an OSError: the caller reconnects)."""

    def __init__(self, endpoint: Endpoint, client_name: str, connect_timeout_seconds: float = DEFAULT_CONNECT_TIMEOUT_SECONDS, keepalive_seconds: float = DEFAULT_KEEPALIVE_SECONDS, silence_seconds: float = DEFAULT_SILENCE_SECONDS) -> None:
        self.endpoint = endpoint
        self.keepalive_seconds = keepalive_seconds
        self.silence_seconds = silence_seconds
        deadline = time.monotonic() + connect_timeout_seconds
        self.transport = open_transport(endpoint, deadline, silence_seconds)
        self.held: Dict[int, Deque[Dict[str, Any]]] = {}
        self.pings: Set[int] = set()
        self.next_id = 1
        self.last_rx = time.monotonic()
        #: Set once a frame broke the protocol, the supervisor refused the connection or the transport died: it is unusable.
        self.broken = False
        try:
            r = P.answer(self.recv(self.send("hello", P.hello_params(client_name)), deadline=deadline, what=f"connect and hello within {connect_timeout_seconds:g} s"))
        except BaseException:
            self.close(dead=True)
            raise
        self.hello = Hello.from_wire(r)

    def send(self, method: str, params: Mapping[str, Any]) -> int:
        rid = self.next_id
        self.next_id += 1
        try:
            self.transport.send({"id": rid, "method": method, "params": dict(params)})
        except OSError:
            self.broken = True
            raise
        return rid

    def recv(self, rid: int, *, deadline: Optional[float] = None, what: str = "") -> Dict[str, Any]:
        """The next frame for request rid (its answer, or one of its events). With ``deadline``
        (the hello): TransportDead past it, no pings; else pings while waiting and TransportDead
        after silence_seconds without a byte."""
        return self.recv_any((rid,), deadline=deadline, what=what)[1]

    def recv_any(self, rids: Sequence[int], *, deadline: Optional[float] = None, what: str = "") -> "tuple[int, Dict[str, Any]]":
        """``(rid, frame)``: the next frame for any of rids (requests pending at once on this
        connection, e.g. the subscriptions of two streams), the first rid's first when several
        are held. Deadlines as ``recv``."""
        waiting_since = last_ping = time.monotonic()
        while True:
            for rid in rids:
                queue = self.held.get(rid)
                if queue:
                    return rid, queue.popleft()
            now = time.monotonic()
            if deadline is not None:
                wake = deadline
                if now >= deadline:
                    self._die()
                    raise TransportDead(f"the supervisor over {self.endpoint.describe()} did not {what}")
            else:
                quiet_since = max(self.last_rx, waiting_since)
                if now - quiet_since >= self.silence_seconds:
                    self._die()
                    raise TransportDead(f"no byte from the supervisor over {self.endpoint.describe()} for {self.silence_seconds:g} s while a call was pending: the transport is dead (closed)")
                if self.keepalive_seconds > 0 and now - last_ping >= self.keepalive_seconds:
                    self.pings.add(self.send("ping", {}))
                    last_ping = now
                wake = quiet_since + self.silence_seconds
                if self.keepalive_seconds > 0:
                    wake = min(wake, last_ping + self.keepalive_seconds)
            try:
                frames = self.transport.recv(wake - now)
            except SupervisorError:
                self.broken = True
                raise
            except OSError:
                self.broken = True
                raise
            if frames is not None:
                self._hold(frames)

    def _hold(self, frames: List[Dict[str, Any]]) -> None:
        """Keeps each frame for its request; raises the supervisor's refusal of the whole connection (id 0)."""
        self.last_rx = time.monotonic()
        for frame in frames:
            fid = frame.get("id")
            if fid == 0 and frame.get("error") is not None:  # id 0 is never a request of ours
                self.broken = True
                raise SupervisorError.from_wire(frame["error"])
            if fid in self.pings:
                self.pings.discard(fid)  # a keepalive's answer (an error from a supervisor without ping: as good)
            elif isinstance(fid, int):
                self.held.setdefault(fid, deque()).append(frame)

    def alive(self) -> bool:
        """Takes what arrived while idle without waiting (a WebSocket's pings are answered here) and
        says whether the transport is still open: one found closed before a request is sent makes
        the request's reconnect unambiguous (it never reached the supervisor on this one)."""
        if self.broken:
            return False
        try:
            while True:
                frames = self.transport.recv(0)
                if frames is None:
                    return True
                self._hold(frames)
        except (OSError, SupervisorError):
            self.broken = True
            return False

    def _die(self) -> None:
        self.broken = True
        self.close(dead=True)

    def forget(self, rid: int) -> None:
        self.held.pop(rid, None)

    def close(self, dead: bool = False) -> None:
        try:
            self.transport.close(dead=dead or self.broken)
        except OSError:
            pass


class Client(EndpointClient):
    """A blocking client; one request at a time (use AsyncClient for many at once, or several Clients).

    The endpoint, one of: ``socket_path`` (the Unix socket); ``url`` (ws:// or wss://) with
    ``token`` or ``token_file`` (else ``$SBX_TOKEN``, ``$SBX_TOKEN_FILE``) and ``ca_file`` (wss:
    the CA to trust); ``command`` (argv spawned for each connection, its stdin/stdout the
    transport, e.g. ``["docker", "exec", "-i", "box", "sbx", "bridge"]``; killed by pid and
    reaped on close). None given: ``$SBX_URL`` (with ``$SBX_TOKEN``/``$SBX_TOKEN_FILE``), else
    ``$SBX_SOCKET`` or the default path. ``reconnect_seconds``: after a drop, how long to keep trying
    to reach the supervisor again. Deadlines: ``connect_timeout_seconds`` for connect + hello;
    while a call is pending a ``ping`` every ``keepalive_seconds``, and no byte for
    ``silence_seconds`` closes the transport (TransportDead, a TimeoutError) and reconnects.
    Use as a context manager, or call ``close()`` (the connection only: sessions go on).
    """

    def __init__(self, socket_path: Optional[str] = None, **options: Any) -> None:
        super().__init__(socket_path, **options)
        self._conn: Optional[_Connection] = None

    def _sibling(self) -> "Client":
        """A client to the same endpoint with the same options (read_output's own connection)."""
        c = Client(**self._same_options())
        c._connected_once = self._connected_once  # once reached, it may wait for the supervisor to come back
        return c

    def _new_connection(self) -> _Connection:
        return _Connection(self.endpoint, self.client_name, self.connect_timeout_seconds, self.keepalive_seconds, self.silence_seconds)

    # -- connection ---------------------------------------------------------------------------

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connection (a later call makes a new one); never ends a session."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    @property
    def hello(self) -> Hello:
        """The hello of the current connection (connecting if there is none)."""
        return self._connection().hello

    def _open(self, retry: Optional[Retry] = None) -> _Connection:
        """A new connection: at once the first time; after a drop, tried again as ``retry`` says
        (default: for reconnect_seconds from the first failure)."""
        retry = retry or Retry(self)
        while True:
            try:
                conn = self._new_connection()
            except (OSError, SupervisorError) as err:
                time.sleep(retry.connect_failed(err))
                continue
            self._connected_once = True
            return conn

    def _connection(self, retry: Optional[Retry] = None) -> _Connection:
        if self._conn is not None and not self._conn.alive():
            self.close()  # closed while idle (the supervisor restarted, a server ping went unanswered): a new one
        if self._conn is None:
            self._conn = self._open(retry)
        return self._conn

    def request(self, method: str, params: Optional[Mapping[str, Any]] = None, *, resend: bool = True) -> Any:
        """Sends one request and returns its result (docs/reference/protocol.md names every method).

        After a dropped connection the request is sent again on a new one when ``resend``
        (every method here is safe to resend but ``kill`` and a ``write`` without offset), pausing between attempts, for up
        to reconnect_seconds from its first failure (a supervisor that drops the connection on
        every attempt is not retried for ever): then ConnectionError naming the endpoint.
        A ``launch`` without ``invocation_key`` is never resent once it may have reached the
        supervisor: LaunchNotResent (a ConnectionError) instead.
        Raises SupervisorError for the supervisor's answer, OSError when it cannot be reached,
        TransportDead (TimeoutError) when the endpoint stays silent through reconnect_seconds.
        """
        params = params or {}
        retry = Retry(self, method, params, resend=resend)
        while True:
            conn = self._connection(retry)
            try:
                rid = conn.send(method, params)
                frame = conn.recv(rid)
                conn.forget(rid)
                return P.answer(frame)
            except OSError as err:
                self.close()
                time.sleep(retry.dropped(err))
            finally:
                if self._conn is not None and self._conn.broken:
                    self.close()

    # -- the method table (_methods.py): the same methods as AsyncClient's, over this transport ---

    launch = M.blocking(M.launch)
    run = M.blocking(M.run)
    wait = M.blocking(M.wait)
    receipt = M.blocking(M.receipt)
    cancel = M.blocking(M.cancel)
    kill = M.blocking(M.kill)
    write = M.blocking(M.write)
    close_stdin = M.blocking(M.close_stdin)
    resize = M.blocking(M.resize)
    changes = M.blocking(M.changes)
    resolve = M.blocking(M.resolve)
    ps = M.blocking(M.ps)
    status = M.blocking(M.status)
    gc = M.blocking(M.gc)
    seal = M.blocking(M.seal)
    seal_all = M.blocking(M.seal_all)
    close_task = M.blocking(M.close_task)
    close_supervisor = M.blocking(M.close_supervisor)
    checkpoint = M.blocking(M.checkpoint)
    restore = M.blocking(M.restore)
    diff = M.blocking(M.diff)

    # -- the parts whose I/O is this client's own -------------------------------------------------

    def _offline(self, work: Callable[[], Any]) -> Any:
        """Work off the connection (a checkpoint store, the sbx bin: restore, diff), in place."""
        return work()

    def _run_launched(self, session: Session, stdin: Optional[bytes], on_stdout: Optional[Callable[[bytes], None]], on_stderr: Optional[Callable[[bytes], None]]) -> Result:
        """run once launched: stdin fed, then both streams followed at once on one connection of their own
        (_follow), each new piece to its callback or kept, then the receipt."""
        if stdin is not None and session.state != "ended":
            self._feed_stdin(session, bytes(stdin))
        kept: Dict[str, List[bytes]] = {"stdout": [], "stderr": []}
        sinks: Dict[str, Callable[[bytes], None]] = {
            "stdout": guarded(on_stdout) if on_stdout else kept["stdout"].append,
            "stderr": guarded(on_stderr) if on_stderr else kept["stderr"].append,
        }
        chunks = self._follow([P.Subscription(session, stream, 0, True) for stream in sinks])
        try:
            for chunk in chunks:
                sinks[chunk.stream](chunk.data)
        except CallbackFailed as failed:
            # Whatever a callback raised (an OSError too, not taken for a drop): nothing reads the rest.
            self._cancel_quietly(session)
            raise failed.error
        except (SupervisorError, OSError):
            raise
        except BaseException:
            self._cancel_quietly(session)  # KeyboardInterrupt and the like: nothing reads the rest
            raise
        finally:
            chunks.close()
        receipt = self.wait(session, unknown="fail")
        stdout = None if on_stdout else b"".join(kept["stdout"])
        stderr = None if on_stderr else b"".join(kept["stderr"])
        return P.result_of(session, receipt, stdout, stderr)

    def _feed_stdin(self, session: Session, data: bytes) -> None:
        """All of data then EOF, in pieces of at most P.MAX_WRITE_BYTES. A command that stops
        reading (stdin closed) is not an error of run(); any other failure cancels the session
        (it would wait for the rest of its stdin for ever) and is raised."""
        try:
            self.write(session, data, offset=0, eof=True)
        except SupervisorError as err:
            if P.stdin_closed(err):
                return
            self._cancel_quietly(session)
            raise
        except BaseException:
            self._cancel_quietly(session)
            raise

    def _cancel_quietly(self, session: Session) -> None:
        try:
            self.cancel(session)
        except (OSError, SupervisorError):
            pass  # the supervisor is gone too: nothing more to do from here

    def read_output(self, session: SessionRef, stream: str = "stdout", cursor: int = 0, follow: bool = True) -> Iterator[OutputChunk]:
        """The bytes of one stream from ``cursor`` as OutputChunks, in order, on a connection of its own.

        ``stream="all"``: stdout and stderr merged in arrival order, as ``sbx logs --stream
        all`` (each chunk one read of its own stream, ``chunk.stream`` saying which; cursor 0
        only): see ``_read_merged``.

        ``follow``: until the stream is final (drained to EOF after the session ended); else
        the bytes stored now. Pulled: while you do not iterate, nothing is read (the
        supervisor holds off). A dropped connection (a supervisor restart) is re-made for up
        to reconnect_seconds and the stream resumed from the next byte not yet yielded: no
        gap, no duplicate: a frame overlapping bytes already yielded (a resend) is trimmed
        to its new bytes; one past the next byte (a gap) raises SupervisorError INTERNAL
        naming both cursors, never skipped. Errors: SESSION_NOT_FOUND, CURSOR_OUT_OF_RANGE (past the end,
        without follow), OUTPUT_REMOVED (retention removed it), INVALID_ARGUMENT.
        """
        if stream == "all":
            if cursor != 0:
                raise SupervisorError("INVALID_ARGUMENT", "read_output(stream='all') starts at cursor 0 (a cursor is one stream's)")
            yield from self._read_merged(session, follow)
            return
        yield from self._follow([P.Subscription(session, stream, cursor, follow)])

    def _follow(self, subs: List[P.Subscription]) -> Generator[OutputChunk, None, None]:
        """The new bytes of each subscription as they come, all subscribed at once on one connection of
        its own; pulled: nothing is read while not iterated. A drop is re-made for up to reconnect_seconds
        and each stream resumed from its next byte not yet yielded (no gap, no duplicate)."""
        reader = self._sibling()
        retry = Retry(reader, "subscribe")  # from the first failure since the last byte yielded
        try:
            while not all(sub.ended for sub in subs):
                conn = reader._connection(retry)
                try:
                    rids = {conn.send("subscribe", sub.params()): sub for sub in subs if not sub.ended}
                    while rids:
                        rid, frame = conn.recv_any(tuple(rids))
                        chunk = rids[rid].take(frame)
                        if chunk is not None:
                            retry.progress()
                            yield chunk
                        elif rids[rid].ended:
                            del rids[rid]
                            conn.forget(rid)
                except OSError as err:
                    reader.close()
                    time.sleep(retry.dropped(err))
                finally:
                    if reader._conn is not None and reader._conn.broken:
                        reader.close()
        finally:
            reader.close()

    def _read_merged(self, session: SessionRef, follow: bool) -> Iterator[OutputChunk]:
        """stdout and stderr merged as cli/logs.ts writeLogs merges them (``sbx logs --stream
        all``): each stream's per-read index (read_index) orders its reads by arrival (µs),
        ties stdout first, then by cursor; a read is yielded only once the other stream is
        known (its ``through_us``) to hold no earlier read, waiting for that with a long poll
        (read_index with follow, both streams' polls pending at once on one connection). The
        bytes come from read_output of each stream (two more connections). Without follow: a
        prefix of the merge as stored now, stopped before reads a live stream may still add
        in between. Bytes past a final index's end (never indexed) come after every read."""
        sel = P.selector(session)
        streams = ("stdout", "stderr")
        rank = {"stdout": 0, "stderr": 1}
        inf = float("inf")
        feeds: Dict[str, Dict[str, Any]] = {
            st: {"queue": deque(), "next": 0, "ended": False, "cut": False, "through": None, "started": False, "more": False, "poll": None} for st in streams
        }
        index = self._sibling()
        sources = {st: self.read_output(session, st, 0, follow=True) for st in streams}
        pending: Dict[str, bytes] = {st: b"" for st in streams}
        retry = Retry(index, "read_index")

        def apply(st: str, r: Dict[str, Any]) -> None:
            f = feeds[st]
            if r["from"] != f["next"] or f["ended"]:
                return  # an answer from a cursor already passed (a poll and a refresh crossed)
            f["started"] = True
            for rec in r["records"]:
                skip = max(0, r["from"] - rec["cursor"])
                f["queue"].append((rec["at_us"], rec["cursor"] + skip, rec["length"] - skip))
            f["next"], f["more"], f["through"] = r["next"], r["more"], r["through_us"]
            if r["more"]:
                return
            if r["final"]:
                if r["next"] < r["cursor"]:
                    f["queue"].append((inf, r["next"], r["cursor"] - r["next"]))
                f["ended"] = True
            elif not follow:
                f["ended"] = f["cut"] = True

        def ask(st: str, long_poll: bool) -> Optional[int]:
            """read_index of st from its next cursor: answered now (None), or the long poll's rid."""
            conn = index._connection(retry)
            rid = conn.send("read_index", {**sel, "stream": st, "from": feeds[st]["next"], "follow": long_poll})
            if long_poll:
                return rid
            apply(st, P.answer(conn.recv(rid)))
            conn.forget(rid)
            return None

        def poll(sts: List[str]) -> None:
            for st in sts:
                if feeds[st]["poll"] is None:
                    feeds[st]["poll"] = ask(st, True)
            by_rid = {feeds[st]["poll"]: st for st in sts}
            rid, frame = index._connection(retry).recv_any(tuple(by_rid))
            st = by_rid[rid]
            feeds[st]["poll"] = None
            apply(st, P.answer(frame))

        def take(st: str, at: int, length: int) -> bytes:
            while len(pending[st]) < length:
                chunk = next(sources[st], None)
                if chunk is None:
                    raise SupervisorError("INTERNAL", f"read_output(all): {st} ended before byte {at + length}")
                pending[st] += chunk.data
            data, pending[st] = pending[st][:length], pending[st][length:]
            return data

        def wants_page(f: Dict[str, Any]) -> bool:
            return not f["ended"] and not f["queue"] and (not f["started"] or f["more"])

        def blocked(f: Dict[str, Any], at: float) -> bool:
            return not f["queue"] and not f["ended"] and (f["through"] is None or f["through"] < at)

        try:
            while True:
                try:
                    while any(wants_page(f) for f in feeds.values()):
                        for st in streams:
                            if wants_page(feeds[st]):
                                ask(st, False)
                    heads = [st for st in streams if feeds[st]["queue"]]
                    if not heads:
                        if all(f["ended"] for f in feeds.values()):
                            return
                        poll([st for st in streams if not feeds[st]["ended"]])
                        continue
                    st = min(heads, key=lambda h: (feeds[h]["queue"][0][0], rank[h], feeds[h]["queue"][0][1]))
                    at_us, at, length = feeds[st]["queue"][0]
                    others = [o for o in streams if o != st]
                    if any(feeds[o]["cut"] and not feeds[o]["queue"] and (feeds[o]["through"] is None or feeds[o]["through"] < at_us) for o in others):
                        return
                    blockers = [o for o in others if blocked(feeds[o], at_us)]
                    if blockers:
                        for o in blockers:
                            ask(o, False)
                        still = [o for o in blockers if blocked(feeds[o], at_us)]
                        if still:
                            poll(still)
                        continue
                except OSError as err:
                    index.close()
                    for f in feeds.values():
                        f["poll"] = None
                    time.sleep(retry.dropped(err))
                    continue
                retry.progress()
                feeds[st]["queue"].popleft()
                yield OutputChunk(stream=st, cursor=at, data=take(st, at, length))
        finally:
            for gen in sources.values():
                gen.close()
            index.close()

    def read(self, session: SessionRef, stream: str = "stdout", cursor: int = 0) -> bytes:
        """The bytes of one stream stored now, from ``cursor`` (``read_output`` without follow)."""
        return b"".join(c.data for c in self.read_output(session, stream, cursor, follow=False))

    # -- files (sandbox_supervisor/files.py, docs/guide/files.md) -------------------------------------

    def write_file(self, path: str, data: bytes, *, mode: Optional[int] = None, user: Optional[str] = None, key: Optional[str] = None, task: Optional[str] = None, timeout_seconds: Optional[float] = None) -> Dict[str, Any]:
        """See files.write_file: atomic, never through a symlink; returns the session's receipt."""
        return _files.write_file(self, path, data, mode=mode, user=user, key=key, task=task, timeout_seconds=timeout_seconds)

    def read_file(self, path: str, *, user: Optional[str] = None, key: Optional[str] = None, task: Optional[str] = None, timeout_seconds: Optional[float] = None) -> bytes:
        """See files.read_file: the file's bytes (OUTPUT_QUOTA_EXCEEDED past the stream quota)."""
        return _files.read_file(self, path, user=user, key=key, task=task, timeout_seconds=timeout_seconds)

    def upload(self, local_dir: str, remote_dir: str, *, user: Optional[str] = None, key: Optional[str] = None, task: Optional[str] = None, timeout_seconds: Optional[float] = None) -> Dict[str, Any]:
        """See files.upload: local_dir's tree into remote_dir as a streamed tar."""
        return _files.upload(self, local_dir, remote_dir, user=user, key=key, task=task, timeout_seconds=timeout_seconds)

    def download(self, remote_dir: str, local_dir: str, *, user: Optional[str] = None, key: Optional[str] = None, task: Optional[str] = None, timeout_seconds: Optional[float] = None) -> Dict[str, Any]:
        """See files.download: remote_dir's tree into local_dir, each member checked."""
        return _files.download(self, remote_dir, local_dir, user=user, key=key, task=task, timeout_seconds=timeout_seconds)
