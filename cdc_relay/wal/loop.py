"""WAL mode's loop: read → decode → route → produce → poll → confirm (docs/design.md, WAL mode).

One synchronous loop per process. It talks only to small protocols - a replication
source, a decoder, the router, a sink - so it is driven by fakes in unit tests and by
PostgreSQL and Kafka in production. The AckTracker decides what is safe to confirm; this
module only feeds it and acts on failures:

* a delivery that failed permanently (too large, illegal topic) is re-sent to the
  dead-letter topic under the same token, so the tracker waits for *that* ack;
* a fatal producer error, a timed-out or otherwise failed delivery → the producer is
  discarded and the stream resumes from the slot's confirmed LSN with a new one;
* a lost replication connection → reconnect with capped backoff, resume from the slot;
* a busy slot (another relay holds it) → wait and retry: hot standby;
* a decode error is fatal: nothing past it is ever confirmed.

What counts as delivered, and which transactions are already delivered, is the delivery
mode's (wal/delivery.py): at-least-once by default, ``run --exactly-once``
(wal/exactly_once.py) otherwise. The loop calls it at the points marked "delivery mode".

It must not block on one side while the other needs service: the replication socket is
read only while fewer than the configured events/bytes are in flight; status updates
continue on a timer while backed up so the walsender does not time out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from cdc_relay.acks import AckTracker
from cdc_relay.config import FlowConfig
from cdc_relay.errors import ConfigError, RelayError, SlotBusy, SourceLost
from cdc_relay.logs import event_fields
from cdc_relay.model import Begin, Change, Commit, Lsn, Message, OutboxEvent
from cdc_relay.routing import Router, RoutingError
from cdc_relay.sink.base import (
    Delivery,
    DeliveryError,
    ErrorKind,
    ProduceRejected,
    QueueFull,
    Sink,
    SinkFactory,
)
from cdc_relay.wal.delivery import AtLeastOnce, DeliveryMode
from cdc_relay.wal.protocol import KEEPALIVE, ServerMessage

log = logging.getLogger("cdc_relay.relay")

_READ_BATCH = 1000  # messages read per loop turn before the sink is served again
_TOO_LARGE_MARKERS = ("too large", "TOO_LARGE")


class ReplicationSource(Protocol):
    """What the loop needs from a replication connection (see source/replication.py)."""

    def open(self) -> Lsn: ...
    def read(self) -> ServerMessage | None: ...
    def wait(self, timeout: float) -> None: ...
    def send_status(self, flushed: Lsn, *, reply: bool = False) -> None: ...
    def close(self) -> None: ...


class Decoder(Protocol):
    """Plugin payload bytes → Change (see decoding/)."""

    def decode(self, payload: bytes | memoryview, wal_start: Lsn) -> Change | None: ...
    def reset(self) -> None: ...


class ProducerFailed(RelayError):
    """The producer cannot be trusted any more: replay from the slot with a new one."""


@dataclass
class RelayStats:
    """Plain counters the loop updates; metrics and health read them from another thread.

    Plain attributes, not Prometheus objects, keep the per-event path cheap.
    """

    published: int = 0
    dead_lettered: int = 0
    failed_by_type: dict[str, int] = field(default_factory=dict)
    inflight: int = 0
    confirmed_lsn: int = 0
    last_tick: float = 0.0  # monotonic time of the last loop turn (healthz)
    streaming: bool = False  # replication stream open (readyz)
    producer_ok: bool = False  # producer built and not failed (readyz)
    restarts: int = 0


@dataclass(frozen=True, slots=True)
class LoopTimings:
    """Intervals of the loop; defaults suit production, tests may shorten them."""

    status_interval: float = 1.0
    reconnect_min: float = 0.5
    reconnect_max: float = 30.0
    slot_busy_retry: float = 2.0
    shutdown_timeout: float = 25.0
    sink_warmup: float = 10.0


class WalRelay:
    """Streams outbox inserts from a replication slot to a sink, confirming only acked LSNs."""

    def __init__(
        self,
        *,
        source_factory: Callable[[], ReplicationSource],
        decoder: Decoder,
        router: Router,
        sink_factory: SinkFactory,
        flow: FlowConfig,
        timings: LoopTimings,
        stats: RelayStats | None = None,
        clock: Callable[[], float] = time.monotonic,
        mode: DeliveryMode | None = None,
    ) -> None:
        self._source_factory = source_factory
        self._decoder = decoder
        self._router = router
        self._sink_factory = sink_factory
        self._flow = flow
        self._timings = timings
        self.stats = stats or RelayStats()
        self._clock = clock
        self._session: _Session | None = None
        self._mode: DeliveryMode = mode or AtLeastOnce()

    def run(self, stop: threading.Event) -> None:
        """Stream until ``stop`` is set; survive broker and PostgreSQL failures.

        Returns normally after a clean shutdown. Raises RelayError for what a retry
        cannot fix (decode errors, misconfiguration).
        """
        delay = self._timings.reconnect_min
        sink: Sink | None = None
        try:
            while not stop.is_set():
                try:
                    if sink is None:
                        sink = self._new_sink()
                    self._stream_once(sink, stop)
                    delay = self._timings.reconnect_min
                except SlotBusy as exc:
                    log.info("%s; standing by, retrying in %.0fs", exc, self._timings.slot_busy_retry)
                    stop.wait(self._timings.slot_busy_retry)
                except SourceLost as exc:
                    self.stats.restarts += 1
                    log.warning("%s; reconnecting in %.1fs", exc, delay)
                    sink = self._drain_or_discard(sink)
                    stop.wait(delay)
                    delay = min(delay * 2, self._timings.reconnect_max)
                except ProducerFailed as exc:
                    self.stats.restarts += 1
                    self.stats.producer_ok = False
                    log.warning("%s; new producer, resuming from the slot in %.1fs", exc, delay)
                    if sink is not None:
                        sink.close(0)
                    sink = None
                    stop.wait(delay)
                    delay = min(delay * 2, self._timings.reconnect_max)
        finally:
            self.stats.streaming = False
            if sink is not None:
                # The session already waited (shutdown_timeout) for in-flight acks; what is
                # still unacked was not confirmed and will be replayed. Keep exit < 30 s.
                sink.close(1.0)

    def _new_sink(self) -> Sink:
        """A fresh producer, warmed up; failing to build one is retried like a producer failure."""
        try:
            sink = self._sink_factory(self._on_delivery)
        except ConfigError:
            raise  # a bad --producer-config: retrying cannot fix it
        except RelayError as exc:
            raise ProducerFailed(f"cannot create the producer: {exc}") from exc
        try:
            sink.warm_up(self._timings.sink_warmup)
        except RelayError as exc:
            sink.close(0)
            raise ProducerFailed(f"broker not reachable: {exc}") from exc
        self.stats.producer_ok = True
        return sink

    def _drain_or_discard(self, sink: Sink | None) -> Sink | None:
        """After a lost stream: keep the sink only if nothing of the old session is pending."""
        if sink is None:
            return None
        sink.flush(5.0)
        if sink.pending() == 0 and sink.fatal_error is None:
            return sink
        sink.close(0)
        return None

    def _on_delivery(self, delivery: Delivery) -> None:
        session = self._session
        if session is not None:
            session.on_delivery(delivery)

    def _stream_once(self, sink: Sink, stop: threading.Event) -> None:
        source = self._source_factory()
        try:
            start = source.open()
            self._decoder.reset()
            session = _Session(self, source, sink, self._mode.start(sink, start))  # delivery mode
            self._session = session
            self.stats.streaming = True
            self.stats.confirmed_lsn = int(start)
            log.info("streaming from slot at %s", start, extra={"confirmed_lsn": str(start)})
            session.loop(stop)
            session.shutdown()
        finally:
            self._session = None
            self.stats.streaming = False
            source.close()


class _Session:
    """One replication connection's worth of state: tracker, in-flight events, timers."""

    def __init__(self, relay: WalRelay, source: ReplicationSource, sink: Sink, tracker: AckTracker):
        self.relay = relay
        self.source = source
        self.sink = sink
        self.tracker = tracker
        self.stats = relay.stats
        self.inflight: dict[int, OutboxEvent] = {}
        self.inflight_bytes = 0
        # Tokens now carried by a dead-letter message -> whether its payload was omitted.
        self.dead_lettered: dict[int, bool] = {}
        self.redo: list[tuple[int, Message]] = []  # dead letters to produce from the loop
        self.failure: str | None = None
        self.next_status = 0.0
        self.sent = Lsn(-1)
        self.mode = relay._mode
        self.skip = 0  # events of the current transaction still to skip (delivery mode)

    # -- delivery reports (called from sink.poll) ------------------------------------
    def on_delivery(self, delivery: Delivery) -> None:
        token, error = delivery.token, delivery.error
        event = self.inflight.get(token)
        if event is None:
            return
        if error is None:
            del self.inflight[token]
            self.inflight_bytes -= len(event.payload)
            self.tracker.delivered(token)
            if self.dead_lettered.pop(token, None) is not None:
                self.stats.dead_lettered += 1
            else:
                self.stats.published += 1
            return
        failed = self.stats.failed_by_type
        failed[event.event_type] = failed.get(event.event_type, 0) + 1
        if self.mode.delivery_failed(event, error):  # delivery mode
            return
        if error.kind is ErrorKind.PERMANENT:
            try:
                self.redo.append((token, self._next_dead_letter(token, error.reason)))
                return
            except ProducerFailed as exc:
                error = DeliveryError(error.kind, str(exc))
        log.warning("delivery failed (%s): %s", error.kind.value, error.reason,
                    extra=event_fields(event))
        if self.failure is None:
            self.failure = f"delivery of event {event.id} failed: {error.reason}"

    # -- the loop ------------------------------------------------------------------
    def loop(self, stop: threading.Event) -> None:
        relay, source, sink = self.relay, self.source, self.sink
        flow = relay._flow
        clock = relay._clock
        while not stop.is_set():
            sink.poll(0)
            self._check()
            wake = self.mode.tick(clock())  # delivery mode
            if self.redo:
                self._produce_redo()
            now = clock()
            self.stats.last_tick = now
            if len(self.inflight) >= flow.max_inflight_events or (
                self.inflight_bytes >= flow.max_inflight_bytes
            ):
                # Backpressure: leave the WAL unread (libpq buffers nothing more), but keep
                # telling the walsender we are alive.
                sink.poll(0.05)
            elif self._read_batch() == 0:
                source.wait(min(0.005 if self.inflight else 0.1, wake))
            self._maybe_send_status(clock())

    def _check(self) -> None:
        if self.failure is not None:
            raise ProducerFailed(self.failure)
        fatal = self.sink.fatal_error
        if fatal is not None:
            raise ProducerFailed(f"producer failed: {fatal.reason}")

    def _maybe_send_status(self, now: float, *, force: bool = False) -> None:
        if force or now >= self.next_status:
            confirmed = self.tracker.confirmed
            self.source.send_status(confirmed)
            self.next_status = now + self.relay._timings.status_interval
            if confirmed != self.sent:
                self.sent = confirmed
                self.stats.confirmed_lsn = int(confirmed)
            self.stats.inflight = len(self.inflight)

    def _read_batch(self) -> int:
        source, tracker = self.source, self.tracker
        decode = self.relay._decoder.decode
        limit = self.relay._flow.max_inflight_events
        count = 0
        while count < _READ_BATCH:
            message = source.read()
            if message is None:
                break
            count += 1
            kind, position, data = message
            if kind == KEEPALIVE:
                tracker.idle_position(Lsn(position))
                if data:
                    self._maybe_send_status(self.relay._clock(), force=True)
                continue
            change = decode(data, Lsn(position))  # type: ignore[arg-type]
            if change is None:
                continue
            change_type = type(change)
            if change_type is OutboxEvent:
                if self.skip:  # delivery mode: already delivered
                    self.skip -= 1
                    continue
                self._publish(change)  # type: ignore[arg-type]
                if len(self.inflight) >= limit:
                    break
            elif change_type is Commit:
                self.skip = 0
                tracker.commit(change.end_lsn)  # type: ignore[union-attr]
                self.mode.commit(change.end_lsn)  # type: ignore[union-attr]  # delivery mode
            elif change_type is Begin:
                tracker.begin()
                self.skip = self.mode.begin(change)  # type: ignore[arg-type]  # delivery mode
        return count

    def _publish(self, event: OutboxEvent) -> None:
        token = self.tracker.produced()
        self.inflight[token] = event
        self.inflight_bytes += len(event.payload)
        try:
            message = self.relay._router.route(event)
        except RoutingError as exc:
            message = self._next_dead_letter(token, str(exc))
        refusal = self.mode.admit(token, event, message)  # delivery mode
        if refusal is not None:
            message = self._next_dead_letter(token, refusal)
        try:
            self.sink.produce(message, token)  # the common case, without the retry loop
        except (QueueFull, ProduceRejected):
            self._produce(token, message)

    def _produce(self, token: int, message: Message) -> None:
        sink = self.sink
        while True:
            try:
                sink.produce(message, token)
                return
            except QueueFull:
                # The producer's own queue is the bound: serve acks, stay alive, retry.
                sink.poll(0.05)
                self._check()
                self._maybe_send_status(self.relay._clock())
            except ProduceRejected as exc:
                if exc.error.kind is not ErrorKind.PERMANENT:
                    raise ProducerFailed(f"cannot produce event: {exc.error.reason}") from exc
                message = self._next_dead_letter(token, exc.error.reason)

    def _produce_redo(self) -> None:
        redo, self.redo = self.redo, []
        for token, message in redo:
            self._produce(token, message)

    def _next_dead_letter(self, token: int, reason: str) -> Message:
        """The dead letter to send for a message refused for good.

        First refusal: the event goes to the dead-letter topic. If that is refused as too
        large, once more without the payload. Beyond that nothing can deliver it, and
        skipping it would confirm past it: ProducerFailed (replay, and the operator sees
        the error on every attempt).
        """
        event = self.inflight[token]
        too_large = any(marker in reason for marker in _TOO_LARGE_MARKERS)
        omitted = self.dead_lettered.get(token)
        if omitted is not None and (omitted or not too_large):
            raise ProducerFailed(f"the dead-letter topic refused event {event.id} too: {reason}")
        log.warning("dead-lettering event: %s", reason, extra=event_fields(event))
        message = self.relay._router.dead_letter(event, reason)
        if too_large:
            # The payload itself is what the broker refuses: keep the headers (the event
            # id finds the row) and say what was dropped.
            message = replace(message, value=b"", headers=[
                *message.headers, ("payload_omitted_bytes", str(len(message.value)).encode())])
        self.dead_lettered[token] = too_large
        return message

    def shutdown(self) -> None:
        """Stop reading; wait (bounded) for in-flight acks, confirm what was acked."""
        deadline = self.relay._clock() + self.relay._timings.shutdown_timeout
        while self.inflight and self.failure is None and self.relay._clock() < deadline:
            self.sink.poll(0.1)
            if self.redo:
                self._produce_redo()
        self.mode.finish()  # delivery mode
        self._maybe_send_status(self.relay._clock(), force=True)
        log.info("stopped; confirmed %s, %d events unacknowledged", self.tracker.confirmed,
                 len(self.inflight))
