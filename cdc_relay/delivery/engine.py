"""The delivery engine: messages in flight on one producer, and the failure rules for them.

One ``Engine`` per producer generation of a loop (a WAL session, a backfill run between
two producer replacements). The loop hands it routed events under tokens it drew from
its watermark; the engine produces them with backpressure and acts on every delivery
report (docs/design.md, failure rules):

* acknowledged → the tokens go to the loop's ``acked`` (its watermark), counted;
* refused for good (``PERMANENT``; a routing error is one too) → re-sent to the
  dead-letter topic under the same token, so the watermark waits for *that* ack; a
  ``Cause.TOO_LARGE`` refusal sends it without the payload (the sink classifies: the
  engine never reads error text); a dead letter refused again → ``DeadLetterRefused``:
  the relay stops, since replaying would repeat it for ever and skipping would confirm
  past it;
* a missing or forbidden topic → ``TopicUnavailable``, anything else failed or timed
  out, or a producer with a ``fatal_error`` → ``ProducerFailed``: the loop discards the
  producer and resumes from its watermark with a new one (delivery/producer.py).

Backpressure: ``produce`` retries a full producer queue (``QueueFull``, librdkafka's
BufferError) after serving delivery reports (``poll``), checking for failures and
calling the loop's ``serve`` (status updates, row marking) - until there is room, or,
with a ``stop`` event, until a stop request (``Stopped``: the message is not sent).

WAL mode's per-event path inlines ``send`` (a Python call per event is measurable:
docs/design.md, WAL mode's hot path) and reads ``inflight`` / ``inflight_bytes``
directly; everything else goes through the methods.

Must not: know a mode (LSNs, rows, claims), sleep, import a driver, or decide *when* a
loop reads more - the loop owns its flow limits and its watermark.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from cdc_relay.errors import DeadLetterRefused, RelayError
from cdc_relay.logs import event_fields
from cdc_relay.model import InFlight, Message, OutboxEvent
from cdc_relay.routing import Router, RoutingError
from cdc_relay.sink.base import (
    Cause,
    DeliveryError,
    ErrorKind,
    ProduceRejected,
    QueueFull,
    Sink,
)

log = logging.getLogger("cdc_relay.relay")

_TOPIC_CAUSES = (Cause.TOPIC_MISSING, Cause.TOPIC_FORBIDDEN, Cause.REGISTRY)
_ROOM_WAIT = 0.05  # seconds a full producer queue is served before the next attempt


class ProducerFailed(RelayError):
    """The producer cannot be trusted any more: resume with a new one from the watermark."""

    reason = "producer_failed"  # the label of cdc_relay_delivery_retries_total


class TopicUnavailable(ProducerFailed):
    """A topic is missing or not authorized: broker trouble, retried, never dead-lettered."""

    def __init__(self, message: str, cause: Cause) -> None:
        super().__init__(message)
        self.reason = cause.value


class Stopped(Exception):
    """A stop request arrived while waiting for room in the producer's queue."""


class Counters(Protocol):
    """The plain counters the engine updates (RelayStats, BackfillStats)."""

    published: int
    dead_lettered: int
    failed_by_type: dict[str, int]


def offer(sink: Sink, message: Message, token: int, full: Callable[[], None]) -> None:
    """Produce ``message``; while the producer's queue is full, call ``full()`` (serve the
    sink, or raise to give up) and try again. ``ProduceRejected`` is the caller's."""
    while True:
        try:
            sink.produce(message, token)
            return
        except QueueFull:
            full()


def _no_service() -> None:
    return None


