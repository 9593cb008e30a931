"""Prometheus collectors: the relay's plain counters turned into metric families at scrape time.

Owns every metric name, help text and label the relay exposes: ``WalCollector`` reads
``RelayStats`` and the slot figures of the lag probe, ``PollCollector`` reads
``PollStats``, ``ReadyCollector`` turns the ``/readyz`` verdict into
``cdc_relay_ready`` (Prometheus cannot probe /readyz itself), ``FailoverCollector`` the
failover readiness the probe reads given a standby, ``TxnCollector`` reads
exactly-once's ``TxnStats`` (the stats types are cdc_relay/stats.py's: no mode's loop is
imported here), ``make_registry`` adds the process, platform
and GC collectors. The slot gauges are absent while the probe cannot read or the slot does
not exist.

Must not: mutate the stats, open a connection, start a thread or serve HTTP - the lag
probe and the endpoint are cdc_relay.ops.metrics.endpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from cdc_relay.model import INVALIDATION_CAUSES, SlotStatus
from cdc_relay.ops.failover.facts import FailoverStatus
from cdc_relay.stats import BATCH_BUCKETS, PollStats, RelayStats, TxnStats


class SlotFigures(Protocol):
    """What the collectors read from the slot lag probe (metrics.SlotLagProbe)."""

    @property
    def ok(self) -> bool:
        """The last read succeeded."""

    @property
    def succeeded_at(self) -> float:
        """Wall-clock time of the last successful read (0: never)."""

    @property
    def latest(self) -> SlotStatus | None:
        """The slot as last read; None when it does not exist (or was not read yet)."""


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _topic_retries(count: int) -> CounterMetricFamily:
    family = CounterMetricFamily(
        "cdc_relay_delivery_retries", "Deliveries retried, by reason (polling: events released "
        "because their topic is missing or forbidden).", labels=["reason"])
    family.add_metric(["topic_unavailable"], count)
    return family


def _failed(by_type: dict[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(
        "outbox_events_failed", "Failed delivery attempts, by event type.",
        labels=["event_type"])
    for event_type, count in sorted(by_type.items()):
        family.add_metric([event_type], count)
    return family


WAL_STATUSES = ("reserved", "extended", "unreserved", "lost")


def _wal_status(current: str) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "cdc_relay_slot_wal_status", "pg_replication_slots.wal_status of the slot: 1 for the "
        "current one (unreserved: the next checkpoint may invalidate it; lost: invalidated).",
        labels=["status"])
    for name in sorted({*WAL_STATUSES, current}):
        family.add_metric([name], 1 if name == current else 0)
    return family


def _invalidation(slot: SlotStatus) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "cdc_relay_slot_invalidated", "1 for the reason PostgreSQL invalidated the slot "
        "(pg_replication_slots.invalidation_reason; wal_removed where the server predates it), "
        "0 for the others: idle_timeout is PostgreSQL 18's idle_replication_slot_timeout.",
        labels=["reason"])
    current = (slot.invalidation_reason or "wal_removed") if slot.invalidated else None
    for name in sorted({*INVALIDATION_CAUSES, *([current] if current else [])}):
        family.add_metric([name], 1 if name == current else 0)
    return family


def slot_metrics(probe: SlotFigures) -> Iterator[Metric]:
    """The probe's figures; absent while it cannot read or the slot does not exist."""
    yield _gauge("cdc_relay_slot_probe_success",
                 "1 if the last read of pg_replication_slots succeeded.", 1 if probe.ok else 0)
    if probe.succeeded_at:
        yield _gauge("cdc_relay_slot_probe_timestamp_seconds",
                     "Unix time of the last successful read of the slot's lag.", probe.succeeded_at)
    status = probe.latest
    if not probe.ok or status is None:
        return
    yield _gauge("cdc_relay_slot_active", "1 while a client streams from the slot.",
                 1 if status.active else 0)
    if status.lag_bytes is not None:
        yield _gauge("cdc_relay_slot_lag_bytes",
                     "WAL bytes between the server's position and the slot's confirmed LSN.",
                     status.lag_bytes)
    if status.retained_bytes is not None:
        yield _gauge("cdc_relay_wal_retained_bytes",
                     "WAL the slot keeps on the server (restart LSN to current position).",
                     status.retained_bytes)
    if status.safe_wal_size is not None:
        yield _gauge("cdc_relay_slot_safe_wal_size_bytes",
                     "WAL that can still be written before the slot is invalidated.",
                     status.safe_wal_size)
    if status.wal_status is not None:
        yield _wal_status(status.wal_status)
    yield _invalidation(status)
    if not status.active and status.inactive_seconds is not None:
        yield _gauge("cdc_relay_slot_inactive_seconds",
                     "Seconds since a client last streamed from the slot (PostgreSQL 17+).",
                     status.inactive_seconds)
    if status.idle_timeout is not None:
        yield _gauge("cdc_relay_slot_idle_timeout_seconds",
                     "PostgreSQL 18's idle_replication_slot_timeout (0 = off): an inactive slot "
                     "is invalidated at the first checkpoint after it.", status.idle_timeout)
    if status.lag_seconds is not None:
        yield _gauge("cdc_relay_replication_lag_seconds",
                     "pg_stat_replication.flush_lag of the slot's walsender (0 when caught up).",
                     status.lag_seconds)


