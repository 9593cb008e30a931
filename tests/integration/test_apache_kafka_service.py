"""The real Apache Kafka broker (cdc_relay.local.apache_kafka), 4.1 and 3.9: idempotent and
transactional producers, ``read_committed``, consumer groups, restart and kill.

One broker per version for the whole module; the restart and kill tests run on it too
(its ports and data survive both), each test on topics of its own (``topic_prefix``).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from cdc_relay.local.apache_kafka import KAFKA_3_9, KAFKA_4_1, ApacheKafka, cache_root, has_jars, jar_dir
from tests.support import KafkaCollector, skip_or_fail_in_ci, wait_for


@pytest.fixture(scope="module", params=[KAFKA_4_1, KAFKA_3_9])
def kafka(request: pytest.FixtureRequest) -> Iterator[ApacheKafka]:
    """An Apache Kafka broker of the parametrised version, shared by this module's tests."""
    version = str(request.param)
    if shutil.which("java") is None:
        skip_or_fail_in_ci("Apache Kafka needs Java 17+ (apt-get install openjdk-17-jre-headless)")
    if not has_jars(jar_dir(version, cache_root()), version) and shutil.which("mvn") is None:
        skip_or_fail_in_ci("Apache Kafka's jars are not cached and Maven is missing: "
                           "python -m cdc_relay.local.apache_kafka fetch")
    broker = ApacheKafka(version)
    try:
        broker.start()
        yield broker
    finally:
        broker.cleanup()


def _produce(bootstrap: str, topic: str, values: list[bytes], **config: object) -> None:
    """Produce ``values`` with an idempotent ``acks=all`` producer; every one must be acked."""
    failures: list[KafkaError] = []

    def report(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            failures.append(error)

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, **config})
    for value in values:
        producer.produce(topic, value, on_delivery=report)
    assert producer.flush(30) == 0
    assert failures == []


def _read_to_end(bootstrap: str, topic: str, isolation: str = "read_uncommitted") -> list[bytes]:
    """Every value a fresh ``isolation`` consumer reads from partition 0's start to its end."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-{isolation}",
                         "isolation.level": isolation, "enable.partition.eof": True,
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        values: list[bytes] = []
        while True:
            message = consumer.poll(10)
            assert message is not None, "no end of partition within 10 s"
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                return values
            assert error is None, error
            values.append(message.value() or b"")
    finally:
        consumer.close()


def _txn_producer(bootstrap: str, transactional_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    producer.init_transactions(30)
    return producer


def test_an_idempotent_producer_round_trips_through_a_consumer_group(kafka: ApacheKafka,
                                                                      topic_prefix: str) -> None:
    topic = f"{topic_prefix}.t"
    values = [f"m{i}".encode() for i in range(200)]
    _produce(kafka.bootstrap, topic, values)
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"{topic_prefix}-g",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        seen: list[bytes] = []

        def read_all() -> bool:
            seen.extend(m.value() or b"" for m in consumer.consume(500, 0.5) if m.error() is None)
            return len(seen) >= len(values)

        wait_for(read_all, timeout=30, interval=0, message="the group consumer reads every message")
        consumer.commit(asynchronous=False)
        committed = consumer.committed([TopicPartition(topic, 0)], timeout=10)
    finally:
        consumer.close()
    assert seen == values
    assert committed[0].offset == len(values)


def test_read_committed_sees_committed_transactions_only(kafka: ApacheKafka, topic_prefix: str) -> None:
    topic = f"{topic_prefix}.t"
    producer = _txn_producer(kafka.bootstrap, f"{topic_prefix}-p")
    for value, commit in ((b"committed", True), (b"aborted", False), (b"after", True)):
        producer.begin_transaction()
        producer.produce(topic, value)
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    assert _read_to_end(kafka.bootstrap, topic, "read_committed") == [b"committed", b"after"]
    assert _read_to_end(kafka.bootstrap, topic) == [b"committed", b"aborted", b"after"]


def test_a_second_init_transactions_fences_the_first_producer(kafka: ApacheKafka, topic_prefix: str) -> None:
    first = _txn_producer(kafka.bootstrap, f"{topic_prefix}-p")
    first.begin_transaction()
    first.produce(f"{topic_prefix}.t", b"zombie")
    first.flush(30)
    _txn_producer(kafka.bootstrap, f"{topic_prefix}-p")
    with pytest.raises(KafkaException) as raised:
        first.commit_transaction(30)
    assert raised.value.args[0].fatal() or raised.value.args[0].txn_requires_abort()
    assert _read_to_end(kafka.bootstrap, f"{topic_prefix}.t", "read_committed") == []


def test_restart_keeps_the_ports_and_the_messages(kafka: ApacheKafka, topic_prefix: str) -> None:
    topic = f"{topic_prefix}.t"
    _produce(kafka.bootstrap, topic, [b"one", b"two"])
    ports, pid = (kafka.port, kafka.controller_port), kafka.pid
    kafka.restart()
    assert (kafka.port, kafka.controller_port) == ports
    assert kafka.pid != pid
    with KafkaCollector(kafka.bootstrap, topic) as collector:
        assert [m.value for m in collector.collect(count=2)] == [b"one", b"two"]


def test_kill_then_start_keeps_acked_messages_and_serves_again(kafka: ApacheKafka,
                                                              topic_prefix: str) -> None:
    topic = f"{topic_prefix}.t"
    _produce(kafka.bootstrap, topic, [b"before"])
    port = kafka.port
    kafka.kill()
    assert kafka.pid is None
    kafka.start()
    assert kafka.port == port
    _produce(kafka.bootstrap, topic, [b"after"])
    assert _read_to_end(kafka.bootstrap, topic) == [b"before", b"after"]
