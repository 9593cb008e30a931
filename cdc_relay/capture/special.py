"""The PostgreSQL types beyond numbers, text and time that Debezium maps by default.

Owns the schema, conversion and fallback of: ``bit(1)`` (a boolean), ``bit(n)`` and
``varbit`` (``io.debezium.data.Bits``: the bits as one little-endian number in the
fewest bytes: none for zero), ``point`` (``io.debezium.data.geometry.Point``: ``x``, ``y``,
the WKB of the point, a null ``srid``), ``hstore`` (``hstore.handling.mode=json``: an
``io.debezium.data.Json`` object; ``map``: a map), and the types Debezium writes as the
text PostgreSQL prints: ``inet`` ``cidr`` ``macaddr`` ``macaddr8`` ``citext``, the
built-in ranges, ``tsvector`` (``io.debezium.data.Tsvector``), ``xml``
(``io.debezium.data.Xml``), ``ltree`` (``io.debezium.data.Ltree``); ``oid`` as an int64.

Debezium builds an hstore's object from a Java ``HashMap``, so its keys come in that
map's iteration order (bucket by bucket, from ``String.hashCode``), which ``java_order``
reproduces - not in the order PostgreSQL prints them.

Pure; must not do I/O.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Callable
from typing import Any

from cdc_relay.capture.arrays import quoted
from cdc_relay.capture.jsonw import dumps

__all__ = ["BY_NAME", "BY_OID", "bits_parts", "hstore_parts", "java_order"]

Parts = tuple[dict[str, Any], Callable[[str], Any], Any]  # schema, convert, fallback
_WKB_POINT = struct.Struct("<BIdd")
_VARBIT_LENGTH = 2147483647  # what Debezium gives a varbit without a length


def _named(kind: str, name: str) -> dict[str, Any]:
    return {"type": kind, "name": name, "version": 1}


def _point(x: float, y: float) -> dict[str, Any]:
    wkb = base64.b64encode(_WKB_POINT.pack(1, 1, x, y)).decode()
    return {"x": x, "y": y, "wkb": wkb, "srid": None}


def _point_value(text: str) -> dict[str, Any]:
    if not (text.startswith("(") and text.endswith(")")) or text.count(",") != 1:
        raise ValueError(f"not a point: {text!r}")
    x, y = text[1:-1].split(",")
    return _point(float(x), float(y))


POINT_SCHEMA = {
    "type": "struct", "fields": [
        {"type": "double", "optional": False, "field": "x"},
        {"type": "double", "optional": False, "field": "y"},
        {"type": "bytes", "optional": True, "field": "wkb"},
        {"type": "int32", "optional": True, "field": "srid"}],
    "name": "io.debezium.data.geometry.Point", "version": 1, "doc": "Geometry (POINT)"}


def _oid(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 0xFFFFFFFF:
        raise ValueError(f"oid {text} out of range")
    return value


# type OID -> (schema, convert, fallback, whether Debezium reads a literal column default)
BY_OID: dict[int, tuple[dict[str, Any], Callable[[str], Any], Any, bool]] = {
    869: ({"type": "string"}, str, "", False),  # inet
    650: ({"type": "string"}, str, "", False),  # cidr
    829: ({"type": "string"}, str, "", False),  # macaddr
    774: ({"type": "string"}, str, "", False),  # macaddr8
    3904: ({"type": "string"}, str, "", False),  # int4range
    3926: ({"type": "string"}, str, "", False),  # int8range
    3906: ({"type": "string"}, str, "", False),  # numrange
    3908: ({"type": "string"}, str, "", False),  # tsrange
    3910: ({"type": "string"}, str, "", False),  # tstzrange
    3912: ({"type": "string"}, str, "", False),  # daterange
    3614: (_named("string", "io.debezium.data.Tsvector"), str, "", False),
    142: (_named("string", "io.debezium.data.Xml"), str, "", True),
    26: ({"type": "int64"}, _oid, 0, False),
    600: (POINT_SCHEMA, _point_value, _point(0.0, 0.0), False),
}
# extension types (their OIDs differ per database): by name
BY_NAME: dict[str, tuple[dict[str, Any], Callable[[str], Any], Any, bool]] = {
    "citext": ({"type": "string"}, str, "", False),
    "ltree": (_named("string", "io.debezium.data.Ltree"), str, "", False),
}


def _bits_value(text: str) -> str:
    if text and text.strip("01"):
        raise ValueError(f"not a bit string: {text!r}")
    value = int(text, 2) if text else 0
    return base64.b64encode(value.to_bytes((value.bit_length() + 7) // 8, "little")).decode()


def bits_parts(oid: int, typmod: int) -> Parts:
    """``bit(n)`` (``oid`` 1560) or ``varbit(n)`` (1562; ``typmod`` -1: no length)."""
    length = typmod if typmod > 0 else 1 if oid == 1560 else _VARBIT_LENGTH
    if length == 1:
        def boolean(text: str) -> bool:
            if text not in ("0", "1"):
                raise ValueError(f"not a bit: {text!r}")
            return text == "1"
        return {"type": "boolean"}, boolean, False
    schema = {**_named("bytes", "io.debezium.data.Bits"), "parameters": {"length": str(length)}}
    return schema, _bits_value, ""


def _java_hash(text: str) -> int:
    """``String.hashCode`` spread as ``HashMap.hash`` spreads it (unsigned 32 bits)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h ^ (h >> 16)


