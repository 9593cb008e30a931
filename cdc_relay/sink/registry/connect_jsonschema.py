"""Kafka Connect schemas (JsonConverter's schema block) as JSON Schema, the way Confluent's
JsonSchemaData does for Debezium's ``JsonSchemaConverter``.

Owns the translation for captured tables (docs/table-cdc.md, registry formats):
``json_schema_text`` turns the Connect schema that ``debezium-json`` writes beside the
payload (cdc_relay/capture/envelope.py) into the JSON Schema text JsonSchemaData and its
JSON writer make of it:

* a struct is ``{"type":"object","title":<Connect name>,"properties":{…}}``; an optional
  schema is ``{"connect.index":i,"oneOf":[{"type":"null"},<the schema>]}``;
* int8…int64 are ``integer`` and float32/float64 ``number``, each with ``connect.type``;
  bytes a ``string`` (base64) and Connect's ``Decimal`` a ``number``, both with
  ``connect.type: bytes``; a name is the ``title``, a doc the ``description``, a version
  ``connect.version``, parameters ``connect.parameters``, a field's position
  ``connect.index``;
* keys come in the order of the Java ``HashMap``s JsonSchemaData and its JSON Schema
  library keep them in (``_java_order``), so the text is the one the converter registers
  (checked against texts Debezium registered: ``op`` comes before ``before``).

``json_datum`` turns the payload (JsonConverter's form) into what the converter writes:
the same, but a ``Decimal`` is a JSON number (``decimal.Decimal``, written by
``json_encode`` as BigDecimal's text) instead of base64 bytes; a float's NaN or infinity
(a string in JsonConverter's form) is a ValueError, a number cannot hold it.

Must not: talk to the registry or Kafka (pure data).
"""

from __future__ import annotations

import base64
import json
from decimal import Decimal
from typing import Any

import orjson

from cdc_relay.sink.registry.connect_avro import DECIMAL

_TYPES = {"int8": "integer", "int16": "integer", "int32": "integer", "int64": "integer",
          "float32": "number", "float64": "number", "boolean": "boolean", "string": "string",
          "bytes": "string", "array": "array", "map": "object", "struct": "object"}


def _java_hash(text: str) -> int:
    """Java's ``String.hashCode`` spread as ``HashMap.hash`` does."""
    h = 0
    for unit in text.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    return h ^ (h >> 16)


def _java_order(keys: list[str]) -> list[str]:
    """``keys`` (in insertion order) in the iteration order of a default ``java.util.HashMap``."""
    capacity = 16
    while len(keys) > capacity * 3 // 4:
        capacity *= 2
    return [key for _, _, key in sorted(
        (_java_hash(key) & (capacity - 1), i, key) for i, key in enumerate(keys))]


def _ordered(items: dict[str, Any]) -> dict[str, Any]:
    return {key: items[key] for key in _java_order(list(items))}


def json_schema(connect: dict[str, Any], index: int | None = None) -> dict[str, Any]:
    """The JSON Schema (JSON-ready, keys in the converter's order) of ``connect``."""
    if connect.get("optional", False):
        inner = _plain(connect)
        out: dict[str, Any] = {} if index is None else {"connect.index": index}
        out["oneOf"] = [{"type": "null"}, inner]
        return out
    out = _plain(connect)
    if index is not None:
        props = {key: out.pop(key) for key in list(out) if key.startswith("connect.")}
        props["connect.index"] = index
        tail: dict[str, Any] = {key: out.pop(key) for key in ("properties", "items",
                                                             "additionalProperties") if key in out}
        out.update(_ordered(props))
        out.update(tail)
    return out


def _plain(connect: dict[str, Any]) -> dict[str, Any]:
    """``connect`` as a non-optional schema, without its field position."""
    kind = connect["type"]
    name = connect.get("name")
    out: dict[str, Any] = {"type": "number" if name == DECIMAL else _TYPES[kind]}
    if name is not None:
        out["title"] = name
    if connect.get("doc") is not None:
        out["description"] = connect["doc"]
    if connect.get("default") is not None:
        out["default"] = json_datum(connect, connect["default"])
    props: dict[str, Any] = {}
    if kind.startswith(("int", "float")) or kind in ("bytes", "map"):
        props["connect.type"] = kind
    if connect.get("version") is not None:
        props["connect.version"] = connect["version"]
    if connect.get("parameters"):
        props["connect.parameters"] = _ordered(dict(connect["parameters"]))
    out.update(_ordered(props))
    if kind == "struct":
        out["properties"] = _ordered({field["field"]: json_schema(field, i)
                                      for i, field in enumerate(connect.get("fields", []))})
    elif kind == "array":
        out["items"] = json_schema(connect["items"])
    elif kind == "map":
        out["additionalProperties"] = json_schema(connect["values"])
    return out


def json_schema_text(connect: dict[str, Any]) -> str:
    """The registered text: compact JSON, as the converter sends it."""
    return json.dumps(json_schema(connect), separators=(",", ":"), ensure_ascii=False)


def json_datum(connect: dict[str, Any], value: Any) -> Any:
    """The payload ``value`` (JsonConverter's form) as the converter writes it: decimals as
    numbers (``decimal.Decimal``), the rest unchanged."""
    if value is None:
        return None
    kind = connect["type"]
    if kind == "struct":
        return {field["field"]: json_datum(field, value.get(field["field"]))
                for field in connect.get("fields", [])}
    if kind == "array":
        return [json_datum(connect["items"], item) for item in value]
    if kind == "map":
        return {key: json_datum(connect["values"], item) for key, item in value.items()}
    if kind in ("float32", "float64") and isinstance(value, str):
        raise ValueError(f"{value} (JsonConverter's text for a float) has no JSON Schema "
                         "number form")
    if kind == "bytes" and connect.get("name") == DECIMAL and isinstance(value, str):
        scale = int(connect.get("parameters", {}).get("scale", "0"))
        unscaled = int.from_bytes(base64.b64decode(value), "big", signed=True)
        return Decimal(unscaled).scaleb(-scale)
    return value


def _decimal_text(value: Any) -> Any:
    if isinstance(value, Decimal):
        return orjson.Fragment(str(value))  # BigDecimal.toString's form: 12.50, 1E+3
    raise TypeError(f"{type(value).__name__} is not JSON")


def json_encode(value: Any) -> bytes:
    """JSON bytes of ``value``, a ``decimal.Decimal`` as the number it is (exactly)."""
    return orjson.dumps(value, default=_decimal_text)
