"""JSON text as Kafka Connect's JsonConverter (Jackson) writes it, for captured events.

Owns the serialization of the values the capture room builds: ``None``, ``bool``,
``int``, ``str`` (escaped by formats.json_string, Jackson's escaping), ``float`` (a
double) and ``Float32`` (a float column) in Java's ``Double.toString`` /
``Float.toString`` form (``1.0E20``, ``0.001``, ``-0.0``; NaN and the infinities as the
strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``, as Jackson quotes them), lists, and
dicts in insertion order, all without whitespace (docs/table-cdc.md, the contract).

The digits are the shortest that read back as the same value (Python's repr, and the
float32 equivalent); Java 17's algorithm is not always shortest (``Float.MIN_NORMAL``
prints ``1.17549435E-38``), so a rare float prints with other digits of the same value.

Pure; must not do I/O.
"""

from __future__ import annotations

import math
import struct
from typing import Any

from cdc_relay.formats import json_string

__all__ = ["Float32", "dumps", "java_double", "java_float"]

_F32 = struct.Struct("<f")


class Float32(float):
    """A ``real`` column's value: printed with float32's shortest digits."""

    __slots__ = ()


def _java_form(digits: str, exponent: int, negative: bool) -> str:
    """Java's layout of the decimal ``0.<digits> x 10^exponent``."""
    sign = "-" if negative else ""
    if -3 < exponent <= 7:  # 1e-3 <= |x| < 1e7: plain notation
        if exponent <= 0:
            return f"{sign}0.{'0' * -exponent}{digits}"
        whole, fraction = digits[:exponent].ljust(exponent, "0"), digits[exponent:]
        return f"{sign}{whole}.{fraction or '0'}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{exponent - 1}"


def _digits(text: str) -> tuple[str, int]:
    """``repr``-style text of a finite positive number → (significant digits, exponent)."""
    mantissa, _, exp = text.partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    exponent = int(exp or 0) + len(whole.lstrip("0")) if whole.strip("0") else int(exp or 0) - (
        len(fraction) - len(fraction.lstrip("0")))
    return digits.rstrip("0") or "0", exponent


def java_double(value: float) -> str:
    """``Double.toString`` for a finite double (shortest digits)."""
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    digits, exponent = _digits(repr(abs(value)))
    return _java_form(digits, exponent, value < 0)


def java_float(value: float) -> str:
    """``Float.toString`` for a finite float32 (shortest digits that read back the same)."""
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    target = _F32.pack(value)
    text = repr(abs(value))
    for precision in range(1, 10):
        candidate = f"{abs(value):.{precision}g}"
        if _F32.pack(float(candidate) * (1 if value > 0 else -1)) == target:
            text = candidate
            break
    digits, exponent = _digits(text.replace("e+", "e"))
    return _java_form(digits, exponent, value < 0)


def _number(value: float) -> bytes:
    if math.isnan(value):
        return b'"NaN"'
    if math.isinf(value):
        return b'"Infinity"' if value > 0 else b'"-Infinity"'
    return (java_float(value) if type(value) is Float32 else java_double(value)).encode()


def _write(value: Any, out: list[bytes]) -> None:
    kind = type(value)
    if kind is str:
        out.append(json_string(value))
    elif value is None:
        out.append(b"null")
    elif kind is bool:
        out.append(b"true" if value else b"false")
    elif kind is int:
        out.append(str(value).encode())
    elif kind is dict:
        out.append(b"{")
        first = True
        for key, item in value.items():
            if not first:
                out.append(b",")
            first = False
            out.append(json_string(key))
            out.append(b":")
            _write(item, out)
        out.append(b"}")
    elif kind is list:
        out.append(b"[")
        for index, item in enumerate(value):
            if index:
                out.append(b",")
            _write(item, out)
        out.append(b"]")
    elif kind is float or kind is Float32:
        out.append(_number(value))
    elif kind is bytes:  # pre-serialized JSON (a cached schema block)
        out.append(value)
    else:
        raise TypeError(f"cannot write {kind.__name__} as JSON")


def dumps(value: Any) -> bytes:
    """``value`` as compact JSON bytes, JsonConverter's way (see the module docstring).

    ``bytes`` inside ``value`` are taken as JSON text already (a cached schema block).
    """
    out: list[bytes] = []
    _write(value, out)
    return b"".join(out)
