"""Kafka Connect schemas (JsonConverter's schema block) as Avro, the way Connect's AvroData does.

Owns the translation Debezium's AvroConverter applies to a captured table's key and
envelope (docs/table-cdc.md, Avro): ``avro_schema`` turns the Connect schema that
``debezium-json`` writes beside the payload (cdc_relay/capture/envelope.py) into the Avro
schema AvroData (``connect.meta.data=true``, ``enhanced.avro.schema.support=false``) makes
of it:

* a struct is a record named by the part after the Connect name's last dot, its
  namespace the part before (``shop.public.customers.Value`` → ``Value`` in
  ``shop.public.customers``); a record met again is written by its name;
* int8/int16 are Avro ``int`` with ``connect.type``, int32 ``int``, int64 ``long``,
  float32 ``float``, float64 ``double`` (JsonConverter's names ``float`` and ``double``);
  a struct such as ``io.debezium.data.geometry.Point`` a record like any other, a map
  (``hstore.handling.mode=map``) an Avro ``map``;
* a named, versioned or parameterised schema carries ``connect.doc`` (a doc only there,
  neither the record's nor the field's Avro ``doc``),
  ``connect.version``, ``connect.parameters``, ``connect.default`` and ``connect.name``
  in that order; Debezium's ``io.debezium.time.*`` stay plain ``int``/``long``, Json,
  Uuid, Enum and ZonedTimestamp plain ``string`` with their ``connect.name``;
* Connect's ``Decimal`` is ``bytes`` with ``scale``/``precision`` and ``logicalType:
  decimal`` (written after the connect properties, as AvroData does), its ``Date``,
  ``Time`` and ``Timestamp`` (``time.precision.mode=connect``) ``int``/``long`` with
  ``logicalType`` ``date``, ``time-millis``, ``timestamp-millis``;
* an optional schema is the union ``["null", T]`` with field default null, or
  ``[T, "null"]`` when it has a default (the field's default then).

``avro_datum`` turns the JSON payload (JsonConverter's form: bytes and decimals as base64)
into what fastavro writes for that schema: ``bytes``, ``decimal.Decimal``. ``columns``
names a record's fields and their Avro types, for saying which column a refused schema
change is about.

Must not: talk to the registry or Kafka (pure data).
"""

from __future__ import annotations

import base64
from decimal import Decimal
from typing import Any

DECIMAL = "org.apache.kafka.connect.data.Decimal"
_PRIMITIVES = {"int8": "int", "int16": "int", "int32": "int", "int64": "long", "float32": "float",
               "float64": "double", "float": "float", "double": "double", "boolean": "boolean",
               "string": "string", "bytes": "bytes"}
# Kafka Connect's own logical types (time.precision.mode=connect) and their Avro logicalType
_LOGICAL = {"org.apache.kafka.connect.data.Date": "date",
            "org.apache.kafka.connect.data.Time": "time-millis",
            "org.apache.kafka.connect.data.Timestamp": "timestamp-millis"}
_DECIMAL_PRECISION_DEFAULT = 64  # AvroData's, for a Decimal without connect.decimal.precision


def avro_schema(connect: dict[str, Any]) -> Any:
    """The Avro schema (JSON-ready) of the Connect schema ``connect`` (see the module docstring)."""
    return _Writer().schema(connect, "")


