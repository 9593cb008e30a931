"""The modes' options: the replication stream, backpressure, polling, metrics, password
rotation, exactly-once delivery and table CDC (docs/design.md, modes).

Owns one frozen, validated ``*Config`` per group of a mode's options. Pure: it must not
import psycopg or a broker client, nor read the environment; the roots in ``app/`` turn
these into ``*Settings``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cdc_relay.config.names import validate_identifier, validate_slot_name
from cdc_relay.errors import ConfigError


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
