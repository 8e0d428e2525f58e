"""A stand-in for `sbx bridge` in the transport tests: joins stdin/stdout to a Unix socket byte for
byte (two threads; exits when either side ends). ``--cut-after METHOD --marker FILE``: the first
time (FILE absent: it is made) a request of METHOD has been passed on, waits for the supervisor's
first bytes back and exits without passing them on: the request reached it, its answer is lost.

    python3 pipe_bridge.py SOCKET [--cut-after launch --marker FILE]
"""
from __future__ import annotations

import os
import select
import socket
import struct
import sys
import threading

import msgpack


def main() -> None:
    path = sys.argv[1]
    args = sys.argv[2:]
    cut = args[args.index("--cut-after") + 1] if "--cut-after" in args else None
    marker = args[args.index("--marker") + 1] if "--marker" in args else None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as err:
        print(f"pipe_bridge: cannot connect to {path}: {err}", file=sys.stderr)
        sys.exit(69)
    cutting = threading.Event()

    def up() -> None:  # stdin -> socket, frame by frame when cutting
        buf = bytearray()
        while True:
            data = os.read(0, 1 << 20)
            if not data:
                sock.shutdown(socket.SHUT_WR)
                return
            if cut is None:
                sock.sendall(data)
                continue
            buf += data
            while len(buf) >= 4:
                (n,) = struct.unpack_from(">I", buf)
                if len(buf) < 4 + n:
                    break
                frame, buf = bytes(buf[: 4 + n]), buf[4 + n :]
                sock.sendall(frame)
                if msgpack.unpackb(frame[4:], raw=False).get("method") == cut and marker and not os.path.exists(marker):
                    open(marker, "w").close()
                    cutting.set()

    def down() -> None:  # socket -> stdout
        while True:
            if cutting.is_set():
                select.select([sock], [], [], 5)
                os._exit(0)  # the answer reached us: drop it and the connection
            ready, _, _ = select.select([sock], [], [], 0.05)
            if not ready:
                continue
            data = sock.recv(1 << 20)
            if not data:
                os._exit(0)
            if cutting.is_set():
                os._exit(0)
            view = memoryview(data)
            while view:
                n = os.write(1, view)
                view = view[n:]

    threading.Thread(target=up, daemon=True).start()
    down()


if __name__ == "__main__":
    main()
