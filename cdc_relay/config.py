"""Frozen, validated configuration: one dataclass per group of the user's options.

Values are validated here, at the edge, and every problem is a ConfigError naming the
option and the fix. Components receive their config object and never read the
environment or files themselves (the CLI layers flags > env > TOML file into these).

The naming rule (docs/design.md, configuration): ``*Config`` is such a group, as the user
gave it (here, or beside the sink that reads it: sink/config.py, sink/sqs/config.py);
``*Settings`` is what one command's root or one component takes, derived from Configs
(``WalSettings``, ``PollerSettings``); ``*Timings`` a loop's intervals; ``*Parts`` the
built objects a composition root hands over together.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from cdc_relay.cloudevents import DEFAULT_SOURCE, SOURCE_FIELDS
from cdc_relay.cloudevents import FORMATS as CLOUDEVENTS_FORMATS
from cdc_relay.errors import ConfigError
from cdc_relay.model import BOOKKEEPING_COLUMNS, OutboxColumns

# Unquoted-style identifiers only: letters, digits, underscore, dollar; at most 63 bytes
# (NAMEDATALEN - 1). Everything that reaches SQL is also quoted at the use site.
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")
_SLOT_RE = re.compile(r"^[a-z0-9_]{1,63}$")
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def validate_identifier(name: str, what: str) -> str:
    """Return ``name`` if it is a safe SQL identifier, else raise ConfigError."""
    if not _IDENT_RE.match(name):
        raise ConfigError(
            f"invalid {what} {name!r}: use letters, digits and underscores "
            "(starting with a letter or underscore, at most 63 characters)"
        )
    return name


def validated_table(table: str | TableRef) -> TableRef:
    """A TableRef from ``"schema.table"`` text or a TableRef, both parts validated.

    TableRef's constructor does not validate, so a TableRef is re-checked here.
    """
    if isinstance(table, str):
        return TableRef.parse(table)
    validate_identifier(table.schema, "schema name")
    validate_identifier(table.name, "table name")
    return table


def validated_columns(columns: OutboxColumns | None) -> OutboxColumns:
    """OutboxColumns with every name a safe identifier and no two roles on one column."""
    columns = columns or OutboxColumns()
    names: dict[str, str] = {}
    for role in OutboxColumns.__dataclass_fields__:
        name = validate_identifier(getattr(columns, role), f"column name for {role}")
        if name in names:
            raise ConfigError(
                f"invalid column mapping: {role} and {names[name]} both map to {name!r}"
            )
        if name in BOOKKEEPING_COLUMNS:
            raise ConfigError(
                f"invalid column mapping: {role} maps to {name!r}, a column the relay "
                "itself uses; choose another name"
            )
        names[name] = role
    return columns


def validate_slot_name(name: str) -> str:
    """Replication slot names allow only lower-case letters, digits and underscores."""
    if not _SLOT_RE.match(name):
        raise ConfigError(
            f"invalid slot name {name!r}: use lower-case letters, digits and underscores "
            "(at most 63 characters)"
        )
    return name


def parse_duration(text: str, what: str = "duration") -> float:
    """Parse ``"250ms"``, ``"1s"``, ``"5m"``, ``"2h"``, ``"7d"``, ``"1w"`` into seconds.

    The unit is required (``0`` alone is allowed): a bare ``7`` meant seven days to one
    user and seven seconds to the code, so it is refused with an example.
    """
    match = _DURATION_RE.match(str(text))
    if match is None:
        raise ConfigError(
            f"invalid {what} {text!r}: expected a number with a unit, e.g. 500ms, 1s, 5m, 2h, 7d"
        )
    if match.group(2) is None and float(match.group(1)) != 0:
        raise ConfigError(
            f"invalid {what} {text!r}: a unit is required, e.g. {match.group(1)}s or "
            f"{match.group(1)}d (units: ms, s, m, h, d, w)"
        )
    return float(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]


@dataclass(frozen=True, slots=True)
class TableRef:
    """A validated ``schema.table`` name."""

    schema: str = "public"
    name: str = "outbox_events"

    @classmethod
    def parse(cls, text: str) -> TableRef:
        """Parse ``table`` or ``schema.table``; both parts must be safe identifiers."""
        parts = text.split(".")
        if len(parts) == 1:
            return cls("public", validate_identifier(parts[0], "table name"))
        if len(parts) == 2:
            return cls(
                validate_identifier(parts[0], "schema name"),
                validate_identifier(parts[1], "table name"),
            )
        raise ConfigError(f"invalid table {text!r}: expected 'table' or 'schema.table'")

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}"


@dataclass(frozen=True, slots=True)
class OutboxConfig:
    """Where the outbox lives and what its columns are called."""

    table: TableRef = field(default_factory=TableRef)
    columns: OutboxColumns = field(default_factory=OutboxColumns)
    # Columns read beyond the contract's (RouterConfig.extra_columns, in that order), and
    # the trace context columns the table has (polling mode reads only what exists; the
    # WAL decoders find traceparent/tracestate in each row themselves).
    extra_columns: tuple[str, ...] = ()
    trace_columns: tuple[str, ...] = ()

    @property
    def notify_channel(self) -> str:
        """The LISTEN/NOTIFY channel of the table's AFTER INSERT trigger."""
        return f"{self.table.schema}_{self.table.name}_inserted"[:63]


