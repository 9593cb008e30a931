"""KafkaSink against the real (local) broker: the message contract, errors, generations."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError

from cdc_relay.config import KafkaConfig
from cdc_relay.errors import BrokerError
from cdc_relay.local.broker import Broker
from cdc_relay.model import Message
from cdc_relay.sink.base import Cause, Delivery, ErrorKind, ProduceRejected, collect, ignore_reports
from cdc_relay.sink.kafka.client import check_brokers, classify, describe_settings, producer_settings
from cdc_relay.sink.kafka.sink import KafkaSink, Reports, kafka_sink_factory
from tests.support import KafkaCollector


def serve_until(sink: KafkaSink, done: Callable[[], object], timeout: float = 30.0) -> None:
    """Poll the sink until ``done()`` is true; a bound against hanging, not a timing check."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError("the sink did not get there in time")
        sink.poll(0.05)


def test_messages_arrive_with_exact_key_value_headers_and_timestamp(
        broker: Broker, topic_prefix: str) -> None:
    got: list[Delivery] = []
    sink = kafka_sink_factory(KafkaConfig(broker.bootstrap))(collect(got))
    sent = {
        10: Message(f"{topic_prefix}.orders", "aggregate-ä-🚀".encode(), b'{"n": 1}',
                    [("id", b"e-1"), ("event_type", b"Created"), ("aggregate_type", b"Order")],
                    1_700_000_000_123),
        11: Message(f"{topic_prefix}.orders", b"o-2", b'{"n": 2}', [("id", b"e-2")],
                    1_700_000_000_456),
        12: Message(f"{topic_prefix}.users", b"u-1", b"", [], 1_700_000_000_789),
    }
    try:
        sink.warm_up(10.0)
        for token, message in sent.items():
            sink.produce(message, token)
        serve_until(sink, lambda: len(got) == len(sent))
    finally:
        sink.close(5.0)

    assert sorted(got, key=lambda d: d.token) == [Delivery(10), Delivery(11), Delivery(12)]
    with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        received = {m.key: m for m in collector.collect(count=len(sent))}
    for message in sent.values():
        arrived = received[message.key]
        assert arrived.topic == message.topic
        assert arrived.value == message.value
        assert arrived.headers == dict(message.headers)
        assert arrived.timestamp == message.timestamp_ms


def test_message_without_timestamp_gets_the_produce_time(broker: Broker,
                                                         topic_prefix: str) -> None:
    got: list[Delivery] = []
    sink = kafka_sink_factory(KafkaConfig(broker.bootstrap))(collect(got))
    before_ms = int(time.time() * 1000)
    try:
        sink.produce(Message(f"{topic_prefix}.t", b"k", b"v"), 1)
        assert sink.flush(30.0) == 0
    finally:
        sink.close(5.0)
    with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        [arrived] = collector.collect(count=1)
    assert arrived.timestamp >= before_ms
    assert got == [Delivery(1)]


def test_set_handler_sends_the_later_reports_to_the_new_handler(broker: Broker,
                                                                topic_prefix: str) -> None:
    first: list[Delivery] = []
    second: list[Delivery] = []
    sink = kafka_sink_factory(KafkaConfig(broker.bootstrap))(collect(first))
    try:
        sink.produce(Message(f"{topic_prefix}.t", b"k", b"v"), 1)
        assert sink.flush(30.0) == 0
        sink.set_handler(collect(second))
        sink.produce(Message(f"{topic_prefix}.t", b"k", b"v"), 2)
        assert sink.flush(30.0) == 0
    finally:
        sink.close(5.0)
    assert first == [Delivery(1)] and second == [Delivery(2)]


