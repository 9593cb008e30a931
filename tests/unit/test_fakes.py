"""The FakeSink behaves as cdc_relay.testing documents (loop tests rely on it)."""

from __future__ import annotations

import pytest

from cdc_relay.errors import BrokerError
from cdc_relay.model import Message
from cdc_relay.sink.base import Delivery, ErrorKind, ProduceRejected, QueueFull, collect, ignore_reports
from cdc_relay.testing import FakeSink, FakeSinkFactory, reverse, shuffled


def msg(topic: str = "t") -> Message:
    return Message(topic, b"k", b"v")


def sink_with(**options: object) -> tuple[FakeSink, list[Delivery]]:
    got: list[Delivery] = []
    return FakeSink(collect(got), **options), got


def test_deliveries_are_reported_only_when_polled_in_produce_order() -> None:
    sink, got = sink_with()
    for token in range(3):
        sink.produce(msg(), token)
    assert got == [] and sink.pending() == 3
    assert sink.poll(0) == 3
    assert got == [Delivery(0), Delivery(1), Delivery(2)]
    assert sink.pending() == 0
    assert sink.messages == [msg(), msg(), msg()]


def test_failed_token_fails_once_with_its_kind() -> None:
    sink, got = sink_with(fail_tokens={1: ErrorKind.PERMANENT})
    sink.produce(msg(), 1)
    sink.produce(msg("dlq"), 1)  # re-produced under the same token, as a dead letter
    sink.flush(0)
    assert [d.error.kind if d.error else None for d in got] == [ErrorKind.PERMANENT, None]


def test_failed_topic_fails_every_delivery_to_it() -> None:
    sink, got = sink_with(fail_topics={"bad": ErrorKind.RETRIABLE})
    for token, topic in enumerate(["bad", "ok", "bad"]):
        sink.produce(msg(topic), token)
    sink.poll(0)
    assert [d.error is not None for d in got] == [True, False, True]
    assert got[0].error is not None and got[0].error.kind is ErrorKind.RETRIABLE


def test_rejected_topic_raises_at_produce() -> None:
    sink, _ = sink_with(reject_topics={"huge": ErrorKind.PERMANENT})
    with pytest.raises(ProduceRejected) as caught:
        sink.produce(msg("huge"), 0)
    assert caught.value.error.kind is ErrorKind.PERMANENT
    assert sink.pending() == 0


def test_queue_limit_raises_queue_full_until_polled() -> None:
    sink, _ = sink_with(queue_limit=2)
    sink.produce(msg(), 0)
    sink.produce(msg(), 1)
    with pytest.raises(QueueFull):
        sink.produce(msg(), 2)
    sink.poll(0)
    sink.produce(msg(), 2)


def test_held_deliveries_wait_for_release() -> None:
    sink, got = sink_with(hold=True)
    for token in range(3):
        sink.produce(msg(), token)
    assert sink.poll(0) == 0 and sink.flush(1) == 3
    sink.release([2])
    sink.poll(0)
    assert got == [Delivery(2)]
    sink.release()
    sink.poll(0)
    assert got == [Delivery(2), Delivery(0), Delivery(1)]


@pytest.mark.parametrize("reorder", [reverse, shuffled(7)])
def test_reorder_delivers_every_token_once_in_its_order(reorder: object) -> None:
    sink, got = sink_with(reorder=reorder)
    for token in range(20):
        sink.produce(msg(), token)
    sink.flush(0)
    assert sorted(d.token for d in got) == list(range(20))
    assert [d.token for d in got] != list(range(20))


def test_reorder_may_hold_back_tokens_and_max_per_poll_limits_a_poll() -> None:
    sink, got = sink_with(reorder=lambda tokens: [t for t in tokens if t % 2], max_per_poll=1)
    for token in range(4):
        sink.produce(msg(), token)
    assert sink.poll(0) == 1
    assert sink.poll(0) == 1
    assert sink.poll(0) == 0
    assert [d.token for d in got] == [1, 3] and sink.pending() == 2


def test_close_reports_what_is_ready_drops_the_rest_and_then_rejects() -> None:
    sink, got = sink_with(hold=True)
    sink.produce(msg(), 0)
    sink.produce(msg(), 1)
    sink.release([0])
    sink.close(1)
    assert got == [Delivery(0)]
    assert [token for token, _ in sink.dropped] == [1]
    assert sink.pending() == 0 and sink.poll(0) == 0
    with pytest.raises(ProduceRejected) as caught:
        sink.produce(msg(), 2)
    assert caught.value.error.kind is ErrorKind.FATAL


def test_fail_producer_sets_a_fatal_error() -> None:
    sink, _ = sink_with()
    assert sink.fatal_error is None
    sink.fail_producer("fenced")
    assert sink.fatal_error is not None and sink.fatal_error.kind is ErrorKind.FATAL


def test_factory_numbers_generations_and_configures_each_sink() -> None:
    def fail_first(sink: FakeSink) -> None:
        if sink.generation == 1:
            sink.fail_producer()

    factory = FakeSinkFactory(fail_first, queue_limit=5)
    first, second = factory(ignore_reports), factory(ignore_reports)
    assert factory.generations == 2 and factory.current is second
    assert (first.generation, second.generation) == (1, 2)
    assert first.fatal_error is not None and second.fatal_error is None
    assert second.queue_limit == 5


def test_warm_up_is_recorded_or_fails_when_unreachable() -> None:
    sink, _ = sink_with()
    sink.warm_up(1)
    assert sink.warmed_up
    down, _ = sink_with(unreachable=True)
    with pytest.raises(BrokerError):
        down.warm_up(1)


def test_set_handler_sends_the_reports_served_from_then_on_to_the_new_handler() -> None:
    sink, first = sink_with()
    sink.produce(msg(), 0)
    sink.produce(msg(), 1)
    second: list[Delivery] = []
    sink.set_handler(collect(second))
    assert sink.poll(0) == 2
    assert first == [] and second == [Delivery(0), Delivery(1)]


def test_batch_reports_hand_a_polls_successes_over_at_once_failures_in_order() -> None:
    order: list[object] = []
    sink = FakeSink(ignore_reports, batch_reports=True, fail_tokens={2: ErrorKind.PERMANENT})
    sink.set_handler(lambda token, error: order.append((token, error is None)), order.append)
    for token in range(5):
        sink.produce(Message("t", b"k", b"v"), token)
    assert sink.poll(0) == 5
    assert order == [[0, 1], (2, False), [3, 4]]
    unbatched: list[object] = []
    plain = FakeSink(ignore_reports)  # batch_reports off: the batch handler is not used
    plain.set_handler(lambda token, error: unbatched.append(token), unbatched.append)
    plain.produce(Message("t", b"k", b"v"), 7)
    plain.poll(0)
    assert unbatched == [7]
