"""Session ids by unique prefix from the Python client (issue 31): the supervisor resolves them
for every verb, so a prefix of 3+ characters names its session; an ambiguous one is
INVALID_ARGUMENT listing the matches."""
from __future__ import annotations

import secrets

from daemon import Daemon
from sandbox_supervisor import Client, SupervisorError


def test_a_unique_prefix_names_the_session_and_an_ambiguous_one_lists_the_matches(daemon: Daemon):
    with Client(daemon.socket_path) as c:
        a = c.launch(["sh", "-c", "echo a"], key=f"py-{secrets.token_hex(6)}", cwd="/").session_id
        b = c.launch(["sh", "-c", "echo b"], key=f"py-{secrets.token_hex(6)}", cwd="/").session_id
        assert c.wait(a)["session_id"] == a
        assert c.wait(b)["session_id"] == b
        common = 0
        while a[common] == b[common]:
            common += 1
        # One character past the shared part names one session.
        assert c.wait(a[: common + 1])["session_id"] == a
        assert c.receipt(b[: common + 1])["receipt"]["session_id"] == b
        prefix = a[:common]
        assert len(prefix) >= 3
        try:
            c.receipt(prefix)
            raise AssertionError("an ambiguous prefix was answered")
        except SupervisorError as e:
            assert e.code == "INVALID_ARGUMENT"
            assert e.details["prefix"] == prefix
            assert sorted([a, b]) == [m for m in e.details["matches"] if m in (a, b)]
            assert e.details["count"] == len(e.details["matches"])
        try:
            c.wait("s-")
            raise AssertionError("a 2-character prefix was answered")
        except SupervisorError as e:
            assert e.code == "SESSION_NOT_FOUND"
