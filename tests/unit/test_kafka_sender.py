"""KafkaSink.produce both ways (sink/kafka/sink.py, and sink/kafka/_creports.c's ``Sender``; docs/design.md,
"The compiled delivery report"): the same arguments reach the producer, the same errors
come out.

The producer's ``produce`` is replaced by a recorder here, so these are unit tests of what
the sink passes and raises; tests/integration/test_kafka_sink.py sends through a real
broker on both paths. They fail, not skip, when the extension is not built.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from cdc_relay.config import KafkaConfig
from cdc_relay.model import Message
from cdc_relay.sink.base import Cause, DeliveryError, ErrorKind, ProduceRejected, QueueFull
from cdc_relay.sink.kafka import _creports
from cdc_relay.sink.kafka.sink import KafkaSink

MESSAGES = [
    Message("orders", b"o-1", b'{"n": 1}', [("id", b"e-1"), ("event_type", b"Created")],
            1_700_000_000_123),
    Message("orders", b"o-2", b"", [], None),  # no timestamp: 0, the producer's clock
    Message("orders", b"o-3", b"v", [("id", b"e-3")], 0, 2),  # an explicit partition
]


@dataclass(slots=True)
class Other:  # not a Message: the compiled sender hands it to the Python produce
    topic: str
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    timestamp_ms: int | None = None
    partition: int | None = None


class Recorder:
    def __init__(self, raises: BaseException | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.raises = raises

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        assert not kwargs, "produce must get positional arguments only"
        self.calls.append(args)
        if self.raises is not None:
            raise self.raises


@pytest.fixture
def sink(compiled: bool) -> Iterator[KafkaSink]:
    # No broker is needed: librdkafka connects only when it has something to send.
    made = KafkaSink(KafkaConfig("127.0.0.1:1"), lambda token, error: None)
    assert (made._sender is not None) is compiled
    yield made
    made._producer = None  # nothing was really produced: skip the flush


def record(sink: KafkaSink, raises: BaseException | None = None) -> Recorder:
    recorder = Recorder(raises)
    sink._produce = recorder
    if sink._sender is not None:
        sink._sender.produce = recorder
    return recorder


def test_the_compiled_sender_is_what_produce_is_by_default() -> None:
    sink = KafkaSink(KafkaConfig("127.0.0.1:1"), lambda token, error: None)
    assert isinstance(sink._sender, _creports.Sender)
    assert sink.produce == sink._sender.send
    sink._producer = None


@pytest.mark.parametrize("message", [*MESSAGES, Other("t", b"k", b"v", [("a", b"b")], 5, 1)],
                         ids=["full", "no-timestamp", "partition", "not-a-message"])
def test_produce_passes_the_message_positionally_with_the_tokens_callback(
        sink: KafkaSink, message: Message) -> None:
    recorder = record(sink)
    batch: list[list[int]] = []
    sink.set_handler(lambda token, error: None, batch.append)
    sink.produce(message, 41)
    [args] = recorder.calls
    partition = -1 if message.partition is None else message.partition
    assert args[:4] == (message.topic, message.value, message.key, partition)
    assert args[5:] == (None, message.timestamp_ms or 0, message.headers)
    args[4](None, "the message")  # the callback carries the token
    sink._reports.hand_over()
    assert batch == [[41]]


def kafka_exception(code: int) -> KafkaException:
    return KafkaException(KafkaError(code, "fake"))


@pytest.mark.parametrize(("raised", "expected"), [
    (BufferError("queue full"), QueueFull),
    (kafka_exception(KafkaError._QUEUE_FULL), QueueFull),
    (kafka_exception(KafkaError.MSG_SIZE_TOO_LARGE), ProduceRejected),
    (KafkaException("not a KafkaError"), ProduceRejected),
    (TypeError("a bug"), TypeError),
], ids=["buffer-error", "queue-full", "too-large", "odd-kafka-exception", "other"])
def test_what_produce_raises_becomes_the_sinks_error(
        sink: KafkaSink, raised: BaseException, expected: type[Exception]) -> None:
    record(sink, raised)
    with pytest.raises(expected) as caught:
        sink.produce(MESSAGES[0], 1)
    if expected is ProduceRejected:
        assert isinstance(caught.value, ProduceRejected)
        error = caught.value.error
        assert error.kind in (ErrorKind.PERMANENT, ErrorKind.FATAL)


def test_a_fatal_produce_error_marks_the_sink_fatal(sink: KafkaSink) -> None:
    record(sink, kafka_exception(KafkaError._FATAL))
    with pytest.raises(ProduceRejected):
        sink.produce(MESSAGES[0], 1)
    assert isinstance(sink.fatal_error, DeliveryError)
    assert sink.fatal_error.kind is ErrorKind.FATAL


def test_after_close_produce_is_rejected_as_fatal(sink: KafkaSink) -> None:
    sink.close(0)
    with pytest.raises(ProduceRejected, match="closed") as caught:
        sink.produce(MESSAGES[0], 1)
    assert caught.value.error.kind is ErrorKind.FATAL


@dataclass(slots=True)
class Reordered:
    key: bytes
    topic: str


def test_the_compiled_sender_refuses_a_class_that_is_not_messages_shape() -> None:
    reports = _creports.Reports(lambda token, error: None, lambda *args: None)
    with pytest.raises(TypeError, match=r"_creports\.c"):
        _creports.Sender(Recorder(), reports, Reordered, Recorder(), Recorder())


def test_a_missing_or_forbidden_kafka_topic_carries_kafkas_fix_in_its_reason() -> None:
    from cdc_relay.sink.kafka.client import classify

    for code, cause in ((KafkaError.UNKNOWN_TOPIC_OR_PART, Cause.TOPIC_MISSING),
                        (KafkaError.TOPIC_AUTHORIZATION_FAILED, Cause.TOPIC_FORBIDDEN)):
        error = classify(KafkaError(code, "fake"))
        assert (error.kind, error.cause) == (ErrorKind.RETRIABLE, cause)
        assert error.reason.endswith("create the topic or grant the producer access")


class FailingFlush:
    """A producer whose flush fails as confluent-kafka's does when librdkafka raised a
    fatal error inside the call and the exception was lost."""

    def flush(self, timeout: float) -> int:
        raise SystemError("<method 'flush' of 'cimpl.Producer' objects> returned NULL without "
                          "setting an exception")

    def poll(self, timeout: float) -> int:
        return 0

    def __len__(self) -> int:
        return 1


def test_a_bare_system_error_after_a_logged_cluster_refusal_is_access_refused(
        sink: KafkaSink) -> None:
    from cdc_relay.errors import AccessRefused

    real = sink._producer
    sink._librdkafka_log.log(2, "%s [%s] %s", "FATAL", "cdc-relay#producer-1",
                             "[thrd:main]: Fatal error: Broker: Cluster authorization failed: "
                             "Failed to acquire idempotence PID")
    sink._producer = FailingFlush()  # type: ignore[assignment]
    try:
        with pytest.raises(AccessRefused, match="refused the relay's idempotent producer"):
            sink.flush(1.0)
    finally:
        sink._producer = real


def test_a_bare_system_error_after_another_logged_fatal_error_is_the_sinks_fatal_error(
        sink: KafkaSink) -> None:
    real = sink._producer
    sink._librdkafka_log.log(2, "%s [%s] %s", "FATAL", "cdc-relay#producer-1",
                             "[thrd:main]: Fatal error: Broker: Producer fenced")
    sink._producer = FailingFlush()  # type: ignore[assignment]
    try:
        assert sink.flush(1.0) == 1
    finally:
        sink._producer = real
    assert sink.fatal_error is not None and "Producer fenced" in sink.fatal_error.reason
