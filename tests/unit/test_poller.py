"""The polling loop against fakes: an in-memory outbox and FakeSink (no services)."""

from __future__ import annotations

import itertools
import logging
import threading

from cdc_relay.config import RouterConfig
from cdc_relay.errors import ServiceUnavailable
from cdc_relay.model import OutboxEvent
from cdc_relay.polling.settlement import BackoffPolicy
from cdc_relay.polling.threads import Waker, monitor_loop
from cdc_relay.polling.worker import PollerSettings, PollWorker
from cdc_relay.routing import Router
from cdc_relay.sink.base import Cause, DeliveryError, ErrorKind
from cdc_relay.stats import PollStats
from cdc_relay.testing import FakeMonitor, FakeOutbox, FakeSink, FakeSinkFactory


def events(*specs: tuple[str, str, str]) -> list[OutboxEvent]:
    return [OutboxEvent(f"e{n}", agg_type, agg_id, event_type, b'{"n": %d}' % n, 1000 + n)
            for n, (agg_type, agg_id, event_type) in enumerate(specs)]


def make_worker(outbox: FakeOutbox, factory: FakeSinkFactory, *, pattern: str = "t.{aggregate_type}",
                **overrides: object) -> PollWorker:
    settings = PollerSettings(**{"batch_size": 10, "max_attempts": 3,  # type: ignore[arg-type]
                                 "backoff": BackoffPolicy(1.0, 60.0, 0.0), **overrides})
    ticks = itertools.count()
    return PollWorker(source=outbox, router=Router(RouterConfig(topic_pattern=pattern)),
                      sink_factory=factory, settings=settings, waker=Waker(), stats=PollStats(),
                      clock=lambda: float(next(ticks)), rand=lambda: 0.5)


def prime(worker: PollWorker) -> None:
    """Build and warm the worker's sink as its loop does before the first claim."""
    assert worker.ensure_broker()


def test_a_healthy_batch_is_published_and_marked_processed_with_the_message_contract() -> None:
    outbox = FakeOutbox(events(("order", "o-1", "Placed"), ("order", "o-2", "Paid")))
    factory = FakeSinkFactory()
    worker = make_worker(outbox, factory)
    prime(worker)
    assert worker.poll_once() == 2
    assert all(r.processed for r in outbox.rows.values())
    first = factory.current.messages[0]
    assert (first.topic, first.key, first.value, first.timestamp_ms) == (
        "t.order", b"o-1", b'{"n": 0}', 1000)
    assert dict(first.headers)["id"] == b"e0"
    assert worker.stats.published == 2 and worker.stats.batches == 1
    assert factory.current.warmed_up


def test_a_poison_event_counts_attempts_with_backoff_and_never_blocks_the_others() -> None:
    outbox = FakeOutbox(events(("bad type", "x", "Odd"), ("order", "o-1", "Placed")))
    worker = make_worker(outbox, FakeSinkFactory())
    prime(worker)
    worker.poll_once()
    poison, healthy = outbox.rows["e0"], outbox.rows["e1"]
    assert healthy.processed
    assert (poison.attempts, poison.delay) == (1, 1.0)
    assert poison.last_error is not None and "cannot route" in poison.last_error
    worker.poll_once()
    worker.poll_once()
    assert poison.dead and poison.attempts == 3
    assert worker.stats.dead_lettered == 1 and worker.stats.failed_by_type == {"Odd": 3}


def test_an_event_given_up_on_is_copied_to_the_dead_letter_topic_once() -> None:
    outbox = FakeOutbox(events(("bad type", "x", "Odd")))
    factory = FakeSinkFactory()
    worker = make_worker(outbox, factory, max_attempts=2)
    prime(worker)
    for _ in range(3):
        worker.poll_once()
    [dead] = factory.current.messages
    assert dead.topic == "outbox.dead-letters" and dead.key == b"x"
    headers = dict(dead.headers)
    assert headers["id"] == b"e0" and b"cannot route" in headers["error"]
    assert outbox.rows["e0"].dead


