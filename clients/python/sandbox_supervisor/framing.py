"""Length-prefixed msgpack frames (docs/reference/protocol.md, ipc/framing.ts): a 4-byte big-endian body
length, then one msgpack map (plain maps, ``bin`` for bytes). Owns encoding, incremental
decoding and the frame-size bound (checked on the prefix, before the body is buffered).
Shared by the blocking and the asyncio client; no sockets here.
"""
from __future__ import annotations

import struct
from typing import Any, Dict, List

import msgpack

from .errors import SupervisorError

#: Upper bound on one frame's body, in bytes (the supervisor's default ipc.maxFrameBytes).
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024

_PREFIX = struct.Struct(">I")


def encode_frame(value: Dict[str, Any]) -> bytes:
    """One frame: [u32 BE length][msgpack body]; ``bytes`` become msgpack bin, ``str`` str."""
    body = msgpack.packb(value, use_bin_type=True)
    return _PREFIX.pack(len(body)) + body


def decode_body(body: bytes) -> Dict[str, Any]:
    """One frame body, which must be exactly one msgpack map; else SupervisorError INVALID_ARGUMENT."""
    first = body[0] if body else -1
    if not (0x80 <= first <= 0x8F or first in (0xDE, 0xDF)):
        what = "empty" if first < 0 else f"0x{first:02x}"
        raise SupervisorError("INVALID_ARGUMENT", f"a frame body must be one msgpack map; it starts with {what}")
    try:
        value = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as err:  # msgpack raises several types (ExtraData, FormatError, ValueError)
        raise SupervisorError("INVALID_ARGUMENT", f"malformed msgpack frame: {err}") from None
    return value  # type: ignore[no-any-return]


class FrameDecoder:
    """Incremental decoder: ``feed(bytes)`` returns the frames now whole, in order.

    Raises SupervisorError FRAME_TOO_LARGE when a prefix announces more than max_frame_bytes,
    INVALID_ARGUMENT for a body that is not one msgpack map; the connection is then unusable.
    """

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()

    @property
    def buffered_bytes(self) -> int:
        """Bytes of the incomplete frame held now (prefix included)."""
        return len(self._buf)

    def feed(self, data: bytes) -> List[Dict[str, Any]]:
        self._buf += data
        frames: List[Dict[str, Any]] = []
        while len(self._buf) >= 4:
            (body_bytes,) = _PREFIX.unpack_from(self._buf, 0)
            if body_bytes > self.max_frame_bytes:
                raise SupervisorError(
                    "FRAME_TOO_LARGE",
                    f"frame of {body_bytes} bytes is over the limit of {self.max_frame_bytes}",
                    {"max_frame_bytes": self.max_frame_bytes},
                )
            if len(self._buf) < 4 + body_bytes:
                break
            body = bytes(self._buf[4 : 4 + body_bytes])
            del self._buf[: 4 + body_bytes]
            frames.append(decode_body(body))
        return frames
