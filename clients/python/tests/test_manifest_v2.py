"""Manifest version 2 (entries in tree objects: sandbox_supervisor/tree.py) read in Python, no daemon:
a store built by hand expands to the version 1 entries of the same tree (a name not UTF-8, a symlink,
an empty dir, a mount point, two identical subtrees sharing one tree); each damage (a tree byte, a
missing tree, names out of order, a dir without its tree, a form not canonical) is named; version 1
still reads; restore, diff and verify take either; and the expansion is tree.ts's (run with node)."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
from typing import Any, Dict, List, Optional, Tuple

import pytest

from daemon import ROOT
from sandbox_supervisor import canonicalize
from sandbox_supervisor.diff import diff_local
from sandbox_supervisor.errors import SupervisorError
from sandbox_supervisor.restore import RestoreError, load_checkpoint, restore_local
from sandbox_supervisor.state_verify import LocalStore, check_manifest, manifest_objects, verify_checkpoint
from sandbox_supervisor.tree import check_tree, expand_tree, tree_bytes, tree_entry, tree_id

pytest.importorskip("cryptography")

UID, GID = os.getuid(), os.getgid()
X = b"x-content\n"
C1, C2 = b"first chunk ", b"second\n"


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def meta(t: str, **more: Any) -> Dict[str, Any]:
    """An entry's fields (no path, no name), owned by the user running the tests."""
    return {"type": t, "mode": 0o755 if t == "dir" else 0o644, "uid": UID, "gid": GID, "size": 0, "mtime_ns": "1600000000123456789", **more}


FILE_X = meta("file", size=len(X), sha256=sha(X))
CHUNKED = meta("file", size=len(C1 + C2), chunks=[{"sha256": sha(C1), "size": len(C1)}, {"sha256": sha(C2), "size": len(C2)}])
LINK = meta("symlink", mode=0o777, size=len(b"a/x.txt"), target="a/x.txt")
FIFO = meta("fifo")
DEV = meta("char", mode=0o600, rdev=0x0103)
MOUNT = meta("dir", mount=True)

# The workspace, as (name, fields, children or None): a and b the same subtree, a/y and b/y empty.
SUB = [(b"x.txt", FILE_X, None), (b"y", meta("dir"), [])]
WORKSPACE = [
    (b"a", meta("dir"), SUB),
    (b"b", meta("dir"), SUB),
    (b"bad\xff", CHUNKED, None),
    (b"fifo", FIFO, None),
    (b"link", LINK, None),
    (b"mnt", MOUNT, None),
    (b"z\xfe", meta("dir", mode=0o700), [(b"in", FILE_X, None)]),
]


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


# What version 1 lists for it (written out, not derived).
EXPECTED = [
    {"path": "a", **meta("dir")},
    {"path": "a/x.txt", **FILE_X},
    {"path": "a/y", **meta("dir")},
    {"path": "b", **meta("dir")},
    {"path": "b/x.txt", **FILE_X},
    {"path": "b/y", **meta("dir")},
    {"path_b64": b64(b"bad\xff"), **CHUNKED},
    {"path": "fifo", **FIFO},
    {"path": "link", **LINK},
    {"path": "mnt", **MOUNT},
    {"path_b64": b64(b"z\xfe"), **meta("dir", mode=0o700)},
    {"path_b64": b64(b"z\xfe/in"), **FILE_X},
]


