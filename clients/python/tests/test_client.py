"""The blocking Client against a real supervisor (one per module): exact bytes, statuses, codes,
and receipts verified by both the Python and the TypeScript side."""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import tempfile

import pytest

from daemon import ROOT, NODE, Daemon, planted_receipt_link, until
from sandbox_supervisor import Client, InvocationKey, SupervisorError, canonicalize, verify_receipt


@pytest.fixture(scope="module")
def client(daemon: Daemon):
    with Client(daemon.socket_path) as c:
        yield c


def key() -> str:
    return f"py-{secrets.token_hex(6)}"


def test_run_gives_exact_bytes_status_and_a_receipt_both_sides_verify(daemon: Daemon, client: Client):
    payload = bytes(range(256)) * 40  # every byte value, NUL included
    r = client.run(["sh", "-c", "cat; printf 'to stderr' >&2; exit 3"], key=key(), stdin=payload, cwd="/")
    assert (r.exit_code, r.outcome, r.stdout, r.stderr) == (3, "exited", payload, b"to stderr")
    assert r.receipt["output"]["stdout"]["final_cursor"] == len(payload)
    assert r.receipt["exit"] == {"code": 3, "signal": None}
    pem = client.status()["receipt_key"]["public_key_pem"]
    with open(daemon.public_key_path) as f:
        assert f.read() == pem
    assert verify_receipt(r.receipt, pem).ok
    # The same receipt, as JSON, verified by sbx (signature and every chunk file re-read).
    path = os.path.join(daemon.dir, "receipt.json")
    with open(path, "w") as f:
        json.dump(r.receipt, f)
    v = daemon.sbx(["verify", path, "--key", daemon.public_key_path, "--state-dir", daemon.state_dir, "--json"])
    assert v.returncode == 0, v.stderr
    assert json.loads(v.stdout) == {"ok": True, "key_id": r.receipt["signature"]["key_id"], "problems": []}
    # The receipt sbx prints as JSON is the one msgpack carried: the same JCS bytes, to the byte (TypeScript's jcs too).
    printed = daemon.sbx(["receipt", r.session_id, "--json"])
    assert printed.returncode == 0, printed.stderr
    as_json = json.loads(printed.stdout)
    ts = subprocess.run([NODE, "--input-type=module", "-e", "import { jcs } from './dist/core/receipts/signature.js'; import { readFileSync } from 'node:fs'; process.stdout.write(jcs(JSON.parse(readFileSync(0, 'utf8'))))"], input=printed.stdout, capture_output=True, cwd=ROOT, check=True)
    assert canonicalize(as_json) == canonicalize(r.receipt) == ts.stdout


def test_exit_statuses_follow_sbx_run(client: Client):
    assert client.run(["sh", "-c", "kill -9 $$"], key=key()).exit_code == 137
    r = client.run(["sleep", "30"], key=key(), timeout_seconds=0.3, grace_seconds=0)
    assert (r.exit_code, r.outcome, r.timed_out, r.receipt["termination"]["cause"]) == (124, "timed_out", True, "deadline")
    r = client.run(["/nonexistent/cmd"], key=key())
    assert (r.exit_code, r.outcome) == (127, "spawn_failed")


def test_a_key_runs_once_its_retry_gets_the_same_result_and_another_command_is_a_conflict(client: Client, tmp_path):
    k = key()
    marker = tmp_path / "runs"
    argv = ["sh", "-c", f"echo run >> {marker}; echo out; exit 5"]
    first = client.run(argv, key=k, cwd=str(tmp_path))
    again = client.run(argv, key=k, cwd=str(tmp_path))
    assert (again.session.existing, again.exit_code, again.stdout, again.receipt) == (True, 5, b"out\n", first.receipt)
    assert marker.read_bytes() == b"run\n"
    with pytest.raises(SupervisorError) as e:
        client.run(["true"], key=k, cwd=str(tmp_path))
    assert (e.value.code, e.value.retryable) == ("KEY_CONFLICT", False)
    assert client.wait(InvocationKey(k)) == first.receipt


def test_bad_input_gets_its_code_and_the_supervisor_goes_on(client: Client):
    with pytest.raises(SupervisorError) as e:
        client.launch(["echo", "a\0b"], key=key())
    assert (e.value.code, e.value.retryable) == ("INVALID_ARGUMENT", False)
    with pytest.raises(SupervisorError) as e:
        client.wait("s-no-such-session")
    assert e.value.code == "SESSION_NOT_FOUND"
    with pytest.raises(SupervisorError) as e:
        client.request("no_such_method", {})
    assert e.value.code == "INVALID_ARGUMENT"
    with pytest.raises(SupervisorError) as e:
        client.launch(["true"], key=key(), timeout_seconds=-1)
    assert e.value.code == "INVALID_ARGUMENT"
    assert client.run(["echo", "still here"], key=key()).stdout == b"still here\n"


