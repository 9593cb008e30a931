"""Avro-illegal table and column names (``my-table``, ``order-id``, ``1st``, ``größe``)
with ``--message-format avro``: Debezium's default (``none``) leaves them, so the row is a
dead letter with the serializer's reason; ``--capture-schema-name-adjustment avro
--capture-field-name-adjustment avro`` registers and writes what Debezium embedded with
``schema.name.adjustment.mode=avro`` / ``field.name.adjustment.mode=avro`` and
Confluent's AvroConverter does (cdc_relay/capture/names.py, docs/table-cdc.md). The table
is selected by ``public.*``: ``--capture`` names take unquoted identifiers only."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from cdc_relay.local.apache_kafka import ApacheKafka
from cdc_relay.local.apicurio import ApicurioRegistry
from tests.integration.registry_support import (
    assert_same_subjects,
    debezium_records,
    prepare_debezium,
)
from tests.integration.test_capture_avro import _comparable, _decode
from tests.integration.wal_support import init_db, start_relay
from tests.support import KafkaCollector, Msg

pytestmark = pytest.mark.integration

TABLE = 'CREATE TABLE "my-table" ("order-id" int PRIMARY KEY, "1st" text, "größe" int)'
INSERT = 'INSERT INTO "my-table" VALUES (1, \'x\', 2)'
ADJUST = ("--capture-schema-name-adjustment", "avro", "--capture-field-name-adjustment", "avro")


def _run(db: str, broker: ApacheKafka, registry: ApicurioRegistry, prefix: str,
         *extra: str) -> list[Msg]:
    relay = start_relay(db, broker.bootstrap, prefix, plugin="pgoutput", extra=(
        "--capture", "public.*", "--capture-prefix", prefix, "--no-outbox",
        "--message-format", "avro", "--schema-registry", registry.ccompat_url, *extra))
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(INSERT)
        with KafkaCollector(broker.bootstrap, prefix) as collector:
            return collector.collect(until=lambda ms: bool(ms), timeout=60)
    finally:
        assert relay.stop() == 0, relay.stderr


def test_without_adjustment_an_illegal_name_is_a_dead_letter_with_the_reason(
        db: str, broker: ApacheKafka, schema_registry: ApicurioRegistry, topic_prefix: str) -> None:
    init_db(db, plugin="pgoutput")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(TABLE)
    got = _run(db, broker, schema_registry, topic_prefix)
    assert [m.topic for m in got] == [f"{topic_prefix}.dlq"]
    reason = got[0].headers["error"].decode()
    assert "does not fit its avro schema" in reason, reason
    assert "is no legal Avro name: set --capture-schema-name-adjustment avro" in reason, reason


@pytest.mark.slow
def test_avro_adjustment_equals_debezium_embedded(
        db: str, broker: ApacheKafka, schema_registry: ApicurioRegistry, topic_prefix: str,
        tmp_path: Path) -> None:
    prepare_debezium(db, TABLE, 'public."my-table"')
    got = _run(db, broker, schema_registry, topic_prefix, *ADJUST)
    topic = f"{topic_prefix}.public.my-table"  # the topic keeps the table's name
    assert [m.topic for m in got] == [topic]
    dbz = f"{topic_prefix}dbz"
    [(their_topic, their_key, their_value)] = debezium_records(
        db, dbz, schema_registry, tmp_path / "debezium.jsonl", 1, tables="public.my-table",
        properties={"schema.name.adjustment.mode": "avro", "field.name.adjustment.mode": "avro"})
    assert their_topic == f"{dbz}.public.my-table"
    assert_same_subjects(schema_registry, (topic, topic_prefix), (their_topic, dbz),
                         {"key": [1], "value": [1]})
    mine = SchemaRegistryClient({"url": schema_registry.ccompat_url}).get_latest_version(
        f"{topic}-value").schema.schema_str or ""
    assert '"name":"order_id"' in mine and "my_table" in mine
    key, value = _decode(schema_registry, got[0])
    dbz_key, dbz_value = _decode(schema_registry, Msg(their_topic, 0, 0, bytes.fromhex(their_key),
                                                      bytes.fromhex(their_value), {}, 0))
    assert key == dbz_key == {"order_id": 1}
    mine_v, their_v = _comparable(value), _comparable(dbz_value)
    for side in (mine_v, their_v):
        side["source"].pop("version")
    assert mine_v == their_v
    assert mine_v["after"] == {"order_id": 1, "_1st": "x", "gr__e": 2}
