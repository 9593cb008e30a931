"""The delivery mode: what WAL mode's loop asks at transaction boundaries and acks.

The loop (wal/stream/loop.py) reads, routes, produces and confirms; *when* an acked event
counts and whether a transaction must be skipped is the delivery mode's call. The loop
calls it at a handful of well-defined points - a session starts, a PostgreSQL
transaction begins or commits, an event is about to be produced, a delivery failed, a
loop turn, shutdown - and nowhere else, so one loop serves both modes:

* ``AtLeastOnce`` (the default): every hook is a no-op and the plain AckTracker
  confirms what the broker acknowledged;
* ``ExactlyOnce`` (wal/exactly_once/mode.py, ``run --exactly-once``): Kafka transactions
  closed at commit boundaries, a checkpoint in each, replay skipping what is in Kafka.

It must not read the stream or touch the slot: the loop does.
"""

from __future__ import annotations

from typing import Protocol

from cdc_relay.acks import AckTracker
from cdc_relay.model import Begin, InFlight, Lsn, Message
from cdc_relay.sink.base import DeliveryError, Sink


class DeliveryMode(Protocol):
    """The hooks the loop calls (see the module docstring)."""

    # Whether ``admit`` must see every event. False lets the loop skip the call on its
    # per-event path (at-least-once has nothing to check there).
    admits: bool

    def start(self, sink: Sink, start: Lsn) -> AckTracker:
        """A replication session opened at ``start`` (nothing read yet): its tracker."""

    def begin(self, begin: Begin) -> int:
        """A PostgreSQL transaction starts: how many of its events to skip (already delivered)."""

    def admit(self, token: int, event: InFlight, message: Message) -> DeliveryError | None:
        """``message`` is about to be produced: None, or why it must be dead-lettered instead."""

    def commit(self, end_lsn: Lsn) -> None:
        """The current PostgreSQL transaction ended at ``end_lsn`` (after the tracker knows)."""

    def tick(self, now: float) -> float:
        """Once per loop turn (timers); may raise to end the session.

        Returns how soon (seconds) it wants the next tick: the loop waits no longer
        for the stream.
        """

    def delivery_failed(self, event: InFlight, error: DeliveryError) -> bool:
        """A delivery failed; True if the mode handled it (the loop then does nothing more)."""

    def finish(self) -> None:
        """Shutdown, after in-flight acks were awaited and before the final status update."""


class AtLeastOnce:
    """The default mode: the broker's ack is the delivery; nothing to skip or close."""

    admits = False

    def start(self, sink: Sink, start: Lsn) -> AckTracker:
        return AckTracker(start)

    def begin(self, begin: Begin) -> int:
        return 0

    def admit(self, token: int, event: InFlight, message: Message) -> DeliveryError | None:
        return None

    def commit(self, end_lsn: Lsn) -> None:
        return None

    def tick(self, now: float) -> float:
        return 1.0

    def delivery_failed(self, event: InFlight, error: DeliveryError) -> bool:
        return False

    def finish(self) -> None:
        return None
