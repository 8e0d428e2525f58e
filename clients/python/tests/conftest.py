"""pytest wiring: the package from this checkout, one supervisor per test module (stopped and
removed by its finalizer whatever happens), and at the end a sweep that fails the run if any
cgroup of this run is left.
"""
from __future__ import annotations

import os
import sys
from typing import Iterator

import pytest

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))
sys.path.insert(0, os.path.dirname(__file__))

from daemon import DAEMON, Daemon, leftover_cgroups, remove_cgroup_tree  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    if not os.path.exists(DAEMON):
        raise pytest.UsageError(f"{DAEMON} is missing: build first (npx tsc -p tsconfig.json && node scripts/build/sbx-bundle.mjs, or npm test)")


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    d = Daemon()
    try:
        d.start()
        yield d
    finally:
        d.stop()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    left = leftover_cgroups()
    for d in left:
        remove_cgroup_tree(d)
    if left:
        print(f"\ntests left cgroups behind (now removed): {', '.join(left)}", file=sys.stderr)
        session.exitstatus = 1
