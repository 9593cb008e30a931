"""How polling mode's threads meet: wake-ups, the NOTIFY monitor and the thread runner.

A ``Waker`` shared by the workers is poked by the monitor thread on every NOTIFY (and by
``run_threads`` on shutdown); a generation counter means a wake-up between a worker's
last claim and its wait is never lost. ``monitor_loop`` runs on the per-process
LISTEN/count connection (a ``Monitor``, polling/admin.py): it wakes the workers
and refreshes the pending / dead-letter gauges, reconnecting with backoff.
``run_threads`` runs each loop in its own thread while the main thread only waits, so
signal handlers run promptly; an error in one stops all, then is re-raised.

Must not: claim or publish events (worker.py does), run SQL itself (the Monitor does),
or keep running threads after ``run_threads`` returns.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from cdc_relay.backoff import Backoff
from cdc_relay.errors import ServiceUnavailable
from cdc_relay.stats import PollStats

log = logging.getLogger("cdc_relay.poller")


class Waker:
    """Wakes idle workers: a generation counter, so a wake-up is never lost in between."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generation = 0

    @property
    def generation(self) -> int:
        return self._generation

    def wake(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def wait(self, since: int, timeout: float) -> bool:
        """Wait until woken after generation ``since``, or ``timeout``; True if woken."""
        with self._cond:
            return self._cond.wait_for(lambda: self._generation != since, timeout)


class Monitor(Protocol):
    """The per-process LISTEN/count connection (polling/admin.py OutboxMonitor)."""

    def open(self) -> None: ...
    def wait(self, timeout: float) -> bool: ...
    def counts(self) -> tuple[int, int]: ...
    def close(self) -> None: ...


def monitor_loop(monitor: Monitor, waker: Waker, stats: PollStats, stop: threading.Event, *,
                 listen: bool, refresh_every: float = 5.0, reconnect_max: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
    """Wake the workers on NOTIFY and refresh the pending / dead-letter gauges."""
    next_count = 0.0
    backoff = Backoff(0.5, reconnect_max)
    opened = False
    try:
        while not stop.is_set():
            try:
                if not opened:
                    monitor.open()
                    opened = True
                    waker.wake()  # notifications may have been missed while disconnected
                if clock() >= next_count:
                    pending, dead = monitor.counts()
                    with stats.lock:
                        stats.pending, stats.dead_letters = pending, dead
                    next_count = clock() + refresh_every
                timeout = max(0.0, min(1.0, next_count - clock()))
                if not listen:
                    stop.wait(timeout)
                elif monitor.wait(timeout):
                    waker.wake()
                backoff.reset()
            except ServiceUnavailable as exc:
                delay = backoff.next_delay()
                log.warning("monitor connection: %s; reconnecting in %.1fs", exc, delay)
                monitor.close()
                opened = False
                stop.wait(delay)
    finally:
        monitor.close()


def run_threads(targets: Sequence[tuple[str, Callable[[threading.Event], None]]],
                stop: threading.Event, waker: Waker) -> None:
    """Run each target in a thread until ``stop``; an error in one stops all, then re-raises.

    The calling (main) thread only waits, so signal handlers run promptly.
    """
    errors: list[BaseException] = []

    def guard(target: Callable[[threading.Event], None]) -> Callable[[], None]:
        def body() -> None:
            try:
                target(stop)
            except BaseException as exc:
                errors.append(exc)
                stop.set()
        return body

    threads = [threading.Thread(target=guard(target), name=name, daemon=True)
               for name, target in targets]
    for thread in threads:
        thread.start()
    while not stop.wait(0.5):
        pass
    waker.wake()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
