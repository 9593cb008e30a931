"""Doctor's vocabulary: what to check (``DoctorSettings``) and the facts gathered to check it.

Owns the options and the frozen facts dataclasses (server, endpoint, table, publication,
backfill) that ``ops/doctor/gather.py`` fills and the pure checks (``checks.py``,
``slot_checks.py``) decide on, and ``quote_ident`` for the fixes they print. Must not do
I/O or decide a verdict: no connection, no broker, no environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from cdc_relay.config import KafkaConfig, OutboxConfig
from cdc_relay.model import SlotStatus
from cdc_relay.sink.config import NatsConfig, RabbitMqConfig
from cdc_relay.sink.http.config import HttpConfig
from cdc_relay.sink.kinesis.config import KinesisConfig
from cdc_relay.sink.redis.config import RedisConfig
from cdc_relay.sink.sqs.config import SqsConfig


@dataclass(frozen=True, slots=True)
class DoctorSettings:
    """What to check: the relay's own options."""

    dsn: str
    outbox: OutboxConfig = field(default_factory=OutboxConfig)
    slot: str = "cdc_relay"
    plugin: str = "pgoutput"
    publication: str = "cdc_relay_outbox"
    mode: str = "wal"  # or "poll": skip logical decoding checks
    plugin_from_slot: bool = False  # no --plugin: an existing slot's plugin, as run does
    kafka: KafkaConfig | None = None
    broker_timeout: float = 10.0
    # --sink other than kafka (sink/factory.py's OtherSink)
    sink: (RabbitMqConfig | NatsConfig | SqsConfig | RedisConfig | HttpConfig | KinesisConfig
           | None) = None
    standby_dsn: str | None = None  # --standby-dsn: check its copy of the slot (failover)


@dataclass(frozen=True, slots=True)
class ServerFacts:
    version: str
    database: str
    role: str
    superuser: bool
    replication: bool
    wal_level: str
    max_slots: int
    max_senders: int
    keep_size: int  # max_slot_wal_keep_size in bytes, -1 = unlimited
    slots_used: int
    senders_used: int
    plugin_libraries: str | None = None  # output_plugin_libraries; None where the server lacks it
    libraries_hidden: bool = False  # the setting exists but this role may not read it
    wal_segment_size: int = 16 * 2**20
    rds_replication: bool = False  # a member of rds_replication (RDS/Aurora's replication right)


@dataclass(frozen=True, slots=True)
class EndpointFacts:
    """What the DSN reaches (pg/endpoint.py): a pooler, a read-only node."""

    read_only: str | None = None  # why sessions cannot write; None: they can
    replication_error: str | None = None  # a replication connection's failure; None: it works
    pooler: bool = False  # that failure is a connection pooler's refusal
    probed: bool = False  # a replication connection was tried (WAL mode)
    # A hot standby (decoding on a standby, run --primary-dsn): its hot_standby_feedback and
    # major version; None where the server is not a standby.
    hot_standby_feedback: str | None = None
    standby_version: int | None = None


@dataclass(frozen=True, slots=True)
class TableFacts:
    exists: bool
    owner: bool = False
    privileges: dict[str, bool] = field(default_factory=dict)
    trigger: bool = False
    columns: frozenset[str] = frozenset()
    partitions: int | None = None  # leaf partitions of a partitioned table; None: not one


@dataclass(frozen=True, slots=True)
class PublicationFacts:
    exists: bool
    inserts: bool = False
    includes_table: bool = False
    via_root: bool = False  # publish_via_partition_root


@dataclass(frozen=True, slots=True)
class BackfillFacts:
    """Pending rows and ``run --snapshot initial``'s record for the slot (if any)."""

    pending: int
    oldest_pending: datetime | None = None
    state: str | None = None  # creating / running / done; None: no record for the slot
    running: bool = False  # a relay holds the slot's backfill lock now
    rows_done: int = 0
    rows_total: int | None = None
    pending_before_start: int = 0  # pending rows created before the recorded backfill began
    # pending rows created before the slot's recorded creation (None: no record of the slot)
    pending_before_slot: int | None = None


@dataclass(frozen=True, slots=True)
class Facts:
    server: ServerFacts
    table: TableFacts
    publication: PublicationFacts
    slot: SlotStatus | None
    idle_slots: tuple[SlotStatus, ...] = ()  # inactive logical slots of this database
    backfill: BackfillFacts | None = None  # None: the table has no bookkeeping columns
    endpoint: EndpointFacts = field(default_factory=EndpointFacts)


def quote_ident(name: str) -> str:
    """A double-quoted SQL identifier, for fixes printed to the user."""
    return '"' + name.replace('"', '""') + '"'
