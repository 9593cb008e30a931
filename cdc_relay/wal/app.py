"""Composition root: builds the real parts from config and runs them.

The only module that knows every concrete class: it picks the decoder for the plugin,
the Kafka sink, the replication stream, installs signal handlers and starts the metrics
endpoint. Components get frozen configs from here and never read the environment.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from cdc_relay.checkpoint import transactional_id
from cdc_relay.config import (
    ExactlyOnceSettings,
    FlowConfig,
    KafkaConfig,
    MetricsConfig,
    OutboxConfig,
    ReplicationConfig,
    RouterConfig,
)
from cdc_relay.decoding.pgoutput import PgOutputDecoder
from cdc_relay.decoding.pgoutput import plugin_options as pgoutput_options
from cdc_relay.decoding.wal2json import Wal2JsonDecoder
from cdc_relay.decoding.wal2json import plugin_options as wal2json_options
from cdc_relay.errors import ConfigError, ExitCode
from cdc_relay.model import Lsn
from cdc_relay.ops.metrics.endpoint import serve_wal
from cdc_relay.routing import Router
from cdc_relay.signals import install_signal_handlers
from cdc_relay.sink.base import SinkFactory
from cdc_relay.sink.kafka import kafka_sink_factory
from cdc_relay.txn_policy import TxnLimits
from cdc_relay.wal.delivery import DeliveryMode
from cdc_relay.wal.exactly_once import ExactlyOnce, ExactlyOnceConfig
from cdc_relay.wal.loop import Decoder, LoopTimings, ReplicationSource, WalRelay
from cdc_relay.wal.partitions import PartitionTree
from cdc_relay.wal.stream import ReplicationStream

log = logging.getLogger("cdc_relay")


def make_decoder(repl: ReplicationConfig, outbox: OutboxConfig, *,
                 partitioned: bool = False) -> tuple[Decoder, list[tuple[str, str]]]:
    """The decoder and START_REPLICATION options for the configured plugin.

    A partitioned outbox: pgoutput's publication publishes via the root (wal/setup.py),
    so nothing changes; wal2json streams every table and its decoder looks partitions
    up (wal/partitions.py).
    """
    decoder: Decoder
    if repl.plugin == "pgoutput":
        return PgOutputDecoder(outbox.table, outbox.columns), pgoutput_options(repl.publication)
    tree = PartitionTree(repl.dsn, outbox.table) if partitioned else None
    decoder = Wal2JsonDecoder(outbox.table, outbox.columns, tree)
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
    exactly_once: ExactlyOnceSettings | None = None


def build_wal_relay(settings: WalSettings, exactly_once: ExactlyOnceParts | None = None, *,
                    partitioned: bool = False) -> WalRelay:
    """Wire a WalRelay from settings (no I/O until ``run``)."""
    repl = settings.replication
    decoder, options = make_decoder(repl, settings.outbox, partitioned=partitioned)
    logger = logging.getLogger("cdc_relay.kafka")
    sink_factory: SinkFactory = kafka_sink_factory(settings.kafka, logger=logger)
    mode: DeliveryMode | None = None
    if exactly_once is not None:
        sink_factory, mode = exactly_once.sink_factory, exactly_once.mode

    def source_factory() -> ReplicationSource:
        return ReplicationStream(repl, options)

    return WalRelay(
        source_factory=source_factory,
        decoder=decoder,
        router=Router(settings.router, settings.outbox.table),
        sink_factory=sink_factory,
        flow=settings.flow,
        timings=LoopTimings(status_interval=repl.status_interval, reconnect_max=repl.reconnect_max),
        mode=mode,
    )


def run_wal(settings: WalSettings) -> int:
    """``cdc-relay run``: ensure the slot, stream until a signal, exit 0 after a clean stop."""
    from cdc_relay.wal.setup import ensure_replication

    stop = threading.Event()
    install_signal_handlers(stop)  # first: a SIGTERM during start-up is a clean stop too
    repl = settings.replication
    if settings.exactly_once is not None:
        check_exactly_once(settings)  # before any I/O: bad options exit 2 at once
    setup = ensure_replication(repl.dsn, settings.outbox, slot=repl.slot, plugin=repl.plugin,
                               publication=repl.publication)
    eos = None if settings.exactly_once is None else exactly_once_parts(settings)
    relay = build_wal_relay(settings, eos, partitioned=setup.partitioned)
    log.info("WAL mode: slot %s, plugin %s, table %s%s", repl.slot, repl.plugin, settings.outbox.table,
             ", exactly once" if eos else "",
             extra={"slot": repl.slot, "plugin": repl.plugin, "table": str(settings.outbox.table)})
    with serve_wal(settings.metrics, relay.stats, dsn=repl.dsn, slot=repl.slot,
                   txn=eos.mode.stats if eos else None):
        relay.run(stop)
    stats = relay.stats
    log.info("stopped: %d events published, %d dead-lettered", stats.published,
             stats.dead_lettered, extra={
                 "slot": repl.slot, "confirmed_lsn": str(Lsn(stats.confirmed_lsn)),
                 "published": stats.published, "dead_lettered": stats.dead_lettered,
                 "restarts": stats.restarts})
    return ExitCode.OK


@dataclass(frozen=True, slots=True)
class ExactlyOnceParts:
    """The transactional sink factory and the ExactlyOnce mode, built together."""

    sink_factory: SinkFactory
    mode: ExactlyOnce


def check_exactly_once(settings: WalSettings) -> None:
    """ConfigError for exactly-once settings that contradict the producer's (no I/O)."""
    from cdc_relay.sink.kafka_txn import TxnSinkConfig, transactional_config

    eos, kafka = settings.exactly_once, settings.kafka
    assert eos is not None
    if kafka.message_timeout_ms > eos.transaction_timeout_ms:
        raise ConfigError(f"--message-timeout ({kafka.message_timeout_ms} ms) must not exceed "
                          f"--transaction-timeout ({eos.transaction_timeout_ms} ms)")
    transactional_config(kafka, TxnSinkConfig("check", eos.checkpoint_topic))


def exactly_once_parts(settings: WalSettings) -> ExactlyOnceParts:
    """Identify the source (system identifier + slot) and build exactly-once's parts."""
    from cdc_relay.sink.kafka_txn import TxnSinkConfig, transactional_sink_factory
    from cdc_relay.wal.identity import system_identifier

    eos, repl, kafka = settings.exactly_once, settings.replication, settings.kafka
    assert eos is not None
    check_exactly_once(settings)
    system_id = system_identifier(repl.dsn)
    txn = TxnSinkConfig(transactional_id(system_id, repl.slot), eos.checkpoint_topic,
                        eos.transaction_timeout_ms)
    max_bytes = int(kafka.producer_config.get("message.max.bytes", "1000000"))
    mode = ExactlyOnce(ExactlyOnceConfig(
        system_id=system_id, slot=repl.slot, reset_checkpoint=eos.reset_checkpoint,
        max_message_bytes=max_bytes,
        limits=TxnLimits(interval=eos.txn_interval, max_events=eos.txn_max_events,
                         max_bytes=eos.txn_max_bytes, split_events=eos.txn_split_events)))
    log.info("exactly-once: transactional.id %s, checkpoint topic %s", txn.transactional_id,
             txn.checkpoint_topic)
    return ExactlyOnceParts(transactional_sink_factory(kafka, txn,
                                                       logger=logging.getLogger("cdc_relay.kafka")),
                            mode)