class Store:
    """A local store built by hand in a temp dir: objects/<aa>/<sha256>, manifests/, published/, and a signing key."""

    def __init__(self, directory: str) -> None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        self.dir = directory
        for d in ("objects", "manifests", "published"):
            os.makedirs(os.path.join(directory, d), exist_ok=True)
        self.key = Ed25519PrivateKey.generate()
        self.pem = self.key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()
        raw = self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.key_id = "sha256:" + sha(raw)
        self.key_path = os.path.join(directory, "..", f"{os.path.basename(directory)}-key.pub")
        with open(self.key_path, "w") as f:
            f.write(self.pem)
        self.local = LocalStore(directory)

    def obj(self, oid: str) -> str:
        return os.path.join(self.dir, "objects", oid[:2], oid)

    def put(self, data: bytes) -> str:
        oid = sha(data)
        os.makedirs(os.path.dirname(self.obj(oid)), exist_ok=True)
        with open(self.obj(oid), "wb") as f:
            f.write(data)
        return oid

    def tree(self, items: List[Tuple[bytes, Dict[str, Any], Optional[list]]]) -> str:
        """Stores the tree of items and its subtrees (bytewise by name, as a writer does) and returns its id."""
        entries = []
        for name, fields, children in sorted(items, key=lambda i: i[0]):
            entries.append(tree_entry(fields, name, self.tree(children) if children is not None else None))
        return self.put(tree_bytes(entries))

    def sign(self, doc: Dict[str, Any]) -> Dict[str, Any]:
        unsigned = {k: v for k, v in doc.items() if k != "signature"}
        value = base64.b64encode(self.key.sign(canonicalize(unsigned))).decode()
        return {**unsigned, "signature": {"alg": "ed25519", "key_id": self.key_id, "value": value}}

    def manifest(self, *, root: Optional[str] = None, entries: Optional[list] = None, edit: Any = None) -> Tuple[str, bytes]:
        """Stores a signed, published manifest: version 2 naming root, or version 1 listing entries; edit(m) changes it before signing."""
        listed = entries if entries is not None else EXPECTED
        files = [e for e in listed if e["type"] == "file"]
        m: Dict[str, Any] = {
            "version": 2 if root else 1,
            "kind": "checkpoint",
            "workspace": "/ws",
            "task": "t-1",
            "started_at": "2024-01-01T00:00:00.000Z",
            "created_at": "2024-01-01T00:00:01.000Z",
            "boundary": {"epoch": None, "seq": None, "gap": "not_watched"},
            "scan": {"digest": f"sha256:{root}" if root else "sha256:" + sha(canonicalize(listed)), "entries": len(listed), "files": len(files), "bytes": sum(e["size"] for e in files), "passes": 1},
            "consistent": True,
            "unstable": [],
            "supervisor": {"instance": "i-1", "generation": 1, "boot_id": "boot", "mode": "user"},
            "root": {"mode": 0o755, "uid": UID, "gid": GID, "mtime_ns": "1600000000000000000"},
        }
        if root:
            m["tree"] = root
        else:
            m["entries"] = listed
        if edit:
            edit(m)
        data = canonicalize(self.sign(m))
        cid = sha(data)
        with open(os.path.join(self.dir, "manifests", f"{cid}.json"), "wb") as f:
            f.write(data)
        record = {"version": 1, "kind": "checkpoint_published", "checkpoint_id": cid, "workspace": "/ws", "task": "t-1", "boundary": m["boundary"], "read_back": {"at": "2024-01-01T00:00:02.000Z", "objects": 1, "bytes": 1, "ms": 1}, "supervisor": m["supervisor"]}
        with open(os.path.join(self.dir, "published", f"{cid}.json"), "wb") as f:
            f.write(canonicalize(self.sign(record)))
        return cid, data


@pytest.fixture
def store(tmp_path) -> Store:
    s = Store(str(tmp_path / "store"))
    for b in (X, C1, C2):
        s.put(b)
    return s


def ids(s: Store) -> Dict[str, str]:
    """The tree ids of WORKSPACE: root, sub (a and b), empty (a/y and b/y), z."""
    return {"root": s.tree(WORKSPACE), "sub": s.tree(SUB), "empty": s.tree([]), "z": s.tree([(b"in", FILE_X, None)])}