def test_both_report_paths_hand_over_successes_and_failures_alike(
        broker: Broker, topic_prefix: str, compiled: bool) -> None:
    got: list[Delivery] = []
    later: list[Delivery] = []
    sink = KafkaSink(KafkaConfig(broker.bootstrap), collect(got))
    assert (type(sink._reports) is not Reports) is compiled
    try:
        sink.produce(Message(f"{topic_prefix}.t", b"k", b"v"), 1)
        sink.produce(Message("not a topic/name", b"k", b"v"), 2)  # fails at delivery
        serve_until(sink, lambda: len(got) == 2)
        sink.set_handler(collect(later))
        sink.produce(Message(f"{topic_prefix}.t", b"k", b"w"), 3)
        served = 0
        deadline = time.monotonic() + 30.0
        while not later and time.monotonic() < deadline:
            served += sink.poll(0.05)
    finally:
        sink.close(5.0)
    by_token = {delivery.token: delivery for delivery in got}
    assert by_token[1] == Delivery(1)
    failed = by_token[2].error
    assert failed is not None and failed.kind is ErrorKind.PERMANENT
    assert later == [Delivery(3)] and served == 1


def test_a_batch_handler_gets_each_polls_successes_before_it_returns(
        broker: Broker, topic_prefix: str, compiled: bool) -> None:
    got: list[Delivery] = []
    batches: list[list[int]] = []
    sink = KafkaSink(KafkaConfig(broker.bootstrap), ignore_reports)
    sink.set_handler(collect(got), batches.append)
    try:
        for token in range(20):
            sink.produce(Message(f"{topic_prefix}.t", b"k%d" % (token % 3), b"v"), token)
        served = 0
        deadline = time.monotonic() + 30.0
        while served < 20 and time.monotonic() < deadline:
            before = len(batches)
            count = sink.poll(0.05)
            served += count
            # what a poll served is handed over by the time it returns: one list, or none
            assert len(batches) - before == (1 if count else 0)
            assert sum(map(len, batches)) == served
        # An illegal topic fails at delivery, or at once when librdkafka already holds
        # metadata that says so (timing): either way it is no success of a batch.
        try:
            sink.produce(Message("not a topic/name", b"k", b"v"), 20)
            failures = [20]
        except ProduceRejected:
            failures = []
        sink.produce(Message(f"{topic_prefix}.t", b"k", b"w"), 21)
        assert sink.flush(30.0) == 0  # flush hands over too
        sink.set_handler(collect(got))  # back to one call per success
        sink.produce(Message(f"{topic_prefix}.t", b"k", b"x"), 22)
        assert sink.flush(30.0) == 0
    finally:
        sink.close(5.0)
    handed = [token for batch in batches for token in batch]
    assert sorted(handed) == [*range(20), 21] and len(handed) == 21
    assert [d.token for d in got] == [*failures, 22]
    assert all(d.error is not None and d.error.kind is ErrorKind.PERMANENT for d in got[:-1])
    assert got[-1] == Delivery(22)


def test_oversized_message_is_permanent(broker: Broker, topic_prefix: str) -> None:
    got: list[Delivery] = []
    sink = kafka_sink_factory(KafkaConfig(broker.bootstrap))(collect(got))
    huge = Message(f"{topic_prefix}.big", b"k", b"x" * 2_000_000)  # > message.max.bytes (1 MB)
    try:
        try:
            sink.produce(huge, 1)
        except ProduceRejected as exc:
            error = exc.error
        else:
            serve_until(sink, lambda: got)
            [delivery] = got
            assert delivery.error is not None
            error = delivery.error
        assert error.kind is ErrorKind.PERMANENT and error.cause is Cause.TOO_LARGE
        assert "TOO_LARGE" in error.reason
        assert sink.fatal_error is None
        sink.produce(Message(f"{topic_prefix}.big", b"k", b"small"), 2)  # the sink still works
        serve_until(sink, lambda: Delivery(2) in got)
    finally:
        sink.close(5.0)


def test_illegal_topic_fails_permanently_at_delivery(broker: Broker) -> None:
    got: list[Delivery] = []
    sink = kafka_sink_factory(KafkaConfig(broker.bootstrap))(collect(got))
    try:
        sink.produce(Message("not a topic/name", b"k", b"v"), 7)
        serve_until(sink, lambda: got)
    finally:
        sink.close(5.0)
    [delivery] = got
    assert delivery.token == 7
    assert delivery.error is not None and delivery.error.kind is ErrorKind.PERMANENT


