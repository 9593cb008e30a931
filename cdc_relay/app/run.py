"""Composition root of ``run`` (WAL mode): builds the real parts from config and runs them.

The only module that knows every concrete class: it picks the decoder for the plugin,
the sink (``--sink``, through sink/factory.py), the replication stream, installs signal
handlers and starts the metrics endpoint. Components get frozen configs from here and never
read the environment.

Start-up order matters here (docs/design.md, WAL mode, start-up): importing this module
(and cli/main.py) loads no psycopg, so ``run_wal`` has the first producer warming up
before the PostgreSQL side is imported (psycopg alone takes ~0.1 s), and the modules of
other paths (exactly-once, the backfill, the plugin not in use, metrics) are imported
only when used. Keep PostgreSQL-side imports inside the functions that need them:
tests/unit/test_purity.py checks the module level.
"""

from __future__ import annotations

import logging
import threading
from contextlib import AbstractContextManager, closing, nullcontext
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from cdc_relay.app.incremental import build_snapshots, signal_table
from cdc_relay.app.wal_settings import WalSettings, make_decoder
from cdc_relay.app.wal_startup import (
    relayed_outbox,
    standby_pair,
    startup_checks_retried,
    writer_connection,
)
from cdc_relay.config import (
    MetricsConfig,
)
from cdc_relay.errors import (
    ConfigError,
    ExitCode,
    RelayError,
    SlotLost,
)
from cdc_relay.model import Lsn
from cdc_relay.routing import Router
from cdc_relay.signals import install_signal_handlers
from cdc_relay.sink.base import SinkFactory, ignore_reports
from cdc_relay.sink.factory import make_sink_factory, sink_name
from cdc_relay.stats import RelayStats
from cdc_relay.wal.stream.delivery import DeliveryMode
from cdc_relay.wal.stream.loop import SinkWarmUp, WalRelay
from cdc_relay.wal.stream.session import LoopTimings, ReplicationSource

if TYPE_CHECKING:
    import psycopg

    from cdc_relay.app.capture import CaptureSetup
    from cdc_relay.wal.exactly_once.mode import ExactlyOnce

log = logging.getLogger("cdc_relay")


def build_wal_relay(settings: WalSettings, *, partitioned: bool = False,
                    router: Router | None = None, sink_factory: SinkFactory | None = None,
                    stats: RelayStats | None = None,
                    exactly_once: ExactlyOnceParts | None = None,
                    first_sink: SinkWarmUp | None = None,
                    position_conn: psycopg.Connection[Any] | None = None,
                    capture: CaptureSetup | None = None) -> WalRelay:
    """Wire a WalRelay from settings (no I/O until ``run``).

    ``router``, ``sink_factory`` and ``stats`` are shared with a backfill that runs first;
    ``exactly_once`` brings the transactional sink factory and the delivery mode;
    ``first_sink`` is a producer warming up already (the first session takes it);
    ``position_conn`` is the start-up checks' connection, still open: the first
    replication stream reads the slot's held position on it and closes it.
    """
    from cdc_relay.wal.stream.replication import ReplicationStream

    mode: DeliveryMode | None = None
    if exactly_once is not None:
        sink_factory, mode = exactly_once.sink_factory, exactly_once.mode
    repl = settings.replication
    outbox = replace(settings.outbox, extra_columns=settings.router.extra_columns())
    decoder, options = make_decoder(repl, outbox, partitioned=partitioned)
    capture_router = snapshots = None
    stats = stats or RelayStats()
    if settings.capture is not None and capture is not None:
        from cdc_relay.app.capture import (
            capture_decoder,
            make_capture_router,
            type_modes,
            with_schemas,
        )

        if repl.plugin == "wal2json":
            from cdc_relay.app.capture import wal2json_capture_options

            options = wal2json_capture_options(settings.capture, outbox.table, capture,
                                               partitioned=partitioned)
        decoder = capture_decoder(decoder, settings.capture, settings.router, repl.dsn, capture)
        capture_router = make_capture_router(settings.capture, repl.dsn)
        if capture.signal is not None and mode is not None:
            # A chunk is read outside the WAL: a replay cannot count it (docs/table-cdc.md).
            log.warning("incremental snapshots are off with --exactly-once: a snapshot "
                        "signal is ignored (docs/table-cdc.md, incremental snapshots)")
        elif capture.signal is not None:  # incremental snapshots (app/incremental.py)
            snapshots = build_snapshots(settings.capture, dsn=repl.dsn, slot=repl.slot,
                                        primary_dsn=repl.primary_dsn,
                                        signal=capture.signal, stats=stats,
                                        schemas=with_schemas(settings.router.message_format),
                                        modes=type_modes(settings.capture))

    def source_factory() -> ReplicationSource:
        nonlocal position_conn  # the first stream takes it
        conn, position_conn = position_conn, None
        return ReplicationStream(repl, options, position_conn=conn)

    return WalRelay(
        source_factory=source_factory,
        decoder=decoder,
        router=router or _router(settings),
        sink_factory=sink_factory or make_sink_factory(settings.kafka, settings.sink),
        flow=settings.flow,
        timings=LoopTimings(status_interval=repl.status_interval, reconnect_max=repl.reconnect_max,
                            replication_timeout=repl.replication_timeout),
        stats=stats,
        mode=mode,
        first_sink=first_sink,
        capture=capture_router,
        snapshots=snapshots,
    )


