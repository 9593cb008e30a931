"""PostgreSQL column types as Debezium's PostgreSQL connector maps them by default.

Owns, per column (its type OID and typmod, capture/shape.py): the Kafka Connect schema
Debezium writes for it (``decimal.handling.mode=precise``, ``time.precision.mode=adaptive``,
``binary.handling.mode=bytes``), the conversion of pgoutput's text value into the JSON
value Debezium writes, the value a non-optional column takes when a row image lacks it
(Debezium's fallback: ``0``, ``""``, an empty array...), the schema ``default`` Debezium
derives from a literal column default, and the unchanged-TOAST placeholder's form.

A type without a mapping here yields a ``Unsupported`` reason: its table's events become
dead letters naming the column and type, never a silently wrong value (docs/table-cdc.md,
types). Pure; must not do I/O.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from cdc_relay.capture import temporal
from cdc_relay.capture.arrays import parse_array
from cdc_relay.capture.jsonw import Float32
from cdc_relay.capture.shape import ColumnShape

__all__ = ["Mapping", "Unsupported", "literal_default", "mapping_for", "ordered"]

Convert = Callable[[str], Any]
_NUMERIC, _TIME, _TIMESTAMP, _TIMESTAMPTZ = 1700, 1083, 1114, 1184
_EPOCH_TZ = "1970-01-01T00:00:00"
_ZERO_UUID = "00000000-0000-0000-0000-000000000000"
_LITERAL = re.compile(r"^(?:'((?:[^']|'')*)'(?:::[\w .\"]+(?:\(\d+(?:,\d+)?\))?)?|\(?(-?[\d.]+)\)?"
                      r"(?:::[\w .\"]+)?|(true|false))$")


class Unsupported(Exception):
    """The column's type has no mapping yet: ``str(exc)`` says which."""


@dataclass(frozen=True, slots=True)
class Mapping:
    """How one column's values become Debezium's: ``schema`` (the field's schema without
    ``optional``/``default``/``field``), ``convert`` (text → value), ``fallback`` (the
    value of a non-optional column a row image lacks), ``placeholder`` (the unchanged-TOAST
    value's form, given the placeholder text), ``literal_default`` (False: Debezium never
    reads this type's column default)."""

    schema: dict[str, Any]
    convert: Convert
    fallback: Any
    placeholder: Callable[[str], Any] = field(default=lambda text: text)
    literal_default: bool = True


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unscaled(value: int) -> str:
    """A BigInteger's two's-complement bytes (``toByteArray``), base64."""
    length = (value + (value < 0)).bit_length() // 8 + 1
    return _b64(value.to_bytes(length, "big", signed=True))


def _bool(text: str) -> bool:
    if text not in ("t", "f", "true", "false"):
        raise ValueError(f"not a boolean: {text!r}")
    return text in ("t", "true")


def _bytea(text: str) -> str:
    if not text.startswith("\\x"):
        raise ValueError("bytea not in hex format (bytea_output = 'hex' is needed)")
    return _b64(bytes.fromhex(text[2:]))


def _decimal(scale: int) -> Convert:
    def convert(text: str) -> str | None:
        try:
            number = Decimal(text)
        except InvalidOperation as exc:
            raise ValueError(f"not a numeric: {text!r}") from exc
        if not number.is_finite():
            return None  # Debezium's precise mode writes NaN and the infinities as null
        return _unscaled(_unscaled_at(number, scale))
    return convert


def _unscaled_at(number: Decimal, scale: int) -> int:
    """The unscaled integer of ``number`` at ``scale``, exactly (no context rounding)."""
    sign, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    value = int("".join(map(str, digits)) or "0")
    shift = exponent + scale
    power: int = 10 ** abs(shift)
    value = value * power if shift >= 0 else value // power
    return -value if sign else value


def _variable_decimal(text: str) -> dict[str, Any] | None:
    try:
        number = Decimal(text)
    except InvalidOperation as exc:
        raise ValueError(f"not a numeric: {text!r}") from exc
    if not number.is_finite():
        return None
    _, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    trailing = len(digits) - len("".join(map(str, digits)).rstrip("0")) if number else len(digits)
    scale = max(0, -(exponent + trailing)) if number else 0
    return {"scale": scale, "value": _unscaled(_unscaled_at(number, scale))}


