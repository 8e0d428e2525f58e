"""Pure tests (no daemon): RFC 8785 JCS against the TypeScript side's bytes, the checked-in v1
receipt fixture, framing, exit statuses."""
from __future__ import annotations

import json
import math
import os
import random
import subprocess
import struct

import msgpack
import pytest

from daemon import NODE, ROOT
from sandbox_supervisor import FrameDecoder, SupervisorError, canonicalize, encode_frame, key_id_of, receipt_digest, verify_receipt
from sandbox_supervisor._protocol import exit_status_of
from sandbox_supervisor.jcs import format_number

FIXTURE = os.path.join(ROOT, "test", "fixtures", "receipt-v1")


def fixture_receipt() -> dict:
    with open(os.path.join(FIXTURE, "receipt.json")) as f:
        return json.load(f)


def fixture_key() -> str:
    with open(os.path.join(FIXTURE, "receipt-key.pub")) as f:
        return f.read()


def test_the_v1_fixture_verifies_and_any_change_does_not():
    receipt = fixture_receipt()
    v = verify_receipt(receipt, fixture_key())
    assert v.ok and bool(v) and v.problems == []
    assert v.key_id == receipt["signature"]["key_id"] == key_id_of(fixture_key())
    for mutate in (
        lambda r: r["exit"].__setitem__("code", 0),
        lambda r: r["output"]["stdout"].__setitem__("final_cursor", 4999),
        lambda r: r.__setitem__("added_later", None),  # a field unknown today is covered too
        lambda r: r["argv"].append("x"),
    ):
        r = fixture_receipt()
        mutate(r)
        bad = verify_receipt(r, fixture_key())
        assert not bad and bad.problems == ["the signature does not match the receipt: a field was changed after signing"]


def test_verify_names_a_wrong_key_a_missing_signature_and_a_bad_alg():
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    other = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()
    v = verify_receipt(fixture_receipt(), other)
    assert not v and v.problems[0].startswith("signed by key sha256:6be83597")
    r = fixture_receipt()
    del r["signature"]
    assert verify_receipt(r, fixture_key()).problems == ["the receipt has no signature"]
    r = fixture_receipt()
    r["signature"]["alg"] = "rsa"
    assert verify_receipt(r, fixture_key()).problems == ["unsupported signature algorithm 'rsa'"]
    assert verify_receipt(fixture_receipt(), "not a pem").problems[0].startswith("the public key cannot be read")


def test_rfc8785_examples():
    # RFC 8785 appendix B (number serialisation) and section 3.2.3 (sorting).
    cases = {
        0.0: "0", -0.0: "0", 1e21: "1e+21", 1e-7: "1e-7", 1e20: "100000000000000000000",
        9007199254740992.0: "9007199254740992", 295147905179352830000.0: "295147905179352830000",
        4.5: "4.5", 2e-3: "0.002", 0.000001: "0.000001", 1e-6 * 1.5: "0.0000015",
        5e-324: "5e-324", 1.7976931348623157e308: "1.7976931348623157e+308", 333333333.3333333: "333333333.3333333",
    }
    for x, text in cases.items():
        assert format_number(x) == text, x
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError):
            format_number(bad)
    sorted_keys = canonicalize({"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet With Dagesh", "1": "One", "\U0001f600": "Emoji: Grinning Face", "\u0080": "Control", "\u00f6": "Latin Small Letter O With Diaeresis"})
    assert sorted_keys.decode() == '{"\\r":"Carriage Return","1":"One","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis","\u20ac":"Euro Sign","\U0001f600":"Emoji: Grinning Face","\ufb33":"Hebrew Letter Dalet With Dagesh"}'
    with pytest.raises(ValueError, match="Lone surrogate"):
        canonicalize({"a": "\ud800"})
    with pytest.raises(TypeError):
        canonicalize({"a": b"bytes"})


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.randint(-(2**53), 2**53)
    if kind == 2:
        return rng.choice([rng.uniform(-1e6, 1e6), rng.random() * 10 ** rng.randint(-30, 30), struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]])
    if kind in (3, 4):
        return "".join(chr(rng.choice([rng.randrange(0, 0x80), rng.randrange(0x80, 0xD800), rng.randrange(0xE000, 0x110000)])) for _ in range(rng.randrange(6)))
    if kind == 5:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {_random_value(rng, 5) if False else "".join(chr(rng.choice([rng.randrange(0x20, 0x80), rng.randrange(0x80, 0xD800), rng.randrange(0xE000, 0x110000)])) for _ in range(rng.randrange(1, 4))): _random_value(rng, depth + 1) for _ in range(rng.randrange(5))}


