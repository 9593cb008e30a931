"""Application side of the outbox: write one event in the caller's transaction (docs/design.md).

``emit`` (psycopg ``Connection``) and ``emit_async`` (``AsyncConnection``) share one
statement builder and one argument builder; only the ``execute`` call differs. The
INSERT is composed from validated, quoted identifiers once per (table, columns) and
cached.

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
import importlib
import re
import uuid
from collections.abc import Sequence
from typing import Any

import orjson
import psycopg
from psycopg import sql

from cdc_relay.config import TableRef
from cdc_relay.db import validated_columns, validated_table
from cdc_relay.errors import ConfigError
from cdc_relay.model import MESSAGE_PREFIX, TRACE_COLUMNS, OutboxColumns

DEFAULT_TABLE = "public.outbox_events"
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
_TRACE_LOOKUP = (
    "SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass(%s)"
    " AND attname = ANY(%s) AND attnum > 0 AND NOT attisdropped"
)
# The envelope of decoding/envelope.py, built by PostgreSQL: the payload as the text of
# its jsonb (the bytes a table row gives), created_at from the same clock as a row's.
_EMIT_MESSAGE = (
    "SELECT pg_logical_emit_message(true, %s::text, json_build_object("
    "'v', 1, 'id', %s::uuid, 'aggregate_type', %s::text, 'aggregate_id', %s::text,"
    " 'event_type', %s::text, 'payload', %s::jsonb::text,"
    " 'created_at', floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint,"
    " 'traceparent', %s::text, 'tracestate', %s::text)::text)"
)

# JSON text escaping U+0000: valid JSON, refused by jsonb ("unsupported Unicode escape
# sequence"). Preceded by an even number of backslashes, so ``\\u0000`` (an escaped
# backslash followed by "u0000") is not matched.
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


@functools.lru_cache(maxsize=128)
def insert_statement(table: str | TableRef, columns: OutboxColumns | None = None,
                     trace: bool = False) -> sql.Composed:
    """The INSERT for one event into ``table``; ConfigError for an invalid name.

    ``trace`` adds the ``traceparent`` and ``tracestate`` columns (two more parameters).
    Cached per (table, columns, trace): all hashable, and the result is immutable.
    """
    ref = validated_table(table)
    cols = validated_columns(columns)
    extra = ", traceparent, tracestate" if trace else ""
    params = ", %s, %s" if trace else ""
    return sql.SQL(
        "INSERT INTO {table} ({id}, {aggregate_type}, {aggregate_id}, {event_type}, {payload}"
        + extra + ") VALUES (%s, %s, %s, %s, %s" + params + ")"
    ).format(
        table=sql.Identifier(ref.schema, ref.name),
        id=sql.Identifier(cols.id),
        aggregate_type=sql.Identifier(cols.aggregate_type),
        aggregate_id=sql.Identifier(cols.aggregate_id),
        event_type=sql.Identifier(cols.event_type),
        payload=sql.Identifier(cols.payload),
    )


def serialize_payload(payload: Any) -> str:
    """The payload as JSON text, checked before it reaches PostgreSQL.

    * ``bytes`` / ``bytearray`` / ``memoryview``: already-serialised JSON (UTF-8); it is
      validated and stored as is (jsonb normalises it).
    * anything else is serialised with orjson: dict, list, str (a JSON *string*, not
      JSON text - pass bytes for that), int, float, bool, None, and what orjson
      handles natively (datetime, UUID, dataclasses, ...).

    Raises TypeError for a value orjson cannot serialise and ValueError for bytes that
    are not JSON, or for a U+0000 character, which jsonb cannot store.
    """
    if isinstance(payload, bytes | bytearray | memoryview):
        data = bytes(payload)
        try:
            orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"payload bytes are not valid JSON: {exc}") from exc
    else:
        try:
            data = orjson.dumps(payload)
        except orjson.JSONEncodeError as exc:
            raise TypeError(f"payload is not JSON-serialisable: {exc}") from exc
    if b"\\u0000" in data and _NUL_ESCAPE.search(data):
        raise ValueError("payload contains a U+0000 (NUL) character, which jsonb cannot store")
    return data.decode("utf-8")


def _arguments(
    aggregate_type: str,
    aggregate_id: str,
    event_type: str,
    payload: Any,
    event_id: uuid.UUID | None,
) -> tuple[uuid.UUID, str, str, str, str]:
    for what, value in (
        ("aggregate_type", aggregate_type),
        ("aggregate_id", aggregate_id),
        ("event_type", event_type),
    ):
        if not isinstance(value, str):
            raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    if event_id is None:
        event_id = uuid.uuid4()
    elif not isinstance(event_id, uuid.UUID):
        raise TypeError(f"event_id must be a uuid.UUID, got {type(event_id).__name__}")
    return (event_id, aggregate_type, aggregate_id, event_type, serialize_payload(payload))


def emit(
    conn: psycopg.Connection[Any],
    aggregate_type: str,
    aggregate_id: str,
    event_type: str,
    payload: Any,
    *,
    table: str | TableRef = DEFAULT_TABLE,
    columns: OutboxColumns | None = None,
    event_id: uuid.UUID | None = None,
    traceparent: str | None = None,
    tracestate: str | None = None,
) -> uuid.UUID:
    """Insert one outbox event inside the caller's transaction and return its id.

    Nothing is committed here: the event becomes visible to the relay when the
    caller's transaction commits, and disappears if it rolls back. (On an autocommit
    connection outside ``conn.transaction()`` the event commits on its own.)
    ``payload``: see :func:`serialize_payload`. ``event_id`` defaults to a random
    UUID; it is the Kafka ``id`` header consumers deduplicate on. Invalid table or
    column names raise ConfigError before anything is sent to the database.
    ``traceparent`` / ``tracestate``: see the module docstring (default: the current
    OpenTelemetry span, if any).
    """
    query = insert_statement(table, columns)  # first: bad names fail before any I/O
    args: Sequence[Any] = _arguments(aggregate_type, aggregate_id, event_type, payload, event_id)
    trace = _trace_context(traceparent, tracestate)
    if trace[0] is not None and _has_trace_columns(conn, table, explicit=traceparent):
        query, args = insert_statement(table, columns, True), (*args, *trace)
    conn.execute(query, args)
    return args[0]  # type: ignore[no-any-return]


async def emit_async(
    conn: psycopg.AsyncConnection[Any],
    aggregate_type: str,
    aggregate_id: str,
    event_type: str,
    payload: Any,
    *,
    table: str | TableRef = DEFAULT_TABLE,
    columns: OutboxColumns | None = None,
    event_id: uuid.UUID | None = None,
    traceparent: str | None = None,
    tracestate: str | None = None,
) -> uuid.UUID:
    """The asyncio twin of :func:`emit` (same statement, same checks)."""
    query = insert_statement(table, columns)  # first: bad names fail before any I/O
    args: Sequence[Any] = _arguments(aggregate_type, aggregate_id, event_type, payload, event_id)
    trace = _trace_context(traceparent, tracestate)
    if trace[0] is not None:
        key = _trace_key(conn.info, table)
        if key not in _TRACE_COLUMNS_SEEN:
            cursor = await conn.execute(_TRACE_LOOKUP, _trace_lookup_args(table))
            _TRACE_COLUMNS_SEEN[key] = _count(await cursor.fetchone()) == len(TRACE_COLUMNS)
        if _trace_usable(key, table, explicit=traceparent):
            query, args = insert_statement(table, columns, True), (*args, *trace)
    await conn.execute(query, args)
    return args[0]  # type: ignore[no-any-return]


def emit_message(
    conn: psycopg.Connection[Any],
    aggregate_type: str,
    aggregate_id: str,
    event_type: str,
    payload: Any,
    *,
    event_id: uuid.UUID | None = None,
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
    event_id: uuid.UUID | None = None,
    traceparent: str | None = None,
    tracestate: str | None = None,
) -> uuid.UUID:
    """The asyncio twin of :func:`emit_message`."""
    args = _message_arguments(aggregate_type, aggregate_id, event_type, payload, event_id,
                              traceparent, tracestate)
    await conn.execute(_EMIT_MESSAGE, args)
    return args[1]  # type: ignore[no-any-return]


def _message_arguments(aggregate_type: str, aggregate_id: str, event_type: str, payload: Any,
                       event_id: uuid.UUID | None, traceparent: str | None,
                       tracestate: str | None) -> tuple[Any, ...]:
    event = _arguments(aggregate_type, aggregate_id, event_type, payload, event_id)
    return (MESSAGE_PREFIX, *event, *_trace_context(traceparent, tracestate))


# ---------------------------------------------------------------- trace context

def _trace_context(traceparent: str | None, tracestate: str | None) -> tuple[str | None, str | None]:
    """The explicit trace context (checked), else the current OpenTelemetry span's, else none."""
    if traceparent is None:
        if tracestate is not None:
            raise ValueError("tracestate without traceparent: pass both, or neither")
        return _current_span_context()
    if not isinstance(traceparent, str) or not _TRACEPARENT.match(traceparent):
        raise ValueError(
            f"traceparent {traceparent!r} is not a W3C traceparent "
            "(version-traceid-spanid-flags in lower-case hex, e.g. 00-<32 hex>-<16 hex>-01)"
        )
    if tracestate is not None and not isinstance(tracestate, str):
        raise TypeError(f"tracestate must be a str, got {type(tracestate).__name__}")
    return traceparent, tracestate or None


