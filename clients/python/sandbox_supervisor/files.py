"""Files over the transport, as sessions (docs/guide/files.md): ``write_file``, ``read_file``,
``upload`` and ``download`` for ``Client`` and ``AsyncClient`` (their methods call these). Each
call is keyed (a random key when none is given), so a resend after a drop finds the same
session; stdin goes by offset in pieces of at most 4 MiB (exactly once), stdout is read by
cursor, and the receipt decides: exit 0 (else the tool's error code), no dropped bytes (else
OUTPUT_QUOTA_EXCEEDED), and the sha256 of what was read equals the receipt's. Trees go as tar
streams (``tarfile``, streamed both ways); a download refuses absolute names, ``..`` escapes and
links that point out of the target directory.
"""
from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import queue
import secrets
import tarfile
import threading
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Dict, Iterator, Optional

from . import _protocol as P
from .errors import ERROR_CODES, SupervisorError
from .types import Session

if TYPE_CHECKING:
    from .aio import AsyncClient
    from .client import Client

#: Most bytes of stdin per write request (the protocol allows 8 MiB); less when the server's frame limit is lower.
CHUNK_BYTES = 4 * 1024 * 1024
#: Bytes of a write frame besides its data (id, method, session_id, offset, eof), with room to spare.
_FRAME_OVERHEAD_BYTES = 4096


def chunk_bytes(hello: Any) -> int:
    """Stdin bytes per write for a server whose hello said max_frame_bytes: at most CHUNK_BYTES, a frame under its limit."""
    limit = getattr(hello, "max_frame_bytes", None)
    if not isinstance(limit, int):
        return CHUNK_BYTES
    return max(1, min(CHUNK_BYTES, limit - _FRAME_OVERHEAD_BYTES))


def _skipped(stderr: bytes, remote_dir: str, session_id: str) -> None:
    """FILE_ERROR naming the entries the remote tar left out with exit 0 (GNU tar: "socket ignored"): never silently less."""
    lines = [l.strip() for l in stderr.decode("utf-8", "replace").splitlines() if l.strip().endswith(" ignored")]
    if lines:
        entries = [l[len("tar: "):].rsplit(": ", 1)[0] if l.startswith("tar: ") else l for l in lines]
        raise SupervisorError("FILE_ERROR", f"download {remote_dir}: the remote tar left out {len(lines)} entries (sockets): {'; '.join(lines)[:4096]}; nothing was extracted", {"skipped": entries, "session_id": session_id})


def _key(verb: str, key: Optional[str]) -> str:
    return key if key is not None else f"file-{verb}-{secrets.token_hex(12)}"


def _common(verb: str, key: Optional[str], task: Optional[str], user: Optional[str], timeout_seconds: Optional[float] = None) -> Dict[str, Any]:
    """The session's params of every file method: key (default a random one), task, user, timeout_ms."""
    params: Dict[str, Any] = {"key": _key(verb, key)}
    if timeout_seconds is not None:
        params["timeout_ms"] = P.ms(timeout_seconds, "timeout_seconds")
    if task is not None:
        params["task"] = task
    if user is not None:
        params["user"] = user
    return params


def _tool_error(stderr: bytes, receipt: Dict[str, Any], what: str) -> SupervisorError:
    """The tool's JSON line on stderr as its SupervisorError, else FILE_ERROR with tar's text."""
    text = stderr.decode("utf-8", "replace").strip()
    last = text.splitlines()[-1] if text else ""
    try:
        line = json.loads(last)
        if isinstance(line, dict) and line.get("code") in ERROR_CODES:
            details = {k: v for k, v in line.items() if k not in ("code", "message")}
            details["session_id"] = receipt["session_id"]
            return SupervisorError(str(line["code"]), f"{what}: {line.get('message', line['code'])}", details)
    except ValueError:
        pass
    exit_ = receipt.get("exit") or {}
    why = f"exit {exit_.get('code')}" if exit_.get("code") is not None else str(receipt.get("outcome"))
    return SupervisorError("FILE_ERROR", f"{what}: {why}" + (f": {text[-4096:]}" if text else ""), {"exit": exit_, "outcome": receipt.get("outcome"), "session_id": receipt["session_id"]})


