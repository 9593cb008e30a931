"""The message side's options: the router (formats, headers, partitions), the schema
registry, the Kafka producer (docs/design.md, the message contract).

Owns ``RouterConfig``, ``RegistryConfig``, ``KafkaConfig`` and the parsers of their
repeated ``KEY=VALUE`` / ``COLUMN:NAME`` options. Pure: it must not import a broker client
or a registry client (the sinks build those from these configs), nor read the environment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from cdc_relay.cloudevents import DEFAULT_SOURCE, SOURCE_FIELDS
from cdc_relay.cloudevents import FORMATS as CLOUDEVENTS_FORMATS
from cdc_relay.config.names import validate_identifier
from cdc_relay.errors import ConfigError

_TOPIC_FIELDS = ("aggregate_type", "event_type", "table", "schema")
# Encoded by the Kafka sink through a schema registry (cdc_relay/sink/registry, docs/messages.md).
REGISTRY_FORMATS = ("avro", "json-schema", "protobuf")
# The outbox payload under a registry format: JSON encoded by --value-schema, or bytea
# already in the Confluent wire format (cdc_relay/sink/registry/pre_encoded.py).
VALUE_ENCODINGS = ("schema", "pre-encoded")
MESSAGE_FORMATS = ("raw", "debezium-json", "debezium-json-schemaless", *CLOUDEVENTS_FORMATS,
                   *REGISTRY_FORMATS)
_HEADER_NAME_RE = re.compile(r"^[\x21-\x7e]{1,249}$")
# Header names the router itself writes: a --header must not shadow them.
RESERVED_HEADERS = ("id", "event_type", "aggregate_type", "traceparent", "tracestate",
                    "error", "original_topic")


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """How events become messages (docs/design.md, the message contract).

    ``message_format``: ``raw`` (key and value as UTF-8 text, what Debezium emits with
    StringConverter), ``debezium-json`` (JsonConverter with schemas, the stock Debezium
    Connect image), ``debezium-json-schemaless`` (JsonConverter, schemas.enable=false),
    ``cloudevents`` or ``cloudevents-structured`` (cdc_relay/cloudevents.py).
    ``header_columns``: (column, header name) pairs copied into headers (``--header``).
    ``partition_column``: an integer column that picks the partition (``--partition-column``).
    ``cloudevents_source``: the ``source`` attribute of the CloudEvents formats, a template
    with ``{database}``, ``{schema}``, ``{table}`` (``--cloudevents-source``).
    """

    topic_pattern: str = "outbox.event.{aggregate_type}"
    dead_letter_topic: str = "outbox.dead-letters"
    message_format: str = "raw"
    header_columns: tuple[tuple[str, str], ...] = ()
    partition_column: str | None = None
    cloudevents_source: str = DEFAULT_SOURCE

    def __post_init__(self) -> None:
        try:
            self.topic_pattern.format(**{name: "x" for name in _TOPIC_FIELDS})
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(
                f"invalid topic pattern {self.topic_pattern!r}: placeholders may be "
                + ", ".join("{" + f + "}" for f in _TOPIC_FIELDS)
            ) from exc
        if self.message_format not in MESSAGE_FORMATS:
            raise ConfigError(
                f"unknown message format {self.message_format!r}: use "
                + ", ".join(MESSAGE_FORMATS)
            )
        _check_cloudevents_source(self.cloudevents_source)
        seen: set[str] = set()
        for column, name in self.header_columns:
            validate_identifier(column, "--header column")
            if name in RESERVED_HEADERS or name in seen or self._cloudevents_header(name):
                raise ConfigError(
                    f"invalid --header {column}:{name}: header {name!r} is "
                    + ("given twice" if name in seen else "set by the relay itself")
                    + "; choose another name with COLUMN:NAME"
                )
            seen.add(name)
        if self.partition_column is not None:
            validate_identifier(self.partition_column, "--partition-column")

    def _cloudevents_header(self, name: str) -> bool:
        """True for a name the CloudEvents formats write (``ce_*``, ``content-type``)."""
        return self.message_format in CLOUDEVENTS_FORMATS and (
            name.lower().startswith("ce_") or name.lower() == "content-type")

    def extra_columns(self) -> tuple[str, ...]:
        """The columns events must carry for this config, each once, in a fixed order.

        Header columns first (in option order), then the partition column. The decoders
        and the polling query fill ``OutboxEvent.extra`` in this order.
        """
        names = [column for column, _ in self.header_columns]
        if self.partition_column is not None:
            names.append(self.partition_column)
        return tuple(dict.fromkeys(names))


def _check_cloudevents_source(template: str) -> None:
    try:
        source = template.format(**{name: "x" for name in SOURCE_FIELDS})
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(
            f"invalid --cloudevents-source {template!r}: placeholders may be "
            + ", ".join("{" + name + "}" for name in SOURCE_FIELDS)
        ) from exc
    if not source.strip():
        raise ConfigError(f"invalid --cloudevents-source {template!r}: CloudEvents needs a "
                          f"non-empty source, e.g. {DEFAULT_SOURCE}")


def parse_header_option(text: str) -> tuple[str, str]:
    """``COLUMN`` or ``COLUMN:NAME`` (``--header``) -> (column, header name)."""
    column, sep, name = text.partition(":")
    column = column.strip()
    name = name.strip() if sep else column
    validate_identifier(column, "--header column")
    if not _HEADER_NAME_RE.match(name):
        raise ConfigError(
            f"invalid --header {text!r}: the header name must be 1-249 printable ASCII "
            "characters without spaces (COLUMN or COLUMN:NAME)"
        )
    return column, name


def parse_producer_config(items: tuple[str, ...] | list[str]) -> dict[str, str]:
    """Parse repeated ``KEY=VALUE`` librdkafka properties."""
    result: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"invalid producer setting {item.split('=')[0]!r}: expected KEY=VALUE, "
                "e.g. compression.type=lz4"
            )
        result[key.strip()] = value.strip()
    return result


SUBJECT_STRATEGIES = ("topic", "record", "topic-record")
# --schema-registry-config keys for the serializers; every other key is the client's.
SERIALIZER_KEYS = ("auto.register.schemas", "normalize.schemas", "use.latest.version")


@dataclass(frozen=True, slots=True)
class RegistryConfig:
    """``--message-format avro|json-schema|protobuf`` through a schema registry (docs/messages.md).

    ``url``: the Confluent-compatible API (``--schema-registry``); ``client_config``: the
    rest of confluent-kafka's SchemaRegistryClient settings (auth, TLS), ``serializer_config``
    theirs (``auto.register.schemas``...), both from ``--schema-registry-config KEY=VALUE``;
    ``subject_strategy``: ``topic`` (TopicNameStrategy), ``record``, ``topic-record``;
    ``value_schemas``: (event type, schema file) pairs, or ("", directory) for a directory
    of ``<event type>.<ext>`` files (not needed without the outbox: ``outbox`` False);
    ``dead_letter_topic``: sent as the router made it. ``value_encoding``: ``schema`` (the
    JSON payload encoded by its event type's value schema) or ``pre-encoded`` (a bytea
    payload already in the Confluent wire format, passed through); ``key_schema``: a
    record schema file for a struct key (the aggregate id is its JSON), else the string.
    """

    url: str
    message_format: str
    client_config: dict[str, str] = field(default_factory=dict)
    serializer_config: dict[str, str] = field(default_factory=dict)
    subject_strategy: str = "topic"
    value_schemas: tuple[tuple[str, str], ...] = ()
    dead_letter_topic: str = "outbox.dead-letters"
    outbox: bool = True  # False: captured tables only (run --capture --no-outbox)
    value_encoding: str = "schema"
    key_schema: str = ""

    def __post_init__(self) -> None:
        if self.message_format not in REGISTRY_FORMATS:
            raise ConfigError(f"--schema-registry goes with --message-format "
                              f"{'|'.join(REGISTRY_FORMATS)}, not {self.message_format!r}")
        if not self.url.strip():
            raise ConfigError("--message-format avro|json-schema|protobuf needs --schema-registry URL "
                              "(the Confluent-compatible API, e.g. http://host:8080/apis/ccompat/v7)")
        if self.subject_strategy not in SUBJECT_STRATEGIES:
            raise ConfigError(f"unknown subject name strategy {self.subject_strategy!r}: use "
                              + ", ".join(SUBJECT_STRATEGIES))
        if self.value_encoding not in VALUE_ENCODINGS:
            raise ConfigError(f"unknown value encoding {self.value_encoding!r}: use "
                              + " or ".join(VALUE_ENCODINGS))
        if self.value_encoding == "pre-encoded" and self.value_schemas:
            raise ConfigError("--value-encoding pre-encoded takes the schema id from each payload: "
                              "drop --value-schema (or use --value-encoding schema)")
        if not self.value_schemas and self.outbox and self.value_encoding == "schema":
            raise ConfigError(f"--message-format {self.message_format} needs --value-schema "
                              "EVENT_TYPE=FILE (repeatable) or --value-schema DIRECTORY")


def split_registry_config(items: tuple[str, ...] | list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """``--schema-registry-config KEY=VALUE`` items as (client settings, serializer settings)."""
    client: dict[str, str] = {}
    serializer: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"invalid schema registry setting {item!r}: expected KEY=VALUE, "
                              "e.g. basic.auth.user.info=USER:PASSWORD")
        key = key.strip()
        (serializer if key in SERIALIZER_KEYS else client)[key] = value.strip()
    return client, serializer


@dataclass(frozen=True, slots=True)
class KafkaConfig:
    """The Kafka sink: brokers and librdkafka properties (docs/design.md, the message contract).

    ``schema_registry``: set for the registry formats (avro, json-schema, protobuf).
    """

    brokers: str
    producer_config: dict[str, str] = field(default_factory=dict)
    # Far below librdkafka's 300 s default: a timed-out message means "replay from the
    # slot with a new producer" (docs/design.md, failure rules).
    message_timeout_ms: int = 30_000
    schema_registry: RegistryConfig | None = None

    def __post_init__(self) -> None:
        if not self.brokers.strip():
            raise ConfigError("no brokers given: pass --brokers HOST:PORT (or CDC_RELAY_BROKERS)")
