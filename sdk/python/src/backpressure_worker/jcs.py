"""RFC 8785 JSON Canonicalization Scheme (JCS) for the JSON values of the wire contract.

The config hash is the SHA-256 of the JCS form of the payload. JCS writes every number as
ECMAScript's ``Number.prototype.toString`` writes the IEEE-754 double it stands for (integers
too: ``1.0`` and ``1`` are both ``1``), sorts object members by the UTF-16 code units of their
names, and escapes strings as ``JSON.stringify`` does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = ["canonicalize", "canonical_bytes", "format_number"]

_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}


def format_number(value: float | int) -> str:
    """A number as ECMAScript's ``Number.prototype.toString`` writes its double value.

    Non-finite numbers have no JSON form: they are written as ``null`` (as serde_json does).
    """
    try:
        x = float(value)
    except OverflowError:  # an int beyond the doubles
        return "null"
    if not math.isfinite(x):
        return "null"
    if x == 0.0:
        return "0"  # -0 too
    sign = "-" if x < 0 else ""
    # repr() gives the shortest digit string that round-trips, as ECMAScript requires.
    text = repr(abs(x))
    mantissa, _, exp_text = text.partition("e")
    exponent = int(exp_text) if exp_text else 0
    int_part, _, frac_part = mantissa.partition(".")
    digits = (int_part + frac_part).lstrip("0")
    # Position of the decimal point relative to the start of `digits` (ECMAScript's n).
    leading_zeros = len(int_part + frac_part) - len((int_part + frac_part).lstrip("0"))
    n = len(int_part) - leading_zeros + exponent
    digits = digits.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        out = digits + "0" * (n - k)
    elif 0 < n <= 21:
        out = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        out = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        exp = ("+" if e >= 0 else "-") + str(abs(e))
        out = digits + "e" + exp if k == 1 else digits[0] + "." + digits[1:] + "e" + exp
    return sign + out


def _string(s: str) -> str:
    out = ['"']
    for ch in s:
        esc = _ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
        elif ord(ch) < 0x20 or 0xD800 <= ord(ch) <= 0xDFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _utf16_key(name: str) -> bytes:
    return name.encode("utf-16-be", "surrogatepass")


def canonicalize(value: object) -> str:
    """The JCS text of a JSON value (dicts, lists, str, int, float, bool, None)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (int, float)):
        return format_number(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, Mapping):
        members = sorted(((str(k), v) for k, v in value.items()), key=lambda kv: _utf16_key(kv[0]))
        return "{" + ",".join(_string(k) + ":" + canonicalize(v) for k, v in members) + "}"
    if isinstance(value, Sequence):
        return "[" + ",".join(canonicalize(v) for v in value) + "]"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def canonical_bytes(value: object) -> bytes:
    """The UTF-8 bytes of :func:`canonicalize`."""
    return canonicalize(value).encode("utf-8", "surrogatepass")
