"""The Sink protocol: what the relay loops need from a message broker.

No broker types leak through here (docs/design.md, roadmap: NATS, RabbitMQ, ... later). A sink accepts
messages tagged with an opaque token and reports, later and in any order, one delivery
per token: ``handler(token, None)`` when the broker acked it, ``handler(token, error)``
when not. Two plain arguments, no object per report: the report runs once per event on
WAL mode's hot path (docs/design.md, WAL mode's hot path). ``Delivery`` is the same
report as a record, for collecting them (``collect``). Errors are classified so the loops
can act without knowing the broker:

* ``PERMANENT``  - this message can never be delivered as is (too large, illegal topic):
  dead-letter it and go on.
* ``FATAL``      - the producer is unusable (fenced, lost producer state) or the message
  timed out: discard the producer, resume from the last confirmed position.
* ``RETRIABLE``  - transient trouble reported for this message (polling counts an attempt;
  WAL mode retries with a new producer and replays from the slot).

``Cause`` says more where a loop acts on it: ``TOO_LARGE`` (PERMANENT: the dead letter is
sent without the payload), ``TOPIC_MISSING`` / ``TOPIC_FORBIDDEN`` (RETRIABLE: broker
trouble about the topic - a topic not created yet, a brief ACL glitch - never a reason to
dead-letter the event), ``REGISTRY`` (RETRIABLE: the schema registry is unreachable or
lacks the schema: the event waits like one whose topic is missing).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from cdc_relay.model import Message


class ErrorKind(enum.Enum):
    """How a failed delivery must be handled."""

    PERMANENT = "permanent"
    FATAL = "fatal"
    RETRIABLE = "retriable"


class Cause(enum.Enum):
    """What a failure is about, beyond its kind (the value is a metric label)."""

    UNSPECIFIED = "unspecified"
    TOO_LARGE = "too_large"
    TOPIC_MISSING = "topic_missing"
    TOPIC_FORBIDDEN = "topic_authorization"
    REGISTRY = "schema_registry"


@dataclass(frozen=True, slots=True)
class DeliveryError:
    """Why a message was not delivered."""

    kind: ErrorKind
    reason: str
    cause: Cause = Cause.UNSPECIFIED


@dataclass(slots=True)
class Delivery:
    """One delivery report as a record: ``error`` is None when the broker acked it."""

    token: int
    error: DeliveryError | None = None


class QueueFull(Exception):
    """The sink's local queue is full: poll for deliveries, then try again."""


class ProduceRejected(Exception):
    """``produce`` refused the message itself (e.g. too large, illegal topic)."""

    def __init__(self, error: DeliveryError) -> None:
        super().__init__(error.reason)
        self.error = error


# handler(token, error): error is None when the broker acknowledged the message.
DeliveryHandler = Callable[[int, DeliveryError | None], None]
# delivered(tokens): the broker acknowledged each of these, in the order reported - what
# handler(token, None) says of one, for a sink that hands a poll's successes over at once.
BatchHandler = Callable[[list[int]], None]


def collect(into: list[Delivery]) -> DeliveryHandler:
    """A handler that appends every report to ``into`` as a Delivery (tests, one-off senders)."""

    def handler(token: int, error: DeliveryError | None) -> None:
        into.append(Delivery(token, error))

    return handler


def ignore_reports(_token: int, _error: DeliveryError | None) -> None:
    """A handler that drops every report: a sink built only to check its settings, or
    one no session streams through (WAL mode points it at a session, ``set_handler``)."""


class Sink(Protocol):
    """A message broker producer, as the relay loops see it."""

    def produce(self, message: Message, token: int) -> None:
        """Queue a message. Raises QueueFull (back off) or ProduceRejected (this message)."""

    def poll(self, timeout: float) -> int:
        """Serve delivery reports to the handler for up to ``timeout`` s; return how many."""

    def flush(self, timeout: float) -> int:
        """Wait until queued messages are delivered or ``timeout`` passes; return how many remain."""

    def pending(self) -> int:
        """Messages queued or in flight."""

    def close(self, timeout: float) -> None:
        """Flush for up to ``timeout`` s, then drop whatever is left (never reported)."""

    @property
    def fatal_error(self) -> DeliveryError | None:
        """Set when the producer as a whole is unusable (even with nothing in flight)."""

    def warm_up(self, timeout: float) -> None:
        """Get ready to deliver (connections, producer id); raise BrokerError if unreachable."""

    def set_handler(self, handler: DeliveryHandler, delivered: BatchHandler | None = None) -> None:
        """Hand later reports to ``handler`` instead (WAL mode points a producer it keeps
        across a reconnect at each new session: no hop per report). A sink may hand the
        successes it serves in one poll to ``delivered(tokens)``, when given, instead of
        calling ``handler(token, None)`` for each - before it serves any later report, and
        before the poll (or flush, close) returns."""


class SinkFactory(Protocol):
    """Builds a fresh sink whose delivery reports go to ``on_delivery``."""

    def __call__(self, on_delivery: DeliveryHandler) -> Sink: ...
