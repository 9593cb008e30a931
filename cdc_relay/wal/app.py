"""Composition root: builds the real parts from config and runs them.

The only module that knows every concrete class: it picks the decoder for the plugin,
the sink (``--sink``, through sink/factory.py), the replication stream, installs signal
handlers and starts the metrics endpoint. Components get frozen configs from here and never
read the environment.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, replace

from cdc_relay.config import (
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
from cdc_relay.errors import ExitCode
from cdc_relay.message_columns import resolve_message_columns
from cdc_relay.model import Lsn
from cdc_relay.ops.metrics.endpoint import serve_wal
from cdc_relay.routing import Router
from cdc_relay.signals import install_signal_handlers
from cdc_relay.sink.factory import OtherSink, make_sink_factory, sink_name
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
        return (PgOutputDecoder(outbox.table, outbox.columns, outbox.extra_columns),
                pgoutput_options(repl.publication))
    tree = PartitionTree(repl.dsn, outbox.table) if partitioned else None
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
    sink: OtherSink | None = None  # --sink rabbitmq|nats; None: the Kafka sink of ``kafka``


def build_wal_relay(settings: WalSettings, *, partitioned: bool = False) -> WalRelay:
    """Wire a WalRelay from settings (no I/O until ``run``)."""
    repl = settings.replication
    outbox = replace(settings.outbox, extra_columns=settings.router.extra_columns())
    decoder, options = make_decoder(repl, outbox, partitioned=partitioned)

    def source_factory() -> ReplicationSource:
        return ReplicationStream(repl, options)

    return WalRelay(
        source_factory=source_factory,
        decoder=decoder,
        router=Router(settings.router, settings.outbox.table),
        sink_factory=make_sink_factory(settings.kafka, settings.sink),
        flow=settings.flow,
        timings=LoopTimings(status_interval=repl.status_interval, reconnect_max=repl.reconnect_max),
    )


def run_wal(settings: WalSettings) -> int:
    """``cdc-relay run``: ensure the slot, stream until a signal, exit 0 after a clean stop."""
    from cdc_relay.wal.setup import ensure_replication

    stop = threading.Event()
    install_signal_handlers(stop)  # first: a SIGTERM during start-up is a clean stop too
    repl = settings.replication
    sink = sink_name(settings.sink)
    # A missing client library or bad sink settings: one line now, before touching the slot
    # (a RabbitMQ or NATS sink does no I/O until warm_up; a Kafka producer would connect).
    factory = make_sink_factory(settings.kafka, settings.sink)
    if settings.sink is not None:
        factory(lambda _delivery: None).close(0)
    setup = ensure_replication(repl.dsn, settings.outbox, slot=repl.slot, plugin=repl.plugin,
                               publication=repl.publication)
    # --header / --partition-column name real columns: a typo is one line now, exit 2.
    resolve_message_columns(repl.dsn, settings.outbox, settings.router)
    relay = build_wal_relay(settings, partitioned=setup.partitioned)
    log.info("WAL mode: slot %s, plugin %s, table %s, sink %s", repl.slot, repl.plugin,
             settings.outbox.table, sink, extra={"slot": repl.slot, "plugin": repl.plugin,
                                                 "table": str(settings.outbox.table), "sink": sink})
    with serve_wal(settings.metrics, relay.stats, dsn=repl.dsn, slot=repl.slot, sink=sink):
        relay.run(stop)
    stats = relay.stats
    log.info("stopped: %d events published, %d dead-lettered", stats.published,
             stats.dead_lettered, extra={
                 "slot": repl.slot, "confirmed_lsn": str(Lsn(stats.confirmed_lsn)),
                 "published": stats.published, "dead_lettered": stats.dead_lettered,
                 "restarts": stats.restarts, "sink": sink})
    return ExitCode.OK