class WalCollector:
    """WAL mode's metrics, read from RelayStats (and the lag probe) at scrape time."""

    def __init__(self, stats: RelayStats, probe: SlotFigures | None) -> None:
        self._stats = stats
        self._probe = probe

    def collect(self) -> Iterable[Metric]:
        stats = self._stats
        yield _counter("outbox_events_published", "Events the broker acknowledged.",
                       stats.published)
        yield _failed(dict(stats.failed_by_type))  # dict(): a C-level copy, safe vs. the loop
        yield _counter("outbox_events_dead_lettered",
                       "Events sent to the dead-letter topic by this process.", stats.dead_lettered)
        yield _gauge("outbox_dead_letters",
                     "Dead letters: in WAL mode, events this process sent to the dead-letter "
                     "topic.", stats.dead_lettered)
        yield _gauge("cdc_relay_inflight_events", "Events produced and not yet acknowledged.",
                     stats.inflight)
        yield _gauge("cdc_relay_confirmed_lsn", "The LSN last confirmed to PostgreSQL.",
                     stats.confirmed_lsn)
        yield _gauge("cdc_relay_streaming", "1 while the replication stream is open.",
                     1 if stats.streaming else 0)
        yield _counter("cdc_relay_restarts",
                       "Stream or producer restarts (reconnects, new producers).", stats.restarts)
        retries = CounterMetricFamily(
            "cdc_relay_delivery_retries", "Deliveries retried with a new producer, by reason "
            "(topic_missing, topic_authorization, producer_failed).", labels=["reason"])
        for reason, count in sorted(dict(stats.retries_by_reason).items()):
            retries.add_metric([reason], count)
        yield retries
        yield _counter("cdc_relay_ignored_messages",
                       "Non-transactional 'cdc-relay' logical decoding messages, never published.",
                       stats.ignored_messages)
        yield from captured_metrics(stats)
        if stats.incremental_rows or stats.incremental_tables:  # run --capture's snapshots
            yield _counter("cdc_relay_incremental_snapshot_rows", "Rows of incremental "
                           "snapshots the broker acknowledged (op: r events).",
                           stats.incremental_rows)
            yield _gauge("cdc_relay_incremental_snapshot_tables", "Tables whose incremental "
                         "snapshot is queued or running.", stats.incremental_tables)
        if self._probe is not None:
            yield from slot_metrics(self._probe)


def captured_metrics(stats: RelayStats) -> Iterator[Metric]:
    """``run --capture``: change events by table and op, and each table's lag (absent
    without --capture)."""
    counts, lags = dict(stats.captured), dict(stats.captured_lag)  # C-level copies
    if not counts and not lags:
        return
    events = CounterMetricFamily(
        "cdc_relay_captured_events", "Change events made of captured tables' changes, by "
        "table and op (c, u, d, t; r: a snapshot's rows; tombstones and dead letters not counted).",
        labels=["table", "op"])
    for (table, op), count in sorted(counts.items()):
        events.add_metric([table, op], count)
    yield events
    lag = GaugeMetricFamily(
        "cdc_relay_captured_lag_seconds", "Per captured table: seconds from the commit of its "
        "last streamed change to the moment the relay made its event.", labels=["table"])
    for table, seconds in sorted(lags.items()):
        lag.add_metric([table], seconds)
    yield lag


class FailoverFigures(Protocol):
    """What the failover collector reads (the slot lag probe, given a standby)."""

    @property
    def failover_ok(self) -> bool:
        """The last read of the failover facts succeeded (the primary's at least)."""

    @property
    def failover(self) -> FailoverStatus | None:
        """The verdict as last read (None: not read yet, or the primary could not be read)."""


class FailoverCollector:
    """Failover readiness (``run --standby-dsn``; docs/high-availability.md), at scrape time."""

    def __init__(self, probe: FailoverFigures) -> None:
        self._probe = probe

    def collect(self) -> Iterable[Metric]:
        probe, status = self._probe, self._probe.failover
        read = probe.failover_ok and status is not None and status.standby_checked
        yield _gauge("cdc_relay_failover_probe_success", "1 if the last read of the failover "
                     "facts of both the primary and the standby succeeded.", 1 if read else 0)
        if not probe.failover_ok or status is None:
            return
        if status.slot_failover is not None:
            yield _gauge("cdc_relay_slot_failover", "1 if the slot has failover = true "
                         "(PostgreSQL 17+: standbys may sync it).", 1 if status.slot_failover else 0)
        if status.ready is not None:
            yield _gauge("cdc_relay_slot_failover_ready", "1 while the standby holds a synced, "
                         "non-temporary copy of the slot that survives its promotion.",
                         1 if status.ready else 0)


