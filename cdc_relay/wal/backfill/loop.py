"""The backfill's publishing loop: rows of a snapshot → router → sink; every ack → marked processed.

The rows come from a ``RowSource`` (backfill_rows.SnapshotReader: a server-side cursor
over the pending rows of one snapshot) and go through the same Router and Sink as
streaming, so the messages are identical. Rows are numbered in cursor order (fixed
within one snapshot); a contiguous low-watermark of acknowledged ordinals plus the set
acknowledged above it is the delivery accounting, as the AckTracker keeps it for LSNs.
Acknowledged rows are handed to ``MarkProcessed`` (backfill_rows.RowMarker) in batches.
Memory is bounded: at most ``max_inflight_events`` rows are unacknowledged.

Failures follow WAL mode's rules (docs/design.md, failure rules): a message refused for
good goes to the dead-letter topic (then its row counts as done); a fatal producer error
or a timed-out message discards the producer and the backfill resumes, with a new one,
at the watermark of the same snapshot (only the rows unacknowledged at the failure are
sent again).

Must not: do I/O of its own, create slots, take locks or decide whether a backfill is
needed (cutover.py), stream from the slot, or confirm any LSN: the slot is not read until
the backfill is done.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from typing import Any, Protocol

from cdc_relay.config import FlowConfig
from cdc_relay.errors import ConfigError, RelayError
from cdc_relay.logs import event_fields
from cdc_relay.model import OutboxEvent
from cdc_relay.routing import Router, RoutingError
from cdc_relay.sink.base import DeliveryError, ErrorKind, ProduceRejected, QueueFull, Sink, SinkFactory

log = logging.getLogger("cdc_relay.backfill")

_MARK_BATCH = 2000  # acked rows marked processed per UPDATE
_TOO_LARGE_MARKERS = ("too large", "TOO_LARGE")


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


@dataclass(frozen=True, slots=True)
class BackfillTimings:
    progress_interval: float = 2.0
    mark_interval: float = 0.5
    sink_warmup: float = 10.0
    delivery_timeout: float = 40.0  # > message.timeout.ms: librdkafka reports first
    shutdown_timeout: float = 25.0
    retry_min: float = 0.5
    retry_max: float = 30.0


class _ProducerFailed(RelayError):
    """The producer cannot be trusted: resume at the watermark with a new one."""


class RowSource(Protocol):
    """The pending rows of one snapshot, in a fixed order (SnapshotReader)."""

    pid: int

    def rows(self, offset: int) -> Generator[tuple[Any, OutboxEvent], None, None]: ...


class ProgressStore(Protocol):
    """Where progress is recorded (backfill_state.StateStore)."""

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
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._reader = reader
        self._store = store
        self._mark = mark
        self._router = router
        self._sink_factory = sink_factory
        self._flow = flow
        self._timings = timings
        self.stats = stats
        self._clock = clock
        self._low = 0  # every ordinal below is acknowledged
        self._ahead: set[int] = set()  # acknowledged ordinals above _low
        self._next_token = 0
        # token -> (ordinal, raw id, event, dead-lettered: None | payload omitted)
        self._inflight: dict[int, tuple[int, Any, OutboxEvent, bool | None]] = {}
        self._marks: list[Any] = []  # raw ids acknowledged, not yet marked processed
        self._redo: list[tuple[int, Any]] = []  # dead letters to produce from the loop
        self._failure: str | None = None
        self._started = 0.0
        self._next_mark = self._next_progress = 0.0

    def run(self, stop: threading.Event) -> bool:
        """Publish every pending row; True once all are acked and marked, False if stopped."""
        self._started = self._clock()
        self.stats.running = True
        delay = self._timings.retry_min
        try:
            while not stop.is_set():
                sink: Sink | None = None
                try:
                    sink = self._new_sink()
                    if self._publish_all(sink, stop):
                        self._flush_marks(force=True)
                        self.stats.finished = True
                        return True
                    break
                except _ProducerFailed as exc:
                    log.warning("%s; resuming the backfill at row %d with a new producer in "
                                "%.1fs", exc, self._low, delay)
                    self._inflight.clear()
                    self._failure = None
                    stop.wait(delay)
                    delay = min(delay * 2, self._timings.retry_max)
                finally:
                    if sink is not None:
                        sink.close(1.0)
            self._flush_marks(force=True)
            return False
        finally:
            self.stats.running = False
            self._progress(force=True)

    def _new_sink(self) -> Sink:
        try:
            sink = self._sink_factory(self._on_delivery)
        except ConfigError:
            raise
        except RelayError as exc:
            raise _ProducerFailed(f"cannot create the producer: {exc}") from exc
        try:
            sink.warm_up(self._timings.sink_warmup)
        except RelayError as exc:
            sink.close(0)
            raise _ProducerFailed(f"broker not reachable: {exc}") from exc
        return sink

    def _publish_all(self, sink: Sink, stop: threading.Event) -> bool:
        limit = self._flow.max_inflight_events
        rows = self._reader.rows(self._low)
        try:
            for ordinal, (raw_id, event) in enumerate(rows, start=self._low):
                if ordinal in self._ahead:
                    continue  # acknowledged before the producer was replaced
                while len(self._inflight) >= limit:
                    sink.poll(0.05)
                    self._tick(sink)
                self._publish(sink, ordinal, raw_id, event)
                if not ordinal % 256:
                    sink.poll(0)
                    self._tick(sink)
                if stop.is_set():
                    self._await_acks(sink, self._timings.shutdown_timeout, fail=False)
                    return False
        finally:
            rows.close()  # the server-side cursor, before a retry opens another
        self._await_acks(sink, self._timings.delivery_timeout, fail=True)
        return True

    def _publish(self, sink: Sink, ordinal: int, raw_id: Any, event: OutboxEvent) -> None:
        token = self._next_token
        self._next_token += 1
        try:
            message = self._router.route(event)
            self._inflight[token] = (ordinal, raw_id, event, None)
        except RoutingError as exc:
            message = self._dead_letter(token, (ordinal, raw_id, event, None), exc.reason)
        self._produce(sink, token, message)

    def _produce(self, sink: Sink, token: int, message: Any) -> None:
        while True:
            try:
                sink.produce(message, token)
                return
            except QueueFull:
                sink.poll(0.05)
                self._tick(sink)
            except ProduceRejected as exc:
                if exc.error.kind is not ErrorKind.PERMANENT:
                    raise _ProducerFailed(f"cannot produce: {exc.error.reason}") from exc
                message = self._dead_letter(token, self._inflight[token], exc.error.reason)

    def _dead_letter(self, token: int, entry: tuple[int, Any, OutboxEvent, bool | None],
                     reason: str) -> Any:
        """The dead letter for a message refused for good (as WAL mode makes it)."""
        ordinal, raw_id, event, omitted = entry
        too_large = any(marker in reason for marker in _TOO_LARGE_MARKERS)
        if omitted is not None and (omitted or not too_large):
            raise _ProducerFailed(f"the dead-letter topic refused event {event.id} too: {reason}")
        log.warning("dead-lettering event: %s", reason, extra=event_fields(event))
        message = self._router.dead_letter(event, reason)
        if too_large:
            message = replace(message, value=b"", headers=[
                *message.headers, ("payload_omitted_bytes", str(len(message.value)).encode())])
        self._inflight[token] = (ordinal, raw_id, event, too_large)
        return message

    def _on_delivery(self, token: int, error: DeliveryError | None) -> None:
        entry = self._inflight.get(token)
        if entry is None:
            return  # a report of a discarded producer
        if error is None:
            del self._inflight[token]
            self._acked(entry[0])
            self._marks.append(entry[1])
            if entry[3] is not None:
                self.stats.dead_lettered += 1
            return
        if error.kind is ErrorKind.PERMANENT and self._failure is None:
            try:
                self._redo.append((token, self._dead_letter(token, entry, error.reason)))
                return
            except _ProducerFailed as exc:
                self._failure = str(exc)
                return
        if self._failure is None:
            self._failure = f"delivery of event {entry[2].id} failed: {error.reason}"

    def _acked(self, ordinal: int) -> None:
        if ordinal == self._low:
            low = ordinal + 1
            while low in self._ahead:
                self._ahead.remove(low)
                low += 1
            self._low = low
        elif ordinal > self._low:
            self._ahead.add(ordinal)

    def _tick(self, sink: Sink) -> None:
        """Between produces: fail fast, re-send dead letters, mark, report progress."""
        if self._failure is not None:
            raise _ProducerFailed(self._failure)
        fatal = sink.fatal_error
        if fatal is not None:
            raise _ProducerFailed(f"producer failed: {fatal.reason}")
        redo, self._redo = self._redo, []
        for token, message in redo:
            self._produce(sink, token, message)
        self._flush_marks()
        self._progress()

    def _await_acks(self, sink: Sink, timeout: float, *, fail: bool) -> None:
        deadline = self._clock() + timeout
        while self._inflight or self._redo:
            if self._clock() > deadline:
                if fail:
                    raise _ProducerFailed(f"{len(self._inflight)} messages unacknowledged "
                                          f"after {timeout:.0f}s")
                return
            sink.poll(0.1)
            self._tick(sink)

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
        self.stats.rows_done = self._low + len(self._ahead)
        self._store.progress(self.stats.rows_done)
        self._next_mark = now + self._timings.mark_interval

    def _progress(self, *, force: bool = False) -> None:
        now = self._clock()
        if not force and now < self._next_progress:
            return
        self._next_progress = now + self._timings.progress_interval
        stats = self.stats
        stats.rows_done = self._low + len(self._ahead)
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