def test_v2_expands_to_the_v1_entries(store: Store):
    t = ids(store)
    cid, data = store.manifest(root=t["root"])
    reads: List[str] = []

    def read(tid: str) -> Optional[bytes]:
        reads.append(tid)
        return store.local.read_tree(tid)

    m, problems = check_manifest(data, store.pem, expect_id=cid, store=read)
    assert problems == [] and m is not None
    assert m["entries"] == EXPECTED
    # Each tree read once, the shared one too; the mount point and the files name none.
    assert sorted(reads) == sorted(set(t.values())) and len(reads) == 4
    assert m.trees == {tid: os.path.getsize(store.obj(tid)) for tid in t.values()}
    # The objects it names: its trees and its files' (whole and chunks).
    assert manifest_objects(m) == {**m.trees, sha(X): len(X), sha(C1): len(C1), sha(C2): len(C2)}
    # A LocalStore reads the same.
    assert check_manifest(data, store.pem, expect_id=cid, store=store.local) == (m, [])
    # The stored bytes carry no entries; the signature covers them without.
    assert "entries" not in json.loads(data) and json.loads(data)["version"] == 2


def test_v1_still_reads_and_equals_v2(store: Store, tmp_path):
    t = ids(store)
    v2, data2 = store.manifest(root=t["root"])
    v1, data1 = store.manifest(entries=EXPECTED)
    m1, p1 = check_manifest(data1, store.pem, expect_id=v1)
    assert p1 == [] and m1 is not None and m1["entries"] == EXPECTED and m1.trees == {}
    m2, p2 = check_manifest(data2, store.pem, expect_id=v2, store=store.local)
    assert p2 == [] and m1["entries"] == m2["entries"]
    # A store given to a version 1 manifest is not needed, and changes nothing.
    assert check_manifest(data1, store.pem, expect_id=v1, store=store.local) == (m1, [])
    assert diff_local(v1, v2, store=store.dir, key_path=store.key_path)["identical"] is True
    assert load_checkpoint(store.local, v2, store.pem)["entries"] == load_checkpoint(store.local, v1, store.pem)["entries"]


def test_no_store_is_named(store: Store):
    cid, data = store.manifest(root=ids(store)["root"])
    assert check_manifest(data, store.pem, expect_id=cid) == (None, ["a version 2 manifest's entries are in the store's tree objects: no store was given"])


def test_verify_rehashes_the_trees_and_names_a_flipped_byte(store: Store):
    t = ids(store)
    cid, _ = store.manifest(root=t["root"])
    v = verify_checkpoint(cid, store.pem, store.local)
    assert v.ok and v.problems == [], v.problems
    # Every object once: 4 trees and 3 file objects (x.txt's named 3 times).
    assert v.objects == 7 and v.bytes == sum(os.path.getsize(store.obj(tid)) for tid in t.values()) + len(X + C1 + C2)
    path = store.obj(t["sub"])
    data = bytearray(open(path, "rb").read())
    data[20] ^= 0x01
    open(path, "wb").write(bytes(data))
    v = verify_checkpoint(cid, store.pem, store.local)
    got = sha(bytes(data))
    assert not v.ok and v.problems == [f'tree {t["sub"]} reads back as {got} ({len(data)} bytes): its bytes changed in the store (directory "a")']
    with pytest.raises(RestoreError) as e:
        load_checkpoint(store.local, cid, store.pem)
    assert e.value.details["restore_error"] == "bad_manifest" and t["sub"] in e.value.message


def test_a_missing_tree_is_named(store: Store):
    t = ids(store)
    cid, data = store.manifest(root=t["root"])
    os.unlink(store.obj(t["z"]))
    m, problems = check_manifest(data, store.pem, expect_id=cid, store=store.local)
    assert m is None and problems == [f'tree {t["z"]} (directory "z\u00fe") is missing from the store']
    os.unlink(store.obj(t["root"]))
    assert check_manifest(data, store.pem, expect_id=cid, store=store.local) == (None, [f'tree {t["root"]} (the root) is missing from the store'])


def raw_tree(entries: List[Dict[str, Any]]) -> Tuple[bytes, str]:
    """A tree's bytes as given (entries in the order given, not checked) and its id."""
    data = canonicalize({"entries": entries, "kind": "checkpoint_tree", "version": 2})
    return data, tree_id(data)


