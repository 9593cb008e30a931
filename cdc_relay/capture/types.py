"""PostgreSQL column types as Debezium's PostgreSQL connector maps them.

Owns, per column (its type OID and typmod, a domain's base type's, capture/shape.py) and
the type modes (capture/modes.py, Debezium's defaults unless changed): the Kafka Connect
schema Debezium writes for it, the conversion of pgoutput's text value into the JSON
value Debezium writes (numbers in capture/numeric.py, the network, geometric, bit-string
and extension types in capture/special.py, dates and times read by capture/temporal.py),
the value a non-optional column takes when a row image lacks it (Debezium's fallback:
``0``, ``""``, an empty array...), the schema ``default`` Debezium derives from a literal
column default, and the unchanged-TOAST placeholder's form.

A type without a mapping here yields a ``Unsupported`` reason: its table's events become
dead letters naming the column and type, never a silently wrong value (docs/table-cdc.md,
types). Pure; must not do I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from cdc_relay.capture import special, temporal
from cdc_relay.capture.arrays import parse_array
from cdc_relay.capture.jsonw import Float32
from cdc_relay.capture.modes import TypeModes, binary_schema, binary_value
from cdc_relay.capture.numeric import money_mapping_parts, numeric_mapping_parts
from cdc_relay.capture.shape import ColumnShape

__all__ = ["DEFAULT_MODES", "Mapping", "Unsupported", "literal_default", "mapping_for", "ordered"]

Convert = Callable[[str], Any]
_NUMERIC, _TIME, _TIMESTAMP, _TIMESTAMPTZ, _TIMETZ, _MONEY = 1700, 1083, 1114, 1184, 1266, 790
DEFAULT_MODES = TypeModes()
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


def _bool(text: str) -> bool:
    if text not in ("t", "f", "true", "false"):
        raise ValueError(f"not a boolean: {text!r}")
    return text in ("t", "true")


def _bytea(mode: str) -> Convert:
    def convert(text: str) -> str:
        if not text.startswith("\\x"):
            raise ValueError("bytea not in hex format (bytea_output = 'hex' is needed)")
        return binary_value(bytes.fromhex(text[2:]), mode)
    return convert


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


def _numeric(column: ColumnShape, modes: TypeModes) -> Mapping:
    return Mapping(*numeric_mapping_parts(column.typmod, modes.decimal))


def _time(typmod: int, modes: TypeModes) -> Mapping:
    if modes.time == "connect":
        return Mapping(_named("int32", "org.apache.kafka.connect.data.Time"),
                       lambda text: temporal.time_micros(text) // 1000, 0)
    if 0 <= typmod <= 3 and modes.time == "adaptive":
        return Mapping(_named("int32", "io.debezium.time.Time"),
                       lambda text: temporal.time_micros(text) // 1000, 0)
    return Mapping(_named("int64", "io.debezium.time.MicroTime"), temporal.time_micros, 0)


def _temporal(column: ColumnShape, modes: TypeModes) -> Mapping:
    oid, typmod = column.type_oid, column.typmod
    connect = modes.time == "connect"
    if oid == 1082:
        name = "org.apache.kafka.connect.data.Date" if connect else "io.debezium.time.Date"
        return Mapping(_named("int32", name), temporal.date_days, 0)
    if oid == _TIME:
        return _time(typmod, modes)
    if oid == _TIMESTAMP:
        if connect:
            return Mapping(_named("int64", "org.apache.kafka.connect.data.Timestamp"),
                           lambda text: temporal.timestamp_micros(text) // 1000, 0)
        if 0 <= typmod <= 3:
            return Mapping(_named("int64", "io.debezium.time.Timestamp"), _millis, 0)
        return Mapping(_named("int64", "io.debezium.time.MicroTimestamp"),
                       temporal.timestamp_micros, 0)
    if oid == _TIMESTAMPTZ:
        digits = 6 if typmod < 0 else typmod
        fallback = _EPOCH_TZ + ("." + "0" * digits if digits else "") + "Z"
        return Mapping(_named("string", "io.debezium.time.ZonedTimestamp"),
                       lambda text: temporal.timestamptz_text(text, digits), fallback)
    if oid == _TIMETZ:
        return Mapping(_named("string", "io.debezium.time.ZonedTime"), temporal.timetz_text,
                       "00:00:00Z", literal_default=False)
    if modes.interval == "string":
        return Mapping(_named("string", "io.debezium.time.Interval"), temporal.interval_iso,
                       "P0Y0M0DT0H0M0S")
    return Mapping(_named("int64", "io.debezium.time.MicroDuration"), temporal.interval_micros, 0)


def _millis(text: str) -> int:
    micros = temporal.timestamp_micros(text)
    if micros in (temporal.TIMESTAMP_INFINITY, temporal.TIMESTAMP_MINUS_INFINITY):
        return micros
    return micros // 1000


def _bytea_mapping(modes: TypeModes) -> Mapping:
    mode = modes.binary
    return Mapping(binary_schema(mode), _bytea(mode), "", lambda text: _bytea_unchanged(text, mode),
                   literal_default=False)


def _bits_unchanged(placeholder: str) -> str:
    raise ValueError("an unchanged TOASTed varbit (Debezium writes null, losing the value)")


def _bytea_unchanged(placeholder: str, mode: str) -> str:
    """Debezium's unchanged-TOAST bytea: the placeholder's bytes (``bytes``), its text
    (``hex``); under ``base64``/``base64-url-safe`` Debezium writes null, losing the value:
    the row is a dead letter instead (docs/table-cdc.md, known differences)."""
    if mode == "bytes":
        return binary_value(placeholder.encode(), mode)
    if mode == "hex":
        return placeholder
    raise ValueError(f"an unchanged TOASTed bytea under binary.handling.mode={mode} (Debezium "
                     "writes null, losing the value)")


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
}
_TEMPORAL = frozenset({1082, _TIME, _TIMESTAMP, _TIMESTAMPTZ, _TIMETZ, 1186})
# array type OID -> element type OID, for the built-in element types above
_ARRAYS = {1000: 16, 1005: 21, 1007: 23, 1016: 20, 1021: 700, 1022: 701, 1231: 1700, 1009: 25,
           1015: 1043, 1014: 1042, 2951: 2950, 199: 114, 3807: 3802, 1001: 17, 1182: 1082,
           1183: _TIME, 1115: _TIMESTAMP, 1185: _TIMESTAMPTZ, 1187: 1186, 1270: _TIMETZ,
           1041: 869, 651: 650, 1040: 829, 775: 774, 3905: 3904, 3927: 3926, 3907: 3906,
           3909: 3908, 3911: 3910, 3913: 3912, 3643: 3614, 1028: 26}
# element types whose arrays Debezium leaves out of its events (or writes as null)
_NO_ARRAY = frozenset({_MONEY, 600, 1560, 1562, 142})


def _scalar(column: ColumnShape, modes: TypeModes) -> Mapping:
    if column.labels is not None:
        schema = _named("string", "io.debezium.data.Enum",
                        parameters={"allowed": ",".join(column.labels)})
        return Mapping(schema, str, "")
    oid = column.type_oid
    make = _SIMPLE.get(oid)
    if make is not None:
        return make()
    if oid == _NUMERIC:
        return _numeric(column, modes)
    if oid in _TEMPORAL:
        return _temporal(column, modes)
    if oid == 17:
        return _bytea_mapping(modes)
    if oid == _MONEY:
        return Mapping(*money_mapping_parts(modes.money_digits, modes.decimal),
                       literal_default=False)
    if oid in (1560, 1562):
        return Mapping(*special.bits_parts(oid, column.typmod), placeholder=_bits_unchanged)
    name = column.type_name.rsplit(".", 1)[-1].strip('"')
    known = special.BY_OID.get(oid) or special.BY_NAME.get(name)
    if known is not None:
        schema, convert, fallback, reads_default = known
        return Mapping(schema, convert, fallback, literal_default=reads_default)
    if name == "hstore":
        schema, convert, fallback, placeholder = special.hstore_parts(modes.hstore)
        return Mapping(schema, convert, fallback, placeholder, literal_default=False)
    raise Unsupported(f"type {column.type_name or oid} has no mapping yet")


def mapping_for(column: ColumnShape, modes: TypeModes = DEFAULT_MODES) -> Mapping:
    """The mapping of ``column``'s type (a domain's: its base type's) under ``modes``;
    Unsupported when it has none yet."""
    if column.base_oid:  # Debezium reads no column default of a domain
        typmod = column.typmod if column.typmod >= 0 else column.base_typmod
        base = replace(column, type_oid=column.base_oid, typmod=typmod, base_oid=0)
        return replace(mapping_for(base, modes), literal_default=False)
    element = _ARRAYS.get(column.type_oid) or column.element_oid
    if not element:
        return _scalar(column, modes)
    if element in _NO_ARRAY:
        raise Unsupported(f"type {column.type_name or column.type_oid} (Debezium leaves "
                          "arrays of it out) has no mapping yet")
    item = _scalar(ColumnShape(column.name, element, column.typmod,
                               column.type_name.removesuffix("[]"), labels=column.labels), modes)
    if element == _TIMETZ:  # Debezium drops the fraction of an array's timetz
        item = replace(item, convert=lambda text: temporal.timetz_text(text, fraction=False))
    return _array(item, items_optional=element != 3614)  # Debezium's tsvector[]: items required


def _array(item: Mapping, *, items_optional: bool = True) -> Mapping:
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

    return Mapping({"type": "array", "items": ordered(item.schema, optional=items_optional)},
                   values, [], placeholder, literal_default=False)


def ordered(schema: dict[str, Any], *, optional: bool, default: tuple[bool, Any] = (False, None),
            name: str | None = None) -> dict[str, Any]:
    """``schema`` with its keys in JsonConverter's order: type, fields, items or keys and
    values, optional,
    name, version, doc, parameters, default, field (``name``: the field's name, if any)."""
    out = {"type": schema["type"]}
    for key in ("fields", "items", "keys", "values"):
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
