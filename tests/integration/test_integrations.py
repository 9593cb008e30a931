"""The SQLAlchemy, asyncpg and Django integrations against a real PostgreSQL
(docs/application-side.md): each writes the event in the caller's transaction, a
rollback leaves nothing, ``process_once`` deduplicates, and the tables they describe or
create are the ones ``cdc-relay init`` creates."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from cloudevents.v1.kafka import KafkaMessage, from_binary, from_structured
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import MetaData, create_engine, inspect
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from cdc_relay.cloudevents import rfc3339
from cdc_relay.config import OutboxConfig, TableRef
from cdc_relay.errors import ConfigError
from cdc_relay.integrations import asyncpg as pg_async
from cdc_relay.integrations import sqlalchemy as sa_outbox
from cdc_relay.local.broker import Broker
from cdc_relay.outbox import emit
from cdc_relay.outbox_core import TransactionRequired
from cdc_relay.schema import init_database
from tests.integration.wal_support import init_db, start_relay
from tests.support import CliProcess, KafkaCollector, Msg

PAYLOAD = {"order": "o-1", "total": 12.5, "name": "Zoë — 東京"}
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def outbox_db(db: str) -> str:
    init_database(db, OutboxConfig(), slot=None)
    return db


def url(dsn: str, driver: str) -> str:
    """The SQLAlchemy URL of a libpq DSN, for ``driver`` (psycopg or asyncpg)."""
    p = conninfo_to_dict(dsn)
    return f"postgresql+{driver}://{p['user']}@{p['host']}:{p['port']}/{p['dbname']}"


def rows(dsn: str, query: str = "SELECT id, aggregate_type, aggregate_id, event_type, payload "
         "FROM outbox_events ORDER BY created_at") -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query).fetchall()


# ---------------------------------------------------------------- SQLAlchemy

@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
def test_sqlalchemy_emit_commits_with_the_session_and_vanishes_on_rollback(
        outbox_db: str, driver: str) -> None:
    async def scenario() -> uuid.UUID:
        engine = create_async_engine(url(outbox_db, driver))
        try:
            async with AsyncSession(engine) as session:
                await sa_outbox.emit_async(session, "order", "o-0", "dropped", PAYLOAD)
                await session.rollback()
            async with AsyncSession(engine) as session, session.begin():
                return await sa_outbox.emit_async(session, "order", "o-1", "created", PAYLOAD)
        finally:
            await engine.dispose()

    if driver == "psycopg":  # the sync Session too
        engine = create_engine(url(outbox_db, driver))
        with Session(engine) as session:
            sa_outbox.emit(session, "order", "o-0", "dropped", PAYLOAD)
            session.rollback()
        given = uuid.uuid4()
        with Session(engine) as session, session.begin():
            assert sa_outbox.emit(session, "order", "o-2", "paid", [1, 2], id=given) == given
        engine.dispose()
    event_id = asyncio.run(scenario())
    found = rows(outbox_db)
    assert (event_id, "order", "o-1", "created", PAYLOAD) in found
    assert [r[3] for r in found if r[3] == "dropped"] == []
    assert len(found) == (2 if driver == "psycopg" else 1)


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
def test_sqlalchemy_process_once_deduplicates_and_a_rollback_unmarks(
        outbox_db: str, driver: str) -> None:
    event_id = uuid.uuid4()

    async def scenario() -> list[bool]:
        engine = create_async_engine(url(outbox_db, driver))
        try:
            async with AsyncSession(engine) as session:
                first = await sa_outbox.process_once_async(session, event_id)
                await session.rollback()
            async with AsyncSession(engine) as session, session.begin():
                again = await sa_outbox.process_once_async(session, str(event_id))
            async with AsyncSession(engine) as session, session.begin():
                duplicate = await sa_outbox.process_once_async(session, event_id)
            return [first, again, duplicate]
        finally:
            await engine.dispose()

    assert asyncio.run(scenario()) == [True, True, False]
    engine = create_engine(url(outbox_db, "psycopg"), isolation_level="AUTOCOMMIT")
    with Session(engine) as session, pytest.raises(TransactionRequired, match="AUTOCOMMIT"):
        sa_outbox.process_once(session, uuid.uuid4())
    engine.dispose()


def _columns(engine: Any, table: str) -> list[tuple[Any, ...]]:
    found = inspect(engine)
    columns = [(c["name"], str(c["type"]), c["nullable"], str(c.get("default")))
               for c in found.get_columns(table)]
    indexes = sorted((i["name"], tuple(i["column_names"]),
                      str(i.get("dialect_options", {}).get("postgresql_where")))
                     for i in found.get_indexes(table))
    primary = found.get_pk_constraint(table)["constrained_columns"]
    return [*columns, *indexes, ("pk", *primary)]


@pytest.mark.parametrize("trace_context", [False, True])
def test_outbox_table_is_what_init_creates(outbox_db: str, db: str, pg_cluster: Any,
                                           trace_context: bool) -> None:
    if trace_context:
        init_database(db, OutboxConfig(), slot=None, trace_context=True)
    metadata = MetaData()
    sa_outbox.outbox_table(metadata, trace_context=trace_context)
    sa_outbox.processed_events_table(metadata)
    init_engine = create_engine(url(outbox_db, "psycopg"))
    # The same tables created by SQLAlchemy in another database: identical catalogs.
    other = pg_cluster.create_database(f"test_{uuid.uuid4().hex[:12]}")
    other_engine = create_engine(url(other, "psycopg"))
    try:
        metadata.create_all(other_engine)
        for table in ("outbox_events", "processed_events"):
            assert _columns(other_engine, table) == _columns(init_engine, table)
        with init_engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={
                "include_object": sa_outbox.include_object, "compare_server_default": True})
            assert compare_metadata(context, metadata) == []
    finally:
        init_engine.dispose()
        other_engine.dispose()
        pg_cluster.drop_database(conninfo_to_dict(other)["dbname"])


# ---------------------------------------------------------------- asyncpg

def test_asyncpg_emit_and_process_once_in_the_connections_transaction(outbox_db: str) -> None:
    p = conninfo_to_dict(outbox_db)

    async def scenario() -> tuple[uuid.UUID, list[bool]]:
        conn = await asyncpg.connect(host=p["host"], port=int(p["port"]), user=p["user"],
                                     database=p["dbname"])
        try:
            tx = conn.transaction()
            await tx.start()
            await pg_async.emit(conn, "order", "o-0", "dropped", PAYLOAD)
            await tx.rollback()
            async with conn.transaction():
                event_id = await pg_async.emit(conn, "order", "o-1", "created", PAYLOAD)
                first = await pg_async.process_once(conn, event_id)
            async with conn.transaction():
                duplicate = await pg_async.process_once(conn, event_id)
            with pytest.raises(TransactionRequired, match=r"conn\.transaction"):
                await pg_async.process_once(conn, uuid.uuid4())
            return event_id, [first, duplicate]
        finally:
            await conn.close()

    event_id, marks = asyncio.run(scenario())
    assert marks == [True, False]
    assert rows(outbox_db) == [(event_id, "order", "o-1", "created", PAYLOAD)]


def test_asyncpg_writes_the_trace_context_of_the_current_span(db: str) -> None:
    init_database(db, OutboxConfig(), slot=None, trace_context=True)
    p = conninfo_to_dict(db)
    context = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331,
                          is_remote=False, trace_flags=TraceFlags(1))

    async def scenario() -> None:
        conn = await asyncpg.connect(host=p["host"], port=int(p["port"]), user=p["user"],
                                     database=p["dbname"])
        try:
            with trace.use_span(NonRecordingSpan(context)):
                await pg_async.emit(conn, "order", "o-1", "created", PAYLOAD)
        finally:
            await conn.close()

    asyncio.run(scenario())
    assert rows(db, "SELECT traceparent, tracestate FROM outbox_events") == [
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", None)]


# ---------------------------------------------------------------- Django

DJANGO_SCRIPT = """
import json, sys, uuid
import django
from django.conf import settings
settings.configure(
    INSTALLED_APPS=["cdc_relay.integrations.django"],
    DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": sys.argv[1],
                           "HOST": sys.argv[2], "PORT": sys.argv[3], "USER": sys.argv[4]}},
    USE_TZ=True,
)
django.setup()
from django.core.management import call_command
from django.db import transaction
from cdc_relay.integrations.django import emit, process_once
from cdc_relay.outbox_core import TransactionRequired

