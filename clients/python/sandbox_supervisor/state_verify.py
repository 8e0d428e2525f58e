"""Offline verification against a state dir, as ``sbx verify --state-dir DIR`` (core/receipts/verify.ts, cli/tasks.ts,
core/checkpoint/verify.ts; docs/reference/state-dir.md): a session receipt's chunk files re-hashed,
a close receipt's sessions and tasks, a task receipt's sessions and checkpoints (manifest v1, or v2 read
from its tree objects: tree.py; signature, publication, every local-store object re-hashed). Owns
these checks, worded as sbx's; needs ``cryptography``; an s3:// store is refused (no S3 client here).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

from .errors import SupervisorError
from .jcs import canonicalize
from .tree import ExpandedTree, ReadTree, _js, entry_problem, expand_tree
from .verify import receipt_digest, verify_receipt

SESSIONS_DIR = "sessions"
TASKS_DIR = "tasks"
ADMISSION_FILE = "admission.json"
RECEIPT_FILE = "receipt.json"
STARTED_FILE = "started.json"
CHANGES_FILE = "changes.jsonl"
ESCAPE_ATTESTED_FILE = "escape-attested.json"
OUTPUT_REMOVED_FILE = "output-removed.json"
INDEX_FILE = "index.bin"
TASK_RECEIPT_FILE = "receipt.json"
_UNREADABLE = re.compile(r"^receipt\.unreadable-\d+\.json$")
_READ_BLOCK = 1024 * 1024


@dataclass(frozen=True)
class StateVerification:
    """What verify_* against a state dir found: ``ok`` (also the truth value), ``problems`` in sbx's
    words ([] when it all holds), ``key_id`` of the receipt, ``objects``/``bytes``: what was re-read and
    hashed (a session receipt's chunk files, a checkpoint's store objects; 0 when nothing was)."""

    ok: bool
    problems: List[str] = field(default_factory=list)
    key_id: Optional[str] = None
    objects: int = 0
    bytes: int = 0

    def __bool__(self) -> bool:
        return self.ok


def chunk_file_name(start_cursor: int) -> str:
    """The file of the chunk starting at start_cursor: 16 hex digits + ``.chunk``."""
    return f"{start_cursor:016x}.chunk"


def task_dir_name(task: str) -> str:
    """A task's dir name in tasks/: the SHA-256 (hex) of the task id."""
    return hashlib.sha256(task.encode("utf-8")).hexdigest()


def _read_json(path: str) -> Any:
    with open(path, "rb") as f:
        text = f.read().decode("utf-8").rstrip("\0")
    try:
        return json.loads(text)
    except ValueError as err:
        raise ValueError(f"not JSON: {err}") from None


def _open_nofollow(path: str) -> int:
    return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)


def _stored_stream(session_dir: str, stream: str, chunk_bytes: int) -> Dict[str, Any]:
    """core/state/stream-files.ts storedStream: the chunk files from cursor 0 while contiguous, each
    re-read (O_NOFOLLOW) and hashed; the SHA-256 of all and of each; the index's digest."""
    d = os.path.join(session_dir, stream)
    chunks: List[Dict[str, Any]] = []
    cursor = 0
    if os.path.isdir(d):
        while True:
            try:
                size = os.lstat(os.path.join(d, chunk_file_name(cursor))).st_size
            except OSError:
                break
            chunks.append({"start_cursor": cursor, "length": size})
            cursor += size
            if size < chunk_bytes:
                break
    whole = hashlib.sha256()
    for c in chunks:
        h = hashlib.sha256()
        fd = _open_nofollow(os.path.join(d, chunk_file_name(c["start_cursor"])))
        try:
            left = c["length"]
            while left > 0:
                b = os.read(fd, min(_READ_BLOCK, left))
                if not b:
                    raise OSError(f"chunk {chunk_file_name(c['start_cursor'])} ends early")
                h.update(b)
                whole.update(b)
                left -= len(b)
        finally:
            os.close(fd)
        c["sha256"] = h.hexdigest()
    index = hashlib.sha256()
    try:
        with open(os.path.join(d, INDEX_FILE), "rb") as f:
            index.update(f.read())
    except OSError:
        pass  # no index: the digest of nothing
    return {"final_cursor": cursor, "sha256": whole.hexdigest(), "index_sha256": index.hexdigest(), "chunks": chunks}


