"""``run --exactly-once`` with ``--message-format avro``: the registry encodes before the
transactional produce; a registry outage in the middle of a PostgreSQL transaction aborts
the Kafka transaction and waits, and a ``read_committed`` consumer then sees every event
once (docs/messages.md, schema registry; docs/exactly-once.md)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from cdc_relay.local.apache_kafka import ApacheKafka
from cdc_relay.local.apicurio import ApicurioRegistry
from cdc_relay.outbox import emit
from tests.integration.eos_support import READ_COMMITTED, start_eos_relay
from tests.integration.test_schema_registry import AVRO, GOOD, registry_args
from tests.integration.wal_support import init_db
from tests.support import KafkaCollector, Msg, wait_for

pytestmark = pytest.mark.integration


def transaction(dsn: str, *events: tuple[str, str]) -> list[str]:
    """One PostgreSQL transaction of (aggregate id, event type) events; their ids."""
    with psycopg.connect(dsn) as conn:
        ids = [str(emit(conn, "order", aggregate_id, event_type, GOOD))
               for aggregate_id, event_type in events]
        conn.commit()
    return ids


def counted(messages: list[Msg]) -> Counter[str]:
    return Counter(m.headers["id"].decode() for m in messages if m.topic.endswith(".order"))


def test_a_registry_outage_under_exactly_once_waits_and_read_committed_sees_each_event_once(
        db: str, broker: ApacheKafka, private_schema_registry: ApicurioRegistry, topic_prefix: str,
        tmp_path: Path) -> None:
    registry = private_schema_registry
    init_db(db, plugin="pgoutput")
    (tmp_path / "OrderCreated.avsc").write_text(json.dumps(AVRO))
    (tmp_path / "OrderPaid.avsc").write_text(json.dumps(dict(AVRO, name="OrderPaid")))
    with start_eos_relay(db, broker.bootstrap, topic_prefix, plugin="pgoutput",
                         extra=registry_args(registry, "avro", str(tmp_path))) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix, config=READ_COMMITTED) as collector:
        before = transaction(db, ("o-1", "OrderCreated"), ("o-2", "OrderCreated"))
        collector.collect(until=lambda ms: set(before) <= set(counted(ms)), timeout=60)
        registry.stop()
        # OrderCreated's id is cached, OrderPaid needs the registry: the Kafka transaction
        # holding o-3 is aborted, and the whole PostgreSQL transaction waits.
        during = transaction(db, ("o-3", "OrderCreated"), ("o-4", "OrderPaid"),
                             ("o-5", "OrderCreated"))
        wait_for(lambda: "unreachable" in relay.stderr, timeout=60, message="the registry line")
        assert not set(during) & set(counted(collector.collect(timeout=1.0)))
        registry.start()
        after = transaction(db, ("o-6", "OrderCreated"))
        expected = set(before + during + after)
        collector.collect(until=lambda ms: expected <= set(counted(ms)), timeout=120)
        messages = collector.collect(timeout=1.0)  # late duplicates would show up here
        assert relay.stop() == 0, relay.stderr
    counts = counted(messages)
    assert set(counts) == expected
    assert {i: n for i, n in counts.items() if n > 1} == {}  # nothing twice
    assert "unreachable" in relay.stderr and "new producer, resuming from the slot" in relay.stderr
    events = [m for m in messages if m.topic.endswith(".order")]  # not the checkpoints
    assert [m.headers["id"].decode() for m in events] == before + during + after  # in order
    paid = events[len(before) + 1]
    reader = AvroDeserializer(SchemaRegistryClient({"url": registry.ccompat_url}))
    assert paid.value is not None and paid.value[0] == 0
    assert reader(paid.value, SerializationContext(paid.topic, MessageField.VALUE)) == GOOD
