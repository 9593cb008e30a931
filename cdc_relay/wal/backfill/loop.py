"""The backfill's publishing loop: rows of a snapshot → router → sink; every ack → marked processed.

The rows come from a ``RowSource`` (backfill/rows.py SnapshotReader: a server-side cursor
over the pending rows of one snapshot) and go through the same Router, Sink and delivery
engine (delivery/engine.py) as streaming, so the messages and the failure rules are
identical. Rows are numbered in cursor order (fixed within one snapshot), and a row's
ordinal is its token: a ``Watermark`` of acknowledged ordinals (delivery/watermark.py,
as the AckTracker keeps it for LSNs) is the delivery accounting. Acknowledged rows are
handed to ``MarkProcessed`` (backfill/rows.py RowMarker) in batches. Memory is bounded: at
most ``max_inflight_events`` rows are unacknowledged.

Failures are the engine's (docs/design.md, failure rules): a message refused for good
goes to the dead-letter topic (then its row counts as done); a dead letter refused too
stops the relay (DeadLetterRefused); a fatal producer error or a timed-out message
discards the producer and the backfill resumes, with a new one (delivery/producer.py)
after a ``Backoff``, at the watermark of the same snapshot (only the rows
unacknowledged at the failure are sent again).

Must not: do I/O of its own, create slots, take locks or decide whether a backfill is
needed (backfill/cutover.py), stream from the slot, or confirm any LSN: the slot is not
read until the backfill is done.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Protocol

from cdc_relay.backoff import Backoff
from cdc_relay.config import FlowConfig
from cdc_relay.delivery.engine import Engine, ProducerFailed
from cdc_relay.delivery.producer import new_producer
from cdc_relay.delivery.watermark import Watermark
from cdc_relay.errors import DeadLetterRefused
from cdc_relay.routing import Router
from cdc_relay.sink.base import SinkFactory, ignore_reports

log = logging.getLogger("cdc_relay.backfill")

_MARK_BATCH = 2000  # acked rows marked processed per UPDATE


@dataclass
class BackfillStats:
    """Plain counters for the progress line, ``/metrics`` and the state row."""

    running: bool = False
    finished: bool = False
    rows_total: int = 0
    rows_done: int = 0
    dead_lettered: int = 0
    rate: float = 0.0  # rows acknowledged per second since the backfill started
    snapshot_age: float = 0.0  # seconds the reading transaction (its xmin) has been held
    snapshot_xmin: int | None = None  # the read snapshot's xmin (a recovery's new horizon)
    published: int = 0  # rows acknowledged on their own topic (the engine's count)
    failed_by_type: dict[str, int] = field(default_factory=dict)  # failed deliveries


@dataclass(frozen=True, slots=True)
class BackfillTimings:
    progress_interval: float = 2.0
    mark_interval: float = 0.5
    sink_warmup: float = 10.0
    delivery_timeout: float = 40.0  # > message.timeout.ms: librdkafka reports first
    shutdown_timeout: float = 25.0
    retry_min: float = 0.5
    retry_max: float = 30.0


class RowSource(Protocol):
    """The pending rows of one snapshot, in a fixed order (SnapshotReader)."""

    pid: int

    def rows(self, offset: int) -> Generator[tuple[Any, Any], None, None]: ...


class ProgressStore(Protocol):
    """Where progress is recorded (backfill/state.py StateStore)."""

    def progress(self, rows_done: int) -> None: ...
    def snapshot_age(self, reader_pid: int) -> tuple[float, int] | None: ...


class MarkProcessed(Protocol):
    """Sets ``processed_at`` on acknowledged rows (RowMarker)."""

    def __call__(self, raw_ids: list[Any]) -> None: ...
    def drain(self) -> None: ...


class Backfill:
    """Publishes a SnapshotReader's rows through the router and sink; see the module docstring."""

    def __init__(self, *, reader: RowSource, store: ProgressStore, mark: MarkProcessed,
                 router: Router, sink_factory: SinkFactory, flow: FlowConfig,
                 timings: BackfillTimings, stats: BackfillStats,
                 clock: Callable[[], float] = time.monotonic,
                 send: Callable[[Engine, int, Any], None] | None = None) -> None:
        """``send(engine, ordinal, row)``: how a row is produced (default: an outbox row
        through the router, ``engine.send``; a captured table's snapshot row: tables.py)."""
        self._reader = reader
        self._send = send
        self._store = store
        self._mark = mark
        self._router = router
        self._sink_factory = sink_factory
        self._flow = flow
        self._timings = timings
        self.stats = stats
        self._clock = clock
        self._watermark = Watermark()  # of row ordinals, each row's token
        self._raw_ids: dict[int, Any] = {}  # ordinal -> raw id, of the rows in flight
        self._marks: list[Any] = []  # raw ids acknowledged, not yet marked processed
        self._backoff = Backoff(timings.retry_min, timings.retry_max)
        self._engine: Engine | None = None  # the current producer's
        self._started = 0.0
        self._next_mark = self._next_progress = 0.0

    def run(self, stop: threading.Event) -> bool:
        """Publish every pending row; True once all are acked and marked, False if stopped."""
        self._started = self._clock()
        self.stats.running = True
        try:
            while not stop.is_set():
                try:
                    if self._run_producer(stop):
                        self._flush_marks(force=True)
                        self.stats.finished = True
                        return True
                    break
                except ProducerFailed as exc:
                    delay = self._backoff.next_delay()
                    log.warning("%s; resuming the backfill at row %d with a new producer in "
                                "%.1fs", exc, self._watermark.low, delay)
                    self._raw_ids.clear()
                    stop.wait(delay)
                except DeadLetterRefused:
                    self._flush_marks(force=True)  # what was acknowledged stays done
                    raise
            self._flush_marks(force=True)
            return False
        finally:
            self.stats.running = False
            self._progress(force=True)

    def _run_producer(self, stop: threading.Event) -> bool:
        """Publish with one producer until done (True), stopped (False) or it failed."""
        sink = new_producer(self._sink_factory, warmup=self._timings.sink_warmup,
                            clock=self._clock, stopped=stop.is_set)
        if sink is None:
            return False  # stopped while warming up
        engine = Engine(sink, self._router, self.stats, self._acked, serve=self._chores,
                        logger=log)
        sink.set_handler(engine.on_delivery, engine.on_delivered)
        self._engine = engine
        try:
            return self._publish_all(engine, stop)
        except ProducerFailed:
            sink.set_handler(ignore_reports)  # a discarded producer's reports count no more
            raise
        finally:
            sink.close(1.0)  # otherwise what it still reports is acknowledged (and marked)

    def _publish_all(self, engine: Engine, stop: threading.Event) -> bool:
        limit = self._flow.max_inflight_events
        watermark, raw_ids, inflight = self._watermark, self._raw_ids, engine.inflight
        send = self._send
        watermark.rewind()  # resume at the watermark: only what is unacknowledged again
        rows = self._reader.rows(watermark.low)
        try:
            for raw_id, event in rows:
                ordinal = watermark.produced()
                if watermark.acknowledged(ordinal):
                    continue  # acknowledged before the producer was replaced
                while len(inflight) >= limit:
                    engine.sink.poll(0.05)
                    self._tick(engine)
                raw_ids[ordinal] = raw_id
                if send is None:
                    engine.send(ordinal, event)
                else:
                    send(engine, ordinal, event)
                if not ordinal % 256:
                    engine.sink.poll(0)
                    self._tick(engine)
                if stop.is_set():
                    self._await_acks(engine, self._timings.shutdown_timeout, fail=False)
                    return False
        finally:
            rows.close()  # the server-side cursor, before a retry opens another
        self._await_acks(engine, self._timings.delivery_timeout, fail=True)
        return True

    def _acked(self, ordinals: list[int]) -> None:
        """The engine's successes: the watermark moves, the rows wait to be marked."""
        self._watermark.delivered_all(ordinals)
        raw_ids = self._raw_ids
        self._marks.extend(raw_ids.pop(ordinal) for ordinal in ordinals)

    def _tick(self, engine: Engine) -> None:
        """Between produces: fail fast, then the chores."""
        engine.check()
        self._chores()

    def _chores(self) -> None:
        """Re-send dead letters, mark, report progress (also while the queue is full)."""
        if self._engine is not None:
            self._engine.produce_redo()
        self._flush_marks()
        self._progress()

    def _await_acks(self, engine: Engine, timeout: float, *, fail: bool) -> None:
        deadline = self._clock() + timeout
        while engine.inflight or engine.redo:
            if self._clock() > deadline:
                if fail:
                    raise ProducerFailed(f"{len(engine.inflight)} messages unacknowledged "
                                         f"after {timeout:.0f}s")
                return
            engine.sink.poll(0.1)
            self._tick(engine)

    def _flush_marks(self, *, force: bool = False) -> None:
        now = self._clock()
        if not force and (not self._marks or (len(self._marks) < _MARK_BATCH
                                               and now < self._next_mark)):
            return
        while self._marks:
            batch, self._marks = self._marks[:_MARK_BATCH], self._marks[_MARK_BATCH:]
            self._mark(batch)
        if force:
            self._mark.drain()
        # Every acknowledged row is marked now: the state row's count says so (status).
        self.stats.rows_done = self._watermark.delivered_count
        self._store.progress(self.stats.rows_done)
        self._next_mark = now + self._timings.mark_interval

    def _progress(self, *, force: bool = False) -> None:
        now = self._clock()
        if not force and now < self._next_progress:
            return
        self._next_progress = now + self._timings.progress_interval
        stats = self.stats
        stats.rows_done = self._watermark.delivered_count
        elapsed = max(now - self._started, 1e-9)
        stats.rate = stats.rows_done / elapsed
        self._store.progress(stats.rows_done)
        age = self._store.snapshot_age(self._reader.pid)
        held = ""
        if age is not None:
            stats.snapshot_age = age[0]
            held = (f"; snapshot held {age[0]:.0f}s, xmin age {age[1]} transactions "
                    "(VACUUM cannot remove rows deleted after it)")
        percent = 100.0 * stats.rows_done / stats.rows_total if stats.rows_total else 100.0
        log.info("backfill: %d of %d rows (%.0f%%), %.0f rows/s%s", stats.rows_done,
                 stats.rows_total, percent, stats.rate, held, extra={
                     "rows_done": stats.rows_done, "rows_total": stats.rows_total,
                     "rate": round(stats.rate, 1), "snapshot_age_s": round(stats.snapshot_age, 1)})