class Engine:
    """Messages in flight on one producer; see the module docstring."""

    __slots__ = ("_acked", "_failed", "_log", "_route", "_router", "_serve", "_stop", "counters",
                 "dead_lettered", "failure", "inflight", "inflight_bytes", "redo", "sink")

    def __init__(self, sink: Sink, router: Router, counters: Counters,
                 acked: Callable[[list[int]], None], *,
                 serve: Callable[[], None] = _no_service, stop: threading.Event | None = None,
                 failed: Callable[[InFlight, DeliveryError], bool] | None = None,
                 logger: logging.Logger = log) -> None:
        """``acked(tokens)``: the loop's watermark; ``serve()``: the loop's own chores while
        the producer's queue is full; ``stop``: honoured while waiting for room;
        ``failed(event, error)``: True when the loop handled a failed delivery itself
        (exactly-once aborts its transaction instead); ``logger``: the loop's."""
        self.sink = sink
        self.counters = counters
        self._router = router
        self._route = router.route
        self._acked = acked
        self._serve = serve
        self._stop = stop
        self._failed = failed
        self._log = logger
        self.inflight: dict[int, InFlight] = {}
        self.inflight_bytes = 0
        # Tokens now carried by a dead-letter message -> whether its payload was omitted.
        self.dead_lettered: dict[int, bool] = {}
        self.redo: list[tuple[int, Message]] = []  # dead letters to produce from the loop
        self.failure: RelayError | None = None

    # -- producing -----------------------------------------------------------------
    def send(self, token: int, event: OutboxEvent) -> None:
        """Route ``event`` and produce it under ``token`` (a routing error: its dead letter)."""
        self.inflight[token] = event
        self.inflight_bytes += len(event.payload)
        try:
            message = self._route(event)
        except RoutingError as exc:
            message = self.dead_letter(token, DeliveryError(ErrorKind.PERMANENT, str(exc)))
        self.produce(token, message)

    def produce(self, token: int, message: Message) -> None:
        """Produce ``message`` for the event in flight under ``token``, waiting for room in
        the producer's queue; a refusal for good sends its dead letter instead."""
        while True:
            try:
                offer(self.sink, message, token, self._wait_for_room)
                return
            except ProduceRejected as exc:
                error = exc.error
                if error.kind is not ErrorKind.PERMANENT:
                    raise self.failure_for(self.inflight[token], error) from exc
                message = self.dead_letter(token, error)

    def produce_redo(self) -> None:
        """Produce the dead letters of refused deliveries (reports cannot produce)."""
        redo, self.redo = self.redo, []
        for token, message in redo:
            self.produce(token, message)

    def _wait_for_room(self) -> None:
        # The producer's own queue is the bound: serve acks, stay alive, retry - unless
        # asked to stop (the message was not sent: it is sent again next time).
        if self._stop is not None and self._stop.is_set():
            raise Stopped
        self.sink.poll(_ROOM_WAIT)
        self.check()
        self._serve()

    def check(self) -> None:
        """Raise what ends this producer's run: a failed delivery, a failed producer."""
        if self.failure is not None:
            raise self.failure
        fatal = self.sink.fatal_error
        if fatal is not None:
            raise ProducerFailed(f"producer failed: {fatal.reason}")

    # -- delivery reports (called from sink.poll) ------------------------------------
    def on_delivery(self, token: int, error: DeliveryError | None) -> None:
        """One delivery report: a success to ``on_delivered``, a failure acted on."""
        if error is None:
            self.on_delivered([token])
            return
        event = self.inflight.get(token)  # not delivered: stays in flight (dead letter, replay)
        if event is None:
            return
        failed = self.counters.failed_by_type
        failed[event.event_type] = failed.get(event.event_type, 0) + 1
        if self._failed is not None and self._failed(event, error):
            return
        if error.kind is ErrorKind.PERMANENT:
            try:
                self.redo.append((token, self.dead_letter(token, error)))
            except DeadLetterRefused as exc:
                self.fail(exc)
            return
        self.fail(self.failure_for(event, error))

    def on_delivered(self, tokens: list[int]) -> None:
        """Successes: every success comes here, a poll's at once from a sink that hands them
        over so, one call per event otherwise (docs/design.md, "The compiled delivery
        report")."""
        inflight, dead_lettered = self.inflight, self.dead_lettered
        size = dead = 0
        known: list[int] = []
        for token in tokens:
            event = inflight.pop(token, None)
            if event is None:
                continue  # as on_delivery: not in flight (any more), ignored
            known.append(token)
            size += len(event.payload)
            if dead_lettered and dead_lettered.pop(token, None) is not None:
                dead += 1
        self._acked(known)
        self.inflight_bytes -= size
        counters = self.counters
        counters.published += len(known) - dead
        if dead:
            counters.dead_lettered += dead

    # -- the failure rules -----------------------------------------------------------
    def failure_for(self, event: InFlight, error: DeliveryError) -> ProducerFailed:
        """What a failed delivery that is not the event's fault ends the run with."""
        if error.cause in _TOPIC_CAUSES:
            # The sink's reason names what is missing and the fix, in its own words.
            return TopicUnavailable(
                f"destination not available for event {event.id} ({error.reason}): retrying, "
                "nothing is dead-lettered", error.cause)
        self._log.warning("delivery failed (%s): %s", error.kind.value, error.reason,
                          extra=event_fields(event))
        return ProducerFailed(f"delivery of event {event.id} failed: {error.reason}")

    def fail(self, failure: RelayError) -> None:
        """Remember what ends the run (the first failure; a refused dead letter wins)."""
        if self.failure is None or isinstance(failure, DeadLetterRefused):
            self.failure = failure

    def dead_letter(self, token: int, error: DeliveryError) -> Message:
        """The dead letter to send for the event under ``token``, refused for good.

        First refusal: the event goes to the dead-letter topic. If that is refused as too
        large, once more without the payload. Beyond that nothing can deliver it, and
        skipping it would confirm past it, while replaying would repeat the refusal for
        ever: DeadLetterRefused stops the relay.
        """
        event = self.inflight[token]
        too_large = error.cause is Cause.TOO_LARGE
        omitted = self.dead_lettered.get(token)
        if omitted is not None and (omitted or not too_large):
            raise DeadLetterRefused(
                f"the dead-letter topic {self._router.config.dead_letter_topic!r} refused "
                f"event {event.id}: {error.reason}; stopped without confirming past it - fix "
                "the topic (its name, size limit or ACLs, --dead-letter-topic) and start again")
        self._log.warning("dead-lettering event: %s", error.reason, extra=event_fields(event))
        message = self._router.dead_letter(event, error.reason)
        if too_large:
            # The payload itself is what the broker refuses: keep the headers (the event
            # id finds the row) and say what was dropped.
            message = replace(message, value=b"", headers=[
                *message.headers, ("payload_omitted_bytes", str(len(message.value or b"")).encode())])
        self.dead_lettered[token] = too_large
        return message