call_command("migrate", verbosity=0)
call_command("migrate", verbosity=0)  # a second run changes nothing
try:
    with transaction.atomic():
        emit("order", "o-0", "dropped", {"n": 0})
        raise RuntimeError("roll back")
except RuntimeError:
    pass
with transaction.atomic():
    event_id = emit("order", "o-1", "created", {"n": 1})
    first = process_once(event_id)
with transaction.atomic():
    duplicate = process_once(event_id)
try:
    process_once(uuid.uuid4())
    outside = "accepted"
except TransactionRequired as exc:
    outside = str(exc)
print(json.dumps({"id": str(event_id), "marks": [first, duplicate], "outside": outside}))
"""


def run_django(dsn: str) -> dict[str, Any]:
    p = conninfo_to_dict(dsn)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(DJANGO_SCRIPT), p["dbname"], p["host"],
         p["port"], p["user"]],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    found: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


def test_django_migrate_creates_inits_tables_and_emit_writes_inside_atomic(
        db: str, pg_cluster: Any) -> None:
    found = run_django(db)
    assert found["marks"] == [True, False]
    assert "transaction.atomic()" in found["outside"]
    assert rows(db) == [(uuid.UUID(found["id"]), "order", "o-1", "created", {"n": 1})]
    # init afterwards: the migrations are recorded, so it applies none.
    report = init_database(db, OutboxConfig(), slot=None)
    assert report.migrations_applied == ()
    # The same catalog as a database that only init touched.
    other = pg_cluster.create_database(f"test_{uuid.uuid4().hex[:12]}")
    try:
        init_database(other, OutboxConfig(), slot=None)
        assert _catalog(db) == _catalog(other)
    finally:
        pg_cluster.drop_database(conninfo_to_dict(other)["dbname"])


def _catalog(dsn: str) -> list[tuple[Any, ...]]:
    """Columns, indexes and views of the public schema, minus Django's own tables."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        columns = conn.execute(
            "SELECT table_name, column_name, data_type, character_maximum_length, is_nullable,"
            " column_default FROM information_schema.columns WHERE table_schema = 'public'"
            " AND table_name NOT LIKE 'django%' ORDER BY 1, 2").fetchall()
        indexes = conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'"
            " AND tablename NOT LIKE 'django%' ORDER BY 1").fetchall()
        versions = conn.execute(
            "SELECT table_name, version FROM cdc_relay_schema_migrations ORDER BY 1, 2").fetchall()
    return [*columns, *indexes, *versions]


