"""What ``cdc-relay run`` runs with: ``WalSettings`` (validated when made) and the decoder
for the configured plugin (``make_decoder``). app/run.py composes and runs them; this module
builds nothing else and, like run.py, imports no PostgreSQL driver at module level
(tests/unit/test_purity.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from cdc_relay.app.capture import check_capture
from cdc_relay.config import (
    CaptureConfig,
    ExactlyOnceConfig,
    FlowConfig,
    KafkaConfig,
    MetricsConfig,
    OutboxConfig,
    ReplicationConfig,
    RouterConfig,
)
from cdc_relay.errors import ConfigError
from cdc_relay.sink.factory import OtherSink
from cdc_relay.wal.stream.session import Decoder


def make_decoder(repl: ReplicationConfig, outbox: OutboxConfig, *,
                 partitioned: bool = False) -> tuple[Decoder, list[tuple[str, str]]]:
    """The decoder and START_REPLICATION options for the configured plugin.

    A partitioned outbox: pgoutput's publication publishes via the root (wal/slot/setup.py),
    so nothing changes; wal2json streams every table and its decoder looks partitions
    up (pg/partitions.py).
    """
    decoder: Decoder
    if repl.plugin == "pgoutput":
        from cdc_relay.decoding.pgoutput import PgOutputDecoder
        from cdc_relay.decoding.pgoutput import plugin_options as pgoutput_options

        return (PgOutputDecoder(outbox.table, outbox.columns, outbox.extra_columns),
                pgoutput_options(repl.publication))
    from cdc_relay.decoding.wal2json import Wal2JsonDecoder
    from cdc_relay.decoding.wal2json import plugin_options as wal2json_options

    tree = None
    if partitioned:
        from cdc_relay.pg.partitions import PartitionTree

        tree = PartitionTree(repl.dsn, outbox.table)
    decoder = Wal2JsonDecoder(outbox.table, outbox.columns, tree, extra_columns=outbox.extra_columns)
    return decoder, wal2json_options(outbox.table, partitioned=partitioned)


@dataclass(frozen=True, slots=True)
class WalSettings:
    """Everything ``cdc-relay run`` needs, already validated."""

    replication: ReplicationConfig
    outbox: OutboxConfig
    router: RouterConfig
    kafka: KafkaConfig
    flow: FlowConfig = field(default_factory=FlowConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    sink: OtherSink | None = None  # --sink other than kafka; None: the Kafka sink of ``kafka``
    snapshot: str = "never"  # "initial": backfill pending rows when the relay creates the slot
    exactly_once: ExactlyOnceConfig | None = None
    capture: CaptureConfig | None = None

    def __post_init__(self) -> None:
        if self.capture is not None:
            check_capture(self.capture, snapshot=self.snapshot,
                          other_sink=self.sink is not None,
                          message_format=self.router.message_format)
        if self.snapshot not in ("initial", "never"):
            raise ConfigError(f"unknown --snapshot {self.snapshot!r}: use initial or never")
        if self.snapshot == "initial" and self.exactly_once is not None:
            raise ConfigError("--snapshot initial cannot be combined with --exactly-once yet (the "
                              "backfill is at least once): backfill without --exactly-once, then "
                              "restart with it")
        if self.sink is not None and self.exactly_once is not None:
            raise ConfigError("--exactly-once needs Kafka transactions: it works with --sink kafka "
                              "only (RabbitMQ, NATS and SQS stay at least once, docs/sinks.md)")
