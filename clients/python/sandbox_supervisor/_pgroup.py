"""A command transport's process group: the command is spawned as the leader of a group of its
own (so an exec channel's helpers, ``sh -c 'bridge; sleep 30'``'s sleep, go with it), and closing
signals that group by number: SIGTERM (+SIGCONT), then SIGKILL once the grace is over. Both
clients' transports (transport.py, aio_transport.py) use it.
"""
from __future__ import annotations

import os
import signal
import sys
from typing import Any, Dict

#: How often the group is looked at while its grace runs, in seconds.
POLL_SECONDS = 0.01


def spawn_options() -> Dict[str, Any]:
    """Keyword arguments for subprocess.Popen / asyncio.create_subprocess_exec that make the child
    the leader of a new process group (its pgid is its pid): ``process_group=0`` on Python 3.11+,
    else ``preexec_fn=os.setpgrp``."""
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}


def signal_group(pgid: int, sig: int) -> bool:
    """kill(-pgid, sig); False when no process of the group is left (ESRCH). sig 0 only asks."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def terminate_group(pgid: int) -> None:
    """SIGTERM to the group, and SIGCONT for members that are stopped."""
    if signal_group(pgid, signal.SIGTERM):
        signal_group(pgid, signal.SIGCONT)
