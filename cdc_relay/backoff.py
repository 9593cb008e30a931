"""Capped exponential backoff for waits between reconnects and retries (pure; no clock, no sleep).

One ``Backoff`` per thing that is retried (WAL mode's reconnects, a polling worker's
wait for the broker or the database). ``next_delay()`` hands out ``minimum``, then
doubles up to ``maximum``. The delay comes back down on its own: ``healthy(now)`` marks
the moment things started working, and a ``next_delay(now)`` after at least
``healthy_after`` seconds of that starts again from ``minimum``; ``reset()`` does it at
once. So one bad hour does not make every later incident wait the maximum.

The caller owns the clock and the waiting; this module only does the arithmetic. The
per-event retry schedule of polling mode (``retry_after`` with jitter) is a different
policy and lives in polling/settlement.py.
"""

from __future__ import annotations


class Backoff:
    """Delays ``minimum, 2·minimum, …, maximum``; back to ``minimum`` after a healthy period."""

    __slots__ = ("_delay", "_healthy_since", "healthy_after", "maximum", "minimum")

    def __init__(self, minimum: float, maximum: float, *, healthy_after: float = 60.0) -> None:
        self.minimum = max(0.0, minimum)
        self.maximum = max(self.minimum, maximum)
        self.healthy_after = healthy_after
        self._delay = self.minimum
        self._healthy_since: float | None = None

    @property
    def current(self) -> float:
        """The delay the next ``next_delay()`` returns (ignoring a healthy period)."""
        return self._delay

    def next_delay(self, now: float | None = None) -> float:
        """The delay to wait before the next attempt; the one after it doubles (capped).

        With ``now``: if things had been healthy for ``healthy_after`` seconds since the
        last ``healthy()`` call, start again from ``minimum``.
        """
        since = self._healthy_since
        if since is not None and now is not None and now - since >= self.healthy_after:
            self._delay = self.minimum
        self._healthy_since = None
        delay = self._delay
        self._delay = min(max(delay * 2, self.minimum), self.maximum)
        return delay

    def healthy(self, now: float) -> None:
        """Things work again since ``now`` (the first call of a healthy stretch counts)."""
        if self._healthy_since is None:
            self._healthy_since = now

    def reset(self) -> None:
        """Start again from ``minimum`` now (e.g. after a clean stop or a proven success)."""
        self._delay = self.minimum
        self._healthy_since = None
