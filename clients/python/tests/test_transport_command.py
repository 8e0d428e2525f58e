"""Client and AsyncClient over a command transport (bridges.py: `sbx bridge`, socat or
pipe_bridge.py, each spawn's pid logged) against a real supervisor: exact bytes and digests; a
bridge stopped with SIGSTOP is found silent within silence_seconds, killed and reaped, and the
call completes on a new spawn; read_output across killed bridges has no gap and no duplicate; a
keyed launch whose answer was lost is resent and returns the same session, an unkeyed one is not
resent; connect + hello has its deadline. Random kill points: the seed is printed.
"""
from __future__ import annotations

import asyncio
import hashlib
import os
import random
import secrets
import signal
import threading
import time
from typing import Any, Dict, List

import pytest

from bridges import PIPE_BRIDGE, base_bridge, gone, logged, pids
from daemon import Daemon, python, until
from sandbox_supervisor import AsyncClient, Client
from sandbox_supervisor.endpoint import LaunchNotResent, TransportDead

KEEPALIVE_SECONDS = 0.3
SILENCE_SECONDS = 1.5
FAST = {"keepalive_seconds": KEEPALIVE_SECONDS, "silence_seconds": SILENCE_SECONDS, "reconnect_seconds": 20.0}


def key() -> str:
    return f"py-{secrets.token_hex(6)}"