def verify_stored_output(receipt: Mapping[str, Any], state_dir: str) -> List[str]:
    """Problems with the stored output of a session receipt in state_dir (core/receipts/verify.ts
    verifyStoredOutput): nothing added to the session dir, each stream's chunk files re-read
    and compared with final_cursor, sha256, every chunk's digest and index_sha256."""
    d = os.path.join(state_dir, SESSIONS_DIR, str(receipt.get("session_id")))
    if not os.path.exists(d):
        return [f"no session directory {d}"]
    try:
        chunk_bytes = int(_read_json(os.path.join(d, ADMISSION_FILE))["chunk_bytes"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        return [f"admission record unreadable: {err}"]
    removed_path = os.path.join(d, OUTPUT_REMOVED_FILE)
    if os.path.exists(removed_path):
        try:
            removed = _read_json(removed_path)
            return [f"the stored output was removed by the retention policy at {removed['removed_at']}: only the signature can be checked"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            return [f"output-removed record unreadable: {err}"]
    problems: List[str] = []
    output: Mapping[str, Any] = receipt.get("output") or {}
    streams = list(output)
    records = [ADMISSION_FILE, RECEIPT_FILE, STARTED_FILE, CHANGES_FILE]
    if (receipt.get("death") or {}).get("evidence") == "cgroup_escaped":
        records.append(ESCAPE_ATTESTED_FILE)
    for entry in sorted(os.listdir(d)):
        if entry in records or entry in streams or _UNREADABLE.match(entry):
            continue
        problems.append(f"unexpected entry in the session directory: {entry}")
    for name, expected in output.items():
        listed = {chunk_file_name(c["start_cursor"]) for c in expected.get("chunks") or []} | {INDEX_FILE}
        sd = os.path.join(d, name)
        for entry in sorted(os.listdir(sd)) if os.path.isdir(sd) else []:
            if entry not in listed:
                problems.append(f"{name}: unexpected file {entry}")
    for name, expected in output.items():
        # A planted link (the stream's directory, or a chunk: opened O_NOFOLLOW) is a mismatch, not a crash.
        if os.path.islink(os.path.join(d, name)):
            problems.append(f"{name}: the stream directory is a symbolic link")
            continue
        try:
            disk = _stored_stream(d, name, chunk_bytes)
        except OSError as err:
            problems.append(f"{name}: cannot read the stored stream: {_os_message(err)}")
            continue
        if disk["final_cursor"] != expected.get("final_cursor"):
            problems.append(f"{name}: {disk['final_cursor']} bytes on disk, the receipt says {expected.get('final_cursor')}")
        if disk["sha256"] != expected.get("sha256"):
            problems.append(f"{name}: sha256 on disk {disk['sha256']}, the receipt says {expected.get('sha256')}")
        if disk["index_sha256"] != expected.get("index_sha256"):
            problems.append(f"{name}: index sha256 on disk {disk['index_sha256']}, the receipt says {expected.get('index_sha256')}")
        chunks = expected.get("chunks") or []
        if len(chunks) != len(disk["chunks"]):
            problems.append(f"{name}: {len(disk['chunks'])} chunk files on disk, the receipt lists {len(chunks)}")
        for c, dc in zip(chunks, disk["chunks"]):
            if dc["start_cursor"] != c["start_cursor"] or dc["length"] != c["length"] or (c.get("sha256") is not None and dc["sha256"] != c["sha256"]):
                problems.append(f"{name}: chunk at {c['start_cursor']} differs (disk: {dc['length']} bytes, {dc['sha256']}; receipt: {c['length']} bytes, {c.get('sha256') or 'no chunk digest'})")
    return problems


def verify_close_sessions(close: Mapping[str, Any], state_dir: str, public_key_pem: str) -> List[str]:
    """Each listed session receipt (``sessions[]`` of a close or task receipt) must be in state_dir,
    hash to its ``receipt_sha256``, verify under the key, and its stored output match it."""
    problems: List[str] = []
    for entry in close.get("sessions") or []:
        if entry.get("receipt_sha256") is None:
            continue
        sid = entry["session_id"]
        try:
            receipt = _read_json(os.path.join(state_dir, SESSIONS_DIR, sid, RECEIPT_FILE))
        except (OSError, ValueError) as err:
            problems.append(f"{sid}: receipt unreadable: {_os_message(err)}")
            continue
        digest = receipt_digest(receipt)
        if digest != entry["receipt_sha256"]:
            problems.append(f"{sid}: receipt digest {digest}, the close receipt says {entry['receipt_sha256']}")
        problems.extend(f"{sid}: {p}" for p in verify_receipt(receipt, public_key_pem).problems)
        problems.extend(f"{sid}: {p}" for p in verify_stored_output(receipt, state_dir))
    return problems


def _os_message(err: BaseException) -> str:
    if isinstance(err, FileNotFoundError):
        return f"ENOENT: no such file or directory, open '{err.filename}'"
    return str(err)


def verify_close_tasks(close: Mapping[str, Any], state_dir: str) -> List[str]:
    """Each task a close receipt lists: its task receipt in state_dir hashes to the digest listed."""
    problems: List[str] = []
    for t in close.get("tasks") or []:
        path = os.path.join(state_dir, TASKS_DIR, task_dir_name(t["task"]), TASK_RECEIPT_FILE)
        try:
            digest = receipt_digest(_read_json(path))
        except (OSError, ValueError) as err:
            problems.append(f"task {json.dumps(t['task'])}: task receipt unreadable: {_os_message(err)}")
            continue
        if digest != t["receipt_sha256"]:
            problems.append(f"task {json.dumps(t['task'])}: task receipt digest {digest}, the close receipt says {t['receipt_sha256']}")
    return problems


# -- checkpoints (core/checkpoint/manifest.ts, verify.ts, local-store.ts) ---------------


def _entry_path(e: Mapping[str, Any]) -> bytes:
    import base64

    if e.get("path") is not None:
        return str(e["path"]).encode("utf-8", "surrogateescape")
    if e.get("path_b64") is not None:
        return base64.b64decode(e["path_b64"])
    raise ValueError("a manifest entry has neither path nor path_b64")


def _show_path(e: Mapping[str, Any], max_chars: int = 200) -> str:
    """manifest.ts showEntryPath: a path for people, bytes that are not printable ASCII of a
    path_b64 as \\xNN; past max_chars its tail after "..."."""
    if e.get("path") is not None:
        out = str(e["path"])
    else:
        out = "".join(chr(b) if 0x20 <= b < 0x7F else f"\\x{b:02x}" for b in _entry_path(e))
    return out if len(out) <= max_chars else f"...{out[len(out) - max_chars:]}"


def _path_key(p: bytes) -> Tuple[bytes, ...]:
    """Sort key of comparePaths: component by component ('/' ends a component: shorter first)."""
    return tuple(p.split(b"/"))


class Manifest(Dict[str, Any]):
    """A manifest as check_manifest returns it: the parsed JSON (a dict), ``entries`` filled in from
    its trees for version 2 (never written back: the stored bytes have none), and ``trees``: the
    tree objects those entries were read from (id -> size in bytes; {} for version 1); ``unsigned``:
    a key was given and its signature does not verify (then its trees are not read)."""

    trees: Dict[str, int]
    unsigned: bool

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trees = {}
        self.unsigned = False


def manifest_objects(manifest: Mapping[str, Any]) -> Dict[str, int]:
    """manifest.ts manifestObjects: every object a manifest names, each once: sha256 -> size (whole
    files and chunks and, for a version 2 manifest as check_manifest returned it, its tree objects)."""
    out: Dict[str, int] = dict(getattr(manifest, "trees", None) or {})
    for e in manifest.get("entries") or []:
        if e.get("type") != "file":
            continue
        if e.get("sha256") is not None:
            out[e["sha256"]] = e["size"]
        for c in e.get("chunks") or []:
            out[c["sha256"]] = c["size"]
    return out


class LocalStore:
    """The local checkpoint store (``<state>/checkpoints`` or a directory given): objects/<aa>/<sha256>,
    manifests/<id>.json, published/<id>.json; every file opened O_NOFOLLOW (a planted link is
    refused, never followed), directories checked to be real directories."""

    def __init__(self, directory: str) -> None:
        if directory.startswith("s3://"):
            raise SupervisorError("INVALID_ARGUMENT", f"the store {directory} is in S3: this library reads the local store only (no S3 client here); use sbx verify / sbx restore --store {directory} (Client.restore with sbx=, or $SBX_BIN)")
        self.location = directory

    def _open(self, *parts: str) -> int:
        path = self.location
        for p in parts[:-1]:
            path = os.path.join(path, p)
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode):
                raise OSError(f"{path} is not a directory (a planted link?)")
        return _open_nofollow(os.path.join(path, parts[-1]))

    def _read(self, *parts: str) -> Optional[bytes]:
        try:
            fd = self._open(*parts)
        except FileNotFoundError:
            return None
        try:
            out = bytearray()
            while True:
                b = os.read(fd, _READ_BLOCK)
                if not b:
                    return bytes(out)
                out += b
        finally:
            os.close(fd)

    def read_manifest(self, checkpoint_id: str) -> bytes:
        b = self._read("manifests", f"{checkpoint_id}.json")
        if b is None:
            raise FileNotFoundError(f"no manifest {checkpoint_id} in {self.location}")
        return b

    def read_published(self, checkpoint_id: str) -> Optional[bytes]:
        return self._read("published", f"{checkpoint_id}.json")

    def read_object(self, sha256: str) -> Iterator[bytes]:
        """The object's bytes in pieces; OSError when it is missing or not a regular file."""
        if not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise ValueError(f"not an object name: {sha256!r}")
        fd = self._open("objects", sha256[:2], sha256)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(f"object {sha256} is not a regular file")
            while True:
                b = os.read(fd, _READ_BLOCK)
                if not b:
                    return
                yield b
        finally:
            os.close(fd)

    def read_tree(self, tree: str) -> Optional[bytes]:
        """A tree object's bytes (manifest version 2: tree.py), read as read_object reads an object;
        None when the store has no such object, OSError when it cannot be read, ValueError for a bad name."""
        try:
            return b"".join(self.read_object(tree))
        except FileNotFoundError:
            return None


def _entries_problems(entries: List[Any]) -> List[str]:
    """manifest.ts entriesProblems: plain relative paths, in order, none twice, none under a mount
    point (never entered), each one's fields (tree.py entry_problem)."""
    problems: List[str] = []
    prev: Optional[bytes] = None
    mount: Optional[bytes] = None  # the last mount point: nothing under it is walked
    for e in entries:
        if not isinstance(e, dict):
            problems.append("a manifest entry has neither path nor path_b64")
            continue
        try:
            p = _entry_path(e)
        except ValueError as err:
            problems.append(str(err))
            continue
        shown = _js(_show_path(e))
        if not p or p.startswith(b"/") or b"\0" in p or any(c in (b"", b".", b"..") for c in p.split(b"/")):
            problems.append(f"entry {shown}: not a relative path of plain names")
        if prev is not None and _path_key(prev) >= _path_key(p):
            problems.append(f"entry {shown}: out of order or listed twice")
        prev = p
        if mount is not None and p.startswith(mount + b"/"):
            problems.append(f"entry {shown}: under a mount point, which is never entered")
        if e.get("mount") is True:
            mount = p
        bad = entry_problem(e)
        if bad:
            problems.append(f"entry {shown}: {bad}")
    return problems


def _signature_problems(m: Mapping[str, Any], public_key_pem: str) -> List[str]:
    """The manifest's signature under the key: Ed25519 over the JCS of all of it but ``signature``."""
    return [p.replace("the receipt", "the manifest") for p in verify_receipt(m, public_key_pem).problems]


def _check_head(data: bytes, public_key_pem: Optional[str], expect_id: Optional[str]) -> Tuple[Optional[Manifest], List[str]]:
    """manifest.ts checkHead: a manifest's own checks, before any tree is read: JSON, kind, version,
    canonical bytes and id (with expect_id), the digest (version 1: of its entries, which are checked
    too; version 2: the root tree's id), and with a key its signature. A version 2 manifest comes
    back with ``entries`` [] (not yet read from its trees)."""
    try:
        parsed = json.loads(data.decode("utf-8"))
    except ValueError as err:
        return None, [f"the manifest is not JSON: {err}"]
    if not isinstance(parsed, dict) or parsed.get("kind") != "checkpoint":
        return None, ['not a checkpoint manifest (kind "checkpoint")']
    m = Manifest(parsed)
    problems: List[str] = []
    got_id = hashlib.sha256(data).hexdigest()
    scan = m.get("scan") if isinstance(m.get("scan"), dict) else {}
    if m.get("version") == 2 and not isinstance(m.get("version"), bool):
        if "entries" in m or not (isinstance(m.get("tree"), str) and re.fullmatch(r"[0-9a-f]{64}", m["tree"])):
            return None, ["not a version 2 checkpoint manifest (a root `tree`, 64 hex digits, and no entries)"]
        try:
            text = canonicalize(m)
        except (ValueError, TypeError) as err:
            return None, [f"the manifest cannot be canonicalised: {err}"]
        if expect_id is not None:
            if text != data:
                problems.append("the stored manifest is not in canonical form (RFC 8785): its bytes were edited")
            if got_id != expect_id:
                problems.append(f"the manifest's SHA-256 is {got_id}, not its id {expect_id}")
        if scan.get("digest") != f"sha256:{m['tree']}":
            problems.append(f"the scan digest is {scan.get('digest')}, the root tree is sha256:{m['tree']}")
        if public_key_pem is not None:
            sig = _signature_problems(m, public_key_pem)
            problems.extend(sig)
            m.unsigned = bool(sig)
        m["entries"] = []
        return m, problems
    if not isinstance(m.get("entries"), list):
        return None, ['not a checkpoint manifest (kind "checkpoint" with entries)']
    if m.get("version") != 1 or isinstance(m.get("version"), bool):
        problems.append(f"manifest version {_js(m.get('version'))}: this sbx reads versions 1 and 2")
    try:
        entries_jcs = canonicalize(m["entries"])
    except (ValueError, TypeError) as err:
        return None, [f"the entries cannot be canonicalised: {err}"]
    if expect_id is not None:
        if canonicalize(m) != data:
            problems.append("the stored manifest is not in canonical form (RFC 8785): its bytes were edited")
        if got_id != expect_id:
            problems.append(f"the manifest's SHA-256 is {got_id}, not its id {expect_id}")
    digest = "sha256:" + hashlib.sha256(entries_jcs).hexdigest()
    if scan.get("digest") != digest:
        problems.append(f"the scan digest is {scan.get('digest')}, the entries hash to {digest}")
    if scan.get("entries") != len(m["entries"]):
        problems.append(f"the manifest says {scan.get('entries')} entries and lists {len(m['entries'])}")
    problems.extend(_entries_problems(m["entries"]))
    if public_key_pem is not None:
        problems.extend(_signature_problems(m, public_key_pem))
    return m, problems


def _with_trees(m: Manifest, head_problems: List[str], expanded: ExpandedTree) -> Tuple[Optional[Manifest], List[str]]:
    """manifest.ts withTrees: a version 2 manifest given its expanded entries, checked as version 1's
    are (order, paths, fields, counts); None when a tree was missing or did not hold."""
    if expanded.problems:
        return None, head_problems + expanded.problems
    m["entries"] = expanded.entries
    m.trees = dict(expanded.trees)
    problems = head_problems + _entries_problems(m["entries"])
    scan = m.get("scan") if isinstance(m.get("scan"), dict) else {}
    if scan.get("entries") != len(m["entries"]):
        problems.append(f"the manifest says {scan.get('entries')} entries and its trees hold {len(m['entries'])}")
    return m, problems


def check_manifest(
    data: bytes,
    public_key_pem: Optional[str] = None,
    expect_id: Optional[str] = None,
    store: Union[LocalStore, ReadTree, None] = None,
) -> Tuple[Optional[Manifest], List[str]]:
    """manifest.ts checkManifest: ``(manifest or None, problems)`` ([] = it all holds) of a manifest's
    bytes: JSON of kind checkpoint, version 1 or 2, canonical bytes and id (with expect_id), scan
    digest and count, entries as relative plain paths in order, never twice, none under a mount
    point, each one's fields, and with a key its signature.

    Version 1 lists its entries; version 2 names its root tree (``tree``) and its entries are read
    from the tree objects in ``store`` (a LocalStore, or a function from a tree id to its bytes,
    None when missing: tree.py ReadTree), each checked (tree.py check_tree) and expanded into the
    same entries version 1 lists, put in ``entries``; the returned Manifest's ``trees`` names them
    (id -> size). A version 2 manifest without a store, or with a tree missing or not holding,
    gives None (its entries unknown: never taken as none) and the problem naming it."""
    m, problems = _check_head(data, public_key_pem, expect_id)
    if m is None or m.get("version") != 2:
        return m, problems
    if store is None:
        return None, problems + ["a version 2 manifest's entries are in the store's tree objects: no store was given"]
    if getattr(m, "unsigned", False):
        # An unsigned manifest's trees could be anything (a chain of shared subtrees expands past any memory).
        return None, problems + ["its trees were not read: its signature does not verify"]
    read: ReadTree = store.read_tree if isinstance(store, LocalStore) else store
    scan = m.get("scan") if isinstance(m.get("scan"), dict) else {}
    bound = scan.get("entries") if isinstance(scan.get("entries"), int) and not isinstance(scan.get("entries"), bool) and scan.get("entries") >= 0 else 0
    return _with_trees(m, problems, expand_tree(m["tree"], read, bound))


def verify_checkpoint(checkpoint_id: str, public_key_pem: str, store: LocalStore) -> StateVerification:
    """core/checkpoint/verify.ts verifyCheckpoint of a stored manifest: its form, id and
    signature (a version 2 manifest's entries read from its trees in store), its published record
    (signed, naming it), every object re-hashed to its name and size: the files' and a version 2
    manifest's tree objects."""
    try:
        data = store.read_manifest(checkpoint_id)
    except OSError as err:
        return StateVerification(False, [str(err)])
    m, problems = check_manifest(data, public_key_pem, expect_id=checkpoint_id, store=store)
    if m is None:
        return StateVerification(False, problems)
    if any("signature" in p for p in problems):
        return StateVerification(False, problems)
    published = store.read_published(checkpoint_id)
    if published is None:
        problems.append(f"checkpoint {checkpoint_id} was never published in {store.location}: its read-back did not complete (it claims nothing)")
    else:
        problems.extend(f"its published record in {store.location}: {p}" for p in _check_published(published, checkpoint_id, public_key_pem))
    users: Dict[str, List[str]] = {}
    for e in m["entries"]:
        for sha in [c["sha256"] for c in e.get("chunks") or []] or ([e["sha256"]] if e.get("sha256") else []):
            lst = users.setdefault(sha, [])
            if len(lst) < 3:
                lst.append(_show_path(e))
    for tree in m.trees:
        users.setdefault(tree, ["the root tree" if tree == m.get("tree") else "a tree"])
    objects = n_bytes = 0
    for sha, size in manifest_objects(m).items():
        named = f"object {sha} ({', '.join(users.get(sha, []))})"
        h = hashlib.sha256()
        got = 0
        try:
            for piece in store.read_object(sha):
                h.update(piece)
                got += len(piece)
        except (OSError, ValueError) as err:
            problems.append(f"{named}: {_os_message(err)}")
            continue
        objects += 1
        n_bytes += got
        if h.hexdigest() != sha:
            problems.append(f"{named}: its bytes hash to {h.hexdigest()}: changed in the store")
        elif got != size:
            problems.append(f"{named}: {got} bytes, the manifest says {size}")
    return StateVerification(not problems, problems, (m.get("signature") or {}).get("key_id"), objects, n_bytes)


def _check_published(data: bytes, checkpoint_id: str, public_key_pem: str) -> List[str]:
    try:
        record = json.loads(data.decode("utf-8"))
    except ValueError as err:
        return [f"not JSON: {err}"]
    if not isinstance(record, dict) or record.get("kind") != "checkpoint_published":
        return ['not a published record (kind "checkpoint_published")']
    problems = []
    if record.get("checkpoint_id") != checkpoint_id:
        problems.append(f"it names checkpoint {json.dumps(record.get('checkpoint_id'))}")
    problems.extend(p.replace("the receipt", "the record") for p in verify_receipt(record, public_key_pem).problems)
    return problems


def verify_task_receipt(receipt: Mapping[str, Any], state_dir: str, public_key_pem: Optional[str] = None, store: Optional[str] = None) -> StateVerification:
    """A task receipt end to end, as ``sbx verify TASK.json --state-dir DIR`` (cli/tasks.ts): its
    signature; every session receipt it lists (digest, signature, stored output, of this task);
    every checkpoint it names (manifest, publication, every object re-hashed from the local
    store: ``store``, default ``<state_dir>/checkpoints``) and that the manifest says what the
    task receipt says of it (task, boundary, started_at, scan digest, consistent, fence, close
    attempt). Not re-run here: the join (the verdict evaluated again from those facts), which
    ``sbx verify`` also does. ``public_key_pem`` defaults to ``<state_dir>/receipt-key.pub``."""
    pem = public_key_pem if public_key_pem is not None else _key(state_dir)
    key_id = (receipt.get("signature") or {}).get("key_id")
    problems = [f"task receipt: {p}" for p in verify_receipt(receipt, pem).problems]
    if problems:
        return StateVerification(False, problems, key_id)
    if not os.path.isdir(os.path.join(state_dir, SESSIONS_DIR)):
        raise SupervisorError("INVALID_ARGUMENT", f"verify: a task receipt is checked against its state dir: {state_dir} has no sessions/ (give --state-dir DIR)")
    sessions = [s for s in receipt.get("sessions") or [] if s.get("state") != "retired"]
    problems.extend(verify_close_sessions({"sessions": sessions}, state_dir, pem))
    for s in sessions:
        if s.get("receipt_sha256") is None:
            continue
        try:
            r = _read_json(os.path.join(state_dir, SESSIONS_DIR, s["session_id"], RECEIPT_FILE))
        except (OSError, ValueError):
            continue  # named above
        if isinstance(r.get("task"), str) and r["task"] != receipt.get("task"):
            problems.append(f"{s['session_id']}: its receipt is of task {json.dumps(r['task'])}, not {json.dumps(receipt.get('task'))}")
    objects = n_bytes = 0
    for cp in receipt.get("checkpoints") or []:
        if cp.get("checkpoint_id") is None:
            continue
        where = store or (cp.get("store") if str(cp.get("store") or "").startswith("s3://") else os.path.join(state_dir, "checkpoints"))
        v = verify_checkpoint(cp["checkpoint_id"], pem, LocalStore(where))
        objects += v.objects
        n_bytes += v.bytes
        problems.extend(f"checkpoint {cp['checkpoint_id']} ({cp.get('workspace')}): {p}" for p in v.problems)
        try:
            m = json.loads(LocalStore(where).read_manifest(cp["checkpoint_id"]))
        except (OSError, ValueError):
            continue
        sup = m.get("supervisor") or {}

        def said(what: str, in_manifest: Any, in_task: Any) -> None:
            if canonicalize(in_manifest) != canonicalize(in_task):
                problems.append(f"checkpoint {cp['checkpoint_id']}: the manifest's {what} is {json.dumps(in_manifest)}, the task receipt says {json.dumps(in_task)}")

        said("task", m.get("task"), receipt.get("task"))
        said("boundary", m.get("boundary"), cp.get("boundary"))
        said("started_at", m.get("started_at"), cp.get("started_at"))
        said("scan digest", (m.get("scan") or {}).get("digest"), cp.get("scan_digest"))
        said("consistent", m.get("consistent"), cp.get("consistent"))
        said("fence", {"instance": sup.get("instance"), "generation": sup.get("generation"), "boot_id": sup.get("boot_id")}, cp.get("fence"))
        said("close attempt", m.get("close_attempt"), cp.get("close_attempt"))
    return StateVerification(not problems, problems, key_id, objects, n_bytes)


def _key(state_dir: str) -> str:
    path = os.path.join(state_dir, "receipt-key.pub")
    try:
        with open(path) as f:
            return f.read()
    except OSError as err:
        raise SupervisorError("INVALID_ARGUMENT", f"cannot read the public key {path} (give public_key_pem): {err}") from None


def verify_state(receipt: Mapping[str, Any], state_dir: str, public_key_pem: Optional[str] = None, store: Optional[str] = None) -> StateVerification:
    """``sbx verify FILE --state-dir DIR`` for any receipt: a task receipt (verify_task_receipt),
    a close receipt (its sessions and tasks), or a session receipt (its stored output), each
    after its signature. ``ok`` is sbx's exit 0; the problems are its MISMATCH lines."""
    if receipt.get("kind") == "task":
        return verify_task_receipt(receipt, state_dir, public_key_pem, store)
    pem = public_key_pem if public_key_pem is not None else _key(state_dir)
    v = verify_receipt(receipt, pem)
    problems = list(v.problems)
    if not problems:
        if receipt.get("kind") == "close":
            problems += verify_close_sessions(receipt, state_dir, pem) + verify_close_tasks(receipt, state_dir)
        else:
            problems += verify_stored_output(receipt, state_dir)
            # What was re-read: every chunk file the receipt names, as sbx verify's progress counts them.
            chunks = [c for s in (receipt.get("output") or {}).values() if s for c in (s.get("chunks") or [])]
            return StateVerification(not problems, problems, v.key_id, len(chunks), sum(int(c.get("length", 0)) for c in chunks))
    return StateVerification(not problems, problems, v.key_id)