def _int(bits: int) -> Convert:
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    def convert(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise ValueError(f"{text} out of range")
        return value
    return convert


def _named(kind: str, name: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "name": name, "version": 1, **extra}


def _numeric(column: ColumnShape) -> Mapping:
    if column.typmod < 4:  # numeric without precision: variable scale
        schema = {"type": "struct", "fields": [
            {"type": "int32", "optional": False, "field": "scale"},
            {"type": "bytes", "optional": False, "field": "value"}],
            "name": "io.debezium.data.VariableScaleDecimal", "version": 1,
            "doc": "Variable scaled decimal"}
        return Mapping(schema, _variable_decimal, {"scale": 0, "value": "AA=="})
    precision, scale = (column.typmod - 4) >> 16, (column.typmod - 4) & 0xFFFF
    schema = _named("bytes", "org.apache.kafka.connect.data.Decimal",
                    parameters={"scale": str(scale), "connect.decimal.precision": str(precision)})
    return Mapping(schema, _decimal(scale), "AA==")


def _temporal(column: ColumnShape) -> Mapping:
    oid, typmod = column.type_oid, column.typmod
    if oid == 1082:
        return Mapping(_named("int32", "io.debezium.time.Date"), temporal.date_days, 0)
    if oid == _TIME:
        if 0 <= typmod <= 3:
            return Mapping(_named("int32", "io.debezium.time.Time"),
                           lambda text: temporal.time_micros(text) // 1000, 0)
        return Mapping(_named("int64", "io.debezium.time.MicroTime"), temporal.time_micros, 0)
    if oid == _TIMESTAMP:
        if 0 <= typmod <= 3:
            return Mapping(_named("int64", "io.debezium.time.Timestamp"), _millis, 0)
        return Mapping(_named("int64", "io.debezium.time.MicroTimestamp"),
                       temporal.timestamp_micros, 0)
    if oid == _TIMESTAMPTZ:
        digits = 6 if typmod < 0 else typmod
        fallback = _EPOCH_TZ + ("." + "0" * digits if digits else "") + "Z"
        return Mapping(_named("string", "io.debezium.time.ZonedTimestamp"),
                       lambda text: temporal.timestamptz_text(text, digits), fallback)
    return Mapping(_named("int64", "io.debezium.time.MicroDuration"), temporal.interval_micros, 0)


def _millis(text: str) -> int:
    micros = temporal.timestamp_micros(text)
    if micros in (temporal.TIMESTAMP_INFINITY, temporal.TIMESTAMP_MINUS_INFINITY):
        return micros
    return micros // 1000


def _placeholder_bytes(text: str) -> str:
    return _b64(text.encode())


_SIMPLE: dict[int, Callable[[], Mapping]] = {
    16: lambda: Mapping({"type": "boolean"}, _bool, False),
    21: lambda: Mapping({"type": "int16"}, _int(16), 0),
    23: lambda: Mapping({"type": "int32"}, _int(32), 0),
    20: lambda: Mapping({"type": "int64"}, _int(64), 0),
    700: lambda: Mapping({"type": "float"}, lambda text: Float32(float(text)), Float32(0.0)),
    701: lambda: Mapping({"type": "double"}, float, 0.0),
    25: lambda: Mapping({"type": "string"}, str, ""),
    1043: lambda: Mapping({"type": "string"}, str, ""),
    1042: lambda: Mapping({"type": "string"}, str, ""),
    2950: lambda: Mapping(_named("string", "io.debezium.data.Uuid"), str, _ZERO_UUID),
    114: lambda: Mapping(_named("string", "io.debezium.data.Json"), str, ""),
    3802: lambda: Mapping(_named("string", "io.debezium.data.Json"), str, ""),
    17: lambda: Mapping({"type": "bytes"}, _bytea, "", _placeholder_bytes, literal_default=False),
}
_TEMPORAL = frozenset({1082, _TIME, _TIMESTAMP, _TIMESTAMPTZ, 1186})
# array type OID -> element type OID, for the element types above
_ARRAYS = {1000: 16, 1005: 21, 1007: 23, 1016: 20, 1021: 700, 1022: 701, 1231: 1700, 1009: 25,
           1015: 1043, 1014: 1042, 2951: 2950, 199: 114, 3807: 3802, 1001: 17, 1182: 1082,
           1183: _TIME, 1115: _TIMESTAMP, 1185: _TIMESTAMPTZ, 1187: 1186}


def _scalar(column: ColumnShape) -> Mapping:
    if column.labels is not None:
        schema = _named("string", "io.debezium.data.Enum",
                        parameters={"allowed": ",".join(column.labels)})
        return Mapping(schema, str, "")
    make = _SIMPLE.get(column.type_oid)
    if make is not None:
        return make()
    if column.type_oid == _NUMERIC:
        return _numeric(column)
    if column.type_oid in _TEMPORAL:
        return _temporal(column)
    raise Unsupported(f"type {column.type_name or column.type_oid} has no mapping yet")


def mapping_for(column: ColumnShape) -> Mapping:
    """The mapping of ``column``'s type; Unsupported when it has none yet."""
    element = _ARRAYS.get(column.type_oid) or column.element_oid
    if not element:
        return _scalar(column)
    item = _scalar(ColumnShape(column.name, element, column.typmod,
                               column.type_name.removesuffix("[]"), labels=column.labels))
    return _array(item)


def _array(item: Mapping) -> Mapping:
    """One-dimensional arrays of a mapped type (capture/arrays.py reads the text form)."""
    convert = item.convert

    def values(text: str) -> list[Any]:
        return [None if element is None else convert(element) for element in parse_array(text)]

    kind = item.schema["type"]

    def placeholder(text: str) -> list[Any]:
        # Debezium's unchanged-TOAST array: the placeholder as the one element of a string
        # array, its bytes as the elements of an integer array.
        if kind == "string":
            return [text]
        if kind in ("int16", "int32", "int64"):
            return list(text.encode())
        raise ValueError(f"an unchanged TOAST array of {kind} has no Debezium form here yet")

    return Mapping({"type": "array", "items": ordered(item.schema, optional=True)}, values, [],
                   placeholder, literal_default=False)


def ordered(schema: dict[str, Any], *, optional: bool, default: tuple[bool, Any] = (False, None),
            name: str | None = None) -> dict[str, Any]:
    """``schema`` with its keys in JsonConverter's order: type, fields or items, optional,
    name, version, doc, parameters, default, field (``name``: the field's name, if any)."""
    out = {"type": schema["type"]}
    for key in ("fields", "items"):
        if key in schema:
            out[key] = schema[key]
    out["optional"] = optional
    for key in ("name", "version", "doc", "parameters"):
        if key in schema:
            out[key] = schema[key]
    if default[0]:
        out["default"] = default[1]
    if name is not None:
        out["field"] = name
    return out


def literal_default(column: ColumnShape, mapping: Mapping) -> tuple[bool, Any]:
    """(whether Debezium writes a schema ``default``, its value) for ``column``.

    A literal default (``'x'::text``, ``42``, ``true``) is converted as a value would be;
    a NOT NULL column whose default is an expression (``now()``, ``nextval(…)``) gets the
    type's fallback; no default, or a type whose default Debezium does not read, gets none.
    """
    if column.default is None or not mapping.literal_default:
        return False, None
    match = _LITERAL.match(column.default.strip())
    if match is None:
        return (True, mapping.fallback) if column.not_null else (False, None)
    quoted, number, boolean = match.groups()
    text = quoted.replace("''", "'") if quoted is not None else number or boolean or ""
    if boolean is not None:
        text = text[0]
    try:
        return True, mapping.convert(text.rstrip() if column.type_oid == 1042 else text)
    except (ValueError, Unsupported):
        return (True, mapping.fallback) if column.not_null else (False, None)