class _Writer:
    """One translation: the records already defined, so a second use is by name."""

    def __init__(self) -> None:
        self._defined: set[str] = set()

    def schema(self, connect: dict[str, Any], space: str) -> Any:
        base = self._base(connect, space)
        if not connect.get("optional", False):
            return base
        if connect.get("default") is not None:
            return [base, "null"]
        return ["null", base]

    def _base(self, connect: dict[str, Any], space: str) -> Any:
        kind = connect["type"]
        name = connect.get("name")
        if kind == "struct":
            return self._record(connect, space)
        out: dict[str, Any]
        if kind == "array":
            out = {"type": "array", "items": self.schema(connect["items"], space)}
        elif kind == "map":
            out = {"type": "map", "values": self.schema(connect["values"], space)}
        else:
            out = {"type": _PRIMITIVES[kind]}
            if kind == "bytes" and name == DECIMAL:
                parameters = connect.get("parameters", {})
                out["scale"] = int(parameters.get("scale", "0"))
                out["precision"] = int(parameters.get("connect.decimal.precision",
                                                      _DECIMAL_PRECISION_DEFAULT))
        _connect_properties(out, connect)
        if kind in ("int8", "int16"):
            out["connect.type"] = kind
        if name == DECIMAL:
            out["logicalType"] = "decimal"
        elif name in _LOGICAL:
            out["logicalType"] = _LOGICAL[name]
        if len(out) == 1:
            return out["type"]  # a bare primitive, as Avro writes it
        return out

    def _record(self, connect: dict[str, Any], space: str) -> Any:
        full = connect.get("name") or "ConnectDefault"
        namespace, _, short = full.rpartition(".")
        if full in self._defined:
            return short if namespace == space else full
        self._defined.add(full)
        out: dict[str, Any] = {"type": "record", "name": short}
        if namespace != space and namespace:
            out["namespace"] = namespace
        inner = namespace or space
        fields = []
        for field in connect.get("fields", []):
            entry: dict[str, Any] = {"name": field["field"]}
            entry["type"] = self.schema(field, inner)
            if field.get("default") is not None:
                entry["default"] = _avro_default(field, field["default"])
            elif field.get("optional", False):
                entry["default"] = None
            fields.append(entry)
        out["fields"] = fields
        _connect_properties(out, connect)
        return out


def _connect_properties(out: dict[str, Any], connect: dict[str, Any]) -> None:
    """AvroData's ``connect.*`` properties, in its order."""
    if connect.get("doc") is not None:
        out["connect.doc"] = connect["doc"]
    if connect.get("version") is not None:
        out["connect.version"] = connect["version"]
    if connect.get("parameters"):
        out["connect.parameters"] = dict(connect["parameters"])
    if connect.get("default") is not None and connect["type"] != "struct":
        out["connect.default"] = _avro_default(connect, connect["default"])
    if connect.get("name") is not None:
        out["connect.name"] = connect["name"]


def _avro_default(connect: dict[str, Any], value: Any) -> Any:
    """A default in Avro's JSON form: bytes (base64 in JsonConverter's) as ISO-8859-1 text."""
    if connect["type"] == "bytes" and isinstance(value, str):
        return base64.b64decode(value).decode("latin-1")
    return value


def avro_datum(connect: dict[str, Any], value: Any) -> Any:
    """The payload ``value`` (JsonConverter's JSON form) as fastavro writes ``connect``'s Avro."""
    if value is None:
        return None
    kind = connect["type"]
    if kind == "struct":
        return {field["field"]: avro_datum(field, value.get(field["field"]))
                for field in connect.get("fields", [])}
    if kind == "array":
        return [avro_datum(connect["items"], item) for item in value]
    if kind == "map":
        return {key: avro_datum(connect["values"], item) for key, item in value.items()}
    if kind == "bytes":
        data = base64.b64decode(value)
        if connect.get("name") == DECIMAL:
            scale = int(connect.get("parameters", {}).get("scale", "0"))
            return Decimal(int.from_bytes(data, "big", signed=True)).scaleb(-scale)
        return data
    if kind in ("float32", "float64", "float", "double") and isinstance(value, int | str):
        return float(value)  # JsonConverter's "NaN", "Infinity", "-Infinity" included
    return value


def columns(avro: Any) -> dict[str, str]:
    """field name -> its Avro type as text, of a registered key or envelope schema (the
    envelope's: its row record's, from ``before``); empty when it has none."""
    import json

    if not isinstance(avro, dict) or avro.get("type") != "record":
        return {}
    fields = {field["name"]: field["type"] for field in avro.get("fields", [])}
    row = fields.get("before")
    if row is not None and "source" in fields:
        record = next((t for t in (row if isinstance(row, list) else [row])
                       if isinstance(t, dict) and t.get("type") == "record"), None)
        if record is None:
            return {}
        fields = {field["name"]: field["type"] for field in record.get("fields", [])}
    return {name: json.dumps(kind, sort_keys=True) for name, kind in fields.items()}
