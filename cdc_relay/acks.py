"""The acknowledgement invariant (docs/design.md, the acknowledgement invariant), in one place.

The AckTracker turns "event N was produced", "event N was delivered" and "a transaction
ended at LSN L" into the one LSN that is safe to confirm to PostgreSQL: the slot's
confirmed flush position must never pass an event the broker has not acknowledged.

Events get consecutive sequence numbers in WAL order. Delivery reports arrive in any
order (partitions ack independently), so the tracker keeps a contiguous low-watermark:
every sequence number below ``_low`` is delivered. A transaction's commit end LSN
becomes safe once the watermark has passed its last event. When nothing is open or in
flight, a keepalive / empty-transaction position is safe too, so an idle outbox does not
pin WAL written for other tables.

Memory is bounded by the *span* - from the oldest undelivered event to the newest
produced one (``inflight``), not by what is still undelivered: the queue of commits
holds at most one entry per transaction that issued events within the span, because
commits with no event since the previous one (other tables' transactions, empty B/C
pairs) are coalesced into it - they become safe at the same moment. One stuck event
and a busy server therefore cost one entry, not one per transaction. The loop caps the
span (backpressure on ``inflight``), so the delivered-ahead set is bounded too.

Pure: no I/O, no clock. It must not decide *what* to do about failures - an event that
is never delivered simply holds the watermark, and the relay replays from ``confirmed``.
"""

from __future__ import annotations

from collections import deque

from cdc_relay.delivery.watermark import Watermark
from cdc_relay.model import ZERO_LSN, Lsn


class AckTracker(Watermark):
    """Computes the safe-to-confirm LSN from produce / deliver / commit notifications.

    The sequence numbers are a Watermark's tokens (delivery/watermark.py); the commits
    are what waits for it (``_waiting``), released by ``_passed``.
    """

    __slots__ = ("_commits", "_confirmed", "_in_txn")

    def __init__(self, start: Lsn = ZERO_LSN) -> None:
        super().__init__()
        # (events issued before the commit, commit end LSN), in commit order
        self._commits: deque[tuple[int, Lsn]] = deque()
        self._waiting = self._commits  # the watermark calls _passed while any wait
        self._in_txn = False
        self._confirmed = start

    @property
    def confirmed(self) -> Lsn:
        """The highest LSN that is safe to report as flushed. Never decreases."""
        return self._confirmed

    @property
    def pending_commits(self) -> int:
        """Commits waiting for the watermark (bounded; see the module docstring)."""
        return len(self._commits)

    @property
    def idle(self) -> bool:
        """True when no transaction is open and every produced event is delivered."""
        return not self._in_txn and self._low == self._next_seq and not self._commits

    def begin(self) -> None:
        """A transaction's first message arrived."""
        self._in_txn = True

    def commit(self, end_lsn: Lsn) -> None:
        """The current transaction ended; ``end_lsn`` is safe once all events so far are acked."""
        self._in_txn = False
        if end_lsn > self._confirmed:
            commits, seq = self._commits, self._next_seq
            if commits and commits[-1][0] == seq:
                # No event since the previous commit: both become safe together.
                commits[-1] = (seq, max(end_lsn, commits[-1][1]))
            else:
                commits.append((seq, end_lsn))
            self._passed()

    def idle_position(self, lsn: Lsn) -> None:
        """A keepalive or position at which nothing of ours is pending: safe only when idle."""
        if lsn > self._confirmed and self.idle:
            self._confirmed = lsn

    def _passed(self) -> None:
        commits = self._commits
        low = self._low
        while commits and commits[0][0] <= low:
            _, lsn = commits.popleft()
            if lsn > self._confirmed:
                self._confirmed = lsn