def test_names_out_of_order_or_twice_are_refused(store: Store):
    for names in ([b"b", b"a"], [b"a", b"a"], [b"a\xff", b"a\x01"]):
        data, tid = raw_tree([tree_entry(FILE_X, n) for n in names])
        shown = json.dumps(names[1].decode("latin-1"), ensure_ascii=False)
        assert check_tree(data, tid)[2] == [f"tree {tid}: entry {shown} out of order or listed twice"]
    data, tid = raw_tree([tree_entry(FILE_X, b"b"), tree_entry(FILE_X, b"a")])
    store.put(data)
    cid, manifest = store.manifest(root=tid, entries=[{"path": "a", **FILE_X}, {"path": "b", **FILE_X}])
    m, problems = check_manifest(manifest, store.pem, expect_id=cid, store=store.local)
    assert m is None and problems == [f'tree {tid}: entry "a" out of order or listed twice (the root)']


def test_tree_field_on_the_wrong_entries_is_refused():
    data, tid = raw_tree([tree_entry(meta("dir"), b"d")])
    assert check_tree(data, tid)[2] == [f'tree {tid}: directory "d" names no tree (64 hex digits)']
    data, tid = raw_tree([tree_entry(meta("dir"), b"d", "NOTHEX")])
    assert check_tree(data, tid)[2] == [f'tree {tid}: directory "d" names no tree (64 hex digits)']
    data, tid = raw_tree([tree_entry(MOUNT, b"m", "0" * 64)])
    assert check_tree(data, tid)[2] == [f'tree {tid}: mount point "m" names a tree']
    data, tid = raw_tree([tree_entry(FILE_X, b"f", "0" * 64)])
    assert check_tree(data, tid)[2] == [f'tree {tid}: file "f" names a tree']


def test_names_must_be_one_plain_name():
    for name in (b"", b".", b"..", b"a/b", b"a\0b"):
        data, tid = raw_tree([tree_entry(FILE_X, name)])
        shown = json.dumps(name.decode("latin-1"))
        assert check_tree(data, tid)[2] == [f"tree {tid}: entry {shown} is not one plain name"], name
    for e in ({**FILE_X}, {**FILE_X, "name": "a", "name_b64": "YQ=="}):
        data, tid = raw_tree([e])
        assert check_tree(data, tid)[2] == [f"tree {tid}: an entry with no name (exactly one of name, name_b64)"]


def test_entry_fields_are_checked_as_v1s():
    cases = [
        ({**FILE_X, "sha256": None}, "a file with no sha256 (64 hex digits) or chunks"),
        (meta("dir", mode=0o10000), "mode 4096 is not permission bits (0..07777)"),
        (meta("fifo", rdev=1), "a fifo with an rdev"),
        (meta("char"), "a device with no rdev"),
        (meta("file", mount=True, sha256=sha(X)), "mount true on a file: only a directory is a mount point (true)"),
        ({**CHUNKED, "size": 1}, "chunks are not {sha256, size} adding up to size"),
        (meta("socket", mtime_ns=12), "mtime_ns is not decimal nanoseconds"),
        (meta("socket", mtime_ns="1" * 29), "mtime_ns is not decimal nanoseconds"),
        (meta("nope"), 'unknown type "nope"'),
    ]
    for fields, problem in cases:
        data, tid = raw_tree([tree_entry(fields, b"e", "1" * 64 if fields["type"] == "dir" else None)])
        assert check_tree(data, tid)[2] == [f'tree {tid}: entry "e": {problem}'], fields
    # Times past int64 nanoseconds are times (touch -d 6000 on a tmpfs: 21 digits; before 1677).
    for ns in ("127174492800000000000", "-11676095999500000000", "1" * 28):
        data, tid = raw_tree([tree_entry(meta("fifo", mtime_ns=ns), b"e")])
        assert check_tree(data, tid)[2] == [], ns


