"""The ``atexit`` registry of cdc_relay's throwaway local services.

Owns: the set of services that are running (or hold a temp dir) and the ``atexit`` hook
that kills each one, so that no server outlives the interpreter that started it.
``PostgresCluster`` (cdc_relay.local.postgres) and ``Broker`` (cdc_relay.local.broker) track
themselves when they first create something and untrack once it is gone.

Must not: start services, or know how to stop one beyond calling its
``_emergency_stop``.
"""

from __future__ import annotations

import atexit
import contextlib
from typing import Protocol


class _Service(Protocol):
    def _emergency_stop(self) -> None: ...


_LIVE: set[_Service] = set()


def track(service: _Service) -> None:
    """Have ``service`` killed at interpreter exit unless untracked first."""
    _LIVE.add(service)


def untrack(service: _Service) -> None:
    """``service`` is gone: nothing left for the exit hook to do."""
    _LIVE.discard(service)


@atexit.register
def _stop_all() -> None:
    """Kill every service still running when the interpreter exits."""
    for service in list(_LIVE):
        with contextlib.suppress(Exception):
            service._emergency_stop()
