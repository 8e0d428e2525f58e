"""The sandbox-wide seal and close are named as such (seal_all, close_supervisor); seal(task)
needs its task, so a forgotten task never seals the whole sandbox. A daemon of its own: this
module seals it for good."""
from __future__ import annotations

import pytest

from daemon import Daemon
from sandbox_supervisor import Client, SupervisorError


def test_seal_needs_a_task_seal_all_seals_everything_and_close_supervisor_lists_each_task(daemon: Daemon):
    with Client(daemon.socket_path) as c:
        with pytest.raises(TypeError):
            c.seal()  # type: ignore[call-arg]
        assert c.status()["admission"] == "open"
        assert c.seal("only-a")["task"] == "only-a"
        r = c.run(["echo", "b"], key="py-b", task="b")
        assert r.exit_code == 0
        sealed = c.seal_all()
        assert sealed["already_sealed"] is False
        with pytest.raises(SupervisorError) as e:
            c.launch(["true"], key="py-after", task="c")
        assert e.value.code == "ADMISSION_SEALED"
        close = c.close_supervisor(timeout_seconds=5)
        assert close["kind"] == "close" and close["complete"] is True
        assert [(t["task"], t["complete"]) for t in close["tasks"]] == [("b", True)]
        assert [s["session_id"] for s in close["sessions"]] == [r.session_id]
