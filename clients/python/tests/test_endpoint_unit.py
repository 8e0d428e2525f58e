"""Choosing the endpoint (endpoint.py) without a supervisor: explicit arguments, else $SBX_URL with
$SBX_TOKEN / $SBX_TOKEN_FILE, else the socket; the token's order; refused combinations; the
handshake's HTTP statuses as errors."""
from __future__ import annotations

import pytest

from sandbox_supervisor import Client, SupervisorError, resolve_endpoint
from sandbox_supervisor.transport import handshake_error


def test_explicit_then_env_url_then_socket(tmp_path):
    env = {"SBX_URL": "ws://10.0.0.5:7300/", "SBX_SOCKET": "/tmp/x.sock"}
    assert resolve_endpoint("/run/s.sock", env=env).socket_path == "/run/s.sock"
    assert resolve_endpoint(command=["ssh", "h", "sbx", "bridge"], env=env).command == ["ssh", "h", "sbx", "bridge"]
    assert resolve_endpoint(env=env).url == "ws://10.0.0.5:7300/"
    assert resolve_endpoint(env={"SBX_SOCKET": "/tmp/x.sock"}).socket_path == "/tmp/x.sock"
    c = Client(command=["cat"])
    assert (c.endpoint.kind, c.socket_path) == ("command", None)


def test_token_order_token_then_file_then_env(tmp_path):
    f = tmp_path / "tok"
    f.write_text("from-file\n")
    g = tmp_path / "tok2"
    g.write_text("from-env-file")
    env = {"SBX_TOKEN": "from-env", "SBX_TOKEN_FILE": str(g)}
    assert resolve_endpoint(url="ws://h/", token="given", token_file=str(f)).bearer_token(env) == "given"
    assert resolve_endpoint(url="ws://h/", token_file=str(f)).bearer_token(env) == "from-file"
    assert resolve_endpoint(url="ws://h/").bearer_token(env) == "from-env"
    assert resolve_endpoint(url="ws://h/").bearer_token({"SBX_TOKEN_FILE": str(g)}) == "from-env-file"
    assert resolve_endpoint(url="ws://h/").bearer_token({}) is None
    with pytest.raises(SupervisorError, match="cannot read the token file") as info:
        resolve_endpoint(url="ws://h/", token_file=str(tmp_path / "missing")).bearer_token({})
    assert info.value.code == "UNAUTHORIZED"


def test_refused_combinations():
    with pytest.raises(ValueError, match="give one endpoint, not socket_path and url"):
        resolve_endpoint("/s.sock", url="ws://h/")
    with pytest.raises(ValueError, match="list of strings"):
        resolve_endpoint(command="docker exec -i box sbx bridge")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ws:// or wss://"):
        resolve_endpoint(url="http://h/")


def test_handshake_statuses():
    e = handshake_error(401, b'{"error":{"code":"UNAUTHORIZED","message":"no token"}}', "ws://h/")
    assert isinstance(e, SupervisorError) and e.code == "UNAUTHORIZED" and "HTTP 401" in e.message and "no token" in e.message
    assert isinstance(handshake_error(503, b"busy", "ws://h/"), ConnectionRefusedError)
    e = handshake_error(426, b"upgrade required", "ws://h/")
    assert isinstance(e, SupervisorError) and e.code == "INVALID_ARGUMENT" and "HTTP 426: upgrade required" in e.message
