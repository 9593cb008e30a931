"""The fake sink: ``FakeSink`` / ``FakeSinkFactory`` (``Sink``, ``SinkFactory``), an in-memory
sink that can fail, hold back and reorder deliveries (knobs below), for unit tests.

No services, threads or sleeps: like the real sink, a FakeSink reports deliveries only
from ``poll``, ``flush`` and ``close``, so the test decides when time passes. It keeps
the KafkaSink contract (sink/kafka/sink.py): at most one Delivery per produced message;
``close`` reports what can be delivered, then drops the rest silently; a closed sink
rejects ``produce`` with a FATAL ProduceRejected. It must stay small and obvious - a
fake that needs its own tests to be trusted defeats its purpose.

Knobs (constructor arguments, also plain attributes a test may change at any time):

Failure knobs take an ``ErrorKind`` (a generic reason is made up) or a whole
``DeliveryError`` (to give a ``Cause``, e.g. TOO_LARGE or TOPIC_MISSING).

* ``fail_tokens``  ``{token: ErrorKind}`` - the next delivery of that token fails with
  that kind; the entry is used up (a re-produce under the same token, e.g. as a dead
  letter, then succeeds unless a new entry is added).
* ``fail_topics``  ``{topic: ErrorKind}`` - every delivery to that topic fails.
* ``reject_topics`` ``{topic: ErrorKind}`` - ``produce`` to that topic raises
  ProduceRejected at once (like librdkafka's synchronous MSG_SIZE_TOO_LARGE).
* ``queue_limit``  - ``produce`` raises QueueFull while that many are pending.
* ``hold``         - deliveries wait until ``release()`` (all) or ``release(tokens...)``.
* ``reorder``      - ``f(ready_tokens) -> tokens to deliver now, in that order``; tokens
  left out stay pending. ``shuffled(seed)`` and ``reverse`` are ready-made ones.
* ``max_per_poll`` - at most that many deliveries per ``poll`` (``flush`` ignores it).
* ``fail_producer(reason)`` sets ``fatal_error`` as a fatal librdkafka error would.
* ``unreachable``  - ``warm_up`` raises BrokerError, as with no broker answering.
* ``batch_reports`` - successes of one poll go to the ``delivered(tokens)`` handler
  ``set_handler`` was given, as the Kafka sink hands them over (a failure first hands
  over the successes served before it); ``FakeSink.batch_reports_default`` when not given.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from cdc_relay.errors import BrokerError
from cdc_relay.model import Message
from cdc_relay.sink.base import (
    BatchHandler,
    Delivery,
    DeliveryError,
    DeliveryHandler,
    ErrorKind,
    ProduceRejected,
    QueueFull,
)

Reorder = Callable[[list[int]], list[int]]
Failure = ErrorKind | DeliveryError


def _error(failure: Failure, reason: str) -> DeliveryError:
    return failure if isinstance(failure, DeliveryError) else DeliveryError(failure, reason)


def shuffled(seed: int) -> Reorder:
    """A ``reorder`` that delivers the ready tokens in a seeded random order."""
    rng = random.Random(seed)

    def reorder(tokens: list[int]) -> list[int]:
        result = list(tokens)
        rng.shuffle(result)
        return result

    return reorder


def reverse(tokens: list[int]) -> list[int]:
    """A ``reorder`` that delivers the ready tokens newest first."""
    return tokens[::-1]


class FakeSink:
    """An in-memory Sink; see the module docstring for its knobs."""

    batch_reports_default = False  # ``batch_reports`` when not given (a test may flip it)

    def __init__(
        self,
        on_delivery: DeliveryHandler,
        *,
        generation: int = 1,
        fail_tokens: Mapping[int, Failure] | None = None,
        fail_topics: Mapping[str, Failure] | None = None,
        reject_topics: Mapping[str, Failure] | None = None,
        queue_limit: int | None = None,
        hold: bool = False,
        reorder: Reorder | None = None,
        max_per_poll: int | None = None,
        unreachable: bool = False,
        batch_reports: bool | None = None,
    ) -> None:
        self.generation = generation
        self.batch_reports = self.batch_reports_default if batch_reports is None else batch_reports
        self.fail_tokens: dict[int, Failure] = dict(fail_tokens or {})
        self.fail_topics: dict[str, Failure] = dict(fail_topics or {})
        self.reject_topics: dict[str, Failure] = dict(reject_topics or {})
        self.queue_limit = queue_limit
        self.hold = hold
        self.reorder = reorder
        self.max_per_poll = max_per_poll
        self.unreachable = unreachable
        self.fatal_error: DeliveryError | None = None
        self.closed = False
        self.warmed_up = False
        self.produced: list[tuple[int, Message]] = []  # every accepted message, in order
        self.delivered: list[Delivery] = []  # every report handed to the handler, in order
        self.dropped: list[tuple[int, Message]] = []  # what close() dropped unreported
        self._handler = on_delivery
        self._batch: BatchHandler | None = None
        self._queue: list[tuple[int, Message]] = []
        self._released: set[int] = set()

    @property
    def messages(self) -> list[Message]:
        """The accepted messages, in produce order."""
        return [message for _, message in self.produced]

    def produce(self, message: Message, token: int) -> None:
        """Accept a message, or raise ProduceRejected / QueueFull as configured."""
        if self.closed:
            raise ProduceRejected(DeliveryError(ErrorKind.FATAL, "fake sink is closed"))
        rejected = self.reject_topics.get(message.topic)
        if rejected is not None:
            raise ProduceRejected(_error(rejected, f"fake: produce to {message.topic!r} rejected"))
        if self.queue_limit is not None and len(self._queue) >= self.queue_limit:
            raise QueueFull(f"fake queue full ({self.queue_limit} pending)")
        self._queue.append((token, message))
        self.produced.append((token, message))

    def poll(self, timeout: float) -> int:
        """Deliver what is ready (never sleeps); return how many were reported."""
        return self._deliver(self.max_per_poll)

    def flush(self, timeout: float) -> int:
        """Deliver everything ready; return how many stay pending (held back)."""
        while self._deliver(None):
            pass
        return len(self._queue)

    def pending(self) -> int:
        """Messages accepted and not yet reported."""
        return len(self._queue)

    def close(self, timeout: float) -> None:
        """Deliver what is ready, then drop the rest without reporting it."""
        if self.closed:
            return
        self.flush(timeout)
        self.dropped.extend(self._queue)
        self._queue.clear()
        self.closed = True

    def set_handler(self, handler: DeliveryHandler, delivered: BatchHandler | None = None) -> None:
        """Hand the reports served from now on to ``handler``; with ``batch_reports``, the
        successes of each poll to ``delivered(tokens)`` when given (as the Kafka sink)."""
        self._handler = handler
        self._batch = delivered if self.batch_reports else None

    def warm_up(self, timeout: float) -> None:
        """Record the call; raise BrokerError if ``unreachable``."""
        if self.unreachable:
            raise BrokerError("fake broker unreachable")
        self.warmed_up = True

    def release(self, tokens: Iterable[int] | None = None) -> None:
        """Let held deliveries through: the given tokens, or all (and stop holding)."""
        if tokens is None:
            self.hold = False
            self._released.clear()
        else:
            self._released.update(tokens)

    def fail_producer(self, reason: str = "fake fatal producer error") -> None:
        """Make ``fatal_error`` report a producer-wide FATAL error."""
        self.fatal_error = DeliveryError(ErrorKind.FATAL, reason)

    def _deliver(self, limit: int | None) -> int:
        if self.closed:
            return 0
        ready = [token for token, _ in self._queue if not self.hold or token in self._released]
        if self.reorder is not None:
            chosen = self.reorder(ready)
            if not set(chosen) <= set(ready):
                raise ValueError(f"reorder returned tokens that are not ready: {chosen}")
            ready = chosen
        if limit is not None:
            ready = ready[:limit]
        batch, kept = self._batch, []
        for token in ready:
            index = next(i for i, (queued, _) in enumerate(self._queue) if queued == token)
            _, message = self._queue.pop(index)
            self._released.discard(token)
            error = self._failure(token, message)
            self.delivered.append(Delivery(token, error))
            if batch is not None and error is None:
                kept.append(token)
                continue
            if kept:  # successes served before a failure are handed over before it
                batch(kept)  # type: ignore[misc]  # kept only with a batch handler
                kept = []
            self._handler(token, error)
        if kept:
            batch(kept)  # type: ignore[misc]
        return len(ready)

    def _failure(self, token: int, message: Message) -> DeliveryError | None:
        failure = self.fail_tokens.pop(token, None)
        if failure is not None:
            return _error(failure, f"fake {_kind(failure)} failure of token {token}")
        failure = self.fail_topics.get(message.topic)
        if failure is not None:
            return _error(failure, f"fake {_kind(failure)} failure on topic {message.topic!r}")
        return None


def _kind(failure: Failure) -> str:
    return (failure.kind if isinstance(failure, DeliveryError) else failure).value


class FakeSinkFactory:
    """A SinkFactory of FakeSinks that numbers their generations and keeps them all.

    ``options`` go to every FakeSink; ``configure(sink)`` may set up each one further
    (``sink.generation`` tells which), e.g. to fail only the first producer.
    """

    def __init__(self, configure: Callable[[FakeSink], None] | None = None,
                 **options: Any) -> None:
        self.sinks: list[FakeSink] = []
        self._configure = configure
        self._options = options

    def __call__(self, on_delivery: DeliveryHandler) -> FakeSink:
        sink = FakeSink(on_delivery, generation=len(self.sinks) + 1, **self._options)
        if self._configure is not None:
            self._configure(sink)
        self.sinks.append(sink)
        return sink

    @property
    def generations(self) -> int:
        """How many sinks were built."""
        return len(self.sinks)

    @property
    def current(self) -> FakeSink:
        """The newest sink (IndexError if none was built yet)."""
        return self.sinks[-1]
