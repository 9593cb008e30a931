"""The outbox through a schema registry beyond JSON payloads: payloads the application
encoded (``emit_encoded`` with confluent-kafka's serializer, ``--value-encoding
pre-encoded``) passed through unchanged, and struct keys (``--key-schema``), against real
PostgreSQL, Apache Kafka and Apicurio Registry, read back with confluent-kafka's own
deserializers (docs/messages.md, schema registry)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from cdc_relay.local.apache_kafka import ApacheKafka
from cdc_relay.local.apicurio import ApicurioRegistry
from cdc_relay.outbox_encoded import emit_encoded
from cdc_relay.sink.registry.schemas import load_value_schemas
from tests.integration.test_schema_registry import AVRO, GOOD, JSON_SCHEMA, by_id, emit_events, schema_file
from tests.integration.wal_support import init_db, start_relay
from tests.support import CliProcess, KafkaCollector, init_outbox

pytestmark = pytest.mark.integration

KEY_AVRO = {"type": "record", "name": "OrderKey", "namespace": "shop",
            "fields": [{"name": "tenant", "type": "string"}, {"name": "order_id", "type": "long"}]}


def create_bytea_outbox(dsn: str) -> None:
    """The outbox with a bytea payload column, created before ``init`` adds the relay's
    bookkeeping (docs/messages.md, pre-encoded payloads)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.outbox_events (id uuid PRIMARY KEY, aggregate_type "
                     "varchar(100) NOT NULL, aggregate_id varchar(100) NOT NULL, event_type "
                     "varchar(100) NOT NULL, payload bytea NOT NULL)")


def insert_raw(dsn: str, aggregate_id: str, data: bytes) -> str:
    """An event whose bytea payload is ``data`` as it is (no serializer)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("INSERT INTO public.outbox_events (id, aggregate_type, aggregate_id, "
                           "event_type, payload) VALUES (gen_random_uuid(), 'order', %s, "
                           "'OrderCreated', %s) RETURNING id::text", (aggregate_id, data)).fetchone()
        conn.commit()
    assert row is not None
    return str(row[0])


def relay_command(mode: str, db: str, bootstrap: str, prefix: str, extra: tuple[str, ...], *,
                  wait: bool = True) -> CliProcess:
    """``run`` (pgoutput) or ``poll`` with the test's topics and ``extra``."""
    if mode == "run":
        return start_relay(db, bootstrap, prefix, plugin="pgoutput", extra=extra, wait=wait)
    return CliProcess(["poll", "--dsn", db, "--brokers", bootstrap, "--topic-pattern",
                       prefix + ".{aggregate_type}", "--dead-letter-topic", prefix + ".dlq",
                       "--interval", "200ms", *extra])


class AppCodec:
    """The application's serializer for ``message_format`` and the consumer's reader."""

    def __init__(self, message_format: str, client: SchemaRegistryClient, tmp_path: Path) -> None:
        self.message_format = message_format
        self.message: Any = None
        if message_format == "avro":
            self.serializer: Any = AvroSerializer(client, json.dumps(AVRO))
            self.reader: Any = AvroDeserializer(client)
        elif message_format == "json-schema":
            self.serializer = JSONSerializer(json.dumps(JSON_SCHEMA), client)
            self.reader = JSONDeserializer(None, schema_registry_client=client)
        else:
            path = str(schema_file(tmp_path, "protobuf"))
            self.message = load_value_schemas("protobuf", (("OrderCreated", path),))["OrderCreated"].message
            self.serializer = ProtobufSerializer(self.message, client, {"use.deprecated.format": False})
            self.reader = ProtobufDeserializer(self.message, {"use.deprecated.format": False})

    def payload(self, value: dict[str, Any]) -> Any:
        return self.message(**value) if self.message is not None else value

    def read(self, data: bytes | None, topic: str) -> Any:
        value = self.reader(data, SerializationContext(topic, MessageField.VALUE))
        return {"id": value.id, "note": value.note} if self.message is not None else value


@pytest.mark.parametrize(("mode", "message_format"),
                         [("run", "avro"), ("poll", "json-schema"), ("run", "protobuf")])
