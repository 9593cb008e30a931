"""Reading the dead-letter topic back, and producing its records again (``dead-letters``).

``read_dead_letters`` assigns every partition of the topic from the beginning (nothing is
committed, nothing removed) and reads until each partition reported its end and nothing
more came for a short while - end-of-partition alone is not trusted, some brokers report
it early. confluent-kafka insists on a ``group.id``, and librdkafka looks that group's
coordinator up even for an assigned consumer: so the reader needs READ on the topic and
DESCRIBE on GROUP ``cdc-relay-dead-letters`` (never READ on it: it joins and commits
nothing). A refused login or a missing ACL is AccessRefused (exit 6) naming the grant.
``produce_again`` sends rebuilt messages with the relay's own producer (``KafkaSink``:
``acks=all``, idempotent) and waits for every report; a topic it may not write to is that
message's failure (one line each, exit 1), no WRITE on any topic at all a refused
idempotent producer (exit 6, naming the topics).

What a record means and which ones to send is ops/dead_letters.py. Must not decide
anything about records, and must not commit offsets or delete anything.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from cdc_relay.config import KafkaConfig
from cdc_relay.errors import AccessRefused, BrokerError, ConfigError, mask_secrets
from cdc_relay.model import Message, TopicDeadLetter
from cdc_relay.sink.base import Cause, DeliveryError, ErrorKind, ProduceRejected, QueueFull
from cdc_relay.sink.kafka.client import (
    ACL_DOC,
    REFUSAL_CODES,
    TOPIC_FIX,
    describe_error,
    exception_text,
    masking_logger,
    producer_settings,
    refusal_text,
    topic_problem,
)
from cdc_relay.sink.kafka.sink import KafkaSink

_log = logging.getLogger("cdc_relay.dead_letters")

# Producer-only librdkafka properties: the consumer would warn about each one.
_PRODUCER_ONLY = ("acks", "enable.idempotence", "linger.ms", "queue.buffering.", "compression.",
                  "message.timeout.ms", "batch.", "retries", "partitioner", "transactional.",
                  "delivery.timeout.ms", "max.in.flight", "request.required.acks")
QUIET = 0.5  # seconds without a record after every partition reported its end
GROUP = "cdc-relay-dead-letters"


class _Refusals:
    """The consumer's ``error_cb``: keeps the first refused login or cluster ACL."""

    def __init__(self) -> None:
        self.first: tuple[int, str] | None = None

    def __call__(self, error: KafkaError) -> None:
        if self.first is None and error.code() in REFUSAL_CODES:
            self.first = (error.code(), describe_error(error))


def _refused(error: KafkaError, topic: str) -> AccessRefused | None:
    """A missing READ on the topic or DESCRIBE on the group, in words with the grant."""
    if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return AccessRefused(f"not authorized to read the dead-letter topic {topic}: grant READ "
                             f"on TOPIC {topic} to the relay's user ({ACL_DOC}) "
                             f"[{describe_error(error)}]")
    if error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
        return AccessRefused(f"not authorized to use the consumer group {GROUP} (the dead-letter "
                             f"reader looks it up; it commits nothing): grant DESCRIBE on GROUP "
                             f"{GROUP} to the relay's user ({ACL_DOC}) [{describe_error(error)}]")
    return None


def _consumer(config: KafkaConfig, refusals: _Refusals) -> Consumer:
    settings: dict[str, Any] = {key: value for key, value in producer_settings(config).items()
                                if not key.startswith(_PRODUCER_ONLY)}
    settings.update({"group.id": GROUP, "enable.auto.commit": False, "error_cb": refusals,
                     "enable.partition.eof": True, "fetch.wait.max.ms": 50,
                     "client.id": "cdc-relay-dead-letters",
                     # librdkafka's own lines at debug only: the one error line says it all.
                     "logger": masking_logger(_log, demote=True)})
    try:
        return Consumer(settings)
    except KafkaException as exc:
        raise ConfigError(f"invalid client configuration: {exception_text(exc)} "
                          "(check --producer-config)") from exc


