"""Client.restore() without the sbx bin: PATH without sbx and $SBX_BIN unset, the local store is
restored in Python (sandbox_supervisor/restore.py) into a tree byte-exact to what `sbx restore`
makes from the same checkpoint (every entry's type, mode, owner, size, digest, link target and
mtime to the ns; the root's too), with the same result. Refusals as sbx's: a target that is a
symlink or not empty, a damaged object; an s3:// store without sbx names the fallback."""
from __future__ import annotations

import json
import os
import shutil
import stat

import pytest

from daemon import Daemon
from sandbox_supervisor import Client, SupervisorError
from sandbox_supervisor.restore import describe_tree
from sandbox_supervisor.state_verify import LocalStore, check_manifest


@pytest.fixture(scope="module")
def checkpoint(daemon: Daemon, tmp_path_factory):
    ws = tmp_path_factory.mktemp("ws")
    (ws / "a.txt").write_bytes(b"alpha\n" * 1000)
    (ws / "empty").write_bytes(b"")
    os.makedirs(ws / "sub" / "deeper")
    (ws / "sub" / "big.bin").write_bytes(os.urandom(9 * 1024 * 1024 + 17))
    (ws / "sub" / "deeper" / "x.sh").write_bytes(b"#!/bin/sh\necho x\n")
    os.chmod(ws / "sub" / "deeper" / "x.sh", 0o755)
    (ws / "setuid").write_bytes(b"s")
    os.chown(ws / "setuid", 65534, 65534)
    os.chmod(ws / "setuid", 0o4750)  # after chown, which clears set-ID bits
    (ws / "ro").write_bytes(b"ro")
    os.chmod(ws / "ro", 0o444)
    os.symlink("a.txt", ws / "link")
    os.symlink("../../outside", ws / "sub" / "dangling")
    os.mkfifo(ws / "fifo", 0o640)
    os.chmod(ws / "sub", 0o750)
    os.utime(ws / "a.txt", ns=(1_600_000_000_123_456_789, 1_600_000_000_123_456_789))
    with Client(daemon.socket_path) as c:
        cp = c.checkpoint(str(ws))
    assert cp["consistent"] is True
    return cp["checkpoint_id"]


