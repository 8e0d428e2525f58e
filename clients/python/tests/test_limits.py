"""Session limits from Python (docs/guide/limits.md): memory_max_bytes, pids_max and cpus go to the
launch as given, and a limit whose controller this host's cgroup v2 lacks is LIMIT_UNAVAILABLE
(not retryable), naming the controller, with nothing admitted; where the controller is there,
the receipt records the limit. Which holds is read from the kernel, never assumed."""
from __future__ import annotations

import os
import secrets

import pytest

from daemon import Daemon, cgroup_mount
from sandbox_supervisor import ERROR_CODES, Client, SupervisorError
from sandbox_supervisor import _protocol as P


@pytest.fixture(scope="module")
def client(daemon: Daemon):
    with Client(daemon.socket_path) as c:
        yield c


def offered(daemon: Daemon, controller: str) -> bool:
    """Whether the parent hands the controller to the supervisor's subtree (its cgroup.controllers)."""
    with open(os.path.join(cgroup_mount() or "/sys/fs/cgroup", daemon.cgroup_parent.lstrip("/"), "cgroup.controllers")) as f:
        return controller in f.read().split()


def test_limit_params_go_as_given_and_only_when_given():
    p = P.launch_params(["true"], key="k", timeout_seconds=None, grace_seconds=None, cwd="/", env=None, inherit_env=False, user=None, task=None, stdin=False, pty=None, linger=None, on_disconnect=None, memory_max_bytes=64 << 20, pids_max=64, cpus=0.5)
    assert (p["memory_max_bytes"], p["pids_max"], p["cpus"]) == (64 << 20, 64, 0.5)
    bare = P.launch_params(["true"], key="k", timeout_seconds=None, grace_seconds=None, cwd="/", env=None, inherit_env=False, user=None, task=None, stdin=False, pty=None, linger=None, on_disconnect=None)
    assert not {"memory_max_bytes", "pids_max", "cpus"} & set(bare)
    assert ERROR_CODES["LIMIT_UNAVAILABLE"] is False


@pytest.mark.parametrize("param,value,controller", [("memory_max_bytes", 64 << 20, "memory"), ("pids_max", 64, "pids"), ("cpus", 0.5, "cpu")])
def test_a_limit_without_its_controller_is_refused_naming_it_and_admits_nothing(daemon: Daemon, client: Client, param: str, value: float, controller: str):
    key = f"py-limit-{secrets.token_hex(4)}"
    if offered(daemon, controller):
        r = client.run(["true"], key=key, cwd="/", **{param: value})
        assert r.receipt["limits"] == {param: value}
        return
    with pytest.raises(SupervisorError) as refused:
        client.run(["true"], key=key, cwd="/", **{param: value})
    err = refused.value
    assert (err.code, err.retryable) == ("LIMIT_UNAVAILABLE", False)
    assert err.details["controller"] == controller and err.details["limit"] == param
    assert f"needs the {controller} controller in cgroup v2" in err.message and err.message.endswith("Nothing was run.")
    assert [s for s in client.ps(all=True) if s["invocation_key"] == key] == []
    # The key was not taken: the same key without the limit runs.
    again = client.run(["true"], key=key, cwd="/")
    assert (again.outcome, again.receipt.get("limits")) == ("exited", None)
