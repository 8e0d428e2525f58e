"""Checkpoint trees (manifest version 2, core/checkpoint/tree.ts): each directory an object in the
store, the RFC 8785 JSON of its entries by name (a subdirectory by its tree's SHA-256), the signed
manifest naming only the root's. Owns a tree's bytes, their checks, the expansion into manifest
entries (paths, in the manifest's order), and the field checks a tree entry shares with a
manifest entry (manifest.ts entryProblem).
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .jcs import canonicalize

TREE_KIND = "checkpoint_tree"
MAX_TREE_BYTES = 256 << 20
"""tree.ts MAX_TREE_BYTES: the largest tree object a reader takes."""
TREE_VERSION = 2

ReadTree = Callable[[str], Optional[bytes]]
"""How a version 2 manifest's trees are read: a tree object's bytes by id (64 hex digits), None
when the store has no such object; OSError/ValueError when it cannot be read (a problem, named)."""

_TYPES = frozenset(["file", "dir", "symlink", "fifo", "socket", "char", "block"])
_MAX_SAFE = 2**53 - 1
_HEX64 = re.compile(r"[0-9a-f]{64}")
# Up to 28 digits, as manifest.ts checkEntry: a file system of 64-bit seconds (tmpfs: touch -d 6000 is 21) in nanoseconds.
_MTIME = re.compile(r"-?[0-9]{1,28}")
_MISSING = object()


def _js(v: Any) -> str:
    """JSON.stringify(v) as the TypeScript messages show it (``undefined`` for a missing value)."""
    if v is _MISSING:
        return "undefined"
    try:
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):
        return repr(v)


def _uint(v: Any, top: int = _MAX_SAFE) -> bool:
    """Number.isSafeInteger(v) and 0 <= v <= top (a JSON 3.0 is the number 3, true is not one)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    if isinstance(v, float) and not v.is_integer():
        return False
    return 0 <= v <= min(top, _MAX_SAFE)


def _hex64(v: Any) -> bool:
    return isinstance(v, str) and _HEX64.fullmatch(v) is not None


def entry_problem(e: Mapping[str, Any]) -> Optional[str]:
    """manifest.ts entryProblem: what is wrong with one entry's fields (types, ranges, what its type
    needs; its path or name is not looked at), or None. A field is there when its key is (JSON null too)."""
    t = e.get("type", _MISSING)
    if not isinstance(t, str) or t not in _TYPES:
        return f"unknown type {_js(t)}"
    if not _uint(e.get("mode"), 0o7777):
        return f"mode {_js(e.get('mode', _MISSING))} is not permission bits (0..07777)"
    if not _uint(e.get("uid"), 0xFFFFFFFE) or not _uint(e.get("gid"), 0xFFFFFFFE):
        return "uid/gid is not a number 0..4294967294"
    if not _uint(e.get("size")):
        return f"size {_js(e.get('size', _MISSING))} is not a byte count"
    mtime = e.get("mtime_ns")
    if not isinstance(mtime, str) or _MTIME.fullmatch(mtime) is None:
        return "mtime_ns is not decimal nanoseconds"
    if t == "file":
        if "chunks" in e:
            chunks = e["chunks"]
            if (
                not isinstance(chunks, list)
                or any(not isinstance(c, dict) or not _hex64(c.get("sha256")) or not _uint(c.get("size")) for c in chunks)
                or sum(c["size"] for c in chunks) != e["size"]
            ):
                return "chunks are not {sha256, size} adding up to size"
        elif not _hex64(e.get("sha256")):
            return "a file with no sha256 (64 hex digits) or chunks"
    elif "sha256" in e or "chunks" in e:
        return f"a {t} with content"
    has_target = "target" in e or "target_b64" in e
    if t == "symlink" and not has_target:
        return "a symlink with no target"
    if t != "symlink" and has_target:
        return f"a {t} with a link target"
    if (t in ("char", "block")) != ("rdev" in e):
        return "a device with no rdev" if "rdev" not in e else f"a {t} with an rdev"
    if "rdev" in e and not _uint(e["rdev"]):
        return "rdev is not a device number"
    if "mount" in e and (e["mount"] is not True or t != "dir"):
        return f"mount {_js(e['mount'])} on a {t}: only a directory is a mount point (true)"
    return None


