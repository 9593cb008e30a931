"""The WAL relay loop against fakes: a scripted replication slot (wal_harness.py) and FakeSink."""

from __future__ import annotations

import pytest

from cdc_relay.config import FlowConfig, RouterConfig
from cdc_relay.errors import DecodeError
from cdc_relay.model import Message
from cdc_relay.sink.base import Cause, DeliveryError, DeliveryHandler, ErrorKind, ProduceRejected
from cdc_relay.testing import FakeSink, FakeSinkFactory, shuffled
from cdc_relay.wal.stream.protocol import KEEPALIVE, XLOG_DATA, ServerMessage
from tests.unit.wal_harness import Harness, Txn, report_styles, txns

__all__ = ["report_styles"]  # the autouse fixture: every test with both report styles


def test_out_of_order_acks_confirm_only_complete_prefixes_and_everything_at_the_end() -> None:
    factory = FakeSinkFactory(reorder=shuffled(3), max_per_poll=3)
    harness = Harness(txns(20, 5), factory)
    harness.run()
    assert harness.slot.confirmed == 20_000
    assert harness.acked_ids() == {e for t in harness.slot.txns for e in t.event_ids}
    assert factory.generations == 1


def test_fatal_delivery_replays_from_the_slot_with_a_new_producer() -> None:
    def fail_first(sink: FakeSink) -> None:
        if sink.generation == 1:
            sink.fail_tokens[7] = ErrorKind.FATAL

    factory = FakeSinkFactory(configure=fail_first)
    harness = Harness(txns(5, 4), factory)
    harness.run()
    assert factory.generations == 2
    assert harness.slot.opens == 2
    assert harness.slot.confirmed == 5000
    # The replay started at or before the transaction holding the failed event (txn 1).
    replayed = [dict(m.headers)["id"].decode() for m in factory.sinks[1].messages]
    assert replayed[0] <= "e1-3"
    assert harness.acked_ids() >= {e for t in harness.slot.txns for e in t.event_ids}


def test_permanent_failure_goes_to_the_dead_letter_topic_under_the_same_token() -> None:
    factory = FakeSinkFactory(fail_tokens={2: ErrorKind.PERMANENT})
    harness = Harness(txns(2, 3), factory,
                      router=RouterConfig(topic_pattern="t.{aggregate_type}", dead_letter_topic="dlq"))
    harness.run()
    sink = factory.current
    dead = [(token, m) for token, m in sink.produced if m.topic == "dlq"]
    assert [token for token, _ in dead] == [2]
    assert b"fake" in dict(dead[0][1].headers)["error"]
    assert harness.slot.confirmed == 2000
    assert harness.relay.stats.dead_lettered == 1
    assert harness.relay.stats.published == 5


def test_illegal_topic_is_dead_lettered_without_failing_the_stream() -> None:
    txns = [Txn(1000, ["bad-0", "e0-1"])]
    factory = FakeSinkFactory()
    harness = Harness(txns, factory, router=RouterConfig(
        topic_pattern="t.{aggregate_type}", dead_letter_topic="dlq"))
    harness.run()
    assert [m.topic for m in factory.current.messages] == ["dlq", "t.order"]
    assert harness.slot.confirmed == 1000


def test_backpressure_stops_reading_but_keeps_sending_status_updates() -> None:
    factory = FakeSinkFactory(hold=True)
    harness = Harness(txns(10, 10), factory, flow=FlowConfig(max_inflight_events=15))
    harness.idle_hook = lambda: None  # acks stay held until the clock says otherwise
    seen: dict[str, int] = {}
    ticks = {"n": 0}

    def fake_clock() -> float:
        # The loop reads the clock every turn; 1 ms of fake time per read.
        ticks["n"] += 1
        if ticks["n"] == 1000:
            seen["reads"] = harness.sources[-1].reads
            seen["statuses"] = len(harness.slot.statuses)
        if ticks["n"] == 3000:
            seen["reads_later"] = harness.sources[-1].reads
            seen["statuses_later"] = len(harness.slot.statuses)
            factory.current.hold = False
            harness.idle_hook = harness._stop_when_done
        return ticks["n"] / 1000

    harness.relay._clock = fake_clock
    harness.run()
    assert seen["reads"] == seen["reads_later"], "WAL was read while backed up"
    assert seen["reads"] < 10 * 12
    assert seen["statuses_later"] > seen["statuses"], "no status updates while backed up"
    assert harness.slot.confirmed == 10_000


def test_busy_slot_is_retried_until_the_other_relay_lets_go() -> None:
    factory = FakeSinkFactory()
    harness = Harness(txns(2, 2), factory)
    harness.slot.busy_opens = 3
    harness.run()
    assert harness.slot.opens == 4
    assert harness.slot.confirmed == 2000


def test_decode_error_is_fatal_and_nothing_past_it_is_confirmed() -> None:
    factory = FakeSinkFactory()
    harness = Harness(txns(3, 2), factory)
    original = harness.slot.messages

    def corrupt() -> list[ServerMessage]:
        messages = original()
        messages[5] = (XLOG_DATA, messages[5][1], memoryview(b"{not json"))
        return messages

    harness.slot.messages = corrupt  # type: ignore[method-assign]
    with pytest.raises(DecodeError):
        harness.run()
    assert harness.slot.confirmed <= 1000


def test_keepalive_advances_an_idle_slot() -> None:
    factory = FakeSinkFactory()
    harness = Harness(txns(1, 1), factory)
    original = harness.slot.messages

    def with_keepalive() -> list[ServerMessage]:
        return [*original(), (KEEPALIVE, 5000, False)]

    harness.slot.messages = with_keepalive  # type: ignore[method-assign]
    harness.slot.txns.append(Txn(5000, []))  # the stop condition: reach the keepalive
    harness.run()
    assert harness.slot.confirmed == 5000


class SizeLimitedSink(FakeSink):
    """Refuses, at produce(), any message whose value exceeds 10 bytes - like librdkafka."""

    def produce(self, message: Message, token: int) -> None:
        if len(message.value) > 10:
            raise ProduceRejected(DeliveryError(ErrorKind.PERMANENT, "Broker: Message size too large",
                                                Cause.TOO_LARGE))
        super().produce(message, token)


class SizeLimitedFactory(FakeSinkFactory):
    def __call__(self, on_delivery: DeliveryHandler) -> FakeSink:
        sink = SizeLimitedSink(on_delivery, generation=len(self.sinks) + 1)
        self.sinks.append(sink)
        return sink


@pytest.mark.parametrize("event_id", ["e0-0", "bad-0"])
def test_too_large_event_is_dead_lettered_without_its_payload(event_id: str) -> None:
    # "bad-0" also has an illegal topic: its dead letter (with payload) is refused as too
    # large in turn, and the second dead letter omits the payload.
    factory = SizeLimitedFactory()
    harness = Harness([Txn(1000, [event_id])], factory, router=RouterConfig(
        topic_pattern="t.{aggregate_type}", dead_letter_topic="dlq"))
    harness.run()
    [message] = factory.current.messages
    assert message.topic == "dlq" and message.value == b""
    headers = dict(message.headers)
    assert int(headers["payload_omitted_bytes"]) > 10
    assert headers["id"] == event_id.encode()
    assert harness.slot.confirmed == 1000
    assert harness.relay.stats.dead_lettered == 1 and harness.relay.stats.published == 0