def test_canonical_form_is_enforced():
    good, _ = raw_tree([tree_entry(FILE_X, b"f")])
    for data in (
        good.replace(b'"kind"', b' "kind"'),  # whitespace
        json.dumps(json.loads(good), sort_keys=False).encode(),  # spaces after separators
        b'{"kind":"checkpoint_tree","entries":' + good[len(b'{"entries":') : good.index(b',"kind"')] + b',"version":2}',  # key order
    ):
        assert check_tree(data, sha(data))[2] == [f"tree {sha(data)} is not in canonical form (RFC 8785)"], data
    assert check_tree(good, sha(good))[2] == []
    other = canonicalize({"entries": [], "kind": "checkpoint", "version": 2})
    assert check_tree(other, sha(other))[2] == [f'object {sha(other)} is not a tree (kind "checkpoint_tree", version 2, with entries)']
    assert check_tree(b"{", sha(b"{"))[2][0].startswith(f"tree {sha(b'{')} is not JSON: ")


def test_manifest_head_checks(store: Store):
    t = ids(store)
    cid, data = store.manifest(root=t["root"], edit=lambda m: m["scan"].update(entries=5))
    # Its trees are read no further than it says (a planted chain of shared subtrees would expand past any memory).
    assert check_manifest(data, store.pem, expect_id=cid, store=store.local)[1] == ["the trees hold more than the 5 entries the manifest says: not read further"]
    cid, data = store.manifest(root=t["root"], edit=lambda m: m["scan"].update(digest="sha256:" + "0" * 64))
    assert check_manifest(data, store.pem, expect_id=cid, store=store.local)[1] == [f"the scan digest is sha256:{'0' * 64}, the root tree is sha256:{t['root']}"]
    cid, data = store.manifest(root=t["root"], edit=lambda m: m.update(entries=[]))
    assert check_manifest(data, store.pem, expect_id=cid, store=store.local) == (None, ["not a version 2 checkpoint manifest (a root `tree`, 64 hex digits, and no entries)"])
    cid, data = store.manifest(root=t["root"])
    edited = canonicalize({**json.loads(data), "workspace": "/elsewhere"})
    m, problems = check_manifest(edited, store.pem, expect_id=cid, store=store.local)
    # Its signature does not verify: its trees are not read.
    assert m is None and "the signature does not match the manifest: a field was changed after signing" in problems
    assert problems[-1] == "its trees were not read: its signature does not verify"
    assert "the stored manifest is not in canonical form (RFC 8785): its bytes were edited" in check_manifest(data + b" ", store.pem, expect_id=cid, store=store.local)[1]


def test_v2_restore_and_diff(store: Store, tmp_path):
    ws = [i for i in WORKSPACE if i[0] != b"fifo"] + [(b"fifo", FIFO, None)]  # the same, listed in another order
    root = store.tree(ws)
    assert root == ids(store)["root"]
    cid, _ = store.manifest(root=root)
    out = restore_local(cid, str(tmp_path / "target"), store=store.dir, key_path=store.key_path)
    assert out["identical"] is True and out["differences"] == [], out["differences"]
    assert out["entries"] == len(EXPECTED) and out["files"] == 4 and out["mounts_skipped"] == ["mnt"]
    target = os.fsencode(str(tmp_path / "target"))
    assert open(os.path.join(target, b"bad\xff"), "rb").read() == C1 + C2 and os.readlink(os.path.join(target, b"link")) == b"a/x.txt"
    assert os.listdir(os.path.join(target, b"a", b"y")) == [] and open(os.path.join(target, b"z\xfe", b"in"), "rb").read() == X
    # A second checkpoint: b/x.txt's content changed (a new tree for b; a keeps its own).
    y = b"y-content\n"  # the same size: a content change
    store.put(y)
    sub2 = [(b"x.txt", meta("file", size=len(y), sha256=sha(y)), None), (b"y", meta("dir"), [])]
    cid2, _ = store.manifest(root=store.tree([(n, f, sub2 if n == b"b" else c) for n, f, c in WORKSPACE]))
    d = diff_local(cid, cid2, store=store.dir, key_path=store.key_path)
    assert d["counts"]["modified"] == 1 and d["modified"][0]["path"] == "b/x.txt" and d["modified"][0]["changed"] == ["content"]


# -- cross-check with the TypeScript implementation (core/checkpoint/tree.ts), run with node + tsx

