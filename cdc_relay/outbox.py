"""Application side of the outbox: write one event in the caller's transaction (docs/design.md).

``emit`` (psycopg ``Connection``) and ``emit_async`` (``AsyncConnection``) are adapters
over the application side's shared core (cdc_relay/outbox_core.py, docs/design.md): the
checks, the event id, the trace context and the statements are the core's, as they are
for the SQLAlchemy, asyncpg and Django integrations (cdc_relay/integrations/); only the
``execute`` call is psycopg's.

``emit_message`` / ``emit_message_async`` are the tableless outbox (docs/messages.md):
the event is a transactional logical decoding message with the ``cdc-relay`` prefix,
whose envelope PostgreSQL builds itself (decoding/envelope.py), so WAL mode publishes it
exactly as it would publish the same row. No table row, no cleanup; polling mode cannot
see these events.

Trace context: ``traceparent`` / ``tracestate`` (W3C) are written when given, or taken
from the current OpenTelemetry span when ``opentelemetry-api`` is installed (the optional
extra ``otel``). For the table they need the columns of ``init --with-trace-context``;
whether the table has them is looked up once per database and table (a catalog read in
the caller's transaction) - without them an automatic trace context is not written, an
explicit one is refused before anything is sent.

Must not: commit, roll back or open a transaction (the event must commit or vanish
with the caller's business rows), open connections, or fail *in the database* on input
it can check itself - a failed statement aborts the caller's whole transaction, so bad
names, non-JSON payloads and wrong argument types are refused before the INSERT.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

import psycopg
from psycopg import sql

from cdc_relay.config import TableRef
from cdc_relay.model import MESSAGE_PREFIX, OutboxColumns
from cdc_relay.outbox_core import (
    DEFAULT_TABLE,
    EventIdError,
    Query,
    current_span_context,
    emit_steps,
    event_row,
    insert_sql,
    run_async,
    run_sync,
    serialize_payload,
    trace_context,
)

__all__ = ["DEFAULT_TABLE", "EventIdError", "emit", "emit_async", "emit_message", "emit_message_async",
           "insert_statement", "serialize_payload"]

# The envelope of decoding/envelope.py, built by PostgreSQL: the payload as the text of
# its jsonb (the bytes a table row gives), created_at from the same clock as a row's.
_EMIT_MESSAGE = (
    "SELECT pg_logical_emit_message(true, %s::text, json_build_object("
    "'v', 1, 'id', %s::uuid, 'aggregate_type', %s::text, 'aggregate_id', %s::text,"
    " 'event_type', %s::text, 'payload', %s::jsonb::text,"
    " 'created_at', floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint,"
    " 'traceparent', %s::text, 'tracestate', %s::text)::text)"
)
# The core's names, kept for the callers that import them from here.
_trace_context = trace_context
_current_span_context = current_span_context


@functools.lru_cache(maxsize=128)
def insert_statement(table: str | TableRef, columns: OutboxColumns | None = None,
                     trace: bool = False) -> sql.Composed:
    """The INSERT for one event into ``table``; ConfigError for an invalid name.

    ``trace`` adds the ``traceparent`` and ``tracestate`` columns (two more parameters).
    The core's statement as a psycopg Composed, cached per (table, columns, trace).
    """
    return sql.Composed([sql.SQL(insert_sql(table, columns, trace))])


def _where(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> tuple[str, int, str]:
    info = conn.info
    return (str(info.host), int(info.port), str(info.dbname))


def emit(
    conn: psycopg.Connection[Any],
    aggregate_type: str,
    aggregate_id: str,
    event_type: str,
    payload: Any,
    *,
    table: str | TableRef = DEFAULT_TABLE,
    columns: OutboxColumns | None = None,
    event_id: uuid.UUID | str | None = None,
    traceparent: str | None = None,
    tracestate: str | None = None,
) -> uuid.UUID:
    """Insert one outbox event inside the caller's transaction and return its id.

    Nothing is committed here: the event becomes visible to the relay when the
    caller's transaction commits, and disappears if it rolls back. (On an autocommit
    connection outside ``conn.transaction()`` the event commits on its own.)
    ``payload``: see :func:`serialize_payload`. ``event_id`` (a ``uuid.UUID`` or its
    text; text that is no UUID raises EventIdError) defaults to a random UUID; it is the
    Kafka ``id`` header consumers deduplicate on. Invalid table or
    column names raise ConfigError before anything is sent to the database.
    ``traceparent`` / ``tracestate``: see the module docstring (default: the current
    OpenTelemetry span, if any).
    """
    steps = emit_steps(aggregate_type, aggregate_id, event_type, payload, style="format",
                       where=lambda: _where(conn), table=table, columns=columns,
                       event_id=event_id, traceparent=traceparent, tracestate=tracestate)

    def execute(query: Query) -> Any:
        cursor = conn.execute(query.text, query.params)
        return cursor.fetchone() if query.fetch else None

    return run_sync(steps, execute)


async def emit_async(
    conn: psycopg.AsyncConnection[Any],
    aggregate_type: str,
    aggregate_id: str,
    event_type: str,
    payload: Any,
    *,
    table: str | TableRef = DEFAULT_TABLE,
    columns: OutboxColumns | None = None,
    event_id: uuid.UUID | str | None = None,
    traceparent: str | None = None,
    tracestate: str | None = None,
) -> uuid.UUID:
    """The asyncio twin of :func:`emit` (same statement, same checks)."""
    steps = emit_steps(aggregate_type, aggregate_id, event_type, payload, style="format",
                       where=lambda: _where(conn), table=table, columns=columns,
                       event_id=event_id, traceparent=traceparent, tracestate=tracestate)

    async def execute(query: Query) -> Any:
        cursor = await conn.execute(query.text, query.params)
        return await cursor.fetchone() if query.fetch else None

    return await run_async(steps, execute)


def emit_message(
    conn: psycopg.Connection[Any],
    aggregate_type: str,
    aggregate_id: str,
    event_type: str,
    payload: Any,
    *,
    event_id: uuid.UUID | str | None = None,
    traceparent: str | None = None,
    tracestate: str | None = None,
) -> uuid.UUID:
    """Write one event as a transactional logical decoding message; return its id.

    The tableless outbox: ``pg_logical_emit_message(true, 'cdc-relay', <envelope>)`` in
    the caller's transaction. WAL mode publishes it when the transaction commits - the
    same Kafka message a row with these values would give, in commit order with the
    transaction's other events - and never if it rolls back. Nothing is written to a
    table (no cleanup). Polling mode cannot see it. Same checks as :func:`emit`.
    """
    args = _message_arguments(aggregate_type, aggregate_id, event_type, payload, event_id,
                              traceparent, tracestate)
    conn.execute(_EMIT_MESSAGE, args)
    return args[1]  # type: ignore[no-any-return]


async def emit_message_async(
    conn: psycopg.AsyncConnection[Any],
    aggregate_type: str,
    aggregate_id: str,
    event_type: str,
    payload: Any,
    *,
    event_id: uuid.UUID | str | None = None,
    traceparent: str | None = None,
    tracestate: str | None = None,
) -> uuid.UUID:
    """The asyncio twin of :func:`emit_message`."""
    args = _message_arguments(aggregate_type, aggregate_id, event_type, payload, event_id,
                              traceparent, tracestate)
    await conn.execute(_EMIT_MESSAGE, args)
    return args[1]  # type: ignore[no-any-return]


def _message_arguments(aggregate_type: str, aggregate_id: str, event_type: str, payload: Any,
                       event_id: uuid.UUID | str | None, traceparent: str | None,
                       tracestate: str | None) -> tuple[Any, ...]:
    event = event_row(aggregate_type, aggregate_id, event_type, payload, event_id)
    return (MESSAGE_PREFIX, *event, *trace_context(traceparent, tracestate))
