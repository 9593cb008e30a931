"""The backfill: publish the rows pending in a snapshot, wait for every ack, mark them processed.

``SnapshotReader`` reads ``processed_at IS NULL AND dead_lettered_at IS NULL`` rows in a
``REPEATABLE READ READ ONLY`` transaction that imports the slot's exported snapshot (or,
when a crashed backfill is redone, in a fresh one), oldest first (``created_at``, then
heap position), through a server-side cursor: memory is bounded by the fetch size plus
what is in flight. The rows become OutboxEvents exactly as in polling mode (payload =
the column's text output, the same bytes WAL mode sends; ``created_at`` in epoch ms),
and go through the same Router and Sink as streaming, so the messages are identical.

``Backfill`` is the publishing loop. Rows are numbered in cursor order (the order is
fixed within one snapshot); a contiguous low-watermark of acknowledged ordinals plus the
set acknowledged above it is the delivery accounting, as the AckTracker keeps it for
LSNs. Acked rows are marked processed in batches on the state connection. Failures
follow WAL mode's rules (docs/design.md, failure rules): a message refused for good goes to the
dead-letter topic (then its row counts as done); a fatal producer error or a timed-out
message discards the producer and the backfill resumes, with a new one, at the
watermark of the same snapshot (only the rows unacknowledged at the failure are sent again).

Must not: create slots, take locks or decide whether a backfill is needed (cutover.py),
stream from the slot, or confirm any LSN: the slot is not read until the backfill is done.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

import psycopg
from psycopg import sql

from cdc_relay.config import FlowConfig, OutboxConfig
from cdc_relay.db import connect, translate_error, validated_columns, validated_table
from cdc_relay.errors import ConfigError, RelayError
from cdc_relay.logs import event_fields
from cdc_relay.model import OutboxEvent
from cdc_relay.routing import Router, RoutingError
from cdc_relay.sink.base import Delivery, ErrorKind, ProduceRejected, QueueFull, Sink, SinkFactory

log = logging.getLogger("cdc_relay.backfill")

FETCH_SIZE = 2000  # rows per round trip of the server-side cursor
_MARK_BATCH = 2000  # acked rows marked processed per UPDATE
_MARK_QUEUE = 2  # batches handed to the marker thread and not yet marked
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

    def rows(self, offset: int) -> Iterator[tuple[Any, OutboxEvent]]: ...


class ProgressStore(Protocol):
    """Where progress is recorded (backfill_state.StateStore)."""

    def progress(self, rows_done: int) -> None: ...
    def snapshot_age(self, reader_pid: int) -> tuple[float, int] | None: ...


class MarkProcessed(Protocol):
    """Sets ``processed_at`` on acknowledged rows (RowMarker)."""

    def __call__(self, raw_ids: list[Any]) -> None: ...
    def drain(self) -> None: ...


class RowMarker:
    """Sets ``processed_at`` on acknowledged rows, on its own connection and thread.

    The UPDATEs cost the database about as much as reading and publishing the rows (measured:
    a third of the backfill's time when run inline), so they overlap with publishing. The
    queue holds at most ``_MARK_QUEUE`` batches: a slow database slows the backfill down
    instead of growing memory or the window of acknowledged, unmarked rows.
    """

    def __init__(self, dsn: str, outbox: OutboxConfig) -> None:
        table = validated_table(outbox.table)
        self._sql = sql.SQL(
            "UPDATE {} SET processed_at = now() WHERE {} = ANY(%s) AND processed_at IS NULL"
        ).format(sql.Identifier(table.schema, table.name),
                 sql.Identifier(validated_columns(outbox.columns).id))
        self._conn = connect(dsn, autocommit=True, application_name="cdc-relay backfill marks")
        self._queue: queue.Queue[list[Any] | None] = queue.Queue(maxsize=_MARK_QUEUE)
        self._error: RelayError | None = None
        self._thread = threading.Thread(target=self._run, name="backfill-marks", daemon=True)
        self._thread.start()

    def __call__(self, raw_ids: list[Any]) -> None:
        """Queue a batch (blocks while the queue is full); raise an earlier batch's error."""
        self._raise()
        self._queue.put(raw_ids)

    def drain(self) -> None:
        """Wait until every queued batch is marked; raise if one failed."""
        self._queue.join()
        self._raise()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(30)
        self._conn.close()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            try:
                if batch is None:
                    return
                if self._error is None:
                    self._conn.execute(self._sql, (batch,))
            except psycopg.Error as exc:
                self._error = translate_error(exc, "marking backfilled rows processed")
            finally:
                self._queue.task_done()


class SnapshotReader:
    """The reading transaction: pending rows of one snapshot, oldest first."""

    def __init__(self, dsn: str, outbox: OutboxConfig, snapshot_name: str | None) -> None:
        table = validated_table(outbox.table)
        cols = validated_columns(outbox.columns)
        c = {role: sql.Identifier(getattr(cols, role)) for role in cols.__dataclass_fields__}
        names = {"t": sql.Identifier(table.schema, table.name), **{f"c_{k}": v for k, v in c.items()}}
        pending = "FROM {t} WHERE processed_at IS NULL AND dead_lettered_at IS NULL"
        self._count = sql.SQL("SELECT count(*) " + pending).format(**names)
        self._select = sql.SQL(
            "SELECT {c_id}::text, {c_aggregate_type}::text, {c_aggregate_id}::text,"
            " {c_event_type}::text, {c_payload}::text,"
            " CASE WHEN isfinite({c_created_at})"
            " THEN floor(extract(epoch FROM {c_created_at}) * 1000)::bigint END, {c_id} "
            + pending + " ORDER BY {c_created_at}, tableoid, ctid OFFSET %s").format(**names)
        self._dsn = dsn
        self._snapshot_name = snapshot_name
        self._conn: psycopg.Connection[Any] | None = None
        self.pid = 0

    def open(self) -> int:
        """Begin the transaction (importing the snapshot); return the number of pending rows."""
        conn = connect(self._dsn, application_name="cdc-relay backfill")
        self._conn = conn
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        try:
            if self._snapshot_name is not None:
                # The first statement of the transaction: BEGIN is sent just before it.
                conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(
                    sql.Literal(self._snapshot_name)))
            row = conn.execute(self._count).fetchone()
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()
        except psycopg.Error as exc:
            self.close()
            raise translate_error(exc, "opening the backfill's snapshot") from exc
        self.pid = int(pid[0]) if pid else 0
        return int(row[0]) if row else 0

    def rows(self, offset: int) -> Iterator[tuple[Any, OutboxEvent]]:
        """(raw id, event) from the ``offset``-th pending row on, through a server-side cursor."""
        assert self._conn is not None, "rows() before open()"
        try:
            with self._conn.cursor(name="cdc_relay_backfill") as cursor:
                cursor.itersize = FETCH_SIZE
                cursor.execute(self._select, (offset,))
                for row in cursor:
                    yield row[6], OutboxEvent(row[0], row[1], row[2], row[3], row[4].encode(),
                                              row[5])
        except psycopg.Error as exc:
            raise translate_error(exc, "reading pending rows for the backfill") from exc

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


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
        for ordinal, (raw_id, event) in enumerate(self._reader.rows(self._low), start=self._low):
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

    def _on_delivery(self, delivery: Delivery) -> None:
        entry = self._inflight.get(delivery.token)
        if entry is None:
            return  # a report of a discarded producer
        error = delivery.error
        if error is None:
            del self._inflight[delivery.token]
            self._acked(entry[0])
            self._marks.append(entry[1])
            if entry[3] is not None:
                self.stats.dead_lettered += 1
            return
        if error.kind is ErrorKind.PERMANENT and self._failure is None:
            try:
                self._redo.append((delivery.token, self._dead_letter(delivery.token, entry,
                                                                     error.reason)))
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
