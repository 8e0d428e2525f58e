"""The two clients cannot drift: Client and AsyncClient have the same public methods with the same
signatures, the method table (_methods.py) makes the same requests through either, every wire method of
ipc/methods.ts is in the table or named here with where it is used instead, and the one reconnect policy
(endpoint.Retry) decides as both clients rely on. No supervisor needed."""
from __future__ import annotations

import ast
import asyncio
import inspect
import os
import re
from typing import Any, Dict, List, Optional

import pytest

from daemon import ROOT
from sandbox_supervisor import AsyncClient, Client, InvocationKey, Session
from sandbox_supervisor import _methods as M
from sandbox_supervisor import _protocol as P
from sandbox_supervisor.endpoint import LaunchNotResent, Retry

#: Public names only one client has, and why: the I/O differs, not the method.
ONLY_IN = {
    Client: {"hello": "a property connecting on first use; a property cannot await, so AsyncClient has connect()"},
    AsyncClient: {"connect": "connects now and returns the hello: Client.hello's asyncio form"},
}
#: Methods whose return annotation differs: a blocking iterator is an async iterator in asyncio.
RETURNS_DIFFER = {"read_output": ("Iterator[OutputChunk]", "AsyncIterator[OutputChunk]")}

#: Wire methods of ipc/methods.ts that are not in the Python method table, and where they are used instead.
NOT_IN_TABLE = {
    "hello": "each connection's handshake (client.py _Connection, aio.py _Wire); Client.hello / AsyncClient.connect() return it",
    "ping": "the keepalive sent while a call is pending (keepalive_seconds), never a call of its own",
    "subscribe": "a stream of output events, not one answer: read_output and run follow it by cursor (_protocol.Subscription)",
    "read_index": "read_output(stream='all') merges stdout and stderr by each stream's read index (Client._read_merged)",
    "write_file": "files.py: a session whose stdin carries the file (Client.write_file / AsyncClient.write_file)",
    "read_file": "files.py: a session whose stdout carries the file (Client.read_file / AsyncClient.read_file)",
    "upload": "files.py: a session whose stdin carries a tar stream (Client.upload / AsyncClient.upload)",
    "download": "files.py: a session whose stdout carries a tar stream (Client.download / AsyncClient.download)",
}


def public(cls: type) -> Dict[str, Any]:
    return {n: inspect.getattr_static(cls, n) for n in dir(cls) if not n.startswith("_")}


def test_both_clients_have_the_same_public_methods_with_the_same_signatures():
    blocking, aio = public(Client), public(AsyncClient)
    assert set(blocking) - set(aio) == set(ONLY_IN[Client])
    assert set(aio) - set(blocking) == set(ONLY_IN[AsyncClient])
    for name in sorted(set(blocking) & set(aio)):
        a, b = inspect.signature(getattr(Client, name)), inspect.signature(getattr(AsyncClient, name))
        if name in RETURNS_DIFFER:
            assert (a.return_annotation, b.return_annotation) == RETURNS_DIFFER[name]
            a, b = a.replace(return_annotation=None), b.replace(return_annotation=None)
        assert a == b, f"{name}: Client{a} but AsyncClient{b}"
        assert getattr(Client, name).__doc__, f"Client.{name} has no docstring"
        if isinstance(aio[name], classmethod):
            continue  # over_command / over_url: the same constructor for both
        f = getattr(AsyncClient, name)
        assert inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f), f"AsyncClient.{name} is not async"
        assert not inspect.iscoroutinefunction(getattr(Client, name)), f"Client.{name} is async"


def test_every_table_entry_is_a_method_of_both_clients_made_from_it():
    for spec in M.TABLE:
        for cls in (Client, AsyncClient):
            method = getattr(cls, spec.__name__)
            assert method.__wrapped__ is spec, f"{cls.__name__}.{spec.__name__} is not made from _methods.{spec.__name__}"
            assert method.__doc__ == spec.__doc__ and list(inspect.signature(method).parameters)[0] == "self"


def methods_ts_keys() -> List[str]:
    """The keys of ``interface Methods { ... }`` in ipc/methods.ts: the names at brace depth 1, comments skipped."""
    with open(os.path.join(ROOT, "ipc", "methods.ts")) as f:
        text = re.sub(r"/\*.*?\*/|//[^\n]*", "", f.read(), flags=re.S)
    start = re.search(r"\binterface\s+Methods\s*\{", text)
    assert start, "no interface Methods in ipc/methods.ts"
    keys, depth = [], 1
    for m in re.finditer(r"[{}]|(\w+)\s*:", text[start.end():]):
        if m.group(0) in "{}":
            depth += 1 if m.group(0) == "{" else -1
            if depth == 0:
                return keys
        elif depth == 1:
            keys.append(m.group(1))
    raise AssertionError("interface Methods in ipc/methods.ts does not close")


