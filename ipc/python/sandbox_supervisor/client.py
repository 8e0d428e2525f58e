"""The blocking client: a connection to the supervisor (its Unix socket, a WebSocket URL or a
command's stdin/stdout: endpoint.py, transport.py; hello first), requests by id, and output read
by cursor on a connection of its own. Every call has a deadline (keepalive pings, a silence bound). Owns no process and no session: closing
it never touches a command. Mirrors ipc/client.ts: after a drop it reconnects (for up to
``reconnect_seconds``) and resends the request, and ``read_output`` resumes from the next byte
it has not yielded. Answers' errors are SupervisorError; a first connection that fails raises
the socket's OSError (FileNotFoundError, ConnectionRefusedError) at once.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, Iterator, List, Mapping, Optional, Sequence, Set

from . import _protocol as P
from . import files as _files
from .errors import ERROR_CODES, CallbackFailed, SupervisorError, guarded
from .endpoint import DEFAULT_CONNECT_TIMEOUT_SECONDS, DEFAULT_KEEPALIVE_SECONDS, DEFAULT_SILENCE_SECONDS, Endpoint, EndpointClient, LaunchNotResent, TransportDead
from .transport import open_transport
from .types import Hello, OutputChunk, Receipt, Result, Session, SessionRef


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
        self.hello = Hello(version=r["version"], server=r["server"], instance=r["instance"], generation=r["generation"], max_frame_bytes=r.get("max_frame_bytes"))

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
            if frames is None:
                continue
            self.last_rx = time.monotonic()
            for frame in frames:
                fid = frame.get("id")
                # id 0 is never a request of ours: the supervisor refusing the whole connection.
                if fid == 0 and frame.get("error") is not None:
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
                self.last_rx = time.monotonic()
                for frame in frames:
                    fid = frame.get("id")
                    if fid == 0 and frame.get("error") is not None:
                        self.broken = True
                        return False
                    if fid in self.pings:
                        self.pings.discard(fid)
                    elif isinstance(fid, int):
                        self.held.setdefault(fid, deque()).append(frame)
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

    def _open(self, give_up_at: Optional[float] = None) -> _Connection:
        """A new connection: at once the first time; after a drop, retried until give_up_at
        (monotonic; default reconnect_seconds from now)."""
        if not self._connected_once:
            conn = self._new_connection()
            self._connected_once = True
            return conn
        if give_up_at is None:
            give_up_at = time.monotonic() + self.reconnect_seconds
        while True:
            try:
                return self._new_connection()
            except (OSError, SupervisorError) as err:
                if isinstance(err, SupervisorError) and not err.retryable:
                    raise
                if time.monotonic() > give_up_at:
                    raise ConnectionError(f"lost the supervisor at {self.endpoint.describe()} and it did not come back within {self.reconnect_seconds:g} s ({err})") from err
                time.sleep(P.RECONNECT_PAUSE_SECONDS)

    def _connection(self, give_up_at: Optional[float] = None) -> _Connection:
        if self._conn is not None and not self._conn.alive():
            self.close()  # closed while idle (the supervisor restarted, a server ping went unanswered): a new one
        if self._conn is None:
            self._conn = self._open(give_up_at)
        return self._conn

    def request(self, method: str, params: Optional[Mapping[str, Any]] = None, *, resend: bool = True) -> Any:
        """Sends one request and returns its result (docs/reference/protocol.md names every method).

        After a dropped connection the request is sent again on a new one when ``resend``
        (every method here is safe to resend but ``kill``), pausing between attempts, for up
        to reconnect_seconds from its first failure (a supervisor that drops the connection on
        every attempt is not retried for ever): then ConnectionError naming the endpoint.
        A ``launch`` without ``invocation_key`` is never resent once it may have reached the
        supervisor: LaunchNotResent (a ConnectionError) instead.
        Raises SupervisorError for the supervisor's answer, OSError when it cannot be reached,
        TransportDead (TimeoutError) when the endpoint stays silent through reconnect_seconds.
        """
        params = params or {}
        unkeyed_launch = method == "launch" and not params.get("invocation_key")
        give_up_at: Optional[float] = None  # set at the request's first failure; a reconnect does not restart it
        while True:
            conn = self._connection(give_up_at)
            sent = False
            try:
                rid = conn.send(method, params)
                sent = True
                frame = conn.recv(rid)
                conn.forget(rid)
                return P.answer(frame)
            except OSError as err:
                self.close()
                if not resend:
                    raise
                if unkeyed_launch and (sent or conn.broken):
                    raise LaunchNotResent(f"the connection to the supervisor at {self.endpoint.describe()} dropped after a launch without an invocation key was sent: it may be running, so it is not sent again (give it a key to make it safe to resend) ({err})") from err
                give_up_at = self._pause_after_drop(method, err, give_up_at)
            finally:
                if self._conn is not None and self._conn.broken:
                    self.close()

    # -- sessions -----------------------------------------------------------------------------

    def launch(
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
        params = P.launch_params(argv, key=key, timeout_seconds=timeout_seconds, grace_seconds=grace_seconds, cwd=cwd, env=env, inherit_env=inherit_env, user=user, task=task, stdin=stdin, pty=pty, linger=linger, on_disconnect=on_disconnect, service=service, keep_after_close=keep_after_close, memory_max_bytes=memory_max_bytes, pids_max=pids_max, cpus=cpus)
        return Session.from_wire(self.request("launch", params))

    def run(
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
        """Launches argv (as ``launch``, ``inherit_env`` too), feeds it ``stdin`` (bytes, then EOF;
        None: /dev/null), reads stdout and stderr to their ends, and returns the Result once
        the receipt is durable.

        Both streams are followed at once on one connection of run's own. ``on_stdout`` /
        ``on_stderr``: called with each new piece of that stream's bytes as it arrives, in
        cursor order (from this thread, inside run); such a stream is not kept: the Result's
        ``stdout``/``stderr`` is None for it (memory stays at one piece, not the output).
        A retry with the same ``key`` after a crash returns the first run's Result (its stored
        output and receipt), never a second run. Errors as ``launch``; an exception from a
        callback (any, an OSError too) cancels the session and is raised as it was.
        """
        session = self.launch(argv, key=key, timeout_seconds=timeout_seconds, grace_seconds=grace_seconds, cwd=cwd, env=env, inherit_env=inherit_env, user=user, task=task, stdin=stdin is not None, linger=linger, memory_max_bytes=memory_max_bytes, pids_max=pids_max, cpus=cpus)
        if stdin is not None and session.state != "ended":
            self._feed_stdin(session, bytes(stdin))
        kept: Dict[str, List[bytes]] = {"stdout": [], "stderr": []}
        sinks: Dict[str, Callable[[bytes], None]] = {
            "stdout": guarded(on_stdout) if on_stdout else kept["stdout"].append,
            "stderr": guarded(on_stderr) if on_stderr else kept["stderr"].append,
        }
        try:
            self._follow_streams(session, sinks)
        except CallbackFailed as failed:
            # Whatever a callback raised (an OSError too, not taken for a drop): nothing reads the rest.
            self._cancel_quietly(session)
            raise failed.error
        except (SupervisorError, OSError):
            raise
        except BaseException:
            self._cancel_quietly(session)  # KeyboardInterrupt and the like: nothing reads the rest
            raise
        receipt = self.wait(session)
        stdout = None if on_stdout else b"".join(kept["stdout"])
        stderr = None if on_stderr else b"".join(kept["stderr"])
        return Result(exit_code=P.exit_status_of(receipt), outcome=receipt["outcome"], stdout=stdout, stderr=stderr, receipt=receipt, session=session)

    def _follow_streams(self, session: SessionRef, sinks: Mapping[str, Callable[[bytes], None]]) -> None:
        """Follows each stream of ``sinks`` from cursor 0 to its end, all subscribed at once on
        one connection of its own, handing each new piece to its stream's sink in cursor order.
        A drop is re-made for up to reconnect_seconds and each stream resumed from its next
        byte not yet handed (no gap, no duplicate, as read_output). Errors as read_output."""
        sel = P.selector(session)
        cursors = {stream: 0 for stream in sinks}
        done: Set[str] = set()
        reader = self._sibling()
        give_up_at: Optional[float] = None
        try:
            while len(done) < len(sinks):
                conn = reader._connection(give_up_at)
                try:
                    rids: Dict[int, str] = {}
                    for stream in sinks:
                        if stream not in done:
                            rids[conn.send("subscribe", {**sel, "stream": stream, "from": cursors[stream], "follow": True})] = stream
                    answered: Set[int] = set()
                    while rids:
                        rid, frame = conn.recv_any(tuple(rids))
                        stream = rids[rid]
                        if rid not in answered:
                            P.answer(frame)
                            answered.add(rid)
                            continue
                        event = frame.get("event")
                        if event == "output":
                            data = P.new_output(stream, cursors[stream], frame.get("cursor"), bytes(frame["data"]))
                            if data:
                                cursors[stream] += len(data)
                                give_up_at = None
                                sinks[stream](data)
                        elif event == "end":
                            done.add(stream)
                            del rids[rid]
                            conn.forget(rid)
                        elif frame.get("error") is not None:
                            raise SupervisorError.from_wire(frame["error"])
                except OSError as err:
                    reader.close()
                    give_up_at = self._pause_after_drop("subscribe", err, give_up_at)
                finally:
                    if reader._conn is not None and reader._conn.broken:
                        reader.close()
        finally:
            reader.close()

    def _pause_after_drop(self, method: str, err: OSError, give_up_at: Optional[float]) -> float:
        """After a dropped connection: the reconnect deadline (reconnect_seconds from the first
        drop, time.monotonic() seconds), once the pause before the next try is over. Raises
        ConnectionError (P.gave_up) when the deadline has passed."""
        now = time.monotonic()
        if give_up_at is None:
            give_up_at = now + self.reconnect_seconds
        elif now > give_up_at:
            raise P.gave_up(self.endpoint.describe(), method, self.reconnect_seconds, err) from err
        time.sleep(P.RECONNECT_PAUSE_SECONDS)
        return give_up_at

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
        if stream not in P.STREAMS:
            raise SupervisorError("INVALID_ARGUMENT", f"stream must be one of all, {', '.join(P.STREAMS)}, not {stream!r}")
        sel = P.selector(session)
        reader = self._sibling()
        give_up_at: Optional[float] = None  # from the first failure since the last byte yielded
        try:
            while True:
                conn = reader._connection(give_up_at)
                expected = cursor
                try:
                    rid = conn.send("subscribe", {**sel, "stream": stream, "from": expected, "follow": follow})
                    P.answer(conn.recv(rid))
                    while True:
                        frame = conn.recv(rid)
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
                    reader.close()
                    give_up_at = self._pause_after_drop("subscribe", err, give_up_at)
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
        give_up_at: Optional[float] = None

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
            conn = index._connection(give_up_at)
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
            rid, frame = index._connection(give_up_at).recv_any(tuple(by_rid))
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
                    give_up_at = self._pause_after_drop("read_index", err, give_up_at)
                    continue
                give_up_at = None
                feeds[st]["queue"].popleft()
                yield OutputChunk(stream=st, cursor=at, data=take(st, at, length))
        finally:
            for gen in sources.values():
                gen.close()
            index.close()

    def read(self, session: SessionRef, stream: str = "stdout", cursor: int = 0) -> bytes:
        """The bytes of one stream stored now, from ``cursor`` (``read_output`` without follow)."""
        return b"".join(c.data for c in self.read_output(session, stream, cursor, follow=False))

    def wait(self, session: SessionRef) -> Receipt:
        """Blocks until the session's receipt is durable and returns it (signed; see verify_receipt)."""
        return self.request("wait", P.selector(session))  # type: ignore[no-any-return]

    def receipt(self, session: SessionRef) -> Dict[str, Any]:
        """``{"state", "receipt": receipt or None}`` now, without waiting."""
        return self.request("receipt", P.selector(session))  # type: ignore[no-any-return]

    def cancel(self, session: SessionRef, grace_seconds: Optional[float] = None) -> Dict[str, Any]:
        """TERM to every process of the session, KILL after the grace (first cause wins): ``{"session_id", "state"}``."""
        params: Dict[str, Any] = dict(P.selector(session))
        if grace_seconds is not None:
            params["grace_ms"] = P.ms(grace_seconds, "grace_seconds")
        return self.request("cancel", params)  # type: ignore[no-any-return]

    def kill(self, session: SessionRef, signal: Any = "SIGKILL") -> Dict[str, Any]:
        """Sends signal (a name like "SIGUSR1"/"USR1", or a number; default SIGKILL, as ``sbx kill``) to every process of the session: ``{"session_id", "signal", "pids"}``. Never resent after a drop."""
        sig = int(signal) if not isinstance(signal, str) else signal
        return self.request("kill", {**P.selector(session), "signal": sig}, resend=False)  # type: ignore[no-any-return]

    def write(self, session: SessionRef, data: bytes, *, offset: Optional[int] = None, eof: bool = False) -> Dict[str, Any]:
        """Writes stdin bytes (a session launched with ``stdin=True``), any amount: sent in
        requests of at most P.MAX_WRITE_BYTES (8 MiB) each, at their offsets, eof with the last.

        ``offset``: the stdin cursor of data[0] (bytes before the session's cursor are skipped,
        so a resend is exactly once; default: append); ``eof``: close stdin after them.
        Returns ``{"session_id", "cursor"}`` of the last piece once handed to the pipe or pty.
        """
        parts = P.pieces(bytes(data))
        result: Dict[str, Any] = {}
        for i, part in enumerate(parts):
            result = self.request("write", P.write_params(session, part, offset, eof and i == len(parts) - 1))
            if offset is None:  # the first piece was appended: it began at the cursor less its length
                offset = result["cursor"] - len(part)
            offset += len(part)  # each piece's offset from data[0]'s, never the answered cursor (ahead after a resend)
        return result

    def close_stdin(self, session: SessionRef) -> Dict[str, Any]:
        """EOF on the session's stdin."""
        return self.write(session, b"", eof=True)

    def resize(self, session: SessionRef, cols: int, rows: int) -> Dict[str, Any]:
        """A pty session's terminal size."""
        return self.request("resize", {**P.selector(session), "cols": cols, "rows": rows})  # type: ignore[no-any-return]

    def changes(self, session: SessionRef) -> Dict[str, Any]:
        """What the session changed in each watched workspace (``ChangesResult``, ipc/protocol.ts)."""
        return self.request("changes", P.selector(session))  # type: ignore[no-any-return]

    def resolve(self, session: SessionRef, reason: str, force: bool = False) -> Receipt:
        """Operator escape for a session stuck ``unknown``: a receipt with evidence ``operator_attested``;
        for an ended one whose death is ``cgroup_escaped``: the word that what left its cgroup is ended (its receipt, unchanged); refused while a destination still holds processes unless ``force``."""
        return self.request("resolve", {**P.selector(session), "as_operator": True, "reason": reason, **({"force": True} if force else {})})  # type: ignore[no-any-return]

    # -- the supervisor -----------------------------------------------------------------------

    def ps(self, all: bool = False) -> List[Dict[str, Any]]:
        """Session summaries (``SessionSummary``): those not ended, or every one with ``all``."""
        return P.ps_rows(self.request("ps", {"all": all}))

    def status(self) -> Dict[str, Any]:
        """Supervisor health (``StatusResult``): version, mode, sessions, admission, ``receipt_key`` {key_id, public_key_pem, path}, ..."""
        return self.request("status", {})  # type: ignore[no-any-return]

    def gc(self) -> Dict[str, Any]:
        """Applies the retention policy now."""
        return self.request("gc", {})  # type: ignore[no-any-return]

    def seal(self, task: str) -> Dict[str, Any]:
        """``sbx seal --task``: stops admission of new keys in one task for good (durable); other tasks go on."""
        return self.request("seal", {"task": task})  # type: ignore[no-any-return]

    def seal_all(self) -> Dict[str, Any]:
        """``sbx seal --all``: stops admission of the whole sandbox, every task, for good (durable)."""
        return self.request("seal", {})  # type: ignore[no-any-return]

    def close_task(self, task: str, *, workspaces: Optional[Sequence[str]] = None, timeout_seconds: Optional[float] = None) -> Dict[str, Any]:
        """``sbx close --task``: seals the task, settles its sessions (ending the rest after timeout_seconds, default 60),
        checkpoints each workspace (default: every watched one) and returns the signed task receipt
        (``complete``, ``conditions``, ``obligations``). Errors: TASK_CONFLICT, INVALID_ARGUMENT, SHUTTING_DOWN."""
        return self.request("close", _close_params(task, workspaces, timeout_seconds))  # type: ignore[no-any-return]

    def close_supervisor(self, *, workspaces: Optional[Sequence[str]] = None, timeout_seconds: Optional[float] = None) -> Dict[str, Any]:
        """``sbx close --all``: seals the whole sandbox for good, settles every session, closes each task and returns the
        signed close receipt with each task's verdict (``complete``; not final when false: close again)."""
        return self.request("close", _close_params(None, workspaces, timeout_seconds))  # type: ignore[no-any-return]

    def checkpoint(self, workspace: str, task: Optional[str] = None) -> Dict[str, Any]:
        """A checkpoint of a workspace directory, returned once published (``CheckpointResult``: ``checkpoint_id``, ``consistent``, ...).
        Errors: INVALID_ARGUMENT, CHECKPOINT_FAILED (retryable; ``details["stage"]``)."""
        params: Dict[str, Any] = {"workspace": os.path.abspath(workspace)}
        if task is not None:
            params["task"] = task
        return self.request("checkpoint", params)  # type: ignore[no-any-return]

    def restore(self, checkpoint_id: str, directory: str, *, store: Optional[str] = None, key_path: Optional[str] = None, same_owner: Optional[bool] = None, sbx: Optional[str] = None) -> Dict[str, Any]:
        """Materialises a published checkpoint into an empty or new directory and compares it (``sbx restore --json``).

        Restore reads the store directly (there is no wire method), from this supervisor's
        state dir (from ``status()``) unless ``store`` is given: a local store in Python
        (restore.py, no sbx needed: the same checks, result and refusals as sbx's); with
        ``sbx`` (a path), or an ``s3://`` store, by running the ``sbx`` bin (``sbx``, else
        ``$SBX_BIN``, else on PATH). Returns sbx's result (``identical``, ``differences``,
        ``entries``, ``files``, ``bytes``, ...). Raises SupervisorError (RestoreError from
        Python, ``details["restore_error"]``; the code sbx names, else INTERNAL) when it could not restore.
        """
        state_dir = None if store is not None else self.status()["state_dir"]
        return restore_checkpoint(checkpoint_id, directory, state_dir=state_dir, store=store, key_path=key_path, same_owner=same_owner, sbx=sbx)

    def diff(self, a: Optional[str] = None, b: Optional[str] = None, *, task: Optional[str] = None, store: Optional[str] = None, key_path: Optional[str] = None, sbx: Optional[str] = None) -> Any:
        """What changed from checkpoint ``a`` to ``b`` (``sbx diff A B --json``: a dict with ``from``,
        ``to``, ``added``, ``removed``, ``modified``, ``type_changed``, ``mode_changed``,
        ``owner_changed``, ``counts``, ``identical``), or with ``task`` (a and b None) its latest
        checkpoint against the one before it, one dict per workspace in a list (``sbx diff --task T
        --json``). Offline like restore: this supervisor's state dir (from ``status()``) unless
        ``store`` is given; a local store is read in Python (diff.py), an ``s3://`` store or
        ``sbx`` runs the sbx bin. Raises SupervisorError NOT_FOUND / INVALID_ARGUMENT."""
        state_dir = None if store is not None else self.status()["state_dir"]
        return diff_checkpoints(a, b, task=task, state_dir=state_dir, store=store, key_path=key_path, sbx=sbx)


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