def _check_stdout(receipt: Dict[str, Any], what: str) -> None:
    out = (receipt.get("output") or {}).get("stdout")
    if not out:
        return
    if out["dropped_bytes"] > 0 or out.get("reason") == "quota":
        total = out["final_cursor"] + out["dropped_bytes"]
        raise SupervisorError(
            "OUTPUT_QUOTA_EXCEEDED",
            f"{what}: {total} bytes are past the session's stream quota: {out['final_cursor']} stored, {out['dropped_bytes']} dropped; nothing is returned",
            {"total_bytes": total, "stored_bytes": out["final_cursor"], "dropped_bytes": out["dropped_bytes"], "session_id": receipt["session_id"]},
        )
    if not out.get("complete", True):
        raise SupervisorError("FILE_ERROR", f"{what}: the session's stdout is incomplete (reason {out.get('reason')})", {"session_id": receipt["session_id"]})


def _check_digest(receipt: Dict[str, Any], digest: str, size: int, what: str) -> None:
    out = (receipt.get("output") or {}).get("stdout") or {}
    if out.get("sha256") != digest or out.get("final_cursor") != size:
        raise SupervisorError("INTERNAL", f"{what}: read {size} bytes (sha256 {digest}), the receipt says {out.get('final_cursor')} (sha256 {out.get('sha256')})")


# -- safe extraction ---------------------------------------------------------------------------


def _inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def _safe_member(member: tarfile.TarInfo, root: str) -> tarfile.TarInfo:
    """The member if extracting it under root (a realpath) stays under root: no absolute name,
    no ``..`` escape (also through a link extracted before), no link pointing out; else
    SupervisorError FILE_ERROR naming it. Modes (setgid included) are kept."""
    name = member.name
    if name.startswith("/") or os.path.isabs(name):
        raise SupervisorError("FILE_ERROR", f"download: refused an absolute member name {name!r}", {"member": name})
    dest = os.path.normpath(os.path.join(root, name))
    parent = root if dest == root else os.path.realpath(os.path.dirname(dest))
    if not _inside(root, parent) or not _inside(root, dest):
        raise SupervisorError("FILE_ERROR", f"download: refused member {name!r}: it escapes {root}", {"member": name})
    if member.issym():
        target = member.linkname
        resolved = os.path.normpath(os.path.join(parent, target)) if not os.path.isabs(target) else target
        if os.path.isabs(target) or not _inside(root, resolved):
            raise SupervisorError("FILE_ERROR", f"download: refused symlink {name!r} -> {target!r}: it points out of {root}", {"member": name, "linkname": target})
    elif member.islnk():
        resolved = os.path.realpath(os.path.join(root, member.linkname))
        if os.path.isabs(member.linkname) or not _inside(root, resolved):
            raise SupervisorError("FILE_ERROR", f"download: refused hard link {name!r} -> {member.linkname!r}: it points out of {root}", {"member": name, "linkname": member.linkname})
    elif not (member.isfile() or member.isdir()):
        raise SupervisorError("FILE_ERROR", f"download: refused member {name!r}: a device, fifo or other special file", {"member": name})
    return member


def _extract_stream(fileobj: Any, local_dir: str) -> None:
    """Extracts a streamed tar (mode ``r|``) into local_dir, member by member, each checked."""
    root = os.path.realpath(local_dir)
    dirs = []
    with tarfile.open(fileobj=fileobj, mode="r|") as tar:
        for member in tar:
            _safe_member(member, root)
            if member.isdir():
                dirs.append(member)
                if os.path.normpath(member.name) == ".":
                    continue  # the target itself: its attributes at the end, like the others
            tar.extract(member, root, set_attrs=not member.isdir(), **_no_filter())
    # Directories' modes and times last (a read-only directory would refuse its own entries), deepest first.
    for member in sorted(dirs, key=lambda m: m.name, reverse=True):
        path = os.path.join(root, member.name)
        os.chmod(path, member.mode)
        os.utime(path, (member.mtime, member.mtime))
        if os.geteuid() == 0:
            os.lchown(path, member.uid, member.gid)
            os.chmod(path, member.mode)  # chown clears setgid