@functools.cache
def _opentelemetry_trace() -> Any:
    """``opentelemetry.trace``, or None without the optional ``opentelemetry-api``."""
    try:
        return importlib.import_module("opentelemetry.trace")
    except ImportError:
        return None


def _current_span_context() -> tuple[str | None, str | None]:
    trace = _opentelemetry_trace()
    if trace is None:
        return None, None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None, None
    traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
    return traceparent, context.trace_state.to_header() or None


# (host, port, dbname, table) -> whether the table has both trace columns.
_TRACE_COLUMNS_SEEN: dict[tuple[str, int, str, str], bool] = {}


def _trace_key(info: Any, table: str | TableRef) -> tuple[str, int, str, str]:
    return (str(info.host), int(info.port), str(info.dbname), str(validated_table(table)))


def _trace_lookup_args(table: str | TableRef) -> tuple[str, list[str]]:
    ref = validated_table(table)
    return (sql.Identifier(ref.schema, ref.name).as_string(None), list(TRACE_COLUMNS))


def _count(row: Any) -> int:
    return int(row[0]) if row is not None else 0


def _has_trace_columns(conn: psycopg.Connection[Any], table: str | TableRef, *,
                       explicit: str | None) -> bool:
    key = _trace_key(conn.info, table)
    if key not in _TRACE_COLUMNS_SEEN:
        row = conn.execute(_TRACE_LOOKUP, _trace_lookup_args(table)).fetchone()
        _TRACE_COLUMNS_SEEN[key] = _count(row) == len(TRACE_COLUMNS)
    return _trace_usable(key, table, explicit=explicit)


def _trace_usable(key: tuple[str, int, str, str], table: str | TableRef, *,
                  explicit: str | None) -> bool:
    if _TRACE_COLUMNS_SEEN[key]:
        return True
    if explicit is not None:
        raise ConfigError(
            f"table {validated_table(table)} has no traceparent/tracestate columns: run "
            "`cdc-relay init --with-trace-context` (or omit traceparent)"
        )
    return False
