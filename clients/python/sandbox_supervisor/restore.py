"""``sbx restore`` in Python, for the local checkpoint store (core/checkpoint/restore.ts; store
layout in docs/reference/state-dir.md): a published checkpoint materialised into an empty or new
directory byte for byte, then rescanned and compared with its manifest. Every name is made
relative to its directory's fd, O_EXCL|O_NOFOLLOW (no planted link followed or replaced, no path
outside the target); owners as recorded when root. Owns the restore and the compare; an s3:// store is refused (no S3 client here).
"""
from __future__ import annotations

import base64
import hashlib
import os
import re
import stat
import time
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

from .errors import SupervisorError
from .paths import default_state_dir
from .state_verify import LocalStore, _check_published, check_manifest

_SETID = 0o6000
_BLOCK = 1024 * 1024
_TYPE_BITS = {"fifo": stat.S_IFIFO, "socket": stat.S_IFSOCK, "char": stat.S_IFCHR, "block": stat.S_IFBLK}
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


class RestoreError(SupervisorError):
    """A restore that could not be done (nothing claimed). ``details["restore_error"]``: as
    restore.ts, one of not_published, no_such_checkpoint, bad_manifest, target, object, io;
    code INVALID_ARGUMENT for the first two and target, else INTERNAL. The message is sbx's."""

    def __init__(self, kind: str, message: str) -> None:
        code = "INVALID_ARGUMENT" if kind in ("not_published", "no_such_checkpoint", "target") else "INTERNAL"
        super().__init__(code, f"restore: {message}", {"restore_error": kind})


def _b(v: Optional[str], b64: Optional[str]) -> bytes:
    if v is not None:
        return v.encode("utf-8", "surrogateescape")
    if b64 is not None:
        return base64.b64decode(b64)
    raise ValueError("a manifest entry has neither path nor path_b64")


def _path(e: Mapping[str, Any]) -> bytes:
    return _b(e.get("path"), e.get("path_b64"))


def _show(e: Mapping[str, Any]) -> str:
    if e.get("path") is not None:
        return str(e["path"])
    return "".join(chr(c) if 0x20 <= c < 0x7F else f"\\x{c:02x}" for c in _path(e))


