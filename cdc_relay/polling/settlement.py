"""Polling mode's pure verdict on a batch: whose fault each failure is, and the counters.

``settle`` sorts a batch's claimed events by their delivery results into processed,
failed (an attempt is counted) and released (no attempt); worker.py writes the verdict.

Whose fault is a failure? Only the event's own: a routing error, a rejected or
permanently refused message, or a retriable failure while other events of the batch
got through. Broker-wide trouble - no event of the batch acknowledged while deliveries
failed retriably, fatally or not at all - is not: those rows are released without an
attempt and the worker waits for the broker (docs/design.md, failure rules). A fatal producer error,
or a missing delivery report, means the sink must be discarded; its undelivered events
are released, never counted. One bad event never aborts its batch.

Strict order (``--strict-order``): once an event of an aggregate is not acknowledged
(failed, held back or unreported), its later events in the batch are released without an
attempt - even those the broker already acknowledged: marking them processed would let
them stand as published before the earlier event ever is. They go out again after it
(a duplicate, but the last copies arrive in order), and the failed event stays the
aggregate's head until it succeeds or is dead-lettered.

The counters the workers and the monitor update (``PollStats``) are cdc_relay/stats.py's.
Must not: do I/O, sleep, or log.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from cdc_relay.model import OutboxEvent
from cdc_relay.sink.base import Cause, DeliveryError, ErrorKind

MAX_ERROR_LENGTH = 2000  # last_error is for people; a broker's essay is cut here


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """``retry_after = now() + min(base * 2**failures, maximum) * (1 ± jitter)``."""

    base: float = 1.0
    maximum: float = 300.0
    jitter: float = 0.1


def backoff_delay(failures_before: int, policy: BackoffPolicy, rand: float) -> float:
    """Seconds until a failed event may be tried again.

    ``failures_before`` is how many attempts had failed before this one (the row's
    ``attempts`` when it was claimed), so the first failure waits ``base``.
    ``rand`` in [0, 1) picks the jitter; the result stays within [0, maximum].
    """
    exponent = max(0, failures_before)
    # 2.0**1100 overflows a float: past ~60 doublings every base is above any maximum.
    delay = policy.maximum if exponent > 60 else min(policy.base * 2.0**exponent, policy.maximum)
    jittered = delay * (1.0 + policy.jitter * (2.0 * rand - 1.0))
    return min(max(jittered, 0.0), policy.maximum)


@dataclass(frozen=True, slots=True)
class AttemptFailure:
    """A failed attempt to record: the event, why, and the backoff chosen for it."""

    event: OutboxEvent
    reason: str
    delay: float


@dataclass(frozen=True, slots=True)
class Completion:
    """What ``complete`` wrote: ids marked processed, ids that became dead letters."""

    processed: int
    failed: int
    dead_lettered: tuple[str, ...]



class Unsettled(enum.Enum):
    """Why a claimed event has no delivery outcome."""

    HELD = "held back behind an earlier failure of its aggregate"
    UNREPORTED = "no delivery report (the producer was discarded or timed out)"


# Per claimed event: None = acknowledged, a DeliveryError, or Unsettled.
Result = DeliveryError | Unsettled | None


@dataclass(frozen=True, slots=True)
class Settlement:
    """What to write for one batch."""

    processed: list[OutboxEvent]
    failures: list[tuple[OutboxEvent, str]]
    released: list[OutboxEvent]
    broker_down: bool
    discard_sink: bool
    topic_trouble: int = 0  # events released because their topic is missing or forbidden
    topic_reasons: tuple[str, ...] = ()  # why, once per distinct reason (each names the fix)


def settle(events: Sequence[OutboxEvent], results: Sequence[Result], *, strict: bool) -> Settlement:
    """Sort a batch's outcomes into processed / failed (an attempt) / released (none).

    See the module docstring for whose fault a failure is. With ``strict``, only the
    first failure of each aggregate counts; its later events are released.
    """
    acked = any(result is None for result in results)
    topic_trouble = sum(1 for result in results if _topic_trouble(result))
    topic_reasons = tuple(dict.fromkeys(
        result.reason for result in results
        if isinstance(result, DeliveryError) and _topic_trouble(result)))
    broker_down = not acked and any(
        result is Unsettled.UNREPORTED
        or (isinstance(result, DeliveryError) and result.kind is not ErrorKind.PERMANENT)
        for result in results
    )
    discard = any(
        result is Unsettled.UNREPORTED
        or (isinstance(result, DeliveryError) and result.kind is ErrorKind.FATAL)
        for result in results
    )
    processed: list[OutboxEvent] = []
    failures: list[tuple[OutboxEvent, str]] = []
    released: list[OutboxEvent] = []
    blocked: set[tuple[str, str]] = set()
    for event, result in zip(events, results, strict=True):
        aggregate = (event.aggregate_type, event.aggregate_id)
        if aggregate in blocked:
            released.append(event)
            continue
        if strict and result is not None:
            blocked.add(aggregate)
        if result is None:
            processed.append(event)
        elif _topic_trouble(result):
            released.append(event)  # the broker's trouble, not the event's: no attempt
        elif isinstance(result, DeliveryError) and (result.kind is ErrorKind.PERMANENT or (
                result.kind is ErrorKind.RETRIABLE and not broker_down)):
            failures.append((event, result.reason))
        else:
            released.append(event)
    return Settlement(processed, failures, released, broker_down, discard, topic_trouble,
                      topic_reasons)


_TOPIC_CAUSES = (Cause.TOPIC_MISSING, Cause.TOPIC_FORBIDDEN, Cause.REGISTRY)


def _topic_trouble(result: Result) -> bool:
    """A missing or forbidden topic: retried (after a wait), never an attempt or a dead letter."""
    return isinstance(result, DeliveryError) and result.cause in _TOPIC_CAUSES
