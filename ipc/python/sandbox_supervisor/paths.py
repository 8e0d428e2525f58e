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
