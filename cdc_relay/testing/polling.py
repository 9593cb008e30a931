"""Polling mode's fakes: ``FakeOutbox`` (``BatchSource``), an in-memory outbox table, and
``FakeMonitor`` (``Monitor``), a scripted number of NOTIFYs.

For unit tests of the polling worker: no database, thread of their own or sleep. Must stay
small and obvious, and import no driver.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace

from cdc_relay.model import OutboxEvent
from cdc_relay.polling.settlement import AttemptFailure, Completion


@dataclass
class Row:
    """One FakeOutbox row and its bookkeeping."""

    event: OutboxEvent
    attempts: int = 0
    processed: bool = False
    dead: bool = False
    last_error: str | None = None
    delay: float | None = None


class FakeOutbox:
    """A BatchSource over rows: claims the oldest live ones; ``fail_next_claim`` raises once.

    ``premark`` records what the worker marked ahead of the acks (``premarked``, this
    batch; ``premarks``, calls so far); only ``complete`` decides what is processed, as
    the real source's commit does. ``fail_next_premark`` raises once, like a lost
    connection: the batch is then over (rolled back).
    """

    def __init__(self, events: Sequence[OutboxEvent]) -> None:
        self.rows = {e.id: Row(e) for e in events}
        self.claimed: list[str] = []
        self.batches = 0
        self.released = 0
        self.connected = True
        self.fail_next_claim: Exception | None = None
        self.fail_next_premark: Exception | None = None
        self.premarked: list[str] = []
        self.premarks = 0
        self.lock = threading.Lock()  # premark runs on the worker's helper thread

    def open(self) -> None:
        self.connected = True

    def close(self) -> None:
        self.connected = False
        with self.lock:
            self.claimed, self.premarked = [], []

    def claim(self, limit: int, max_attempts: int, *, strict_order: bool = False) -> list[OutboxEvent]:
        if self.fail_next_claim is not None:
            error, self.fail_next_claim = self.fail_next_claim, None
            raise error
        with self.lock:
            assert not self.claimed, "claimed while a batch is open"
            ready = [r for r in self.rows.values()
                     if not r.processed and not r.dead and r.attempts < max_attempts][:limit]
            self.claimed = [r.event.id for r in ready]
        return [replace(r.event, attempt=r.attempts + 1) for r in ready]

    def premark(self, events: Sequence[OutboxEvent]) -> None:
        with self.lock:
            if self.fail_next_premark is not None:
                error, self.fail_next_premark = self.fail_next_premark, None
                self.claimed, self.premarked = [], []
                raise error
            assert all(e.id in self.claimed for e in events), "premarked a row not claimed"
            self.premarked.extend(e.id for e in events)
            self.premarks += 1

    def complete(self, processed: Sequence[OutboxEvent], failures: Sequence[AttemptFailure],
                 max_attempts: int) -> Completion:
        dead = []
        with self.lock:
            for event in processed:
                self.rows[event.id].processed = True
            for failure in failures:
                row = self.rows[failure.event.id]
                row.attempts += 1
                row.last_error, row.delay = failure.reason, failure.delay
                if row.attempts >= max_attempts:
                    row.dead = True
                    dead.append(row.event.id)
            self.batches += 1
            self.claimed, self.premarked = [], []
        return Completion(len(processed), len(failures), tuple(dead))

    def release(self) -> None:
        with self.lock:
            self.released += 1
            self.claimed, self.premarked = [], []


class FakeMonitor:
    """A Monitor that reports ``notifications`` NOTIFYs, then sets ``stop``."""

    def __init__(self, notifications: int, stop: threading.Event,
                 counts: tuple[int, int] = (42, 3)) -> None:
        self.notifications = notifications
        self.stop = stop
        self.opened = 0
        self._counts = counts

    def open(self) -> None:
        self.opened += 1

    def wait(self, timeout: float) -> bool:
        if self.notifications:
            self.notifications -= 1
            return True
        self.stop.set()
        return False

    def counts(self) -> tuple[int, int]:
        return self._counts

    def close(self) -> None:
        pass