class TxnCollector:
    """Exactly-once mode's metrics, read from TxnStats at scrape time."""

    def __init__(self, stats: TxnStats, clock: Callable[[], float] = time.monotonic) -> None:
        self._stats = stats
        self._clock = clock

    def collect(self) -> Iterable[Metric]:
        stats = self._stats
        yield _counter("cdc_relay_transactions_committed", "Kafka transactions committed.",
                       stats.committed)
        yield _counter("cdc_relay_transactions_aborted",
                       "Kafka transactions aborted (their events are replayed).", stats.aborted)
        opened = stats.open_since
        yield _gauge("cdc_relay_transaction_open_age_seconds",
                     "Age of the open Kafka transaction; 0 when none is open.",
                     0.0 if opened is None else max(0.0, self._clock() - opened))
        yield _gauge("cdc_relay_checkpoint_lsn",
                     "The checkpoint LSN of the last committed Kafka transaction.",
                     stats.checkpoint_lsn)


class BackfillFigures(Protocol):
    """What the backfill collector reads (wal/backfill/loop.py, BackfillStats)."""

    running: bool
    finished: bool
    rows_total: int
    rows_done: int
    rate: float
    snapshot_age: float


class BackfillCollector:
    """``run --snapshot initial``: the backfill's progress, read at scrape time."""

    def __init__(self, stats: BackfillFigures) -> None:
        self._stats = stats

    def collect(self) -> Iterable[Metric]:
        stats = self._stats
        yield _gauge("cdc_relay_backfill_running", "1 while the backfill publishes pending rows.",
                     1 if stats.running else 0)
        yield _gauge("cdc_relay_backfill_finished", "1 once the backfill of this slot is done.",
                     1 if stats.finished else 0)
        yield _gauge("cdc_relay_backfill_rows_total", "Rows pending in the backfill's snapshot.",
                     stats.rows_total)
        yield _gauge("cdc_relay_backfill_rows_done", "Backfilled rows the broker acknowledged.",
                     stats.rows_done)
        yield _gauge("cdc_relay_backfill_rows_per_second", "Backfill rate since it started.",
                     stats.rate)
        yield _gauge("cdc_relay_backfill_snapshot_age_seconds",
                     "How long the backfill's snapshot (its xmin, which holds back VACUUM) "
                     "has been held.", stats.snapshot_age)


def batch_histogram(counts: list[int], total: float) -> HistogramMetricFamily:
    """``outbox_batch_duration_seconds`` from per-bucket counts (last = above every bound)."""
    buckets: list[tuple[str, float]] = []
    cumulative = 0
    for bound, count in zip((*map(str, BATCH_BUCKETS), "+Inf"), counts, strict=True):
        cumulative += count
        buckets.append((bound, cumulative))
    return HistogramMetricFamily("outbox_batch_duration_seconds",
                                 "Claim-to-commit time of polling batches.",
                                 buckets=buckets, sum_value=total)


class PollCollector:
    """Polling mode's metrics, read from PollStats at scrape time."""

    def __init__(self, stats: PollStats) -> None:
        self._stats = stats

    def collect(self) -> Iterable[Metric]:
        stats = self._stats
        with stats.lock:
            published, failed = stats.published, dict(stats.failed_by_type)
            dead_lettered, dead, pending = stats.dead_lettered, stats.dead_letters, stats.pending
            counts, total = list(stats.batch_duration_counts), stats.batch_duration_sum
        yield _counter("outbox_events_published", "Events the broker acknowledged.", published)
        yield _failed(failed)
        yield _counter("outbox_events_dead_lettered",
                       "Events this process gave up on (now dead letters).", dead_lettered)
        yield _gauge("outbox_dead_letters", "Rows in the dead-letter state.", dead)
        yield _topic_retries(self._stats.topic_retries)
        yield _gauge("outbox_events_pending", "Rows waiting to be published.", pending)
        yield batch_histogram(counts, total)
        yield _gauge("cdc_relay_poller_connected", "1 while every worker has its connection.",
                     1 if stats.connected else 0)
        yield _gauge("cdc_relay_broker_ok", "0 while workers wait for the broker.",
                     1 if stats.broker_ok else 0)


class SinkInfoCollector:
    """``cdc_relay_sink_info{sink="kafka|rabbitmq|..."} 1``: which broker this relay publishes to."""

    def __init__(self, sink: str) -> None:
        self._sink = sink

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily("cdc_relay_sink_info", "The sink (broker) this relay publishes "
                                   "to, as a label; always 1.", labels=["sink"])
        family.add_metric([self._sink], 1)
        yield family


class ReadyCollector:
    """``cdc_relay_ready``: 1 while ``ready()`` (the /readyz verdict) says ready, else 0."""

    def __init__(self, ready: Callable[[], tuple[bool, str]]) -> None:
        self._ready = ready

    def collect(self) -> Iterable[Metric]:
        ok, _ = self._ready()
        yield _gauge("cdc_relay_ready", "1 while /readyz answers 200 (stream or pollers connected, "
                     "producer usable).", 1 if ok else 0)


def make_registry(*collectors: Any) -> CollectorRegistry:
    """A private registry: our collectors plus process, platform and GC metrics."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry
