"""``sbx diff`` in Python, for the local checkpoint store: what changed between two published
checkpoints, from their manifests alone (core/checkpoint/diff.ts, the same result as
``sbx diff --json``). Owns the comparison's port; the manifest checks are state_verify.py's
(as restore.py uses them); an s3:// store is sbx's (checkpoints.diff_checkpoints runs it).
"""
from __future__ import annotations

import base64
import hashlib
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .errors import SupervisorError
from .paths import default_state_dir
from .restore import _b, _name_fields, _path
from .state_verify import LocalStore, _check_published, check_manifest

_EMPTY = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
_KINDS = ("added", "removed", "modified", "type_changed", "mode_changed", "owner_changed")


def _target(e: Mapping[str, Any]) -> bytes:
    return _b(e.get("target"), e.get("target_b64"))


def _path_of(e: Mapping[str, Any]) -> Dict[str, str]:
    return {"path": e["path"]} if e.get("path") is not None else {"path_b64": e["path_b64"]}


def chunk_list_key(chunks: Sequence[Mapping[str, Any]]) -> str:
    """diff.ts chunkListKey: ``sha256:size`` of each chunk, joined by ','."""
    return ",".join(f"{c['sha256']}:{c['size']}" for c in chunks)


def _content_key(e: Mapping[str, Any], whole: Optional[Mapping[str, str]]) -> str:
    if e.get("sha256") is not None:
        return f"sha256:{e['sha256']}"
    chunks = e.get("chunks") or []
    if len(chunks) == 1:
        return f"sha256:{chunks[0]['sha256']}"
    if not chunks:
        return f"sha256:{_EMPTY}"
    key = chunk_list_key(chunks)
    got = (whole or {}).get(key)
    return f"sha256:{got}" if got is not None else f"chunks:{key}"


def _sha(e: Mapping[str, Any]) -> Optional[str]:
    if e.get("sha256") is not None:
        return str(e["sha256"])
    chunks = e.get("chunks") or []
    return str(chunks[0]["sha256"]) if len(chunks) == 1 else None


def _described(e: Mapping[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {**_path_of(e), "type": e["type"], "size": e["size"], "mode": e["mode"]}
    for f in ("sha256", "chunks", "target", "target_b64"):
        if e.get(f) is not None:
            out[f] = e[f]
    return out


def _item_bytes(item: Mapping[str, Any]) -> bytes:
    return item["path"].encode("utf-8", "surrogateescape") if "path" in item else base64.b64decode(item["path_b64"])


def diff_entries(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]], whole_digests: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """diff.ts diffEntries: the two entry lists compared by path bytes; mtime_ns never compared.
    Returns ``{added, removed, modified, type_changed, mode_changed, owner_changed, counts, identical}``,
    every list sorted by path bytes; sizes in bytes, modes as numbers (st_mode & 0o7777)."""
    before = {_path(e): e for e in old}
    d: Dict[str, List[Dict[str, Any]]] = {k: [] for k in _KINDS}
    for b in new:
        k = _path(b)
        a = before.pop(k, None)
        if a is None:
            d["added"].append(_described(b))
            continue
        if a["type"] != b["type"]:
            d["type_changed"].append({**_path_of(b), "old_type": a["type"], "new_type": b["type"], "old_size": a["size"], "new_size": b["size"], "old_mode": a["mode"], "new_mode": b["mode"]})
            continue
        changed: List[str] = []
        if a["type"] == "file":
            if a["size"] != b["size"]:
                changed += ["content", "size"]  # bytes of another size are other bytes
            elif _content_key(a, whole_digests) != _content_key(b, whole_digests):
                changed.append("content")
        elif a["type"] == "symlink":
            if _target(a) != _target(b):
                changed.append("target")
        elif a["type"] in ("char", "block"):
            if a.get("rdev") != b.get("rdev"):
                changed.append("rdev")
        if changed:
            m: Dict[str, Any] = {**_path_of(b), "type": b["type"], "changed": changed, "old_size": a["size"], "new_size": b["size"], "old_mode": a["mode"], "new_mode": b["mode"]}
            if a["type"] == "file":
                for side, e in (("old", a), ("new", b)):
                    s = _sha(e)
                    if s is not None:
                        m[f"{side}_sha256"] = s
            if a["type"] == "symlink":
                for side, e in (("old", a), ("new", b)):
                    for f, v in _name_fields(_target(e), "target").items():
                        m[f"{side}_{f}"] = v
            d["modified"].append(m)
            continue
        if a["mode"] != b["mode"]:
            d["mode_changed"].append({**_path_of(b), "type": b["type"], "old_mode": a["mode"], "new_mode": b["mode"]})
        if a["uid"] != b["uid"] or a["gid"] != b["gid"]:
            d["owner_changed"].append({**_path_of(b), "type": b["type"], "old_uid": a["uid"], "new_uid": b["uid"], "old_gid": a["gid"], "new_gid": b["gid"]})
    d["removed"] = [_described(a) for a in before.values()]
    for k in _KINDS:
        d[k].sort(key=_item_bytes)
    counts = {k: len(d[k]) for k in _KINDS}
    return {**d, "counts": counts, "identical": not any(counts.values())}


def undecided_chunk_lists(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]) -> List[Sequence[Mapping[str, Any]]]:
    """diff.ts undecidedChunkLists: the chunk lists (2+) whose whole-file digest decides a compare."""
    before = {_path(e): e for e in old}
    out: Dict[str, Sequence[Mapping[str, Any]]] = {}
    for b in new:
        a = before.get(_path(b))
        if a is None or a["type"] != "file" or b["type"] != "file" or a["size"] != b["size"]:
            continue
        ka, kb = _content_key(a, None), _content_key(b, None)
        if ka == kb or (ka.startswith("sha256:") and kb.startswith("sha256:")):
            continue
        for e in (a, b):
            if len(e.get("chunks") or []) > 1:
                out[chunk_list_key(e["chunks"])] = e["chunks"]
    return list(out.values())


