"""``emit_encoded`` of the SQLAlchemy, asyncpg and Django integrations against real
PostgreSQL, Apache Kafka and Apicurio Registry: payloads encoded by confluent-kafka's
AvroSerializer in the caller's transaction (a rollback leaves nothing), passed through
unchanged by ``--value-encoding pre-encoded`` and read back with the stock deserializer
(docs/application-side.md, registry-encoded payloads)."""

from __future__ import annotations

import asyncio
import json
import uuid

import asyncpg
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from cdc_relay.integrations import asyncpg as pg_async
from cdc_relay.integrations import sqlalchemy as sa_outbox
from cdc_relay.local.apache_kafka import ApacheKafka
from cdc_relay.local.apicurio import ApicurioRegistry
from tests.integration.appside_support import DJANGO_SETUP, rows, run_django, url
from tests.integration.test_registry_outbox import create_bytea_outbox
from tests.integration.test_schema_registry import AVRO, by_id
from tests.integration.wal_support import init_db, start_relay
from tests.support import KafkaCollector

pytestmark = pytest.mark.integration

PAYLOADS = "SELECT id::text, payload FROM outbox_events ORDER BY aggregate_id"


def _write_with_sqlalchemy_and_asyncpg(dsn: str, serializer: AvroSerializer,
                                       topic: str) -> dict[str, int]:
    """Committed events (event id -> the payload's ``id``) and rolled-back ones."""
    written: dict[str, int] = {}
    engine = create_engine(url(dsn, "psycopg"))
    with Session(engine) as session:
        sa_outbox.emit_encoded(session, "order", "gone", "OrderCreated", {"id": 0, "note": "x"},
                               serializer=serializer, topic=topic)
        session.rollback()
    with Session(engine) as session, session.begin():
        event_id = sa_outbox.emit_encoded(session, "order", "o-1", "OrderCreated",
                                          {"id": 1, "note": "sqlalchemy"}, serializer=serializer,
                                          topic=topic)
        written[str(event_id)] = 1
    engine.dispose()
    p = conninfo_to_dict(dsn)

    async def async_writers() -> None:
        async_engine = create_async_engine(url(dsn, "asyncpg"))
        async with AsyncSession(async_engine) as session, session.begin():
            event_id = await sa_outbox.emit_encoded_async(
                session, "order", "o-2", "OrderCreated", {"id": 2, "note": "sqlalchemy async"},
                serializer=serializer, topic=topic)
            written[str(event_id)] = 2
        await async_engine.dispose()
        conn = await asyncpg.connect(host=p["host"], port=int(p["port"]), user=p["user"],
                                     database=p["dbname"])
        try:
            tx = conn.transaction()
            await tx.start()
            await pg_async.emit_encoded(conn, "order", "gone", "OrderCreated",
                                        {"id": 0, "note": "x"}, serializer=serializer, topic=topic)
            await tx.rollback()
            async with conn.transaction():
                event_id = await pg_async.emit_encoded(
                    conn, "order", "o-3", "OrderCreated", {"id": 3, "note": "asyncpg"},
                    serializer=serializer, topic=topic)
                written[str(event_id)] = 3
        finally:
            await conn.close()

    asyncio.run(async_writers())
    return written


def test_sqlalchemy_and_asyncpg_emit_encoded_pass_through_the_relay_unchanged(
        db: str, broker: ApacheKafka, schema_registry: ApicurioRegistry,
        topic_prefix: str) -> None:
    create_bytea_outbox(db)
    init_db(db, plugin="pgoutput")
    topic = f"{topic_prefix}.order"
    client = SchemaRegistryClient({"url": schema_registry.ccompat_url})
    written = _write_with_sqlalchemy_and_asyncpg(db, AvroSerializer(client, json.dumps(AVRO)), topic)
    stored = {event_id: bytes(data) for event_id, data in rows(db, PAYLOADS)}
    assert set(stored) == set(written)  # the rolled-back events left nothing
    args = ("--message-format", "avro", "--schema-registry", schema_registry.ccompat_url,
            "--value-encoding", "pre-encoded")
    with start_relay(db, broker.bootstrap, topic_prefix, plugin="pgoutput", extra=args) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        messages = by_id(collector.collect(until=lambda ms: set(written) <= set(by_id(ms)),
                                           timeout=60))
        assert relay.stop() == 0, relay.stderr
    reader = AvroDeserializer(client)
    context = SerializationContext(topic, MessageField.VALUE)
    for event_id, n in written.items():
        assert messages[event_id].topic == topic
        assert messages[event_id].value == stored[event_id]  # the application's bytes
        assert reader(messages[event_id].value, context)["id"] == n
    assert f"{topic}-value" in client.get_subjects()  # TopicNameStrategy, as a producer's


DJANGO_SCRIPT = DJANGO_SETUP + """
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from django.core.management import call_command
from django.db import transaction
from cdc_relay.integrations.django import emit_encoded

call_command("migrate", verbosity=0)
serializer = AvroSerializer(SchemaRegistryClient({"url": sys.argv[5]}), sys.argv[6])
try:
    with transaction.atomic():
        emit_encoded("order", "gone", "OrderCreated", {"id": 0, "note": "x"},
                     serializer=serializer, topic=sys.argv[7])
        raise RuntimeError("roll back")
except RuntimeError:
    pass
with transaction.atomic():
    event_id = emit_encoded("order", "o-1", "OrderCreated", {"id": 1, "note": "django"},
                            serializer=serializer, topic=sys.argv[7])
try:
    emit_encoded("order", "o-2", "OrderCreated", {"id": "one"}, serializer=serializer)
    refused = "accepted"
except Exception as exc:
    refused = type(exc).__name__
print(json.dumps({"id": str(event_id), "refused": refused}))
"""


def test_django_emit_encoded_writes_the_registry_encoded_payload_inside_atomic(
        db: str, schema_registry: ApicurioRegistry, topic_prefix: str) -> None:
    create_bytea_outbox(db)
    topic = f"{topic_prefix}.order"
    found = run_django(db, DJANGO_SCRIPT, schema_registry.ccompat_url, json.dumps(AVRO), topic)
    assert found["refused"] != "accepted"  # the serializer's own error, before any statement
    stored = rows(db, PAYLOADS)
    assert [r[0] for r in stored] == [found["id"]]
    uuid.UUID(found["id"])
    client = SchemaRegistryClient({"url": schema_registry.ccompat_url})
    value = AvroDeserializer(client)(bytes(stored[0][1]), SerializationContext(topic, MessageField.VALUE))
    assert value == {"id": 1, "note": "django"}
