"""Files as sessions from Python (docs/guide/files.md), blocking and async, against a real daemon: a
file round-trips byte-exact, a tree with odd names, modes and symlinks round-trips through
upload + download, writes through planted links are refused, and a download that would
escape the target (absolute names, .., links pointing out) is refused."""
from __future__ import annotations

import asyncio
import hashlib
import io
import os
import random
import stat
import tarfile
import tempfile
import time
from typing import Dict, Iterator

import pytest

from daemon import Daemon
from sandbox_supervisor import AsyncClient, Client, InvocationKey, SupervisorError
from sandbox_supervisor import files as F

MiB = 1024 * 1024


@pytest.fixture()
def tmp() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="sbx-pyfiles-")
    try:
        yield d
    finally:
        import shutil

        shutil.rmtree(d, ignore_errors=True)


def tree(root: str) -> Dict[str, str]:
    """Every entry under root: type, mode, link target or sha256 (lstat only)."""
    out: Dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            mode = oct(stat.S_IMODE(st.st_mode))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = f"link {os.readlink(p)}"
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = f"dir {mode}"
            else:
                with open(p, "rb") as f:
                    out[rel] = f"file {mode} {hashlib.sha256(f.read()).hexdigest()}"
    return out


def make_tree(root: str, rng: random.Random) -> None:
    for i, name in enumerate(["with space", "new\nline", "ütf-8 ✓ 名前", "-leading-dash", "--rf"]):
        with open(os.path.join(root, name), "wb") as f:
            f.write(rng.randbytes(1000 + 777 * i))
    os.mkdir(os.path.join(root, "sub dir"))
    with open(os.path.join(root, "sub dir", "secret"), "wb") as f:
        f.write(b"secret\n")
    os.chmod(os.path.join(root, "sub dir", "secret"), 0o600)
    with open(os.path.join(root, "sub dir", "run.sh"), "wb") as f:
        f.write(b"#!/bin/sh\necho hi\n")
    os.chmod(os.path.join(root, "sub dir", "run.sh"), 0o755)
    os.mkdir(os.path.join(root, "setgid"))
    os.chmod(os.path.join(root, "setgid"), 0o2775)
    os.symlink("with space", os.path.join(root, "rel-link"))
    os.symlink("../ütf-8 ✓ 名前", os.path.join(root, "sub dir", "up-link"))
    os.symlink("does/not/exist", os.path.join(root, "dangling"))
    with open(os.path.join(root, "big"), "wb") as f:
        f.write(rng.randbytes(9 * MiB + 17))


