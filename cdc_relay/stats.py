"""The counters the loops update and ops/metrics reads: the mode-neutral stats types.

``RelayStats`` (WAL mode's stream), ``TxnStats`` (exactly-once's transactions) and
``PollStats`` (polling mode's workers and monitor) are plain attributes, not Prometheus
objects, so the per-event path stays cheap; the metrics thread reads them. They live
here, below both modes, so that ops/metrics imports no mode's loop and ``poll`` does
not load WAL mode's (docs/design.md, layers).

Must not: import a mode, a sink or a driver, do I/O, or log.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from cdc_relay.model import OutboxEvent


@dataclass
class RelayStats:
    """Plain counters the loop updates; metrics and health read them from another thread.

    Plain attributes, not Prometheus objects, keep the per-event path cheap.
    """

    published: int = 0
    dead_lettered: int = 0
    failed_by_type: dict[str, int] = field(default_factory=dict)
    retries_by_reason: dict[str, int] = field(default_factory=dict)
    inflight: int = 0
    confirmed_lsn: int = 0
    last_tick: float = 0.0  # monotonic time of the last loop turn (healthz)
    streaming: bool = False  # replication stream open (readyz)
    producer_ok: bool = False  # producer built and not failed (readyz)
    restarts: int = 0
    ignored_messages: int = 0  # non-transactional cdc-relay logical messages (never published)
    # run --capture: change events produced, by ("schema.table", op); tombstones and dead
    # letters not counted
    captured: dict[tuple[str, str], int] = field(default_factory=dict)
    # run --capture: per "schema.table", seconds from the commit of its last streamed change
    # to the moment the relay made its event
    captured_lag: dict[str, float] = field(default_factory=dict)
    # run --capture, incremental snapshots: rows acknowledged, tables queued or running
    incremental_rows: int = 0
    incremental_tables: int = 0


@dataclass
class TxnStats:
    """Exactly-once counters for metrics (plain attributes, read from the metrics thread)."""

    committed: int = 0
    aborted: int = 0
    open_since: float | None = None  # time.monotonic() when the open transaction began
    checkpoint_lsn: int = 0


class SettledBatch(Protocol):
    """What ``PollStats.record`` reads of a batch's verdict (polling.settlement.Settlement)."""

    @property
    def failures(self) -> Sequence[tuple[OutboxEvent, str]]: ...
    @property
    def topic_trouble(self) -> int: ...


class WrittenBatch(Protocol):
    """What ``PollStats.record`` reads of a written batch (polling.settlement.Completion)."""

    @property
    def processed(self) -> int: ...
    @property
    def dead_lettered(self) -> Sequence[str]: ...


# Upper bounds (seconds) of the batch duration histogram (ops/metrics/collectors.py exports it).
BATCH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass
class PollStats:
    """Plain counters shared by the workers; metrics and health read them.

    Workers update them under ``lock``; readers may read attributes without it.
    """

    published: int = 0
    failed_by_type: dict[str, int] = field(default_factory=dict)
    dead_lettered: int = 0  # events this process gave up on
    dead_letters: int = 0  # rows in the dead-letter state (refreshed by the monitor)
    pending: int = 0  # rows waiting to be published (refreshed by the monitor)
    batches: int = 0
    last_batch_duration: float = 0.0
    # Batches per BATCH_BUCKETS bucket (last: slower than every bound) and their total time.
    batch_duration_counts: list[int] = field(default_factory=lambda: [0] * (len(BATCH_BUCKETS) + 1))
    batch_duration_sum: float = 0.0
    topic_retries: int = 0  # events released because their topic was missing or forbidden
    last_tick: float = 0.0  # monotonic time of the last loop turn of any worker
    connected: bool = False  # every worker has a database connection
    broker_ok: bool = True  # False while workers wait for the broker
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, settlement: SettledBatch, completion: WrittenBatch, duration: float) -> None:
        """Count one settled batch."""
        with self.lock:
            self.published += completion.processed
            for event, _ in settlement.failures:
                self.failed_by_type[event.event_type] = self.failed_by_type.get(event.event_type, 0) + 1
            self.dead_lettered += len(completion.dead_lettered)
            self.topic_retries += settlement.topic_trouble
            self.batches += 1
            self.last_batch_duration = duration
            self.batch_duration_counts[bisect.bisect_left(BATCH_BUCKETS, duration)] += 1
            self.batch_duration_sum += duration