def test_a_dead_letter_the_broker_refuses_is_still_dead_in_the_database() -> None:
    outbox = FakeOutbox(events(("bad type", "x", "Odd")))
    factory = FakeSinkFactory(reject_topics={"outbox.dead-letters": ErrorKind.PERMANENT})
    worker = make_worker(outbox, factory, max_attempts=1)
    prime(worker)
    worker.poll_once()
    assert outbox.rows["e0"].dead and factory.current.messages == []


def test_delays_double_with_each_failed_attempt() -> None:
    outbox = FakeOutbox(events(("bad type", "x", "Odd")))
    worker = make_worker(outbox, FakeSinkFactory(), max_attempts=5)
    prime(worker)
    delays = []
    for _ in range(4):
        worker.poll_once()
        delays.append(outbox.rows["e0"].delay)
    assert delays == [1.0, 2.0, 4.0, 8.0]


def test_a_broker_outage_counts_no_attempt_and_stops_claiming_until_a_broker_answers() -> None:
    outbox = FakeOutbox(events(("order", "o-1", "Placed"), ("order", "o-2", "Placed")))

    def configure(sink: FakeSink) -> None:
        if sink.generation == 1:  # every message times out: fatal, broker-wide
            sink.fail_topics["t.order"] = ErrorKind.FATAL
        else:  # its replacement finds no broker at first
            sink.unreachable = True

    factory = FakeSinkFactory(configure=configure)
    worker = make_worker(outbox, factory)
    prime(worker)
    worker.poll_once()
    assert [r.attempts for r in outbox.rows.values()] == [0, 0]
    assert not any(r.processed for r in outbox.rows.values())
    assert factory.sinks[0].closed and worker.stats.broker_ok is False
    assert not worker.ensure_broker()
    factory.current.unreachable = False
    assert worker.ensure_broker() and worker.stats.broker_ok
    worker.poll_once()
    assert all(r.processed and r.attempts == 0 for r in outbox.rows.values())
    assert factory.generations == 2


def test_retriable_failures_count_when_the_broker_otherwise_works() -> None:
    outbox = FakeOutbox(events(("order", "o-1", "Placed"), ("order", "o-2", "Placed")))
    factory = FakeSinkFactory(configure=lambda sink: sink.fail_tokens.update({0: ErrorKind.RETRIABLE}))
    worker = make_worker(outbox, factory)
    prime(worker)
    worker.poll_once()
    assert (outbox.rows["e0"].attempts, outbox.rows["e1"].processed) == (1, True)


def test_missing_delivery_reports_release_the_batch_and_discard_the_producer() -> None:
    outbox = FakeOutbox(events(("order", "o-1", "Placed")))
    factory = FakeSinkFactory(hold=True)
    worker = make_worker(outbox, factory, delivery_timeout=5.0)
    prime(worker)
    worker.poll_once()
    row = outbox.rows["e0"]
    assert (row.processed, row.attempts) == (False, 0)
    assert factory.sinks[0].closed and worker._sink is None


def test_a_producer_queue_that_stays_full_releases_the_batch_instead_of_waiting_for_ever() -> None:
    outbox = FakeOutbox(events(("order", "o-1", "Placed"), ("order", "o-2", "Placed"),
                               ("order", "o-3", "Placed")))
    factory = FakeSinkFactory(hold=True, queue_limit=1)  # one message fits; the broker takes none
    worker = make_worker(outbox, factory, delivery_timeout=5.0)
    prime(worker)
    assert worker.poll_once() == 3
    assert [(r.processed, r.attempts) for r in outbox.rows.values()] == [(False, 0)] * 3
    assert len(factory.sinks[0].produced) == 1  # the third event was not even tried
    assert factory.sinks[0].closed and worker._sink is None


def test_strict_order_holds_back_an_aggregate_behind_its_failed_event() -> None:
    outbox = FakeOutbox(events(("order", "o-1", "bad type"), ("order", "o-2", "Placed"),
                               ("order", "o-1", "Placed"), ("order", "o-1", "Shipped")))
    factory = FakeSinkFactory()
    worker = make_worker(outbox, factory, pattern="t.{event_type}", strict_order=True)
    prime(worker)
    worker.poll_once()
    rows = outbox.rows
    assert rows["e0"].attempts == 1 and rows["e1"].processed
    assert [rows[i].processed or rows[i].attempts for i in ("e2", "e3")] == [False, False]
    assert [m.key for m in factory.current.messages] == [b"o-2"]