def test_write_and_read_round_trip(daemon: Daemon, tmp: str):
    seed = time.time_ns()
    print(f"test_files seed {seed}")
    data = random.Random(seed).randbytes(20 * MiB + 3)
    path = os.path.join(tmp, "blob")
    with Client(daemon.socket_path) as c:
        receipt = c.write_file(path, data, mode=0o600)
        assert receipt["exit"]["code"] == 0
        assert receipt["argv"][2:] == ["write", path, "--mode", "0600", "--size", str(len(data))]
        assert receipt["invocation_key"].startswith("file-write-")
        with open(path, "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == hashlib.sha256(data).hexdigest()
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert os.listdir(tmp) == ["blob"]
        back = c.read_file(path)
        assert hashlib.sha256(back).hexdigest() == hashlib.sha256(data).hexdigest()

    async def run() -> bytes:
        async with AsyncClient(daemon.socket_path) as a:
            await a.write_file(path + "2", data[: 5 * MiB], mode=0o640)
            return await a.read_file(path + "2")

    assert asyncio.run(run()) == data[: 5 * MiB]
    assert stat.S_IMODE(os.stat(path + "2").st_mode) == 0o640


def test_tree_round_trip(daemon: Daemon, tmp: str):
    seed = time.time_ns()
    print(f"test_files tree seed {seed}")
    local, remote, back, aremote, aback = (os.path.join(tmp, n) for n in ("local", "remote", "back", "aremote", "aback"))
    for d in (local, remote, back, aremote, aback):
        os.mkdir(d)
    make_tree(local, random.Random(seed))
    want = tree(local)
    assert want["setgid"] == "dir 0o2775" and want["dangling"] == "link does/not/exist"
    with Client(daemon.socket_path) as c:
        up = c.upload(local, remote)
        assert up["argv"][2:] == ["upload", remote] and (up["argv"][1].endswith("dist/supervisor/files/file-tool.js") or "/sandbox-supervisor-file-tool-" in up["argv"][1])
        assert tree(remote) == want
        down = c.download(remote, back)
        assert down["argv"] == ["tar", "-c", "-f", "-", "-C", remote, "."]
        assert tree(back) == want

    async def run() -> None:
        async with AsyncClient(daemon.socket_path) as a:
            await a.upload(local, aremote)
            await a.download(aremote, aback)

    asyncio.run(run())
    assert tree(aremote) == want
    assert tree(aback) == want


def test_symlink_refused(daemon: Daemon, tmp: str):
    outside = os.path.join(tmp, "outside")
    inside = os.path.join(tmp, "inside")
    os.mkdir(outside)
    os.mkdir(inside)
    victim = os.path.join(outside, "victim")
    with open(victim, "wb") as f:
        f.write(b"original")
    os.symlink(victim, os.path.join(inside, "final-link"))
    os.symlink(outside, os.path.join(inside, "dir-link"))
    with Client(daemon.socket_path) as c:
        for path in (os.path.join(inside, "final-link"), os.path.join(inside, "dir-link", "victim"), os.path.join(inside, "dir-link", "new")):
            with pytest.raises(SupervisorError) as e:
                c.write_file(path, b"evil")
            assert e.value.code == "SYMLINK_REFUSED", e.value
        with pytest.raises(SupervisorError) as e:
            c.read_file(os.path.join(inside, "final-link"))
        assert e.value.code == "SYMLINK_REFUSED"
        with pytest.raises(SupervisorError) as e:
            c.write_file(os.path.join(inside, "missing", "x"), b"x")
        assert e.value.code == "NOT_FOUND"
    with open(victim, "rb") as f:
        assert f.read() == b"original"
    assert os.listdir(outside) == ["victim"]
    assert sorted(os.listdir(inside)) == ["dir-link", "final-link"]


def _tar_with(*members: tarfile.TarInfo) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for m in members:
            if m.isfile():
                t.addfile(m, io.BytesIO(b"x" * m.size))
            else:
                t.addfile(m)
    return buf.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    m = tarfile.TarInfo(name)
    m.type = kind
    m.linkname = linkname
    m.size = 1 if kind == tarfile.REGTYPE else 0
    return m


@pytest.mark.parametrize(
    "members",
    [
        [_member("/etc/evil")],
        [_member("../evil")],
        [_member("a/../../evil")],
        [_member("abs-link", tarfile.SYMTYPE, "/etc")],
        [_member("up-link", tarfile.SYMTYPE, "../..")],
        [_member("sub", tarfile.DIRTYPE), _member("sub/out", tarfile.SYMTYPE, "../../x")],
        [_member("hard", tarfile.LNKTYPE, "../evil")],
        [_member("ok-link", tarfile.SYMTYPE, "."), _member("esc", tarfile.SYMTYPE, ".."), _member("esc/evil")],
    ],
    ids=["absolute", "dotdot", "inner-dotdot", "symlink-absolute", "symlink-up", "symlink-nested-up", "hardlink-out", "through-link"],
)
def test_download_extraction_refuses_escapes(tmp: str, members):
    target = os.path.join(tmp, "t")
    os.mkdir(target)
    data = _tar_with(*members)
    with pytest.raises(SupervisorError) as e:
        F._extract_stream(F._ChunkReader(iter([data])), target)
    assert e.value.code == "FILE_ERROR" and "download: refused" in e.value.message
    assert not os.path.exists(os.path.join(tmp, "evil")) and not os.path.exists("/etc/evil")


def test_download_extraction_keeps_links_inside(tmp: str):
    target = os.path.join(tmp, "t")
    os.mkdir(target)
    data = _tar_with(_member("a"), _member("d", tarfile.DIRTYPE), _member("d/l", tarfile.SYMTYPE, "../a"), _member("self", tarfile.SYMTYPE, "."))
    F._extract_stream(F._ChunkReader(iter([data[i : i + 700] for i in range(0, len(data), 700)])), target)
    assert os.readlink(os.path.join(target, "d", "l")) == "../a"
    assert open(os.path.join(target, "d", "l"), "rb").read() == b"x"


def test_quota_and_size_limit(tmp: str):
    d = Daemon({"drain": {"quotaBytes": MiB, "postDeathDrainMs": 2000}, "files": {"maxBytes": 4 * MiB}})
    try:
        d.start()
        path = os.path.join(tmp, "q")
        data = os.urandom(3 * MiB)
        with Client(d.socket_path) as c:
            with pytest.raises(SupervisorError) as e:
                c.write_file(path, b"\0" * (4 * MiB + 1))
            assert e.value.code == "LIMIT_EXCEEDED" and e.value.details["limit"] == "file_bytes"
            assert os.listdir(tmp) == []
            c.write_file(path, data)
            with pytest.raises(SupervisorError) as e:
                c.read_file(path)
            assert e.value.code == "OUTPUT_QUOTA_EXCEEDED"
            assert (e.value.details["total_bytes"], e.value.details["stored_bytes"], e.value.details["dropped_bytes"]) == (3 * MiB, MiB, 2 * MiB)
    finally:
        d.stop()


def test_fifo_and_device_refused(daemon: Daemon, tmp: str):
    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    with Client(daemon.socket_path) as c:
        for call in (lambda: c.read_file(fifo, timeout_seconds=20), lambda: c.read_file("/dev/null"), lambda: c.write_file(fifo, b"x", timeout_seconds=20)):
            with pytest.raises(SupervisorError) as e:
                call()
            assert e.value.code == "NOT_A_REGULAR_FILE", e.value
        with pytest.raises(SupervisorError) as e:
            c.read_file(tmp + "/")
        assert e.value.code == "INVALID_ARGUMENT"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.listdir(tmp) == ["fifo"]


def test_download_names_a_skipped_socket(daemon: Daemon, tmp: str):
    import socket

    remote, local = os.path.join(tmp, "r"), os.path.join(tmp, "l")
    os.mkdir(remote)
    os.mkdir(local)
    s = socket.socket(socket.AF_UNIX)
    s.bind(os.path.join(remote, "sock"))
    s.close()
    with Client(daemon.socket_path) as c:
        with pytest.raises(SupervisorError) as e:
            c.download(remote, local)
    assert e.value.code == "FILE_ERROR" and e.value.details["skipped"] == ["./sock"]
    assert os.listdir(local) == []


def test_small_frames_and_cancel_on_failure(tmp: str, monkeypatch):
    d = Daemon({"ipc": {"maxFrameBytes": 256 * 1024}})
    try:
        d.start()
        data = os.urandom(3 * MiB + 5)
        with Client(d.socket_path) as c:
            assert c.hello.max_frame_bytes == 256 * 1024
            c.write_file(os.path.join(tmp, "f"), data)
            assert open(os.path.join(tmp, "f"), "rb").read() == data

            async def run() -> bytes:
                async with AsyncClient(d.socket_path) as a:
                    await a.write_file(os.path.join(tmp, "g"), data)
                    return await a.read_file(os.path.join(tmp, "g"))

            assert asyncio.run(run()) == data
            # A client that ignores the limit (the old 4 MiB writes): FRAME_TOO_LARGE, and its session is cancelled, not left on stdin.
            monkeypatch.setattr(F, "chunk_bytes", lambda hello: 4 * MiB)
            with pytest.raises(SupervisorError):
                c.write_file(os.path.join(tmp, "h"), data, key="too-big")
            r = c.wait(InvocationKey("too-big"))
            assert r["outcome"] in ("cancelled", "killed"), r
        assert sorted(os.listdir(tmp)) == ["f", "g"]
    finally:
        d.stop()
