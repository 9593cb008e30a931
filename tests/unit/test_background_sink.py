"""The relay-thread bookkeeping of the RabbitMQ and NATS sinks, and their message mapping.

A small BackgroundSink subclass plays the I/O thread: the test decides when a report
"arrives". The RabbitMQ confirm bookkeeping (multiple acks, nacks, returns) is driven
through its callbacks with a recording channel, without a broker.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from pika import spec

from cdc_relay.model import Message
from cdc_relay.sink.background import BackgroundSink
from cdc_relay.sink.base import Delivery, DeliveryError, ErrorKind, ProduceRejected, QueueFull, collect
from cdc_relay.sink.config import parse_rabbitmq
from cdc_relay.sink.nats import classify, headers
from cdc_relay.sink.rabbitmq import RabbitMqSink, properties


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ScriptedSink(BackgroundSink):
    kind = "scripted"

    def __init__(self, got: list[Delivery], clock: Clock, max_in_flight: int = 3) -> None:
        super().__init__(collect(got), generation=1, max_in_flight=max_in_flight,
                         message_timeout=10.0, logger=logging.getLogger("test"), clock=clock)
        self.submitted: list[tuple[int, Message]] = []
        self.stopped = False

    def _refuse(self, message: Message) -> DeliveryError | None:
        too_large = len(message.value) > 10
        return DeliveryError(ErrorKind.PERMANENT, "too large") if too_large else None

    def _submit(self, seq: int, message: Message) -> None:
        self.submitted.append((seq, message))

    def _stop(self) -> None:
        self.stopped = True


def msg(value: bytes = b"{}", topic: str = "t") -> Message:
    return Message(topic, b"k", value, [("id", b"e-1"), ("event_type", b"Created"),
                                         ("aggregate_type", b"Order")], 1_700_000_000_123)


def test_reports_reach_the_handler_only_from_poll() -> None:
    got: list[Delivery] = []
    sink = ScriptedSink(got, Clock())
    sink.produce(msg(), 7)
    sink.produce(msg(), 8)
    [(seq7, _), (seq8, _)] = sink.submitted
    sink._report([seq8], None)
    sink._report([seq7], DeliveryError(ErrorKind.RETRIABLE, "nack"))
    assert got == [] and sink.pending() == 2
    assert sink.poll(0) == 2
    assert got == [Delivery(8), Delivery(7, DeliveryError(ErrorKind.RETRIABLE, "nack"))]
    assert sink.pending() == 0


def test_a_late_report_of_an_earlier_publish_is_not_taken_for_a_re_produce() -> None:
    got: list[Delivery] = []
    sink = ScriptedSink(got, Clock())
    sink.produce(msg(), 1)
    first = sink.submitted[0][0]
    sink._report([first], DeliveryError(ErrorKind.PERMANENT, "unroutable"))
    sink.poll(0)
    sink.produce(msg(topic="dlq"), 1)  # the same token, now as a dead letter
    sink._report([first], None)  # a duplicate report of the first publish
    assert sink.poll(0) == 0 and sink.pending() == 1
    sink._report([sink.submitted[1][0]], None)
    sink.poll(0)
    assert got[-1] == Delivery(1)


def test_the_in_flight_bound_is_backpressure_and_a_refusal_is_permanent() -> None:
    sink = ScriptedSink([], Clock(), max_in_flight=2)
    sink.produce(msg(), 1)
    sink.produce(msg(), 2)
    with pytest.raises(QueueFull):
        sink.produce(msg(), 3)
    sink._report([sink.submitted[0][0]], None)
    sink.poll(0)
    with pytest.raises(ProduceRejected) as rejected:
        sink.produce(msg(b"x" * 11), 3)
    assert rejected.value.error.kind is ErrorKind.PERMANENT
    sink.produce(msg(), 3)


def test_an_unconfirmed_message_past_the_timeout_makes_the_sink_fatal() -> None:
    clock = Clock()
    got: list[Delivery] = []
    sink = ScriptedSink(got, clock)
    sink.produce(msg(), 1)
    clock.now = 9.0
    sink.produce(msg(), 2)
    sink._report([sink.submitted[0][0]], None)  # the oldest is confirmed ...
    clock.now = 15.0
    sink.poll(0)
    assert sink.fatal_error is None  # ... the other is only 6 s old
    clock.now = 19.5
    sink.poll(0)
    assert sink.fatal_error is not None and "message timeout" in sink.fatal_error.reason
    with pytest.raises(ProduceRejected):
        sink.produce(msg(), 3)
    sink.close(5.0)
    assert sink.stopped and got == [Delivery(1)]  # token 2 is dropped, never reported


def test_close_reports_what_arrived_and_drops_the_rest() -> None:
    got: list[Delivery] = []
    sink = ScriptedSink(got, Clock())
    sink.produce(msg(), 1)
    sink.produce(msg(), 2)
    sink._report([sink.submitted[1][0]], None)
    sink._fail("connection lost")
    sink.close(5.0)
    assert got == [Delivery(2)] and sink.pending() == 0
    with pytest.raises(ProduceRejected, match="closed"):
        sink.produce(msg(), 3)


# -- RabbitMQ -----------------------------------------------------------------------

class RecordingChannel:
    def __init__(self) -> None:
        self.published: list[tuple[str, str, bytes, Any, bool]] = []

    def basic_publish(self, exchange: str, routing_key: str, body: bytes, props: Any,
                      mandatory: bool) -> None:
        self.published.append((exchange, routing_key, body, props, mandatory))


def rabbit_sink(got: list[Delivery]) -> tuple[RabbitMqSink, RecordingChannel]:
    config = parse_rabbitmq("amqp://guest:guest@127.0.0.1:1/%2F", ["exchange=ex",
                            "dead_letter_exchange=dlx"], dead_letter_topic="dead")
    sink = RabbitMqSink(config, collect(got))
    channel = RecordingChannel()
    sink._channel, sink._ready = channel, True
    sink._submit = lambda seq, message: sink._outbox.append((seq, message))  # type: ignore[method-assign]
    return sink, channel


def frame(method: Any) -> SimpleNamespace:
    return SimpleNamespace(method=method)


def test_rabbitmq_acks_nacks_and_returns_become_deliveries() -> None:
    got: list[Delivery] = []
    sink, channel = rabbit_sink(got)
    for token in range(4):
        message = msg(topic="dead" if token == 3 else "o.order")
        message.headers[0] = ("id", f"e-{token}".encode())
        sink.produce(message, token)
    sink._drain()
    assert [(p[0], p[1], p[4]) for p in channel.published] == [
        ("ex", "o.order", True), ("ex", "o.order", True), ("ex", "o.order", True),
        ("dlx", "dead", True)]
    returned = SimpleNamespace(exchange="ex", routing_key="o.order", reply_code=312,
                               reply_text="NO_ROUTE")
    sink._on_return(None, returned, SimpleNamespace(message_id="e-1"), b"")
    sink._on_confirm(frame(spec.Basic.Ack(delivery_tag=2, multiple=True)))
    sink._on_confirm(frame(spec.Basic.Nack(delivery_tag=4, multiple=False)))
    sink._on_confirm(frame(spec.Basic.Ack(delivery_tag=3, multiple=False)))
    sink.poll(0)
    by_token = {d.token: d.error for d in got}
    assert by_token[0] is None and by_token[2] is None
    assert by_token[1] is not None and by_token[1].kind is ErrorKind.PERMANENT
    assert "unroutable" in by_token[1].reason and "NO_ROUTE" in by_token[1].reason
    assert by_token[3] is not None and by_token[3].kind is ErrorKind.RETRIABLE
    assert sink.pending() == 0 and not sink._tags and not sink._unconfirmed


def test_rabbitmq_properties_carry_the_message_contract() -> None:
    props = properties(Message("o.order", "agg-ä".encode(), b"{}", [
        ("id", b"e-1"), ("event_type", b"Created"), ("aggregate_type", b"Order")], 1_700_000_000_999))
    assert (props.message_id, props.type, props.timestamp) == ("e-1", "Created", 1_700_000_000)
    assert (props.content_type, props.delivery_mode) == ("application/json", 2)
    assert props.headers == {"id": "e-1", "event_type": "Created", "aggregate_type": "Order",
                             "aggregate_id": "agg-ä"}
    long_type = properties(Message("t", b"k", b"", [("event_type", "é".encode() * 200)]))
    assert long_type.type is None and long_type.headers["event_type"] == "é" * 200


def test_nats_headers_carry_the_dedup_id_and_the_contract() -> None:
    assert headers(msg()) == {"id": "e-1", "event_type": "Created", "aggregate_type": "Order",
                              "aggregate_id": "k", "timestamp": "1700000000123",
                              "Nats-Msg-Id": "e-1"}


def test_nats_errors_are_classified() -> None:
    from nats.js.errors import APIError, NoStreamResponseError

    assert classify(NoStreamResponseError(), "s").kind is ErrorKind.PERMANENT
    assert classify(APIError(code=503, description="busy"), "s").kind is ErrorKind.RETRIABLE
    assert classify(APIError(code=400, description="bad"), "s").kind is ErrorKind.FATAL
    assert classify(RuntimeError("?"), "s").kind is ErrorKind.FATAL


def test_nats_pub_acks_duplicates_no_responders_and_api_errors_become_deliveries() -> None:
    import asyncio

    from nats.aio.msg import Msg as NatsMsg

    from cdc_relay.sink.config import parse_nats
    from cdc_relay.sink.nats import NatsSink

    got: list[Delivery] = []
    config = parse_nats("nats://127.0.0.1:1", [], topic_pattern="o.{aggregate_type}",
                        dead_letter_topic="o.dlq")
    sink = NatsSink(config, collect(got))
    sink._submit = lambda seq, message: None  # type: ignore[method-assign]
    for token in range(4):
        sink.produce(msg(topic="o.order"), token)
    sink._reply_prefix = "_INBOX.x."
    replies = [
        NatsMsg(None, subject="_INBOX.x.0", data=b'{"stream":"S", "seq":1}'),  # type: ignore[arg-type]
        NatsMsg(None, subject="_INBOX.x.1",  # type: ignore[arg-type]
                data=b'{"stream":"S", "seq":1,"duplicate": true}'),
        NatsMsg(None, subject="_INBOX.x.2", data=b"", headers={"Status": "503"}),  # type: ignore[arg-type]
        NatsMsg(None, subject="_INBOX.x.3", data=b'{"error":{"code":503,"err_code":10008,'  # type: ignore[arg-type]
                b'"description":"JetStream system temporarily unavailable"}}'),
    ]

    async def deliver() -> None:
        for reply in replies:
            await sink._on_reply(reply)
        await asyncio.sleep(0)  # the batched ack report

    asyncio.run(deliver())
    sink.poll(0)
    by_token = {d.token: d.error for d in got}
    assert by_token[0] is None and by_token[1] is None and sink.duplicates == 1
    assert by_token[2] is not None and by_token[2].kind is ErrorKind.PERMANENT
    assert by_token[3] is not None and by_token[3].kind is ErrorKind.RETRIABLE
    assert "temporarily unavailable" in by_token[3].reason


def test_set_handler_sends_later_reports_to_the_new_handler() -> None:
    got: list[Delivery] = []
    sink, _channel = rabbit_sink(got)
    sink.produce(msg(topic="o.order"), 0)
    sink.produce(msg(topic="o.order"), 1)
    sink._drain()
    sink._on_confirm(frame(spec.Basic.Ack(delivery_tag=1, multiple=False)))
    sink.poll(0)
    later: list[Delivery] = []
    sink.set_handler(collect(later))
    sink._on_confirm(frame(spec.Basic.Ack(delivery_tag=2, multiple=False)))
    sink.poll(0)
    assert got == [Delivery(0)] and later == [Delivery(1)]