def _close_params(task: Optional[str], workspaces: Optional[Sequence[str]], timeout_seconds: Optional[float]) -> Dict[str, Any]:
    params: Dict[str, Any] = {}
    if task is not None:
        params["task"] = task
    if workspaces is not None:
        params["workspaces"] = [os.path.abspath(w) for w in workspaces]
    if timeout_seconds is not None:
        params["timeout_ms"] = P.ms(timeout_seconds, "timeout_seconds")
    return params


def _sbx_json(args: List[str], verb: str, *, last_line: bool = False) -> Any:
    """Runs ``sbx VERB ... --json``: its JSON on exit 0 or 1, else SupervisorError with the code sbx
    names on stderr (its last line with ``last_line``: sbx diff may warn first), else INTERNAL."""
    proc = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True)
    if proc.returncode in (0, 1) and proc.stdout.strip():
        return json.loads(proc.stdout)
    message = proc.stderr.decode("utf-8", "replace").strip()
    if last_line:
        lines = message.splitlines()
        message = lines[-1] if lines else ""
    message = message[len("sbx: "):] if message.startswith("sbx: ") else message
    code, _, rest = message.partition(": ")
    if code in ERROR_CODES:
        raise SupervisorError(code, rest, {"exit_status": proc.returncode})
    raise SupervisorError("INTERNAL", f"sbx {verb} exited {proc.returncode}: {message}", {"exit_status": proc.returncode})