def table_wire_methods() -> set:
    """The wire method of every Call(...) the table's entries yield (its first argument, a string)."""
    tree = ast.parse(inspect.getsource(M))
    return {n.args[0].value for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Call" and n.args and isinstance(n.args[0], ast.Constant)}


def test_every_wire_method_is_in_the_table_or_named_here_with_where_it_is_used():
    wire = methods_ts_keys()
    assert "launch" in wire and "wait" in wire, wire  # the parse found the table
    in_table = table_wire_methods()
    missing = [m for m in wire if m not in in_table and m not in NOT_IN_TABLE]
    assert missing == [], f"ipc/methods.ts has {missing}: add them to sandbox_supervisor/_methods.py, or to NOT_IN_TABLE here with the reason"
    assert sorted(in_table - set(wire)) == [], "the Python table sends methods ipc/methods.ts does not have"
    assert sorted(set(NOT_IN_TABLE) - set(wire)) == [], "NOT_IN_TABLE names methods ipc/methods.ts no longer has"
    assert sorted(set(NOT_IN_TABLE) & in_table) == [], "in the table and in NOT_IN_TABLE"


# -- the table driven by both clients, against a recording request() ---------------------------------


def answer(method: str, params: Dict[str, Any]) -> Dict[str, Any]:
    if method == "launch":
        return {"session_id": "s-1", "invocation_key": params["invocation_key"], "existing": False, "state": "running", "command_digest": "d"}
    if method == "write":
        return {"session_id": "s-1", "cursor": params.get("offset", 0) + len(params["data"])}
    if method == "ps":
        return {"sessions": [{"session_id": "s-1"}]}
    return {"method": method}


class Recording(Client):
    def __init__(self) -> None:
        super().__init__("/nonexistent/sbx.sock")
        self.sent: List[Any] = []

    def request(self, method: str, params: Optional[Dict[str, Any]] = None, *, resend: bool = True) -> Any:
        self.sent.append((method, params, resend))
        return answer(method, params or {})


class AsyncRecording(AsyncClient):
    def __init__(self) -> None:
        super().__init__("/nonexistent/sbx.sock")
        self.sent: List[Any] = []

    async def request(self, method: str, params: Optional[Dict[str, Any]] = None, *, resend: bool = True) -> Any:
        self.sent.append((method, params, resend))
        return answer(method, params or {})


CALLS = [
    ("launch", (["true"],), {"key": "k", "cwd": "/", "timeout_seconds": 1.5}),
    ("cancel", (InvocationKey("k"),), {"grace_seconds": 2}),
    ("kill", ("s-1", 9), {}),
    ("write", ("s-1", b"abcdefghij"), {"offset": 5, "eof": True}),
    ("close_stdin", ("s-1",), {}),
    ("ps", (), {"all": True}),
    ("seal_all", (), {}),
    ("close_task", ("t",), {"workspaces": ["ws"], "timeout_seconds": 3}),
    ("checkpoint", ("ws",), {}),
]


def test_the_table_makes_the_same_requests_and_results_through_either_client(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(P, "MAX_WRITE_BYTES", 4)  # write's pieces
    blocking, aio = Recording(), AsyncRecording()
    results = [getattr(blocking, name)(*args, **kw) for name, args, kw in CALLS]

    async def main() -> List[Any]:
        return [await getattr(aio, name)(*args, **kw) for name, args, kw in CALLS]

    assert asyncio.run(main()) == results
    assert aio.sent == blocking.sent
    sent = {m: (p, resend) for m, p, resend in blocking.sent}
    assert isinstance(results[0], Session) and sent["launch"][0]["timeout_ms"] == 1500
    assert sent["cancel"] == ({"invocation_key": "k", "grace_ms": 2000}, True)
    assert sent["kill"] == ({"session_id": "s-1", "signal": 9}, False)  # never resent
    writes = [(p.get("offset"), bytes(p["data"]), p.get("eof")) for m, p, _ in blocking.sent if m == "write"]
    assert writes == [(5, b"abcd", None), (9, b"efgh", None), (13, b"ij", True), (None, b"", True)] and results[3]["cursor"] == 15
    assert results[5] == [{"session_id": "s-1"}]
    assert sent["close"][0] == {"task": "t", "workspaces": [os.path.abspath("ws")], "timeout_ms": 3000}


# -- the reconnect policy both clients drive -------------------------------------------------------


def test_the_reconnect_policy_resends_until_its_deadline_and_never_an_unkeyed_launch():
    c = Client("/nonexistent/sbx.sock", reconnect_seconds=60)
    c._connected_once = True
    drop = ConnectionResetError("dropped")
    assert Retry(c, "status").dropped(drop) == P.RECONNECT_PAUSE_SECONDS
    with pytest.raises(ConnectionResetError):
        Retry(c, "kill", resend=False).dropped(drop)
    with pytest.raises(LaunchNotResent, match="without an invocation key"):
        Retry(c, "launch", {"argv": ["true"]}).dropped(drop)
    assert Retry(c, "launch", {"invocation_key": "k"}).dropped(drop) == P.RECONNECT_PAUSE_SECONDS
    late = Retry(c, "status")
    late.dropped(drop)
    late.give_up_at = 0.0  # past the deadline
    with pytest.raises(ConnectionError, match="every attempt of status"):
        late.dropped(drop)
    late.progress()  # a byte read: the deadline starts again at the next failure
    assert late.dropped(drop) == P.RECONNECT_PAUSE_SECONDS
    with pytest.raises(ConnectionError, match="did not come back"):
        late.give_up_at = 0.0
        late.connect_failed(ConnectionRefusedError("refused"))
    c._connected_once = False  # the first connect: its error at once
    with pytest.raises(FileNotFoundError):
        Retry(c).connect_failed(FileNotFoundError("no socket"))
