"""The low-watermark of delivered tokens: the accounting every delivery loop shares.

Tokens are handed out in order (``produced``, or a run at once: ``produced_many``);
delivery reports arrive in any order (partitions ack independently). The watermark is
contiguous: every token below ``low`` is delivered; those delivered above it wait in a
set until the watermark passes them.
``inflight`` - the span from the oldest undelivered token to the newest produced one -
is what bounds that set, so the loops cap it (backpressure).

The AckTracker (acks.py) is a Watermark that also keeps commit LSNs waiting for it; the
backfill uses a plain one over its row ordinals (a replacement producer resumes at
``low``, skipping the rows ``acknowledged`` above it). A subclass that keeps positions
waiting for the watermark keeps them in ``_waiting`` and overrides ``_passed``: the
per-report path calls it only when the watermark moved and something waits, so the
hook costs nothing per event otherwise.

Pure: no I/O, no clock; it must not decide what to do about a failed delivery - an
undelivered token simply holds the watermark.
"""

from __future__ import annotations

from collections.abc import Iterable, Sized


class Watermark:
    """Tokens ``0, 1, 2, ...`` produced in order, delivered in any order."""

    __slots__ = ("_ahead", "_low", "_next_seq", "_waiting")

    def __init__(self) -> None:
        self._next_seq = 0  # the token the next produced message gets
        self._low = 0  # every token below this is delivered
        self._ahead: set[int] = set()  # delivered tokens above _low
        self._waiting: Sized = ()  # what a subclass keeps waiting for the watermark

    @property
    def low(self) -> int:
        """Every token below this is delivered."""
        return self._low

    @property
    def inflight(self) -> int:
        """The span from the oldest undelivered token to the newest produced one.

        Tokens delivered after an undelivered one still count: the watermark remembers
        them until it passes, so this is what bounds its memory.
        """
        return self._next_seq - self._low

    @property
    def delivered_count(self) -> int:
        """How many tokens are delivered (below the watermark and above it)."""
        return self._low + len(self._ahead)

    def acknowledged(self, seq: int) -> bool:
        """Whether token ``seq`` is delivered."""
        return seq < self._low or seq in self._ahead

    def produced(self) -> int:
        """Register one message handed to the sink; return its token."""
        seq = self._next_seq
        self._next_seq = seq + 1
        return seq

    @property
    def next_token(self) -> int:
        """The token the next produced message gets."""
        return self._next_seq

    def produced_many(self, count: int) -> int:
        """Register ``count`` messages handed to the sink, the run of tokens from
        ``next_token`` on (``produced()`` ``count`` times, in one call); return the
        ``next_token`` after them.

        A loop that numbers a run itself (a Python call per message is measurable: WAL
        mode's hot path) registers it here before anything can report on it or ask about
        it: before it serves the sink (a poll or a flush: reports come only from those),
        and before it tells the watermark anything else. A report for a token not yet
        registered is taken for an unknown one and ignored.
        """
        if count < 0:
            raise ValueError(f"produced_many: a negative count ({count})")
        seq = self._next_seq + count
        self._next_seq = seq
        return seq

    def rewind(self) -> None:
        """Hand out the tokens from ``low`` again (a replacement producer resends them;
        the loop skips those already ``acknowledged``)."""
        self._next_seq = self._low

    def delivered(self, seq: int) -> None:
        """Token ``seq`` was delivered. Duplicate or unknown reports are ignored."""
        self.delivered_all((seq,))

    def delivered_all(self, seqs: Iterable[int]) -> None:
        """``delivered(seq)`` for each of ``seqs`` in turn (a sink's batch of reports), in one
        call: the watermark is stored, and ``_passed`` called, once at the end."""
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
            if self._waiting:
                self._passed()

    def delivered_through(self, seq: int) -> None:
        """Every token up to and including ``seq`` is durable (e.g. a committed Kafka txn)."""
        if seq >= self._low:
            self._low = min(seq + 1, self._next_seq)
            self._ahead = {s for s in self._ahead if s > self._low}
            while self._low in self._ahead:
                self._ahead.remove(self._low)
                self._low += 1
            self._passed()

    def _passed(self) -> None:
        """The watermark moved while something waited for it (a subclass's hook)."""