def java_order(pairs: list[tuple[str, str | None]]) -> dict[str, str | None]:
    """``pairs`` (distinct keys, in insertion order) in the iteration order of a
    ``java.util.HashMap`` they were put into (default capacity 16, load factor 0.75)."""
    capacity = 16
    while len(pairs) > capacity * 3 // 4:
        capacity *= 2
    order = sorted(range(len(pairs)), key=lambda i: (_java_hash(pairs[i][0]) & (capacity - 1), i))
    return {pairs[i][0]: pairs[i][1] for i in order}


def _quoted(text: str, pos: int) -> tuple[str, int]:
    if text[pos] != '"':
        raise ValueError(f"not an hstore: {text[:40]!r}")
    return quoted(text, pos)


def parse_hstore(text: str) -> list[tuple[str, str | None]]:
    """The pairs of ``hstore_out``'s text (``"k"=>"v", "n"=>NULL``), in its order."""
    pairs: list[tuple[str, str | None]] = []
    pos = 0
    try:
        while pos < len(text):
            key, pos = _quoted(text, pos)
            if text[pos:pos + 2] != "=>":
                raise ValueError(f"not an hstore: {text[:40]!r}")
            pos += 2
            if text.startswith("NULL", pos):
                value, pos = None, pos + 4
            else:
                value, pos = _quoted(text, pos)
            pairs.append((key, value))
            if text.startswith(", ", pos):
                pos += 2
            elif pos != len(text):
                raise ValueError(f"not an hstore: {text[:40]!r}")
    except IndexError as exc:
        raise ValueError(f"not an hstore: {text[:40]!r}") from exc
    return pairs


def hstore_parts(mode: str) -> tuple[dict[str, Any], Callable[[str], Any], Any,
                                      Callable[[str], Any]]:
    """``hstore`` under ``hstore.handling.mode`` ``mode``: schema, convert, fallback and
    the unchanged-TOAST form (an object mapping the placeholder to itself, as Debezium's)."""
    if mode == "map":
        schema = {"type": "map", "keys": {"type": "string", "optional": False},
                  "values": {"type": "string", "optional": True}}
        return schema, lambda text: java_order(parse_hstore(text)), {}, \
            lambda placeholder: {placeholder: placeholder}
    return _named("string", "io.debezium.data.Json"), \
        lambda text: dumps(java_order(parse_hstore(text))).decode(), "{}", \
        lambda placeholder: dumps({placeholder: placeholder}).decode()
