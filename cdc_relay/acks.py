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
from collections.abc import Iterable

from cdc_relay.model import ZERO_LSN, Lsn


class AckTracker:
    """Computes the safe-to-confirm LSN from produce / deliver / commit notifications."""

    __slots__ = ("_ahead", "_commits", "_confirmed", "_in_txn", "_low", "_next_seq")

    def __init__(self, start: Lsn = ZERO_LSN) -> None:
        self._next_seq = 0  # the sequence number the next produced event gets
        self._low = 0  # every sequence number below this is delivered
        self._ahead: set[int] = set()  # delivered sequence numbers above _low
        # (events issued before the commit, commit end LSN), in commit order
        self._commits: deque[tuple[int, Lsn]] = deque()
        self._in_txn = False
        self._confirmed = start

    @property
    def confirmed(self) -> Lsn:
        """The highest LSN that is safe to report as flushed. Never decreases."""
        return self._confirmed

    @property
    def inflight(self) -> int:
        """The span from the oldest undelivered event to the newest produced one.

        Events delivered after an undelivered one still count: the tracker remembers them
        until the watermark passes, so this is what bounds its memory.
        """
        return self._next_seq - self._low

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

    def produced(self) -> int:
        """Register one event handed to the sink; return its sequence number (the token)."""
        seq = self._next_seq
        self._next_seq = seq + 1
        return seq

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
            self._advance()

    def delivered(self, seq: int) -> None:
        """The broker acknowledged event ``seq``. Duplicate or unknown reports are ignored."""
        self.delivered_all((seq,))

    def delivered_all(self, seqs: Iterable[int]) -> None:
        """``delivered(seq)`` for each of ``seqs`` in turn (a sink's batch of reports), in one
        call: the watermark is stored, and commits it passed released, once at the end."""
        low, ahead, end = self._low, self._ahead, self._next_seq
        for seq in seqs:
            if seq == low and seq < end:
                low += 1
                while low in ahead:
                    ahead.remove(low)
                    low += 1
            elif low < seq < end:
                ahead.add(seq)
        if low != self._low:
            self._low = low
            if self._commits:
                self._advance()

    def delivered_through(self, seq: int) -> None:
        """Every event up to and including ``seq`` is durable (e.g. a committed Kafka txn)."""
        if seq >= self._low:
            self._low = min(seq + 1, self._next_seq)
            self._ahead = {s for s in self._ahead if s > self._low}
            while self._low in self._ahead:
                self._ahead.remove(self._low)
                self._low += 1
            self._advance()

    def idle_position(self, lsn: Lsn) -> None:
        """A keepalive or position at which nothing of ours is pending: safe only when idle."""
        if lsn > self._confirmed and self.idle:
            self._confirmed = lsn

    def _advance(self) -> None:
        commits = self._commits
        low = self._low
        while commits and commits[0][0] <= low:
            _, lsn = commits.popleft()
            if lsn > self._confirmed:
                self._confirmed = lsn