def test_a_missing_topic_is_retriable_broker_trouble_not_the_events_fault(
    broker: Broker, topic_prefix: str
) -> None:
    got: list[Delivery] = []
    config = KafkaConfig(broker.bootstrap, {"allow.auto.create.topics": "false",
                                            "topic.metadata.propagation.max.ms": "300"})
    sink = kafka_sink_factory(config)(collect(got))
    missing = Message(f"{topic_prefix}.missing", b"k", b"v")
    try:
        sink.produce(missing, 1)
        serve_until(sink, lambda: got)
        [delivery] = got
        assert delivery.error is not None
        assert delivery.error.kind is ErrorKind.RETRIABLE
        assert delivery.error.cause is Cause.TOPIC_MISSING
        # Now known to be missing: produce() refuses at once, classified the same way.
        with pytest.raises(ProduceRejected) as caught:
            sink.produce(missing, 2)
        assert caught.value.error.kind is ErrorKind.RETRIABLE
        assert caught.value.error.cause is Cause.TOPIC_MISSING
        assert sink.fatal_error is None
    finally:
        sink.close(0)


def test_broker_restart_fails_fatally_and_a_fresh_sink_works(private_tansu: Broker,
                                                             topic_prefix: str) -> None:
    config = KafkaConfig(private_tansu.bootstrap, message_timeout_ms=5000)
    factory = kafka_sink_factory(config)
    got: list[Delivery] = []
    first = factory(collect(got))
    topic = f"{topic_prefix}.r"
    try:
        first.produce(Message(topic, b"k", b"before"), 1)
        serve_until(first, lambda: got)
        assert got == [Delivery(1)]

        private_tansu.restart()  # memory lost: topics and producer ids are gone
        for token in range(2, 6):
            first.produce(Message(topic, b"k", b"after"), token)
        serve_until(first, lambda: len(got) == 5 or first.fatal_error is not None)
    finally:
        first.close(0)

    failures = [d.error for d in got[1:]]
    assert all(e is not None and e.kind is ErrorKind.FATAL for e in failures)
    assert failures or first.fatal_error is not None

    second_got: list[Delivery] = []
    second = factory(collect(second_got))
    try:
        assert isinstance(second, KafkaSink) and second.generation == 2
        second.produce(Message(topic, b"k", b"again"), 9)
        serve_until(second, lambda: second_got)
    finally:
        second.close(5.0)
    assert second_got == [Delivery(9)]
    assert len(got) <= 5  # nothing of the first generation arrived after its close


def test_close_drops_undelivered_messages_without_reporting_them(private_broker: Broker,
                                                                 topic_prefix: str) -> None:
    got: list[Delivery] = []
    sink = kafka_sink_factory(KafkaConfig(private_broker.bootstrap))(collect(got))
    try:
        sink.produce(Message(f"{topic_prefix}.c", b"k", b"v"), 1)
        serve_until(sink, lambda: got)
        private_broker.pause()
        for token in range(2, 12):
            sink.produce(Message(f"{topic_prefix}.c", b"k", b"v"), token)
        sink.close(0.5)
    finally:
        private_broker.resume()
    assert got == [Delivery(1)]
    assert sink.pending() == 0 and sink.poll(0) == 0
    with pytest.raises(ProduceRejected) as caught:
        sink.produce(Message(f"{topic_prefix}.c", b"k", b"v"), 99)
    assert caught.value.error.kind is ErrorKind.FATAL


def test_check_brokers_passes_only_while_the_broker_answers(private_broker: Broker) -> None:
    config = KafkaConfig(private_broker.bootstrap)
    check_brokers(config, timeout=10.0)  # answers: no BrokerError
    private_broker.pause()  # the port stays open, nothing answers: the check must notice
    try:
        with pytest.raises(BrokerError) as caught:
            check_brokers(config, timeout=1.0)
    finally:
        private_broker.resume()
    assert private_broker.bootstrap in str(caught.value)
    check_brokers(config, timeout=10.0)  # and passes again once the broker answers


