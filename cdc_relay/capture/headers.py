"""A primary-key change's headers as Kafka Connect writes Debezium's: ``__debezium.newkey``
on the ``d`` (and its tombstone), ``__debezium.oldkey`` on the ``c``.

Owns ``key_header``: the key struct's text as Kafka Connect's default header converter
(``SimpleHeaderConverter``, ``Values.convertToString``) writes it, whatever the message
format: ``{"b":"x","a":2}`` - a struct's fields in order, a string in double quotes
with only ``\\`` and ``"`` escaped (a newline or a non-ASCII letter as itself), a
``Decimal`` as its number (``1.50``: BigDecimal's ``toString``, never base64), bytes in
base64, a double in Java's notation. Checked against Debezium embedded's own records
through Connect's converter (tests/integration/test_capture_debezium.py).

Pure: takes the key struct as the codec builds it (capture/envelope.py) and the names of
its ``Decimal`` fields; must not do I/O.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from typing import Any

from cdc_relay.capture.jsonw import Float32, java_double, java_float

__all__ = ["NEWKEY", "OLDKEY", "key_header"]

NEWKEY = "__debezium.newkey"
OLDKEY = "__debezium.oldkey"


def key_header(key: dict[str, Any], decimals: Mapping[str, int] | None = None) -> bytes:
    """The header value of ``key`` (see the module docstring); ``decimals``: the fields
    that hold a ``Decimal`` (base64 of the unscaled value in the struct), by their scale."""
    parts = []
    for name, value in key.items():
        scale = None if decimals is None else decimals.get(name)
        text = _big_decimal(value, scale) if scale is not None and isinstance(value, str) \
            else _text(value)
        parts.append(f"{_quoted(name)}:{text}")
    return ("{" + ",".join(parts) + "}").encode()


def _text(value: Any) -> str:
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, str):
        return _quoted(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return java_float(value) if isinstance(value, Float32) else java_double(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, bytes):
        return _quoted(base64.b64encode(value).decode())
    if isinstance(value, list):
        return "[" + ",".join(_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_quoted(k)}:{_text(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no header text for {type(value).__name__}")


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _big_decimal(encoded: str, scale: int) -> str:
    """BigDecimal.toString of the unscaled two's-complement bytes (base64) at ``scale``."""
    unscaled = int.from_bytes(base64.b64decode(encoded), "big", signed=True)
    digits = str(abs(unscaled))
    sign = "-" if unscaled < 0 else ""
    adjusted = len(digits) - 1 - scale
    if scale >= 0 and adjusted >= -6:
        if scale == 0:
            return sign + digits
        digits = digits.rjust(scale + 1, "0")
        return f"{sign}{digits[:-scale]}.{digits[-scale:]}"
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{sign}{mantissa}E{'+' if adjusted > 0 else ''}{adjusted}"
