"""Offline verification in Python (sandbox_supervisor.state_verify) against `sbx verify --state-dir`:
on copies of one state dir holding a closed task (sessions with output, a checkpoint of a
workspace), both agree on the good task receipt and on each tampering: a flipped byte in an
output chunk file, a flipped byte in a checkpoint object, a removed session receipt. Also the
session receipt and close receipt paths, planted links and a malformed output-removed record
as problems (never exceptions), and an s3:// store refused with the fallback named."""
from __future__ import annotations

import json
import os
import secrets
import shutil
from typing import Iterator

import pytest

from daemon import Daemon
from sandbox_supervisor import Client, SupervisorError
from sandbox_supervisor.state_verify import LocalStore, check_manifest, chunk_file_name, verify_state, verify_task_receipt


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return tmp_path_factory.mktemp("ws")


@pytest.fixture(scope="module")
def daemon(workspace) -> Iterator[Daemon]:
    """This module's supervisor watches the workspace (a close checkpoints only a watched one)."""
    d = Daemon({"workspace": {"paths": [str(workspace)]}})
    try:
        d.start()
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def closed(daemon: Daemon, workspace):
    """A task with two sessions (stdout and stderr output) whose close checkpointed a workspace."""
    ws = workspace
    (ws / "a.txt").write_bytes(b"alpha\n" * 1000)
    os.makedirs(ws / "sub")
    (ws / "sub" / "b.bin").write_bytes(os.urandom(70_000))
    os.symlink("a.txt", ws / "link")
    task = f"t-{secrets.token_hex(4)}"
    with Client(daemon.socket_path) as c:
        runs = [
            c.run(["sh", "-c", "i=0; while [ $i -lt 300 ]; do echo line $i; echo err $i >&2; i=$((i+1)); done"], key=f"py-{secrets.token_hex(6)}", task=task, cwd=str(ws)),
            c.run(["sh", "-c", "printf 'x%.0s' $(seq 1 5000)"], key=f"py-{secrets.token_hex(6)}", task=task, cwd=str(ws)),
        ]
        receipt = c.close_task(task, workspaces=[str(ws)], timeout_seconds=30)
    assert [r.exit_code for r in runs] == [0, 0]
    assert [cp["checkpoint_id"] is not None for cp in receipt["checkpoints"]] == [True], receipt
    return receipt, runs


def sbx_verify(daemon: Daemon, receipt_path: str, state_dir: str) -> dict:
    p = daemon.sbx(["verify", receipt_path, "--state-dir", state_dir, "--json"])
    assert p.returncode in (0, 1), p.stderr
    out = json.loads(p.stdout)
    assert out["ok"] == (p.returncode == 0)
    return out


def copy_state(daemon: Daemon, tmp_path, name: str) -> str:
    dst = str(tmp_path / name)
    shutil.copytree(daemon.state_dir, dst, symlinks=True, ignore=lambda d, names: [n for n in names if n.endswith(".sock")])
    return dst


def flip(path: str, at: int = 0) -> None:
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x01]))


def both(daemon: Daemon, receipt: dict, state_dir: str, tmp_path):
    path = str(tmp_path / f"r-{secrets.token_hex(4)}.json")
    with open(path, "w") as f:
        json.dump(receipt, f)
    ours = verify_state(receipt, state_dir)
    theirs = sbx_verify(daemon, path, state_dir)
    return ours, theirs


def test_good_task_agrees(daemon: Daemon, closed, tmp_path):
    receipt, _ = closed
    state = copy_state(daemon, tmp_path, "good")
    ours, theirs = both(daemon, receipt, state, tmp_path)
    assert (ours.ok, ours.problems) == (True, []) and theirs["ok"] is True, theirs
    assert (ours.objects, ours.bytes) == (theirs["objects"], theirs["bytes"]) and ours.objects >= 2


def test_flipped_chunk_byte_agrees(daemon: Daemon, closed, tmp_path):
    receipt, runs = closed
    state = copy_state(daemon, tmp_path, "chunk")
    flip(os.path.join(state, "sessions", runs[0].session_id, "stderr", chunk_file_name(0)), 7)
    ours, theirs = both(daemon, receipt, state, tmp_path)
    assert ours.ok is False and theirs["ok"] is False
    assert sorted(ours.problems) == sorted(theirs["problems"])
    assert any(p.startswith(f"{runs[0].session_id}: stderr: sha256 on disk ") for p in ours.problems), ours.problems


