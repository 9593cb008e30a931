"""Start-up steps retried while a service cannot be reached (docs/design.md, failure rules).

``run`` and ``poll`` reconnect mid-run with a capped backoff; this applies the same rule
to their start-up checks, so an unreachable PostgreSQL at start is a line per attempt and
a wait, never an exit. Only reachability is retried: a refusal (``AccessRefused``), bad
configuration (``ConfigError``) or any other error a retry cannot fix leaves at once.

Must not: know what the step does, or retry anything but ``ServiceUnavailable`` itself
(and ``SourceLost``, its connection-lost form).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from cdc_relay.backoff import Backoff
from cdc_relay.errors import ServiceUnavailable, SourceLost

log = logging.getLogger("cdc_relay")

T = TypeVar("T")


def until_reachable(step: Callable[[], T], stop: threading.Event, *,
                    maximum: float = 30.0) -> T | None:
    """``step()``, retried with backoff (0.5 s doubling to ``maximum``) while it raises an
    unreachable service; None when ``stop`` is set meanwhile."""
    backoff = Backoff(0.5, maximum)
    while True:
        try:
            return step()
        except ServiceUnavailable as exc:
            if type(exc) not in (ServiceUnavailable, SourceLost):
                raise  # DatabaseError, SlotBusy, BrokerError: not a reachability problem
            delay = backoff.next_delay(time.monotonic())
            log.warning("%s; retrying in %.1fs", exc, delay)
            if stop.wait(delay):
                return None
