"""The outbox event's key as a registry-encoded struct (``--key-schema FILE``).

Owns the key serializer when the user names a key schema: a record (Avro ``.avsc``), an
object (JSON Schema ``.json``) or a message (Protobuf ``.desc``), read like a value schema
(cdc_relay/sink/registry/schemas.py). The aggregate id then holds the key's JSON
(``{"tenant": "t1", "order_id": 7}``), which is encoded with confluent-kafka's
serializer for the format and registered under ``<topic>-key`` (TopicNameStrategy, as
Kafka Connect's key converter does). Without ``--key-schema`` the key stays the
registry's string (cdc_relay/sink/registry/encoder.py).

What goes wrong: an aggregate id that is not JSON, or does not fit the key schema, is
``Unencodable`` (a dead letter naming the key). Registry trouble is the caller's to sort.

Must not: produce, or read the value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from confluent_kafka.serialization import SerializationContext, SerializationError

from cdc_relay.config import RegistryConfig
from cdc_relay.errors import ConfigError
from cdc_relay.sink.registry.encoder import Serializer, Unencodable, _protobuf_parser
from cdc_relay.sink.registry.schemas import load_value_schemas

KeyConvert = Callable[[str], Any]


def struct_key(config: RegistryConfig, client: Any, conf: dict[str, Any]) -> tuple[Serializer, KeyConvert]:
    """(serializer, aggregate id -> what it takes) for ``config.key_schema``; ConfigError
    at start-up when the file is not a schema of the format."""
    try:
        schema = load_value_schemas(config.message_format, (("key", config.key_schema),))["key"]
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("--value-schema key=", "--key-schema ", 1)) from exc
    conf = {key: value for key, value in conf.items() if key != "subject.name.strategy"}
    fmt = config.message_format
    serializer: Serializer
    parse: Callable[[Any], Any] = _same
    if fmt == "avro":
        from confluent_kafka.schema_registry.avro import AvroSerializer

        serializer = AvroSerializer(client, schema.text, conf=conf)
    elif fmt == "json-schema":
        from confluent_kafka.schema_registry.json_schema import JSONSerializer

        serializer = JSONSerializer(schema.text, client, conf=conf)
    else:
        from confluent_kafka.schema_registry import topic_subject_name_strategy

        from cdc_relay.sink.registry.proto_wire import TextProtobufSerializer

        serializer = TextProtobufSerializer(schema.message, client,
                                            {**conf, "subject.name.strategy": topic_subject_name_strategy})
        parse = _protobuf_parser(schema.message)

    def convert(aggregate_id: str) -> Any:
        try:
            return parse(orjson.loads(aggregate_id))
        except (orjson.JSONDecodeError, ValueError) as exc:
            raise Unencodable(f"the aggregate id {aggregate_id[:80]!r} is not the JSON of the "
                              f"--key-schema {config.key_schema} struct: {exc}") from exc

    return _guarded(serializer, config.key_schema), convert


def _guarded(serializer: Serializer, path: str) -> Serializer:
    """``serializer`` with a key that does not fit its schema as Unencodable."""

    def encode(value: Any, context: SerializationContext) -> bytes | None:
        try:
            return serializer(value, context)
        except (SerializationError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise Unencodable(f"the key does not fit the --key-schema {path} struct: {exc}") from exc

    return encode


def _same(value: Any) -> Any:
    return value