def test_a_lost_database_connection_is_retried_and_the_loop_stops_on_request() -> None:
    outbox = FakeOutbox(events(("order", "o-1", "Placed")))
    outbox.fail_next_claim = ServiceUnavailable("lost the PostgreSQL connection")
    worker = make_worker(outbox, FakeSinkFactory(), broker_wait_min=0.0, interval=0.01)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:
        for _ in range(500):
            if outbox.rows["e0"].processed:
                break
            threading.Event().wait(0.01)
    finally:
        stop.set()
        worker._waker.wake()
        thread.join(10)
    assert outbox.rows["e0"].processed and not thread.is_alive()
    assert not outbox.connected  # closed on the way out
    assert outbox.batches == 1


def test_monitor_wakes_workers_on_every_notification_and_refreshes_gauges() -> None:
    stop = threading.Event()
    waker, stats = Waker(), PollStats()
    monitor_loop(FakeMonitor(2, stop), waker, stats, stop, listen=True)
    assert waker.generation == 3  # once after connecting, once per notification
    assert (stats.pending, stats.dead_letters) == (42, 3)


def test_waker_never_loses_a_wake_up_that_came_before_the_wait() -> None:
    waker = Waker()
    since = waker.generation
    waker.wake()
    assert waker.wait(since, timeout=0.0)
    assert not waker.wait(waker.generation, timeout=0.0)


def test_a_missing_topic_counts_no_attempt_and_never_dead_letters() -> None:
    outbox = FakeOutbox(events(("order", "o-1", "Placed"), ("invoice", "i-1", "Sent")))
    missing = DeliveryError(ErrorKind.RETRIABLE, "Broker: Unknown topic or partition",
                            Cause.TOPIC_MISSING)
    factory = FakeSinkFactory(configure=lambda sink: sink.fail_topics.update({"t.invoice": missing}))
    worker = make_worker(outbox, factory)
    for _ in range(5):  # more rounds than --max-attempts (3), each with a new producer
        prime(worker)
        worker.poll_once()
    invoice = outbox.rows["e1"]
    assert (invoice.attempts, invoice.processed, invoice.dead) == (0, False, False)
    assert outbox.rows["e0"].processed
    assert worker.stats.topic_retries == 5 and worker.stats.dead_lettered == 0
    assert len(factory.sinks) == 5  # the producer is replaced after each topic failure


class StopOnWarning(logging.Handler):
    """Keeps the warnings and sets ``stop`` at the first: the loop ends after one wait."""

    def __init__(self, stop: threading.Event) -> None:
        super().__init__(logging.WARNING)
        self.stop, self.lines = stop, list[str]()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        self.stop.set()


def test_a_missing_destination_is_logged_in_the_sinks_words_not_kafkas() -> None:
    reason = ("queue 't-invoice.fifo' does not exist: create it (aws sqs create-queue "
              "--queue-name t-invoice.fifo --attributes FifoQueue=true; docs/sinks.md)")
    outbox = FakeOutbox(events(("invoice", "i-1", "Sent")))
    missing = DeliveryError(ErrorKind.RETRIABLE, reason, Cause.TOPIC_MISSING)
    factory = FakeSinkFactory(configure=lambda sink: sink.fail_topics.update({"t.invoice": missing}))
    worker = make_worker(outbox, factory, pipeline=False)
    stop = threading.Event()
    handler = StopOnWarning(stop)
    logger = logging.getLogger("cdc_relay.poller")
    logger.addHandler(handler)
    try:
        worker.run(stop)
    finally:
        logger.removeHandler(handler)
    [line] = [line for line in handler.lines if "not claiming events" in line]
    assert f"1 event(s) ({reason}): nothing is dead-lettered" in line
    assert "topic" not in line