def run_wal(settings: WalSettings) -> int:
    """``cdc-relay run``: ensure the slot (or backfill first), stream until a signal, exit 0.

    A slot loss (wal/slot/continuity.py) stops with exit 7 and the recovery command, or, with
    ``--on-slot-loss recover``, is recovered (wal/recovery.py) and streaming goes on.
    """
    stop = threading.Event()
    install_signal_handlers(stop)  # first: a SIGTERM during start-up is a clean stop too
    recovered = Republished("by the slot's recovery")  # counted into the stop line
    while True:
        try:
            return _run_wal_once(settings, stop, recovered)
        except SlotLost as exc:
            if str(exc) == _UNFINISHED:
                log.warning("%s: finishing it before streaming", exc)
            elif settings.replication.on_slot_loss != "recover":
                raise _explained(exc, settings) from None
            else:
                log.warning("%s; recovering (--on-slot-loss recover)", exc)
        if not _recover(settings, stop, recovered):
            log.info("stopped during the recovery: nothing streamed; %d rows republished, "
                     "%d dead-lettered", recovered.published, recovered.dead_lettered,
                     extra={"republished": recovered.published})
            return ExitCode.OK


_UNFINISHED = "a recovery of the slot did not finish"


def _explained(exc: SlotLost, settings: WalSettings) -> SlotLost:
    """The loss as the stream saw it, with what the slot's record adds and the command."""
    from cdc_relay.pg.db import connect
    from cdc_relay.wal.slot import continuity

    if "Recover" in str(exc):
        return exc  # already explained at start-up
    record = None
    try:
        repl = settings.replication
        with connect(repl.primary_dsn or repl.dsn, autocommit=True) as conn:
            record = continuity.read_record(conn, settings.outbox.table.schema,
                                            settings.replication.slot)
    except RelayError as read_failed:
        log.debug("cannot read the slot's record: %s", read_failed)
    return continuity.slot_lost(str(exc), record)


def _recover(settings: WalSettings, stop: threading.Event, recovered: Republished) -> bool:
    """Run the recovery (or finish one), with the relay's router and sink; False if stopped.
    What it published is added to ``recovered``."""
    from cdc_relay.pg.message_columns import resolve_message_columns
    from cdc_relay.wal.backfill.loop import BackfillStats
    from cdc_relay.wal.recovery import recover

    repl = settings.replication
    outbox = resolve_message_columns(repl.dsn, settings.outbox, settings.router)
    settings = replace(settings, outbox=outbox)
    stats = BackfillStats()
    try:
        return recover(repl=repl, outbox=outbox, router=_router(settings),
                       sink_factory=make_sink_factory(settings.kafka, settings.sink),
                       flow=settings.flow, stats=stats, stop=stop)
    finally:
        recovered.add(stats.published, stats.dead_lettered)


