"""Client.diff() / diff_checkpoints(): what changed between two checkpoints, read from the local
store in Python (sandbox_supervisor/diff.py, no sbx bin) with the same result as `sbx diff
--json`: added, removed, modified, a chmod, a file replaced by a symlink, a name that is not
UTF-8 (path_b64), mtime-only not a change; A A identical; --task (from None for the first); AsyncClient.diff;
sbx= runs the bin and answers the same; refusals with sbx's codes."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import uuid

import pytest

from daemon import SBX_BIN, Daemon
from sandbox_supervisor import Client, SupervisorError, diff_checkpoints

LATIN = b"n\xff.b"


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.fixture(scope="module")
def pair(daemon: Daemon, tmp_path_factory):
    ws = tmp_path_factory.mktemp("diffws")
    os.chmod(ws, 0o755)

    def put(name: str, data: bytes, mode: int = 0o644) -> None:
        (ws / name).write_bytes(data)
        os.chmod(ws / name, mode)

    put("keep", b"kept\n")
    put("edit", b"old\n")
    put("grow", b"abc\n")
    put("gone", b"bye\n")
    put("script", b"#!/bin/sh\n")
    put("swap", b"a file\n")
    tasks = (f"diff-a-{uuid.uuid4().hex[:8]}", f"diff-b-{uuid.uuid4().hex[:8]}")
    with Client(daemon.socket_path) as c:
        a = c.checkpoint(str(ws), task=tasks[0])["checkpoint_id"]
        put("edit", b"NEW\n")  # same size, other bytes
        put("grow", b"abcd\n")  # another size: other content too
        os.unlink(ws / "gone")
        os.chmod(ws / "script", 0o755)
        os.unlink(ws / "swap")
        os.symlink("keep", ws / "swap")
        fd = os.open(os.path.join(os.fsencode(str(ws)), LATIN), os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"latin\n")
        os.close(fd)
        os.utime(ws / "keep", ns=(1_000_000_000, 1_000_000_000))  # mtime only: no change
        b = c.checkpoint(str(ws), task=tasks[1])["checkpoint_id"]
    return str(ws), a, b, tasks


@pytest.fixture
def no_sbx(monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("SBX_BIN", raising=False)
    assert shutil.which("sbx") is None


def sbx_diff(daemon: Daemon, *args: str):
    p = daemon.sbx(["diff", *args, "--json", "--state-dir", daemon.state_dir])
    assert p.returncode in (0, 1), p.stderr
    return p.returncode, json.loads(p.stdout)


def test_diff_in_python_equals_sbx_diff(daemon: Daemon, pair, no_sbx):
    ws, a, b, tasks = pair
    with Client(daemon.socket_path) as c:
        ours = c.diff(a[:10], b)
    status, theirs = sbx_diff(daemon, a, b)
    assert status == 1
    assert ours == theirs
    assert ours["from"]["checkpoint_id"] == a and ours["to"]["checkpoint_id"] == b
    assert (ours["from"]["task"], ours["to"]["task"], ours["to"]["workspace"]) == (tasks[0], tasks[1], ws)
    assert ours["added"] == [{"path_b64": base64.b64encode(LATIN).decode(), "type": "file", "size": 6, "mode": 0o600, "sha256": sha(b"latin\n")}]
    assert ours["removed"] == [{"path": "gone", "type": "file", "size": 4, "mode": 0o644, "sha256": sha(b"bye\n")}]
    assert ours["modified"] == [
        {"path": "edit", "type": "file", "changed": ["content"], "old_size": 4, "new_size": 4, "old_mode": 0o644, "new_mode": 0o644, "old_sha256": sha(b"old\n"), "new_sha256": sha(b"NEW\n")},
        {"path": "grow", "type": "file", "changed": ["content", "size"], "old_size": 4, "new_size": 5, "old_mode": 0o644, "new_mode": 0o644, "old_sha256": sha(b"abc\n"), "new_sha256": sha(b"abcd\n")},
    ]
    assert ours["type_changed"] == [{"path": "swap", "old_type": "file", "new_type": "symlink", "old_size": 7, "new_size": 4, "old_mode": 0o644, "new_mode": 0o777}]
    assert ours["mode_changed"] == [{"path": "script", "type": "file", "old_mode": 0o644, "new_mode": 0o755}]
    assert ours["owner_changed"] == []
    assert ours["counts"] == {"added": 1, "removed": 1, "modified": 2, "type_changed": 1, "mode_changed": 1, "owner_changed": 0}
    assert ours["identical"] is False


def test_identical_and_task(daemon: Daemon, pair, no_sbx):
    ws, a, b, tasks = pair
    same = diff_checkpoints(a, a, state_dir=daemon.state_dir)
    assert same["identical"] is True and same["counts"] == dict.fromkeys(same["counts"], 0)
    assert same == sbx_diff(daemon, a, a)[1]
    with Client(daemon.socket_path) as c:
        by_task = c.diff(task=tasks[1])
        first = c.diff(task=tasks[0])
    assert by_task == [diff_checkpoints(a, b, state_dir=daemon.state_dir)]
    assert by_task == sbx_diff(daemon, "--task", tasks[1])[1]
    assert len(first) == 1 and first[0]["to"]["checkpoint_id"] == a
    assert first[0]["from"] is None  # the first checkpoint of this workspace: everything added
    assert [e["path"] for e in first[0]["added"]] == ["edit", "gone", "grow", "keep", "script", "swap"]
    assert first == sbx_diff(daemon, "--task", tasks[0])[1]


def test_state_dir_defaults_to_sbx_state_dir(daemon: Daemon, pair, no_sbx, monkeypatch):
    # As sbx and the TS diffCheckpoints: without state_dir or store, $SBX_STATE_DIR's store.
    ws, a, b, tasks = pair
    monkeypatch.setenv("SBX_STATE_DIR", daemon.state_dir)
    assert diff_checkpoints(a, b) == diff_checkpoints(a, b, state_dir=daemon.state_dir)


def test_sbx_bin_answers_the_same(daemon: Daemon, pair):
    _, a, b, _ = pair
    assert diff_checkpoints(a, b, state_dir=daemon.state_dir, sbx=SBX_BIN) == diff_checkpoints(a, b, state_dir=daemon.state_dir)


def test_refusals_name_sbx_codes(daemon: Daemon, pair, no_sbx, tmp_path):
    _, a, b, _ = pair
    with pytest.raises(SupervisorError) as e:
        diff_checkpoints("0" * 64, b, state_dir=daemon.state_dir)
    assert e.value.code == "NOT_FOUND"
    assert str(e.value.message) == f"diff: no checkpoint {'0' * 64} in {os.path.join(daemon.state_dir, 'checkpoints')} (never taken there, or removed by gc)"
    with pytest.raises(SupervisorError) as e2:
        diff_checkpoints("0" * 64, b, state_dir=daemon.state_dir, sbx=SBX_BIN)
    assert (e2.value.code, e2.value.message) == (e.value.code, e.value.message)
    with pytest.raises(SupervisorError) as e3:
        diff_checkpoints(None, None, task=f"none-{uuid.uuid4().hex}", state_dir=daemon.state_dir)
    assert e3.value.code == "NOT_FOUND"
    # A copy of the store with A's manifest edited: refused as INVALID_ARGUMENT, in Python and by sbx.
    copy = str(tmp_path / "store")
    shutil.copytree(os.path.join(daemon.state_dir, "checkpoints"), copy, symlinks=True)
    f = os.path.join(copy, "manifests", f"{a}.json")
    os.chmod(f, 0o644)
    with open(f, "rb") as fh:
        data = fh.read()
    # An entry's size; a version 2 manifest lists none (they are in its trees): its created_at.
    edited = data.replace(b'"size":4', b'"size":5', 1)
    edited = edited if edited != data else data.replace(b'"created_at":"2', b'"created_at":"3', 1)
    assert edited != data
    with open(f, "wb") as fh:
        fh.write(edited)
    for sbx in (None, SBX_BIN):
        with pytest.raises(SupervisorError) as e4:
            diff_checkpoints(a, b, store=copy, key_path=daemon.public_key_path, sbx=sbx)
        assert e4.value.code == "INVALID_ARGUMENT"
        assert e4.value.message.startswith(f"diff: checkpoint {a}: its manifest does not verify: ")


def test_chunks_against_one_sha256_compare_by_content():
    from sandbox_supervisor.diff import chunk_list_key, diff_entries, undecided_chunk_lists

    def f(**kw):
        return {"path": "f", "type": "file", "mode": 0o644, "uid": 0, "gid": 0, "size": 6, "mtime_ns": "1", **kw}

    whole = f(sha256="1" * 64)
    one = f(chunks=[{"sha256": "1" * 64, "size": 6}])
    two = f(chunks=[{"sha256": "2" * 64, "size": 3}, {"sha256": "3" * 64, "size": 3}])
    assert diff_entries([whole], [one])["identical"] is True
    assert diff_entries([two], [dict(two, mtime_ns="9")])["identical"] is True
    assert undecided_chunk_lists([whole], [two]) == [two["chunks"]]
    assert diff_entries([whole], [two])["counts"]["modified"] == 1
    assert diff_entries([whole], [two], {chunk_list_key(two["chunks"]): "1" * 64})["identical"] is True


def test_async_client_diff_is_the_same(daemon: Daemon, pair, no_sbx):
    import asyncio

    from sandbox_supervisor import AsyncClient

    _, a, b, tasks = pair

    async def main():
        async with AsyncClient(daemon.socket_path) as c:
            return await c.diff(a, b), await c.diff(task=tasks[1])

    one, by_task = asyncio.run(main())
    assert one == diff_checkpoints(a, b, state_dir=daemon.state_dir)
    assert by_task == [one]
