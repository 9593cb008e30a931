"""WAL mode's relay: sessions over one replication slot, with reconnects (docs/design.md, WAL mode).

One synchronous loop per process. ``WalRelay.run`` opens a replication stream, runs a
``Session`` on it (wal/stream/session.py: read → decode → route → produce → confirm) and,
when the session ends early, decides what comes next:

* a fatal producer error, a timed-out or otherwise failed delivery, a missing or
  forbidden topic → the producer is discarded and the stream resumes from the slot's
  confirmed LSN with a new one, after a backoff;
* a lost replication connection → reconnect after a backoff, resume from the slot;
* a busy slot (another relay holds it) → wait and retry: hot standby;
* a decode error, a bad producer configuration, a dead-letter topic that refuses
  events → raised: a retry cannot fix them.

Start-up overlaps its waits: ``SinkWarmUp`` warms the first producer (connect, get a
producer id) on a thread while ``cdc-relay run`` does its PostgreSQL checks, and the
relay takes that sink for its first session; later ones are built and warmed up by
delivery/producer.py. A sink is built reporting nowhere (``ignore_reports``); each
session points it at its delivery engine's ``on_delivery`` (and ``on_delivered``, for
the successes a sink hands over per poll) for as long as it streams
(``Sink.set_handler``), so a report takes no extra hop per event, and a report of a
session that has ended reaches nobody.

The backoff (cdc_relay/backoff.py) doubles per incident and comes back down once a
stream has run for ``healthy_after`` seconds. Every wait here ends early on a stop
request. The AckTracker (acks.py) decides what is safe to confirm; this module only
wires sessions to producers and sources. The delivery mode (wal/stream/delivery.py:
at-least-once by default, ``run --exactly-once`` otherwise) is handed to every session.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from cdc_relay.backoff import Backoff
from cdc_relay.capture.incremental import IncrementalSnapshots
from cdc_relay.capture.route import CaptureRouter
from cdc_relay.config import FlowConfig
from cdc_relay.delivery.engine import ProducerFailed
from cdc_relay.delivery.producer import new_producer, warm_up
from cdc_relay.errors import DeadLetterRefused, SlotBusy, SourceLost
from cdc_relay.routing import Router
from cdc_relay.sink.base import Sink, SinkFactory, ignore_reports
from cdc_relay.stats import RelayStats
from cdc_relay.wal.stream.delivery import AtLeastOnce, DeliveryMode
from cdc_relay.wal.stream.session import (
    Decoder,
    LoopTimings,
    ReplicationSource,
    Session,
    SessionParts,
)

__all__ = ["SinkWarmUp", "WalRelay"]

log = logging.getLogger("cdc_relay.relay")


class _HeldLines(logging.Filter):
    """Holds what one thread logs (on the root logger's handlers) until ``release``."""

    def __init__(self, thread_name: str) -> None:
        super().__init__()
        self.thread_names = {thread_name}
        self._handlers = list(logging.getLogger().handlers)
        self.held: list[logging.LogRecord] = []
        for handler in self._handlers:
            handler.addFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.threadName in self.thread_names:
            self.held.append(record)
            return False
        return True

    def release(self, *, emit: bool) -> None:
        for handler in self._handlers:
            handler.removeFilter(self)
        held, self.held = self.held, []
        for record in held if emit else ():
            logging.getLogger(record.name).handle(record)


class SinkWarmUp:
    """The first producer, warmed up on a thread while start-up does its other I/O.

    ``result()`` (the relay's first session) joins it and hands the sink over, or raises
    what warming raised, as ``WalRelay`` would have; ``cancel()`` closes it when start-up
    fails before the relay runs. What the warm-up logs (librdkafka's lines about a broker
    that does not answer) is held until ``result()`` and dropped by ``cancel()``: a
    start-up that fails on PostgreSQL says so in one line, as it would have without it.
    """

    _THREAD = "cdc-relay-warm-up"

    def __init__(self, sink: Sink, stop: threading.Event, *, timeout: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._sink: Sink | None = sink
        self._stop = stop
        self._cancelled = threading.Event()
        self._ready = False
        self._error: BaseException | None = None
        self._lines = _HeldLines(self._THREAD)
        self._thread = threading.Thread(target=self._warm, args=(timeout, clock),
                                        name=self._THREAD, daemon=True)
        self._thread.start()

    def _warm(self, timeout: float, clock: Callable[[], float]) -> None:
        assert self._sink is not None
        try:
            self._ready = warm_up(self._sink, timeout, clock,
                                  lambda: self._stop.is_set() or self._cancelled.is_set())
        except BaseException as exc:  # handed to the thread that takes the sink
            self._error = exc

    def result(self) -> Sink | None:
        """The warmed sink (None if stopped meanwhile); raises what warming raised."""
        self._thread.join()
        self._lines.release(emit=True)
        sink, self._sink = self._sink, None
        if sink is not None and (self._error is not None or not self._ready):
            sink.close(0)
            sink = None
        if self._error is not None:
            raise self._error
        return sink

    def cancel(self) -> None:
        """Stop warming and close the sink (start-up failed before the relay ran)."""
        self._cancelled.set()
        self._thread.join()
        # Closing serves librdkafka's queued lines on this thread: drop them as well.
        self._lines.thread_names.add(threading.current_thread().name)
        sink, self._sink = self._sink, None
        try:
            if sink is not None:
                sink.close(0)
        finally:
            self._lines.release(emit=False)


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
        first_sink: SinkWarmUp | None = None,
        capture: CaptureRouter | None = None,
        snapshots: IncrementalSnapshots | None = None,
    ) -> None:
        self._source_factory = source_factory
        self._decoder = decoder
        self._sink_factory = sink_factory
        self._timings = timings
        self.stats = stats or RelayStats()
        self._clock = clock
        self._parts = SessionParts(decoder=decoder, router=router, flow=flow, timings=timings,
                                   stats=self.stats, clock=self._now, mode=mode or AtLeastOnce(),
                                   capture=capture, snapshots=snapshots)
        self._backoff = Backoff(timings.reconnect_min, timings.reconnect_max,
                                healthy_after=timings.healthy_after)
        self._first_sink = first_sink

    def _now(self) -> float:
        return self._clock()

    def run(self, stop: threading.Event) -> None:
        """Stream until ``stop`` is set; survive broker and PostgreSQL failures.

        Returns normally after a clean shutdown. Raises RelayError for what a retry
        cannot fix (decode errors, misconfiguration, a refusing dead-letter topic).
        """
        sink: Sink | None = None
        try:
            while not stop.is_set():
                try:
                    if sink is None:
                        sink = self._new_sink(stop)
                        if sink is None:
                            break  # stopped while warming up
                        self.stats.producer_ok = True
                    self._stream_once(sink, stop)
                    self._backoff.reset()
                except SlotBusy as exc:
                    log.info("%s; standing by, retrying in %.0fs", exc, self._timings.slot_busy_retry)
                    stop.wait(self._timings.slot_busy_retry)
                except SourceLost as exc:
                    self.stats.restarts += 1
                    delay = self._backoff.next_delay(self._clock())
                    log.warning("%s; reconnecting in %.1fs", exc, delay)
                    sink = self._drain_or_discard(sink, stop)
                    stop.wait(delay)
                except ProducerFailed as exc:
                    self._count_retry(exc)
                    delay = self._backoff.next_delay(self._clock())
                    log.warning("%s; new producer, resuming from the slot in %.1fs", exc, delay)
                    if sink is not None:
                        sink.close(0)
                    sink = None
                    stop.wait(delay)
        finally:
            self.stats.streaming = False
            if self._first_sink is not None:  # stopped before the first session took it
                first, self._first_sink = self._first_sink, None
                first.cancel()
            if sink is not None:
                # The session already waited (shutdown_timeout) for in-flight acks; what is
                # still unacked was not confirmed and will be replayed. Keep exit < 30 s.
                sink.close(1.0)

    def _count_retry(self, exc: ProducerFailed) -> None:
        stats = self.stats
        stats.restarts += 1
        stats.producer_ok = False
        stats.retries_by_reason[exc.reason] = stats.retries_by_reason.get(exc.reason, 0) + 1

    def _new_sink(self, stop: threading.Event) -> Sink | None:
        """A fresh producer, warmed up (None if stopped meanwhile); failing is a ProducerFailed."""
        if self._first_sink is not None:  # warmed up during start-up
            first, self._first_sink = self._first_sink, None
            return first.result()
        # Each session points it at its own engine (delivery/producer.py).
        return new_producer(self._sink_factory, warmup=self._timings.sink_warmup,
                            clock=self._clock, stopped=stop.is_set)

    def _drain_or_discard(self, sink: Sink | None, stop: threading.Event) -> Sink | None:
        """After a lost stream: keep the sink only if nothing of the old session is pending."""
        if sink is None:
            return None
        deadline = self._clock() + 5.0
        while sink.flush(0.2) and not stop.is_set() and self._clock() < deadline:
            pass
        if sink.pending() == 0 and sink.fatal_error is None:
            return sink
        sink.close(0)
        return None

    def _stream_once(self, sink: Sink, stop: threading.Event) -> None:
        source = self._source_factory()
        try:
            start = source.open()
            self._decoder.reset()
            session = Session(self._parts, source, sink, start, stop)
            engine = session.engine  # the reports go straight to it: no hop per report
            sink.set_handler(engine.on_delivery, engine.on_delivered)
            self.stats.streaming = True
            self.stats.confirmed_lsn = int(start)
            self._backoff.healthy(self._clock())
            log.info("streaming from slot at %s", start, extra={"confirmed_lsn": str(start)})
            try:
                session.loop()
            except DeadLetterRefused:
                session.shutdown()  # confirm what the other events' acks allow, then stop
                raise
            session.shutdown()
        finally:
            sink.set_handler(ignore_reports)  # what is still reported belongs to no session
            self.stats.streaming = False
            source.close()