def diff_checkpoints(a: Optional[str] = None, b: Optional[str] = None, *, task: Optional[str] = None, state_dir: Optional[str] = None, store: Optional[str] = None, key_path: Optional[str] = None, sbx: Optional[str] = None) -> Any:
    """``sbx diff A B --json`` / ``sbx diff --task T --json`` (offline); see Client.diff. The local
    store (``store`` a directory, or ``<state_dir>/checkpoints``) is read here (diff.py: no sbx
    needed); ``sbx`` given, or an ``s3://`` store, runs the sbx bin (``sbx``, else ``$SBX_BIN``,
    else on PATH; none: SupervisorError INVALID_ARGUMENT naming it)."""
    s3 = store is not None and store.startswith("s3://")
    if sbx is None and not s3:
        from .diff import diff_local

        return diff_local(a, b, task=task, state_dir=state_dir, store=store, key_path=key_path)
    binary = sbx or os.environ.get("SBX_BIN") or shutil.which("sbx")
    if not binary:
        raise SupervisorError("INVALID_ARGUMENT", f"diff of the S3 store {store} runs the sbx bin (this library reads the local store only: it has no S3 client): give sbx=, set $SBX_BIN, or put sbx on PATH")
    args = [binary, "diff", *(x for x in (a, b) if x is not None), "--json"]
    if task is not None:
        args += ["--task", task]
    if state_dir is not None and store is None:
        args += ["--state-dir", state_dir]
    if store is not None:
        args += ["--store", store]
    if key_path is None and state_dir is not None and store is not None:
        key_path = os.path.join(state_dir, "receipt-key.pub")
    if key_path is not None:
        args += ["--public-key", key_path]
    return _sbx_json(args, "diff", last_line=True)