def _name_fields(raw: bytes, field: str) -> Dict[str, str]:
    try:
        return {field: raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{field}_b64": base64.b64encode(raw).decode("ascii")}


def resolve_id(store: LocalStore, text: str) -> str:
    """A checkpoint id from 64 hex digits (or ``sha256:``), or a unique prefix of 8 or more."""
    t = text.strip().lower()
    t = t[len("sha256:"):] if t.startswith("sha256:") else t
    if not re.fullmatch(r"[0-9a-f]{1,64}", t):
        raise SupervisorError("INVALID_ARGUMENT", f"{text!r} is not a checkpoint id (64 hex digits, or a unique prefix of 8 or more)")
    if len(t) == 64:
        return t
    if len(t) < 8:
        raise SupervisorError("INVALID_ARGUMENT", f"{text!r}: give at least 8 hex digits of the checkpoint id")
    try:
        names = os.listdir(os.path.join(store.location, "manifests"))
    except OSError as err:
        raise SupervisorError("INTERNAL", f"cannot list the checkpoints in {store.location}: {err}") from None
    matches = sorted(n[:64] for n in names if re.fullmatch(r"[0-9a-f]{64}\.json", n) and n.startswith(t))
    if len(matches) == 1:
        return matches[0]
    raise SupervisorError("INVALID_ARGUMENT", f"no checkpoint {t}… in {store.location} (sbx checkpoints lists them)" if not matches else f"{t}… is ambiguous in {store.location}: {', '.join(matches)}")


def load_checkpoint(store: LocalStore, checkpoint_id: str, public_key_pem: str) -> Dict[str, Any]:
    """restore.ts loadCheckpoint: published (its record there and signed), the manifest's bytes its
    id, canonical, digest and counts holding, signed; a version 2 manifest's entries read from its
    tree objects in store (each checked), so the entries are version 1's either way. RestoreError otherwise."""
    published = store.read_published(checkpoint_id)
    try:
        data: Optional[bytes] = store.read_manifest(checkpoint_id)
        read_error = ""
    except OSError as err:
        data, read_error = None, str(err)
    if published is None:
        if data is not None:
            raise RestoreError("not_published", f"checkpoint {checkpoint_id} in {store.location} was never published (its read-back did not complete): it claims nothing")
        raise RestoreError("no_such_checkpoint", f"no checkpoint {checkpoint_id} in {store.location} (never taken there, or removed by gc)")
    if data is None:
        raise RestoreError("bad_manifest", f"checkpoint {checkpoint_id}: its published record is there but its manifest is not: {read_error}")
    record_problems = _check_published(published, checkpoint_id, public_key_pem)
    if record_problems:
        raise RestoreError("not_published", f"checkpoint {checkpoint_id}: its published record does not hold: {'; '.join(record_problems)}")
    m, problems = check_manifest(data, public_key_pem, expect_id=checkpoint_id, store=store)
    if m is None or problems:
        raise RestoreError("bad_manifest", f"checkpoint {checkpoint_id}: {'; '.join(problems)}")
    return m


def _open_target(target: str) -> int:
    """The target dir's fd: made if absent, a directory and not a link, empty; as root taken
    over (root's, 0700) until the end; anyone else only into a dir of their own no one else writes."""
    try:
        os.mkdir(target, 0o700)
    except FileExistsError:
        pass
    except OSError as err:
        raise RestoreError("target", f"cannot make {target}: {err}") from None
    try:
        fd = os.open(target, _OPEN_DIR)
    except OSError as err:
        if os.path.islink(target):
            raise RestoreError("target", f"{target} is a symlink (never followed): restore into an empty or new directory") from None
        if isinstance(err, NotADirectoryError):
            raise RestoreError("target", f"{target} is not a directory: restore into an empty or new directory") from None
        raise RestoreError("target", f"cannot open {target}: {err}") from None

    def not_empty() -> Optional[RestoreError]:
        names = os.listdir(fd)
        if names:
            return RestoreError("target", f"{target} is not empty ({len(names)} {'entry' if len(names) == 1 else 'entries'}, e.g. {names[0]!r}): restore into an empty or new directory")
        return None

    try:
        st = os.fstat(fd)
        me = os.getuid()
        refused = not_empty()
        if refused:
            raise refused
        if me == 0:
            if st.st_uid != 0 or st.st_gid != 0:
                os.fchown(fd, 0, 0)
            os.fchmod(fd, 0o700)
            late = not_empty()
            if late:
                os.fchown(fd, st.st_uid, st.st_gid)
                os.fchmod(fd, stat.S_IMODE(st.st_mode))
                raise late
        elif st.st_uid != me:
            raise RestoreError("target", f"{target} is owned by uid {st.st_uid}, not by you (uid {me}): restore into a new directory, or one of your own that only you can write")
        elif st.st_mode & 0o022:
            raise RestoreError("target", f"{target} is writable by others (mode 0{stat.S_IMODE(st.st_mode):o}): another user could plant names in it during the restore; restore into a new directory, or one only you can write")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _set_times(ns: str, fd: Optional[int] = None, name: Optional[bytes] = None, dir_fd: Optional[int] = None) -> None:
    t = int(ns)
    if fd is not None:
        os.utime(fd, ns=(t, t))
    else:
        os.utime(name, ns=(t, t), dir_fd=dir_fd, follow_symlinks=False)  # type: ignore[arg-type]


def restore_local(checkpoint_id: str, directory: str, *, state_dir: Optional[str] = None, store: Optional[str] = None, key_path: Optional[str] = None, same_owner: Optional[bool] = None) -> Dict[str, Any]:
    """Restores checkpoint_id (64 hex digits or a unique prefix of 8+) from the local store
    (``store``, default ``<state_dir>/checkpoints``; ``state_dir`` default ``$SBX_STATE_DIR``,
    else the default path, as sbx) into directory (empty or new), checking the manifest's
    signature under ``key_path`` (default ``<state_dir>/receipt-key.pub``), then
    rescans and compares. Returns what ``sbx restore --json`` prints (checkpoint_id, target,
    entries, files, bytes, owners, setid_dropped, consistent, unstable, not_captured,
    mounts_skipped, identical, differences, ms). Raises RestoreError (a SupervisorError) when it
    cannot restore; SupervisorError INVALID_ARGUMENT for an s3:// store, naming the fallback."""
    t0 = time.monotonic()
    if store is None:
        store = os.path.join(state_dir or default_state_dir(), "checkpoints")
    st = LocalStore(store)
    cid = resolve_id(st, checkpoint_id)
    key_file = key_path or os.path.join(state_dir or default_state_dir(), "receipt-key.pub")
    if not os.path.exists(key_file):
        raise SupervisorError("INVALID_ARGUMENT", f"no public key to check the manifest's signature ({key_file} is absent): give key_path")
    with open(key_file) as f:
        pem = f.read()
    m = load_checkpoint(st, cid, pem)
    target = os.path.abspath(directory)
    same = same_owner if same_owner is not None else os.getuid() == 0
    my_uid, my_gid = os.getuid(), os.getgid()
    root_fd = _open_target(target)
    stack: List[Tuple[int, bytes, Mapping[str, Any]]] = []
    setid_dropped: List[str] = []
    dropped: Set[int] = set()  # id() of entries (or 0 for the root) whose set-ID bits were dropped
    files = n_bytes = 0

    def mode_for(e: Mapping[str, Any], key: int, where: str) -> int:
        given = same or (e["uid"] == my_uid and e["gid"] == my_gid)
        if given or not e["mode"] & _SETID:
            return int(e["mode"])
        setid_dropped.append(where)
        dropped.add(key)
        return int(e["mode"]) & ~_SETID

    def set_meta(fd: int, e: Mapping[str, Any]) -> None:
        """Owner (when restoring as the same user), mode and mtime of the entry, on its open fd."""
        if same:
            os.fchown(fd, e["uid"], e["gid"])
        os.fchmod(fd, mode_for(e, id(e), _show(e)))
        _set_times(e["mtime_ns"], fd=fd)

    def finish_dir(d: Tuple[int, bytes, Mapping[str, Any]]) -> None:
        fd, _, e = d
        try:
            set_meta(fd, e)
        finally:
            os.close(fd)

    try:
        for e in m["entries"]:
            comps = _path(e).split(b"/")
            name = comps[-1]
            while len(stack) > len(comps) - 1:
                finish_dir(stack.pop())
            for i in range(len(comps) - 1):
                if i >= len(stack) or stack[i][1] != comps[i]:
                    raise RestoreError("bad_manifest", f"checkpoint {cid}: entry {_show(e)!r} comes before (or without) its directory")
            dir_fd = stack[-1][0] if stack else root_fd
            where = f'"{_show(e)}"'
            try:
                t = e["type"]
                if t == "dir":
                    os.mkdir(name, 0o700, dir_fd=dir_fd)
                    stack.append((os.open(name, _OPEN_DIR, dir_fd=dir_fd), name, e))
                elif t == "file":
                    fd = os.open(name, _CREATE, 0o600, dir_fd=dir_fd)
                    try:
                        for part in e.get("chunks") or [{"sha256": e["sha256"], "size": e["size"]}]:
                            _copy_object(st, part["sha256"], part["size"], fd, where)
                        set_meta(fd, e)
                    finally:
                        os.close(fd)
                    files += 1
                    n_bytes += e["size"]
                elif t == "symlink":
                    os.symlink(_b(e.get("target"), e.get("target_b64")), name, dir_fd=dir_fd)
                    if same:
                        os.chown(name, e["uid"], e["gid"], dir_fd=dir_fd, follow_symlinks=False)
                    _set_times(e["mtime_ns"], name=name, dir_fd=dir_fd)
                else:
                    mode = mode_for(e, id(e), _show(e))
                    umask = os.umask(0)
                    try:
                        os.mknod(name, _TYPE_BITS[t] | (mode & 0o7777), e.get("rdev") or 0, dir_fd=dir_fd)
                    finally:
                        os.umask(umask)
                    if same:
                        os.chown(name, e["uid"], e["gid"], dir_fd=dir_fd, follow_symlinks=False)
                    _set_times(e["mtime_ns"], name=name, dir_fd=dir_fd)
            except RestoreError:
                raise
            except FileExistsError:
                raise RestoreError("target", f"{target}: {where} appeared while restoring (planted?): never written through or replaced; the restore stops here") from None
            except OSError as err:
                raise RestoreError("io", f"{target}: restoring {where} failed: {err}") from None
        while stack:
            finish_dir(stack.pop())
        r = m.get("root")
        if r:
            if same:
                os.fchown(root_fd, r["uid"], r["gid"])
            os.fchmod(root_fd, mode_for(r, 0, "."))
            _set_times(r["mtime_ns"], fd=root_fd)
    except RestoreError:
        raise
    except OSError as err:
        raise RestoreError("io", f"{target}: {err}") from None
    finally:
        for d in stack:
            os.close(d[0])
        os.close(root_fd)
    differences = compare_tree(m, target, compare_owners=same, setid_dropped=dropped)
    held = {_show_text(_path(e)) for e in m["entries"]}
    return {
        "checkpoint_id": cid,
        "target": target,
        "entries": len(m["entries"]),
        "files": files,
        "bytes": n_bytes,
        "owners": "same" if same else "not_given",
        "setid_dropped": setid_dropped,
        "consistent": m.get("consistent"),
        "unstable": m.get("unstable"),
        "not_captured": [p for p in m.get("unstable") or [] if p not in held],
        "mounts_skipped": [_show_text(_path(e)) for e in m["entries"] if e.get("mount") is True],
        "identical": not differences,
        "differences": differences,
        "ms": round((time.monotonic() - t0) * 1000),
    }


def _show_text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _copy_object(store: LocalStore, sha256: str, size: int, fd: int, where: str) -> None:
    h = hashlib.sha256()
    n = 0
    try:
        for piece in store.read_object(sha256):
            h.update(piece)
            view = memoryview(piece)
            while view:
                view = view[os.write(fd, view):]
            n += len(piece)
    except (OSError, ValueError) as err:
        raise RestoreError("object", f"{where}: object {sha256}: {err}") from None
    if h.hexdigest() != sha256:
        raise RestoreError("object", f"{where}: object {sha256} in {store.location} reads as {h.hexdigest()} ({n} bytes): the store's copy is damaged; the restore stops here")
    if n != size:
        raise RestoreError("object", f"{where}: object {sha256} holds {n} bytes, the manifest says {size}; the restore stops here")


def describe_tree(root: str) -> List[Dict[str, Any]]:
    """Every entry under root (not root itself) as a manifest records it, in manifest order,
    files hashed; no link followed (lstat, files opened O_NOFOLLOW)."""
    out: List[Dict[str, Any]] = []
    root_b = os.fsencode(root)

    def walk(rel: bytes) -> None:
        full = os.path.join(root_b, rel) if rel else root_b
        for name in sorted(os.listdir(full)):
            p = rel + b"/" + name if rel else name
            st = os.lstat(os.path.join(root_b, p))
            mode = st.st_mode
            e: Dict[str, Any] = {**_name_fields(p, "path")}
            size = 0
            if stat.S_ISDIR(mode):
                t = "dir"
            elif stat.S_ISREG(mode):
                t = "file"
                h = hashlib.sha256()
                fd = os.open(os.path.join(root_b, p), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                try:
                    while True:
                        b = os.read(fd, _BLOCK)
                        if not b:
                            break
                        h.update(b)
                        size += len(b)
                finally:
                    os.close(fd)
                e["sha256"] = h.hexdigest()
            elif stat.S_ISLNK(mode):
                t = "symlink"
                target = os.readlink(os.path.join(root_b, p))
                size = len(target)
                e.update(_name_fields(target, "target"))
            elif stat.S_ISFIFO(mode):
                t = "fifo"
            elif stat.S_ISSOCK(mode):
                t = "socket"
            elif stat.S_ISCHR(mode):
                t = "char"
            elif stat.S_ISBLK(mode):
                t = "block"
            else:
                continue
            e.update({"type": t, "mode": stat.S_IMODE(mode), "uid": st.st_uid, "gid": st.st_gid, "size": size, "mtime_ns": str(st.st_mtime_ns)})
            if t in ("char", "block"):
                e["rdev"] = st.st_rdev
            out.append(e)
            if t == "dir":
                walk(p)

    walk(b"")
    return out


def compare_tree(m: Mapping[str, Any], target: str, *, compare_owners: bool, setid_dropped: Set[int]) -> List[Dict[str, Any]]:
    """restore.ts compareTree: missing and extra paths, and per path each field (mtime to the
    ns; uid/gid only with compare_owners; a mode whose set-ID bits were dropped compared
    without them). The target itself is path '.'."""
    out: List[Dict[str, Any]] = []
    fields = ["type", "mode", *(["uid", "gid"] if compare_owners else []), "size", "sha256", "target", "target_b64", "rdev", "mtime_ns"]

    def expected_mode(mode: int, key: int) -> int:
        return mode & ~_SETID if key in setid_dropped else mode

    r = m.get("root")
    if r:
        st = os.lstat(target)
        found = {"mode": stat.S_IMODE(st.st_mode), "uid": st.st_uid, "gid": st.st_gid, "mtime_ns": str(st.st_mtime_ns)}
        want = {**r, "mode": expected_mode(r["mode"], 0)}
        for f in ["mode", *(["uid", "gid"] if compare_owners else []), "mtime_ns"]:
            if found[f] != want.get(f):
                out.append({"path": ".", "field": f, "found": found[f], "expected": want.get(f)})
    got = {_path(e): e for e in describe_tree(target)}
    for e in m["entries"]:
        k = _path(e)
        f = got.pop(k, None)
        where = _show(e)
        if f is None:
            out.append({"path": where, "field": "missing", "found": None, "expected": e["type"]})
            continue
        for field in fields:
            if field == "sha256" and e.get("sha256") is None:
                continue  # chunked: each chunk was checked as it was written
            want_v = expected_mode(e["mode"], id(e)) if field == "mode" else e.get(field)
            if want_v != f.get(field):
                out.append({"path": where, "field": field, "found": f.get(field), "expected": want_v})
    for f in got.values():
        out.append({"path": _show(f), "field": "extra", "found": f["type"], "expected": None})
    return out
