"""Offline receipt verification (docs/reference/contract.md "Receipt", core/receipts/signature.ts): Ed25519 over the RFC 8785
(JCS) encoding of the receipt without ``signature``; ``key_id`` is ``sha256:`` + hex of the raw
32-byte public key; the key is SPKI PEM (``<state>/receipt-key.pub``, or ``status()["receipt_key"]``).
Works on close and task receipts too (the same rule). Needs the optional ``cryptography``
package; does not read the state dir (``sbx verify --state-dir`` re-hashes the chunk files).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass, field
from typing import Any, List, Mapping, Optional, Union

from .jcs import canonicalize


@dataclass(frozen=True)
class Verification:
    """What verify_receipt found: ``ok`` (also the truth value), ``problems`` in words ([] when ok), the receipt's ``key_id``."""

    ok: bool
    problems: List[str] = field(default_factory=list)
    key_id: Optional[str] = None

    def __bool__(self) -> bool:
        return self.ok


def signed_bytes(receipt: Mapping[str, Any]) -> bytes:
    """The bytes a receipt's signature covers: JCS of every field but ``signature``."""
    return canonicalize({k: v for k, v in receipt.items() if k != "signature"})


def receipt_digest(receipt: Mapping[str, Any]) -> str:
    """``sha256:`` of the JCS of a whole signed receipt (what a close or task receipt lists as receipt_sha256)."""
    return "sha256:" + hashlib.sha256(canonicalize(receipt)).hexdigest()


def key_id_of(public_key_pem: Union[str, bytes]) -> str:
    """``sha256:`` + hex SHA-256 of the raw 32-byte Ed25519 public key in an SPKI PEM."""
    return "sha256:" + hashlib.sha256(_raw_key(_load_key(public_key_pem))).hexdigest()


def verify_receipt(receipt: Mapping[str, Any], public_key_pem: Union[str, bytes]) -> Verification:
    """Checks receipt's signature (a dict as ``wait``/``receipt`` return it, or json.load of ``sbx receipt --json``) under public_key_pem.

    Every field is covered, known or added later. Raises ImportError when ``cryptography`` is
    missing; anything wrong with the receipt or the key is a problem in the result, never raised.
    """
    _require_cryptography()
    from cryptography.exceptions import InvalidSignature

    sig = receipt.get("signature") if isinstance(receipt, Mapping) else None
    if not isinstance(sig, Mapping):
        return Verification(False, ["the receipt has no signature"])
    key_id = sig.get("key_id") if isinstance(sig.get("key_id"), str) else None
    if sig.get("alg") != "ed25519":
        return Verification(False, [f"unsupported signature algorithm {sig.get('alg')!r}"], key_id)
    try:
        key = _load_key(public_key_pem)
    except (ValueError, TypeError) as err:
        return Verification(False, [f"the public key cannot be read: {err}"], key_id)
    expected_id = "sha256:" + hashlib.sha256(_raw_key(key)).hexdigest()
    if key_id != expected_id:
        return Verification(False, [f"signed by key {key_id}, but the key checked against is {expected_id}"], key_id)
    try:
        value = base64.b64decode(str(sig.get("value", "")), validate=True)
    except binascii.Error:
        return Verification(False, ["the signature value is not base64"], key_id)
    if len(value) != _SIGNATURE_BYTES:
        return Verification(False, [f"the signature is malformed: {len(value)} bytes, an Ed25519 signature is {_SIGNATURE_BYTES} (wrong length: truncated or padded)"], key_id)
    try:
        covered = signed_bytes(receipt)
    except (ValueError, TypeError) as err:
        return Verification(False, [f"the receipt has no canonical form: {err}"], key_id)
    try:
        key.verify(value, covered)
    except InvalidSignature:
        return Verification(False, ["the signature does not match the receipt: a field was changed after signing"], key_id)
    return Verification(True, [], key_id)


_SIGNATURE_BYTES = 64


def _require_cryptography() -> None:
    try:
        import cryptography  # noqa: F401
        import cryptography.exceptions  # noqa: F401
        import cryptography.hazmat.primitives.serialization  # noqa: F401
    except ImportError as err:
        raise ImportError(
            "verifying receipts needs the optional 'cryptography' package: pip install 'sandbox-supervisor[verify]' "
            "(from ./clients/python), or on Debian apt-get install python3-cryptography (for /usr/bin/python3)",
            name="cryptography",
        ) from err


def _load_key(pem: Union[str, bytes]) -> Any:
    _require_cryptography()
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    key = load_pem_public_key(pem.encode() if isinstance(pem, str) else pem)
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"not an Ed25519 key ({type(key).__name__})")
    return key


def _raw_key(key: Any) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)  # type: ignore[no-any-return]