def _run_wal_once(settings: WalSettings, stop: threading.Event, recovered: Republished) -> int:
    """Start-up (retrying an unreachable PostgreSQL), then stream; SlotLost leaves as is."""
    repl = settings.replication
    # A missing client library or bad sink settings: one line now, before touching the slot.
    factory = make_sink_factory(settings.kafka, settings.sink)
    warm = None
    if settings.snapshot != "initial" and settings.exactly_once is None:
        # The first producer warms up (connects, gets its producer id) on a thread while
        # the PostgreSQL side is imported and its checks below run: the relay's first
        # session takes it.
        warm = SinkWarmUp(factory(ignore_reports), stop, timeout=LoopTimings().sink_warmup)
    elif settings.sink is not None:  # a RabbitMQ or NATS sink does no I/O until warm_up
        factory(ignore_reports).close(0)
    checks_conn = None
    relay = None
    try:
        # Only now the PostgreSQL side is imported (see the module docstring).
        if settings.snapshot == "initial":
            from cdc_relay.pg.message_columns import resolve_message_columns
            from cdc_relay.wal.backfill.cutover import precheck

            with_outbox = settings.capture is None or settings.capture.outbox
            if repl.primary_dsn is not None:  # the standby and its primary, said first
                from cdc_relay.pg.db import connect

                with connect(repl.dsn, autocommit=True) as standby:
                    standby_pair(standby, repl).close()
            precheck(repl, settings.outbox, outbox_rows=with_outbox)  # before anything is touched
            # The backfill reads the carried columns (and the trace columns the table has).
            return _backfill_then_stream(replace(settings, outbox=resolve_message_columns(
                repl.dsn, settings.outbox, settings.router)), stop)
        if settings.exactly_once is not None:
            check_exactly_once(settings)  # before any I/O: bad options exit 2 at once
        checked = startup_checks_retried(settings, stop)
        if checked is None:
            return ExitCode.OK  # stopped while PostgreSQL was unreachable
        settings, partitioned, checks_conn, recovering, captured = checked
        if recovering:  # a recovery stopped half-way: finish it before streaming
            raise SlotLost(_UNFINISHED)
        eos = None if settings.exactly_once is None else exactly_once_parts(settings)
        relay = build_wal_relay(settings, partitioned=partitioned, exactly_once=eos,
                                sink_factory=factory, first_sink=warm, position_conn=checks_conn,
                                capture=captured)
    finally:
        if relay is None:  # start-up ended here: nothing takes them
            if warm is not None:
                warm.cancel()
            if checks_conn is not None:
                checks_conn.close()
    _log_start(settings)
    # The first stream takes the checks' connection and closes it after one query;
    # closing() only closes it for a relay stopped before it streamed.
    with closing(checks_conn), _serve_metrics(
            settings.metrics, relay.stats, dsn=repl.dsn, slot=repl.slot,
            sink=sink_name(settings.sink), txn=eos.mode.stats if eos else None), \
            _horizon(settings, relay.stats):
        relay.run(stop)
    return _stopped(relay.stats, repl.slot, sink_name(settings.sink), recovered)


def _horizon(settings: WalSettings, stats: RelayStats) -> AbstractContextManager[object]:
    """The thread that moves the slot's recorded horizon forward (wal/slot/continuity.py)."""
    from cdc_relay.wal.slot.continuity import HorizonRecorder

    repl = settings.replication
    if repl.primary_dsn is not None:  # decoding on a standby: the primary's record, heartbeats
        return HorizonRecorder(repl.primary_dsn, settings.outbox.table.schema, repl.slot,
                               lambda: stats.confirmed_lsn, heartbeat=True)
    return HorizonRecorder(repl.dsn, settings.outbox.table.schema, repl.slot,
                           lambda: stats.confirmed_lsn)


def _serve_metrics(config: MetricsConfig, stats: RelayStats, **kwargs: Any
                   ) -> AbstractContextManager[object]:
    """``serve_wal``, imported only when metrics are served (prometheus_client and
    http.server cost start-up time otherwise)."""
    if config.port is None:
        return nullcontext()
    from cdc_relay.ops.metrics.endpoint import serve_wal

    return serve_wal(config, stats, **kwargs)


def _backfill_then_stream(settings: WalSettings, stop: threading.Event) -> int:
    """``--snapshot initial``: the backfill (if due), then the start-up check, then stream."""
    from cdc_relay.wal.backfill.cutover import backfill_before_streaming
    from cdc_relay.wal.backfill.loop import BackfillStats
    from cdc_relay.wal.slot.setup import ensure_replication

    repl = settings.replication
    router = _router(settings)
    sink_factory = make_sink_factory(settings.kafka, settings.sink)
    stats, backfill = RelayStats(), BackfillStats()
    captured = tables = None
    if settings.capture is not None:
        from cdc_relay.app.capture import capture_snapshot

        captured, tables = capture_snapshot(settings.capture, settings.router, repl,
                                            (router, sink_factory, settings.flow, backfill),
                                            stats.captured,
                                            signal_table(settings.capture, settings.outbox.table),
                                            relayed_outbox(settings))
    _log_start(settings)
    with _serve_metrics(settings.metrics, stats, dsn=repl.dsn, slot=repl.slot, backfill=backfill,
                        sink=sink_name(settings.sink)):
        if not backfill_before_streaming(repl=repl, outbox=settings.outbox, router=router,
                                         sink_factory=sink_factory, flow=settings.flow,
                                         stats=backfill, stop=stop, tables=tables):
            log.info("stopped during the backfill: nothing streamed")
            return ExitCode.OK
        partitioned = False
        if tables is None or tables.with_outbox:
            with writer_connection(repl) as writer:
                partitioned = ensure_replication(
                    repl.dsn, settings.outbox, slot=repl.slot, plugin=repl.plugin,
                    publication=repl.publication, failover=repl.failover_slot, writer=writer,
                    primary_dsn=repl.primary_dsn).partitioned
        relay = build_wal_relay(settings, partitioned=partitioned, router=router,
                                sink_factory=sink_factory, stats=stats, capture=captured)
        # Decoding on a standby: the heartbeat that moves the slot, and the horizon.
        with _horizon(settings, stats) if repl.primary_dsn is not None else nullcontext():
            relay.run(stop)
    return _stopped(stats, repl.slot, sink_name(settings.sink),
                    Republished("by the backfill", backfill.published, backfill.dead_lettered))


