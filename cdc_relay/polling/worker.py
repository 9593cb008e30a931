"""One polling worker's loop: claim a batch, route, produce, await every report, settle.

One ``PollWorker`` per worker thread, each with its own database connection (a
``BatchSource``, see polling/claims.py) and its own sink. A batch is one transaction:

1. claim up to ``batch_size`` ready rows (``FOR UPDATE SKIP LOCKED``: concurrent
   workers and processes never hold the same row);
2. route and produce all of them, then wait until every produced message has a
   delivery report (bounded by the producer's message timeout);
3. ``settle`` (pure, settlement.py) sorts the outcome, then one UPDATE marks successes
   processed (premarked, see below), one records failures (attempts + 1, last_error,
   retry_after; dead_lettered_at at the maximum), and the transaction commits.

Premarking (``pipeline``, on by default; off with ``--no-pipeline``): while step 2
waits for the delivery reports, a helper thread already runs step 3's marking UPDATE
for every produced event (``BatchSource.premark``), inside the batch's own uncommitted
transaction. Nothing is visible before the COMMIT, which still comes only after every
report is in; ``complete`` first undoes the marking for each event that did not end up
acknowledged, so what commits is exactly what ``settle`` decided. The UPDATE's time
(PostgreSQL's largest share of a batch) thus overlaps the broker's, and the critical
path after the last ack is one COMMIT. docs/design.md, polling mode, says why every polling
guarantee holds; the measurements are docs/decisions/2026-12-01-polling-premark.md.

After broker-wide trouble (see settlement.py) the worker stops claiming and waits, with
backoff, until a broker answers again (docs/design.md, failure rules); a fatal producer
error, and a missing or forbidden topic, discard the sink. With ``--strict-order`` the
source claims whole aggregate prefixes under advisory locks, and once an event of an
aggregate fails its later events in the batch are not produced.

An event given up on is also copied to the dead-letter topic (best effort: the row's
``dead_lettered_at`` is the dead letter; the topic tells consumers, as in WAL mode).
Producing waits for room in a full producer queue as every loop does (the delivery
engine's ``offer``, delivery/engine.py), for at most the delivery timeout; what a
refusal means is polling's own: an attempt counted, then ``dead_lettered_at``.

Wake-ups: the shared ``Waker`` (threads.py) is poked on every NOTIFY; ``interval`` is
the fallback tick; while batches come back non-empty the worker claims again at once.
Must not: run SQL itself, know Kafka types, or sleep while holding a claimed batch
except to wait for delivery reports.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from cdc_relay.backoff import Backoff
from cdc_relay.delivery.engine import offer
from cdc_relay.errors import BrokerError, DatabaseError, ServiceUnavailable
from cdc_relay.logs import event_fields
from cdc_relay.model import Message, OutboxEvent
from cdc_relay.polling.settlement import (
    AttemptFailure,
    BackoffPolicy,
    Completion,
    Result,
    Settlement,
    Unsettled,
    backoff_delay,
    settle,
)
from cdc_relay.polling.threads import Waker
from cdc_relay.routing import Router, RoutingError
from cdc_relay.sink.base import (
    DeliveryError,
    ErrorKind,
    ProduceRejected,
    Sink,
    SinkFactory,
)
from cdc_relay.stats import PollStats

log = logging.getLogger("cdc_relay.poller")


class _QueueStayedFull(Exception):
    """The producer's queue stayed full for the delivery timeout: a broker that takes nothing."""


class BatchSource(Protocol):
    """What a worker needs from its database connection (polling/claims.py)."""

    @property
    def connected(self) -> bool: ...
    def open(self) -> None: ...
    def close(self) -> None: ...
    def claim(self, limit: int, max_attempts: int, *, strict_order: bool = False) -> list[OutboxEvent]: ...
    def complete(self, processed: Sequence[OutboxEvent], failures: Sequence[AttemptFailure],
                 max_attempts: int) -> Completion: ...
    def release(self) -> None: ...
    def premark(self, events: Sequence[OutboxEvent]) -> None: ...