def _resolve(store: LocalStore, text: str) -> str:
    t = text.strip().lower()
    t = t[len("sha256:"):] if t.startswith("sha256:") else t
    if not re.fullmatch(r"[0-9a-f]{1,64}", t):
        raise SupervisorError("INVALID_ARGUMENT", f"diff: {_js(text)} is not a checkpoint id (64 hex digits, or a unique prefix of 8 or more)")
    if len(t) == 64:
        return t
    if len(t) < 8:
        raise SupervisorError("INVALID_ARGUMENT", f"diff: {_js(text)}: give at least 8 hex digits of the checkpoint id")
    matches = [i for i in _list(store) if i.startswith(t)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise SupervisorError("NOT_FOUND", f"diff: no checkpoint {t}… in {store.location} (sbx checkpoints lists them)")
    raise SupervisorError("INVALID_ARGUMENT", f"diff: {t}… is ambiguous in {store.location}: {', '.join(matches)}")


def _js(text: str) -> str:
    import json

    return json.dumps(text, ensure_ascii=False)


def _list(store: LocalStore) -> List[str]:
    try:
        names = os.listdir(os.path.join(store.location, "manifests"))
    except OSError as err:
        raise SupervisorError("INVALID_ARGUMENT", f"diff: cannot list the checkpoints in {store.location}: {err}") from None
    return sorted(n[:64] for n in names if re.fullmatch(r"[0-9a-f]{64}\.json", n))


def load_published(store: LocalStore, checkpoint_id: str, public_key_pem: str) -> Dict[str, Any]:
    """diff.ts loadPublished: published (record signed, naming it), the manifest its id,
    canonical, digest and counts holding, signed; a version 2 manifest's entries read from its tree
    objects in store (each checked). SupervisorError NOT_FOUND / INVALID_ARGUMENT."""
    published = store.read_published(checkpoint_id)
    try:
        data: Optional[bytes] = store.read_manifest(checkpoint_id)
    except OSError:
        data = None
    if published is None:
        if data is not None:
            raise SupervisorError("INVALID_ARGUMENT", f"diff: checkpoint {checkpoint_id} in {store.location} was never published (its read-back did not complete): it claims nothing")
        raise SupervisorError("NOT_FOUND", f"diff: no checkpoint {checkpoint_id} in {store.location} (never taken there, or removed by gc)")
    if data is None:
        raise SupervisorError("INVALID_ARGUMENT", f"diff: checkpoint {checkpoint_id}: its published record is there but its manifest is not")
    problems = _check_published(published, checkpoint_id, public_key_pem)
    if problems:
        raise SupervisorError("INVALID_ARGUMENT", f"diff: checkpoint {checkpoint_id}: its published record does not hold: {'; '.join(problems)}")
    m, problems = check_manifest(data, public_key_pem, expect_id=checkpoint_id, store=store)
    if m is None or problems:
        raise SupervisorError("INVALID_ARGUMENT", f"diff: checkpoint {checkpoint_id}: its manifest does not verify: {'; '.join(problems)}")
    return m


def _side(cid: str, m: Mapping[str, Any]) -> Dict[str, Any]:
    return {"checkpoint_id": cid, "workspace": m["workspace"], "task": m.get("task"), "created_at": m["created_at"]}


def _whole_digests(store: LocalStore, lists: List[Sequence[Mapping[str, Any]]]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for chunks in lists:
        h = hashlib.sha256()
        for c in chunks:
            for piece in store.read_object(c["sha256"]):
                h.update(piece)
        out[chunk_list_key(chunks)] = h.hexdigest()
    return out


def _pair(store: LocalStore, old: Optional[Tuple[str, Mapping[str, Any]]], new: Tuple[str, Mapping[str, Any]]) -> Dict[str, Any]:
    old_entries = old[1]["entries"] if old else []
    lists = undecided_chunk_lists(old_entries, new[1]["entries"]) if old else []
    d = diff_entries(old_entries, new[1]["entries"], _whole_digests(store, lists) if lists else None)
    return {"from": _side(*old) if old else None, "to": _side(*new), **d}


def diff_local(a: Optional[str] = None, b: Optional[str] = None, *, task: Optional[str] = None, state_dir: Optional[str] = None, store: Optional[str] = None, key_path: Optional[str] = None) -> Any:
    """``sbx diff A B --json`` (a dict) or ``sbx diff --task T --json`` (a list, one per workspace)
    from the local store (``store``, default ``<state_dir>/checkpoints``; ``state_dir`` default
    ``$SBX_STATE_DIR``, else the default path, as sbx), manifests checked under
    ``key_path`` (default ``<state_dir>/receipt-key.pub``). SupervisorError NOT_FOUND / INVALID_ARGUMENT."""
    if task is not None and (a is not None or b is not None):
        raise SupervisorError("INVALID_ARGUMENT", "diff: give two checkpoints (A B) or --task T, not both")
    if task is None and (a is None or b is None):
        raise SupervisorError("INVALID_ARGUMENT", "diff needs two checkpoints (sbx diff A B) or --task T")
    if store is None and state_dir is None:
        state_dir = default_state_dir()
    if store is None:
        store = os.path.join(state_dir, "checkpoints")
    st = LocalStore(store)
    key_file = key_path or os.path.join(state_dir or default_state_dir(), "receipt-key.pub")
    if not os.path.exists(key_file):
        raise SupervisorError("INVALID_ARGUMENT", f"no public key to check the manifests' signatures ({key_file} is absent): give key_path")
    with open(key_file) as f:
        pem = f.read()
    if task is None:
        ia, ib = _resolve(st, a or ""), _resolve(st, b or "")
        return _pair(st, (ia, load_published(st, ia, pem)), (ib, load_published(st, ib, pem)))
    loaded: List[Tuple[str, Dict[str, Any]]] = []
    invalid = 0
    for cid in _list(st):
        if st.read_published(cid) is None:
            continue
        try:
            loaded.append((cid, load_published(st, cid, pem)))
        except SupervisorError:
            invalid += 1
    loaded.sort(key=lambda c: (c[1]["created_at"], c[1]["started_at"], c[0]))
    by_ws: Dict[str, List[Tuple[str, Dict[str, Any]]]] = {}
    for c in loaded:
        by_ws.setdefault(c[1]["workspace"], []).append(c)
    out = []
    for ws in sorted(by_ws):
        lst = by_ws[ws]
        at = max((i for i, c in enumerate(lst) if c[1].get("task") == task), default=-1)
        if at >= 0:
            out.append(_pair(st, lst[at - 1] if at > 0 else None, lst[at]))
    if not out:
        raise SupervisorError("NOT_FOUND", f"diff: no published checkpoint of task {_js(task)} in {st.location}{f' that verifies ({invalid} did not)' if invalid else ''}")
    return out
