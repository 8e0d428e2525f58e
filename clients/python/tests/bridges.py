"""Commands the transport tests hand to ``Client(command=...)``: a bridge to a test supervisor's
socket (`sbx bridge` when the built sbx has it, else socat, else pipe_bridge.py), wrapped so
each spawn appends its pid to a file (the test stops or kills that pid, and counts spawns).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import List

from daemon import SBX_BIN, python

PIPE_BRIDGE = os.path.join(os.path.dirname(__file__), "pipe_bridge.py")


def _sbx_has_bridge() -> bool:
    try:
        out = subprocess.run([SBX_BIN, "--help"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return b"bridge" in out.stdout + out.stderr


def base_bridge(socket_path: str) -> List[str]:
    """``$SBX_TEST_BRIDGE`` (sbx|socat|python) or the first of those that is here."""
    choice = os.environ.get("SBX_TEST_BRIDGE")
    if choice == "sbx" or (choice is None and _sbx_has_bridge()):
        return [SBX_BIN, "bridge", "--socket", socket_path]
    if choice == "socat" or (choice is None and shutil.which("socat")):
        return ["socat", "-", f"UNIX-CONNECT:{socket_path}"]
    return [python(), PIPE_BRIDGE, socket_path]


def logged(pid_file: str, argv: List[str]) -> List[str]:
    """argv run by sh after appending sh's pid to pid_file; exec keeps the pid, so it is argv's."""
    return ["sh", "-c", 'echo $$ >> "$0"; exec "$@"', pid_file, *argv]


def pids(pid_file: str) -> List[int]:
    try:
        with open(pid_file) as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def gone(pid: int) -> bool:
    """True once pid is no process at all (reaped), not even a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "X"
    except (FileNotFoundError, ProcessLookupError):
        return True
