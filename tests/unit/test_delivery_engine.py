"""The delivery engine (delivery/): watermark, produce with backpressure, refusals, new producers.

Driven by the fakes of cdc_relay.testing (FakeSink, FakeSinkFactory): no services.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_relay.config import RouterConfig
from cdc_relay.delivery.engine import Engine, ProducerFailed, Stopped, TopicUnavailable
from cdc_relay.delivery.producer import new_producer
from cdc_relay.delivery.watermark import Watermark
from cdc_relay.errors import AccessRefused, ConfigError, DeadLetterRefused
from cdc_relay.model import OutboxEvent
from cdc_relay.routing import Router
from cdc_relay.sink.base import Cause, DeliveryError, DeliveryHandler, ErrorKind
from cdc_relay.testing import FakeSink, FakeSinkFactory, shuffled

DEAD = "outbox.dead-letters"


@dataclass
class Counts:
    published: int = 0
    dead_lettered: int = 0
    failed_by_type: dict[str, int] = field(default_factory=dict)


def event(n: int, aggregate_type: str = "order") -> OutboxEvent:
    return OutboxEvent(f"id-{n}", aggregate_type, f"o-{n}", "Placed", b'{"n": %d}' % n,
                       1_700_000_000_000 + n)


class Loop:
    """What a loop around the engine does: tokens from a watermark, acks into it."""

    def __init__(self, sink: FakeSink, *, stop: threading.Event | None = None) -> None:
        self.watermark = Watermark()
        self.counts = Counts()
        self.served = 0
        self.engine = Engine(sink, Router(RouterConfig()), self.counts,
                             self.watermark.delivered_all, serve=self._serve, stop=stop)
        sink.set_handler(self.engine.on_delivery, self.engine.on_delivered)
        self.sink = sink

    def _serve(self) -> None:
        self.served += 1

    def send(self, *events: OutboxEvent) -> list[int]:
        tokens = []
        for e in events:
            token = self.watermark.produced()
            self.engine.send(token, e)
            tokens.append(token)
        return tokens

    def settle(self) -> None:
        self.sink.flush(0)
        while self.engine.redo:  # what the loop does between polls
            self.engine.produce_redo()
            self.sink.flush(0)


# ------------------------------------------------------------------- the watermark
@settings(max_examples=200, deadline=None)
@given(n=st.integers(min_value=0, max_value=40), data=st.data())
def test_the_watermark_is_the_count_of_the_contiguous_delivered_prefix(
        n: int, data: st.DataObject) -> None:
    watermark = Watermark()
    tokens = [watermark.produced() for _ in range(n)]
    delivered = data.draw(st.permutations(tokens))
    cut = data.draw(st.integers(min_value=0, max_value=n))
    watermark.delivered_all(delivered[:cut])
    done = set(delivered[:cut])
    low = next((t for t in tokens if t not in done), n)
    assert watermark.low == low
    assert watermark.delivered_count == cut
    assert all(watermark.acknowledged(t) == (t in done) for t in tokens)
    assert watermark.inflight == n - low


def test_a_rewound_watermark_hands_out_the_unacknowledged_tokens_again() -> None:
    watermark = Watermark()
    for _ in range(5):
        watermark.produced()
    watermark.delivered_all([0, 1, 3])
    watermark.delivered(9)  # never produced: ignored
    watermark.rewind()
    again = [watermark.produced() for _ in range(3)]
    assert again == [2, 3, 4]
    assert [watermark.acknowledged(t) for t in again] == [False, True, False]
    assert watermark.delivered_count == 3


# ----------------------------------------------------------------------- the engine
def test_acknowledged_messages_move_the_watermark_and_are_counted() -> None:
    sink = FakeSink(lambda token, error: None, reorder=shuffled(5), batch_reports=True)
    loop = Loop(sink)
    loop.send(*(event(n) for n in range(50)))
    assert loop.engine.inflight_bytes == sum(len(event(n).payload) for n in range(50))
    loop.settle()
    assert loop.watermark.low == 50
    assert (loop.counts.published, loop.counts.dead_lettered) == (50, 0)
    assert loop.engine.inflight == {} and loop.engine.inflight_bytes == 0


def test_a_routing_error_sends_the_dead_letter_under_the_same_token() -> None:
    sink = FakeSink(lambda token, error: None)
    loop = Loop(sink)
    [token] = loop.send(event(1, aggregate_type="no spaces allowed"))
    loop.settle()
    [(produced_token, message)] = sink.produced
    assert (produced_token, message.topic) == (token, DEAD)
    assert loop.watermark.low == 1 and loop.counts.dead_lettered == 1


def test_a_delivery_refused_for_good_is_dead_lettered_and_the_watermark_waits_for_it() -> None:
    sink = FakeSink(lambda token, error: None, fail_tokens={0: ErrorKind.PERMANENT}, hold=True)
    loop = Loop(sink)
    loop.send(event(0), event(1))
    sink.release([0, 1])
    sink.poll(0)
    assert loop.watermark.low == 0  # the refused one holds it until its dead letter's ack
    assert loop.engine.redo and loop.counts.failed_by_type == {"Placed": 1}
    sink.release()
    loop.settle()
    assert [m.topic for m in sink.messages] == ["outbox.event.order", "outbox.event.order", DEAD]
    assert loop.watermark.low == 2
    assert (loop.counts.published, loop.counts.dead_lettered) == (1, 1)


def test_too_large_is_the_sinks_cause_not_the_error_text() -> None:
    large = DeliveryError(ErrorKind.PERMANENT, "broker says: too large", Cause.TOO_LARGE)
    worded = DeliveryError(ErrorKind.PERMANENT, "MSG_SIZE_TOO_LARGE: too large")  # no cause
    sink = FakeSink(lambda token, error: None, fail_tokens={0: large, 1: worded})
    loop = Loop(sink)
    loop.send(event(0), event(1))
    loop.settle()
    dead = {dict(m.headers)["id"]: m for m in sink.messages if m.topic == DEAD}
    assert dead[b"id-0"].value == b""
    assert dict(dead[b"id-0"].headers)["payload_omitted_bytes"] == str(
        len(Router(RouterConfig()).dead_letter(event(0), large.reason).value)).encode()
    assert dead[b"id-1"].value == event(1).payload
    assert "payload_omitted_bytes" not in dict(dead[b"id-1"].headers)


def test_a_dead_letter_too_large_is_sent_once_more_without_its_payload() -> None:
    too_large = DeliveryError(ErrorKind.PERMANENT, "too large", Cause.TOO_LARGE)
    sink = FakeSink(lambda token, error: None, fail_tokens={0: ErrorKind.PERMANENT})
    loop = Loop(sink)
    loop.send(event(0))
    sink.poll(0)
    sink.fail_tokens[0] = too_large  # the dead letter, with the payload, is too large
    loop.settle()
    assert [m.value for m in sink.messages if m.topic == DEAD] == [event(0).payload, b""]
    assert loop.watermark.low == 1 and loop.engine.failure is None


def test_a_dead_letter_refused_again_stops_with_dead_letter_refused() -> None:
    sink = FakeSink(lambda token, error: None, fail_topics={"outbox.event.order": ErrorKind.PERMANENT},
                    reject_topics={DEAD: ErrorKind.PERMANENT})
    loop = Loop(sink)
    loop.send(event(0))
    sink.poll(0)
    with pytest.raises(DeadLetterRefused, match="refused event id-0"):
        loop.engine.produce_redo()
    assert loop.watermark.low == 0  # never confirmed past it


def test_a_refused_dead_letter_report_wins_over_an_earlier_failure() -> None:
    sink = FakeSink(lambda token, error: None,
                    fail_tokens={0: ErrorKind.FATAL, 1: ErrorKind.PERMANENT})
    loop = Loop(sink)
    loop.send(event(0), event(1))
    sink.poll(0)
    assert isinstance(loop.engine.failure, ProducerFailed)
    sink.fail_tokens[1] = ErrorKind.PERMANENT  # the dead letter fails too
    loop.engine.produce_redo()
    sink.poll(0)
    with pytest.raises(DeadLetterRefused):
        loop.engine.check()


def test_a_missing_topic_is_retried_never_dead_lettered() -> None:
    missing = DeliveryError(ErrorKind.RETRIABLE, "unknown topic", Cause.TOPIC_MISSING)
    sink = FakeSink(lambda token, error: None, fail_tokens={0: missing})
    loop = Loop(sink)
    loop.send(event(0))
    sink.poll(0)
    with pytest.raises(TopicUnavailable) as raised:
        loop.engine.check()
    assert raised.value.reason == "topic_missing"
    assert not any(m.topic == DEAD for m in sink.messages)


def test_a_missing_destination_is_reported_in_the_sinks_words_not_kafkas() -> None:
    reason = ("queue 'outbox-event-order.fifo' does not exist: create it (aws sqs create-queue "
              "--queue-name outbox-event-order.fifo --attributes FifoQueue=true; docs/sinks.md)")
    sink = FakeSink(lambda token, error: None, fail_tokens={
        0: DeliveryError(ErrorKind.RETRIABLE, reason, Cause.TOPIC_MISSING)})
    loop = Loop(sink)
    loop.send(event(0))
    sink.poll(0)
    with pytest.raises(TopicUnavailable) as raised:
        loop.engine.check()
    assert reason in str(raised.value) and "retrying, nothing is dead-lettered" in str(raised.value)
    assert "topic" not in str(raised.value)


def test_a_refusal_at_produce_that_is_not_the_events_fault_fails_the_producer() -> None:
    sink = FakeSink(lambda token, error: None, reject_topics={"outbox.event.order": ErrorKind.FATAL})
    loop = Loop(sink)
    with pytest.raises(ProducerFailed, match="delivery of event id-0 failed"):
        loop.send(event(0))


def test_a_failed_producer_ends_the_run() -> None:
    sink = FakeSink(lambda token, error: None)
    loop = Loop(sink)
    loop.engine.check()
    sink.fail_producer("fenced")
    with pytest.raises(ProducerFailed, match="producer failed: fenced"):
        loop.engine.check()


def test_a_full_queue_is_served_until_there_is_room() -> None:
    sink = FakeSink(lambda token, error: None, queue_limit=3)
    loop = Loop(sink)
    loop.send(*(event(n) for n in range(10)))
    loop.settle()
    assert loop.served > 0  # the loop's chores ran while it waited
    assert [m.key for m in sink.messages] == [f"o-{n}".encode() for n in range(10)]
    assert loop.watermark.low == 10


def test_a_stop_request_ends_the_wait_for_room_without_sending() -> None:
    stop = threading.Event()
    sink = FakeSink(lambda token, error: None, queue_limit=1, hold=True)
    loop = Loop(sink, stop=stop)
    loop.send(event(0))
    stop.set()
    with pytest.raises(Stopped):
        loop.send(event(1))
    assert len(sink.produced) == 1


def test_a_handler_may_claim_a_failed_delivery() -> None:
    claimed: list[str] = []

    def failed(e: OutboxEvent, error: DeliveryError) -> bool:
        claimed.append(e.id)
        return True

    sink = FakeSink(lambda token, error: None, fail_tokens={0: ErrorKind.PERMANENT})
    engine = Engine(sink, Router(RouterConfig()), Counts(), lambda tokens: None, failed=failed)
    sink.set_handler(engine.on_delivery, engine.on_delivered)
    engine.send(0, event(0))
    sink.poll(0)
    assert claimed == ["id-0"] and engine.redo == [] and engine.failure is None


# ------------------------------------------------------------------- a new producer
def _clock() -> Callable[[], float]:
    ticks = itertools.count()
    return lambda: float(next(ticks))


def test_a_new_producer_is_warmed_up_and_reports_nowhere_yet() -> None:
    factory = FakeSinkFactory()
    sink = new_producer(factory, warmup=5, clock=_clock(), stopped=lambda: False)
    assert sink is factory.current and factory.current.warmed_up
    sink.produce(Router(RouterConfig()).route(event(0)), 0)
    sink.flush(0)  # the report goes nowhere until the loop points the sink at its engine


def test_a_broker_that_does_not_answer_is_a_producer_failure_and_the_sink_is_closed() -> None:
    factory = FakeSinkFactory(unreachable=True)
    with pytest.raises(ProducerFailed, match="broker not reachable"):
        new_producer(factory, warmup=5, clock=_clock(), stopped=lambda: False)
    assert factory.current.closed


def test_a_stop_while_warming_up_returns_no_producer() -> None:
    factory = FakeSinkFactory(unreachable=True)
    assert new_producer(factory, warmup=5, clock=_clock(), stopped=lambda: True) is None
    assert factory.current.closed


def test_what_a_retry_cannot_fix_is_raised_as_is() -> None:
    def bad_config(on_delivery: DeliveryHandler) -> FakeSink:
        raise ConfigError("bad --producer-config")

    with pytest.raises(ConfigError):
        new_producer(bad_config, warmup=5, clock=_clock(), stopped=lambda: False)

    refused = FakeSinkFactory()

    def refusing(on_delivery: DeliveryHandler) -> FakeSink:
        sink = refused(on_delivery)

        def warm_up(timeout: float) -> None:
            raise AccessRefused("SASL authentication failed")

        sink.warm_up = warm_up  # type: ignore[method-assign]
        return sink

    with pytest.raises(AccessRefused):
        new_producer(refusing, warmup=5, clock=_clock(), stopped=lambda: False)
    assert refused.current.closed
