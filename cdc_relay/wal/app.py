"""Composition root: builds the real parts from config and runs them.

The only module that knows every concrete class: it picks the decoder for the plugin,
the Kafka sink, the replication stream, installs signal handlers and starts the metrics
endpoint. Components get frozen configs from here and never read the environment.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

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
from cdc_relay.errors import ConfigError, ExitCode
from cdc_relay.model import Lsn
from cdc_relay.ops.metrics.endpoint import serve_wal
from cdc_relay.routing import Router
from cdc_relay.signals import install_signal_handlers
from cdc_relay.sink.base import SinkFactory
from cdc_relay.sink.kafka import kafka_sink_factory
from cdc_relay.wal.backfill import BackfillStats
from cdc_relay.wal.loop import Decoder, LoopTimings, ReplicationSource, WalRelay
from cdc_relay.wal.stream import ReplicationStream

log = logging.getLogger("cdc_relay")


def make_decoder(repl: ReplicationConfig, outbox: OutboxConfig) -> tuple[Decoder, list[tuple[str, str]]]:
    """The decoder and START_REPLICATION options for the configured plugin."""
    decoder: Decoder
    if repl.plugin == "pgoutput":
        return PgOutputDecoder(outbox.table, outbox.columns), pgoutput_options(repl.publication)
    decoder = Wal2JsonDecoder(outbox.table, outbox.columns)
    return decoder, wal2json_options(outbox.table)


@dataclass(frozen=True, slots=True)
class WalSettings:
    """Everything ``cdc-relay run`` needs, already validated."""

    replication: ReplicationConfig
    outbox: OutboxConfig
    router: RouterConfig
    kafka: KafkaConfig
    flow: FlowConfig = field(default_factory=FlowConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    snapshot: str = "never"  # "initial": backfill pending rows when the relay creates the slot

    def __post_init__(self) -> None:
        if self.snapshot not in ("initial", "never"):
            raise ConfigError(f"unknown --snapshot {self.snapshot!r}: use initial or never")


def build_wal_relay(settings: WalSettings, *, router: Router | None = None,
                    sink_factory: SinkFactory | None = None) -> WalRelay:
    """Wire a WalRelay from settings (no I/O until ``run``).

    ``router`` and ``sink_factory`` are shared with the backfill when one runs first.
    """
    repl = settings.replication
    decoder, options = make_decoder(repl, settings.outbox)

    def source_factory() -> ReplicationSource:
        return ReplicationStream(repl, options)

    return WalRelay(
        source_factory=source_factory,
        decoder=decoder,
        router=router or Router(settings.router, settings.outbox.table),
        sink_factory=sink_factory or kafka_sink_factory(
            settings.kafka, logger=logging.getLogger("cdc_relay.kafka")),
        flow=settings.flow,
        timings=LoopTimings(status_interval=repl.status_interval, reconnect_max=repl.reconnect_max),
    )


def run_wal(settings: WalSettings) -> int:
    """``cdc-relay run``: ensure the slot (or backfill first), stream until a signal, exit 0."""
    from cdc_relay.wal.cutover import precheck, warn_if_unfinished
    from cdc_relay.wal.setup import ensure_replication

    stop = threading.Event()
    install_signal_handlers(stop)  # first: a SIGTERM during start-up is a clean stop too
    repl = settings.replication
    router = Router(settings.router, settings.outbox.table)
    sink_factory = kafka_sink_factory(settings.kafka, logger=logging.getLogger("cdc_relay.kafka"))
    backfill = BackfillStats() if settings.snapshot == "initial" else None
    if backfill is None:
        ensure_replication(repl.dsn, settings.outbox, slot=repl.slot, plugin=repl.plugin,
                           publication=repl.publication)
        warn_if_unfinished(repl, settings.outbox)
    else:
        precheck(repl, settings.outbox)
    relay = build_wal_relay(settings, router=router, sink_factory=sink_factory)
    log.info("WAL mode: slot %s, plugin %s, table %s", repl.slot, repl.plugin, settings.outbox.table,
             extra={"slot": repl.slot, "plugin": repl.plugin, "table": str(settings.outbox.table)})
    with serve_wal(settings.metrics, relay.stats, dsn=repl.dsn, slot=repl.slot,
                   backfill=backfill):
        if backfill is not None and not _backfill_first(settings, router, sink_factory,
                                                        backfill, stop):
            return ExitCode.OK
        relay.run(stop)
    stats = relay.stats
    log.info("stopped: %d events published, %d dead-lettered", stats.published,
             stats.dead_lettered, extra={
                 "slot": repl.slot, "confirmed_lsn": str(Lsn(stats.confirmed_lsn)),
                 "published": stats.published, "dead_lettered": stats.dead_lettered,
                 "restarts": stats.restarts})
    return ExitCode.OK


def _backfill_first(settings: WalSettings, router: Router, sink_factory: SinkFactory,
                    stats: BackfillStats, stop: threading.Event) -> bool:
    """``--snapshot initial``: the backfill (if due), then the start-up check; False if stopped."""
    from cdc_relay.wal.cutover import backfill_before_streaming
    from cdc_relay.wal.setup import ensure_replication

    repl = settings.replication
    if not backfill_before_streaming(repl=repl, outbox=settings.outbox, router=router,
                                     sink_factory=sink_factory, flow=settings.flow, stats=stats,
                                     stop=stop):
        log.info("stopped during the backfill: nothing streamed")
        return False
    ensure_replication(repl.dsn, settings.outbox, slot=repl.slot, plugin=repl.plugin,
                       publication=repl.publication)
    return not stop.is_set()