def test_jcs_bytes_equal_the_typescript_jcs_on_random_values():
    seed = int(os.environ.get("JCS_SEED") or random.SystemRandom().randrange(2**32))
    print(f"JCS_SEED={seed}")
    rng = random.Random(seed)
    values = []
    while len(values) < 400:
        v = _random_value(rng)
        if isinstance(v, float) and not math.isfinite(v):
            continue
        if isinstance(v, (dict, list)) and any(isinstance(x, float) and not math.isfinite(x) for x in _leaves(v)):
            continue
        values.append(v)
    values.append(fixture_receipt())
    # One node process canonicalises them all with core/receipts/signature.ts (compiled): its lines are the TypeScript side's bytes.
    script = (
        "import { jcs } from './dist/core/receipts/signature.js';"
        "import { readFileSync } from 'node:fs';"
        "for (const line of readFileSync(0, 'utf8').split('\\n').filter(Boolean)) process.stdout.write(Buffer.from(jcs(JSON.parse(line))).toString('base64') + '\\n');"
    )
    feed = "\n".join(json.dumps(v, ensure_ascii=True) for v in values) + "\n"
    out = subprocess.run([NODE, "--input-type=module", "-e", script], input=feed.encode(), capture_output=True, cwd=ROOT, check=True)
    import base64

    theirs = [base64.b64decode(line) for line in out.stdout.decode().split()]
    assert len(theirs) == len(values)
    for v, t in zip(values, theirs):
        assert canonicalize(v) == t, f"seed {seed}: {v!r}"


def _leaves(v):
    if isinstance(v, dict):
        for x in v.values():
            yield from _leaves(x)
    elif isinstance(v, list):
        for x in v:
            yield from _leaves(x)
    else:
        yield v


def test_receipt_digest_is_sha256_of_the_whole_receipts_jcs():
    import hashlib

    r = fixture_receipt()
    assert receipt_digest(r) == "sha256:" + hashlib.sha256(canonicalize(r)).hexdigest()


def test_frames_decode_when_split_anywhere_and_refuse_what_the_protocol_refuses():
    frames = [{"id": 1, "result": {"a": b"\x00\xff", "s": "\u00e9"}}, {"id": 2, "event": "end", "cursor": 2**40, "final": True}]
    data = b"".join(encode_frame(f) for f in frames)
    assert data[:4] == struct.pack(">I", len(data) - 4 - len(encode_frame(frames[1])))
    for cut in range(len(data) + 1):
        d = FrameDecoder()
        assert d.feed(data[:cut]) + d.feed(data[cut:]) == frames
    d = FrameDecoder(max_frame_bytes=10)
    with pytest.raises(SupervisorError) as e:
        d.feed(struct.pack(">I", 11))
    assert (e.value.code, e.value.retryable, e.value.details) == ("FRAME_TOO_LARGE", False, {"max_frame_bytes": 10})
    for body in (msgpack.packb([1, 2]), msgpack.packb(7), b"\xc1", b"", msgpack.packb({"a": 1}) + b"\x00"):
        with pytest.raises(SupervisorError) as e:
            FrameDecoder().feed(struct.pack(">I", len(body)) + body)
        assert e.value.code == "INVALID_ARGUMENT"


def test_errors_keep_the_code_table_and_name_an_unknown_code():
    e = SupervisorError.from_wire({"code": "ADMISSION_DENIED", "message": "reconciling", "retryable": True, "details": {"retry_after_ms": 200}})
    assert (e.code, e.retryable, e.details, e.message) == ("ADMISSION_DENIED", True, {"retry_after_ms": 200}, "reconciling")
    e = SupervisorError.from_wire({"code": "NEW_CODE", "message": "m", "retryable": True})
    assert (e.code, e.retryable, e.details["unknown_code"]) == ("INTERNAL", True, "NEW_CODE") and e.message.startswith("NEW_CODE")


def test_ts_error_table_is_the_python_one():
    with open(os.path.join(ROOT, "ipc", "errors.ts")) as f:
        text = f.read()
    import re

    table = dict((code, flag == "true") for code, flag in re.findall(r"^\s+([A-Z_]+): (true|false),$", text, re.M))
    from sandbox_supervisor import ERROR_CODES

    assert table == ERROR_CODES


def test_exit_status_follows_sbx_run():
    def st(outcome, code=None, sig=None):
        return exit_status_of({"outcome": outcome, "exit": {"code": code, "signal": sig}})

    assert [st("exited", 3), st("signaled", None, "SIGKILL"), st("cancelled", None, "SIGTERM"), st("timed_out", None, "SIGTERM"), st("spawn_failed", 127), st("owner_lost")] == [3, 137, 143, 124, 127, 125]