def _no_filter() -> Dict[str, Any]:
    """Python 3.12+ warns without a filter: the checks are ours (_safe_member), so keep every mode bit."""
    return {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}


class _ChunkReader(io.RawIOBase):
    """A readable file over an iterator of byte chunks (for tarfile's streamed ``r|``)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


class _ChunkWriter(io.RawIOBase):
    """A writable file that hands CHUNK_BYTES pieces to send (for tarfile's streamed ``w|``)."""

    def __init__(self, send: Callable[[bytes], None], size: int = CHUNK_BYTES) -> None:
        self._send = send
        self._size = size
        self._buf = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self._buf += b
        while len(self._buf) >= self._size:
            self._send(bytes(self._buf[: self._size]))
            del self._buf[: self._size]
        return len(b)

    def flush_all(self) -> None:
        if self._buf:
            self._send(bytes(self._buf))
            self._buf.clear()


def _write_tar(local_dir: str, out: io.RawIOBase) -> None:
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        tar.add(local_dir, arcname=".", recursive=True)


# -- blocking ------------------------------------------------------------------------------


class _Stdin:
    """A session's stdin written at offsets (a resend after a drop is exactly once). Stops
    quietly once the command closed its stdin (its receipt tells the rest)."""

    def __init__(self, client: "Client", session: Session) -> None:
        self.client, self.session, self.offset, self.closed = client, session, 0, False

    def send(self, data: bytes, eof: bool = False) -> None:
        if self.closed:
            return
        try:
            self.client.request("write", P.write_params(self.session, data, self.offset, eof))
        except SupervisorError as err:
            if not P.stdin_closed(err):
                raise
            self.closed = True
        self.offset += len(data)


def _settle(client: "Client", session: Session, what: str) -> Dict[str, Any]:
    receipt = client.wait(session)
    if (receipt.get("exit") or {}).get("code") != 0:
        raise _tool_error(client.read(session, "stderr"), receipt, what)
    _check_stdout(receipt, what)
    return receipt  # type: ignore[no-any-return]


def write_file(client: "Client", path: str, data: bytes, *, mode: Optional[int] = None, user: Optional[str] = None, key: Optional[str] = None, task: Optional[str] = None, timeout_seconds: Optional[float] = None) -> Dict[str, Any]:
    """Writes data to the absolute path atomically (temp, fsync, fchmod(mode, default 0o644),
    rename, fsync of the directory), never through a symlink. Returns the receipt.
    Errors: SYMLINK_REFUSED, NOT_FOUND, NOT_A_DIRECTORY, PERMISSION_DENIED, SIZE_MISMATCH,
    LIMIT_EXCEEDED (details limit "file_bytes"), FILE_ERROR."""
    data = bytes(data)
    params = {"path": path, "size_bytes": len(data), **_common("write", key, task, user, timeout_seconds)}
    if mode is not None:
        params["mode"] = mode
    session = Session.from_wire(client.request("write_file", params))
    stdin = _Stdin(client, session)
    if session.state != "ended":
        view = memoryview(data)
        size = chunk_bytes(client.hello)
        try:
            for at in range(0, len(data), size):
                stdin.send(bytes(view[at : at + size]))
            stdin.send(b"", eof=True)
        except BaseException:
            try:  # no session left waiting on its stdin
                client.cancel(session)
            except (OSError, SupervisorError):
                pass
            raise
    return _settle(client, session, f"write_file {path}")


def read_file(client: "Client", path: str, *, user: Optional[str] = None, key: Optional[str] = None, task: Optional[str] = None, timeout_seconds: Optional[float] = None) -> bytes:
    """The bytes of the regular file at the absolute path (never through a symlink).
    OUTPUT_QUOTA_EXCEEDED when it is larger than the session's stream quota (never a tail)."""
    session = Session.from_wire(client.request("read_file", {"path": path, **_common("read", key, task, user, timeout_seconds)}))
    what = f"read_file {path}"
    receipt = _settle(client, session, what)
    data = client.read(session, "stdout")
    _check_digest(receipt, hashlib.sha256(data).hexdigest(), len(data), what)
    return data


def upload(client: "Client", local_dir: str, remote_dir: str, *, user: Optional[str] = None, key: Optional[str] = None, task: Optional[str] = None, timeout_seconds: Optional[float] = None) -> Dict[str, Any]:
    """Copies local_dir's tree into remote_dir (which must exist): a tar streamed (tarfile, in
    pieces sized to the server's frame limit) into the file tool's ``upload remote_dir`` (tar into a staging dir, then
    merged without following links; docs/guide/files.md). Returns the receipt."""
    session = Session.from_wire(client.request("upload", {"dir": remote_dir, **_common("upload", key, task, user, timeout_seconds)}))
    stdin = _Stdin(client, session)
    try:
        out = _ChunkWriter(stdin.send, chunk_bytes(client.hello))
        _write_tar(local_dir, out)
        out.flush_all()
    except BaseException:
        try:
            client.cancel(session)
        except (OSError, SupervisorError):
            pass
        raise
    stdin.send(b"", eof=True)
    return _settle(client, session, f"upload {remote_dir}")


def download(client: "Client", remote_dir: str, local_dir: str, *, user: Optional[str] = None, key: Optional[str] = None, task: Optional[str] = None, timeout_seconds: Optional[float] = None) -> Dict[str, Any]:
    """Copies remote_dir's tree into local_dir (which must exist): ``tar -c -f - -C remote_dir .``
    on the supervisor's side, its stdout read by cursor and extracted as it streams (each member
    checked: see the module). OUTPUT_QUOTA_EXCEEDED (nothing extracted) when the tar is past the
    stream quota. Returns the receipt."""
    session = Session.from_wire(client.request("download", {"dir": remote_dir, **_common("download", key, task, user, timeout_seconds)}))
    what = f"download {remote_dir}"
    receipt = _settle(client, session, what)
    _skipped(client.read(session, "stderr"), remote_dir, receipt["session_id"])
    h = hashlib.sha256()
    size = 0

    def chunks() -> Iterator[bytes]:
        nonlocal size
        for c in client.read_output(session, "stdout", follow=True):
            h.update(c.data)
            size += len(c.data)
            yield c.data

    it = chunks()
    _extract_stream(_ChunkReader(it), local_dir)
    for _ in it:  # the tar's trailing blocks, for the digest
        pass
    _check_digest(receipt, h.hexdigest(), size, what)
    return receipt


# -- asyncio -------------------------------------------------------------------------------


async def _asettle(client: "AsyncClient", session: Session, what: str) -> Dict[str, Any]:
    receipt = await client.wait(session)
    if (receipt.get("exit") or {}).get("code") != 0:
        raise _tool_error(await client.read(session, "stderr"), receipt, what)
    _check_stdout(receipt, what)
    return receipt  # type: ignore[no-any-return]


async def _asend(client: "AsyncClient", session: Session, source: AsyncIterator[bytes]) -> None:
    offset = 0
    try:
        async for data in source:
            await client.request("write", P.write_params(session, data, offset, False))
            offset += len(data)
        await client.request("write", P.write_params(session, b"", offset, True))
    except SupervisorError as err:
        if not P.stdin_closed(err):
            raise


async def awrite_file(client: "AsyncClient", path: str, data: bytes, *, mode: Optional[int] = None, user: Optional[str] = None, key: Optional[str] = None, task: Optional[str] = None, timeout_seconds: Optional[float] = None) -> Dict[str, Any]:
    """See write_file."""
    data = bytes(data)
    params = {"path": path, "size_bytes": len(data), **_common("write", key, task, user, timeout_seconds)}
    if mode is not None:
        params["mode"] = mode
    session = Session.from_wire(await client.request("write_file", params))

    size = chunk_bytes(await client.connect())

    async def pieces() -> AsyncIterator[bytes]:
        for at in range(0, len(data), size):
            yield data[at : at + size]

    if session.state != "ended":
        try:
            await _asend(client, session, pieces())
        except BaseException:
            try:  # no session left waiting on its stdin
                await client.cancel(session)
            except (OSError, SupervisorError):
                pass
            raise
    return await _asettle(client, session, f"write_file {path}")


async def aread_file(client: "AsyncClient", path: str, *, user: Optional[str] = None, key: Optional[str] = None, task: Optional[str] = None, timeout_seconds: Optional[float] = None) -> bytes:
    """See read_file."""
    session = Session.from_wire(await client.request("read_file", {"path": path, **_common("read", key, task, user, timeout_seconds)}))
    what = f"read_file {path}"
    receipt = await _asettle(client, session, what)
    data = await client.read(session, "stdout")
    _check_digest(receipt, hashlib.sha256(data).hexdigest(), len(data), what)
    return data


_END = object()


async def aupload(client: "AsyncClient", local_dir: str, remote_dir: str, *, user: Optional[str] = None, key: Optional[str] = None, task: Optional[str] = None, timeout_seconds: Optional[float] = None) -> Dict[str, Any]:
    """See upload (the tar is made on a thread, handed over through a queue of 4 pieces at most)."""
    session = Session.from_wire(await client.request("upload", {"dir": remote_dir, **_common("upload", key, task, user, timeout_seconds)}))
    size = chunk_bytes(await client.connect())
    q: "queue.Queue[Any]" = queue.Queue(maxsize=4)
    failure: list = []
    stop = threading.Event()

    def produce() -> None:
        def put(b: bytes) -> None:
            while not stop.is_set():
                try:
                    q.put(b, timeout=0.1)
                    return
                except queue.Full:
                    continue
            raise RuntimeError("upload abandoned")

        try:
            out = _ChunkWriter(put, size)
            _write_tar(local_dir, out)
            out.flush_all()
        except BaseException as err:  # noqa: BLE001 (handed to the event loop)
            failure.append(err)
        finally:
            try:
                q.put(_END, timeout=5)
            except queue.Full:
                pass

    async def pieces() -> AsyncIterator[bytes]:
        while True:
            item = await asyncio.to_thread(q.get)
            if item is _END:
                if failure:
                    raise failure[0]
                return
            yield item

    thread = threading.Thread(target=produce, name="sbx-upload-tar", daemon=True)
    thread.start()
    try:
        await _asend(client, session, pieces())
    except BaseException:
        stop.set()
        try:
            await client.cancel(session)
        except (OSError, SupervisorError):
            pass
        raise
    finally:
        stop.set()
        await asyncio.to_thread(thread.join)
    return await _asettle(client, session, f"upload {remote_dir}")


async def adownload(client: "AsyncClient", remote_dir: str, local_dir: str, *, user: Optional[str] = None, key: Optional[str] = None, task: Optional[str] = None, timeout_seconds: Optional[float] = None) -> Dict[str, Any]:
    """See download (extracted on a thread as the chunks arrive, through a bounded queue)."""
    session = Session.from_wire(await client.request("download", {"dir": remote_dir, **_common("download", key, task, user, timeout_seconds)}))
    what = f"download {remote_dir}"
    receipt = await _asettle(client, session, what)
    _skipped(await client.read(session, "stderr"), remote_dir, receipt["session_id"])
    q: "queue.Queue[Any]" = queue.Queue(maxsize=4)
    h = hashlib.sha256()
    size = 0

    def chunks() -> Iterator[bytes]:
        while True:
            item = q.get()
            if item is _END:
                return
            yield item

    def consume() -> None:
        it = chunks()
        try:
            _extract_stream(_ChunkReader(it), local_dir)
        finally:
            for _ in it:  # drain so the producer never blocks
                pass

    extracting = asyncio.ensure_future(asyncio.to_thread(consume))
    try:
        async for c in client.read_output(session, "stdout", follow=True):
            h.update(c.data)
            size += len(c.data)
            while not extracting.done():
                try:
                    q.put_nowait(c.data)
                    break
                except queue.Full:
                    await asyncio.sleep(0.005)
    finally:
        while True:
            try:
                q.put_nowait(_END)
                break
            except queue.Full:
                if extracting.done():
                    break
                await asyncio.sleep(0.005)
    await extracting
    _check_digest(receipt, h.hexdigest(), size, what)
    return receipt
