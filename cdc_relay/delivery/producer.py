"""Building a replacement producer: create it, warm it up, give up on what cannot work.

Every loop that replaces a failed producer (WAL mode's relay, the backfill) builds the
next one here: ``new_producer`` creates it through the loop's ``SinkFactory`` and warms
it up (connections, a producer id) before the loop trusts it. What time can fix - a
broker that does not answer, a producer that cannot be created - is a
``ProducerFailed``, which the loop retries after its ``Backoff`` (cdc_relay/backoff.py);
what it cannot - a bad ``--producer-config`` (``ConfigError``), refused credentials
(``AccessRefused``) - is raised as is (docs/design.md, failure rules).

Must not: wait between attempts (the loop owns its Backoff and its stop event) or keep
the producer: the loop does.
"""

from __future__ import annotations

from collections.abc import Callable

from cdc_relay.delivery.engine import ProducerFailed
from cdc_relay.errors import AccessRefused, ConfigError, RelayError
from cdc_relay.sink.base import Sink, SinkFactory, ignore_reports

_WARMUP_SLICE = 1.0  # seconds per warm-up attempt, so a stop request is seen in time


def warm_up(sink: Sink, timeout: float, clock: Callable[[], float],
            stopped: Callable[[], bool]) -> bool:
    """Warm ``sink`` up within ``timeout`` s: True when ready, False when stopped meanwhile.

    A broker that does not answer in time is a ProducerFailed; the caller closes the sink.
    """
    deadline = clock() + timeout
    while True:
        try:
            sink.warm_up(max(0.0, min(_WARMUP_SLICE, deadline - clock())))
            return True
        except AccessRefused:
            raise  # credentials or permissions: retrying cannot fix it (exit 6)
        except RelayError as exc:
            if stopped():
                return False
            if clock() >= deadline:
                raise ProducerFailed(f"broker not reachable: {exc}") from exc


def new_producer(factory: SinkFactory, *, warmup: float, clock: Callable[[], float],
                 stopped: Callable[[], bool]) -> Sink | None:
    """A fresh producer, warmed up, reporting nowhere yet (the loop points it at its
    engine with ``set_handler``); None if stopped meanwhile."""
    try:
        sink = factory(ignore_reports)
    except ConfigError:
        raise  # a bad --producer-config: retrying cannot fix it
    except RelayError as exc:
        raise ProducerFailed(f"cannot create the producer: {exc}") from exc
    try:
        ready = warm_up(sink, warmup, clock, stopped)
    except BaseException:
        sink.close(0)
        raise
    if not ready:
        sink.close(0)
        return None
    return sink