def parse_columns(text: str | None) -> OutboxColumns:
    """Parse ``--columns`` (``debezium`` or ``field=column,...``) into OutboxColumns."""
    if not text:
        return OutboxColumns()
    if text.strip().lower() == "debezium":
        return OutboxColumns.debezium()
    names = {}
    valid = set(OutboxColumns.__dataclass_fields__)
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in valid:
            raise ConfigError(
                f"invalid column mapping {item!r}: expected FIELD=COLUMN with FIELD one of "
                + ", ".join(sorted(valid))
            )
        names[key] = validate_identifier(value.strip(), f"column name for {key}")
    return OutboxColumns(**names)


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


@dataclass(frozen=True, slots=True)
class CredentialsConfig:
    """Where PostgreSQL passwords come from when they rotate (docs/configuration.md, credentials).

    ``password_command``: a shell command run before every connection, whose first line
    of output is the password; ``aws_rds_iam``: an RDS/Aurora IAM token per connection,
    for ``aws_region`` (None: boto3's standard chain). Neither: the DSN's own password.
    """

    password_command: str | None = None
    aws_rds_iam: bool = False
    aws_region: str | None = None

    def __post_init__(self) -> None:
        if self.password_command is not None and not self.password_command.strip():
            raise ConfigError("--password-command is empty: give the command that prints the "
                              "password")
        if self.password_command and self.aws_rds_iam:
            raise ConfigError("--password-command and --aws-rds-iam both set the password: "
                              "give one")
        if self.aws_region and not self.aws_rds_iam:
            raise ConfigError("--aws-region is only used with --aws-rds-iam")


@dataclass(frozen=True, slots=True)
class ReplicationConfig:
    """The logical replication stream (docs/design.md, WAL mode)."""

    dsn: str
    slot: str = "cdc_relay"
    plugin: str = "pgoutput"
    publication: str = "cdc_relay_outbox"
    # True when no --plugin was given: an existing slot's plugin is used (docs/wal-mode.md).
    plugin_from_slot: bool = False
    status_interval: float = 1.0
    reconnect_max: float = 30.0
    # Continuity (docs/design.md, continuity): create failover slots on PostgreSQL 17+;
    # what a slot loss does ("exit": stop with exit 7 and the recovery command, "recover":
    # recover by itself); silence on the stream after which the connection is dropped.
    failover_slot: bool = True
    on_slot_loss: str = "exit"
    replication_timeout: float = 30.0
    # Decoding on a standby (docs/high-availability.md): ``dsn`` is a hot standby holding
    # the slot; everything that writes (the continuity record and horizon, the heartbeat,
    # the publication, the standby-snapshot nudge at slot creation) goes to this primary.
    primary_dsn: str | None = None

    def __post_init__(self) -> None:
        validate_slot_name(self.slot)
        validate_identifier(self.publication, "publication name")
        if self.plugin not in ("wal2json", "pgoutput"):
            raise ConfigError(f"unknown plugin {self.plugin!r}: use wal2json or pgoutput")
        if self.status_interval <= 0:
            raise ConfigError("--status-interval must be positive")
        if self.on_slot_loss not in ("exit", "recover"):
            raise ConfigError(f"unknown --on-slot-loss {self.on_slot_loss!r}: use exit or recover")
        if self.replication_timeout < 3 * self.status_interval:
            raise ConfigError("--replication-timeout must be at least three --status-interval "
                              f"({3 * self.status_interval:g}s)")


@dataclass(frozen=True, slots=True)
class FlowConfig:
    """Bounds on what WAL mode keeps in flight (backpressure, docs/design.md, WAL mode)."""

    max_inflight_events: int = 50_000
    max_inflight_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class PollConfig:
    """Polling mode (docs/design.md, polling mode): batches, retries, wake-up."""

    dsn: str
    batch_size: int = 100
    interval: float = 1.0
    max_attempts: int = 5
    backoff_base: float = 1.0
    backoff_max: float = 300.0
    workers: int = 1
    notify: bool = True
    strict_order: bool = False
    pipeline: bool = True  # mark a batch processed while its acks are awaited (committed after)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError("--batch-size must be at least 1")
        if self.max_attempts < 1:
            raise ConfigError("--max-attempts must be at least 1")
        if self.workers < 1:
            raise ConfigError("--workers must be at least 1")
        if self.interval <= 0:
            raise ConfigError("--interval must be positive")


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """The Prometheus / health endpoint (docs/design.md, observability); port None = disabled."""

    port: int | None = None
    host: str = "127.0.0.1"
    standby_dsn: str | None = None  # also probe failover readiness (docs/high-availability.md)