def test_check_brokers_on_a_closed_port_raises_a_one_line_broker_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(BrokerError) as caught:
        check_brokers(KafkaConfig(f"127.0.0.1:{port}"), timeout=1.0)
    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message and "--brokers" in message
    assert "\n" not in message


def test_warm_up_raises_a_broker_error_when_no_broker_answers() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sink = kafka_sink_factory(KafkaConfig(f"127.0.0.1:{port}"))(ignore_reports)
    try:
        with pytest.raises(BrokerError, match=f"127.0.0.1:{port}"):
            sink.warm_up(0.5)
    finally:
        sink.close(0)


_E = KafkaError


@pytest.mark.parametrize(
    ("error", "kind", "cause"),
    [
        (KafkaError(_E.MSG_SIZE_TOO_LARGE), ErrorKind.PERMANENT, Cause.TOO_LARGE),
        (KafkaError(_E.RECORD_LIST_TOO_LARGE), ErrorKind.PERMANENT, Cause.TOO_LARGE),
        (KafkaError(_E.TOPIC_EXCEPTION), ErrorKind.PERMANENT, Cause.UNSPECIFIED),
        (KafkaError(_E.INVALID_RECORD), ErrorKind.PERMANENT, Cause.UNSPECIFIED),
        # Broker trouble about the topic: retried, never dead-lettered.
        (KafkaError(_E._UNKNOWN_TOPIC), ErrorKind.RETRIABLE, Cause.TOPIC_MISSING),
        (KafkaError(_E.UNKNOWN_TOPIC_OR_PART, retriable=True), ErrorKind.RETRIABLE,
         Cause.TOPIC_MISSING),
        (KafkaError(_E._UNKNOWN_PARTITION), ErrorKind.RETRIABLE, Cause.TOPIC_MISSING),
        (KafkaError(_E.TOPIC_AUTHORIZATION_FAILED), ErrorKind.RETRIABLE, Cause.TOPIC_FORBIDDEN),
        (KafkaError(_E.UNKNOWN_PRODUCER_ID), ErrorKind.FATAL, Cause.UNSPECIFIED),
        (KafkaError(_E.OUT_OF_ORDER_SEQUENCE_NUMBER), ErrorKind.FATAL, Cause.UNSPECIFIED),
        (KafkaError(_E._MSG_TIMED_OUT, retriable=True), ErrorKind.FATAL, Cause.UNSPECIFIED),
        (KafkaError(_E._PURGE_INFLIGHT), ErrorKind.FATAL, Cause.UNSPECIFIED),
        (KafkaError(_E.MSG_SIZE_TOO_LARGE, fatal=True), ErrorKind.FATAL, Cause.UNSPECIFIED),
        (KafkaError(_E.NOT_ENOUGH_REPLICAS, retriable=True), ErrorKind.RETRIABLE,
         Cause.UNSPECIFIED),
        (KafkaError(_E.UNKNOWN), ErrorKind.FATAL, Cause.UNSPECIFIED),
    ],
)
def test_errors_are_classified_by_the_documented_table(error: KafkaError, kind: ErrorKind,
                                                       cause: Cause) -> None:
    assert classify(error).kind is kind
    assert classify(error).cause is cause
    assert classify(error).reason.startswith(error.name())


def test_user_settings_override_the_defaults_and_secrets_are_masked_in_logs() -> None:
    settings = producer_settings(KafkaConfig("b:9092", {"linger.ms": "0",
                                                        "sasl.password": "hunter2"}, 5000))
    assert settings["acks"] == "all" and settings["enable.idempotence"] == "true"
    assert settings["linger.ms"] == "0" and settings["message.timeout.ms"] == "5000"
    described = describe_settings(settings)
    assert "hunter2" not in described and "sasl.password=***" in described