def _log_start(settings: WalSettings) -> None:
    repl, sink = settings.replication, sink_name(settings.sink)
    log.info("WAL mode: slot %s, plugin %s, table %s, sink %s%s", repl.slot, repl.plugin,
             settings.outbox.table, sink, ", exactly once" if settings.exactly_once else "",
             extra={"slot": repl.slot, "plugin": repl.plugin, "table": str(settings.outbox.table),
                    "snapshot": settings.snapshot, "sink": sink})


def _router(settings: WalSettings) -> Router:
    """The router (compiled where accel.py's choice and its configuration allow)."""
    from cdc_relay.pg.db import dsn_database  # psycopg: imported here, after the warm-up began

    return Router(settings.router, settings.outbox.table,
                  database=dsn_database(settings.replication.dsn))


@dataclass(slots=True)
class Republished:
    """What a backfill or a slot's recovery published before streaming, for the stop line."""

    how: str  # "by the backfill", "by the slot's recovery"
    published: int = 0
    dead_lettered: int = 0

    def add(self, published: int, dead_lettered: int) -> None:
        self.published += published
        self.dead_lettered += dead_lettered


def _stopped(stats: RelayStats, slot: str, sink: str, before: Republished | None = None) -> int:
    """The stop line: every event published in this run, the stream's and those published
    ``before`` it (a backfill's, a recovery's republished rows)."""
    earlier = before.published if before is not None else 0
    published = stats.published + earlier
    dead = stats.dead_lettered + (before.dead_lettered if before is not None else 0)
    how = f" ({earlier} of them {before.how})" if before is not None and earlier else ""
    log.info("stopped: %d events published%s, %d dead-lettered", published, how, dead, extra={
        "slot": slot, "confirmed_lsn": str(Lsn(stats.confirmed_lsn)), "published": published,
        "republished": earlier, "dead_lettered": dead, "restarts": stats.restarts, "sink": sink})
    return ExitCode.OK


@dataclass(frozen=True, slots=True)
class ExactlyOnceParts:
    """The transactional sink factory and the ExactlyOnce mode, built together."""

    sink_factory: SinkFactory
    mode: ExactlyOnce


def check_exactly_once(settings: WalSettings) -> None:
    """ConfigError for exactly-once settings that contradict the producer's (no I/O)."""
    from cdc_relay.sink.kafka.txn import TxnSinkSettings, transactional_config

    eos, kafka = settings.exactly_once, settings.kafka
    assert eos is not None
    if kafka.message_timeout_ms > eos.transaction_timeout_ms:
        raise ConfigError(f"--message-timeout ({kafka.message_timeout_ms} ms) must not exceed "
                          f"--transaction-timeout ({eos.transaction_timeout_ms} ms)")
    transactional_config(kafka, TxnSinkSettings("check", eos.checkpoint_topic))


def exactly_once_parts(settings: WalSettings) -> ExactlyOnceParts:
    """Identify the source (system identifier + slot) and build exactly-once's parts."""
    from cdc_relay.pg.identity import system_identifier
    from cdc_relay.sink.kafka.txn import TxnSinkSettings, transactional_sink_factory
    from cdc_relay.wal.exactly_once.checkpoint import transactional_id
    from cdc_relay.wal.exactly_once.mode import ExactlyOnce, ExactlyOnceSettings

    eos, repl, kafka = settings.exactly_once, settings.replication, settings.kafka
    assert eos is not None
    check_exactly_once(settings)
    system_id = system_identifier(repl.dsn)
    txn = TxnSinkSettings(transactional_id(system_id, repl.slot), eos.checkpoint_topic,
                        eos.transaction_timeout_ms)
    max_bytes = int(kafka.producer_config.get("message.max.bytes", "1000000"))
    mode = ExactlyOnce(ExactlyOnceSettings(
        system_id=system_id, slot=repl.slot, reset_checkpoint=eos.reset_checkpoint,
        max_message_bytes=max_bytes, limits=eos.limits))
    log.info("exactly-once: transactional.id %s, checkpoint topic %s", txn.transactional_id,
             txn.checkpoint_topic)
    from cdc_relay.sink.factory import with_schema_registry

    logger = logging.getLogger("cdc_relay.kafka")
    # A registry format encodes before the transactional produce: a registry outage is a
    # failed produce, which replaces the producer and replays from the checkpoint.
    factory = with_schema_registry(transactional_sink_factory(kafka, txn, logger=logger), kafka,
                                   logger)
    return ExactlyOnceParts(factory, mode)