def restore_checkpoint(checkpoint_id: str, directory: str, *, state_dir: Optional[str] = None, store: Optional[str] = None, key_path: Optional[str] = None, same_owner: Optional[bool] = None, sbx: Optional[str] = None) -> Dict[str, Any]:
    """``sbx restore ID DIR --json`` (offline: the supervisor need not run); see Client.restore.

    The local store (``store`` a directory, or ``<state_dir>/checkpoints``) is restored here, in
    Python (restore.py: no sbx needed); ``sbx`` given, or an ``s3://`` store, runs the sbx bin
    (``sbx``, else ``$SBX_BIN``, else on PATH; none: SupervisorError INVALID_ARGUMENT naming it).
    """
    s3 = store is not None and store.startswith("s3://")
    if sbx is None and not s3:
        from .restore import restore_local

        return restore_local(checkpoint_id, directory, state_dir=state_dir, store=store, key_path=key_path, same_owner=same_owner)
    binary = sbx or os.environ.get("SBX_BIN") or shutil.which("sbx")
    if not binary:
        raise SupervisorError("INVALID_ARGUMENT", f"restore from the S3 store {store} runs the sbx bin (this library restores from the local store only: it has no S3 client): give sbx=, set $SBX_BIN, or put sbx on PATH")
    args = [binary, "restore", checkpoint_id, os.path.abspath(directory), "--json"]
    if state_dir is not None:
        args += ["--state-dir", state_dir]
    if store is not None:
        args += ["--store", store]
    if key_path is not None:
        args += ["--key", key_path]
    if same_owner is not None:
        args.append("--same-owner" if same_owner else "--no-same-owner")
    return _sbx_json(args, "restore")  # type: ignore[no-any-return]

