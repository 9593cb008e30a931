"""The SQLAlchemy, asyncpg and Django integrations against a real PostgreSQL
(docs/application-side.md): each writes the event in the caller's transaction, a
rollback leaves nothing, ``process_once`` deduplicates, and the tables they describe or
create are the ones ``cdc-relay init`` creates."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import MetaData, create_engine, inspect
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from cdc_relay.app.init import init_database
from cdc_relay.config import OutboxConfig, TableRef
from cdc_relay.errors import ConfigError
from cdc_relay.integrations import asyncpg as pg_async
from cdc_relay.integrations import sqlalchemy as sa_outbox
from cdc_relay.outbox_core import TransactionRequired
from tests.integration.appside_support import PAYLOAD, rows, run_django, url


@pytest.fixture
def outbox_db(db: str) -> str:
    init_database(db, OutboxConfig(), slot=None)
    return db


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


# ---------------------------------------------------------------- every emit

def test_every_emit_of_every_integration_takes_the_event_id_as_text(outbox_db: str) -> None:
    from cdc_relay.outbox import emit, emit_async, emit_message, emit_message_async

    given = [str(uuid.UUID(int=n)) for n in range(1, 8)]
    p = conninfo_to_dict(outbox_db)

    async def scenario() -> list[uuid.UUID]:
        engine = create_async_engine(url(outbox_db, "psycopg"))
        conn = await asyncpg.connect(host=p["host"], port=int(p["port"]), user=p["user"],
                                     database=p["dbname"])
        try:
            async with AsyncSession(engine) as session, session.begin():
                a = await sa_outbox.emit_async(session, "order", "o-1", "e", {}, id=given[1])
            async with conn.transaction():
                b = await pg_async.emit(conn, "order", "o-1", "e", {}, event_id=given[2])
            async with await psycopg.AsyncConnection.connect(outbox_db) as pconn:
                c = await emit_async(pconn, "order", "o-1", "e", {}, event_id=given[3])
                d = await emit_message_async(pconn, "order", "o-1", "e", {}, event_id=given[4])
            return [a, b, c, d]
        finally:
            await conn.close()
            await engine.dispose()

    engine = create_engine(url(outbox_db, "psycopg"))
    with Session(engine) as session, session.begin():
        returned = [sa_outbox.emit(session, "order", "o-1", "e", {}, event_id=given[0])]
    engine.dispose()
    returned += asyncio.run(scenario())
    with psycopg.connect(outbox_db) as conn:
        returned.append(emit(conn, "order", "o-1", "e", {}, event_id=given[5]))
        returned.append(emit_message(conn, "order", "o-1", "e", {}, event_id=given[6]))
    assert returned == [uuid.UUID(g) for g in given]
    assert sorted(r[0] for r in rows(outbox_db)) == [uuid.UUID(g) for g in given[:4]] + [
        uuid.UUID(given[5])]  # the emit_message events are in the WAL, not the table
