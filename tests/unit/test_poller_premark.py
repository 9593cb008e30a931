"""The polling loop's premark (pipelining) against fakes: the marking UPDATE is sent while
the reports are awaited, and only ``complete`` - after every report - decides what is
processed (polling/worker.py, docs/design.md)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import pytest

from cdc_relay.config import RouterConfig
from cdc_relay.errors import DatabaseError, ServiceUnavailable
from cdc_relay.model import OutboxEvent
from cdc_relay.polling.settlement import AttemptFailure, BackoffPolicy, Completion
from cdc_relay.polling.threads import Waker
from cdc_relay.polling.worker import PollerSettings, PollWorker
from cdc_relay.routing import Router
from cdc_relay.sink.base import ErrorKind
from cdc_relay.stats import PollStats
from cdc_relay.testing import FakeOutbox, FakeSink, FakeSinkFactory
from tests.support import wait_for


def events(count: int, *, odd: dict[int, str] | None = None) -> list[OutboxEvent]:
    """``count`` events of aggregate type "order" (or ``odd[n]`` for event n)."""
    odd = odd or {}
    return [OutboxEvent(f"e{n}", odd.get(n, "order"), f"o-{n % 3}", "Placed", b"{}", 1000 + n)
            for n in range(count)]


def make_worker(outbox: FakeOutbox, factory: FakeSinkFactory, **overrides: object) -> PollWorker:
    settings = PollerSettings(**{"batch_size": 4, "max_attempts": 3,  # type: ignore[arg-type]
                                 "backoff": BackoffPolicy(0.0, 0.0, 0.0), "interval": 0.01,
                                 "broker_wait_min": 0.0, "broker_wait_max": 0.01, **overrides})
    ticks = itertools.count()
    return PollWorker(source=outbox, router=Router(RouterConfig(topic_pattern="t.{aggregate_type}")),
                      sink_factory=factory, settings=settings, waker=Waker(), stats=PollStats(),
                      clock=lambda: float(next(ticks)), rand=lambda: 0.5)


@contextmanager
def running(worker: PollWorker) -> Iterator[None]:
    """``worker.run`` in a thread until the block ends (then stopped and joined)."""
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:
        yield
    finally:
        stop.set()
        worker._waker.wake()
        thread.join(10)
    assert not thread.is_alive()


def settled(outbox: FakeOutbox, *ids: str) -> Callable[[], bool]:
    return lambda: all(outbox.rows[i].processed or outbox.rows[i].attempts for i in ids)


def test_the_marking_is_sent_before_the_reports_arrive_and_nothing_is_processed_until_them() -> None:
    outbox = FakeOutbox(events(10))
    seen: list[tuple[list[str], int]] = []  # at each batch's first report: premarked, processed
    batches: set[int] = set()

    def at_delivery(tokens: list[int]) -> list[int]:
        if tokens and outbox.batches not in batches:  # the first report of a batch
            batches.add(outbox.batches)
            wait_for(lambda: outbox.premarked, timeout=10, message="the premark")
            before = sum(r.processed for r in outbox.rows.values())
            seen.append((list(outbox.premarked), before))
        return tokens

    factory = FakeSinkFactory(configure=lambda sink: setattr(sink, "reorder", at_delivery))
    worker = make_worker(outbox, factory)
    with running(worker):
        wait_for(lambda: all(r.processed for r in outbox.rows.values()), message="all processed")
    assert [premarked for premarked, _ in seen] == [["e0", "e1", "e2", "e3"],
                                                    ["e4", "e5", "e6", "e7"], ["e8", "e9"]]
    # the batch premarked was not processed before its reports: only earlier batches were
    assert [processed for _, processed in seen] == [0, 4, 8]
    assert outbox.premarks == 3 and outbox.batches == 3
    assert [m.headers[0][1] for m in factory.current.messages] == [f"e{n}".encode() for n in range(10)]


def test_failed_and_unproduced_events_of_a_premarked_batch_count_their_attempt() -> None:
    # e1 cannot be routed (never produced, so never premarked); e2's topic refuses it.
    outbox = FakeOutbox(events(4, odd={1: "bad type", 2: "invoice"}))
    factory = FakeSinkFactory(
        configure=lambda sink: sink.fail_topics.update({"t.invoice": ErrorKind.PERMANENT}))
    worker = make_worker(outbox, factory, max_attempts=5)
    with running(worker):
        wait_for(settled(outbox, "e0", "e1", "e2", "e3"), message="the batch settled")
    rows = outbox.rows
    assert [rows[i].processed for i in ("e0", "e1", "e2", "e3")] == [True, False, False, True]
    assert rows["e1"].attempts >= 1 and rows["e2"].attempts >= 1
    assert rows["e0"].attempts == rows["e3"].attempts == 0
    assert outbox.premarks >= 1


def test_a_broker_outage_after_the_premark_marks_nothing_and_counts_no_attempt() -> None:
    outbox = FakeOutbox(events(4))

    def configure(sink: FakeSink) -> None:
        if sink.generation == 1:  # every message of the first producer fails fatally
            sink.fail_topics["t.order"] = ErrorKind.FATAL

    factory = FakeSinkFactory(configure=configure)
    worker = make_worker(outbox, factory)
    with running(worker):
        wait_for(lambda: factory.generations >= 2 and all(r.processed for r in outbox.rows.values()),
                 message="published by the second producer")
    assert [r.attempts for r in outbox.rows.values()] == [0, 0, 0, 0]
    assert outbox.premarks == 2  # the failed batch was premarked too, then undone
    assert len(factory.sinks[0].produced) == 4 and len(factory.current.messages) == 4


def test_a_connection_lost_while_premarking_releases_the_batch_to_be_published_again() -> None:
    outbox = FakeOutbox(events(2))
    outbox.fail_next_premark = ServiceUnavailable("lost the PostgreSQL connection")
    factory = FakeSinkFactory()
    worker = make_worker(outbox, factory)
    with running(worker):
        wait_for(lambda: all(r.processed for r in outbox.rows.values()), message="all processed")
    assert outbox.released == 1 and outbox.batches == 1
    assert [r.attempts for r in outbox.rows.values()] == [0, 0]
    # published twice (at least once: the first copies' rows were never marked)
    assert [m.key for m in factory.current.messages] == [b"o-0", b"o-1", b"o-0", b"o-1"]


def test_a_premark_the_server_refuses_turns_premarking_off_for_that_worker(
        caplog: pytest.LogCaptureFixture) -> None:
    # A refusal (a trigger raising, a missing privilege) ended the batch's transaction
    # with its messages in flight: the worker must not open that window again per batch.
    outbox = FakeOutbox(events(8))
    outbox.fail_next_premark = DatabaseError("marking a batch: permission denied")
    worker = make_worker(outbox, FakeSinkFactory())
    with running(worker):
        wait_for(lambda: all(r.processed for r in outbox.rows.values()), message="all processed")
    assert outbox.released == 1 and outbox.premarks == 0  # marked after the acks from then on
    assert [r.attempts for r in outbox.rows.values()] == [0] * 8
    assert "now marks each batch after its acks" in caplog.text


def test_without_pipelining_nothing_is_premarked() -> None:
    outbox = FakeOutbox(events(6))
    worker = make_worker(outbox, FakeSinkFactory(), pipeline=False)
    with running(worker):
        wait_for(lambda: all(r.processed for r in outbox.rows.values()), message="all processed")
    assert outbox.premarks == 0 and outbox.batches == 2


def test_strict_order_releases_a_premarked_acknowledged_event_behind_its_aggregates_failure() -> None:
    # e0 and e3 are both aggregate o-0: e0's delivery fails (retriably, while e1 and e2
    # get through), so e3 - produced, acknowledged and premarked - must not be processed.
    outbox = FakeOutbox(events(4))
    verdicts: list[tuple[list[str], list[str], list[str]]] = []
    complete = outbox.complete

    def recording(processed: Sequence[OutboxEvent], failures: Sequence[AttemptFailure],
                  max_attempts: int) -> Completion:
        verdicts.append(([e.id for e in processed], [f.event.id for f in failures],
                         list(outbox.premarked)))
        return complete(processed, failures, max_attempts)

    outbox.complete = recording  # type: ignore[method-assign]

    def configure(sink: FakeSink) -> None:
        sink.fail_tokens[0] = ErrorKind.RETRIABLE  # the first message: e0

    worker = make_worker(outbox, FakeSinkFactory(configure=configure), strict_order=True,
                         max_attempts=5)
    with running(worker):
        wait_for(lambda: verdicts, message="the first batch settled")
    assert verdicts[0] == (["e1", "e2"], ["e0"], ["e0", "e1", "e2", "e3"])
