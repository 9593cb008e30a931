"""When a Kafka transaction closes, in exactly-once mode (docs/design.md, exactly-once delivery).

``TxnBatch`` follows one Kafka transaction as PostgreSQL transactions flow into it and
answers the two questions the relay asks: may it close now, and must it? A Kafka
transaction only ever closes at a PostgreSQL commit boundary, so a ``read_committed``
consumer sees all of a PostgreSQL transaction or none of it. It closes at the first
boundary after ``interval`` has passed since it opened, or once it holds ``max_events``
events or ``max_bytes`` payload bytes; a PostgreSQL transaction larger than those limits
is not split (it needs a ``transaction.timeout.ms`` long enough for it). Only an explicit
``split_events`` lets a transaction be split, after that many of its events in one
Kafka transaction; the checkpoint then records how many of its events are in Kafka.

``CommittedTracker`` is the AckTracker of this mode: a broker ack of one message means
nothing until the Kafka transaction commits, so per-message deliveries are ignored and
the relay reports ``committed(last_token)`` after each commit instead.

Pure: no clock (callers pass ``now``), no broker, no database.
"""

from __future__ import annotations

from collections.abc import Iterable

from cdc_relay.acks import AckTracker
from cdc_relay.config import TxnLimits
from cdc_relay.model import ZERO_LSN, Lsn


class TxnBatch:
    """The open Kafka transaction as PostgreSQL transactions flow into it."""

    __slots__ = ("_limits", "bytes", "events", "in_pg_txn", "open", "opened_at", "pg_events",
                 "pg_events_here")

    def __init__(self, limits: TxnLimits) -> None:
        self._limits = limits
        self.open = False
        self.opened_at = 0.0
        self.events = 0  # events in the open Kafka transaction
        self.bytes = 0
        self.in_pg_txn = False
        self.pg_events = 0  # events of the current PostgreSQL transaction produced so far
        self.pg_events_here = 0  # ... of them in the open Kafka transaction

    def begin_pg(self) -> None:
        """A PostgreSQL transaction starts."""
        self.in_pg_txn = True
        self.pg_events = 0
        self.pg_events_here = 0

    def commit_pg(self) -> None:
        """The current PostgreSQL transaction ended: a boundary."""
        self.in_pg_txn = False
        self.pg_events = 0
        self.pg_events_here = 0

    def opened(self, now: float) -> None:
        """A Kafka transaction began (before its first event)."""
        self.open = True
        self.opened_at = now
        self.events = 0
        self.bytes = 0
        self.pg_events_here = 0

    def added(self, nbytes: int) -> None:
        """One event went into the open Kafka transaction."""
        self.events += 1
        self.bytes += nbytes
        self.pg_events += 1
        self.pg_events_here += 1

    def closed(self) -> None:
        """The open Kafka transaction committed or aborted."""
        self.open = False
        self.events = 0
        self.bytes = 0
        self.pg_events_here = 0

    def age(self, now: float) -> float:
        """Seconds since the open Kafka transaction began; 0 when none is open."""
        return now - self.opened_at if self.open else 0.0

    def should_close(self, now: float) -> bool:
        """At a boundary (no PostgreSQL transaction open): is it time to commit?"""
        limits = self._limits
        return self.open and not self.in_pg_txn and (
            now - self.opened_at >= limits.interval or self.events >= limits.max_events
            or self.bytes >= limits.max_bytes)

    def should_split(self) -> bool:
        """Inside a PostgreSQL transaction: must the Kafka transaction close before the next event?"""
        split = self._limits.split_events
        return split is not None and self.open and self.in_pg_txn and self.pg_events_here >= split


class CommittedTracker(AckTracker):
    """An AckTracker for which "delivered" means "in a committed Kafka transaction".

    ``inflight`` still counts what the broker has not acknowledged (the loop's
    backpressure): events awaiting the commit are not in flight, or a PostgreSQL
    transaction larger than the flow limits could never reach its commit.
    """

    __slots__ = ("_acked",)

    def __init__(self, start: Lsn = ZERO_LSN) -> None:
        super().__init__(start)
        self._acked = 0  # broker acks of events not yet committed

    @property
    def inflight(self) -> int:
        """Events produced and not yet acknowledged by the broker."""
        return max(0, super().inflight - self._acked)

    def delivered_all(self, seqs: Iterable[int]) -> None:
        """Broker acks inside an open transaction prove nothing yet: only counted
        (``delivered(seq)`` comes here too)."""
        low = self._low
        self._acked += sum(1 for seq in seqs if seq >= low)

    @property
    def last_produced(self) -> int:
        """The token of the newest produced event (-1 before the first)."""
        return self._next_seq - 1

    def committed(self, last_token: int) -> None:
        """The Kafka transaction holding every event up to ``last_token`` committed."""
        if last_token >= self._low:
            self._acked = max(0, self._acked - (last_token + 1 - self._low))
            self.delivered_through(last_token)