def test_emit_refuses_an_explicit_trace_context_the_table_cannot_hold(outbox_db: str) -> None:
    engine = create_engine(url(outbox_db, "psycopg"))
    try:
        with Session(engine) as session, pytest.raises(ConfigError, match="with-trace-context"):
            sa_outbox.emit(session, "order", "o-1", "created", {}, table=TableRef(),
                           traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    finally:
        engine.dispose()


# ---------------------------------------------------------------- end to end

def _write_with_every_integration(dsn: str) -> dict[str, str]:
    """One committed event per integration (and rolled-back ones); event id -> writer."""
    written: dict[str, str] = {}
    engine = create_engine(url(dsn, "psycopg"))
    with Session(engine) as session:
        sa_outbox.emit(session, "order", "gone", "RolledBack", {"n": 0})
        session.rollback()
    with Session(engine) as session, session.begin():
        written[str(sa_outbox.emit(session, "order", "o-1", "OrderCreated", PAYLOAD))] = "sqlalchemy"
    engine.dispose()
    p = conninfo_to_dict(dsn)

    async def async_writers() -> None:
        async_engine = create_async_engine(url(dsn, "asyncpg"))
        async with AsyncSession(async_engine) as session, session.begin():
            event_id = await sa_outbox.emit_async(session, "order", "o-2", "OrderPaid", [1, 2])
            written[str(event_id)] = "sqlalchemy async"
        await async_engine.dispose()
        conn = await asyncpg.connect(host=p["host"], port=int(p["port"]), user=p["user"],
                                     database=p["dbname"])
        async with conn.transaction():
            written[str(await pg_async.emit(conn, "invoice", "i-1", "InvoiceSent", "x"))] = "asyncpg"
        await conn.close()

    asyncio.run(async_writers())
    written[run_django(dsn)["id"]] = "django"
    return written


@pytest.mark.slow
def test_the_relay_publishes_what_each_integration_wrote_as_cloudevents(
        db: str, broker: Broker, topic_prefix: str) -> None:
    init_db(db, plugin="pgoutput")
    written = _write_with_every_integration(db)
    with start_relay(db, broker.bootstrap, topic_prefix, plugin="pgoutput",
                     extra=("--message-format", "cloudevents")) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        with psycopg.connect(db) as conn:  # written last: everything before it has arrived
            sentinel = str(emit(conn, "order", "end", "Sentinel", {}))
        messages = collector.collect(
            until=lambda ms: any(m.headers["id"].decode() == sentinel for m in ms), timeout=60)
        assert relay.stop() == 0, relay.stderr
    events = {m.headers["id"].decode(): from_binary(KafkaMessage(m.headers, m.key, m.value))
              for m in messages}
    assert set(events) == {*written, sentinel}  # nothing rolled back, nothing lost
    with psycopg.connect(db, autocommit=True) as conn:
        stored = {str(row[0]): row[1:] for row in conn.execute(
            "SELECT id, aggregate_id, event_type, payload, (extract(epoch FROM created_at)"
            " * 1000)::bigint FROM outbox_events")}
    source = f"/cdc-relay/{conninfo_to_dict(db)['dbname']}/public.outbox_events"
    for event_id, cloud in events.items():
        aggregate_id, event_type, payload, created_ms = stored[event_id]
        assert (cloud["id"], cloud["type"], cloud["subject"], cloud["source"]) == (
            event_id, event_type, aggregate_id, source)
        assert cloud.data == payload
        assert abs(_epoch_ms(cloud["time"]) - created_ms) <= 1  # RFC 3339, to the millisecond
        assert cloud["time"] == rfc3339(_epoch_ms(cloud["time"]))


def _epoch_ms(text: str) -> int:
    return round(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def _by_id(messages: list[Msg]) -> dict[str, Msg]:
    return {m.headers["id"].decode(): m for m in messages}


@pytest.mark.slow
def test_structured_cloudevents_are_identical_compiled_pure_python_and_polled(
        db: str, broker: Broker, topic_prefix: str) -> None:
    init_db(db, slot="c", plugin="pgoutput")
    init_db(db, slot="p", plugin="pgoutput")
    with psycopg.connect(db) as conn:
        wanted = {str(emit(conn, "order", f"o-{n}", "OrderCreated", {"n": n, "note": "grüße"}))
                  for n in range(3)}
    shaping = ("--message-format", "cloudevents-structured", "--cloudevents-source", "urn:{table}")
    results = {}
    for slot, extra in (("c", ()), ("p", ("--pure-python-decoder",))):
        with start_relay(db, broker.bootstrap, topic_prefix + slot, slot=slot, plugin="pgoutput",
                         extra=(*shaping, *extra)) as relay, \
                KafkaCollector(broker.bootstrap, topic_prefix + slot) as collector:
            results[slot] = _by_id(collector.collect(until=lambda ms: wanted <= set(_by_id(ms)),
                                                     timeout=60))
            assert relay.stop() == 0, relay.stderr
    with CliProcess(["poll", "--dsn", db, "--brokers", broker.bootstrap, "--topic-pattern",
                     f"{topic_prefix}q.{{aggregate_type}}", "--interval", "200ms",
                     *shaping]) as poller, \
            KafkaCollector(broker.bootstrap, f"{topic_prefix}q") as collector:
        results["q"] = _by_id(collector.collect(until=lambda ms: wanted <= set(_by_id(ms)),
                                                timeout=60))
        assert poller.stop() == 0, poller.stderr
    for event_id in wanted:
        compiled, pure, polled = (results[name][event_id] for name in ("c", "p", "q"))
        assert (compiled.key, compiled.value, compiled.headers) == (
            pure.key, pure.value, pure.headers) == (polled.key, polled.value, polled.headers)
        cloud = from_structured(KafkaMessage(compiled.headers, compiled.key, compiled.value))
        assert (cloud["id"], cloud["type"], cloud["source"]) == (event_id, "OrderCreated",
                                                                  "urn:outbox_events")
        assert cloud.data["note"] == "grüße"
        assert compiled.headers["content-type"] == b"application/cloudevents+json"
