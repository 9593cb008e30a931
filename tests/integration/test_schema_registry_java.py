"""The relay's Avro messages read back by a JVM consumer: kafka-clients with Apicurio
Registry's AvroKafkaDeserializer (tests/integration/java_consumer/), proving the bytes are the
Confluent wire format the Java ecosystem expects (docs/messages.md, schema registry)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdc_relay.local.apache_kafka import ApacheKafka
from cdc_relay.local.apicurio import ApicurioRegistry
from tests.integration.java_support import consume_avro, ensure_java_consumer
from tests.integration.test_schema_registry import AVRO, emit_events, registry_args
from tests.integration.wal_support import init_db, start_relay

pytestmark = pytest.mark.integration

EVENTS = [("o-1", "OrderCreated", {"id": 1, "note": "grüße"}),
          ("o-2", "OrderCreated", {"id": 2, "note": "quotes \" and \\ backslash"}),
          ("o-3", "OrderCreated", {"id": 9_007_199_254_740_993, "note": ""})]


@pytest.fixture(scope="module")
def java_consumer() -> Path:
    return ensure_java_consumer()


def test_a_java_consumer_with_apicurios_avro_deserializer_reads_the_relays_avro_messages(
        db: str, broker: ApacheKafka, schema_registry: ApicurioRegistry, topic_prefix: str,
        tmp_path: Path, java_consumer: Path) -> None:
    init_db(db, plugin="pgoutput")
    schema = tmp_path / "OrderCreated.avsc"
    schema.write_text(json.dumps(AVRO))
    emit_events(db, *EVENTS)
    with start_relay(db, broker.bootstrap, topic_prefix, plugin="pgoutput",
                     extra=registry_args(schema_registry, "avro", f"OrderCreated={schema}")) as relay:
        records = consume_avro(java_consumer, broker.bootstrap, schema_registry.url + "/apis/registry/v3",
                               f"{topic_prefix}.order", count=len(EVENTS))
        assert relay.stop() == 0, relay.stderr
    assert sorted((r["key"], r["value"]) for r in records) == \
        sorted((aggregate_id, payload) for aggregate_id, _, payload in EVENTS)