@pytest.fixture
def no_sbx(monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("SBX_BIN", raising=False)
    assert shutil.which("sbx") is None


def tree(root: str):
    st = os.lstat(root)
    return (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns), describe_tree(root)


def test_restore_without_sbx_equals_sbx_restore(daemon: Daemon, checkpoint, tmp_path, no_sbx):
    ours_dir, theirs_dir = str(tmp_path / "ours"), str(tmp_path / "theirs")
    with Client(daemon.socket_path) as c:
        ours = c.restore(checkpoint, ours_dir)
    p = daemon.sbx(["restore", checkpoint, theirs_dir, "--json", "--state-dir", daemon.state_dir])
    assert p.returncode == 0, p.stderr
    theirs = json.loads(p.stdout)
    assert ours["identical"] is True and ours["differences"] == []
    drop = ("target", "ms")
    assert {k: v for k, v in ours.items() if k not in drop} == {k: v for k, v in theirs.items() if k not in drop}
    assert tree(ours_dir) == tree(theirs_dir)
    entries = {e["path"]: e for e in describe_tree(ours_dir)}
    assert entries["setuid"]["mode"] == 0o4750 and entries["setuid"]["uid"] == 65534  # root: owners and set-ID kept
    assert (entries["link"]["type"], entries["link"]["target"]) == ("symlink", "a.txt")
    assert entries["sub/dangling"]["target"] == "../../outside" and not os.path.exists(os.path.join(ours_dir, "outside"))
    assert entries["a.txt"]["mtime_ns"] == "1600000000123456789" and entries["fifo"]["type"] == "fifo"
    assert entries["sub/big.bin"]["size"] == 9 * 1024 * 1024 + 17


def test_restore_refuses_a_symlink_or_a_non_empty_target(daemon: Daemon, checkpoint, tmp_path, no_sbx):
    os.makedirs(tmp_path / "elsewhere")
    os.symlink(str(tmp_path / "elsewhere"), tmp_path / "planted")
    os.makedirs(tmp_path / "full")
    (tmp_path / "full" / "x").write_bytes(b"")
    with Client(daemon.socket_path) as c:
        with pytest.raises(SupervisorError) as link:
            c.restore(checkpoint, str(tmp_path / "planted"))
        with pytest.raises(SupervisorError) as full:
            c.restore(checkpoint, str(tmp_path / "full"))
    assert (link.value.code, link.value.details["restore_error"]) == ("INVALID_ARGUMENT", "target")
    assert "is a symlink (never followed)" in link.value.message and os.listdir(tmp_path / "elsewhere") == []
    assert "is not empty" in full.value.message and os.listdir(tmp_path / "full") == ["x"]


def test_restore_stops_at_a_damaged_object(daemon: Daemon, checkpoint, tmp_path, no_sbx):
    store = str(tmp_path / "store")
    shutil.copytree(os.path.join(daemon.state_dir, "checkpoints"), store, symlinks=True)
    sha = next(e for e in manifest_entries(store, checkpoint) if e.get("path") == "a.txt")["sha256"]
    obj = os.path.join(store, "objects", sha[:2], sha)
    os.chmod(obj, 0o644)
    with open(obj, "r+b") as f:
        f.write(b"B")
    with Client(daemon.socket_path) as c:
        with pytest.raises(SupervisorError) as e:
            c.restore(checkpoint, str(tmp_path / "t"), store=store, key_path=daemon.public_key_path)
    assert e.value.details["restore_error"] == "object" and f"object {sha}" in e.value.message and "damaged" in e.value.message
    p = daemon.sbx(["restore", checkpoint, str(tmp_path / "t2"), "--store", store, "--public-key", daemon.public_key_path])
    assert p.returncode != 0 and b"damaged" in p.stderr


def test_s3_store_without_sbx_names_the_fallback(daemon: Daemon, checkpoint, tmp_path, no_sbx):
    with Client(daemon.socket_path) as c:
        with pytest.raises(SupervisorError) as e:
            c.restore(checkpoint, str(tmp_path / "t"), store="s3://bucket/prefix")
    assert e.value.code == "INVALID_ARGUMENT" and "sbx" in e.value.message and "SBX_BIN" in e.value.message


def manifest_entries(store: str, checkpoint: str) -> list:
    """A stored manifest's entries, version 1 or 2 (read from its trees; its signature not checked)."""
    local = LocalStore(store)
    m, problems = check_manifest(local.read_manifest(checkpoint), store=local)
    assert m is not None, problems
    return list(m["entries"])


def forge(daemon: Daemon, store: str, checkpoint: str, edit) -> str:
    """A checkpoint made from `checkpoint` with its entries edited by `edit`, digest and counts
    made to agree and signed with the supervisor's own key (so only the edit is wrong), published."""
    import base64
    import hashlib

    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    from sandbox_supervisor import canonicalize

    key = load_pem_private_key(open(os.path.join(daemon.state_dir, "receipt-key"), "rb").read(), password=None)

    def sign(doc: dict) -> dict:
        unsigned = {k: v for k, v in doc.items() if k != "signature"}
        sig = dict(doc["signature"], value=base64.b64encode(key.sign(canonicalize(unsigned))).decode())
        return {**unsigned, "signature": sig}

    m = json.load(open(os.path.join(store, "manifests", f"{checkpoint}.json")))
    if m.get("version") == 2:  # its entries are in its trees: forged as version 1 (readers take both)
        m = {k: v for k, v in m.items() if k != "tree"}
        m.update(version=1, entries=manifest_entries(store, checkpoint))
    m["entries"] = edit(m["entries"])
    m["scan"] = {**m["scan"], "entries": len(m["entries"]), "digest": "sha256:" + hashlib.sha256(canonicalize(m["entries"])).hexdigest()}
    data = canonicalize(sign(m))
    new_id = hashlib.sha256(data).hexdigest()
    with open(os.path.join(store, "manifests", f"{new_id}.json"), "wb") as f:
        f.write(data)
    pub = json.load(open(os.path.join(store, "published", f"{checkpoint}.json")))
    with open(os.path.join(store, "published", f"{new_id}.json"), "wb") as f:
        f.write(canonicalize(sign({**pub, "checkpoint_id": new_id})))
    return new_id


@pytest.mark.parametrize("case", ["escape", "through_link"])
def test_restore_refuses_a_path_escape_or_a_path_through_a_link(daemon: Daemon, checkpoint, tmp_path, no_sbx, case):
    store = str(tmp_path / "store")
    shutil.copytree(os.path.join(daemon.state_dir, "checkpoints"), store, symlinks=True)
    a = None

    def edit(entries):
        nonlocal a
        a = next(e for e in entries if e.get("path") == "a.txt")
        if case == "escape":
            return [{**a, "path": "../escape"}] + entries
        # "link" is a symlink to a.txt's dir level: a file under it would be written through it.
        i = next(i for i, e in enumerate(entries) if e.get("path") == "link")
        return entries[: i + 1] + [{**a, "path": "link/x"}] + entries[i + 1 :]

    forged = forge(daemon, store, checkpoint, edit)
    target = tmp_path / "t" / "inner"
    os.makedirs(target.parent)
    with Client(daemon.socket_path) as c:
        with pytest.raises(SupervisorError) as e:
            c.restore(forged, str(target), store=store, key_path=daemon.public_key_path)
    assert e.value.details["restore_error"] == "bad_manifest", e.value.message
    want = "not a relative path of plain names" if case == "escape" else "comes before (or without) its directory"
    assert want in e.value.message
    # Refused before anything was written through: nothing beside the target, a.txt as recorded.
    assert set(os.listdir(target.parent)) <= {"inner"} and not os.path.exists(tmp_path / "t" / "escape")
    if case == "through_link":
        assert open(target / "a.txt", "rb").read() == b"alpha\n" * 1000 and not os.path.lexists(target / "x")
    p = daemon.sbx(["restore", forged, str(tmp_path / "t2"), "--store", store, "--public-key", daemon.public_key_path])
    assert p.returncode != 0 and want.encode() in p.stderr, p.stderr
