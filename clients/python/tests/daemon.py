"""Boots a real supervisor (the compiled dist/, as users run it) in a temp dir with its own
socket, state dir and cgroup subtree, as test/helpers/daemon.ts does; stop() settles it with
SIGTERM (by pid) and removes everything it made: cgroup subtree (cgroup.kill, populated 0,
rmdir bottom-up) and temp dir, also after a failure.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, TypeVar

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
DAEMON = os.path.join(ROOT, "dist", "supervisor", "main.js")
# The node flags every start of the supervisor passes (supervisor/node-flags.ts).
NODE_FLAGS = ["--max-semi-space-size=2"]
SBX_BIN = os.path.join(ROOT, "dist", "cli", "sbx")
NODE = os.environ.get("NODE") or shutil.which("node") or "node"
#: One id per pytest run; its cgroup subtrees are named for it (swept by conftest at the end).
RUN_ID = os.environ.get("SBX_PYTEST_RUN_ID") or secrets.token_hex(3)
CGROUP_PREFIX = f"sbx-pytest-{RUN_ID}-"

T = TypeVar("T")


def until(cond: Callable[[], T], what: str, deadline_seconds: float = 10.0) -> T:
    """Polls cond every 20 ms until it is truthy or the deadline passes (then raises naming what); monotonic clock."""
    end = time.monotonic() + deadline_seconds
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)


def cgroup_mount() -> Optional[str]:
    """The cgroup2 mount point from /proc/self/mountinfo (fs type after the " - " separator)."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split(" ", 1)[0] == "cgroup2":
                return left.split(" ")[4]
    return None


def _populated(d: str) -> bool:
    try:
        with open(os.path.join(d, "cgroup.events")) as f:
            return "populated 1" in f.read().splitlines()
    except OSError:
        return False


def remove_cgroup_tree(d: str, deadline_seconds: float = 10.0) -> None:
    """Kills everything in a cgroup subtree and removes it, deepest first; polls with a deadline."""
    if not os.path.isdir(d):
        return
    end = time.monotonic() + deadline_seconds
    if _populated(d):
        with open(os.path.join(d, "cgroup.kill"), "w") as f:
            f.write("1")
    until(lambda: not _populated(d), f"cgroup {d} to empty after cgroup.kill", deadline_seconds)
    for name in os.listdir(d):
        child = os.path.join(d, name)
        if os.path.isdir(child):
            remove_cgroup_tree(child, max(1.0, end - time.monotonic()))
    while True:
        try:
            os.rmdir(d)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.02)


def leftover_cgroups() -> List[str]:
    mount = cgroup_mount()
    if not mount:
        return []
    return [os.path.join(mount, n) for n in os.listdir(mount) if n.startswith(CGROUP_PREFIX)]


class Daemon:
    """One test supervisor: ``start()``, ``kill9()`` (a crash: state kept), ``stop()`` (everything removed)."""

    def __init__(self, config: Optional[Dict[str, Any]] = None) -> None:
        self.dir = tempfile.mkdtemp(prefix="sbx-pytest-")
        self.socket_path = os.path.join(self.dir, "supervisor.sock")
        self.state_dir = os.path.join(self.dir, "state")
        self.cgroup_parent = f"/{CGROUP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        self.log_path = os.path.join(self.dir, "supervisor.log")
        self.config = config or {}
        self.proc: Optional[subprocess.Popen] = None

    @property
    def public_key_path(self) -> str:
        return os.path.join(self.state_dir, "receipt-key.pub")

    def env(self) -> Dict[str, str]:
        """An environment whose SBX_SOCKET/SBX_STATE_DIR name this daemon (for sbx and for examples)."""
        return {**os.environ, "SBX_SOCKET": self.socket_path, "SBX_STATE_DIR": self.state_dir}

    def start(self) -> "Daemon":
        config = {"logLevel": "debug", "cgroup": {"parent": self.cgroup_parent}, "drain": {"postDeathDrainMs": 2000}, **self.config}
        config_path = os.path.join(self.dir, "config.json")
        with open(config_path, "w") as f:
            json.dump(config, f)
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen([NODE, *NODE_FLAGS, DAEMON, "serve", "--config", config_path], env=self.env(), stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        finally:
            log.close()
        until(self._answers, "the supervisor socket")
        return self

    def _answers(self) -> bool:
        from sandbox_supervisor import Client

        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"supervisor exited at start-up ({self.proc.returncode}):\n{self.log()}")
        if not os.path.exists(self.socket_path):
            return False
        try:
            with Client(self.socket_path) as c:
                c.hello
            return True
        except OSError:
            return False

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def kill9(self) -> None:
        """SIGKILL to the daemon (by pid), as a crash: its sessions and state stay for a restart."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def terminate(self) -> Optional[int]:
        """SIGTERM (by pid), SIGKILL after 30 s; the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode

    def stop(self) -> Optional[int]:
        """terminate(), then remove the cgroup subtree (killing leftovers) and the temp dir."""
        try:
            return self.terminate()
        finally:
            mount = cgroup_mount()
            try:
                if mount:
                    remove_cgroup_tree(os.path.join(mount, self.cgroup_parent.lstrip("/")))
            finally:
                shutil.rmtree(self.dir, ignore_errors=True)

    def sbx(self, args: List[str], input: bytes = b"") -> subprocess.CompletedProcess:
        """Runs the sbx bin against this daemon; its status and exact bytes."""
        return subprocess.run([SBX_BIN, *args], env=self.env(), input=input, capture_output=True, cwd=self.dir)


def python() -> str:
    """The interpreter running the tests (Debian's /usr/bin/python3 in CI)."""
    return sys.executable


def planted_receipt_link(daemon: Daemon, target: str) -> str:
    """A command that, as its last act, links its own session's receipt path to target (its session id
    from its cgroup leaf, .../sessions/<id>): the supervisor never writes through a link, so the session
    stays unknown with no receipt on its way."""
    return f"id=$(grep '^0::' /proc/self/cgroup | sed 's|.*/||'); ln -s {target} {daemon.state_dir}/sessions/$id/receipt.json; echo planted"

