"""The outbox for SQLAlchemy 2 services, any driver (docs/application-side.md).

``emit`` / ``process_once`` take a ``Session`` or a ``Connection`` and run the shared
core's statements (cdc_relay/outbox_core.py) as ``text()`` in its current transaction;
``emit_async`` / ``process_once_async`` take an ``AsyncSession`` or ``AsyncConnection``
and run the same sync functions through ``run_sync`` (no second copy). ``emit_encoded`` /
``emit_encoded_async`` write a payload encoded through a schema registry (the shared step
of cdc_relay/outbox_encoded.py) into a ``bytea`` payload column. ``outbox_table``
and ``processed_events_table`` describe the tables ``cdc-relay init`` creates, so
Alembic's autogenerate sees them as they are; ``include_object`` keeps the relay's own
bookkeeping table out of autogenerate.

Must not: commit, roll back, flush the session or begin a transaction of its own (the
event commits or vanishes with the caller's), or define the tables differently from
sql/ (tests/integration/test_integrations.py compares them with an init-created table).
"""

from __future__ import annotations

import uuid
from collections.abc import Hashable
from typing import Any, Unpack

from cdc_relay.integrations import missing

try:
    from sqlalchemy import (
        Column,
        DateTime,
        Index,
        Integer,
        MetaData,
        String,
        Table,
        Text,
        text,
    )
    from sqlalchemy.dialects.postgresql import JSONB, UUID
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session
except ImportError:
    raise missing("SQLAlchemy (with its asyncio extra)", "sqlalchemy") from None

from cdc_relay import outbox_core as core
from cdc_relay.config import TableRef, validated_columns, validated_table
from cdc_relay.model import TRACE_COLUMNS, OutboxColumns
from cdc_relay.outbox_encoded import Serializer, encoded_steps
from cdc_relay.pg.db import derived_name
from cdc_relay.pg.schema import MIGRATIONS_TABLE, PROCESSED_EVENTS_TABLE

__all__ = ["emit", "emit_async", "emit_encoded", "emit_encoded_async", "include_object",
           "outbox_table", "process_once", "process_once_async", "processed_events_table"]

Executor = Session | Connection


def _execute(target: Executor, query: core.Query) -> Any:
    result = target.execute(text(query.text), query.params)
    return result.first() if query.fetch else None


def _where(target: Executor) -> Hashable:
    bind = target.get_bind() if isinstance(target, Session) else target
    url = bind.engine.url
    return (url.host, url.port, url.database)


def emit(session: Executor, aggregate_type: str, aggregate_id: str, event_type: str,
         payload: Any, **options: Unpack[core.EmitOptions]) -> uuid.UUID:
    """Insert one outbox event in the session's (or connection's) transaction; return its id.

    Never commits: the event is published when the caller commits, never if it rolls
    back. Options (``id``, ``table``, ``columns``, ``traceparent``, ...): see
    ``cdc_relay.outbox_core.EmitOptions``; same checks, errors and trace context as
    ``cdc_relay.outbox.emit``.
    """
    steps = core.emit_steps(aggregate_type, aggregate_id, event_type, payload, style="named",
                            where=lambda: _where(session), **options)
    return core.run_sync(steps, lambda query: _execute(session, query))


async def emit_async(session: AsyncSession | AsyncConnection, aggregate_type: str,
                     aggregate_id: str, event_type: str, payload: Any,
                     **options: Unpack[core.EmitOptions]) -> uuid.UUID:
    """:func:`emit` for an ``AsyncSession`` or ``AsyncConnection`` (same keyword options)."""
    result: uuid.UUID = await session.run_sync(
        emit, aggregate_type, aggregate_id, event_type, payload, **options)
    return result


def emit_encoded(session: Executor, aggregate_type: str, aggregate_id: str, event_type: str,
                 payload: Any, *, serializer: Serializer, topic: str | None = None,
                 **options: Unpack[core.EmitOptions]) -> uuid.UUID:
    """:func:`emit` of a payload encoded by ``serializer`` (confluent-kafka's
    ``AvroSerializer``, ``JSONSerializer`` or ``ProtobufSerializer``) for ``topic`` (default
    ``outbox.event.<aggregate_type>``), as ``cdc_relay.outbox_encoded.emit_encoded``: the
    registry is asked before any statement; the payload column must be ``bytea``."""
    steps = encoded_steps(aggregate_type, aggregate_id, event_type, payload, serializer=serializer,
                          topic=topic, style="named", where=lambda: _where(session), **options)
    return core.run_sync(steps, lambda query: _execute(session, query))


