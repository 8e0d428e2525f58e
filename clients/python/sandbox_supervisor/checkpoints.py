"""Restore and diff of published checkpoints without the supervisor (``sbx restore``/``sbx diff`` offline):
a local store is read in Python (restore.py, diff.py), an ``s3://`` store or an explicit ``sbx`` by running
the sbx bin and taking its ``--json``. Owns choosing which; the clients' ``restore``/``diff`` call these.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any, Dict, List, Optional

from .errors import ERROR_CODES, SupervisorError


def _sbx_json(args: List[str], verb: str, *, last_line: bool = False) -> Any:
    """Runs ``sbx VERB ... --json``: its JSON on exit 0 or 1, else SupervisorError with the code sbx
    names on stderr (its last line with ``last_line``: sbx diff may warn first), else INTERNAL."""
    proc = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True)
    if proc.returncode in (0, 1) and proc.stdout.strip():
        return json.loads(proc.stdout)
    message = proc.stderr.decode("utf-8", "replace").strip()
    if last_line:
        lines = message.splitlines()
        message = lines[-1] if lines else ""
    message = message[len("sbx: "):] if message.startswith("sbx: ") else message
    code, _, rest = message.partition(": ")
    if code in ERROR_CODES:
        raise SupervisorError(code, rest, {"exit_status": proc.returncode})
    raise SupervisorError("INTERNAL", f"sbx {verb} exited {proc.returncode}: {message}", {"exit_status": proc.returncode})


def diff_checkpoints(a: Optional[str] = None, b: Optional[str] = None, *, task: Optional[str] = None, state_dir: Optional[str] = None, store: Optional[str] = None, key_path: Optional[str] = None, sbx: Optional[str] = None) -> Any:
    """``sbx diff A B --json`` / ``sbx diff --task T --json`` (offline); see Client.diff. The local
    store (``store`` a directory, or ``<state_dir>/checkpoints``) is read here (diff.py: no sbx
    needed); ``sbx`` given, or an ``s3://`` store, runs the sbx bin (``sbx``, else ``$SBX_BIN``,
    else on PATH; none: SupervisorError INVALID_ARGUMENT naming it)."""
    s3 = store is not None and store.startswith("s3://")
    if sbx is None and not s3:
        from .diff import diff_local

        return diff_local(a, b, task=task, state_dir=state_dir, store=store, key_path=key_path)
    binary = sbx or os.environ.get("SBX_BIN") or shutil.which("sbx")
    if not binary:
        raise SupervisorError("INVALID_ARGUMENT", f"diff of the S3 store {store} runs the sbx bin (this library reads the local store only: it has no S3 client): give sbx=, set $SBX_BIN, or put sbx on PATH")
    args = [binary, "diff", *(x for x in (a, b) if x is not None), "--json"]
    if task is not None:
        args += ["--task", task]
    if state_dir is not None and store is None:
        args += ["--state-dir", state_dir]
    if store is not None:
        args += ["--store", store]
    if key_path is None and state_dir is not None and store is not None:
        key_path = os.path.join(state_dir, "receipt-key.pub")
    if key_path is not None:
        args += ["--public-key", key_path]
    return _sbx_json(args, "diff", last_line=True)


def restore_checkpoint(checkpoint_id: str, directory: str, *, state_dir: Optional[str] = None, store: Optional[str] = None, key_path: Optional[str] = None, same_owner: Optional[bool] = None, sbx: Optional[str] = None) -> Dict[str, Any]:
    """``sbx restore ID DIR --json`` (offline: the supervisor need not run); see Client.restore.

    The local store (``store`` a directory, or ``<state_dir>/checkpoints``) is restored here, in
    Python (restore.py: no sbx needed); ``sbx`` given, or an ``s3://`` store, runs the sbx bin
    (``sbx``, else ``$SBX_BIN``, else on PATH; none: SupervisorError INVALID_ARGUMENT naming it).
    """
    s3 = store is not None and store.startswith("s3://")
    if sbx is None and not s3:
        from .restore import restore_local

        return restore_local(checkpoint_id, directory, state_dir=state_dir, store=store, key_path=key_path, same_owner=same_owner)
    binary = sbx or os.environ.get("SBX_BIN") or shutil.which("sbx")
    if not binary:
        raise SupervisorError("INVALID_ARGUMENT", f"restore from the S3 store {store} runs the sbx bin (this library restores from the local store only: it has no S3 client): give sbx=, set $SBX_BIN, or put sbx on PATH")
    args = [binary, "restore", checkpoint_id, os.path.abspath(directory), "--json"]
    if state_dir is not None:
        args += ["--state-dir", state_dir]
    if store is not None:
        args += ["--store", store]
    if key_path is not None:
        args += ["--key", key_path]
    if same_owner is not None:
        args.append("--same-owner" if same_owner else "--no-same-owner")
    return _sbx_json(args, "restore")  # type: ignore[no-any-return]

