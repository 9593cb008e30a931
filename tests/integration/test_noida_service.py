"""The noida-db broker has the transaction semantics the exactly-once tests rely on."""

from __future__ import annotations

from confluent_kafka import KafkaException, Producer

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
