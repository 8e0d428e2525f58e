"""Default socket location (docs/reference/contract.md "Names", ipc/paths.ts): the same rule as the daemon and sbx."""
from __future__ import annotations

import os
from typing import Mapping, Optional


def default_socket_path(env: Optional[Mapping[str, str]] = None) -> str:
    """``$SBX_SOCKET``, else /run/sandbox-supervisor/supervisor.sock as root, else under ``$XDG_RUNTIME_DIR``."""
    env = os.environ if env is None else env
    if env.get("SBX_SOCKET"):
        return env["SBX_SOCKET"]
    if os.getuid() == 0:
        return "/run/sandbox-supervisor/supervisor.sock"
    runtime = env.get("XDG_RUNTIME_DIR") or os.path.join("/tmp", f"sandbox-supervisor-{os.getuid()}")
    return os.path.join(runtime, "sandbox-supervisor", "supervisor.sock")


def default_state_dir(env: Optional[Mapping[str, str]] = None) -> str:
    """``$SBX_STATE_DIR``, else /var/lib/sandbox-supervisor as root, else under ``$XDG_STATE_HOME`` (ipc/paths.ts defaultStateDir)."""
    env = os.environ if env is None else env
    if env.get("SBX_STATE_DIR"):
        return env["SBX_STATE_DIR"]
    if os.getuid() == 0:
        return "/var/lib/sandbox-supervisor"
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "sandbox-supervisor")