def test_flipped_object_byte_agrees(daemon: Daemon, closed, tmp_path):
    receipt, _ = closed
    state = copy_state(daemon, tmp_path, "object")
    cid = receipt["checkpoints"][0]["checkpoint_id"]
    local = LocalStore(os.path.join(state, "checkpoints"))
    m, _ = check_manifest(local.read_manifest(cid), store=local)  # version 1 or 2 (entries from its trees)
    entry = next(e for e in m["entries"] if e.get("path") == "sub/b.bin")
    sha = entry["sha256"] if entry.get("sha256") else entry["chunks"][0]["sha256"]
    flip(os.path.join(state, "checkpoints", "objects", sha[:2], sha), 100)
    ours, theirs = both(daemon, receipt, state, tmp_path)
    assert ours.ok is False and theirs["ok"] is False
    assert sorted(ours.problems) == sorted(theirs["problems"])
    assert any(sha in p and "changed in the store" in p for p in ours.problems)


def test_removed_session_receipt_agrees(daemon: Daemon, closed, tmp_path):
    receipt, runs = closed
    state = copy_state(daemon, tmp_path, "removed")
    os.unlink(os.path.join(state, "sessions", runs[1].session_id, "receipt.json"))
    ours, theirs = both(daemon, receipt, state, tmp_path)
    assert ours.ok is False and theirs["ok"] is False
    assert any(p.startswith(f"{runs[1].session_id}: receipt unreadable") for p in ours.problems)
    assert any(p.startswith(f"{runs[1].session_id}: receipt unreadable") for p in theirs["problems"])
    ours_rest = [p for p in ours.problems if "receipt unreadable" not in p]
    theirs_rest = [p for p in theirs["problems"] if "receipt unreadable" not in p]
    assert ours_rest == [] and all(p.startswith("condition ") or p.startswith("the task receipt says complete") for p in theirs_rest), theirs_rest


def test_session_receipt_agrees(daemon: Daemon, closed, tmp_path):
    _, runs = closed
    state = copy_state(daemon, tmp_path, "session")
    ours, theirs = both(daemon, runs[0].receipt, state, tmp_path)
    assert ours.ok is True and theirs["ok"] is True
    # The counts say what was re-read: each chunk file the receipt names, and its bytes.
    chunks = [c for st in runs[0].receipt["output"].values() if st for c in st["chunks"]]
    assert (ours.objects, ours.bytes) == (len(chunks), sum(c["length"] for c in chunks)) and ours.bytes > 0
    flip(os.path.join(state, "sessions", runs[0].session_id, "stdout", chunk_file_name(0)), 3)
    ours, theirs = both(daemon, runs[0].receipt, state, tmp_path)
    assert ours.ok is False and theirs["ok"] is False and sorted(ours.problems) == sorted(theirs["problems"])


def test_s3_store_is_refused_naming_the_fallback(daemon: Daemon, closed):
    receipt, _ = closed
    with pytest.raises(SupervisorError) as e:
        verify_task_receipt(receipt, daemon.state_dir, store="s3://bucket/prefix")
    assert e.value.code == "INVALID_ARGUMENT" and "sbx" in e.value.message


def test_planted_links_are_problems_agreeing_with_sbx(daemon: Daemon, closed, tmp_path):
    """A chunk replaced by a link (O_NOFOLLOW: ELOOP) or a stream directory replaced by a link to
    an identical copy: a problem naming it, as sbx's MISMATCH lines, never an exception or ok."""
    _, runs = closed
    state = copy_state(daemon, tmp_path, "links")
    sd = os.path.join(state, "sessions", runs[0].session_id)
    chunk = os.path.join(sd, "stdout", chunk_file_name(0))
    shutil.copy(chunk, str(tmp_path / "chunk-copy"))
    os.unlink(chunk)
    os.symlink(str(tmp_path / "chunk-copy"), chunk)
    shutil.copytree(os.path.join(sd, "stderr"), str(tmp_path / "stderr-copy"))
    shutil.rmtree(os.path.join(sd, "stderr"))
    os.symlink(str(tmp_path / "stderr-copy"), os.path.join(sd, "stderr"))
    ours, theirs = both(daemon, runs[0].receipt, state, tmp_path)
    assert ours.ok is False and theirs["ok"] is False
    assert "stderr: the stream directory is a symbolic link" in ours.problems and "stderr: the stream directory is a symbolic link" in theirs["problems"]
    assert any(p.startswith("stdout: cannot read the stored stream: ") for p in ours.problems), ours.problems
    assert any(p.startswith("stdout: cannot read the stored stream: ") for p in theirs["problems"]), theirs


def test_malformed_output_removed_record_is_a_problem(daemon: Daemon, closed, tmp_path):
    _, runs = closed
    state = copy_state(daemon, tmp_path, "removed")
    with open(os.path.join(state, "sessions", runs[1].session_id, "output-removed.json"), "w") as f:
        f.write("[1]")
    ours, theirs = both(daemon, runs[1].receipt, state, tmp_path)
    assert ours.ok is False and theirs["ok"] is False
    assert [p.split(":")[0] for p in ours.problems] == ["output-removed record unreadable"], ours.problems
    assert [p.split(":")[0] for p in theirs["problems"]] == ["output-removed record unreadable"], theirs
