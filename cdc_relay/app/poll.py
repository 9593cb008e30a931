"""Composition root of polling mode and its admin commands (poll, dead-letters, cleanup).

Builds the real parts from frozen configs - one PollingSource and one sink (``--sink``,
through sink/factory.py) per worker, one OutboxMonitor per process, the router - checks
the outbox before starting, installs the signal handlers and runs the threads. The admin
commands are thin wrappers over polling/admin.py plus their output formatting. Must not
contain loop logic (that is polling/worker.py and threads.py) or SQL (polling/sql.py,
claims.py, admin.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

import orjson

from cdc_relay.config import KafkaConfig, MetricsConfig, OutboxConfig, PollConfig, RouterConfig
from cdc_relay.errors import ExitCode
from cdc_relay.model import human_bytes
from cdc_relay.ops.metrics.endpoint import serve_poll
from cdc_relay.pg.db import connect, dsn_database
from cdc_relay.pg.message_columns import resolve_message_columns
from cdc_relay.pg.slots import idle_logical_slots
from cdc_relay.polling import admin as polling_admin
from cdc_relay.polling.admin import DeadLetter, OutboxMonitor
from cdc_relay.polling.claims import PollingSource
from cdc_relay.polling.settlement import BackoffPolicy
from cdc_relay.polling.threads import Waker, monitor_loop, run_threads
from cdc_relay.polling.worker import PollerSettings, PollWorker
from cdc_relay.routing import Router
from cdc_relay.signals import install_signal_handlers
from cdc_relay.sink.base import ignore_reports
from cdc_relay.sink.factory import OtherSink, make_sink_factory, sink_name
from cdc_relay.startup import until_reachable
from cdc_relay.stats import PollStats
from cdc_relay.text import shorten

log = logging.getLogger("cdc_relay")

# Added to the producer's message timeout: librdkafka reports a timed-out message itself;
# the poller's own deadline is only a backstop.
_DELIVERY_MARGIN = 10.0


@dataclass(frozen=True, slots=True)
class PollSettings:
    """Everything ``cdc-relay poll`` needs, already validated."""

    poll: PollConfig
    outbox: OutboxConfig
    router: RouterConfig
    kafka: KafkaConfig
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    sink: OtherSink | None = None  # --sink other than kafka; None: the Kafka sink of ``kafka``


def poller_settings(settings: PollSettings) -> PollerSettings:
    """The worker settings: PollConfig plus the producer's effective message timeout."""
    poll, kafka = settings.poll, settings.kafka
    timeout_ms = kafka.producer_config.get("message.timeout.ms", str(kafka.message_timeout_ms))
    if settings.sink is not None:
        timeout_ms = str(settings.sink.message_timeout_ms)
    try:
        message_timeout = int(timeout_ms) / 1000
    except ValueError:
        message_timeout = kafka.message_timeout_ms / 1000  # librdkafka will refuse it anyway
    return PollerSettings(
        batch_size=poll.batch_size,
        interval=poll.interval,
        max_attempts=poll.max_attempts,
        backoff=BackoffPolicy(base=poll.backoff_base, maximum=poll.backoff_max),
        strict_order=poll.strict_order,
        pipeline=poll.pipeline,
        delivery_timeout=message_timeout + _DELIVERY_MARGIN,
    )


def build_pollers(settings: PollSettings, stats: PollStats, waker: Waker) -> list[PollWorker]:
    """One worker per ``--workers``, each with its own connection and sink (no I/O yet)."""
    router = Router(settings.router, settings.outbox.table,
                    database=dsn_database(settings.poll.dsn))
    sink_factory = make_sink_factory(settings.kafka, settings.sink)
    worker_settings = poller_settings(settings)
    return [
        PollWorker(
            source=PollingSource(settings.poll.dsn, settings.outbox,
                                 application_name=f"cdc-relay poll {n}"),
            router=router, sink_factory=sink_factory, settings=worker_settings,
            waker=waker, stats=stats,
        )
        for n in range(settings.poll.workers)
    ]


def run_poll(settings: PollSettings, stats: PollStats | None = None,
             stop: threading.Event | None = None) -> int:
    """``cdc-relay poll``: check the outbox, poll until a signal, exit 0 after a clean stop."""
    poll = settings.poll
    stats = stats or PollStats()
    if stop is None:  # first: a SIGTERM during start-up is a clean stop too
        stop = threading.Event()
        install_signal_handlers(stop)
    monitor = OutboxMonitor(poll.dsn, settings.outbox, listen=poll.notify)

    def checks() -> PollSettings:
        monitor.check()  # a missing table or column is a one-line error now, not a retry loop
        warn_unread_slots(poll.dsn)
        warn_without_trigger(settings)
        # The --header / --partition-column columns, and the trace columns the table has.
        return replace(settings, outbox=resolve_message_columns(poll.dsn, settings.outbox,
                                                                settings.router))

    # An unreachable PostgreSQL is waited for, as mid-run (cdc_relay/startup.py).
    checked = until_reachable(checks, stop)
    if checked is None:
        return ExitCode.OK
    settings = checked
    sink = sink_name(settings.sink)
    # A missing client library or a bad --producer-config: one line now, not per worker later.
    make_sink_factory(settings.kafka, settings.sink)(ignore_reports).close(0)
    waker = Waker()
    workers = build_pollers(settings, stats, waker)
    if stop.is_set():  # stopped during start-up: nothing was claimed
        return ExitCode.OK
    log.info("polling mode: table %s, sink %s, %d worker(s), batch %d, interval %.3gs, max "
             "attempts %d%s%s%s", settings.outbox.table, sink, poll.workers, poll.batch_size,
             poll.interval, poll.max_attempts, "" if poll.notify else ", no NOTIFY",
             ", strict order" if poll.strict_order else "",
             "" if poll.pipeline else ", no pipeline", extra={"sink": sink})

    def watch(stop_: threading.Event) -> None:
        monitor_loop(monitor, waker, stats, stop_, listen=poll.notify)

    targets: list[tuple[str, Callable[[threading.Event], None]]] = [("poll-monitor", watch)]
    targets += [(f"poller-{n}", worker.run) for n, worker in enumerate(workers)]
    with serve_poll(settings.metrics, stats, interval=poll.interval, sink=sink):
        run_threads(targets, stop, waker)
    log.info("stopped; %d events published, %d dead-lettered", stats.published, stats.dead_lettered,
             extra={"published": stats.published, "dead_lettered": stats.dead_lettered})
    return ExitCode.OK


