"""Python client of sandbox-supervisor (docs/reference/protocol.md): a blocking ``Client`` and an asyncio
``AsyncClient`` over the supervisor's Unix socket, a WebSocket URL with a token, or a command's
stdin/stdout (``sbx bridge`` through ``docker exec -i``, ``ssh``), sharing framing, types and errors, and
``verify_receipt`` (Ed25519 over RFC 8785 JCS, offline; needs ``cryptography``).

    from sandbox_supervisor import Client
    with Client() as c:
        r = c.run(["make", "test"], key="job-42", timeout_seconds=600)
        print(r.exit_code, r.stdout)
"""
from .aio import AsyncClient
from .checkpoints import diff_checkpoints, restore_checkpoint
from .client import Client
from .endpoint import Endpoint, LaunchNotResent, TransportDead, resolve_endpoint
from .errors import ERROR_CODES, SupervisorError
from .framing import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_frame
from .jcs import canonicalize
from .paths import default_socket_path
from .types import Hello, InvocationKey, OutputChunk, Receipt, Result, Session, SessionRef
from .state_verify import StateVerification, verify_state, verify_task_receipt
from .verify import Verification, key_id_of, receipt_digest, signed_bytes, verify_receipt

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "Client",
    "DEFAULT_MAX_FRAME_BYTES",
    "ERROR_CODES",
    "Endpoint",
    "FrameDecoder",
    "Hello",
    "InvocationKey",
    "LaunchNotResent",
    "OutputChunk",
    "Receipt",
    "Result",
    "Session",
    "SessionRef",
    "StateVerification",
    "SupervisorError",
    "TransportDead",
    "Verification",
    "canonicalize",
    "default_socket_path",
    "diff_checkpoints",
    "encode_frame",
    "key_id_of",
    "receipt_digest",
    "resolve_endpoint",
    "restore_checkpoint",
    "signed_bytes",
    "verify_receipt",
    "verify_state",
    "verify_task_receipt",
]