@pytest.fixture()
def pid_file(daemon: Daemon):
    path = os.path.join(daemon.dir, f"bridge-pids-{secrets.token_hex(4)}")
    yield path
    for pid in pids(path):  # whatever a failed test left: killed by pid (the client reaps its own)
        if not gone(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def assert_all_reaped(pid_file: str) -> None:
    spawned = pids(pid_file)
    assert spawned and all(gone(p) for p in spawned), {p: gone(p) for p in spawned}


def check_digest(receipt: Dict[str, Any], stream: str, data: bytes) -> None:
    out = receipt["output"][stream]
    assert (out["final_cursor"], out["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())


def test_run_over_a_command_exact_bytes_and_every_bridge_reaped(daemon: Daemon, pid_file: str):
    payload = bytes(range(256)) * 1000
    with Client.over_command(logged(pid_file, base_bridge(daemon.socket_path)), **FAST) as c:
        assert c.hello.version == 1 and c.socket_path is None
        r = c.run(["sh", "-c", "cat; printf err >&2"], key=key(), stdin=payload)
        assert (r.exit_code, r.stdout, r.stderr) == (0, payload, b"err")
        check_digest(r.receipt, "stdout", payload)
        assert c.request("ping", {})["now_ms"] > 1.7e12  # the keepalive's method (ms since the epoch)
    assert len(pids(pid_file)) == 2  # the requests' connection and one for the output (run() follows both streams on it)
    assert_all_reaped(pid_file)


def test_a_stopped_bridge_is_found_silent_and_the_call_completes_on_a_new_spawn(daemon: Daemon, pid_file: str):
    with Client(command=logged(pid_file, base_bridge(daemon.socket_path)), **FAST) as c:
        s = c.launch(["sleep", "3"], key=key())
        [bridge] = pids(pid_file)
        got: List[Any] = []
        waiter = threading.Thread(target=lambda: got.append(c.wait(s)))
        waiter.start()
        os.kill(bridge, signal.SIGSTOP)
        stopped_at = time.monotonic()
        until(lambda: gone(bridge), "the stopped bridge to be killed and reaped", SILENCE_SECONDS + 5)
        found_after = time.monotonic() - stopped_at
        waiter.join(30)
        assert not waiter.is_alive()
        assert got and got[0]["outcome"] == "exited" and got[0]["session_id"] == s.session_id
        assert found_after <= SILENCE_SECONDS + 1.0, found_after
        assert len(pids(pid_file)) == 2
    assert_all_reaped(pid_file)


def test_read_output_across_killed_bridges_no_gap_no_duplicate(daemon: Daemon, pid_file: str):
    seed = int(os.environ.get("SBX_TEST_SEED") or secrets.randbits(32))
    print(f"seed {seed}")
    rng = random.Random(seed)
    producer = ["sh", "-c", "i=0; while [ $i -lt 40 ]; do seq $((i*20000)) $((i*20000+9999)); i=$((i+1)); sleep 0.03; done"]
    kill_after = sorted(rng.sample(range(1, 12), 3))
    with Client(command=logged(pid_file, base_bridge(daemon.socket_path)), **FAST) as c:
        s = c.launch(producer, key=key())
        data = bytearray()
        killed: List[int] = []
        for i, chunk in enumerate(c.read_output(s, "stdout")):
            assert chunk.cursor == len(data)
            data += chunk.data
            # Chunks read before the client noticed the last kill come from the killed bridge:
            # the kill waits for the bridge spawned after it (two kill points can be adjacent).
            if kill_after and i >= kill_after[0] and pids(pid_file)[-1] not in killed:
                kill_after.pop(0)
                reader_bridge = pids(pid_file)[-1]
                os.kill(reader_bridge, signal.SIGKILL)
                killed.append(reader_bridge)
        receipt = c.wait(s)
    expected = b"".join(b"%d\n" % n for i in range(40) for n in range(i * 20000, i * 20000 + 10000))
    assert bytes(data) == expected, f"seed {seed}"
    check_digest(receipt, "stdout", expected)
    assert len(killed) == 3 and len(set(killed)) == 3 and len(pids(pid_file)) >= 4, (killed, pids(pid_file))  # each kill hit a new spawn (the last may come after the end arrived)
    assert_all_reaped(pid_file)


def cutting_bridge(daemon: Daemon, pid_file: str, marker: str) -> List[str]:
    return logged(pid_file, [python(), PIPE_BRIDGE, daemon.socket_path, "--cut-after", "launch", "--marker", marker])


def test_a_keyed_launch_whose_answer_was_lost_is_resent_and_returns_the_same_session(daemon: Daemon, pid_file: str):
    runs = os.path.join(daemon.dir, f"runs-{secrets.token_hex(4)}")
    k = key()
    with Client(command=cutting_bridge(daemon, pid_file, runs + ".cut"), **FAST) as c:
        s = c.launch(["sh", "-c", f"echo ran >> {runs}"], key=k)
        assert os.path.exists(runs + ".cut")  # the first launch reached the supervisor, its answer was dropped
        assert s.existing is True and s.invocation_key == k
        assert c.wait(s)["outcome"] == "exited"
        assert [r["session_id"] for r in c.ps(all=True) if r["invocation_key"] == k] == [s.session_id]
    with open(runs) as f:
        assert f.read() == "ran\n"
    assert len(pids(pid_file)) >= 2
    assert_all_reaped(pid_file)


def test_an_unkeyed_launch_is_not_resent_after_it_may_have_reached_the_supervisor(daemon: Daemon, pid_file: str):
    runs = os.path.join(daemon.dir, f"runs-{secrets.token_hex(4)}")
    with Client(command=cutting_bridge(daemon, pid_file, runs + ".cut"), **FAST) as c:
        with pytest.raises(LaunchNotResent, match="without an invocation key"):
            c.request("launch", {"argv": ["sh", "-c", f"echo ran >> {runs}"], "cwd": "/"})
        until(lambda: os.path.exists(runs), "the launch to have run")
        mine = [r for r in c.ps(all=True) if runs in " ".join(r.get("argv") or [])]
        assert len(mine) == 1, mine
        c.wait(mine[0]["session_id"])
    with open(runs) as f:
        assert f.read() == "ran\n"
    assert_all_reaped(pid_file)


def test_connect_and_hello_have_a_deadline_and_the_command_is_reaped(daemon: Daemon, pid_file: str):
    started = time.monotonic()
    with pytest.raises(TransportDead, match="did not connect and hello within 0.5 s"):
        Client(command=logged(pid_file, ["sleep", "30"]), connect_timeout_seconds=0.5).hello
    assert time.monotonic() - started < 3
    assert_all_reaped(pid_file)

    async def main() -> None:
        with pytest.raises(TransportDead, match="did not connect and hello within 0.5 s"):
            await AsyncClient(command=logged(pid_file, ["sleep", "30"]), connect_timeout_seconds=0.5).connect()

    asyncio.run(main())
    assert len(pids(pid_file)) == 2
    until(lambda: all(gone(p) for p in pids(pid_file)), "the async command to be reaped", 5)


def test_async_over_a_command_stop_and_kill_bridges(daemon: Daemon, pid_file: str):
    seed = int(os.environ.get("SBX_TEST_SEED") or secrets.randbits(32))
    print(f"seed {seed}")
    rng = random.Random(seed)
    producer = ["sh", "-c", "i=0; while [ $i -lt 30 ]; do seq $((i*20000)) $((i*20000+9999)); i=$((i+1)); sleep 0.03; done"]
    expected = b"".join(b"%d\n" % n for i in range(30) for n in range(i * 20000, i * 20000 + 10000))

    async def main() -> None:
        async with AsyncClient.over_command(logged(pid_file, base_bridge(daemon.socket_path)), **FAST) as c:
            r = await c.run(["sh", "-c", "printf out; printf err >&2"], key=key())
            assert (r.exit_code, r.stdout, r.stderr) == (0, b"out", b"err")
            # A stopped bridge while wait is pending: found silent, killed, the wait completes on a new spawn.
            s = await c.launch(["sleep", "3"], key=key())
            bridge = pids(pid_file)[0]
            waiting = asyncio.ensure_future(c.wait(s))
            await asyncio.sleep(0.1)
            os.kill(bridge, signal.SIGSTOP)
            stopped_at = time.monotonic()
            while not gone(bridge):
                assert time.monotonic() - stopped_at < SILENCE_SECONDS + 5, "the stopped bridge was not killed"
                await asyncio.sleep(0.02)
            assert time.monotonic() - stopped_at <= SILENCE_SECONDS + 1.0
            assert (await asyncio.wait_for(waiting, 30))["outcome"] == "exited"
            # read_output across killed reader bridges.
            s = await c.launch(producer, key=key())
            kill_after = sorted(rng.sample(range(1, 10), 2))
            data = bytearray()
            i = 0
            async for chunk in c.read_output(s, "stdout"):
                assert chunk.cursor == len(data)
                data += chunk.data
                if kill_after and i == kill_after[0]:
                    kill_after.pop(0)
                    os.kill(pids(pid_file)[-1], signal.SIGKILL)
                i += 1
            assert bytes(data) == expected, f"seed {seed}"
            check_digest(await c.wait(s), "stdout", expected)

    asyncio.run(main())
    assert_all_reaped(pid_file)


def _group_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[2])


def _pids_in_group(pgid: int) -> List[int]:
    """Live (not zombie) processes whose process group is pgid, from /proc."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(name))
    return out


def _grandchild_command(daemon: Daemon, pid_file: str) -> List[str]:
    """sh (its pid logged) starting a sleeper that outlives the bridge unless its group is signalled."""
    bridge = " ".join(f"'{a}'" for a in base_bridge(daemon.socket_path))
    script = f'echo $$ >> "$0"; sleep 30 & echo $! >> "$0"; {bridge}; wait'
    return ["sh", "-c", script, pid_file]


def test_close_signals_the_commands_process_group_nothing_it_started_is_left(daemon: Daemon, pid_file: str):
    with Client(command=_grandchild_command(daemon, pid_file), **FAST) as c:
        c.ps()
        until(lambda: len(pids(pid_file)) == 2, "the sleeper started")
        sh, sleeper = pids(pid_file)
        assert _group_of(sh) == sh and _group_of(sleeper) == sh  # a group of its own, the sleeper in it
    until(lambda: not _pids_in_group(sh) and gone(sleeper), "no process of the group left", deadline_seconds=5)
    assert_all_reaped(pid_file)


def test_async_close_signals_the_commands_process_group_nothing_it_started_is_left(daemon: Daemon, pid_file: str):
    async def main() -> None:
        async with AsyncClient(command=_grandchild_command(daemon, pid_file), **FAST) as c:
            await c.ps()
            deadline = time.monotonic() + 10
            while len(pids(pid_file)) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            sh, sleeper = pids(pid_file)
            assert _group_of(sh) == sh and _group_of(sleeper) == sh

    asyncio.run(main())
    sh, sleeper = pids(pid_file)
    until(lambda: not _pids_in_group(sh) and gone(sleeper), "no process of the group left", deadline_seconds=5)
    assert_all_reaped(pid_file)