def warn_without_trigger(settings: PollSettings) -> None:
    """Without the NOTIFY trigger pollers wake only every --interval: say so, with the fix."""
    poll = settings.poll
    if poll.notify and not polling_admin.has_notify_trigger(poll.dsn, settings.outbox):
        log.warning("table %s has no NOTIFY trigger (a WAL-mode init does not install it): "
                    "pollers wake only every --interval (%.3gs). Fix: cdc-relay init --mode "
                    "poll (or pass --no-notify if this is meant)", settings.outbox.table,
                    poll.interval, extra={"table": str(settings.outbox.table)})


def warn_unread_slots(dsn: str) -> None:
    """Warn about each inactive logical slot of the database: nothing in polling mode reads it."""
    with connect(dsn, autocommit=True, application_name="cdc-relay") as conn:
        idle = idle_logical_slots(conn)
    for slot in idle:
        name, plugin, retained = slot.name, slot.plugin or "", slot.retained_bytes or 0
        log.warning("replication slot %s (%s) is inactive and retains %s of WAL, more with every "
                    "write until the disk is full: polling mode does not read it. Drop it "
                    "(cdc-relay slot drop --slot %s) unless a WAL-mode relay will use it",
                    name, plugin, human_bytes(retained), name,
                    extra={"slot": name, "retained_bytes": retained})


# ---------------------------------------------------------------- admin commands

def list_dead_letters(dsn: str, outbox: OutboxConfig, limit: int) -> list[DeadLetter]:
    """The dead letters of the outbox, oldest first."""
    return polling_admin.list_dead_letters(dsn, outbox, limit)


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def dead_letters_json(rows: Sequence[DeadLetter]) -> str:
    """A JSON array, one object per dead letter, timestamps in ISO 8601."""
    return orjson.dumps([
        {
            "id": row.id,
            "aggregate_type": row.aggregate_type,
            "aggregate_id": row.aggregate_id,
            "event_type": row.event_type,
            "attempts": row.attempts,
            "last_error": row.last_error,
            "created_at": _iso(row.created_at),
            "dead_lettered_at": _iso(row.dead_lettered_at),
        }
        for row in rows
    ], option=orjson.OPT_INDENT_2).decode()


_TABLE_COLUMNS = ("id", "aggregate", "event_type", "attempts", "dead_lettered_at", "last_error")
_ERROR_WIDTH = 80


def dead_letters_table(rows: Sequence[DeadLetter]) -> str:
    """A plain-text table for people; ``last_error`` is cut to one short line."""
    if not rows:
        return "no dead letters"
    lines = [
        (
            row.id,
            f"{row.aggregate_type}/{row.aggregate_id}",
            row.event_type,
            str(row.attempts),
            row.dead_lettered_at.strftime("%Y-%m-%d %H:%M:%S%z"),
            shorten(row.last_error or "", _ERROR_WIDTH),
        )
        for row in rows
    ]
    widths = [max(len(header), *(len(line[i]) for line in lines))
              for i, header in enumerate(_TABLE_COLUMNS)]
    out = ["  ".join(h.ljust(w) for h, w in zip(_TABLE_COLUMNS, widths, strict=True)).rstrip()]
    out += ["  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip()
            for line in lines]
    return "\n".join(out)


@dataclass(frozen=True, slots=True)
class RetryReport:
    """What ``dead-letters retry`` did."""

    requeued: list[str]
    not_found: list[str]

    def __str__(self) -> str:
        text = f"requeued {len(self.requeued)} dead letter(s)"
        if self.not_found:
            text += "; not dead letters (unknown, pending or already requeued): " + ", ".join(
                self.not_found)
        return text


def retry_dead_letters(dsn: str, outbox: OutboxConfig, ids: Sequence[str] | None) -> RetryReport:
    """Requeue the given dead letters (all with ``ids=None``) and wake the pollers."""
    requeued = polling_admin.retry_dead_letters(dsn, outbox, ids)
    wanted = [i.lower() for i in ids or ()]
    done = set(requeued)
    return RetryReport(requeued, [i for i in wanted if i not in done])


def cleanup(dsn: str, outbox: OutboxConfig, older_than: float, batch: int, *,
            wal_mode: bool = False) -> int:
    """Delete processed rows (every row, with ``wal_mode``) older than ``older_than`` s."""
    return polling_admin.cleanup(dsn, outbox, older_than, batch, wal_mode=wal_mode)
