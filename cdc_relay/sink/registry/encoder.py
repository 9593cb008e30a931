"""Encoding a routed outbox message through the schema registry (docs/messages.md).

Owns confluent-kafka's SchemaRegistryClient and its serializers (Avro, JSON Schema; Protobuf
registered as ``.proto`` text: cdc_relay/sink/registry/proto_wire.py): one value serializer
per event type, built at start-up from the user's schemas
(cdc_relay/sink/registry/schemas.py), and the key serializer (the aggregate id as the
registry's string). Each serializer asks the registry once per subject (registers, or with
``auto.register.schemas=false`` looks up) and keeps the schema id: after an event type's
first message, encoding never calls the registry. They live as long as the Encoder, which
the sink factory keeps across producer generations.

What goes wrong is sorted for the sink: ``Unencodable`` (the payload does not fit its
schema, is not JSON, or its event type has no schema: the event's fault, a dead letter) or
``RegistryTrouble`` (unreachable, refused, schema missing with auto-register off: the
event waits and is retried).

Must not: produce, or decide what happens to a failed event.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import orjson
from confluent_kafka.schema_registry import (
    SchemaRegistryClient,
    record_subject_name_strategy,
    topic_record_subject_name_strategy,
    topic_subject_name_strategy,
)
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import (
    MessageField,
    SerializationContext,
    SerializationError,
    StringSerializer,
)

from cdc_relay.config import RegistryConfig
from cdc_relay.errors import ConfigError
from cdc_relay.model import Message
from cdc_relay.sink.registry.schemas import ValueSchema, load_value_schemas

_STRATEGIES = {"topic": topic_subject_name_strategy, "record": record_subject_name_strategy,
               "topic-record": topic_record_subject_name_strategy}
_CLIENT_DEFAULTS = {"timeout": 10}  # seconds per request: a hung registry is retried, not awaited
_HTTP_MODULES = ("httpx", "httpx2", "httpcore", "httpcore2", "h11")
# The key's JSON Schema; ``$schema`` named, as Apicurio recognises JSON Schema content by it.
_JSON_STRING = '{"$schema":"http://json-schema.org/draft-07/schema#","type":"string"}'
Serializer = Callable[[Any, SerializationContext], bytes | None]


class Unencodable(Exception):
    """This event cannot be encoded as it is: dead-letter it with this reason."""


class RegistryTrouble(Exception):
    """The registry cannot be used now (unreachable, refused, schema missing): retry."""


def _serializer_conf(config: RegistryConfig) -> dict[str, Any]:
    """The serializers' settings: the (boolean) SERIALIZER_KEYS given, the subject strategy."""
    conf: dict[str, Any] = {key: value.lower() in ("true", "1", "yes")
                            for key, value in config.serializer_config.items()}
    conf["subject.name.strategy"] = _STRATEGIES[config.subject_strategy]
    return conf


def new_client(config: RegistryConfig) -> SchemaRegistryClient:
    """confluent-kafka's client for ``config`` (auth, TLS pass through); ConfigError if it
    refuses a setting."""
    for name in _HTTP_MODULES:  # one INFO line per request otherwise: the relay says what matters
        logging.getLogger(name).setLevel(logging.WARNING)
    settings: dict[str, Any] = {**_CLIENT_DEFAULTS, **config.client_config, "url": config.url}
    for key in ("timeout", "max.retries", "retries.wait.ms", "retries.max.wait.ms", "cache.capacity",
                "cache.latest.ttl.sec"):
        if isinstance(settings.get(key), str):
            settings[key] = int(settings[key])
    try:
        return SchemaRegistryClient(settings)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"--schema-registry-config: {exc} (see confluent-kafka's "
                          "SchemaRegistryClient settings; serializer settings: "
                          "auto.register.schemas, normalize.schemas, use.latest.version)") from exc