_TOPIC_NAME_RE = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


@dataclass(frozen=True, slots=True)
class TxnLimits:
    """What closes a Kafka transaction (at a PostgreSQL commit boundary): wal/exactly_once/txn_policy.py."""

    interval: float = 0.1
    max_events: int = 10_000
    max_bytes: int = 16 * 1024 * 1024
    split_events: int | None = None

    def __post_init__(self) -> None:
        if self.interval <= 0:
            raise ConfigError("--txn-interval must be positive")
        if self.max_events < 1:
            raise ConfigError("--txn-max-events must be at least 1")
        if self.max_bytes < 1:
            raise ConfigError("--txn-max-bytes must be at least 1")
        if self.split_events is not None and self.split_events < 1:
            raise ConfigError("--txn-split-events must be at least 1")


@dataclass(frozen=True, slots=True)
class ExactlyOnceConfig:
    """``run --exactly-once`` (docs/design.md, exactly-once delivery); None on WalSettings = off."""

    checkpoint_topic: str = "cdc-relay.checkpoints"
    txn_interval: float = 0.1
    txn_max_events: int = 10_000
    txn_max_bytes: int = 16 * 1024 * 1024
    txn_split_events: int | None = None
    transaction_timeout_ms: int = 60_000
    reset_checkpoint: bool = False

    def __post_init__(self) -> None:
        if not _TOPIC_NAME_RE.match(self.checkpoint_topic) or self.checkpoint_topic in (".", ".."):
            raise ConfigError(f"invalid --checkpoint-topic {self.checkpoint_topic!r}: use letters, "
                              "digits, '.', '_' and '-' (at most 249 characters)")
        # Brokers refuse more than transaction.max.timeout.ms (15 min by default).
        if not 1000 <= self.transaction_timeout_ms <= 900_000:
            raise ConfigError("--transaction-timeout must be between 1s and 15m (the broker's "
                              "transaction.max.timeout.ms caps it, 15 min by default)")
        self.limits  # noqa: B018  # validates the batching limits

    @property
    def limits(self) -> TxnLimits:
        """The --txn-* options as the limits that close a Kafka transaction."""
        return TxnLimits(self.txn_interval, self.txn_max_events, self.txn_max_bytes,
                         self.txn_split_events)


UNAVAILABLE_VALUE = "__debezium_unavailable_value"  # Debezium's unavailable.value.placeholder


@dataclass(frozen=True, slots=True)
class CaptureConfig:
    """Table CDC (``run --capture``, docs/table-cdc.md): the tables (``--capture`` text,
    patterns parsed by capture/selection.py), the topic prefix (Debezium's ``topic.prefix``),
    whether the outbox is relayed too, tombstones after deletes, the unchanged-TOAST
    placeholder, truncate events (``op: t``, opt-in as Debezium's ``skipped.operations``),
    and the type modes as Debezium's properties name them (``decimal.handling.mode``...;
    checked where capture/modes.py makes them a TypeModes), Debezium's schema and field
    name adjustment modes (capture/names.py)."""

    tables: str
    prefix: str
    outbox: bool = True
    tombstones: bool = True
    placeholder: str = UNAVAILABLE_VALUE
    truncate: bool = False
    decimal_handling: str = "precise"
    time_precision: str = "adaptive"
    interval_handling: str = "numeric"
    binary_handling: str = "bytes"
    hstore_handling: str = "json"
    money_fraction_digits: int = 2
    # incremental snapshots: the signal table (None: cdc_relay_signal in the outbox table's
    # schema) and the rows per chunk (Debezium's incremental.snapshot.chunk.size)
    signal_table: str | None = None
    chunk_size: int = 1024
    schema_name_adjustment: str = "none"
    field_name_adjustment: str = "none"

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise ConfigError(f"--snapshot-chunk-size must be at least 1, not {self.chunk_size}")
        if not self.tables.strip():
            raise ConfigError("--capture names no table: e.g. --capture public.customers")
        if not self.prefix or not re.fullmatch(r"[A-Za-z0-9._-]+", self.prefix):
            raise ConfigError(
                f"invalid --capture-prefix {self.prefix!r}: captured tables' topics are "
                "PREFIX.SCHEMA.TABLE, so use letters, digits, '.', '_' or '-' (as Debezium's "
                "topic.prefix)")