def _partitions(consumer: Consumer, config: KafkaConfig, topic: str, timeout: float,
                refusals: _Refusals) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:  # in slices: a refused login is told when librdkafka reports it
        try:
            metadata = consumer.list_topics(
                topic, timeout=max(0.001, min(1.0, deadline - time.monotonic())))
            break
        except KafkaException as exc:
            consumer.poll(0)  # serves error_cb
            if refusals.first is not None:
                raise AccessRefused(refusal_text(config.brokers, *refusals.first)) from exc
            if time.monotonic() >= deadline:
                raise BrokerError(f"cannot reach Kafka at {mask_secrets(config.brokers)}: "
                                  f"{exception_text(exc)} (check --brokers and the security "
                                  "settings)") from exc
    found = metadata.topics.get(topic)
    if found is not None and found.error is not None:
        refused = _refused(found.error, topic)
        if refused is not None:
            raise refused
    if found is None or found.error is not None or not found.partitions:
        raise ConfigError(f"topic {topic!r} does not exist on {mask_secrets(config.brokers)}: "
                          "pass the relay's --dead-letter-topic as --from-topic")
    return sorted(found.partitions)


def read_dead_letters(config: KafkaConfig, topic: str, *, timeout: float = 60.0) -> list[TopicDeadLetter]:
    """Every record of ``topic``, partition by partition in offset order."""
    refusals = _Refusals()
    consumer = _consumer(config, refusals)
    try:
        partitions = _partitions(consumer, config, topic, min(timeout, 10.0), refusals)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        records: list[TopicDeadLetter] = []
        at_end: set[int] = set()
        last_news = time.monotonic()
        deadline = last_news + timeout
        while not (len(at_end) == len(partitions) and time.monotonic() - last_news >= QUIET):
            if time.monotonic() > deadline:
                raise BrokerError(f"reading {topic!r} did not reach its end within {timeout:g} s")
            message = consumer.poll(0.1)
            if message is None:
                continue
            error = message.error()
            partition = message.partition() or 0
            last_news = time.monotonic()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(partition)
                    continue
                raise _refused(error, topic) or BrokerError(f"reading {topic!r}: {mask_secrets(error.str())}")
            at_end.discard(partition)
            _ts_type, ts = message.timestamp()
            records.append(TopicDeadLetter(
                partition, message.offset() or 0, message.key(), message.value(),
                _headers(message.headers()),
                ts if ts and ts > 0 else None))
    finally:
        consumer.close()
    records.sort(key=lambda r: (r.partition, r.offset))
    return records


def _headers(raw: Any) -> tuple[tuple[str, bytes], ...]:
    """confluent-kafka's headers (a list of pairs; values bytes, str or None) as bytes."""
    pairs = raw.items() if isinstance(raw, dict) else (raw or [])
    return tuple((str(k), v if isinstance(v, bytes) else (v or "").encode()) for k, v in pairs)


def produce_again(config: KafkaConfig, messages: Sequence[Message], *,
                  timeout: float = 60.0) -> list[DeliveryError | None]:
    """Send each message; per message None (acknowledged) or why it failed."""
    unreported = DeliveryError(ErrorKind.RETRIABLE, "no delivery report")
    results: list[DeliveryError | None] = [unreported] * len(messages)

    def on_delivery(token: int, error: DeliveryError | None) -> None:
        results[token] = error

    sink = KafkaSink(config, on_delivery, logger=_log)
    try:
        _send_all(sink, messages, results, timeout)
    except AccessRefused as exc:
        if sink.refusal_code != KafkaError.CLUSTER_AUTHORIZATION_FAILED:
            raise
        topics = " and ".join(f"TOPIC {t}" for t in sorted({m.topic for m in messages}))
        raise AccessRefused(f"{exc}; this replay writes to {topics}") from exc
    finally:
        sink.close(0)
    return results


def _naming_topic(error: DeliveryError, topic: str) -> DeliveryError:
    """A topic refusal raised by ``produce`` itself (librdkafka's cached metadata; the
    compiled sender does not pass the message along) named with its topic and grant, as
    a delivery report's is."""
    if error.cause not in (Cause.TOPIC_FORBIDDEN, Cause.TOPIC_MISSING):
        return error
    reason = error.reason.removesuffix(f": {TOPIC_FIX}")
    return DeliveryError(error.kind, topic_problem(error.cause, topic, reason), error.cause)


def _send_all(sink: KafkaSink, messages: Sequence[Message], results: list[DeliveryError | None],
              timeout: float) -> None:
    sink.warm_up(min(timeout, 10.0))
    for token, message in enumerate(messages):
        while True:
            try:
                sink.produce(message, token)
                break
            except QueueFull:
                sink.poll(0.1)
            except ProduceRejected as exc:
                results[token] = _naming_topic(exc.error, message.topic)
                break
    sink.flush(timeout)
