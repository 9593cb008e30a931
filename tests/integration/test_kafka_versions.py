"""The Kafka versions the relay is tested against: 3.9 (what most managed Kafka runs) for a
smoke subset - publish, exactly-once, a broker restart - and which transaction protocol
librdkafka speaks to Kafka 4 (the whole suite runs on 4.1, the ``broker`` fixture)."""

from __future__ import annotations

import logging
import re

from confluent_kafka import Producer

from cdc_relay.local.apache_kafka import KAFKA_3_9, ApacheKafka
from tests.integration.eos_support import (
    READ_COMMITTED,
    assert_exactly_once,
    collect_exactly,
    start_eos_relay,
)
from tests.integration.wal_support import (
    Expected,
    assert_contract,
    collect_ids,
    init_db,
    start_relay,
    write_workload,
)
from tests.support import KafkaCollector

_SENT = re.compile(r"Sent (\w+)Request \(v(\d+)")


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _request_versions(bootstrap: str, topic: str) -> dict[str, set[int]]:
    """The request versions a transactional producer sends for one committed transaction."""
    handler = _Lines()
    logger = logging.getLogger(f"librdkafka-{topic}")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": topic,
                         "debug": "protocol", "logger": logger})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"x")
    producer.commit_transaction(30)
    producer.poll(0)
    versions: dict[str, set[int]] = {}
    for line in handler.lines:
        if found := _SENT.search(line):
            versions.setdefault(found[1], set()).add(int(found[2]))
    return versions


def test_librdkafka_speaks_the_first_transaction_protocol_to_kafka_4(broker: ApacheKafka,
                                                                      topic_prefix: str) -> None:
    """Kafka 4.x enables transactions v2 (KIP-890: Produce v12+ and EndTxn v5+, partitions
    added implicitly) for new clusters, but serves each client the version it speaks. The
    relay's exactly-once proof ran on what librdkafka speaks today, v1; when a librdkafka
    upgrade changes that, this fails: re-run the kill test and update docs/exactly-once.md."""
    versions = _request_versions(broker.bootstrap, f"{topic_prefix}.tv")
    assert versions.get("AddPartitionsToTxn"), versions  # v1 adds each partition explicitly
    assert max(versions["EndTxn"]) < 5, versions
    assert max(versions["Produce"]) < 12, versions


def test_run_publishes_on_kafka_3_9(db: str, kafka_3_9: ApacheKafka, topic_prefix: str) -> None:
    init_db(db, plugin="pgoutput")
    with start_relay(db, kafka_3_9.bootstrap, topic_prefix, plugin="pgoutput") as relay:
        expected = write_workload(db, transactions=10, seed=39)
        with KafkaCollector(kafka_3_9.bootstrap, topic_prefix) as collector:
            messages = collect_ids(collector, topic_prefix, expected.ids)
        assert relay.stop() == 0, relay.stderr
    assert_contract(messages, expected, topic_prefix)


def test_exactly_once_on_kafka_3_9(db: str, kafka_3_9: ApacheKafka, topic_prefix: str) -> None:
    init_db(db)
    with start_eos_relay(db, kafka_3_9.bootstrap, topic_prefix) as relay:
        expected = write_workload(db, transactions=15, seed=40, rollback_every=4)
        with KafkaCollector(kafka_3_9.bootstrap, topic_prefix, config=READ_COMMITTED) as collector:
            messages = collect_exactly(collector, expected)
        assert relay.stop() == 0, relay.stderr
    assert expected.rolled_back
    assert_exactly_once(messages, expected)


def test_a_kafka_3_9_restart_is_waited_out_and_nothing_is_lost(db: str, topic_prefix: str) -> None:
    init_db(db)
    expected = Expected()
    with ApacheKafka(KAFKA_3_9) as kafka, start_relay(
            db, kafka.bootstrap, topic_prefix, extra=("--message-timeout", "5s")) as relay:
        write_workload(db, transactions=5, seed=41, expected=expected)
        with KafkaCollector(kafka.bootstrap, topic_prefix) as collector:
            collect_ids(collector, topic_prefix, expected.ids)
        kafka.stop()
        write_workload(db, transactions=10, seed=42, expected=expected)  # while it is down
        kafka.start()
        with KafkaCollector(kafka.bootstrap, topic_prefix) as collector:
            messages = collect_ids(collector, topic_prefix, expected.ids, timeout=120)
        assert relay.running(), relay.stderr
        assert relay.stop() == 0, relay.stderr
    assert_contract(messages, expected, topic_prefix)
