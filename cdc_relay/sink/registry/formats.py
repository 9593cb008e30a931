"""A captured table's Connect schema in each registry format, with its serializer.

Owns ``format_schema``: for one Connect schema (a table's key, or its envelope at one
moment) the schema Confluent's converter for the format derives from it, the record name
the subject strategies use, how to encode a payload to the Confluent wire format, and how
to name the columns of a registered version (for the line a refused change stops with):

* ``avro``: AvroData's schema (cdc_relay/sink/registry/connect_avro.py) through
  confluent-kafka's AvroSerializer;
* ``json-schema``: JsonSchemaData's (connect_jsonschema.py) through its JSONSerializer
  (without validating each value, as the converter), decimals written as JSON numbers;
* ``protobuf``: ProtobufData's ``.proto`` text (connect_protobuf.py), registered as that
  text (what Debezium's ProtobufConverter registers; confluent-kafka's ProtobufSerializer
  would register a base64 descriptor, which Apicurio Registry cannot parse when it checks
  a compatibility rule), the message encoded from its runtime class and framed as the
  Confluent serializers frame it (proto_wire.py: zero byte, 4-byte id, message index
  ``0``, the message).

Must not: decide what a failure means (cdc_relay/sink/registry/captured.py does).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.serialization import SerializationContext

from cdc_relay.sink.registry import connect_avro, connect_jsonschema, connect_protobuf
from cdc_relay.sink.registry.proto_wire import frame, schema_id


class FormatSchema:
    """One Connect schema in one format: ``text`` (registered), ``record_name``, ``encode``."""

    text: str
    record_name: str
    encode: Callable[[Any, SerializationContext], bytes | None]

    def columns(self, text: str) -> dict[str, str]:
        """column -> its type, in the registered schema ``text`` (the row's, for an envelope)."""
        raise NotImplementedError


def format_schema(fmt: str, connect: dict[str, Any], client: SchemaRegistryClient,
                  conf: dict[str, Any]) -> FormatSchema:
    """The FormatSchema of ``connect`` for ``fmt`` (``avro``, ``json-schema``, ``protobuf``)."""
    made = {"avro": _Avro, "json-schema": _JsonSchema, "protobuf": _Protobuf}[fmt]
    return made(connect, client, conf)


class _Avro(FormatSchema):
    def __init__(self, connect: dict[str, Any], client: SchemaRegistryClient,
                 conf: dict[str, Any]) -> None:
        from confluent_kafka.schema_registry.avro import AvroSerializer

        _check_avro_names(connect)
        avro = connect_avro.avro_schema(connect)
        self.text = json.dumps(avro, separators=(",", ":"))
        self.record_name = f"{avro.get('namespace', '')}.{avro.get('name', '')}" \
            if isinstance(avro, dict) else str(avro)
        serializer = AvroSerializer(client, self.text, conf=conf)
        self.encode = lambda payload, ctx: serializer(connect_avro.avro_datum(connect, payload), ctx)

    def columns(self, text: str) -> dict[str, str]:
        return connect_avro.columns(json.loads(text))


_AVRO_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_avro_names(connect: dict[str, Any]) -> None:
    """ValueError naming the first schema or field name Avro does not allow, and the fix."""
    name = connect.get("name")
    if connect.get("type") == "struct" and name and not all(
            _AVRO_NAME.fullmatch(part) for part in name.split(".")):
        raise ValueError(f"{name!r} is no legal Avro name: set --capture-schema-name-adjustment "
                         "avro (Debezium's schema.name.adjustment.mode)")
    for field in connect.get("fields", []):
        if not _AVRO_NAME.fullmatch(field["field"]):
            raise ValueError(f"column {field['field']!r} is no legal Avro name: set "
                             "--capture-field-name-adjustment avro (Debezium's "
                             "field.name.adjustment.mode)")
        _check_avro_names(field)
    for inner in ("items", "values"):
        if inner in connect:
            _check_avro_names(connect[inner])


class _JsonSchema(FormatSchema):
    def __init__(self, connect: dict[str, Any], client: SchemaRegistryClient,
                 conf: dict[str, Any]) -> None:
        from confluent_kafka.schema_registry.json_schema import JSONSerializer

        self.text = connect_jsonschema.json_schema_text(connect)
        self.record_name = str(connect.get("name") or "")
        # no validation per event (as the converter's json.fail.invalid.schema=false): the
        # value is made from the same Connect schema, and json_datum refuses what a JSON
        # number cannot hold; validating cost 13 times the rest of the encoding
        serializer = JSONSerializer(self.text, client, conf={**conf, "validate": False},
                                    json_encode=connect_jsonschema.json_encode)
        self.encode = lambda payload, ctx: serializer(
            connect_jsonschema.json_datum(connect, payload), ctx)

    def columns(self, text: str) -> dict[str, str]:
        schema = json.loads(text)
        fields = schema.get("properties", {})
        if "before" in fields and "source" in fields:
            fields = fields["before"].get("oneOf", [{}, {}])[-1].get("properties", {})
        return {name: json.dumps({k: v for k, v in kind.items() if k != "connect.index"},
                                 sort_keys=True) for name, kind in fields.items()}


_FIELD = re.compile(r"^\s*(?:repeated )?([\w.]+) (\w+) = \d+")


class _Protobuf(FormatSchema):
    def __init__(self, connect: dict[str, Any], client: SchemaRegistryClient,
                 conf: dict[str, Any]) -> None:
        schema = connect_protobuf.proto_schema(connect)
        self.text, self.record_name = schema.text, schema.full_name
        self._connect, self._class = connect, connect_protobuf.message_class(schema)
        self._client, self._conf = client, conf
        self._ids: dict[str, int] = {}
        self.encode = self._encode

    def _encode(self, payload: Any, ctx: SerializationContext) -> bytes:
        message = connect_protobuf.fill(self._class(), self._connect, payload)
        subject = str(self._conf["subject.name.strategy"](ctx, self.record_name))
        found = self._ids.get(subject)
        if found is None:
            found = self._ids[subject] = schema_id(self._client, self._conf, subject,
                                                   Schema(self.text, "PROTOBUF", []))
        return frame(found, [0], message.SerializeToString())

    def columns(self, text: str) -> dict[str, str]:
        lines = text.splitlines()
        start = next((i for i, line in enumerate(lines) if line.strip() == "message Value {"),
                     next((i for i, line in enumerate(lines) if line.startswith("message ")), 0))
        found, depth = {}, 0
        for line in lines[start:]:
            match = _FIELD.match(line)
            if depth == 1 and match:
                found[match.group(2)] = match.group(1)
            depth += line.count("{") - line.count("}")
            if depth <= 0 and line.strip() == "}":
                break
        return found