async def emit_encoded_async(session: AsyncSession | AsyncConnection, aggregate_type: str,
                             aggregate_id: str, event_type: str, payload: Any, *,
                             serializer: Serializer, topic: str | None = None,
                             **options: Unpack[core.EmitOptions]) -> uuid.UUID:
    """:func:`emit_encoded` for an ``AsyncSession`` or ``AsyncConnection`` (the serializer's
    registry call blocks, as in ``emit_encoded_async``)."""
    result: uuid.UUID = await session.run_sync(
        emit_encoded, aggregate_type, aggregate_id, event_type, payload, serializer=serializer,
        topic=topic, **options)
    return result


def _require_transaction(target: Executor) -> None:
    connection = target.connection() if isinstance(target, Session) else target
    # An AUTOCOMMIT engine or connection would commit the mark on its own.
    if getattr(connection.connection.dbapi_connection, "autocommit", False):
        raise core.transaction_required("a session or connection without AUTOCOMMIT isolation")


def process_once(session: Executor, event_id: uuid.UUID | str, *,
                 table: str | TableRef = core.DEFAULT_PROCESSED_TABLE) -> bool:
    """Mark ``event_id`` processed in the session's transaction: True the first time
    (process the event), False for a redelivery. A rollback un-marks it."""
    steps = core.mark_steps(event_id, table=table, style="named")
    _require_transaction(session)
    return core.run_sync(steps, lambda query: _execute(session, query))


async def process_once_async(session: AsyncSession | AsyncConnection, event_id: uuid.UUID | str,
                             *, table: str | TableRef = core.DEFAULT_PROCESSED_TABLE) -> bool:
    """:func:`process_once` for an ``AsyncSession`` or ``AsyncConnection``."""
    result: bool = await session.run_sync(process_once, event_id, table=table)
    return result


def outbox_table(metadata: MetaData, name: str = "outbox_events", schema: str | None = None, *,
                 columns: OutboxColumns | None = None, trace_context: bool = False) -> Table:
    """The outbox ``Table`` as ``cdc-relay init`` creates it (with ``--with-trace-context``
    when ``trace_context``): columns, types, defaults and both partial indexes."""
    cols = validated_columns(columns)  # before any name is used
    validated_table(TableRef(schema or "public", name))
    when = DateTime(timezone=True)
    trace = [Column(column, Text) for column in TRACE_COLUMNS] if trace_context else []
    return Table(
        name, metadata,
        Column(cols.id, UUID(as_uuid=True), primary_key=True,
               server_default=text("gen_random_uuid()")),
        Column(cols.aggregate_type, String(100), nullable=False),
        Column(cols.aggregate_id, String(100), nullable=False),
        Column(cols.event_type, String(100), nullable=False),
        Column(cols.payload, JSONB, nullable=False),
        Column("attempts", Integer, nullable=False, server_default=text("0")),
        Column(cols.created_at, when, nullable=False, server_default=text("clock_timestamp()")),
        Column("processed_at", when),
        Column("retry_after", when),
        Column("last_error", Text),
        Column("dead_lettered_at", when),
        *trace,
        Index(derived_name(name, "_pending_idx"), cols.created_at,
              postgresql_where=text("processed_at IS NULL AND dead_lettered_at IS NULL")),
        Index(derived_name(name, "_dead_idx"), "dead_lettered_at",
              postgresql_where=text("dead_lettered_at IS NOT NULL")),
        schema=schema,
    )


def processed_events_table(metadata: MetaData, schema: str | None = None) -> Table:
    """The consumers' ``processed_events`` table as ``cdc-relay init`` creates it."""
    return Table(
        PROCESSED_EVENTS_TABLE, metadata,
        Column("event_id", UUID(as_uuid=True), primary_key=True),
        Column("processed_at", DateTime(timezone=True), nullable=False,
               server_default=text("now()")),
        schema=schema,
    )


def include_object(obj: Any, name: str | None, type_: str, reflected: bool,
                   compare_to: Any) -> bool:
    """An Alembic ``include_object`` hook: skip the relay's migration bookkeeping table
    (``cdc-relay init`` owns it; autogenerate would otherwise propose dropping it)."""
    return not (type_ == "table" and name == MIGRATIONS_TABLE)
