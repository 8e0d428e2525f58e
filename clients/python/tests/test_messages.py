"""What the client says when something is wrong (no daemon): a socket that is missing or
refuses, receipts without the optional cryptography, an error code it does not know, a
truncated signature."""
from __future__ import annotations

import asyncio
import errno
import json
import os
import socket
import sys

import pytest

from daemon import ROOT
from sandbox_supervisor import AsyncClient, Client, SupervisorError, verify_receipt

FIXTURE = os.path.join(ROOT, "test", "fixtures", "receipt-v1")


def fixture():
    with open(os.path.join(FIXTURE, "receipt.json")) as f:
        receipt = json.load(f)
    with open(os.path.join(FIXTURE, "receipt-key.pub")) as f:
        return receipt, f.read()


def connect(path: str, flavour: str) -> None:
    if flavour == "blocking":
        Client(path).hello
    else:
        asyncio.run(AsyncClient(path).connect())


@pytest.mark.parametrize("flavour", ["blocking", "async"])
def test_no_socket_names_the_path_and_sbx_status(tmp_path, flavour):
    path = str(tmp_path / "none.sock")
    with pytest.raises(FileNotFoundError) as e:
        connect(path, flavour)
    assert (e.value.errno, e.value.filename) == (errno.ENOENT, path)
    assert path in str(e.value) and "sbx status" in str(e.value) and "supervisor" in str(e.value)


@pytest.mark.parametrize("flavour", ["blocking", "async"])
def test_a_refusing_socket_names_the_path_and_sbx_status(tmp_path, flavour):
    path = str(tmp_path / "stale.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)  # bound, never listening: ECONNREFUSED, as a socket left by a dead supervisor
    try:
        with pytest.raises(ConnectionRefusedError) as e:
            connect(path, flavour)
    finally:
        stale.close()
    assert (e.value.errno, e.value.filename) == (errno.ECONNREFUSED, path)
    assert path in str(e.value) and "sbx status" in str(e.value)


def test_verify_without_cryptography_says_what_to_install(monkeypatch):
    receipt, pem = fixture()
    for name in [n for n in sys.modules if n == "cryptography" or n.startswith("cryptography.")] + ["cryptography"]:
        monkeypatch.setitem(sys.modules, name, None)  # as if it were not installed
    with pytest.raises(ImportError) as e:
        verify_receipt(receipt, pem)
    assert type(e.value) is ImportError
    assert "sandbox-supervisor[verify]" in str(e.value) and "python3-cryptography" in str(e.value)


def test_an_unknown_error_code_is_kept_and_its_retryable_honoured():
    err = SupervisorError.from_wire({"code": "QUOTA_SOON", "message": "try later", "retryable": True, "details": {"retry_after_ms": 5}})
    assert (err.code, err.retryable) == ("INTERNAL", True)
    assert err.details == {"retry_after_ms": 5, "unknown_code": "QUOTA_SOON"}
    assert "QUOTA_SOON" in err.message and "try later" in err.message
    assert SupervisorError.from_wire({"code": "NEWER", "message": "m", "retryable": False}).retryable is False
    assert SupervisorError.from_wire({"code": "LIMIT_EXCEEDED", "message": "m", "retryable": True}).retryable is True


def test_a_truncated_signature_is_malformed_not_a_changed_field():
    receipt, pem = fixture()
    receipt["signature"]["value"] = receipt["signature"]["value"][:-4]  # still base64: 63 bytes
    v = verify_receipt(receipt, pem)
    assert not v and len(v.problems) == 1
    assert "malformed" in v.problems[0] and "63 bytes" in v.problems[0] and "changed" not in v.problems[0]