class Encoder:
    """Key and value of routed outbox messages as registry-framed bytes."""

    def __init__(self, config: RegistryConfig, client: SchemaRegistryClient | None = None) -> None:
        self.config = config
        self.client = client if client is not None else new_client(config)
        schemas = load_value_schemas(config.message_format, config.value_schemas)
        conf = _serializer_conf(config)
        self._values: dict[str, tuple[Serializer, Callable[[Any], Any]]] = {
            event_type: self._value_serializer(schema, conf) for event_type, schema in schemas.items()}
        self._key = self._key_serializer()
        # the aggregate id -> what the key serializer takes (a struct key's parse: outbox_encoder.py)
        self._key_convert: Callable[[str], Any] = _same
        # captured tables' encoder (cdc_relay/sink/registry/captured.py), made on first use
        self.capture_encoder: object = None

    @property
    def event_types(self) -> tuple[str, ...]:
        """The event types that have a value schema."""
        return tuple(self._values)

    def _value_serializer(self, schema: ValueSchema, conf: dict[str, Any]
                          ) -> tuple[Serializer, Callable[[Any], Any]]:
        """(serializer, JSON payload -> what it takes) for one event type's schema."""
        fmt = self.config.message_format
        if fmt == "avro":
            from confluent_kafka.schema_registry.avro import AvroSerializer

            return AvroSerializer(self.client, schema.text, conf=conf), _same
        if fmt == "json-schema":
            from confluent_kafka.schema_registry.json_schema import JSONSerializer

            return JSONSerializer(schema.text, self.client, conf=conf), _same
        from cdc_relay.sink.registry.proto_wire import TextProtobufSerializer

        message = schema.message
        try:
            serializer = TextProtobufSerializer(message, self.client, conf)
        except ValueError as exc:  # a file the .proto printer refuses (editions, groups)
            raise ConfigError(f"--value-schema {schema.event_type}={schema.path}: {exc}") from exc
        return serializer, _protobuf_parser(message)

    def _key_serializer(self) -> Serializer:
        """The aggregate id: an Avro ``"string"`` (avro), a JSON Schema string (json-schema),
        UTF-8 text (protobuf, which has no registered primitive)."""
        conf = {key: value for key, value in _serializer_conf(self.config).items()
                if key != "subject.name.strategy"}  # a key has no record name: TopicNameStrategy
        if self.config.message_format == "avro":
            from confluent_kafka.schema_registry.avro import AvroSerializer

            key: Serializer = AvroSerializer(self.client, '"string"', conf=conf)
            return key
        if self.config.message_format == "json-schema":
            from confluent_kafka.schema_registry.json_schema import JSONSerializer

            key = JSONSerializer(_JSON_STRING, self.client, conf=conf)
            return key
        return StringSerializer("utf_8")

    def encode(self, message: Message, event_type: str) -> tuple[bytes | None, bytes | None]:
        """(key, value) of ``message`` (routed with the raw format) for ``event_type``; with
        ``--value-encoding pre-encoded`` the value is the payload's bytes as they are
        (cdc_relay/sink/registry/outbox_encoder.py)."""
        value = self._value(message, event_type)
        try:
            return self._encode_key(message), value()
        except SchemaRegistryError as exc:
            raise RegistryTrouble(_registry_text(self.config, exc)) from exc
        except (SerializationError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise Unencodable(f"the payload does not fit the {event_type} schema: {exc}") from exc
        except Exception as exc:
            if isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in _HTTP_MODULES:
                raise RegistryTrouble(f"schema registry {self.config.url} unreachable: {exc}") from exc
            raise

    def _value(self, message: Message, event_type: str) -> Callable[[], bytes | None]:
        """The value's encoding, once the payload is parsed for ``event_type``'s schema."""
        entry = self._values.get(event_type)
        if entry is None:
            raise Unencodable(f"event type {event_type!r} has no value schema: add --value-schema "
                              f"{event_type}=FILE (or a file {event_type}"
                              f"{_extension(self.config.message_format)} to the schema directory)")
        serializer, convert = entry
        try:
            payload = convert(orjson.loads(message.value or b"null"))
        except (orjson.JSONDecodeError, ValueError) as exc:
            raise Unencodable(f"the payload does not fit the {event_type} schema: {exc}") from exc
        return functools.partial(serializer, payload,
                                 SerializationContext(message.topic, MessageField.VALUE))

    def _encode_key(self, message: Message) -> bytes | None:
        """The aggregate id as the registry's string, or as the --key-schema struct."""
        if message.key is None:
            return None
        key = self._key_convert(message.key.decode())
        return self._key(key, SerializationContext(message.topic, MessageField.KEY))


def _same(value: Any) -> Any:
    return value


def _protobuf_parser(message: Any) -> Callable[[Any], Any]:
    from google.protobuf import json_format

    def parse(payload: Any) -> Any:
        try:
            return json_format.ParseDict(payload, message())
        except json_format.ParseError as exc:
            raise ValueError(str(exc)) from exc

    return parse


def _extension(message_format: str) -> str:
    from cdc_relay.sink.registry.schemas import EXTENSIONS

    return EXTENSIONS[message_format]


def _registry_text(config: RegistryConfig, exc: SchemaRegistryError) -> str:
    """One line: what the registry said, and the fix where it is known."""
    status = exc.http_status_code
    if status == 404 and config.serializer_config.get("auto.register.schemas", "").lower() == "false":
        return (f"schema registry {config.url} has no such schema ({exc.error_message}) and "
                "auto.register.schemas=false: register the schema (or allow auto-registration); "
                "the event waits")
    if status == 409:
        return (f"schema registry {config.url} refused the schema as incompatible "
                f"({exc.error_message}): change the schema or the subject's compatibility rule; "
                "the event waits")
    if status in (401, 403):
        return (f"schema registry {config.url} refused access (HTTP {status}: {exc.error_message}): "
                "check --schema-registry-config basic.auth.user.info / bearer.auth.*")
    return f"schema registry {config.url} answered HTTP {status}: {exc.error_message}"
