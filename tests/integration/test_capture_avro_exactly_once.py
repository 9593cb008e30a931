"""Captured tables as Avro under ``--exactly-once``: the registry encodes each change before
the transactional produce, a rolled-back PostgreSQL transaction never reaches a
``read_committed`` consumer, and a registry outage in the middle of a transaction waits
and then delivers every change once (docs/table-cdc.md, exactly once; docs/messages.md)."""

from __future__ import annotations

from collections import Counter

import psycopg
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from cdc_relay.local.apache_kafka import ApacheKafka
from cdc_relay.local.apicurio import ApicurioRegistry
from tests.integration.eos_support import READ_COMMITTED, start_eos_relay
from tests.integration.wal_support import init_db
from tests.support import KafkaCollector, Msg, wait_for

pytestmark = pytest.mark.integration


def _changes(messages: list[Msg], topic: str, reader: AvroDeserializer) -> list[tuple[str, int]]:
    """(op, id) of each change event on the table's topic, tombstones apart, in order."""
    out = []
    for m in messages:
        if m.topic == topic and m.value is not None:
            value = reader(m.value, SerializationContext(m.topic, MessageField.VALUE))
            row = value["after"] or value["before"]
            out.append((value["op"], row["id"]))
    return out


def test_captured_avro_changes_arrive_once_across_a_rollback_and_a_registry_outage(
        db: str, broker: ApacheKafka, private_schema_registry: ApicurioRegistry,
        topic_prefix: str) -> None:
    registry = private_schema_registry
    init_db(db, plugin="pgoutput")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, label text NOT NULL)")
        conn.execute("CREATE TABLE others (id int PRIMARY KEY)")
    topic = f"{topic_prefix}.public.items"
    reader = AvroDeserializer(SchemaRegistryClient({"url": registry.ccompat_url}))
    extra = ("--capture", "public.items,public.others", "--capture-prefix", topic_prefix, "--no-outbox",
             "--message-format", "avro", "--schema-registry", registry.ccompat_url)
    with start_eos_relay(db, broker.bootstrap, topic_prefix, plugin="pgoutput",
                         extra=extra) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix, config=READ_COMMITTED) as collector:
        with psycopg.connect(db) as conn:
            conn.execute("INSERT INTO items VALUES (1, 'a'), (2, 'b')")
            conn.commit()
            conn.execute("INSERT INTO items VALUES (3, 'rolled back')")
            conn.rollback()
        collector.collect(until=lambda ms: len(_changes(ms, topic, reader)) >= 2, timeout=60)
        registry.stop()
        # items' schemas are cached; others' first change needs the registry: the Kafka
        # transaction holding items' update is aborted and the PostgreSQL transaction waits.
        with psycopg.connect(db) as conn:
            conn.execute("UPDATE items SET label = 'b2' WHERE id = 2")
            conn.execute("INSERT INTO others VALUES (1)")
            conn.execute("DELETE FROM items WHERE id = 1")
            conn.commit()
        wait_for(lambda: "unreachable" in relay.stderr, timeout=60, message="the registry line")
        registry.start()
        with psycopg.connect(db) as conn:
            conn.execute("INSERT INTO items VALUES (4, 'd')")
            conn.commit()
        collector.collect(until=lambda ms: ("c", 4) in _changes(ms, topic, reader), timeout=120)
        messages = collector.collect(timeout=1.0)  # late duplicates would show up here
        assert relay.stop() == 0, relay.stderr
    changes = _changes(messages, topic, reader)
    assert changes == [("c", 1), ("c", 2), ("u", 2), ("d", 1), ("c", 4)]
    tombstones = [m for m in messages if m.topic == topic and m.value is None]
    assert len(tombstones) == 1
    others = Counter(m.topic for m in messages if m.topic == f"{topic_prefix}.public.others")
    assert others == {f"{topic_prefix}.public.others": 1}