def test_payloads_the_application_encoded_pass_through_unchanged_and_bad_frames_are_dead_lettered(
        db: str, broker: ApacheKafka, schema_registry: ApicurioRegistry, topic_prefix: str,
        tmp_path: Path, mode: str, message_format: str) -> None:
    create_bytea_outbox(db)
    if mode == "run":
        init_db(db, plugin="pgoutput")
    else:
        init_outbox(db, "--no-slot")
    topic = f"{topic_prefix}.order"
    client = SchemaRegistryClient({"url": schema_registry.ccompat_url})
    codec = AppCodec(message_format, client, tmp_path)
    with psycopg.connect(db) as conn:
        good = str(emit_encoded(conn, "order", "o-1", "OrderCreated", codec.payload(GOOD),
                                serializer=codec.serializer, topic=topic))
        again = str(emit_encoded(conn, "order", "o-2", "OrderCreated", codec.payload(dict(GOOD, id=8)),
                                 serializer=codec.serializer, topic=topic))
        conn.commit()
        written = conn.execute("SELECT payload FROM public.outbox_events WHERE id = %s",
                               (good,)).fetchone()
    assert written is not None
    no_magic = insert_raw(db, "o-3", b'{"id": 7}')
    unknown = insert_raw(db, "o-4", b"\x00" + (987654).to_bytes(4, "big") + b"\x02")
    args = ("--message-format", message_format, "--schema-registry", schema_registry.ccompat_url,
            "--value-encoding", "pre-encoded")
    with relay_command(mode, db, broker.bootstrap, topic_prefix, args) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        ids = {good, again, no_magic, unknown}
        messages = by_id(collector.collect(until=lambda ms: ids <= set(by_id(ms)), timeout=60))
        assert relay.stop() == 0, relay.stderr
    delivered = messages[good]
    assert delivered.topic == topic
    assert delivered.value == bytes(written[0])  # the application's bytes, unchanged
    assert codec.read(delivered.value, topic) == GOOD
    assert codec.read(messages[again].value, topic) == dict(GOOD, id=8)
    if message_format == "avro":
        key_ctx = SerializationContext(topic, MessageField.KEY)
        assert AvroDeserializer(client)(delivered.key, key_ctx) == "o-1"
    for dead, reason in ((no_magic, "is not in the Confluent wire format"),
                         (unknown, "names schema id 987654, which schema registry")):
        assert messages[dead].topic == f"{topic_prefix}.dlq"
        assert reason in messages[dead].headers["error"].decode()


@pytest.mark.parametrize("message_format", ["avro", "json-schema", "protobuf"])
def test_a_struct_key_is_registered_under_the_key_subject_and_a_key_that_does_not_fit_is_dead_lettered(
        db: str, broker: ApacheKafka, schema_registry: ApicurioRegistry, topic_prefix: str,
        tmp_path: Path, message_format: str) -> None:
    init_db(db, plugin="pgoutput")
    if message_format == "avro":
        key_file = tmp_path / "OrderKey.avsc"
        key_file.write_text(json.dumps(KEY_AVRO))
        key_value: dict[str, Any] = {"tenant": "t1", "order_id": 7}
    else:  # the OrderCreated shape (id, note) as the key's object or message
        (tmp_path / "key").mkdir()
        key_file = schema_file(tmp_path / "key", message_format)
        key_value = {"id": 7, "note": "t1"}
    good, plain = emit_events(db, (json.dumps(key_value), "OrderCreated", GOOD),
                              ("o-9", "OrderCreated", GOOD))
    args = ("--message-format", message_format, "--schema-registry", schema_registry.ccompat_url,
            "--value-schema", f"OrderCreated={schema_file(tmp_path, message_format)}",
            "--key-schema", str(key_file))
    with start_relay(db, broker.bootstrap, topic_prefix, plugin="pgoutput", extra=args) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        messages = by_id(collector.collect(until=lambda ms: {good, plain} <= set(by_id(ms)),
                                           timeout=60))
        assert relay.stop() == 0, relay.stderr
    topic = f"{topic_prefix}.order"
    client = SchemaRegistryClient({"url": schema_registry.ccompat_url})
    codec = AppCodec(message_format, client, tmp_path)
    key_ctx = SerializationContext(topic, MessageField.KEY)
    key = codec.reader(messages[good].key, key_ctx)
    if codec.message is not None:
        key = {"id": key.id, "note": key.note}
    assert key == key_value
    assert codec.read(messages[good].value, topic) == GOOD
    assert f"{topic}-key" in client.get_subjects()
    if message_format == "avro":
        registered = json.loads(client.get_latest_version(f"{topic}-key").schema.schema_str)
        assert registered["name"] == "OrderKey"
    assert messages[plain].topic == f"{topic_prefix}.dlq"
    assert "is not the JSON of the --key-schema" in messages[plain].headers["error"].decode()
