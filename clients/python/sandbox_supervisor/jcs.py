"""RFC 8785 JSON Canonicalization Scheme (JCS): the bytes receipts, close and task receipts and
checkpoint manifests are signed over (core/receipts/signature.ts ``jcs``). Keys sorted by UTF-16 code
units, strings escaped as ECMAScript JSON.stringify does, numbers in ECMAScript Number#toString
form (RFC 8785 section 3.2.2.3); no whitespace. NaN, infinities, lone surrogates and values JSON
has no form for (bytes, sets, objects) raise ValueError/TypeError.
"""
from __future__ import annotations

import math
from decimal import Decimal
from typing import Any, List, Mapping

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def canonicalize(value: Any) -> bytes:
    """The JCS encoding of value (dicts with str keys, lists/tuples, str, int, float, bool, None) as UTF-8 bytes."""
    out: List[str] = []
    _write(value, out, set())
    return "".join(out).encode("utf-8")


def format_number(x: float) -> str:
    """An IEEE 754 double as ECMAScript's Number#toString writes it (RFC 8785 3.2.2.3)."""
    if not math.isfinite(x):
        raise ValueError(f"{x} is not allowed in JCS")
    if x == 0:
        return "0"  # -0 too
    sign = "-" if x < 0 else ""
    # repr() gives the shortest digits that round-trip, as ECMAScript requires; only the layout
    # differs. value = digits x 10^exp; ECMAScript's k digits and n: value = 0.d1..dk x 10^n.
    t = Decimal(repr(abs(x))).as_tuple()
    digits = "".join(map(str, t.digits))
    exp = int(t.exponent)
    stripped = digits.rstrip("0") or "0"
    exp += len(digits) - len(stripped)
    digits = stripped.lstrip("0") or "0"
    k = len(digits)
    n = k + exp
    if k <= n <= 21:
        body = digits + "0" * (n - k)
    elif 0 < n <= 21:
        body = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        body = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        exp = ("+" if e >= 0 else "-") + str(abs(e))
        body = (digits if k == 1 else digits[0] + "." + digits[1:]) + "e" + exp
    return sign + body


def _string(s: str) -> str:
    parts = ['"']
    for ch in s:
        code = ord(ch)
        if 0xD800 <= code <= 0xDFFF:
            raise ValueError("Lone surrogate is not allowed in JCS")
        esc = _ESCAPES.get(ch)
        if esc is not None:
            parts.append(esc)
        elif code < 0x20:
            parts.append(f"\\u{code:04x}")
        else:
            parts.append(ch)
    parts.append('"')
    return "".join(parts)


def _utf16_key(key: str) -> bytes:
    # Big-endian UTF-16 bytes compare as the code units do. surrogatepass lets a lone surrogate
    # through to be refused by _string with its own message.
    return key.encode("utf-16-be", "surrogatepass")


def _write(v: Any, out: List[str], seen: set) -> None:
    if v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif isinstance(v, int):
        # ECMAScript has one number type: an integer beyond 2^53 is written as the double it becomes.
        out.append(str(v) if abs(v) <= 2**53 else format_number(float(v)))
    elif isinstance(v, float):
        out.append(format_number(v))
    elif isinstance(v, str):
        out.append(_string(v))
    elif isinstance(v, (list, tuple)):
        if id(v) in seen:
            raise ValueError("Circular reference detected")
        seen.add(id(v))
        out.append("[")
        for i, x in enumerate(v):
            if i:
                out.append(",")
            _write(x, out, seen)
        out.append("]")
        seen.discard(id(v))
    elif isinstance(v, Mapping):
        if id(v) in seen:
            raise ValueError("Circular reference detected")
        seen.add(id(v))
        for key in v:
            if not isinstance(key, str):
                raise TypeError(f"JCS object keys must be strings, not {type(key).__name__}")
        out.append("{")
        for i, key in enumerate(sorted(v, key=_utf16_key)):
            if i:
                out.append(",")
            out.append(_string(key))
            out.append(":")
            _write(v[key], out, seen)
        out.append("}")
        seen.discard(id(v))
    else:
        raise TypeError(f"{type(v).__name__} has no JSON form (JCS)")