TS_SCRIPT = r"""
import { readFileSync, writeFileSync, mkdirSync } from 'node:fs';
const { treeBytes, treeEntryJcs, treeId, expandSync, checkTree } = await import(process.env.TREE_TS);
const { checkManifest } = await import(process.env.MANIFEST_TS);
const input = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const dir = input.store;
const obj = (id) => `${dir}/objects/${id.slice(0, 2)}/${id}`;
function build(items) {
  const named = items.map((i) => ({ ...i, raw: Buffer.from(i.name_b64, 'base64') })).sort((a, b) => Buffer.compare(a.raw, b.raw));
  const bytes = treeBytes(named.map((i) => treeEntryJcs(i.fields, i.raw, i.children ? build(i.children) : undefined)));
  const id = treeId(bytes);
  mkdirSync(`${dir}/objects/${id.slice(0, 2)}`, { recursive: true });
  writeFileSync(obj(id), bytes);
  return id;
}
const read = (id) => { try { return readFileSync(obj(id)); } catch { return null; } };
const out = { roots: [], expanded: [], checks: [] };
for (const ws of input.workspaces) {
  const root = build(ws);
  const e = expandSync(root, read);
  out.roots.push(root);
  out.expanded.push({ entries: e.entries, trees: Object.fromEntries(e.trees), problems: e.problems });
}
for (const [b64, id] of input.checks) out.checks.push(checkTree(Buffer.from(b64, 'base64'), id).problems);
for (const [root, missing] of input.missing) out.checks.push(expandSync(root, (id) => (id === missing ? null : read(id))).problems);
out.manifests = input.manifests.map(({ store, id, pem }) => {
  const r = checkManifest(readFileSync(`${store}/manifests/${id}.json`), {
    expectId: id, publicKeyPem: pem, readTree: (t) => { try { return readFileSync(`${store}/objects/${t.slice(0, 2)}/${t}`); } catch { return null; } },
  });
  return { entries: r.manifest ? r.manifest.entries : null, problems: r.problems };
});
writeFileSync(process.argv[3], JSON.stringify(out));
"""


def describe(items: List[Tuple[bytes, Dict[str, Any], Optional[list]]]) -> List[Dict[str, Any]]:
    return [{"name_b64": b64(n), "fields": f, **({"children": describe(c)} if c is not None else {})} for n, f, c in items]


def node_tsx() -> Optional[str]:
    node = shutil.which("node")
    if node is None or not os.path.isdir(os.path.join(ROOT, "node_modules", "tsx")):
        return None
    return node


