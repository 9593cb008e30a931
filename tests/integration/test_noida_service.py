"""The noida-db broker has the transaction semantics the exactly-once tests rely on."""

from __future__ import annotations

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec  # type: ignore[attr-defined]

from cdc_relay.local.noida import NoidaBroker
from tests.support import KafkaCollector


def _txn_producer(bootstrap: str, txn_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
    producer.init_transactions(10)
    return producer


def test_read_committed_hides_aborted_and_open_transactions(noida: NoidaBroker,
                                                            topic_prefix: str) -> None:
    topic = f"{topic_prefix}.t"
    producer = _txn_producer(noida.bootstrap, f"{topic_prefix}-p")
    producer.begin_transaction()
    producer.produce(topic, b"committed")
    producer.commit_transaction(10)
    producer.begin_transaction()
    producer.produce(topic, b"aborted")
    producer.flush(10)
    producer.abort_transaction(10)
    producer.begin_transaction()
    producer.produce(topic, b"after")
    producer.commit_transaction(10)
    with KafkaCollector(noida.bootstrap, topic_prefix,
                        config={"isolation.level": "read_committed"}) as collector:
        values = [m.value for m in collector.collect(until=lambda ms: len(ms) >= 2, timeout=20)]
    assert values == [b"committed", b"after"]


def test_a_second_init_transactions_fences_the_first_producer(noida: NoidaBroker,
                                                              topic_prefix: str) -> None:
    topic = f"{topic_prefix}.t"
    first = _txn_producer(noida.bootstrap, f"{topic_prefix}-p")
    first.begin_transaction()
    first.produce(topic, b"zombie")
    first.flush(10)
    _txn_producer(noida.bootstrap, f"{topic_prefix}-p")
    try:
        first.commit_transaction(10)
    except KafkaException as exc:
        assert exc.args[0].fatal()
    else:
        raise AssertionError("the fenced producer committed")


def test_restart_keeps_the_port_and_the_topics(private_noida: NoidaBroker, topic_prefix: str) -> None:
    port = private_noida.port
    producer = _txn_producer(private_noida.bootstrap, f"{topic_prefix}-p")
    producer.begin_transaction()
    producer.produce(f"{topic_prefix}.t", b"kept")
    producer.commit_transaction(10)
    private_noida.restart()
    assert private_noida.port == port
    with KafkaCollector(private_noida.bootstrap, topic_prefix,
                        config={"isolation.level": "read_committed"}) as collector:
        values = [m.value for m in collector.collect(until=lambda ms: len(ms) >= 1, timeout=20)]
    assert values == [b"kept"]


def _read_to_end(bootstrap: str, topic: str, start: int, isolation: str) -> tuple[list[bytes], int]:
    """Values a fresh consumer of ``isolation`` reads from ``start`` to the partition's end,
    and the offset it ends at."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-{isolation}",
                         "isolation.level": isolation, "enable.partition.eof": True,
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, start)])
        values: list[bytes] = []
        while True:
            message = consumer.poll(10)
            assert message is not None, "no end of partition within 10 s"
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                return values, consumer.position([TopicPartition(topic, 0)])[0].offset
            assert error is None, error
            values.append(message.value() or b"")
    finally:
        consumer.close()


def test_gap_a_read_committed_fetch_after_an_abort_drops_the_same_producers_commits(
        noida: NoidaBroker, topic_prefix: str) -> None:
    """noida-db's gap behind issue 32 (docs/exactly-once.md, "Testing on noida-db").

    A Fetch from an offset past an aborted transaction's abort marker still lists that
    transaction among the aborted ones (Kafka lists only those whose marker is at or past
    the fetch offset); librdkafka then takes every later batch of the same producer id -
    a committing successor with the same transactional.id has it too - for part of it
    and skips it. The broker's own answers are right: the last stable offset is past the
    commit, and a read_uncommitted consumer gets it.
    """
    topic = f"{topic_prefix}.t"
    admin = AdminClient({"bootstrap.servers": noida.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    producer = _txn_producer(noida.bootstrap, f"{topic_prefix}-p")
    producer.begin_transaction()
    producer.produce(topic, b"aborted")
    producer.flush(10)
    producer.abort_transaction(10)  # offsets 0 and its abort marker 1
    producer.begin_transaction()
    producer.produce(topic, b"committed")
    producer.commit_transaction(10)  # offsets 2 and its commit marker 3
    partition = TopicPartition(topic, 0)
    stable = admin.list_offsets({partition: OffsetSpec.latest()},
                                isolation_level=IsolationLevel.READ_COMMITTED)[partition].result(10)
    assert stable.offset == 4  # the broker says: committed, visible to read_committed
    assert _read_to_end(noida.bootstrap, topic, 2, "read_uncommitted")[0] == [b"committed"]
    assert _read_to_end(noida.bootstrap, topic, 0, "read_committed")[0] == [b"committed"]
    # The gap: from offset 2 a read_committed consumer passes the commit without it.
    assert _read_to_end(noida.bootstrap, topic, 2, "read_committed") == ([], 4)