def name_fields(raw: bytes, field_name: str) -> Dict[str, str]:
    """A name, path or link target as JSON: ``{field: text}`` when its bytes are UTF-8, else ``{field_b64: base64}``."""
    try:
        return {field_name: raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{field_name}_b64": base64.b64encode(raw).decode("ascii")}


def tree_entry(fields: Mapping[str, Any], name: bytes, tree: Optional[str] = None) -> Dict[str, Any]:
    """tree.ts treeEntryJcs's object: a manifest entry's fields (no path) with ``name``/``name_b64``
    and, for a directory that is not a mount point, ``tree`` (its tree object's id)."""
    out: Dict[str, Any] = {**fields, **name_fields(name, "name")}
    if tree is not None:
        out["tree"] = tree
    return out


def tree_bytes(entries: Sequence[Mapping[str, Any]]) -> bytes:
    """A tree object's bytes: JCS of ``{"entries": [...], "kind": "checkpoint_tree", "version": 2}``
    (entries as tree_entry makes them, in bytewise order of their names: not sorted here)."""
    return canonicalize({"entries": list(entries), "kind": TREE_KIND, "version": TREE_VERSION})


def tree_id(data: bytes) -> str:
    """The hex SHA-256 of a tree's bytes: its id, and its object's name in the store."""
    return hashlib.sha256(data).hexdigest()


def _node_b64(text: str) -> bytes:
    """Buffer.from(text, 'base64') as Node decodes it: either alphabet, other characters skipped,
    up to the first '=', a last lone character dropped (so Python expands a name as tree.ts does)."""
    s = re.sub(r"[^A-Za-z0-9+/]", "", text.split("=", 1)[0].replace("-", "+").replace("_", "/"))
    if len(s) % 4 == 1:
        s = s[:-1]
    return base64.b64decode(s + "=" * (-len(s) % 4))


def _name_bytes(e: Mapping[str, Any]) -> Optional[bytes]:
    """An entry's name as bytes; None when it has neither name nor name_b64, or both."""
    if ("name" in e) == ("name_b64" in e):
        return None
    if isinstance(e.get("name"), str):
        return e["name"].encode("utf-8")
    if isinstance(e.get("name_b64"), str):
        return _node_b64(e["name_b64"])
    return None


def _latin1(raw: bytes) -> str:
    """A name for messages as tree.ts shows it: JSON.stringify of its bytes as latin1."""
    return _js(raw.decode("latin-1"))


def check_tree(data: bytes, expect_id: str) -> Tuple[List[Dict[str, Any]], List[bytes], List[str]]:
    """tree.ts checkTree: ``(entries, names, problems)`` of a tree object's bytes. They must hash to
    expect_id, parse as a tree (kind "checkpoint_tree", version 2, entries a list), be its canonical
    JCS, every name one plain name (exactly one of name/name_b64; not empty, no '/' or NUL, not '.'
    or '..') in strict bytewise order, each entry's fields as a manifest entry's (entry_problem), and
    ``tree`` (64 hex) on exactly the directories that are not mount points. entries are the parsed
    dicts as stored, names their name bytes (b"" for an entry with none); problems [] when it holds.
    A tree over MAX_TREE_BYTES is refused (the writer never stores one)."""
    if len(data) > MAX_TREE_BYTES:
        return [], [], [f"object {expect_id} is {len(data)} bytes, over the {MAX_TREE_BYTES} of a tree"]
    got = tree_id(data)
    if got != expect_id:
        return [], [], [f"tree {expect_id} reads back as {got} ({len(data)} bytes): its bytes changed in the store"]
    try:
        t = json.loads(data.decode("utf-8"))
    except ValueError as err:
        return [], [], [f"tree {expect_id} is not JSON: {err}"]
    version = t.get("version") if isinstance(t, dict) else None
    if not isinstance(t, dict) or t.get("kind") != TREE_KIND or isinstance(version, bool) or version != TREE_VERSION or not isinstance(t.get("entries"), list):
        return [], [], [f'object {expect_id} is not a tree (kind "checkpoint_tree", version 2, with entries)']
    problems: List[str] = []
    try:
        if canonicalize(t) != data:
            problems.append(f"tree {expect_id} is not in canonical form (RFC 8785)")
    except (ValueError, TypeError) as err:
        return [], [], [f"tree {expect_id} cannot be canonicalised: {err}"]
    entries: List[Dict[str, Any]] = t["entries"]
    names: List[bytes] = []
    prev: Optional[bytes] = None
    for e in entries:
        name = _name_bytes(e) if isinstance(e, dict) else None
        if name is None:
            problems.append(f"tree {expect_id}: an entry with no name (exactly one of name, name_b64)")
            names.append(b"")
            continue
        names.append(name)
        shown = _latin1(name)
        if not name or b"/" in name or b"\0" in name or name in (b".", b".."):
            problems.append(f"tree {expect_id}: entry {shown} is not one plain name")
        if prev is not None and prev >= name:
            problems.append(f"tree {expect_id}: entry {shown} out of order or listed twice")
        prev = name
        rest = {k: v for k, v in e.items() if k not in ("name", "name_b64", "tree")}
        bad = entry_problem(rest)
        if bad:
            problems.append(f"tree {expect_id}: entry {shown}: {bad}")
        if "path" in e or "path_b64" in e:
            problems.append(f"tree {expect_id}: entry {shown} has a path (a tree entry has its name only)")
        wants_tree = e.get("type") == "dir" and e.get("mount") is not True
        if wants_tree and not _hex64(e.get("tree")):
            problems.append(f"tree {expect_id}: directory {shown} names no tree (64 hex digits)")
        if not wants_tree and "tree" in e:
            kind = "mount point" if e.get("type") == "dir" else e.get("type")
            problems.append(f"tree {expect_id}: {kind} {shown} names a tree")
    return entries, names, problems


@dataclass(frozen=True)
class ExpandedTree:
    """What expand_tree gave: ``entries`` (manifest entries with ``path``/``path_b64``, in the manifest's
    order), ``trees`` (each tree object read: id -> size in bytes), ``problems`` ([] when it all held;
    else one, and entries [])."""

    entries: List[Dict[str, Any]] = field(default_factory=list)
    trees: Dict[str, int] = field(default_factory=dict)
    problems: List[str] = field(default_factory=list)


def expand_tree(root_id: str, read: ReadTree, max_entries: Optional[int] = None) -> ExpandedTree:
    """tree.ts expandTree (expandSync): the tree root_id expanded into manifest entries, depth first,
    a directory right before what it holds, siblings in the tree's order. Each entry is the tree
    entry's fields but name/name_b64/tree, with ``path`` (the '/'-joined name bytes, when UTF-8)
    or ``path_b64``. A tree named under several directories is read and checked once, expanded at
    each. Stops at the first tree that is missing (read gives None), cannot be read (read raises
    OSError/ValueError) or fails check_tree, or past max_entries (a manifest says how many: a
    planted chain of shared subtrees would expand past any memory): its problem, entries []."""
    trees: Dict[str, int] = {}
    decoded: Dict[str, Tuple[List[Dict[str, Any]], List[bytes]]] = {}

    def fail(problem: str) -> ExpandedTree:
        return ExpandedTree([], trees, [problem])

    def load(tid: str, under: str) -> Any:
        """The tree's (entries, names), or its problem (a str)."""
        known = decoded.get(tid)
        if known is not None:
            return known
        try:
            data = read(tid)
        except (OSError, ValueError) as err:
            return f"tree {tid} ({under}) cannot be read from the store: {err}"
        if data is None:
            return f"tree {tid} ({under}) is missing from the store"
        entries, names, problems = check_tree(data, tid)
        if problems:
            return f"{'; '.join(problems)} ({under})"
        trees[tid] = len(data)
        decoded[tid] = (entries, names)
        return decoded[tid]

    root = load(root_id, "the root")
    if isinstance(root, str):
        return fail(root)
    out: List[Dict[str, Any]] = []
    stack: List[Tuple[Optional[bytes], List[Dict[str, Any]], List[bytes], int]] = [(None, root[0], root[1], 0)]
    while stack:
        prefix, entries, names, i = stack[-1]
        if i >= len(entries):
            stack.pop()
            continue
        if max_entries is not None and len(out) >= max_entries:
            return fail(f"the trees hold more than the {max_entries} entries the manifest says: not read further")
        stack[-1] = (prefix, entries, names, i + 1)
        e = entries[i]
        fields = {k: v for k, v in e.items() if k not in ("name", "name_b64", "tree")}
        path = names[i] if prefix is None else prefix + b"/" + names[i]
        out.append({**fields, **name_fields(path, "path")})
        if "tree" in e:
            sub = load(e["tree"], f"directory {_latin1(path)}")
            if isinstance(sub, str):
                return fail(sub)
            stack.append((path, sub[0], sub[1], 0))
    return ExpandedTree(out, trees, [])