@dataclass(frozen=True, slots=True)
class PollerSettings:
    """How one worker behaves (from PollConfig plus the producer's timeout)."""

    batch_size: int = 100
    interval: float = 1.0
    max_attempts: int = 5
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)
    strict_order: bool = False
    pipeline: bool = True  # premark while the reports are awaited (``run`` only)
    delivery_timeout: float = 40.0  # > message.timeout.ms: librdkafka reports first
    broker_wait_min: float = 0.5
    broker_wait_max: float = 30.0
    warmup_timeout: float = 5.0
    reconnect_max: float = 30.0


class PollWorker:
    """One polling loop: its own connection (``source``) and its own sink."""

    def __init__(self, *, source: BatchSource, router: Router, sink_factory: SinkFactory,
                 settings: PollerSettings, waker: Waker, stats: PollStats,
                 clock: Callable[[], float] = time.monotonic,
                 rand: Callable[[], float] = random.random) -> None:
        self._source = source
        self._router = router
        self._sink_factory = sink_factory
        self._settings = settings
        self._waker = waker
        self.stats = stats
        self._clock = clock
        self._rand = rand
        self._sink: Sink | None = None
        self._broker_suspect = True  # warm the producer up before the first claim
        self._broker_backoff = Backoff(settings.broker_wait_min, settings.broker_wait_max)
        self._broker_problem = "no broker answers"
        self._topic_wait = False  # the last batch had events whose topic is not available
        self._results: list[Result] = []
        self._tokens: dict[int, int] = {}  # token -> index in the current batch
        self._next_token = 0
        self._helper: ThreadPoolExecutor | None = None  # runs premark (``run`` with pipeline)
        self._room_deadline: float | None = None  # while the producer's queue is full

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set; the batch in hand is always finished first."""
        db_backoff = Backoff(self._settings.broker_wait_min, self._settings.reconnect_max)
        if self._settings.pipeline:
            self._helper = ThreadPoolExecutor(
                1, thread_name_prefix=f"{threading.current_thread().name}-premark")
        try:
            while not stop.is_set():
                self.stats.last_tick = self._clock()
                since = self._waker.generation
                try:
                    if not self.ensure_broker():
                        self._wait_for_broker(stop)
                        continue
                    claimed = self.poll_once()
                    db_backoff.reset()
                    self.stats.connected = True
                    if self._topic_wait:
                        self._wait_for_broker(stop)
                        continue
                except ServiceUnavailable as exc:
                    self.stats.connected = False
                    delay = db_backoff.next_delay()
                    log.warning("%s; retrying in %.1fs", exc, delay)
                    self._source.close()
                    stop.wait(delay)
                    continue
                if not claimed:
                    self._waker.wait(since, self._settings.interval)
        finally:
            self._source.close()
            if self._helper is not None:
                self._helper.shutdown(wait=True)
                self._helper = None
            if self._sink is not None:
                self._sink.close(5.0)
                self._sink = None

    def poll_once(self) -> int:
        """Claim, publish and settle one batch; return how many rows were claimed."""
        settings = self._settings
        events = self._source.claim(settings.batch_size, settings.max_attempts,
                                    strict_order=settings.strict_order)
        if not events:
            return 0
        started = self._clock()
        premarked: list[Future[None]] = []

        def premark(produced: list[OutboxEvent]) -> None:
            if self._helper is not None and produced:
                premarked.append(self._helper.submit(self._source.premark, produced))

        try:
            results = self._publish(events, premark)
            for future in premarked:
                future.result()  # a lost connection or a refusal raises here, after the reports
            settlement = settle(events, results, strict=settings.strict_order)
            failures = [
                AttemptFailure(event, reason,
                               backoff_delay(event.attempt - 1, settings.backoff, self._rand()))
                for event, reason in settlement.failures
            ]
            if not settlement.discard_sink:
                self._publish_dead_letters(
                    [f for f in failures if f.event.attempt >= settings.max_attempts])
            completion = self._source.complete(settlement.processed, failures, settings.max_attempts)
        except BaseException:
            for future in premarked:  # the connection is the premark's until it is done
                self._premark_refused(future.exception())
            self._source.release()
            raise
        self.stats.record(settlement, completion, self._clock() - started)
        self._report(settlement, failures, completion)
        if settlement.discard_sink or settlement.topic_trouble:
            # A missing or forbidden topic too, as in WAL mode: the producer would refuse its
            # next produce() from cached metadata, without the topic's name, until a refresh
            # minutes later; a new one asks again, and its reports name the topic and the fix.
            self._discard_sink()
        if settlement.broker_down:
            self._broker_suspect = True
            self.stats.broker_ok = False
        self._topic_wait = settlement.topic_trouble > 0
        if self._topic_wait:
            reasons = settlement.topic_reasons  # each in the sink's words, with its fix
            more = (f"; and {len(reasons) - 1} other destination problem(s)"
                    if len(reasons) > 1 else "")
            self._broker_problem = (
                f"destination not available for {settlement.topic_trouble} event(s) "
                f"({reasons[0] if reasons else 'missing, or the producer may not write to it'}"
                f"{more}): nothing is dead-lettered and no attempt counted")
        elif settlement.processed:
            self._broker_backoff.reset()
        return len(events)

    def _premark_refused(self, error: BaseException | None) -> None:
        """A premark PostgreSQL refused (not a lost connection): premark no more.

        The refusal ended the batch's transaction while its messages were in flight, so
        another poller could claim them meanwhile (docs/design.md, polling mode). After
        the first one this worker marks after the acks, as with ``--no-pipeline``, so
        that window opens at most once per worker, not once per batch.
        """
        if (isinstance(error, DatabaseError) and self._source.connected
                and self._helper is not None):
            log.warning("PostgreSQL refused the early marking UPDATE (%s): this worker now "
                        "marks each batch after its acks, as with --no-pipeline", error)
            self._helper.shutdown(wait=False)
            self._helper = None

    # -- the broker ---------------------------------------------------------------
    def ensure_broker(self) -> bool:
        """Build the sink if needed; after any broker trouble, True only once a broker answers."""
        if self._sink is None:
            self._sink = self._sink_factory(self._on_delivery)
            self._broker_suspect = True
        if not self._broker_suspect:
            return True
        try:
            self._sink.warm_up(self._settings.warmup_timeout)
        except BrokerError as exc:
            self._broker_problem = str(exc)
            return False
        self._broker_suspect = False
        self._broker_backoff.reset()
        self.stats.broker_ok = True
        return True

    def _wait_for_broker(self, stop: threading.Event) -> None:
        self.stats.broker_ok = False
        delay = self._broker_backoff.next_delay()
        log.warning("%s; not claiming events, checking again in %.1fs",
                    self._broker_problem, delay)
        stop.wait(delay)

    def _discard_sink(self) -> None:
        if self._sink is not None:
            self._sink.close(0)
        self._sink = None
        self._broker_suspect = True

    # -- one batch ----------------------------------------------------------------
    def _on_delivery(self, token: int, error: DeliveryError | None) -> None:
        index = self._tokens.pop(token, None)
        if index is not None:  # reports of an earlier batch or producer are stale
            self._results[index] = error

    def _publish(self, events: Sequence[OutboxEvent],
                 produced: Callable[[list[OutboxEvent]], None] | None = None) -> list[Result]:
        """Produce ``events`` and wait for their reports; before waiting, ``produced`` is
        told which events went out (acknowledged already, or awaiting a report)."""
        assert self._sink is not None
        sink = self._sink
        self._results = [Unsettled.UNREPORTED] * len(events)
        self._tokens = {}
        held: set[tuple[str, str]] = set()
        for index, event in enumerate(events):
            aggregate = (event.aggregate_type, event.aggregate_id)
            if aggregate in held:
                self._results[index] = Unsettled.HELD
                continue
            error = self._produce(sink, index, event)
            if error is Unsettled.UNREPORTED:
                break  # the producer's queue stayed full: the rest stays unreported too
            if error is not None:
                self._results[index] = error
                if self._settings.strict_order:
                    held.add(aggregate)
        if produced is not None:
            produced([event for event, result in zip(events, self._results, strict=True)
                      if result is None or result is Unsettled.UNREPORTED])
        self._await_reports(sink)
        self._tokens = {}
        return self._results

    def _produce(self, sink: Sink, index: int, event: OutboxEvent) -> Result:
        try:
            message = self._router.route(event)
        except RoutingError as exc:
            return DeliveryError(ErrorKind.PERMANENT, f"cannot route: {exc.reason}")
        return self._send(sink, index, message)

    def _send(self, sink: Sink, index: int, message: Message) -> Result:
        """Produce one message: None when queued, its refusal, or UNREPORTED when the
        producer's queue stayed full for the delivery timeout (a broker that takes
        nothing: the batch is then settled like one whose reports are missing, and the
        producer discarded)."""
        token = self._next_token
        self._next_token += 1
        self._tokens[token] = index
        self._room_deadline = None
        try:
            offer(sink, message, token, self._wait_for_room)  # the engine's backpressure
            return None
        except _QueueStayedFull:
            self._tokens.pop(token, None)
            return Unsettled.UNREPORTED
        except ProduceRejected as exc:
            self._tokens.pop(token, None)
            return exc.error

    def _wait_for_room(self) -> None:
        """The producer's queue is full: serve its reports, for at most the delivery timeout."""
        now = self._clock()
        if self._room_deadline is None:
            self._room_deadline = now + self._settings.delivery_timeout
        elif now >= self._room_deadline:
            raise _QueueStayedFull
        assert self._sink is not None
        self._sink.poll(0.05)

    def _publish_dead_letters(self, failures: Sequence[AttemptFailure]) -> None:
        """Copy events that are given up on to the dead-letter topic, as WAL mode does.

        Best effort: the row's ``dead_lettered_at`` is the dead letter (``dead-letters
        list|retry``); the topic only tells consumers. A failure here is logged, never
        counted, and never keeps the row from being dead-lettered.
        """
        if not failures or self._sink is None:
            return
        sink = self._sink
        self._results = [Unsettled.UNREPORTED] * len(failures)
        self._tokens = {}
        for index, failure in enumerate(failures):
            error = self._send(sink, index, self._router.dead_letter(failure.event, failure.reason))
            if error is Unsettled.UNREPORTED:
                break
            if error is not None:
                self._results[index] = error
        self._await_reports(sink)
        self._tokens = {}
        for failure, result in zip(failures, self._results, strict=True):
            if result is not None:
                reason = result.reason if isinstance(result, DeliveryError) else result.value
                log.warning("dead letter not copied to %s: %s", self._router.config.dead_letter_topic,
                            reason, extra=event_fields(failure.event))

    def _await_reports(self, sink: Sink) -> None:
        deadline = self._clock() + self._settings.delivery_timeout
        while self._tokens:
            remaining = deadline - self._clock()
            if remaining <= 0:
                log.warning("%d delivery reports missing after %.0fs; discarding the producer",
                            len(self._tokens), self._settings.delivery_timeout)
                return
            if sink.fatal_error is not None:
                sink.poll(0)  # reports already queued still count; the rest never come
                return
            # flush, not poll: the batch is complete, so send it now instead of waiting out
            # linger.ms (measured: +50-65 % events/s with batches of 100); reports are
            # served while it waits, as with poll.
            sink.flush(min(0.1, remaining))

    def _report(self, settlement: Settlement, failures: Sequence[AttemptFailure],
                completion: Completion) -> None:
        dead = set(completion.dead_lettered)
        for failure in failures:
            event = failure.event
            if event.id in dead:
                log.error("giving up after %d attempts, now a dead letter: %s", event.attempt,
                          failure.reason, extra=event_fields(event))
            else:
                log.warning("attempt %d failed, retrying in %.1fs: %s", event.attempt,
                            failure.delay, failure.reason, extra=event_fields(event))
        if settlement.broker_down:
            log.warning("broker-wide failure: %d events released without counting an attempt",
                        len(settlement.released))