def test_read_output_from_a_cursor_follows_and_refuses_a_cursor_past_the_end(client: Client):
    s = client.launch(["sh", "-c", "i=0; while [ $i -lt 200 ]; do echo line $i; i=$((i+1)); done; sleep 0.2; echo last"], key=key())
    expected = b"".join(b"line %d\n" % i for i in range(200)) + b"last\n"
    chunks = list(client.read_output(s, "stdout", cursor=0, follow=True))
    assert b"".join(c.data for c in chunks) == expected
    assert [c.cursor for c in chunks] == [sum(len(x.data) for x in chunks[:i]) for i in range(len(chunks))]
    assert client.read(s, "stdout", cursor=100) == expected[100:]
    with pytest.raises(SupervisorError) as e:
        client.read(s, "stdout", cursor=len(expected) + 1)
    assert (e.value.code, e.value.details.get("cursor")) == ("CURSOR_OUT_OF_RANGE", len(expected))
    assert client.wait(s)["output"]["stdout"]["final_cursor"] == len(expected)


def test_write_close_stdin_cancel_kill_ps(client: Client):
    s = client.launch(["cat"], key=key(), stdin=True)
    assert s.stdin_cursor == 0 and not s.existing
    assert client.write(s, b"hello ")["cursor"] == 6
    assert client.write(s, b"hello world", offset=0)["cursor"] == 11  # a resend: the first 6 bytes are skipped
    client.close_stdin(s)
    receipt = client.wait(s)
    assert (receipt["outcome"], client.read(s)) == ("exited", b"hello world")

    s = client.launch(["sleep", "30"], key=key())
    assert any(row["session_id"] == s.session_id for row in client.ps())
    assert client.cancel(s, grace_seconds=5)["session_id"] == s.session_id
    receipt = client.wait(s)
    assert (receipt["outcome"], receipt["exit"]["signal"], receipt["termination"]["cause"]) == ("cancelled", "SIGTERM", "cancel")

    s = client.launch(["sleep", "30"], key=key())
    until(lambda: client.receipt(s)["state"] == "running", "the session to run")
    assert client.kill(s, "SIGKILL")["pids"] >= 1
    assert client.wait(s)["outcome"] == "signaled"
    assert s.session_id in [row["session_id"] for row in client.ps(all=True)]
    assert client.receipt(s)["state"] == "ended"


def test_status_changes_and_the_hello(client: Client):
    st = client.status()
    assert st["protocol"] == 1 and st["admission"] == "open" and st["receipt_key"]["key_id"].startswith("sha256:")
    assert client.hello.version == 1 and client.hello.instance == st["instance"]
    r = client.run(["true"], key=key())
    assert client.changes(r.session)["workspaces"] == []


def test_checkpoint_restore_and_close_task(daemon: Daemon, client: Client, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_bytes(b"alpha\n")
    (ws / "bin").write_bytes(bytes(range(256)))
    cp = client.checkpoint(str(ws))
    assert cp["consistent"] is True and cp["scan"]["files"] == 2 and len(cp["checkpoint_id"]) == 64
    target = tmp_path / "copy"
    restored = client.restore(cp["checkpoint_id"], str(target), sbx=os.path.join(ROOT, "dist", "cli", "sbx"))
    assert restored["identical"] is True
    assert (target / "a.txt").read_bytes() == b"alpha\n" and (target / "bin").read_bytes() == bytes(range(256))
    with pytest.raises(SupervisorError) as e:
        client.restore("0" * 64, str(tmp_path / "none"), sbx=os.path.join(ROOT, "dist", "cli", "sbx"))
    assert e.value.details["exit_status"] == 125

    task = f"t-{secrets.token_hex(4)}"
    r = client.run(["sh", "-c", "echo in task"], key=key(), task=task)
    tr = client.close_task(task, timeout_seconds=10)  # no watched workspace here: the task has no checkpoint to take
    assert tr["kind"] == "task" and tr["task"] == task
    assert [s["session_id"] for s in tr["sessions"]] == [r.session_id]
    assert verify_receipt(tr, client.status()["receipt_key"]["public_key_pem"]).ok
    with pytest.raises(SupervisorError) as e:
        client.launch(["true"], key=key(), task=task)
    assert e.value.code == "ADMISSION_SEALED"


def test_run_raises_session_unknown_rather_than_waiting_for_good(daemon: Daemon, client: Client, tmp_path):
    target = tmp_path / "receipt-target"
    target.write_text("original")
    k = key()
    with pytest.raises(SupervisorError) as e:
        client.run(["sh", "-c", planted_receipt_link(daemon, str(target))], key=k, cwd="/")
    assert e.value.code == "SESSION_UNKNOWN"
    assert e.value.details["reason"].startswith("the receipt could not be written: EEXIST")
    sid = e.value.details["session_id"]
    assert str(e.value).startswith(f"SESSION_UNKNOWN: session {sid} is unknown: the receipt could not be written: EEXIST")
    assert target.read_text() == "original"
    # A plain wait would wait on; with unknown="fail" it answers at once; the key is not run again.
    with pytest.raises(SupervisorError) as again:
        client.wait(InvocationKey(k), unknown="fail")
    assert (again.value.code, again.value.details) == ("SESSION_UNKNOWN", e.value.details)
    retry = client.launch(["sh", "-c", planted_receipt_link(daemon, str(target))], key=k, cwd="/")
    assert (retry.session_id, retry.existing, retry.state) == (sid, True, "unknown")
    with pytest.raises(ValueError):
        client.wait(InvocationKey(k), unknown="never")
    client.resolve(sid, reason="test: planted receipt link")  # the operator's word ends it (not through the link)
