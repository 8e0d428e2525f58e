"""naive-python: a command run the way agent runtimes commonly run one in asyncio, kept naive
on purpose so the probes (scripts/probes/run.ts) can show where this path fails. Not part of
the product.

    python3 naive-python.py '{"command": "...", "timeout_ms": 1000, "stdin": null | "<base64>"}'

- asyncio.create_subprocess_exec('/bin/sh', '-c', command), stdout and stderr piped, stdin
  piped (written, closed) only when the request has some, otherwise inherited;
- StreamReader.readline() with its default limit (64 KiB), each line decoded as UTF-8 text;
- the timeout is checked when a line arrives, and then proc.kill() on the leader;
- done when stdout ends; then the leader's exit status.
Prints one JSON object on stdout (with "error" when the loop raised); writes "first-line" on
stderr when the first line arrives.
"""
import asyncio
import base64
import hashlib
import json
import re
import sys
import time

request = json.loads(sys.argv[1])
t0 = time.monotonic()
stdout_hash = hashlib.sha256()
stderr_hash = hashlib.sha256()
state = {"leader_pid": None, "stdout_bytes": 0, "stdout_newlines": 0, "stderr_bytes": 0,
         "exit_code": None, "signal": None, "timed_out": False, "kills_sent": 0}


async def run():
    proc = await asyncio.create_subprocess_exec(
        "/bin/sh", "-c", request["command"],
        stdin=asyncio.subprocess.PIPE if request["stdin"] is not None else None,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    state["leader_pid"] = proc.pid
    if request["stdin"] is not None:
        proc.stdin.write(base64.b64decode(request["stdin"]))
        await proc.stdin.drain()
        proc.stdin.close()
    stderr_task = asyncio.create_task(proc.stderr.read())
    while True:
        line = await proc.stdout.readline()
        if not line:
            break
        if state["stdout_newlines"] == 0:
            sys.stderr.write("first-line\n")
            sys.stderr.flush()
        text = line.decode()
        data = text.encode()
        stdout_hash.update(data)
        state["stdout_bytes"] += len(data)
        state["stdout_newlines"] += 1
        if (time.monotonic() - t0) * 1000 > request["timeout_ms"]:
            state["timed_out"] = True
            state["kills_sent"] += 1
            proc.kill()
    state["stream_end_ms"] = round((time.monotonic() - t0) * 1000)
    err = await stderr_task
    stderr_hash.update(err)
    state["stderr_bytes"] = len(err)
    code = await proc.wait()
    if code < 0:
        state["signal"] = -code
    else:
        state["exit_code"] = code


try:
    asyncio.run(run())
except Exception as e:  # what such a loop does with it: the run is over, with an error
    state["error"] = f"{type(e).__name__}: {e}"
state.update({
    "stdout_sha256": stdout_hash.hexdigest(),
    "stderr_sha256": stderr_hash.hexdigest(),
    "wall_ms": round((time.monotonic() - t0) * 1000),
    # VmHWM, not getrusage: ru_maxrss carries the parent's peak across fork and exec.
    "peak_rss_kb": int(re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read()).group(1)),
})
sys.stdout.write(json.dumps(state) + "\n")
sys.stdout.flush()