@pytest.mark.skipif(node_tsx() is None, reason="node or tsx (node_modules/tsx) is not available: the TypeScript cross-check needs `node --import tsx`")
def test_expansion_and_checks_equal_typescripts(tmp_path):
    ts_store = tmp_path / "ts-store"
    py = Store(str(tmp_path / "py-store"))
    deep = [(b"d", meta("dir"), [(b"e", meta("dir"), [(b"\xc3\xa9t\xc3\xa9", FILE_X, None), (b"\x80", DEV, None)])]), (b"d-", FILE_X, None), (b"d.", meta("dir"), [])]
    workspaces = [WORKSPACE, deep, []]
    bad = [
        raw_tree([tree_entry(FILE_X, b"b"), tree_entry(FILE_X, b"a")])[0],
        raw_tree([tree_entry(meta("dir"), b"d"), tree_entry(MOUNT, b"m", "0" * 64), tree_entry(FILE_X, b"..")])[0],
        raw_tree([{**FILE_X}, {**meta("char"), "name": "c"}, tree_entry({**CHUNKED, "size": 3}, b"x/y")])[0],
        raw_tree([tree_entry(FILE_X, b"f")])[0].replace(b'"kind"', b' "kind"'),
        canonicalize({"entries": [], "kind": "checkpoint", "version": 2}),
    ]
    checks = [[b64(b), sha(b)] for b in bad] + [[b64(bad[0]), "0" * 64]]
    py_roots = [py.tree(ws) for ws in workspaces]
    sub = py.tree(SUB)
    missing = [[py_roots[0], sub], [py_roots[0], py.tree([(b"in", FILE_X, None)])], [py_roots[1], py_roots[1]]]
    # Whole manifests made here, read by manifest.ts checkManifest: a good one, one whose count is off, one with a tree missing.
    manifests = [py.manifest(root=py_roots[0])[0], py.manifest(root=py_roots[0], edit=lambda m: m["scan"].update(entries=3))[0]]
    gone = Store(str(tmp_path / "gone-store"))
    manifests.append(gone.manifest(root=gone.tree(WORKSPACE))[0])
    gone_z = tree_bytes([tree_entry(FILE_X, b"in")])
    os.unlink(gone.obj(sha(gone_z)))
    stores = [(py, manifests[0]), (py, manifests[1]), (gone, manifests[2])]
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({
        "store": str(ts_store), "workspaces": [describe(ws) for ws in workspaces], "checks": checks, "missing": missing,
        "manifests": [{"store": st.dir, "id": cid, "pem": st.pem} for st, cid in stores],
    }))
    script = tmp_path / "tree-check.mjs"
    script.write_text(TS_SCRIPT)
    out_path = tmp_path / "out.json"
    env = {**os.environ, "TREE_TS": os.path.join(ROOT, "core", "checkpoint", "tree.ts"), "MANIFEST_TS": os.path.join(ROOT, "core", "checkpoint", "manifest.ts")}
    p = subprocess.run([node_tsx() or "node", "--import", "tsx", str(script), str(spec), str(out_path)], cwd=ROOT, env=env, capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    ts = json.loads(out_path.read_text())
    # The same bytes for the same tree: Python's tree_entry/tree_bytes are tree.ts's treeEntryJcs/treeBytes.
    assert ts["roots"] == py_roots
    ts_local = LocalStore(str(ts_store))
    for root, want in zip(ts["roots"], ts["expanded"]):
        got = expand_tree(root, ts_local.read_tree)
        assert {"entries": got.entries, "trees": got.trees, "problems": got.problems} == want
    assert ts["expanded"][0]["entries"] == EXPECTED
    # The same problems, word for word, for damaged trees and missing ones.
    got_checks = [check_tree(base64.b64decode(b), tid)[2] for b, tid in checks]
    got_checks += [expand_tree(root, lambda tid, m=gone: None if tid == m else py.local.read_tree(tid)).problems for root, gone in missing]
    assert got_checks == ts["checks"]
    got_manifests = []
    for st, cid in stores:
        m, problems = check_manifest(open(os.path.join(st.dir, "manifests", f"{cid}.json"), "rb").read(), st.pem, expect_id=cid, store=st.local)
        got_manifests.append({"entries": m["entries"] if m is not None else None, "problems": problems})
    assert got_manifests == ts["manifests"]
    assert [m["problems"] for m in got_manifests] == [[], ["the trees hold more than the 3 entries the manifest says: not read further"], [f'tree {sha(gone_z)} (directory "z\u00fe") is missing from the store']]


def test_store_alone_takes_the_key_from_sbx_state_dir(store: Store, tmp_path, monkeypatch):
    """store= without key_path: the key is <$SBX_STATE_DIR>/receipt-key.pub, as sbx takes it;
    absent, the error names the file it looked for."""
    cid, _ = store.manifest(root=ids(store)["root"])
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("SBX_STATE_DIR", str(state))
    with pytest.raises(SupervisorError) as no_key:
        restore_local(cid, str(tmp_path / "t1"), store=store.dir)
    assert f"({state}/receipt-key.pub is absent): give key_path" in str(no_key.value)
    with pytest.raises(SupervisorError) as no_key_diff:
        diff_local(cid, cid, store=store.dir)
    assert f"({state}/receipt-key.pub is absent): give key_path" in str(no_key_diff.value)
    with open(store.key_path) as src, open(state / "receipt-key.pub", "w") as dst:
        dst.write(src.read())
    assert restore_local(cid, str(tmp_path / "t2"), store=store.dir)["identical"] is True
    assert diff_local(cid, cid, store=store.dir)["identical"] is True
